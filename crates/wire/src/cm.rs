//! Communication management MADs (IBTA vol. 1 chapter 12) as RoCEv2
//! carries them: 256-byte management datagrams in UD SEND Only packets to
//! QP1 (Q_Key [`CM_QKEY`], source QP 1). A MAD is a 24-byte common header
//! (§13.4.2) and 232 bytes of CM message; the messages' fields sit where
//! IBTA's tables 106–120 put them (Linux's `ibta_vol1_c12.h` names the same
//! offsets). Bit fields are counted from the most significant bit of their
//! byte, as IBTA draws them.
//!
//! Also the RDMA CM's conventions on top (Linux `cma.c`): the service ID
//! of an IP port space and the header that opens a REQ's private data
//! with the IP version, port and addresses ([`CmaHeader`]).
//!
//! Every message parses into a representation and emits back to the same
//! bytes (reserved fields are zero, as senders write them).

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::field::{be16, be24, be32, be64, set_be16, set_be24, set_be32, set_be64};

/// A MAD's length.
pub const MAD_LEN: usize = 256;
/// The common MAD header's length.
pub const MAD_HEADER_LEN: usize = 24;
/// A CM message's length (what follows the header).
pub const CM_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;
/// The Q_Key of QP1 (the GSI).
pub const CM_QKEY: u32 = 0x8001_0000;
/// Management class of communication management.
pub const CM_CLASS: u8 = 0x07;
/// The CM class version this module reads and writes.
pub const CM_CLASS_VERSION: u8 = 2;
/// The MAD base version.
pub const MAD_BASE_VERSION: u8 = 1;
/// `Send`: every CM message travels with this method.
pub const METHOD_SEND: u8 = 0x03;

/// Why a MAD is not a CM message this module reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmError {
    /// Shorter than a MAD.
    Truncated,
    /// Another management class or class version.
    NotCm {
        /// The class.
        class: u8,
        /// The class version.
        version: u8,
    },
}

impl core::fmt::Display for CmError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Truncated => f.write_str("shorter than a 256-byte MAD"),
            Self::NotCm { class, version } => {
                write!(f, "management class {class:#04x} version {version}, not CM version 2")
            }
        }
    }
}

/// CM attribute IDs (IBTA table 104).
pub mod attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// Connection request.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Reject.
    pub const REJ: u16 = 0x0012;
    /// Reply to a request.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnection request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnection reply.
    pub const DREP: u16 = 0x0016;
    /// Service ID resolution request.
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID resolution reply.
    pub const SIDR_REP: u16 = 0x0018;
    /// Load alternate path.
    pub const LAP: u16 = 0x0019;
    /// Alternate path response.
    pub const APR: u16 = 0x001a;
}

/// REJ reasons the connection manager uses (IBTA table 109).
pub mod rej_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No resources.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout: the peer did not answer in time.
    pub const TIMEOUT: u16 = 4;
    /// Unsupported request.
    pub const UNSUPPORTED: u16 = 5;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid service ID: nobody listens on it.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// Stale connection: the QP is still in use by an older connection.
    pub const STALE_CONN: u16 = 10;
    /// Invalid MTU.
    pub const INVALID_MTU: u16 = 26;
    /// Consumer reject (`rdma_reject`), with private data.
    pub const CONSUMER_DEFINED: u16 = 28;
    /// The ECE options asked for are not supported (`rdma_reject_ece`).
    pub const VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;
}

/// `value` of `width` bits at bit `off` of `byte` (bit 0 the MSB).
fn bits(byte: u8, off: u32, width: u32) -> u8 {
    (byte >> (8 - off - width)) & ((1u16 << width) - 1) as u8
}

/// `byte` with `value` put in `width` bits at bit `off` (bit 0 the MSB).
fn set_bits(byte: &mut u8, off: u32, width: u32, value: u8) {
    let mask = (((1u16 << width) - 1) as u8) << (8 - off - width);
    *byte = (*byte & !mask) | ((value << (8 - off - width)) & mask);
}

fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// The common MAD header (IBTA §13.4.2, 24 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHeader {
    /// Base version (1).
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method (and the response bit).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class-specific field.
    pub class_specific: u16,
    /// Transaction ID.
    pub tid: u64,
    /// Attribute ID: which CM message.
    pub attr_id: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl MadHeader {
    /// A CM `Send` header for message `attr_id` in transaction `tid`.
    pub const fn cm(attr_id: u16, tid: u64) -> Self {
        Self {
            base_version: MAD_BASE_VERSION,
            mgmt_class: CM_CLASS,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id,
            attr_mod: 0,
        }
    }

    fn parse(b: &[u8]) -> Self {
        Self {
            base_version: b[0],
            mgmt_class: b[1],
            class_version: b[2],
            method: b[3],
            status: be16(b, 4),
            class_specific: be16(b, 6),
            tid: be64(b, 8),
            attr_id: be16(b, 16),
            attr_mod: be32(b, 20),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        b[0] = self.base_version;
        b[1] = self.mgmt_class;
        b[2] = self.class_version;
        b[3] = self.method;
        set_be16(b, 4, self.status);
        set_be16(b, 6, self.class_specific);
        set_be64(b, 8, self.tid);
        set_be16(b, 16, self.attr_id);
        set_be16(b, 18, 0);
        set_be32(b, 20, self.attr_mod);
    }
}

/// One path of a REQ (primary at byte 52 of the message, alternate at 96).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmPath {
    /// Local port LID (0xffff on RoCE: permissive).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local GID (the sender's address as a RoCEv2 GID).
    pub local_gid: [u8; 16],
    /// Remote GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, `ibv_rate`-like encoding of IBTA).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local (1 bit).
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits, 4.096 µs × 2^value).
    pub local_ack_timeout: u8,
}

impl CmPath {
    const LEN: usize = 44;

    fn parse(b: &[u8]) -> Self {
        Self {
            local_lid: be16(b, 0),
            remote_lid: be16(b, 2),
            local_gid: array(b, 4),
            remote_gid: array(b, 20),
            flow_label: be32(b, 36) >> 12,
            packet_rate: bits(b[39], 2, 6),
            traffic_class: b[40],
            hop_limit: b[41],
            sl: bits(b[42], 0, 4),
            subnet_local: bits(b[42], 4, 1) != 0,
            local_ack_timeout: bits(b[43], 0, 5),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        set_be16(b, 0, self.local_lid);
        set_be16(b, 2, self.remote_lid);
        b[4..20].copy_from_slice(&self.local_gid);
        b[20..36].copy_from_slice(&self.remote_gid);
        set_be32(b, 36, (self.flow_label & 0xf_ffff) << 12);
        set_bits(&mut b[39], 2, 6, self.packet_rate);
        b[40] = self.traffic_class;
        b[41] = self.hop_limit;
        b[42] = 0;
        set_bits(&mut b[42], 0, 4, self.sl);
        set_bits(&mut b[42], 4, 1, u8::from(self.subnet_local));
        set_bits(&mut b[43], 0, 5, self.local_ack_timeout);
    }
}

/// REQ (IBTA table 106).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Req {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// ECE (enhanced connection establishment, IBTA 1.4): the sender's
    /// vendor ID (24 bits; 0 = none). Its options ride in the MAD
    /// header's attribute modifier.
    pub vendor_id: u32,
    /// The service asked for (RDMA CM: [`rdma_cm_service_id`]).
    pub service_id: u64,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// The sender's Q_Key (UD/RD).
    pub local_qkey: u32,
    /// The sender's QP number.
    pub local_qpn: u32,
    /// READs/atomics the sender accepts at once.
    pub responder_resources: u8,
    /// The sender's EE context (RD).
    pub local_eecn: u32,
    /// READs/atomics the sender issues at once.
    pub initiator_depth: u8,
    /// The remote EE context (RD).
    pub remote_eecn: u32,
    /// How long the remote CM may take to answer (5 bits).
    pub remote_cm_response_timeout: u8,
    /// 0 RC, 1 UC, 2 RD, 3 extended (see `extended_transport_type`).
    pub transport_service_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The sender's first PSN (24 bits).
    pub starting_psn: u32,
    /// How long the sender's CM may take to answer (5 bits).
    pub local_cm_response_timeout: u8,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (4 bits, `ibv_mtu` encoding).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retries (3 bits).
    pub rnr_retry_count: u8,
    /// CM retries (4 bits).
    pub max_cm_retries: u8,
    /// The sender's QP takes receives from an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; 1 = XRC).
    pub extended_transport_type: u8,
    /// The primary path.
    pub primary: CmPath,
    /// The alternate path (zeros when none).
    pub alternate: CmPath,
    /// The sender supports SAP (1 bit in the alternate path's last byte).
    pub sap_supported: bool,
    /// Private data (92 bytes; RDMA CM: a [`CmaHeader`] then the
    /// application's).
    pub private_data: [u8; 92],
}

impl Req {
    fn parse(b: &[u8]) -> Self {
        Self {
            local_comm_id: be32(b, 0),
            vendor_id: be24(b, 5),
            service_id: be64(b, 8),
            local_ca_guid: be64(b, 16),
            local_qkey: be32(b, 28),
            local_qpn: be24(b, 32),
            responder_resources: b[35],
            local_eecn: be24(b, 36),
            initiator_depth: b[39],
            remote_eecn: be24(b, 40),
            remote_cm_response_timeout: bits(b[43], 0, 5),
            transport_service_type: bits(b[43], 5, 2),
            end_to_end_flow_control: bits(b[43], 7, 1) != 0,
            starting_psn: be24(b, 44),
            local_cm_response_timeout: bits(b[47], 0, 5),
            retry_count: bits(b[47], 5, 3),
            pkey: be16(b, 48),
            path_mtu: bits(b[50], 0, 4),
            rdc_exists: bits(b[50], 4, 1) != 0,
            rnr_retry_count: bits(b[50], 5, 3),
            max_cm_retries: bits(b[51], 0, 4),
            srq: bits(b[51], 4, 1) != 0,
            extended_transport_type: bits(b[51], 5, 3),
            primary: CmPath::parse(&b[52..52 + CmPath::LEN]),
            alternate: CmPath::parse(&b[96..96 + CmPath::LEN]),
            sap_supported: bits(b[139], 5, 1) != 0,
            private_data: array(b, 140),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        set_be32(b, 0, self.local_comm_id);
        set_be24(b, 5, self.vendor_id & 0xff_ffff);
        set_be64(b, 8, self.service_id);
        set_be64(b, 16, self.local_ca_guid);
        set_be32(b, 28, self.local_qkey);
        set_be24(b, 32, self.local_qpn & 0xff_ffff);
        b[35] = self.responder_resources;
        set_be24(b, 36, self.local_eecn & 0xff_ffff);
        b[39] = self.initiator_depth;
        set_be24(b, 40, self.remote_eecn & 0xff_ffff);
        set_bits(&mut b[43], 0, 5, self.remote_cm_response_timeout);
        set_bits(&mut b[43], 5, 2, self.transport_service_type);
        set_bits(&mut b[43], 7, 1, u8::from(self.end_to_end_flow_control));
        set_be24(b, 44, self.starting_psn & 0xff_ffff);
        set_bits(&mut b[47], 0, 5, self.local_cm_response_timeout);
        set_bits(&mut b[47], 5, 3, self.retry_count);
        set_be16(b, 48, self.pkey);
        set_bits(&mut b[50], 0, 4, self.path_mtu);
        set_bits(&mut b[50], 4, 1, u8::from(self.rdc_exists));
        set_bits(&mut b[50], 5, 3, self.rnr_retry_count);
        set_bits(&mut b[51], 0, 4, self.max_cm_retries);
        set_bits(&mut b[51], 4, 1, u8::from(self.srq));
        set_bits(&mut b[51], 5, 3, self.extended_transport_type);
        self.primary.emit(&mut b[52..52 + CmPath::LEN]);
        self.alternate.emit(&mut b[96..96 + CmPath::LEN]);
        set_bits(&mut b[139], 5, 1, u8::from(self.sap_supported));
        b[140..232].copy_from_slice(&self.private_data);
    }
}

/// MRA (IBTA table 107): "your message arrived; the answer takes longer".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mra {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message is acknowledged: 0 REQ, 1 REP, 2 LAP (2 bits).
    pub message_mraed: u8,
    /// How long the answer may take (5 bits).
    pub service_timeout: u8,
    /// Private data (222 bytes).
    pub private_data: [u8; 222],
}

/// REJ (IBTA table 108).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rej {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID (0 when rejecting a REQ unseen).
    pub remote_comm_id: u32,
    /// Which message is rejected: 0 REQ, 1 REP, 2 other (2 bits).
    pub message_rejected: u8,
    /// Length of the additional rejection information (7 bits).
    pub rejected_info_length: u8,
    /// Reason ([`rej_reason`]).
    pub reason: u16,
    /// Additional rejection information (72 bytes).
    pub ari: [u8; 72],
    /// Private data (148 bytes).
    pub private_data: [u8; 148],
}

/// REP (IBTA table 110).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rep {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The requester's communication ID.
    pub remote_comm_id: u32,
    /// The sender's Q_Key.
    pub local_qkey: u32,
    /// The sender's QP number.
    pub local_qpn: u32,
    /// ECE: the vendor ID the sender answers with (24 bits, carried in
    /// the three bytes after the QPN, EECN and PSN); options in the MAD
    /// header's attribute modifier.
    pub vendor_id: u32,
    /// The sender's EE context (RD).
    pub local_eecn: u32,
    /// The sender's first PSN.
    pub starting_psn: u32,
    /// READs/atomics the sender accepts at once.
    pub responder_resources: u8,
    /// READs/atomics the sender issues at once.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retries (3 bits).
    pub rnr_retry_count: u8,
    /// The sender's QP takes receives from an SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data (196 bytes).
    pub private_data: [u8; 196],
}

/// RTU (IBTA table 111), DREP (table 113): IDs and private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdsOnly {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data (224 bytes).
    pub private_data: [u8; 224],
}

/// DREQ (IBTA table 112).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dreq {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QP number.
    pub remote_qpn: u32,
    /// Private data (220 bytes).
    pub private_data: [u8; 220],
}

/// SIDR_REQ (IBTA table 119): which QP serves a service (UD).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrReq {
    /// The request's ID.
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// The service asked for.
    pub service_id: u64,
    /// Private data (216 bytes).
    pub private_data: [u8; 216],
}

/// SIDR_REP (IBTA table 120).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrRep {
    /// The request's ID.
    pub request_id: u32,
    /// 0: the QP is valid; otherwise why not (IBTA table 121).
    pub status: u8,
    /// Length of the additional information.
    pub additional_info_length: u8,
    /// The serving QP.
    pub qpn: u32,
    /// The service.
    pub service_id: u64,
    /// The serving QP's Q_Key.
    pub qkey: u32,
    /// Additional information (72 bytes).
    pub additional_info: [u8; 72],
    /// Private data (136 bytes).
    pub private_data: [u8; 136],
}

/// A CM message, by attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// REQ.
    Req(Req),
    /// MRA.
    Mra(Mra),
    /// REJ.
    Rej(Rej),
    /// REP.
    Rep(Rep),
    /// RTU.
    Rtu(IdsOnly),
    /// DREQ.
    Dreq(Dreq),
    /// DREP.
    Drep(IdsOnly),
    /// SIDR_REQ.
    SidrReq(SidrReq),
    /// SIDR_REP.
    SidrRep(SidrRep),
    /// Any other attribute (LAP, APR, ClassPortInfo, unknown), kept whole.
    Other {
        /// The attribute ID.
        attr_id: u16,
        /// The message bytes.
        data: [u8; CM_DATA_LEN],
    },
}

impl CmMessage {
    /// The attribute ID the message travels under.
    pub fn attr_id(&self) -> u16 {
        match self {
            Self::Req(_) => attr::REQ,
            Self::Mra(_) => attr::MRA,
            Self::Rej(_) => attr::REJ,
            Self::Rep(_) => attr::REP,
            Self::Rtu(_) => attr::RTU,
            Self::Dreq(_) => attr::DREQ,
            Self::Drep(_) => attr::DREP,
            Self::SidrReq(_) => attr::SIDR_REQ,
            Self::SidrRep(_) => attr::SIDR_REP,
            Self::Other { attr_id, .. } => *attr_id,
        }
    }

    /// The message's name as IBTA spells it.
    pub fn name(&self) -> &'static str {
        match self.attr_id() {
            attr::REQ => "REQ",
            attr::MRA => "MRA",
            attr::REJ => "REJ",
            attr::REP => "REP",
            attr::RTU => "RTU",
            attr::DREQ => "DREQ",
            attr::DREP => "DREP",
            attr::SIDR_REQ => "SIDR_REQ",
            attr::SIDR_REP => "SIDR_REP",
            attr::LAP => "LAP",
            attr::APR => "APR",
            attr::CLASS_PORT_INFO => "ClassPortInfo",
            _ => "CM(unknown)",
        }
    }

    fn parse(attr_id: u16, b: &[u8]) -> Self {
        let ids = |b: &[u8]| IdsOnly {
            local_comm_id: be32(b, 0),
            remote_comm_id: be32(b, 4),
            private_data: array(b, 8),
        };
        match attr_id {
            attr::REQ => Self::Req(Req::parse(b)),
            attr::MRA => Self::Mra(Mra {
                local_comm_id: be32(b, 0),
                remote_comm_id: be32(b, 4),
                message_mraed: bits(b[8], 0, 2),
                service_timeout: bits(b[9], 0, 5),
                private_data: array(b, 10),
            }),
            attr::REJ => Self::Rej(Rej {
                local_comm_id: be32(b, 0),
                remote_comm_id: be32(b, 4),
                message_rejected: bits(b[8], 0, 2),
                rejected_info_length: bits(b[9], 0, 7),
                reason: be16(b, 10),
                ari: array(b, 12),
                private_data: array(b, 84),
            }),
            attr::REP => Self::Rep(Rep {
                local_comm_id: be32(b, 0),
                remote_comm_id: be32(b, 4),
                local_qkey: be32(b, 8),
                local_qpn: be24(b, 12),
                vendor_id: u32::from(b[15]) << 16 | u32::from(b[19]) << 8 | u32::from(b[23]),
                local_eecn: be24(b, 16),
                starting_psn: be24(b, 20),
                responder_resources: b[24],
                initiator_depth: b[25],
                target_ack_delay: bits(b[26], 0, 5),
                failover_accepted: bits(b[26], 5, 2),
                end_to_end_flow_control: bits(b[26], 7, 1) != 0,
                rnr_retry_count: bits(b[27], 0, 3),
                srq: bits(b[27], 3, 1) != 0,
                local_ca_guid: be64(b, 28),
                private_data: array(b, 36),
            }),
            attr::RTU => Self::Rtu(ids(b)),
            attr::DREQ => Self::Dreq(Dreq {
                local_comm_id: be32(b, 0),
                remote_comm_id: be32(b, 4),
                remote_qpn: be24(b, 8),
                private_data: array(b, 12),
            }),
            attr::DREP => Self::Drep(ids(b)),
            attr::SIDR_REQ => Self::SidrReq(SidrReq {
                request_id: be32(b, 0),
                pkey: be16(b, 4),
                service_id: be64(b, 8),
                private_data: array(b, 16),
            }),
            attr::SIDR_REP => Self::SidrRep(SidrRep {
                request_id: be32(b, 0),
                status: b[4],
                additional_info_length: b[5],
                qpn: be24(b, 8),
                service_id: be64(b, 12),
                qkey: be32(b, 20),
                additional_info: array(b, 24),
                private_data: array(b, 96),
            }),
            _ => Self::Other { attr_id, data: array(b, 0) },
        }
    }

    fn emit(&self, b: &mut [u8]) {
        b.fill(0);
        let ids = |m: &IdsOnly, b: &mut [u8]| {
            set_be32(b, 0, m.local_comm_id);
            set_be32(b, 4, m.remote_comm_id);
            b[8..].copy_from_slice(&m.private_data);
        };
        match self {
            Self::Req(m) => m.emit(b),
            Self::Mra(m) => {
                set_be32(b, 0, m.local_comm_id);
                set_be32(b, 4, m.remote_comm_id);
                set_bits(&mut b[8], 0, 2, m.message_mraed);
                set_bits(&mut b[9], 0, 5, m.service_timeout);
                b[10..].copy_from_slice(&m.private_data);
            }
            Self::Rej(m) => {
                set_be32(b, 0, m.local_comm_id);
                set_be32(b, 4, m.remote_comm_id);
                set_bits(&mut b[8], 0, 2, m.message_rejected);
                set_bits(&mut b[9], 0, 7, m.rejected_info_length);
                set_be16(b, 10, m.reason);
                b[12..84].copy_from_slice(&m.ari);
                b[84..].copy_from_slice(&m.private_data);
            }
            Self::Rep(m) => {
                set_be32(b, 0, m.local_comm_id);
                set_be32(b, 4, m.remote_comm_id);
                set_be32(b, 8, m.local_qkey);
                set_be24(b, 12, m.local_qpn & 0xff_ffff);
                set_be24(b, 16, m.local_eecn & 0xff_ffff);
                set_be24(b, 20, m.starting_psn & 0xff_ffff);
                let [_, h, m_, l] = m.vendor_id.to_be_bytes();
                (b[15], b[19], b[23]) = (h, m_, l);
                b[24] = m.responder_resources;
                b[25] = m.initiator_depth;
                set_bits(&mut b[26], 0, 5, m.target_ack_delay);
                set_bits(&mut b[26], 5, 2, m.failover_accepted);
                set_bits(&mut b[26], 7, 1, u8::from(m.end_to_end_flow_control));
                set_bits(&mut b[27], 0, 3, m.rnr_retry_count);
                set_bits(&mut b[27], 3, 1, u8::from(m.srq));
                set_be64(b, 28, m.local_ca_guid);
                b[36..].copy_from_slice(&m.private_data);
            }
            Self::Rtu(m) | Self::Drep(m) => ids(m, b),
            Self::Dreq(m) => {
                set_be32(b, 0, m.local_comm_id);
                set_be32(b, 4, m.remote_comm_id);
                set_be24(b, 8, m.remote_qpn & 0xff_ffff);
                b[12..].copy_from_slice(&m.private_data);
            }
            Self::SidrReq(m) => {
                set_be32(b, 0, m.request_id);
                set_be16(b, 4, m.pkey);
                set_be64(b, 8, m.service_id);
                b[16..].copy_from_slice(&m.private_data);
            }
            Self::SidrRep(m) => {
                set_be32(b, 0, m.request_id);
                b[4] = m.status;
                b[5] = m.additional_info_length;
                set_be24(b, 8, m.qpn & 0xff_ffff);
                set_be64(b, 12, m.service_id);
                set_be32(b, 20, m.qkey);
                b[24..96].copy_from_slice(&m.additional_info);
                b[96..].copy_from_slice(&m.private_data);
            }
            Self::Other { data, .. } => b.copy_from_slice(data),
        }
    }
}

/// A whole CM MAD: header and message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMad {
    /// The MAD header.
    pub header: MadHeader,
    /// The message.
    pub message: CmMessage,
}

impl CmMad {
    /// Reads a CM MAD (the payload of a UD SEND to QP1; bytes past 256
    /// are ignored).
    ///
    /// # Errors
    /// [`CmError::Truncated`] below 256 bytes, [`CmError::NotCm`] for
    /// another management class or version.
    pub fn parse(mad: &[u8]) -> Result<Self, CmError> {
        if mad.len() < MAD_LEN {
            return Err(CmError::Truncated);
        }
        let header = MadHeader::parse(&mad[..MAD_HEADER_LEN]);
        if header.mgmt_class != CM_CLASS || header.class_version != CM_CLASS_VERSION {
            return Err(CmError::NotCm { class: header.mgmt_class, version: header.class_version });
        }
        let message = CmMessage::parse(header.attr_id, &mad[MAD_HEADER_LEN..MAD_LEN]);
        Ok(Self { header, message })
    }

    /// Writes the MAD into `out` (the header's attribute ID is the
    /// message's).
    pub fn emit(&self, out: &mut [u8; MAD_LEN]) {
        let mut h = self.header;
        h.attr_id = self.message.attr_id();
        h.emit(&mut out[..MAD_HEADER_LEN]);
        self.message.emit(&mut out[MAD_HEADER_LEN..]);
    }
}

impl core::fmt::Display for CmMad {
    /// `CM REQ tid 0x… comm 0x… service 0x… (tcp port 7174) qpn 0x… psn 0x…`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "CM {} tid {:#x}", self.message.name(), self.header.tid)?;
        let service = |f: &mut core::fmt::Formatter<'_>, id: u64| -> core::fmt::Result {
            write!(f, " service {id:#018x}")?;
            match rdma_cm_port(id) {
                Some((port_space::TCP, p)) => write!(f, " (tcp port {p})"),
                Some((port_space::UDP, p)) => write!(f, " (udp port {p})"),
                Some((port_space::IB, p)) => write!(f, " (ib port {p})"),
                Some((port_space::IPOIB, p)) => write!(f, " (ipoib port {p})"),
                _ => Ok(()),
            }
        };
        match &self.message {
            CmMessage::Req(m) => {
                write!(f, " comm {:#010x}", m.local_comm_id)?;
                service(f, m.service_id)?;
                write!(
                    f,
                    " qpn {:#08x} psn {:#08x} mtu-code {} retry {} rnr-retry {}",
                    m.local_qpn, m.starting_psn, m.path_mtu, m.retry_count, m.rnr_retry_count
                )
            }
            CmMessage::Rep(m) => write!(
                f,
                " comm {:#010x} remote-comm {:#010x} qpn {:#08x} psn {:#08x}",
                m.local_comm_id, m.remote_comm_id, m.local_qpn, m.starting_psn
            ),
            CmMessage::Rtu(m) | CmMessage::Drep(m) => {
                write!(f, " comm {:#010x} remote-comm {:#010x}", m.local_comm_id, m.remote_comm_id)
            }
            CmMessage::Dreq(m) => write!(
                f,
                " comm {:#010x} remote-comm {:#010x} remote-qpn {:#08x}",
                m.local_comm_id, m.remote_comm_id, m.remote_qpn
            ),
            CmMessage::Rej(m) => write!(
                f,
                " comm {:#010x} remote-comm {:#010x} reason {}",
                m.local_comm_id, m.remote_comm_id, m.reason
            ),
            CmMessage::Mra(m) => write!(
                f,
                " comm {:#010x} remote-comm {:#010x} timeout {}",
                m.local_comm_id, m.remote_comm_id, m.service_timeout
            ),
            CmMessage::SidrReq(m) => {
                write!(f, " request {:#010x}", m.request_id)?;
                service(f, m.service_id)
            }
            CmMessage::SidrRep(m) => write!(
                f,
                " request {:#010x} status {} qpn {:#08x} qkey {:#010x}",
                m.request_id, m.status, m.qpn, m.qkey
            ),
            CmMessage::Other { .. } => Ok(()),
        }
    }
}

/// RDMA CM port spaces (`enum rdma_ucm_port_space`).
pub mod port_space {
    /// IPoIB.
    pub const IPOIB: u16 = 0x0002;
    /// Reliable connected, TCP-like (`RDMA_PS_TCP`).
    pub const TCP: u16 = 0x0106;
    /// Unreliable datagram, UDP-like (`RDMA_PS_UDP`).
    pub const UDP: u16 = 0x0111;
    /// Native IB (`RDMA_PS_IB`).
    pub const IB: u16 = 0x013f;
}

/// The service ID the RDMA CM connects to for `port` in `space`
/// (IBTA annex A11: 0x0000000001 in the top 40 bits).
pub const fn rdma_cm_service_id(space: u16, port: u16) -> u64 {
    0x0000_0000_0100_0000 | ((space as u64) << 16) | port as u64
}

/// The port space and port of an RDMA CM service ID, if it is one.
pub const fn rdma_cm_port(service_id: u64) -> Option<(u16, u16)> {
    if service_id >> 24 != 1 {
        return None;
    }
    Some(((service_id >> 16) as u16, service_id as u16))
}

/// The header the RDMA CM puts at the start of a REQ's private data
/// (Linux `struct cma_hdr`, 36 bytes): version 0, the IP version in the
/// high nibble of byte 1, the source port, then source and destination
/// addresses in 16 bytes each (IPv4 in the last four).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeader {
    /// `cma_version` (0).
    pub version: u8,
    /// The active side's port.
    pub src_port: u16,
    /// The active side's address.
    pub src: IpAddr,
    /// The passive side's address.
    pub dst: IpAddr,
}

impl CmaHeader {
    /// Its length.
    pub const LEN: usize = 36;

    /// Reads the header from private data, if it holds one.
    pub fn parse(private_data: &[u8]) -> Option<Self> {
        let b = private_data.get(..Self::LEN)?;
        let addr = |at: usize, v6: bool| -> IpAddr {
            if v6 {
                IpAddr::V6(Ipv6Addr::from(array::<16>(b, at)))
            } else {
                IpAddr::V4(Ipv4Addr::from(array::<4>(b, at + 12)))
            }
        };
        let v6 = match b[1] >> 4 {
            4 => false,
            6 => true,
            _ => return None,
        };
        Some(Self { version: b[0], src_port: be16(b, 2), src: addr(4, v6), dst: addr(20, v6) })
    }

    /// Writes the header into the start of private data (36 bytes or
    /// more; both addresses of the source's family).
    pub fn emit(&self, private_data: &mut [u8]) {
        let b = &mut private_data[..Self::LEN];
        b.fill(0);
        b[0] = self.version;
        b[1] = if self.src.is_ipv6() { 6 << 4 } else { 4 << 4 };
        set_be16(b, 2, self.src_port);
        for (at, a) in [(4, self.src), (20, self.dst)] {
            match a {
                IpAddr::V4(v4) => b[at + 12..at + 16].copy_from_slice(&v4.octets()),
                IpAddr::V6(v6) => b[at..at + 16].copy_from_slice(&v6.octets()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_fields_count_from_the_msb() {
        assert_eq!(bits(0b1011_0110, 0, 5), 0b10110);
        assert_eq!(bits(0b1011_0110, 5, 2), 0b11);
        assert_eq!(bits(0b1011_0110, 7, 1), 0);
        let mut b = 0u8;
        set_bits(&mut b, 0, 5, 0b10110);
        set_bits(&mut b, 5, 2, 0b11);
        set_bits(&mut b, 7, 1, 1);
        assert_eq!(b, 0b1011_0111);
        // A value wider than its field does not spill into the next one.
        let mut c = 0u8;
        set_bits(&mut c, 0, 4, 0xff);
        assert_eq!(c, 0xf0);
    }

    #[test]
    fn service_ids_of_the_rdma_cm() {
        let id = rdma_cm_service_id(port_space::TCP, 7174);
        assert_eq!(id, 0x0000_0000_0106_1c06);
        assert_eq!(rdma_cm_port(id), Some((port_space::TCP, 7174)));
        assert_eq!(rdma_cm_port(0x1234), None);
    }

    #[test]
    fn every_message_round_trips_and_short_or_foreign_mads_are_refused() {
        let mut mad = [0u8; MAD_LEN];
        for attr_id in [
            attr::REQ,
            attr::MRA,
            attr::REJ,
            attr::REP,
            attr::RTU,
            attr::DREQ,
            attr::DREP,
            attr::SIDR_REQ,
            attr::SIDR_REP,
            attr::LAP,
        ] {
            // A pattern with every field set (reserved bytes too, which a
            // parse then emit clears: compare two emits).
            for (i, b) in mad.iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(37) ^ 0x5a;
            }
            MadHeader::cm(attr_id, 0xfeed).emit(&mut mad[..MAD_HEADER_LEN]);
            let m = CmMad::parse(&mad).unwrap();
            assert_eq!(m.message.attr_id(), attr_id);
            let mut once = [0u8; MAD_LEN];
            m.emit(&mut once);
            let again = CmMad::parse(&once).unwrap();
            assert_eq!(again, m);
            let mut twice = [0u8; MAD_LEN];
            again.emit(&mut twice);
            assert_eq!(once, twice);
        }
        assert_eq!(CmMad::parse(&mad[..255]), Err(CmError::Truncated));
        mad[1] = 0x81;
        assert_eq!(CmMad::parse(&mad), Err(CmError::NotCm { class: 0x81, version: 2 }));
    }

    #[test]
    fn ece_vendor_ids_sit_where_linux_puts_them() {
        // REQ: bytes 5..8 of the message; REP: bytes 15, 19 and 23 (high,
        // middle, low), each after a 24-bit field (Linux's
        // CM_REQ_VENDOR_ID, CM_REP_VENDOR_ID_H/M/L).
        let mut mad = [0u8; MAD_LEN];
        MadHeader::cm(attr::REQ, 1).emit(&mut mad[..MAD_HEADER_LEN]);
        mad[MAD_HEADER_LEN + 5..MAD_HEADER_LEN + 8].copy_from_slice(&[0x02, 0xc9, 0x15]);
        mad[MAD_HEADER_LEN + 4] = 0xff; // reserved, not part of it
        let CmMessage::Req(req) = CmMad::parse(&mad).unwrap().message else { panic!() };
        assert_eq!((req.vendor_id, req.local_comm_id), (0x02c915, 0));
        let mut rep = [0u8; MAD_LEN];
        MadHeader::cm(attr::REP, 1).emit(&mut rep[..MAD_HEADER_LEN]);
        let m = Rep {
            local_comm_id: 1,
            remote_comm_id: 2,
            local_qkey: 0,
            local_qpn: 0xab_cdef,
            vendor_id: 0x12_3456,
            local_eecn: 0,
            starting_psn: 0xff_ffff,
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: 0,
            srq: false,
            local_ca_guid: 0,
            private_data: [0; 196],
        };
        let header = MadHeader { attr_mod: 0xdead_beef, ..MadHeader::cm(attr::REP, 1) };
        CmMad { header, message: CmMessage::Rep(m) }.emit(&mut rep);
        let b = &rep[MAD_HEADER_LEN..];
        assert_eq!(&b[12..24], &[0xab, 0xcd, 0xef, 0x12, 0, 0, 0, 0x34, 0xff, 0xff, 0xff, 0x56]);
        assert_eq!(&rep[20..24], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(CmMad::parse(&rep).unwrap(), CmMad { header, message: CmMessage::Rep(m) });
    }

    #[test]
    fn cma_header_carries_both_families() {
        let mut pd = [0u8; 92];
        let h4 = CmaHeader {
            version: 0,
            src_port: 40000,
            src: "10.0.0.2".parse().unwrap(),
            dst: "10.0.0.1".parse().unwrap(),
        };
        h4.emit(&mut pd);
        assert_eq!(pd[1], 0x40);
        assert_eq!(&pd[16..20], &[10, 0, 0, 2]);
        assert_eq!(CmaHeader::parse(&pd), Some(h4));
        let h6 =
            CmaHeader { src: "fe80::2".parse().unwrap(), dst: "fe80::1".parse().unwrap(), ..h4 };
        h6.emit(&mut pd);
        assert_eq!(CmaHeader::parse(&pd), Some(h6));
        pd[1] = 0x50;
        assert_eq!(CmaHeader::parse(&pd), None);
    }
}
