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
}

/// Per-QP (and, summed, per-device) counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Stats {
    pub sent_pkts: u64,
    pub rcvd_pkts: u64,
    /// Requests retransmitted (go-back-N restarts, not packets).
    pub retransmits: u64,
    /// Packets resent by those restarts.
    pub retransmitted_pkts: u64,
    pub duplicate_request: u64,
    pub out_of_seq_request: u64,
    pub rcvd_rnr_err: u64,
    pub send_rnr_err: u64,
    pub rcvd_seq_err: u64,
    pub send_seq_err: u64,
    pub local_ack_timeout_err: u64,
    pub retry_exceeded_err: u64,
    pub retry_rnr_exceeded_err: u64,
    pub completer_retry_err: u64,
    pub send_err: u64,
    pub rdma_sends: u64,
    pub rdma_recvs: u64,
    pub acks_sent: u64,
    pub icrc_errors: u64,
    pub drop_malformed: u64,
    pub drop_unknown_qpn: u64,
    pub drop_qp_state: u64,
    pub drop_wrong_peer: u64,
    pub drop_bad_pkey: u64,
    pub drop_wrong_transport: u64,
    pub drop_stale_duplicate: u64,
    pub drop_unexpected_response: u64,
    pub drop_uc_message: u64,
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
        };
        *c += 1;
    }

    /// Adds another set of counters (per-device totals).
    pub fn accumulate(&mut self, o: &Self) {
        macro_rules! add {
            ($($f:ident),*) => { $( self.$f += o.$f; )* };
        }
        add!(
            sent_pkts,
            rcvd_pkts,
            retransmits,
            retransmitted_pkts,
            duplicate_request,
            out_of_seq_request,
            rcvd_rnr_err,
            send_rnr_err,
            rcvd_seq_err,
            send_seq_err,
            local_ack_timeout_err,
            retry_exceeded_err,
            retry_rnr_exceeded_err,
            completer_retry_err,
            send_err,
            rdma_sends,
            rdma_recvs,
            acks_sent,
            icrc_errors,
            drop_malformed,
            drop_unknown_qpn,
            drop_qp_state,
            drop_wrong_peer,
            drop_bad_pkey,
            drop_wrong_transport,
            drop_stale_duplicate,
            drop_unexpected_response
        );
    }
}
