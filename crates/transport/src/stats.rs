//! Counters, named after rxe's (`/sys/class/infiniband/rxe0/ports/1/hw_counters`)
//! where one exists, so that operators can compare the two stacks.

/// Why a received packet was dropped without a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The packet's ICRC was wrong.
    IcrcError,
    /// The packet could not be parsed.
    Malformed,
    /// No QP with the destination QPN.
    UnknownQpn,
    /// The QP is not in a state that accepts packets.
    QpState,
    /// The source address is not the QP's peer.
    WrongPeer,
    /// The P_Key does not match.
    BadPkey,
    /// The opcode does not belong to the QP's transport.
    WrongTransport,
    /// A request whose PSN is ahead of the expected one (after the NAK).
    OutOfSequence,
    /// A duplicate that needs no answer (old atomic or read no longer cached).
    StaleDuplicate,
    /// A response that matches no outstanding request.
    UnexpectedResponse,
    /// A UC message dropped (no receive WQE, access error, bad sequence).
    UcMessageDropped,
    /// A UD datagram whose Q_Key is not the QP's.
    QkeyViolation,
    /// A UD datagram with no receive WQE to take it.
    NoReceiveWqe,
}

macro_rules! counters {
    ($($(#[$meta:meta])* $name:ident),* $(,)?) => {
        /// Per-QP (and, summed, per-device) counters.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Stats {
            $($(#[$meta])* pub $name: u64,)*
        }

        impl Stats {
            /// Adds another set of counters (per-device totals).
            pub fn accumulate(&mut self, o: &Self) {
                $(self.$name += o.$name;)*
            }

            /// Sets the counter called `name`; whether one is.
            pub fn set(&mut self, name: &str, value: u64) -> bool {
                match name {
                    $(stringify!($name) => { self.$name = value; true })*
                    _ => false,
                }
            }

            /// Every counter with its name, in declaration order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$((stringify!($name), self.$name)),*].into_iter()
            }
        }
    };
}

counters! {
    /// Packets sent.
    sent_pkts,
    /// Packets received for this QP (before any check).
    rcvd_pkts,
    /// Go-back-N restarts (timeouts, NAKs, lost responses), not packets.
    retransmits,
    /// Packets sent again by those restarts.
    retransmitted_pkts,
    /// Requests received again (answered from state, never re-executed, except READs).
    duplicate_request,
    /// Requests ahead of the expected PSN (dropped; RC NAKs the first of a gap).
    out_of_seq_request,
    /// RNR NAKs received.
    rcvd_rnr_err,
    /// RNR NAKs sent.
    send_rnr_err,
    /// PSN-sequence NAKs received.
    rcvd_seq_err,
    /// PSN-sequence NAKs sent.
    send_seq_err,
    /// Retransmission timer expiries at the Local ACK Timeout (each spends
    /// a transport retry).
    local_ack_timeout_err,
    /// Resends after a probe timeout from the round-trip estimate, before
    /// the Local ACK Timeout (no retry spent).
    rto_probes,
    /// WRs failed with RETRY_EXC_ERR.
    retry_exceeded_err,
    /// WRs failed with RNR_RETRY_EXC_ERR.
    retry_rnr_exceeded_err,
    /// Transport retries spent.
    completer_retry_err,
    /// Send WRs failed locally, and packets the backend could not send.
    send_err,
    /// SEND messages sent.
    rdma_sends,
    /// SEND messages received.
    rdma_recvs,
    /// ACK, NAK and RNR NAK packets sent.
    acks_sent,
    /// Requested ACKs answered by a later, coalesced one.
    ack_deferred,
    /// ACKs held for the application's reply and sent behind it, in one
    /// send (see `qp::ack_hold`).
    acks_behind_request,
    /// ACKs held for a reply that did not come in time.
    ack_hold_expired,
    /// Times the port went down (the interface lost its link).
    link_downed,
    /// Packets dropped for a bad ICRC.
    icrc_errors,
    /// Packets dropped as malformed.
    drop_malformed,
    /// Packets for no existing QP.
    drop_unknown_qpn,
    /// Packets for a QP in a state that takes none.
    drop_qp_state,
    /// Packets from an address that is not the connected peer.
    drop_wrong_peer,
    /// Packets with a P_Key other than the port's.
    drop_bad_pkey,
    /// Packets of another transport than the QP's.
    drop_wrong_transport,
    /// Duplicates too old to answer (READ or atomic no longer cached).
    drop_stale_duplicate,
    /// Responses matching no outstanding request.
    drop_unexpected_response,
    /// UC messages dropped whole (loss, no receive WQE, access error).
    drop_uc_message,
    /// UD datagrams with a foreign Q_Key.
    drop_qkey_violation,
    /// UD datagrams that found no receive WQE.
    drop_no_recv_wqe,
    /// Messages a target QP here received for another process's SRQ of a
    /// shared XRC domain and relayed to it.
    xrc_relayed_out,
    /// Messages relayed here for this context's SRQs by other processes'
    /// target QPs.
    xrc_relayed_in,
    /// Memory accesses (a WRITE packet, a READ, an atomic, a FLUSH, an
    /// invalidation) that target QPs here asked another process to run in
    /// its memory, for a request naming its SRQ.
    xrc_accesses_asked,
    /// Memory accesses this context ran for other processes' target QPs.
    xrc_accesses_served,
    /// Packets sent through shared memory to a context on this host (the
    /// `udp` backend's local path).
    local_sent_pkts,
    /// Packets received through shared memory.
    local_rcvd_pkts,
    /// Doorbell datagrams sent to wake a sleeping local receiver.
    local_doorbells,
    /// Packets a full shared-memory lane refused (resent by the transport).
    local_lane_full,
    /// Shared-memory lanes that broke the ring's rules (contents dropped).
    local_lane_broken,
    /// Shared-memory lanes whose senders went, their memory given back.
    local_lane_released,
    /// Times a shared-memory lane could not grow (a full tmpfs): the
    /// destination took UDP until the next check.
    local_no_memory,
    /// Frames the AF_XDP backend took from its sockets as RoCE datagrams.
    xdp_rcvd_frames,
    /// Frames the AF_XDP backend handed to its transmit ring.
    xdp_sent_frames,
    /// Of those received, frames that spanned several chunks (RoCE MTU
    /// 4096: multi-buffer sockets).
    xdp_rx_multi_chunk,
    /// Of those sent, frames cut into several chunks.
    xdp_tx_multi_chunk,
    /// Frames an AF_XDP socket received that were no whole UDP datagram to
    /// the device's port (truncated, lengths that disagree): dropped.
    xdp_rx_malformed,
    /// Frames with an IPv4 header or UDP checksum that does not verify:
    /// dropped.
    xdp_rx_bad_checksum,
    /// Frames that found no AF_XDP transmit buffer (dropped; RC resends).
    xdp_tx_full,
    /// Datagrams the XDP program passed to the kernel (IPv4 options,
    /// fragments, queues without a socket) that the device's UDP socket
    /// received.
    xdp_via_kernel,
    /// Frames the kernel dropped before an AF_XDP socket (larger than a
    /// chunk on a socket without multi-buffer, no room): its `rx_dropped`.
    xdp_rx_dropped,
    /// The kernel's `rx_invalid_descs` of the AF_XDP sockets.
    xdp_rx_invalid,
    /// The kernel's `rx_ring_full` (frames lost to a full receive ring).
    xdp_rx_ring_full,
    /// The kernel's `rx_fill_ring_empty_descs` (no buffer to receive into).
    xdp_fill_empty,
    /// AF_XDP sockets bound in zero-copy mode (the rest copy: veth).
    xdp_zero_copy_sockets,
    /// Frames the DPDK backend received as RoCE datagrams.
    dpdk_rcvd_frames,
    /// Frames the DPDK backend queued for its port (ARP included).
    dpdk_sent_frames,
    /// Frames that claimed to be RoCE (UDP to the device's port) or ARP
    /// but were no whole datagram or packet: dropped.
    dpdk_rx_malformed,
    /// Frames with an IPv4 header or UDP checksum that does not verify:
    /// dropped.
    dpdk_rx_bad_checksum,
    /// Other traffic on the port (IPv6, TCP, other UDP, other addresses):
    /// ignored.
    dpdk_rx_other,
    /// Frames the port would not take or no mbuf was free for (dropped;
    /// RC resends).
    dpdk_tx_dropped,
    /// ARP replies and neighbour advertisements sent for the device's
    /// addresses (IPv6's announcement at start included).
    dpdk_arp_replies,
    /// ARP requests and neighbour solicitations sent (peers' MACs, and
    /// IPv4's announcement at start).
    dpdk_arp_requests,
    /// ICMP and ICMPv6 echo requests to the device's addresses answered.
    dpdk_echo_replies,
    /// Port unreachable errors sent for UDP datagrams to the device's
    /// addresses at ports nothing listens on (at most 100 a second).
    dpdk_port_unreachables,
    /// Frames dropped because too many waited for unresolved MACs, or
    /// their neighbour never answered.
    dpdk_no_neighbour,
    /// Frames the port missed (no descriptor or mbuf to receive into).
    dpdk_rx_missed,
    /// The port's own receive and transmit errors.
    dpdk_port_errors,
    /// IGMP and MLD membership reports and leaves sent (groups joined and
    /// left, routers' queries answered).
    dpdk_group_reports,
    /// RoCE frames to the device that another of its contexts owns (each
    /// sees every frame of the port's interface): left to it.
    dpdk_rx_for_others,
}

impl Stats {
    /// Counts a drop.
    pub fn drop(&mut self, why: DropReason) {
        let c = match why {
            DropReason::IcrcError => &mut self.icrc_errors,
            DropReason::Malformed => &mut self.drop_malformed,
            DropReason::UnknownQpn => &mut self.drop_unknown_qpn,
            DropReason::QpState => &mut self.drop_qp_state,
            DropReason::WrongPeer => &mut self.drop_wrong_peer,
            DropReason::BadPkey => &mut self.drop_bad_pkey,
            DropReason::WrongTransport => &mut self.drop_wrong_transport,
            DropReason::OutOfSequence => &mut self.out_of_seq_request,
            DropReason::StaleDuplicate => &mut self.drop_stale_duplicate,
            DropReason::UnexpectedResponse => &mut self.drop_unexpected_response,
            DropReason::UcMessageDropped => &mut self.drop_uc_message,
            DropReason::QkeyViolation => &mut self.drop_qkey_violation,
            DropReason::NoReceiveWqe => &mut self.drop_no_recv_wqe,
        };
        *c += 1;
    }
}
