//! The verbs-level vocabulary of queue pairs: types, states, attributes, work requests and
//! completions, shared by the engine and every layer above it.
//!
//! Names follow `ibv_*` where users look for them (states, `WcStatus` with rdma-core's
//! strings), in Rust's idiom otherwise.

use core::fmt;
use core::time::Duration;
use std::net::{IpAddr, SocketAddr};

use crate::memory::{Access, PdId};
use crate::wire::{Qpn, RnrTimer};
use crate::Psn;

/// The transport service of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable Connected: acknowledged, retransmitted, every verb.
    Rc,
    /// Unreliable Connected: SEND and WRITE only, no acknowledgements, no retransmission.
    Uc,
    /// Unreliable Datagram: SEND of one packet at most, to any QP a work request names; no
    /// connection, no acknowledgements, no retransmission.
    Ud,
}

/// The Q_Key of QP 1, the GSI (`IB_QP1_QKEY`): the only one it sends and accepts.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// The bytes at the start of every UD receive buffer, before the payload: 20 zero bytes and
/// the received IPv4 header, or the IPv6 header (what libibverbs' `ibv_init_ah_from_wc` reads).
pub const UD_GRH_LEN: usize = 40;

/// A shared receive queue's number on its engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqId(pub u32);

/// Where a UD send goes (the address handle, remote QPN and Q_Key of `ibv_send_wr.wr.ud`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// The peer NIC's address and UDP port (4791).
    pub peer: SocketAddr,
    /// The destination queue pair.
    pub qpn: Qpn,
    /// The Q_Key to send; a value with the top bit set means the sending QP's own (IBTA
    /// C10-15), as verbs does.
    pub qkey: u32,
}

/// Who sent a datagram a UD receive completed with (`ibv_wc.src_qp` and the GRH's source).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdSource {
    /// The sending queue pair (the DETH's source QP).
    pub qpn: Qpn,
    /// The sender's IP address.
    pub ip: IpAddr,
}

/// An asynchronous event of the engine (`struct ibv_async_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// An armed SRQ fell below its limit (`IBV_EVENT_SRQ_LIMIT_REACHED`); the limit is now
    /// disarmed until set again.
    SrqLimitReached(SrqId),
    /// A QP attached to an SRQ entered ERR and will take no more of its receives
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached(Qpn),
}

/// A queue pair's state (IBTA Vol. 1 §10.3.1; `enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created or reset: nothing is processed.
    Reset,
    /// Initialised: receive requests may be posted, nothing is processed.
    Init,
    /// Ready to receive: the responder runs.
    Rtr,
    /// Ready to send: requester and responder run.
    Rts,
    /// Send queue drained: no new requests start; outstanding ones finish.
    Sqd,
    /// Error: every outstanding work request completes with a flush error.
    Err,
}

impl QpState {
    /// The `enum ibv_qp_state` value (RESET 0 … ERR 6).
    #[must_use]
    pub const fn ibv_value(self) -> u32 {
        match self {
            Self::Reset => 0,
            Self::Init => 1,
            Self::Rtr => 2,
            Self::Rts => 3,
            Self::Sqd => 4,
            Self::Err => 6,
        }
    }

    /// The state of an `enum ibv_qp_state` value: the inverse of [`QpState::ibv_value`];
    /// `None` for SQE (5), which ferroce never enters, and for unknown values.
    ///
    /// ```
    /// use ferroce_proto::qp::QpState;
    /// for v in [0, 1, 2, 3, 4, 6] {
    ///     assert_eq!(QpState::from_ibv_value(v).unwrap().ibv_value(), v);
    /// }
    /// assert_eq!(QpState::from_ibv_value(5), None);
    /// ```
    #[must_use]
    pub const fn from_ibv_value(value: u32) -> Option<Self> {
        Some(match value {
            0 => Self::Reset,
            1 => Self::Init,
            2 => Self::Rtr,
            3 => Self::Rts,
            4 => Self::Sqd,
            6 => Self::Err,
            _ => return None,
        })
    }
}

/// A path MTU (`enum ibv_mtu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    M256,
    /// 512 bytes.
    M512,
    /// 1024 bytes.
    M1024,
    /// 2048 bytes.
    M2048,
    /// 4096 bytes.
    M4096,
}

impl Mtu {
    /// The payload bytes per packet.
    #[must_use]
    pub const fn bytes(self) -> u32 {
        match self {
            Self::M256 => 256,
            Self::M512 => 512,
            Self::M1024 => 1024,
            Self::M2048 => 2048,
            Self::M4096 => 4096,
        }
    }

    /// The MTU of exactly `bytes`, if it is one of the five.
    #[must_use]
    pub const fn from_bytes(bytes: u32) -> Option<Self> {
        match bytes {
            256 => Some(Self::M256),
            512 => Some(Self::M512),
            1024 => Some(Self::M1024),
            2048 => Some(Self::M2048),
            4096 => Some(Self::M4096),
            _ => None,
        }
    }

    /// The largest path MTU a link of `link_mtu` bytes carries, as rxe sets a port's
    /// `active_mtu` from its network device: what is left after 80 bytes of headers, rounded
    /// down to one of the five (1500 → 1024, 9000 → 4096); 256 for links smaller still.
    ///
    /// ```
    /// use ferroce_proto::qp::Mtu;
    /// assert_eq!(Mtu::for_link(1500), Mtu::M1024);
    /// assert_eq!(Mtu::for_link(2128), Mtu::M2048);
    /// assert_eq!(Mtu::for_link(2127), Mtu::M1024);
    /// assert_eq!(Mtu::for_link(9000), Mtu::M4096);
    /// assert_eq!(Mtu::for_link(65536), Mtu::M4096);
    /// assert_eq!(Mtu::for_link(0), Mtu::M256);
    /// ```
    #[must_use]
    pub const fn for_link(link_mtu: u32) -> Self {
        match link_mtu.saturating_sub(80) {
            4096.. => Self::M4096,
            2048.. => Self::M2048,
            1024.. => Self::M1024,
            512.. => Self::M512,
            _ => Self::M256,
        }
    }

    /// The MTU of an `enum ibv_mtu` value (1 for 256 … 5 for 4096), as `ibv_query_port`
    /// reports it and the out-of-band tools exchange it; `None` for any other value.
    ///
    /// ```
    /// use ferroce_proto::qp::Mtu;
    /// assert_eq!(Mtu::from_ibv_value(3), Some(Mtu::M1024));
    /// assert_eq!(Mtu::from_ibv_value(0), None);
    /// ```
    #[must_use]
    pub const fn from_ibv_value(value: i64) -> Option<Self> {
        match value {
            1 => Some(Self::M256),
            2 => Some(Self::M512),
            3 => Some(Self::M1024),
            4 => Some(Self::M2048),
            5 => Some(Self::M4096),
            _ => None,
        }
    }

    /// The `enum ibv_mtu` value (1 for 256 … 5 for 4096), as the out-of-band tools exchange it.
    #[must_use]
    pub const fn ibv_value(self) -> u8 {
        match self {
            Self::M256 => 1,
            Self::M512 => 2,
            Self::M1024 => 3,
            Self::M2048 => 4,
            Self::M4096 => 5,
        }
    }
}

/// A completion queue's handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqId(pub u32);

/// The capacities of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send work requests outstanding at once.
    pub sq_depth: u32,
    /// Receive work requests outstanding at once.
    pub rq_depth: u32,
    /// The largest inline send, in bytes.
    pub max_inline: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        Self {
            sq_depth: 128,
            rq_depth: 128,
            max_inline: 400,
        }
    }
}

/// What a queue pair is created with (`struct ibv_qp_init_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInit {
    /// RC or UC.
    pub qp_type: QpType,
    /// The protection domain its work requests and peers' requests are checked against.
    pub pd: PdId,
    /// Where send completions go.
    pub send_cq: CqId,
    /// Where receive completions go.
    pub recv_cq: CqId,
    /// Queue capacities.
    pub caps: QpCaps,
    /// Whether every send work request completes with a CQE, signaled or not.
    pub sq_sig_all: bool,
    /// The shared receive queue its receives come from, instead of a queue of its own.
    pub srq: Option<SrqId>,
}

/// Attributes for [`crate::engine::Engine::modify_qp`] (`struct ibv_qp_attr`); `None` leaves
/// a value as it is. Each transition requires some of them, as IBTA table 90 (and Linux's
/// `ib_modify_qp_is_ok`) says:
///
/// | transition | RC requires | UC requires |
/// |---|---|---|
/// | RESET → INIT | `access` | `access` |
/// | INIT → RTR | `peer`, `path_mtu`, `dest_qpn`, `rq_psn`, `max_dest_rd_atomic`, `min_rnr_timer` | `peer`, `path_mtu`, `dest_qpn`, `rq_psn` |
/// | RTR → RTS | `sq_psn`, `timeout`, `retry_cnt`, `rnr_retry`, `max_rd_atomic` | `sq_psn` |
///
/// UD needs `access` and `qkey` at RESET → INIT, nothing at INIT → RTR and `sq_psn` at RTR →
/// RTS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// The state to move to.
    pub state: Option<QpState>,
    /// Remote access the responder allows (REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC).
    pub access: Option<Access>,
    /// Path MTU.
    pub path_mtu: Option<Mtu>,
    /// The peer QP.
    pub dest_qpn: Option<Qpn>,
    /// The peer's address and UDP port (the address vector).
    pub peer: Option<SocketAddr>,
    /// The first PSN the responder expects.
    pub rq_psn: Option<Psn>,
    /// The first PSN the requester sends.
    pub sq_psn: Option<Psn>,
    /// READ and atomic requests the responder keeps for replay (rounded up to a power of 2).
    pub max_dest_rd_atomic: Option<u8>,
    /// READ and atomic requests the requester keeps outstanding.
    pub max_rd_atomic: Option<u8>,
    /// The RNR timer the responder asks the requester to wait.
    pub min_rnr_timer: Option<RnrTimer>,
    /// Local ACK timeout: 4.096 µs × 2^timeout; 0 waits forever. At most 31.
    pub timeout: Option<u8>,
    /// Retries after a timeout or sequence NAK, 0–7 (7 means seven, as IBTA says).
    pub retry_cnt: Option<u8>,
    /// Retries after an RNR NAK, 0–7; 7 means retry forever.
    pub rnr_retry: Option<u8>,
    /// A UD queue pair's Q_Key, which arriving datagrams must carry (required at RESET → INIT
    /// for UD; QP 1's is always [`GSI_QKEY`]).
    pub qkey: Option<u32>,
}

/// The local ACK timeout for an `ibv_qp_attr.timeout` value: 4.096 µs × 2^`timeout`, or
/// `None` (wait forever) for 0.
#[must_use]
pub fn ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        None
    } else {
        Some(Duration::from_nanos(4096u64 << timeout.min(31)))
    }
}

/// Why a queue pair could not be modified.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModifyError {
    /// No queue pair has this number.
    #[error("no queue pair {0}")]
    UnknownQp(Qpn),
    /// IBTA does not allow this transition.
    #[error("cannot move a queue pair from {from:?} to {to:?}")]
    InvalidTransition {
        /// The current state.
        from: QpState,
        /// The state asked for.
        to: QpState,
    },
    /// The transition needs an attribute that was not given.
    #[error("moving to {to:?} needs the {attr} attribute")]
    Missing {
        /// The state asked for.
        to: QpState,
        /// The attribute's name in `QpAttr`.
        attr: &'static str,
    },
    /// An attribute's value is out of range.
    #[error("{attr} = {value} is out of range ({expected})")]
    InvalidValue {
        /// The attribute.
        attr: &'static str,
        /// The value given.
        value: u64,
        /// What is allowed.
        expected: &'static str,
    },
    /// A verbs device refused the transition; the text says what it returned and what
    /// usually causes it.
    #[error("{0}")]
    Device(String),
}

/// One entry of a gather or scatter list: `len` bytes at `addr` of the region with `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Start address, in the region's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// The region's local key.
    pub lkey: u32,
}

/// A remote buffer: an address in the peer's region and the key that grants it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteAddr {
    /// The peer's virtual address.
    pub va: u64,
    /// The peer's remote key.
    pub rkey: u32,
}

/// The operation of a send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// SEND: consumes a receive request at the peer.
    Send,
    /// SEND with 4 bytes of immediate data.
    SendWithImm(u32),
    /// RDMA WRITE into the peer's memory.
    Write(RemoteAddr),
    /// RDMA WRITE, then immediate data that consumes a receive request at the peer.
    WriteWithImm(RemoteAddr, u32),
    /// RDMA READ from the peer's memory into the local scatter list (RC only).
    Read(RemoteAddr),
    /// 8-byte compare-and-swap; the original value lands in the local 8-byte entry (RC only).
    CompareSwap {
        /// The 8-byte, 8-aligned target.
        remote: RemoteAddr,
        /// The value to compare with.
        compare: u64,
        /// The value to store when equal.
        swap: u64,
    },
    /// 8-byte fetch-and-add; the original value lands in the local 8-byte entry (RC only).
    FetchAdd {
        /// The 8-byte, 8-aligned target.
        remote: RemoteAddr,
        /// The value to add.
        add: u64,
    },
}

impl SendOp {
    /// Whether the operation reads from the peer (READ, atomics): it needs a responder
    /// resource and a read/atomic credit.
    #[must_use]
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            Self::Read(_) | Self::CompareSwap { .. } | Self::FetchAdd { .. }
        )
    }
}

/// Where a send work request's local bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// A gather list (for SEND and WRITE) or a scatter list (for READ and atomics).
    Sges(Vec<Sge>),
    /// A list of one entry, the common case, which costs no allocation to post.
    Sge(Sge),
    /// Bytes copied at post time (`IBV_SEND_INLINE`), at most the QP's `max_inline`.
    Inline(Vec<u8>),
}

/// A send work request (`struct ibv_send_wr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// The local bytes.
    pub local: Payload,
    /// Whether it completes with a CQE on success (`IBV_SEND_SIGNALED`).
    pub signaled: bool,
    /// Wait for earlier READ and atomic requests to finish first (`IBV_SEND_FENCE`).
    pub fence: bool,
    /// Ask the peer for a solicited event (`IBV_SEND_SOLICITED`).
    pub solicited: bool,
    /// Where a UD queue pair sends it; required on UD, refused elsewhere.
    pub dest: Option<UdDest>,
}

impl SendWr {
    /// A signaled request with no fence or solicited event.
    #[must_use]
    pub fn new(wr_id: u64, op: SendOp, local: Payload) -> Self {
        Self {
            wr_id,
            op,
            local,
            signaled: true,
            fence: false,
            solicited: false,
            dest: None,
        }
    }

    /// A signaled UD request to `dest`.
    #[must_use]
    pub fn to(wr_id: u64, op: SendOp, local: Payload, dest: UdDest) -> Self {
        Self {
            dest: Some(dest),
            ..Self::new(wr_id, op, local)
        }
    }
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where an incoming SEND's bytes go.
    pub sges: Vec<Sge>,
}

/// Why a work request could not be posted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PostError {
    /// No queue pair has this number.
    #[error("no queue pair {0}")]
    UnknownQp(Qpn),
    /// The queue pair's state does not accept this kind of request.
    #[error("a queue pair in state {0:?} does not accept this request")]
    InvalidState(QpState),
    /// The queue is full; wait for completions.
    #[error("the queue is full ({0} outstanding)")]
    QueueFull(u32),
    /// The operation does not exist on this transport (READ or atomics on UC).
    #[error("{0:?} is not supported on a UC queue pair")]
    Unsupported(SendOp),
    /// The inline data is longer than `max_inline`.
    #[error("{len} inline bytes exceed max_inline {max}")]
    InlineTooLong {
        /// The bytes given.
        len: usize,
        /// The limit.
        max: u32,
    },
    /// The message is longer than 2^31 bytes, or an atomic's local entry is not 8 bytes.
    #[error("bad length {0}")]
    Length(u64),
    /// A UD send is longer than the path MTU: a datagram is one packet (rxe would report
    /// success and send nothing).
    #[error("a {len}-byte datagram exceeds the {mtu}-byte MTU")]
    DatagramTooLong {
        /// The message's length.
        len: u64,
        /// The MTU.
        mtu: u32,
    },
    /// A UD send names no destination, or a connected QP's send names one.
    #[error("a UD send needs a destination (SendWr::dest), and only a UD send takes one")]
    Destination,
    /// A UD destination of the other IP family than the NIC's.
    #[error("{0} is not of the NIC's address family")]
    AddressFamily(IpAddr),
    /// The queue pair takes its receives from a shared receive queue: post there.
    #[error("queue pair {0} takes its receives from a shared receive queue")]
    UsesSrq(Qpn),
    /// No shared receive queue has this number.
    #[error("no shared receive queue {0:?}")]
    UnknownSrq(SrqId),
    /// A verbs device refused the request; the text says what it returned.
    #[error("the device refused the request: {0}")]
    Device(String),
}

/// The status of a completion (`enum ibv_wc_status`); `Display` prints rdma-core's string
/// (`ibv_wc_status_str`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcStatus {
    /// The request completed.
    Success,
    /// A message was longer than the receive buffer, or a length was wrong.
    LocLenErr,
    /// The local queue pair hit an internal inconsistency.
    LocQpOpErr,
    /// A local key, range or access right was wrong.
    LocProtErr,
    /// The queue pair entered the error state before this request completed.
    WrFlushErr,
    /// The responder's answer made no sense.
    BadRespErr,
    /// The responder refused the request as invalid (NAK code 1).
    RemInvReqErr,
    /// The responder refused the key, range or access (NAK code 2).
    RemAccessErr,
    /// The responder failed to execute the request (NAK code 3).
    RemOpErr,
    /// No acknowledgement came after `retry_cnt` retries.
    RetryExcErr,
    /// The responder stayed not ready after `rnr_retry` retries.
    RnrRetryExcErr,
    /// A local access right was wrong (a verbs device reports it; the soft engine says
    /// `LocProtErr`).
    LocAccessErr,
    /// A status the soft engine never produces, as a verbs device reported it
    /// (`enum ibv_wc_status`).
    Other(u32),
}

impl WcStatus {
    /// The `enum ibv_wc_status` value.
    #[must_use]
    pub const fn ibv_value(self) -> u32 {
        match self {
            Self::Success => 0,
            Self::LocLenErr => 1,
            Self::LocQpOpErr => 2,
            Self::LocProtErr => 4,
            Self::WrFlushErr => 5,
            Self::BadRespErr => 7,
            Self::LocAccessErr => 8,
            Self::RemInvReqErr => 9,
            Self::RemAccessErr => 10,
            Self::RemOpErr => 11,
            Self::RetryExcErr => 12,
            Self::RnrRetryExcErr => 13,
            Self::Other(value) => value,
        }
    }
}

impl WcStatus {
    /// The status of an `enum ibv_wc_status` value, as a verbs device reports it: the inverse
    /// of [`WcStatus::ibv_value`]; a value the soft engine never produces is
    /// [`WcStatus::Other`].
    ///
    /// ```
    /// use ferroce_proto::qp::WcStatus;
    /// for v in 0..=21 {
    ///     assert_eq!(WcStatus::from_ibv_value(v).ibv_value(), v);
    /// }
    /// assert_eq!(WcStatus::from_ibv_value(7), WcStatus::BadRespErr);
    /// ```
    #[must_use]
    pub const fn from_ibv_value(value: u32) -> Self {
        match value {
            0 => Self::Success,
            1 => Self::LocLenErr,
            2 => Self::LocQpOpErr,
            4 => Self::LocProtErr,
            5 => Self::WrFlushErr,
            7 => Self::BadRespErr,
            8 => Self::LocAccessErr,
            9 => Self::RemInvReqErr,
            10 => Self::RemAccessErr,
            11 => Self::RemOpErr,
            12 => Self::RetryExcErr,
            13 => Self::RnrRetryExcErr,
            other => Self::Other(other),
        }
    }
}

impl WcStatus {
    /// What most often causes this status, and where to look: a sentence for a person, for
    /// the statuses whose rdma-core text names the symptom but not the cause. `None` for
    /// success and for statuses that say enough.
    ///
    /// ```
    /// use ferroce_proto::qp::WcStatus;
    /// assert!(WcStatus::RetryExcErr.hint().unwrap().contains("answered"));
    /// assert_eq!(WcStatus::Success.hint(), None);
    /// ```
    #[must_use]
    pub const fn hint(self) -> Option<&'static str> {
        Some(match self {
            Self::LocLenErr => {
                "a message was longer than the receive buffer posted for it, or a scatter \
                 list's lengths do not add up"
            }
            Self::LocProtErr | Self::LocAccessErr => {
                "a scatter entry names no live region of this NIC (its lkey), or runs past the \
                 region's end"
            }
            Self::WrFlushErr => {
                "the QP moved to the error state before this request ran: look at the first \
                 completion that failed before it, or at a disconnect"
            }
            Self::RemInvReqErr => {
                "the peer's QP refused the operation itself: one its type does not take (READ \
                 or an atomic on UC), an unaligned atomic, or a message longer than it allows"
            }
            Self::RemAccessErr => {
                "the peer refused the remote address: check that the rkey is one the peer \
                 registered and still holds, that address plus length lies inside that region, \
                 and that the region and the peer's QP grant this access (remote write, read \
                 or atomic)"
            }
            Self::RemOpErr => "the peer could not carry out the request (its memory failed)",
            Self::RetryExcErr => {
                "nothing answered after every retry: is the peer's NIC up at the address \
                 given, is its QP connected to this one (this QPN and PSN, RTR at least), and \
                 does UDP port 4791 reach it?"
            }
            Self::RnrRetryExcErr => {
                "the peer had no receive posted for a SEND after every RNR retry: post \
                 receives before the sender sends, or raise rnr_retry (7 retries without limit)"
            }
            Self::Success | Self::BadRespErr | Self::LocQpOpErr | Self::Other(_) => return None,
        })
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Self::Other(value) = self {
            return write!(f, "status {value}");
        }
        f.write_str(match self {
            Self::Success => "success",
            Self::LocLenErr => "local length error",
            Self::LocQpOpErr => "local QP operation error",
            Self::LocProtErr => "local protection error",
            Self::WrFlushErr => "Work Request Flushed Error",
            Self::BadRespErr => "bad response error",
            Self::RemInvReqErr => "remote invalid request error",
            Self::RemAccessErr => "remote access error",
            Self::RemOpErr => "remote operation error",
            Self::RetryExcErr => "transport retry counter exceeded",
            Self::RnrRetryExcErr => "RNR retry counter exceeded",
            Self::LocAccessErr => "local access error",
            Self::Other(_) => "",
        })
    }
}

/// What a completion completed (`enum ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A SEND (with or without immediate).
    Send,
    /// An RDMA WRITE (with or without immediate).
    RdmaWrite,
    /// An RDMA READ.
    RdmaRead,
    /// A compare-and-swap.
    CompSwap,
    /// A fetch-and-add.
    FetchAdd,
    /// A received SEND.
    Recv,
    /// A received RDMA WRITE with immediate.
    RecvRdmaWithImm,
}

/// A work completion (`struct ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was.
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred.
    pub byte_len: u32,
    /// Immediate data, for receives of SEND or WRITE with immediate.
    pub imm: Option<u32>,
    /// The local queue pair (for a receive from a shared receive queue, the QP it came in
    /// on).
    pub qpn: Qpn,
    /// For a UD receive: who sent it.
    pub ud: Option<UdSource>,
}
