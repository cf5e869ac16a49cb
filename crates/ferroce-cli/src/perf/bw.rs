//! The bandwidth loops: the client keeps up to `tx-depth` requests in flight per queue pair
//! and asks for a completion every `cq-mod` requests (`run_iter_bw`); the SEND server keeps
//! receives posted, on each queue pair or on their shared receive queue, and counts them
//! (`run_iter_bw_server`).

use std::time::{Duration, Instant};

use ferroce::cq::{Completion, WcStatus};
use ferroce::qp::{Payload, RecvWr, RemoteAddr, SendOp, SendWr};
use ferroce::ud::UD_GRH_LEN;

use super::oob::{BwReport, Comm, KeyLine};
use super::{mismatch, peer_ip, AtomicType, Connection, Settings, TestResources, Verb};

/// How long a loop waits without any progress before it gives up on the peer.
pub(super) const STALL: Duration = Duration::from_secs(30);

/// How often an idle loop looks at the TCP connection.
const PEEK_EVERY: Duration = Duration::from_millis(2);

/// How long the SEND server keeps taking messages after the client said it is done (its
/// last packets may still be on their way behind the TCP message) before it stops.
const DRAIN: Duration = Duration::from_millis(50);

/// The `wr_id`s of the extra requests `--check` posts, above any traffic's.
const CHECK_WRID: u64 = u64::MAX - 1;

/// perftest's `NOTIFY_COMP_ERROR_SEND`, with rdma-core's name of the status.
pub(super) fn send_error(wc: &Completion, scnt: u64, ccnt: u64) -> String {
    format!(
        " Completion with error at client\n Failed status {}: wr_id {} syndrom 0x0 ({})\nscnt={scnt}, ccnt={ccnt}",
        wc.status.ibv_value(),
        wc.wr_id,
        wc.status
    )
}

/// perftest's `NOTIFY_COMP_ERROR_RECV`, with rdma-core's name of the status.
pub(super) fn recv_error(wc: &Completion, rcnt: u64) -> String {
    format!(
        " Completion with error at server\n Failed status {}: wr_id {} syndrom 0x0 ({})\n rcnt={rcnt}",
        wc.status.ibv_value(),
        wc.wr_id,
        wc.status
    )
}

fn stalled(what: &str) -> String {
    format!(
        " No completion for {} s while {what}: is the peer still there?",
        STALL.as_secs()
    )
}

/// The operation a request of queue pair `peer` carries.
fn operation(s: &Settings, peer: &KeyLine) -> SendOp {
    let remote = RemoteAddr {
        va: peer.vaddr,
        rkey: peer.rkey,
    };
    match (s.verb, s.atomic) {
        (Verb::Send, _) => SendOp::Send,
        (Verb::Write, _) => SendOp::Write(remote),
        (Verb::Read, _) => SendOp::Read(remote),
        (Verb::Atomic, AtomicType::FetchAdd) => SendOp::FetchAdd { remote, add: 1 },
        (Verb::Atomic, AtomicType::CmpSwap) => SendOp::CompareSwap {
            remote,
            compare: 0,
            swap: 0,
        },
    }
}

/// A request of queue pair `i`: its local area as the gather (or scatter) list; on UD, to
/// the peer's queue pair.
pub(super) fn request(
    res: &TestResources,
    i: usize,
    op: SendOp,
    len: u64,
    wr_id: u64,
    signaled: bool,
) -> Result<SendWr, String> {
    let sge = res
        .region
        .local(res.local_off(i), len as u32)
        .map_err(|e| e.to_string())?;
    Ok(SendWr {
        wr_id,
        op,
        local: Payload::Sge(sge),
        signaled,
        fence: false,
        solicited: false,
        dest: res.dest(i),
    })
}

/// Posts one signaled request on queue pair `i` and waits for its completion; the traffic
/// of that queue pair must have completed.
fn post_and_wait(res: &TestResources, i: usize, wr: SendWr) -> Result<(), String> {
    let wr_id = wr.wr_id;
    res.qps[i]
        .post_send(wr)
        .map_err(|e| format!(" Couldn't post send: {e}"))?;
    let since = Instant::now();
    loop {
        match res.send_cq.poll() {
            Some(wc) if wc.status != WcStatus::Success => return Err(send_error(&wc, 1, 0)),
            Some(wc) if wc.wr_id == wr_id => return Ok(()),
            Some(_) => {}
            None if since.elapsed() > STALL => return Err(stalled("checking")),
            None => std::thread::yield_now(),
        }
    }
}

/// The 8-byte counter at the peer's target, read with a fetch-and-add of 0.
fn remote_counter(res: &TestResources, i: usize, peer: &KeyLine) -> Result<u64, String> {
    let remote = RemoteAddr {
        va: peer.vaddr,
        rkey: peer.rkey,
    };
    let op = SendOp::FetchAdd { remote, add: 0 };
    post_and_wait(res, i, request(res, i, op, 8, CHECK_WRID, true)?)?;
    let bytes = res.read(res.local_off(i), 8)?;
    Ok(u64::from_ne_bytes(bytes.try_into().expect("8 bytes")))
}

/// Reads the peer's target area back, a chunk at a time (a READ of megabytes would arrive as
/// one burst of thousands of packets), into our own target area, and compares it with the
/// pattern.
fn read_back(res: &TestResources, i: usize, peer: &KeyLine, len: u64) -> Result<(), String> {
    const CHUNK: u64 = 32 * 1024;
    let scratch = res.target_off(i);
    let mut at = 0;
    while at < len {
        let n = CHUNK.min(len - at);
        res.fill(scratch, &vec![0; n as usize])?;
        let sge = res
            .region
            .local(scratch, n as u32)
            .map_err(|e| e.to_string())?;
        let op = SendOp::Read(RemoteAddr {
            va: peer.vaddr + at,
            rkey: peer.rkey,
        });
        let wr = SendWr {
            wr_id: CHECK_WRID,
            op,
            local: Payload::Sge(sge),
            signaled: true,
            fence: false,
            solicited: false,
            dest: None,
        };
        post_and_wait(res, i, wr)?;
        let back = res.read(scratch, n)?;
        if let Some(k) = mismatch(&back, at) {
            return Err(check_failed(
                "remote target",
                i,
                at as usize + k,
                back[k],
                0,
            ));
        }
        at += n;
    }
    Ok(())
}

fn check_failed(what: &str, i: usize, at: usize, got: u8, start: u64) -> String {
    format!(
        " Data check failed: byte {at} of queue pair {i}'s {what} is {got:#04x}, expected {:#04x}",
        super::pattern_byte(start + at as u64)
    )
}

/// The client's bandwidth run of one message size.
pub(super) fn client(
    s: &Settings,
    res: &TestResources,
    peers: &[KeyLine],
    size: u64,
) -> Result<BwReport, String> {
    let q = res.qps.len();
    let len = if s.verb == Verb::Atomic { 8 } else { size };
    let fetch_add = s.verb == Verb::Atomic && s.atomic == AtomicType::FetchAdd;
    let mut counters_before = Vec::new();
    if s.check {
        for (i, peer) in peers.iter().enumerate() {
            match s.verb {
                Verb::Read => res.fill(res.local_off(i), &vec![0; len as usize])?,
                Verb::Atomic if fetch_add => counters_before.push(remote_counter(res, i, peer)?),
                _ => {}
            }
        }
    }
    let ops: Vec<SendOp> = peers.iter().map(|p| operation(s, p)).collect();
    let iters = if s.duration.is_some() {
        u64::MAX
    } else {
        s.iters
    };
    let (depth, moderation) = (u64::from(s.tx_depth), u64::from(s.cq_mod));
    let record = s.duration.is_none();
    let capacity = if record { (s.iters as usize) * q } else { 0 };
    let mut tposted: Vec<Instant> = Vec::with_capacity(capacity);
    let mut tcompleted: Vec<Instant> = Vec::with_capacity(capacity);
    let (mut posted, mut completed) = (vec![0u64; q], vec![0u64; q]);
    let mut last_signaled = vec![0u64; q];
    let (mut scnt, mut ccnt) = (0u64, 0u64);
    let start = Instant::now();
    let deadline = s.duration.map(|d| start + d);
    let mut last_progress = start;
    // The requests that fit in a queue pair's send queue are posted as one list, as a NIC
    // takes a chain of them behind one doorbell: their packets leave together.
    let mut list = Vec::with_capacity(depth as usize);
    loop {
        let now = Instant::now();
        let stop = deadline.is_some_and(|d| now >= d);
        if !stop {
            for i in 0..q {
                list.clear();
                while posted[i] + (list.len() as u64) < iters
                    && posted[i] + (list.len() as u64) - completed[i] < depth
                {
                    let seq = posted[i] + list.len() as u64;
                    let signaled = (seq + 1) % moderation == 0 || seq + 1 == iters;
                    let wr_id = (i as u64) << 32 | (seq & 0xffff_ffff);
                    list.push(request(res, i, ops[i], len, wr_id, signaled)?);
                }
                let n = list.len();
                if n == 0 {
                    continue;
                }
                // Stamped before the post, which sends them: a request's time runs from when
                // the tool handed it over, as perftest stamps each ibv_post_send.
                let at = Instant::now();
                res.qps[i]
                    .post_send_list(list.drain(..))
                    .map_err(|(k, e)| {
                        format!(" Couldn't post send: qp {i} scnt={} ({e})", scnt + k as u64)
                    })?;
                for k in 0..n as u64 {
                    let seq = posted[i] + k;
                    if record {
                        tposted.push(at);
                    }
                    if (seq + 1) % moderation == 0 || seq + 1 == iters {
                        last_signaled[i] = seq + 1;
                    }
                }
                posted[i] += n as u64;
                scnt += n as u64;
            }
        }
        let mut progressed = false;
        while let Some(wc) = res.send_cq.poll() {
            if wc.status != WcStatus::Success {
                return Err(send_error(&wc, scnt, ccnt));
            }
            let i = (wc.wr_id >> 32) as usize;
            let seq = wc.wr_id & 0xffff_ffff;
            let Some(done) = completed.get_mut(i) else {
                continue;
            };
            let newly = (seq + 1).saturating_sub(*done);
            *done = seq + 1;
            ccnt += newly;
            if record {
                let now = Instant::now();
                tcompleted.extend(std::iter::repeat_n(now, newly as usize));
            }
            progressed = true;
        }
        let finished = if stop {
            (0..q).all(|i| completed[i] >= last_signaled[i])
        } else {
            deadline.is_none() && completed.iter().all(|&c| c >= iters)
        };
        if finished {
            break;
        }
        if progressed {
            last_progress = Instant::now();
        } else {
            if last_progress.elapsed() > STALL {
                return Err(stalled("sending"));
            }
            std::thread::yield_now();
        }
    }
    let end = Instant::now();

    if s.check {
        for (i, peer) in peers.iter().enumerate() {
            match s.verb {
                Verb::Write if s.connection == Connection::Rc => read_back(res, i, peer, len)?,
                Verb::Read => {
                    let got = res.read(res.local_off(i), len)?;
                    if let Some(at) = mismatch(&got, 0) {
                        return Err(check_failed("READ destination", i, at, got[at], 0));
                    }
                }
                Verb::Atomic if fetch_add => {
                    // The probe completes after every request before it, signaled or not.
                    let after = remote_counter(res, i, peer)?;
                    let added = after.wrapping_sub(counters_before[i]);
                    if added != posted[i] {
                        return Err(format!(
                            " Data check failed: queue pair {i}'s remote counter went up by {added}, \
                             expected {}",
                            posted[i]
                        ));
                    }
                }
                Verb::Atomic => {
                    let fetched = res.read(res.local_off(i), 8)?;
                    let value = u64::from_ne_bytes(fetched.try_into().expect("8 bytes"));
                    if value != 0 {
                        return Err(format!(
                            " Data check failed: compare-and-swap on queue pair {i} fetched {value}, expected 0"
                        ));
                    }
                }
                _ => {}
            }
        }
    }

    let total: u64 = completed.iter().sum();
    let secs = if record {
        match (tposted.first(), tcompleted.last()) {
            (Some(first), Some(last)) => last.duration_since(*first).as_secs_f64(),
            _ => 0.0,
        }
    } else {
        end.duration_since(start).as_secs_f64()
    };
    let peak_ops = if record && !s.no_peak {
        peak_rate(&tposted, &tcompleted)
    } else {
        0.0
    };
    // perftest counts the iterations of every queue pair.
    Ok(make_report(
        s,
        size,
        if record { s.iters * q as u64 } else { total },
        total,
        secs,
        peak_ops,
    ))
}

fn make_report(
    s: &Settings,
    size: u64,
    iters: u64,
    total: u64,
    secs: f64,
    peak_ops: f64,
) -> BwReport {
    let factor = if s.gbits { 125_000_000.0 } else { 1_048_576.0 };
    let secs = secs.max(1e-9);
    BwReport {
        size,
        iters,
        peak: peak_ops * size as f64 / factor,
        avg: (size * total) as f64 / secs / factor,
        msg_rate: total as f64 / secs / 1e6,
    }
}

/// The best rate, in operations per second, over any run of consecutive operations: from
/// the posting of the first to the completion of the last, as perftest's peak is (on a
/// sample of the operations when there are many).
fn peak_rate(tposted: &[Instant], tcompleted: &[Instant]) -> f64 {
    let n = tposted.len().min(tcompleted.len());
    if n == 0 {
        return 0.0;
    }
    let stride = n.div_ceil(2048);
    let mut best = f64::MAX;
    for i in (0..n).step_by(stride) {
        for j in (i..n).step_by(stride) {
            let dt = tcompleted[j]
                .saturating_duration_since(tposted[i])
                .as_secs_f64()
                .max(1e-9);
            best = best.min(dt / (j - i + 1) as f64);
        }
    }
    1.0 / best
}

/// What the server of write-bw and atomic-bw can check once the client is done: its target
/// areas hold the pattern, or the counter the client's fetch-and-adds built.
pub(super) fn check_target(s: &Settings, res: &TestResources) -> Result<(), String> {
    for i in 0..res.qps.len() {
        match s.verb {
            Verb::Write => {
                // On UC the last packets may still be on their way: give them a moment.
                let since = Instant::now();
                let len = s.sizes.iter().copied().max().unwrap_or(1);
                loop {
                    let got = res.read(res.target_off(i), len)?;
                    match mismatch(&got, 0) {
                        None => break,
                        Some(_)
                            if s.connection.lossy() && since.elapsed() < Duration::from_secs(1) =>
                        {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Some(at) => return Err(check_failed("target area", i, at, got[at], 0)),
                    }
                }
            }
            Verb::Atomic if s.duration.is_none() => {
                let got = res.read(res.target_off(i), 8)?;
                let value = u64::from_ne_bytes(got.try_into().expect("8 bytes"));
                let expected = match s.atomic {
                    AtomicType::FetchAdd => s.iters,
                    AtomicType::CmpSwap => 0,
                };
                if value != expected {
                    return Err(format!(
                        " Data check failed: queue pair {i}'s counter is {value}, expected {expected}"
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// How many receives to post into each queue pair's receive buffer before a SEND test
/// starts (`ctx_set_recv_wqes`): the receive depth, or fewer when the run has fewer
/// iterations; shared out among the queue pairs when they share a receive queue.
pub(super) fn first_receives(s: &Settings, qps: usize) -> u64 {
    let depth = if s.duration.is_some() {
        u64::from(s.rx_depth)
    } else {
        u64::from(s.rx_depth).min(s.iters)
    };
    if s.has_srq() {
        (depth / qps as u64).max(1)
    } else {
        depth
    }
}

/// Posts one receive into queue pair `i`'s receive buffer, on that queue pair or on the
/// shared receive queue; its `wr_id` names the buffer.
pub(super) fn post_recv(res: &TestResources, i: usize) -> Result<(), String> {
    let (at, len) = res.recv_buffer(i);
    let sge = res
        .region
        .local(at, len as u32)
        .map_err(|e| e.to_string())?;
    let wr = RecvWr {
        wr_id: i as u64,
        sges: vec![sge],
    };
    match &res.srq {
        Some(srq) => srq
            .post_recv(wr)
            .map_err(|e| format!("Couldn't post recv SRQ = {i}: {e}")),
        None => res.qps[i]
            .post_recv(wr)
            .map_err(|e| format!(" Couldn't post receive: {e}")),
    }
}

/// Checks message `n`, which queue pair `qp` received, under `--check`: its length, its bytes
/// and, on UD, who sent it (`peer`, the queue pair of the key line exchanged for `qp`) and
/// the GRH before it.
pub(super) fn check_message(
    res: &TestResources,
    wc: &Completion,
    qp: usize,
    size: u64,
    peer: &KeyLine,
    n: u64,
) -> Result<(), String> {
    let buffer = wc.wr_id as usize;
    let expected = res.received_len(size);
    if u64::from(wc.byte_len) != expected {
        return Err(format!(
            " Data check failed: message {n} on queue pair {qp} has {} bytes, expected {expected}",
            wc.byte_len
        ));
    }
    let got = res.read(res.payload_off(buffer), size)?;
    if let Some(at) = mismatch(&got, 0) {
        return Err(check_failed("receive buffer", buffer, at, got[at], 0));
    }
    if !res.ud {
        return Ok(());
    }
    let ip = peer_ip(peer);
    match wc.ud {
        Some(source) if source.qpn.value() == peer.qpn && source.ip == ip => {}
        other => {
            return Err(format!(
                " Data check failed: datagram {n} on queue pair {qp} came from {other:?}, expected QPN {:#x} at {ip}",
                peer.qpn
            ))
        }
    }
    let len = UD_GRH_LEN as u64;
    let grh = res.read(res.payload_off(buffer) - len, len)?;
    // rxe's GRH of an IPv4 packet: 20 zero bytes, then the IPv4 header; of IPv6, the header.
    let names_sender = match ip {
        std::net::IpAddr::V4(v4) => {
            grh[..20].iter().all(|&b| b == 0) && grh[20] >> 4 == 4 && grh[32..36] == v4.octets()
        }
        std::net::IpAddr::V6(v6) => grh[0] >> 4 == 6 && grh[8..24] == v6.octets(),
    };
    if !names_sender {
        return Err(format!(
            " Data check failed: the GRH of datagram {n} on queue pair {qp} does not name {ip} as its sender: {grh:02x?}"
        ));
    }
    Ok(())
}

/// The SEND server's receives: posted before the sync key line, counted and re-posted while
/// the client sends. A receive goes back where it came from, into the same buffer: to its
/// queue pair, or to the shared receive queue whichever queue pair took it
/// (`run_iter_bw_server`).
pub(super) struct Receiver {
    /// Receives posted into each queue pair's buffer.
    posted: Vec<u64>,
}

/// Whether a counted run has all its messages: `iters` from each of `qps` queue pairs,
/// counted together, as perftest's `run_iter_bw_server` counts `rcnt` against `iters ×
/// num_of_qps`. Not per queue pair: on a shared receive queue one queue pair may take
/// another's share of the receives, and a server waiting for each queue pair's `iters`
/// waited for a share that never came (issue 25).
fn all_in(rcnt: u64, iters: u64, qps: usize) -> bool {
    rcnt >= iters.saturating_mul(qps as u64)
}

impl Receiver {
    /// Posts the first receives into every queue pair's buffer (`ctx_set_recv_wqes`).
    pub(super) fn post(s: &Settings, res: &TestResources) -> Result<Self, String> {
        let q = res.qps.len();
        let first = first_receives(s, q);
        for i in 0..q {
            for _ in 0..first {
                post_recv(res, i)?;
            }
        }
        Ok(Self::new(first, q))
    }

    fn new(first: u64, qps: usize) -> Self {
        Self {
            posted: vec![first; qps],
        }
    }

    /// Counts a receive taken from `buffer` and says whether to post it there again: while
    /// fewer than `iters` went into that buffer (perftest's `posted_per_qp`, kept by the
    /// buffer a receive's `wr_id` names, not by the queue pair that took it), or always in a
    /// timed run (`iters` `None`).
    fn repost(&mut self, buffer: usize, iters: Option<u64>) -> bool {
        let again = iters.is_none_or(|n| self.posted[buffer] < n);
        if again {
            self.posted[buffer] += 1;
        }
        again
    }

    /// Receives one message size's messages from the client's queue pairs (`peers`, for
    /// `--check`); `comm` says when the client has stopped.
    pub(super) fn run(
        &mut self,
        s: &Settings,
        res: &TestResources,
        size: u64,
        peers: &[KeyLine],
        comm: &Comm,
    ) -> Result<BwReport, String> {
        let q = res.qps.len();
        let qp_of = |qpn: u32| res.qps.iter().position(|qp| qp.qpn().value() == qpn);
        let mut rcnt = 0u64;
        let record = s.duration.is_none();
        let limit = record.then_some(s.iters);
        let start = Instant::now();
        // perftest's server times from the first message it receives.
        let mut first: Option<Instant> = None;
        let mut last = start;
        let mut last_progress = start;
        let mut last_peek = start;
        // When the client said it is done: what is on its way still counts for a moment.
        let mut ending: Option<Instant> = None;
        loop {
            let mut progressed = false;
            while let Some(wc) = res.recv_cq.poll() {
                if wc.status != WcStatus::Success {
                    return Err(recv_error(&wc, rcnt));
                }
                let Some(i) = qp_of(wc.qpn.value()) else {
                    continue;
                };
                let buffer = wc.wr_id as usize;
                if buffer >= q {
                    continue;
                }
                if s.check {
                    check_message(res, &wc, i, size, &peers[i], rcnt)?;
                }
                rcnt += 1;
                last = Instant::now();
                first.get_or_insert(last);
                if self.repost(buffer, limit) {
                    post_recv(res, buffer)?;
                }
                progressed = true;
            }
            if record && all_in(rcnt, s.iters, q) {
                break;
            }
            if progressed {
                last_progress = Instant::now();
                continue;
            }
            match ending {
                Some(since) if since.elapsed() >= DRAIN && last_progress.elapsed() >= DRAIN => {
                    // UC and UD lose what was lost; RC must have delivered everything.
                    let expected = s.iters * q as u64;
                    if record && !s.connection.lossy() {
                        return Err(format!(
                            " The client stopped after {rcnt} of {expected} messages"
                        ));
                    }
                    if record {
                        eprintln!(
                            " Received {rcnt} of {expected} messages: the rest were lost ({} does not resend)",
                            s.connection_name()
                        );
                    }
                    break;
                }
                Some(_) => {}
                None if last_peek.elapsed() >= PEEK_EVERY => {
                    last_peek = Instant::now();
                    if comm.peer_spoke() {
                        ending = Some(last_peek);
                    }
                }
                None => {}
            }
            if record && ending.is_none() && last_progress.elapsed() > STALL {
                return Err(stalled("receiving"));
            }
            std::thread::yield_now();
        }
        let first = first.unwrap_or(start);
        let secs = last.duration_since(first).as_secs_f64();
        let iters = if record { s.iters * q as u64 } else { rcnt };
        // perftest's SEND server reports no peak (`noPeak`): it sees when messages arrive,
        // not when they were sent, and those taken in one poll arrive at one instant.
        Ok(make_report(s, size, iters, rcnt, secs, 0.0))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// Issue 25: two queue pairs on one shared receive queue, 5 iterations each, and the first
    /// queue pair's messages arriving first: it takes 6 of the 10 receives. The server is done
    /// when 10 have come, whichever queue pair took them (it waited for the second's fifth,
    /// which never came, and failed with "The client stopped after 10 of 10 messages"), and
    /// the shared queue never runs dry on the way.
    #[test]
    fn a_shared_receive_queue_is_counted_over_all_queue_pairs() {
        let (iters, qps) = (5u64, 2usize);
        // `first_receives`: min(rx_depth, iters) shared out among the queue pairs.
        let first = iters / qps as u64;
        let mut receiver = Receiver::new(first, qps);
        // The shared receive queue: the buffer each posted receive names (its wr_id).
        let mut srq: VecDeque<usize> = (0..qps)
            .flat_map(|b| std::iter::repeat_n(b, first as usize))
            .collect();
        let arrivals = [0, 0, 0, 0, 0, 0, 1, 1, 1, 1];
        let mut taken = [0u64; 2];
        let mut rcnt = 0;
        for (n, &qp) in arrivals.iter().enumerate() {
            assert!(!all_in(rcnt, iters, qps), "done after {rcnt} messages");
            let buffer = srq
                .pop_front()
                .unwrap_or_else(|| panic!("no receive for message {n}: RNR"));
            taken[qp] += 1;
            rcnt += 1;
            if receiver.repost(buffer, Some(iters)) {
                srq.push_back(buffer);
            }
        }
        assert_eq!(taken, [6, 4], "one queue pair took another's share");
        assert!(all_in(rcnt, iters, qps));
        // Each buffer had its `iters` receives posted, and none is left over.
        assert_eq!(receiver.posted, vec![iters; qps]);
        assert!(srq.is_empty(), "{srq:?} left posted");
    }

    /// A timed run re-posts every receive; without a shared queue a queue pair's buffer
    /// stops at `iters`.
    #[test]
    fn receives_are_posted_again_while_the_run_needs_them() {
        let mut receiver = Receiver::new(2, 1);
        assert!(receiver.repost(0, Some(3)));
        assert!(!receiver.repost(0, Some(3)));
        assert!((0..100).all(|_| receiver.repost(0, None)));
        assert!(!all_in(5, 3, 2));
        assert!(all_in(6, 3, 2));
        assert!(all_in(1000, 3, 2));
    }
}
