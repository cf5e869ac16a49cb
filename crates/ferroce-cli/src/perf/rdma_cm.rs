//! perftest's rdma_cm mode (`-R`, `--rdma_cm`), as perftest 4.5 runs it
//! (`create_comm_struct`, `rdma_client_connect`, `rdma_server_connect`,
//! `create_rdma_cm_connection`, `destroy_ctx`), over ferroce's connection manager.
//!
//! Two connections share the test's port (18515) in rdma_cm's port space:
//!
//! 1. The control connection, RC, made first: the client connects, the server accepts with
//!    one receive posted, asking no responder resources either way (the exchange's own
//!    parameters say SEND). Every step of the out-of-band exchange is then one SEND each way
//!    of exactly the step's bytes, the client first; each side keeps a receive posted.
//! 2. After the MTU, an empty key line each way; then the test's queue pairs connect on the
//!    same port (RC: REQ, REP, RTU, one connection per queue pair; UD: a SIDR request per
//!    queue pair in the UDP port space, answered with rdma_cm's Q_Key 0x01234567); then one
//!    more empty key line. perftest's server listens again only once the first empty key line
//!    is through, so its client retries up to ten times, 100 ms apart, while it is refused
//!    (REJ 8, or SIDR status 1); ferroce's server listens all along. READ and atomic tests ask
//!    `-o` outstanding reads each way in the REQ and the REP.
//!
//! The queue pairs are brought up by the connection manager, so the key lines that follow
//! serve only the buffers' addresses and keys (and the printed lines). In the UD latency
//! test the client's first datagram (4 bytes, SEND with immediate = its QPN) tells the server,
//! which posted a receive for it before answering the SIDR request, where to send its own.
//!
//! At the end (after the closing key line, or the last ping-pong where there is none) the
//! RC client disconnects its queue pairs' connections and then the control one; the server
//! waits for that, as perftest's server, which disconnects none itself, leaves it to the
//! client and to the kernel closing its connections when it exits.

use std::cell::RefCell;
use std::io;
use std::net::IpAddr;
use std::time::Duration;

use ferroce::cm::{
    self, CmError, ConnParam, Connection, Listener, SidrStatus, RDMA_UDP_QKEY_DEFAULT,
};
use ferroce::cq::{Completion, WcStatus};
use ferroce::proto::memory::WriteOrder;
use ferroce::proto::wire::Qpn;
use ferroce::qp::{Mtu, Payload, QpCaps, QpType, RecvWr, SendOp, SendWr};
use ferroce::ud::{AddressHandle, UdDest};
use ferroce::{Cq, Nic, Qp, Region, RegionAccess, RegionMemory};

use super::{Connection as Transport, Kind, Settings, TestResources, Verb};

/// The bytes of one control message slot; perftest's messages are at most 56 (a key line),
/// and its receives take 56.
const SLOT: u64 = 256;
/// Receives kept posted on the control queue pair.
const RECEIVES: u64 = 2;
/// The `wr_id` of the control queue pair's SEND.
const SEND_WRID: u64 = u64::MAX;
/// The `wr_id` of the UD latency test's first datagram and of the receive that takes it.
const QPN_WRID: u64 = u64::MAX - 2;
/// perftest's attempts to connect the queue pairs, and the pause between them
/// (`rdma_cm_client_connection`).
const CONNECT_TRIES: u32 = 10;
const CONNECT_PAUSE: Duration = Duration::from_millis(100);
/// How long a connection-manager exchange may take, and how long the server waits for the
/// client's connection requests or the UD latency test's first datagram.
const CM_STEP: Duration = Duration::from_secs(60);
/// How long the server waits for the client to close a connection, and anyone for a DREP.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// `-R`'s out-of-band channel: the control connection rdma_cm made, which carries the
/// exchange as SENDs, and the test's queue pairs' connections, which it makes.
pub(super) struct CmChannel {
    nic: Nic,
    client: bool,
    port: u16,
    /// The peer's address: the server's, or where the control REQ came from.
    peer: IpAddr,
    send_cq: Cq,
    recv_cq: Cq,
    qp: Qp,
    buf: Region,
    control: Connection,
    /// The server's listener in rdma_cm's TCP port space, kept for the queue pairs' requests
    /// until they are connected.
    listener: Option<Listener>,
    /// The RC queue pairs' connections.
    data: Vec<Connection>,
    /// A receive completion [`CmChannel::peer_spoke`] took early.
    pending: RefCell<Option<Completion>>,
}

impl std::fmt::Debug for CmChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmChannel")
            .field("client", &self.client)
            .field("peer", &self.peer)
            .field("control", &self.control)
            .field("data", &self.data)
            .finish_non_exhaustive()
    }
}

/// The control connection's options: RC, no READ or atomic either way (the exchange's
/// parameters say SEND), retries as the test's (7), RNR retries for ever.
fn control_param(nic: &Nic) -> ConnParam {
    ConnParam {
        responder_resources: 0,
        initiator_depth: 0,
        retry_count: 7,
        rnr_retry_count: 7,
        mtu: nic.active_mtu(),
        timeout: CM_STEP,
        ..ConnParam::default()
    }
}

/// The queue pairs' connection options (`rdma_cm_route_handler`,
/// `rdma_cm_connection_request_handler`): READ and atomic tests ask `-o` outstanding
/// requests each way, the others none. ferroce's `--check` of a write test reads the
/// server's target back (`bw::read_back`), which the server's queue pair must allow: only
/// with `--check` does a write test ask one each way (a perftest server grants none on a
/// write test, so a ferroce client cannot check what it wrote into one over `-R`).
fn data_param(s: &Settings, mtu: Mtu) -> ConnParam {
    let rd = match s.verb {
        Verb::Read | Verb::Atomic => s.out_reads.unwrap_or(1),
        Verb::Write if s.check => 1,
        _ => 0,
    };
    ConnParam {
        responder_resources: rd,
        initiator_depth: rd,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: s.has_srq(),
        mtu,
        timeout: CM_STEP,
        ..ConnParam::default()
    }
}

/// perftest's words for a connection-manager failure: the event and its status.
fn event_error(e: &CmError) -> String {
    match e {
        CmError::Rejected { reason, .. } => {
            format!(
                "RDMA CM event error:\nEvent: RDMA_CM_EVENT_REJECTED; error: {}.\n ({e})",
                reason.code()
            )
        }
        CmError::Sidr(status) => {
            format!(
                "RDMA CM event error:\nEvent: RDMA_CM_EVENT_UNREACHABLE; error: {}.\n ({e})",
                status.code()
            )
        }
        CmError::Unreachable | CmError::Timeout { .. } => {
            format!("RDMA CM event error:\nEvent: RDMA_CM_EVENT_UNREACHABLE; error: -110.\n ({e})")
        }
        other => format!("RDMA CM error: {other}"),
    }
}

/// Whether a refusal says that nobody listens yet: REJ 8, SIDR status 1.
fn nobody_listens(e: &CmError) -> bool {
    match e {
        CmError::Rejected { reason, .. } => reason.code() == 8,
        CmError::Sidr(status) => *status == SidrStatus::Unsupported,
        _ => false,
    }
}

/// Waits for a completion on `cq` for up to `timeout`.
fn completion(cq: &Cq, timeout: Duration) -> Option<Completion> {
    cq.wait(timeout)
}

impl CmChannel {
    /// The control queue pair, its CQs and its buffer: one SEND slot, then the receive
    /// slots, each posted.
    fn control_qp(nic: &Nic) -> Result<(Cq, Cq, Qp, Region), String> {
        let error = |e: &dyn std::fmt::Display| {
            format!(" Unable to create the resources needed by comm struct ({e})")
        };
        let send_cq = Cq::new(nic, 8).map_err(|e| error(&e))?;
        let recv_cq = Cq::new(nic, 8).map_err(|e| error(&e))?;
        let caps = QpCaps {
            sq_depth: 2,
            rq_depth: RECEIVES as u32,
            max_inline: 0,
        };
        let qp = Qp::new(nic, QpType::Rc, &send_cq, &recv_cq, caps).map_err(|e| error(&e))?;
        let buf = Region::register(
            nic,
            RegionAccess::Local,
            WriteOrder::InOrder,
            RegionMemory::Host(vec![0; ((1 + RECEIVES) * SLOT) as usize]),
        )
        .map_err(|e| error(&e))?;
        for slot in 1..=RECEIVES {
            post_slot(&qp, &buf, slot).map_err(|e| error(&e))?;
        }
        Ok((send_cq, recv_cq, qp, buf))
    }

    /// The server's side (`rdma_server_connect`): listens on `port` (printing perftest's
    /// banner once listening), accepts one client's control connection with a receive
    /// posted. It goes on without waiting for the RTU, as perftest does: the client speaks
    /// first, and its first SEND establishes the connection if the RTU was lost.
    pub(super) fn accept(nic: &Nic, port: u16) -> Result<Self, String> {
        let listener =
            Listener::bind(nic, port).map_err(|e| format!(" rdma_listen failed ({e})"))?;
        super::print_banner();
        let (send_cq, recv_cq, qp, buf) = Self::control_qp(nic)?;
        let request = loop {
            match listener.get_request(Duration::from_secs(3600)) {
                Ok(request) => break request,
                Err(CmError::Timeout { .. }) => {}
                Err(e) => return Err(format!(" rdma_get_cm_events failed ({e})")),
            }
        };
        let peer = request.from();
        let control = request
            .accept(&qp, &control_param(nic))
            .map_err(|e| format!(" Function rdma_accept failed ({e})"))?;
        Ok(Self {
            nic: nic.clone(),
            client: false,
            port,
            peer,
            send_cq,
            recv_cq,
            qp,
            buf,
            control,
            listener: Some(listener),
            data: Vec::new(),
            pending: RefCell::new(None),
        })
    }

    /// The client's side (`rdma_client_connect`): connects the control queue pair to the
    /// server's `port`, a receive posted first. Refused, it gives up as perftest does (only
    /// the queue pairs' connections are retried).
    pub(super) fn connect(nic: &Nic, server: IpAddr, port: u16) -> Result<Self, String> {
        let (send_cq, recv_cq, qp, buf) = Self::control_qp(nic)?;
        let control =
            Connection::connect(nic, &qp, server, port, &control_param(nic)).map_err(|e| {
                format!(
                    "{}\n Unable to perform rdma_client function",
                    event_error(&e)
                )
            })?;
        Ok(Self {
            nic: nic.clone(),
            client: true,
            port,
            peer: server,
            send_cq,
            recv_cq,
            qp,
            buf,
            control,
            listener: None,
            data: Vec::new(),
            pending: RefCell::new(None),
        })
    }

    /// Whether this side connects.
    pub(super) fn is_client(&self) -> bool {
        self.client
    }

    /// `rdma_write_data`: one SEND of `bytes`, waiting for its completion.
    pub(super) fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        if bytes.len() as u64 > SLOT {
            return Err(io::Error::other("a control message longer than a slot"));
        }
        self.buf.write(0, bytes).map_err(io::Error::other)?;
        let sge = self
            .buf
            .local(0, bytes.len() as u32)
            .map_err(io::Error::other)?;
        let wr = SendWr {
            wr_id: SEND_WRID,
            op: SendOp::Send,
            local: Payload::Sge(sge),
            signaled: true,
            fence: false,
            solicited: false,
            dest: None,
        };
        self.qp.post_send(wr).map_err(io::Error::other)?;
        loop {
            if let Some(wc) = completion(&self.send_cq, Duration::from_secs(1)) {
                return match wc.status {
                    WcStatus::Success => Ok(()),
                    WcStatus::WrFlushErr => Err(closed()),
                    status => Err(io::Error::other(format!("SEND completed with {status}"))),
                };
            }
        }
    }

    /// `rdma_read_data`: the peer's next message into `out` (as many of its bytes as fit,
    /// zeros after a shorter one); the receive is posted again.
    pub(super) fn recv(&mut self, out: &mut [u8]) -> io::Result<()> {
        let pending = self.pending.borrow_mut().take();
        let wc = match pending {
            Some(wc) => wc,
            None => loop {
                if let Some(wc) = completion(&self.recv_cq, Duration::from_secs(1)) {
                    break wc;
                }
            },
        };
        match wc.status {
            WcStatus::Success => {}
            WcStatus::WrFlushErr => return Err(closed()),
            status => {
                return Err(io::Error::other(format!(
                    "a receive completed with {status}"
                )))
            }
        }
        let slot = wc.wr_id;
        let n = (wc.byte_len as usize).min(out.len());
        out.fill(0);
        self.buf
            .read(slot * SLOT, &mut out[..n])
            .map_err(io::Error::other)?;
        post_slot(&self.qp, &self.buf, slot).map_err(io::Error::other)?;
        Ok(())
    }

    /// Whether the peer's next message (or its disconnect) is here; the next [`CmChannel::recv`]
    /// takes it.
    pub(super) fn peer_spoke(&self) -> bool {
        if self.pending.borrow().is_some() {
            return true;
        }
        match self.recv_cq.poll() {
            Some(wc) => {
                *self.pending.borrow_mut() = Some(wc);
                true
            }
            None => false,
        }
    }

    /// Connects the test's queue pairs (`rdma_cm_client_connection`,
    /// `rdma_cm_server_connection`), between the two empty key lines. Returns where each UD
    /// queue pair sends: on the client the server's queue pairs as SIDR named them; on the
    /// server of the UD latency test where each client's first datagram came from; none for
    /// RC, or on the server of the UD bandwidth test, which only receives.
    pub(super) fn connect_queue_pairs(
        &mut self,
        s: &Settings,
        res: &TestResources,
        mtu: Mtu,
    ) -> Result<Vec<UdDest>, String> {
        let result = match (s.connection, self.client) {
            (Transport::Ud, true) => self.resolve_ud(s, res).map(Some),
            (Transport::Ud, false) => self.answer_ud(s, res),
            (_, true) => self.connect_rc(res, &data_param(s, mtu)).map(|()| None),
            (_, false) => self.accept_rc(res, &data_param(s, mtu)).map(|()| None),
        };
        // perftest's server stops listening once its queue pairs are connected.
        self.listener = None;
        result
            .map(Option::unwrap_or_default)
            .map_err(|e| format!("{e}\nFailed to create RDMA CM connection."))
    }

    fn connect_rc(&mut self, res: &TestResources, param: &ConnParam) -> Result<(), String> {
        for qp in &res.qps {
            let mut tries = 0;
            let conn = loop {
                tries += 1;
                match Connection::connect(&res.nic, qp, self.peer, self.port, param) {
                    Ok(conn) => break conn,
                    Err(e) if nobody_listens(&e) && tries < CONNECT_TRIES => {
                        std::thread::sleep(CONNECT_PAUSE);
                    }
                    Err(e) if nobody_listens(&e) => {
                        return Err(format!(
                            "{}\nFailed to connect RDMA CM client, tried {CONNECT_TRIES} times.",
                            event_error(&e)
                        ))
                    }
                    Err(e) => return Err(event_error(&e)),
                }
            };
            self.data.push(conn);
        }
        Ok(())
    }

    fn accept_rc(&mut self, res: &TestResources, param: &ConnParam) -> Result<(), String> {
        let listener = self
            .listener
            .take()
            .ok_or("Failed to listen on RDMA CM server listen ID.")?;
        for qp in &res.qps {
            let request = listener
                .get_request(CM_STEP)
                .map_err(|e| format!("Failed to get RDMA CM event. ({e})"))?;
            let conn = request
                .accept(qp, param)
                .map_err(|e| format!("Failed to accept RDMA CM connection. ({e})"))?;
            self.data.push(conn);
        }
        Ok(())
    }

    /// The UD client: each queue pair resolves one of the server's by SIDR; in the latency
    /// test it then sends its QPN (`rdma_cm_send_ud_connection_parameters`).
    fn resolve_ud(&mut self, s: &Settings, res: &TestResources) -> Result<Vec<UdDest>, String> {
        let mut dests = Vec::with_capacity(res.qps.len());
        for qp in &res.qps {
            ready_ud(qp)?;
            let mut tries = 0;
            let peer = loop {
                tries += 1;
                match cm::resolve_ud(&res.nic, self.peer, self.port, &[], CM_STEP) {
                    Ok(peer) => break peer,
                    Err(e) if nobody_listens(&e) && tries < CONNECT_TRIES => {
                        std::thread::sleep(CONNECT_PAUSE);
                    }
                    Err(e) => return Err(event_error(&e)),
                }
            };
            let dest = peer.address.dest(peer.qpn, peer.qkey);
            if s.kind == Kind::Lat {
                send_qpn(res, qp, dest)?;
            }
            dests.push(dest);
        }
        Ok(dests)
    }

    /// The UD server: answers one SIDR request per queue pair, in the UDP port space of the
    /// same port; in the latency test with a receive posted first for the client's QPN, from
    /// whose completion the answer's address comes (`ibv_create_ah_from_wc`).
    fn answer_ud(
        &mut self,
        s: &Settings,
        res: &TestResources,
    ) -> Result<Option<Vec<UdDest>>, String> {
        let listener = Listener::bind_udp(&res.nic, self.port)
            .map_err(|e| format!("Failed to listen on RDMA CM server listen ID. ({e})"))?;
        let lat = s.kind == Kind::Lat;
        let mut dests = Vec::new();
        for (i, qp) in res.qps.iter().enumerate() {
            ready_ud(qp)?;
            let request = listener
                .get_sidr_request(CM_STEP)
                .map_err(|e| format!("Failed to get RDMA CM event. ({e})"))?;
            if lat {
                post_qpn_receive(res, i)?;
            }
            request
                .accept(qp, RDMA_UDP_QKEY_DEFAULT)
                .map_err(|e| format!("Failed to accept RDMA CM connection. ({e})"))?;
            if lat {
                dests.push(qpn_arrived(res)?);
            }
        }
        Ok(lat.then_some(dests))
    }

    /// Closes the connections as perftest's sides do: the client disconnects its queue pairs'
    /// connections and then the control one; the server waits for that (disconnecting itself
    /// what the client left open after a while). Failures only mean the peer went first.
    pub(super) fn close(self) {
        if self.client {
            for conn in &self.data {
                let _ = conn.disconnect(CLOSE_WAIT);
            }
            let _ = self.control.disconnect(CLOSE_WAIT);
            return;
        }
        for conn in self.data.iter().chain(std::iter::once(&self.control)) {
            if conn.wait_disconnected(CLOSE_WAIT).is_err() {
                let _ = conn.disconnect(CLOSE_WAIT);
            }
        }
        // Stay to answer the client's DREQs again should a DREP have been lost.
        cm::linger(&self.nic, cm::LINGER);
    }
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the peer closed the connection",
    )
}

fn post_slot(qp: &Qp, buf: &Region, slot: u64) -> Result<(), String> {
    let sge = buf
        .local(slot * SLOT, SLOT as u32)
        .map_err(|e| e.to_string())?;
    qp.post_recv(RecvWr {
        wr_id: slot,
        sges: vec![sge],
    })
    .map_err(|e| format!("Function ibv_post_recv failed for RDMA_CM QP ({e})"))
}

/// A UD queue pair to RTS with rdma_cm's Q_Key, as `rdma_create_qp` makes it.
fn ready_ud(qp: &Qp) -> Result<(), String> {
    qp.ready_ud(RDMA_UDP_QKEY_DEFAULT)
        .map_err(|e| format!("Failed to create QP. ({e})"))
}

/// The UD latency client's first datagram: SEND with immediate = its QPN, of the first 4
/// bytes of its buffer as they are (as perftest sends them), waited for.
fn send_qpn(res: &TestResources, qp: &Qp, dest: UdDest) -> Result<(), String> {
    let i = res
        .qps
        .iter()
        .position(|q| q.qpn() == qp.qpn())
        .unwrap_or(0);
    let sge = res
        .region
        .local(res.local_off(i), 4)
        .map_err(|e| e.to_string())?;
    let wr = SendWr {
        wr_id: QPN_WRID,
        op: SendOp::SendWithImm(qp.qpn().value()),
        local: Payload::Sge(sge),
        signaled: true,
        fence: false,
        solicited: false,
        dest: Some(dest),
    };
    let failed = |e: &dyn std::fmt::Display| {
        format!("Failed to send UD connection parameters to the remote node. ({e})")
    };
    qp.post_send(wr).map_err(|e| failed(&e))?;
    match completion(&res.send_cq, CM_STEP) {
        Some(wc) if wc.status == WcStatus::Success => Ok(()),
        Some(wc) => Err(failed(&wc.status)),
        None => Err(failed(&"no completion")),
    }
}

/// The UD latency server's receive for the client's first datagram, into queue pair `i`'s
/// receive buffer (on its shared receive queue, with `--use-srq`).
fn post_qpn_receive(res: &TestResources, i: usize) -> Result<(), String> {
    let (at, len) = res.recv_buffer(i);
    let sge = res
        .region
        .local(at, len as u32)
        .map_err(|e| e.to_string())?;
    let wr = RecvWr {
        wr_id: QPN_WRID,
        sges: vec![sge],
    };
    let posted = match &res.srq {
        Some(srq) => srq.post_recv(wr),
        None => res.qps[i].post_recv(wr),
    };
    posted.map_err(|e| {
        format!("Failed to post receive for RDMA CM UD request connection parameters. ({e})")
    })
}

/// The client's first datagram: where it came from and its QPN, with the server's own Q_Key
/// (`rdma_cm_initialize_ud_connection_parameters`).
fn qpn_arrived(res: &TestResources) -> Result<UdDest, String> {
    let bad = |what: String| {
        format!("Failed to poll CQ.\nBad WQE status when trying to create AH for UD connection in RDMA CM: {what}")
    };
    let wc = completion(&res.recv_cq, CM_STEP).ok_or_else(|| bad("no datagram came".into()))?;
    if wc.status != WcStatus::Success || wc.wr_id != QPN_WRID {
        return Err(bad(format!("Status: {} ; ID: {}.", wc.status, wc.wr_id)));
    }
    let (Some(address), Some(imm)) = (AddressHandle::from_completion(&wc), wc.imm) else {
        return Err(bad("no address or no immediate data".into()));
    };
    Ok(address.dest(Qpn::from_low_bits(imm), RDMA_UDP_QKEY_DEFAULT))
}
