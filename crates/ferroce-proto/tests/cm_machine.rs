//! The CM state machine between two endpoints in virtual time, with a scriptable wire: every
//! message lost once or duplicated once, a slow application drawing an MRA, a silent peer,
//! refusals, timewait and stale QP numbers, a restarted peer, and SIDR.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use ferroce_proto::cm::machine::{
    cm_time, AcceptParams, CmEndpoint, CmEvent, CommId, ConnectParams, QpParams,
    CM_RESPONSE_TIMEOUT, MAX_CM_RETRIES, PACKET_LIFETIME, TIMEWAIT,
};
use ferroce_proto::cm::{
    AttributeId, CmMessage, FixedBytes, Mtu, PortSpace, RejectReason, ServiceId, SidrStatus,
    TransportType,
};
use ferroce_proto::wire::Qpn;
use ferroce_proto::Psn;

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

fn sid() -> ServiceId {
    ServiceId::rdma_cm(PortSpace::Tcp, 7174)
}

/// What the wire does with one message: deliver it, drop it, or deliver it twice.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fate {
    Deliver,
    Drop,
    Twice,
}

type Rule = Box<dyn FnMut(IpAddr, AttributeId) -> Fate>;

struct Wire {
    a: CmEndpoint,
    b: CmEndpoint,
    now: Instant,
    rule: Rule,
    /// Every message that crossed or was dropped: (from, attribute, fate).
    log: Vec<(IpAddr, AttributeId, Fate)>,
    events_a: Vec<CmEvent>,
    events_b: Vec<CmEvent>,
}

impl Wire {
    fn new() -> Self {
        Self {
            a: CmEndpoint::new(A, 0x0a, 0x1000),
            b: CmEndpoint::new(B, 0x0b, 0x9000),
            now: Instant::now(),
            rule: Box::new(|_, _| Fate::Deliver),
            log: Vec::new(),
            events_a: Vec::new(),
            events_b: Vec::new(),
        }
    }

    /// Delivers what both sides have to send, until neither has anything.
    fn pump(&mut self) {
        loop {
            let mut any = false;
            while let Some((to, mad)) = self.a.poll_transmit() {
                assert_eq!(to, B);
                any = true;
                self.carry(A, &mad);
            }
            while let Some((to, mad)) = self.b.poll_transmit() {
                assert_eq!(to, A);
                any = true;
                self.carry(B, &mad);
            }
            self.events_a
                .extend(std::iter::from_fn(|| self.a.poll_event()));
            self.events_b
                .extend(std::iter::from_fn(|| self.b.poll_event()));
            if !any {
                return;
            }
        }
    }

    fn carry(&mut self, from: IpAddr, mad: &[u8]) {
        let (_, message) = CmMessage::parse(mad).expect("the machine emits valid MADs");
        let fate = (self.rule)(from, message.attribute_id());
        self.log.push((from, message.attribute_id(), fate));
        let copies = match fate {
            Fate::Deliver => 1,
            Fate::Drop => 0,
            Fate::Twice => 2,
        };
        for _ in 0..copies {
            if from == A {
                self.b.handle_mad(self.now, A, mad);
            } else {
                self.a.handle_mad(self.now, B, mad);
            }
        }
    }

    /// Lets time pass up to `limit`, running timers and delivering as they fire.
    fn run_for(&mut self, limit: Duration) {
        let end = self.now + limit;
        self.pump();
        loop {
            let next = [self.a.poll_timeout(), self.b.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    self.a.handle_timeout(self.now);
                    self.b.handle_timeout(self.now);
                    self.pump();
                }
                _ => {
                    self.now = end;
                    return;
                }
            }
        }
    }

    fn sent(&self, from: IpAddr, attribute: AttributeId) -> usize {
        self.log
            .iter()
            .filter(|(f, a, _)| *f == from && *a == attribute)
            .count()
    }
}

fn connect_params(qpn: u32) -> ConnectParams {
    ConnectParams {
        to: B,
        service_id: sid(),
        qpn: Qpn::new(qpn).unwrap(),
        starting_psn: Psn::new(0x0a_0000).unwrap(),
        responder_resources: 1,
        initiator_depth: 4,
        retry_count: 7,
        rnr_retry_count: 6,
        mtu: Mtu::M1024,
        transport: TransportType::Rc,
        srq: false,
        private_data: FixedBytes([0x11; 92]),
    }
}

fn accept_params(qpn: u32) -> AcceptParams {
    AcceptParams {
        qpn: Qpn::new(qpn).unwrap(),
        starting_psn: Psn::new(0x0b_0000).unwrap(),
        responder_resources: 4,
        initiator_depth: 1,
        rnr_retry_count: 5,
        srq: false,
        private_data: FixedBytes([0x22; 196]),
    }
}

/// Connects A's QP 0x20 to a listener on B, which accepts with QP 0x30. Returns both IDs.
fn handshake(w: &mut Wire, qpn: u32) -> (CommId, CommId) {
    let now = w.now;
    let active = w.a.connect(now, &connect_params(qpn));
    w.run_for(Duration::from_millis(1));
    let Some(&CmEvent::ConnectRequest { id: passive, .. }) = w.events_b.last() else {
        panic!("no connect request: {:?}", w.events_b);
    };
    w.b.accept(now, passive, &accept_params(qpn + 0x10))
        .unwrap();
    w.run_for(Duration::from_millis(1));
    if matches!(w.events_a.last(), Some(CmEvent::Reply { .. })) {
        w.a.establish(active).unwrap();
    }
    w.run_for(Duration::from_millis(1));
    (active, passive)
}

#[test]
fn connect_cross_over_and_close() {
    let mut w = Wire::new();
    w.b.listen(sid()).unwrap();
    let (active, passive) = handshake(&mut w, 0x20);
    let req = match w.events_b[0] {
        CmEvent::ConnectRequest { from, req, .. } => {
            assert_eq!(from, A);
            req
        }
        ref e => panic!("{e:?}"),
    };
    let rep = match w.events_a[0] {
        CmEvent::Reply { id, rep } => {
            assert_eq!(id, active);
            rep
        }
        ref e => panic!("{e:?}"),
    };
    assert_eq!(w.events_b[1], CmEvent::Established { id: passive });
    assert_eq!(req.private_data.0, [0x11; 92]);
    assert_eq!(rep.private_data.0, [0x22; 196]);

    // What each QP is given: PSNs, READ resources and retry counts cross over.
    let a = QpParams::active(&connect_params(0x20), &rep);
    let b = QpParams::passive(&req, &accept_params(0x30));
    assert_eq!((a.dest_qpn.value(), b.dest_qpn.value()), (0x30, 0x20));
    assert_eq!(a.sq_psn, b.rq_psn, "A sends from the PSN B expects");
    assert_eq!(b.sq_psn, a.rq_psn, "and B from the one A expects");
    assert_eq!(a.rq_psn.value(), 0x0a_0000);
    assert_eq!((a.max_rd_atomic, a.max_dest_rd_atomic), (4, 1));
    assert_eq!((b.max_rd_atomic, b.max_dest_rd_atomic), (1, 4));
    assert_eq!(
        b.retry_count, 7,
        "the REQ's retry count is the passive QP's"
    );
    assert_eq!(
        b.rnr_retry_count, 6,
        "the REQ's RNR retry count is the passive QP's"
    );
    assert_eq!(a.rnr_retry_count, 5, "the REP's is the active QP's");
    assert_eq!(b.mtu, Mtu::M1024);

    w.a.disconnect(w.now, active).unwrap();
    w.run_for(Duration::from_millis(1));
    assert_eq!(
        w.events_a.last(),
        Some(&CmEvent::Disconnected { id: active })
    );
    assert_eq!(
        w.events_b.last(),
        Some(&CmEvent::Disconnected { id: passive })
    );
    assert_eq!(w.sent(A, AttributeId::Dreq), 1);
    assert_eq!(w.sent(B, AttributeId::Drep), 1);
    // Both sit in timewait, then forget.
    assert_eq!((w.a.connections(), w.b.connections()), (1, 1));
    w.run_for(TIMEWAIT + Duration::from_millis(1));
    assert_eq!((w.a.connections(), w.b.connections()), (0, 0));
    assert_eq!(w.a.counters().resends + w.b.counters().resends, 0);
}

#[test]
fn every_message_lost_once_still_connects_and_closes() {
    for lost in [
        AttributeId::Req,
        AttributeId::Rep,
        AttributeId::Rtu,
        AttributeId::Dreq,
        AttributeId::Drep,
    ] {
        for closer_is_a in [true, false] {
            let mut w = Wire::new();
            let mut dropped = false;
            w.rule = Box::new(move |_, attr| {
                if attr == lost && !dropped {
                    dropped = true;
                    Fate::Drop
                } else {
                    Fate::Deliver
                }
            });
            w.b.listen(sid()).unwrap();
            let now = w.now;
            let active = w.a.connect(now, &connect_params(0x20));
            // Long enough for one resend at the kernel's intervals.
            w.run_for(Duration::from_secs(7));
            let passive = match w.events_b.first() {
                Some(&CmEvent::ConnectRequest { id, .. }) => id,
                other => panic!("{lost:?}: {other:?}"),
            };
            w.b.accept(w.now, passive, &accept_params(0x30)).unwrap();
            w.run_for(Duration::from_secs(7));
            assert!(
                matches!(w.events_a.first(), Some(CmEvent::Reply { .. })),
                "{lost:?}: {:?}",
                w.events_a
            );
            w.a.establish(active).unwrap();
            w.run_for(Duration::from_millis(1));
            if lost == AttributeId::Rtu {
                // The RTU is gone: the first data packet on B's QP establishes it.
                assert_eq!(w.events_b.len(), 1, "not established yet");
                w.b.data_arrived(passive);
            }
            w.run_for(Duration::from_millis(1));
            assert_eq!(
                w.events_b.get(1),
                Some(&CmEvent::Established { id: passive }),
                "{lost:?}"
            );
            let (closer, id) = if closer_is_a {
                (&mut w.a, active)
            } else {
                (&mut w.b, passive)
            };
            closer.disconnect(w.now, id).unwrap();
            w.run_for(Duration::from_secs(7));
            let disconnected = |events: &[CmEvent], id| {
                events
                    .iter()
                    .filter(|e| **e == CmEvent::Disconnected { id })
                    .count()
            };
            assert_eq!(
                disconnected(&w.events_a, active),
                1,
                "{lost:?}: {:?}",
                w.events_a
            );
            assert_eq!(
                disconnected(&w.events_b, passive),
                1,
                "{lost:?}: {:?}",
                w.events_b
            );
            assert!(
                w.log.iter().any(|(_, _, f)| *f == Fate::Drop),
                "{lost:?} was dropped"
            );
        }
    }
}

#[test]
fn every_message_duplicated_once_changes_nothing() {
    for twice in [
        AttributeId::Req,
        AttributeId::Rep,
        AttributeId::Rtu,
        AttributeId::Dreq,
        AttributeId::Drep,
    ] {
        let mut w = Wire::new();
        let mut done = false;
        w.rule = Box::new(move |_, attr| {
            if attr == twice && !done {
                done = true;
                Fate::Twice
            } else {
                Fate::Deliver
            }
        });
        w.b.listen(sid()).unwrap();
        let (active, passive) = handshake(&mut w, 0x20);
        w.a.disconnect(w.now, active).unwrap();
        w.run_for(Duration::from_millis(1));
        assert_eq!(w.events_a.len(), 2, "{twice:?}: {:?}", w.events_a);
        assert_eq!(w.events_b.len(), 3, "{twice:?}: {:?}", w.events_b);
        assert_eq!(w.events_a[1], CmEvent::Disconnected { id: active });
        assert_eq!(w.events_b[2], CmEvent::Disconnected { id: passive });
        // A second DREQ finds B in timewait and draws a second DREP, a duplicate too.
        let expected = if twice == AttributeId::Dreq { 2 } else { 1 };
        let dups = w.a.counters().duplicates + w.b.counters().duplicates;
        assert_eq!(dups, expected, "{twice:?}");
    }
}

#[test]
fn a_slow_application_draws_an_mra_and_the_requester_waits() {
    let mut w = Wire::new();
    w.b.listen(sid()).unwrap();
    let now = w.now;
    let active = w.a.connect(now, &connect_params(0x20));
    // B's application does not answer: A resends its REQ once, which draws an MRA.
    let req_interval = cm_time(PACKET_LIFETIME) * 2 + cm_time(CM_RESPONSE_TIMEOUT);
    w.run_for(req_interval + Duration::from_millis(1));
    assert_eq!(w.sent(A, AttributeId::Req), 2);
    assert_eq!(w.sent(B, AttributeId::Mra), 1);
    // A now waits out the service timeout (about 69 s) instead of resending every 6 s.
    w.run_for(Duration::from_secs(60));
    assert_eq!(
        w.sent(A, AttributeId::Req),
        2,
        "no resend while the MRA holds"
    );
    let Some(&CmEvent::ConnectRequest { id: passive, .. }) = w.events_b.first() else {
        panic!()
    };
    w.b.accept(w.now, passive, &accept_params(0x30)).unwrap();
    w.run_for(Duration::from_millis(1));
    assert!(matches!(w.events_a[0], CmEvent::Reply { id, .. } if id == active));
    assert_eq!(w.b.counters().mras_sent, 1);
    assert_eq!(w.a.counters().mras_received, 1);
}

#[test]
fn a_silent_peer_is_unreachable_after_exactly_its_retries() {
    let mut w = Wire::new();
    w.rule = Box::new(|from, _| if from == A { Fate::Drop } else { Fate::Deliver });
    let now = w.now;
    let active = w.a.connect(now, &connect_params(0x20));
    let interval = cm_time(PACKET_LIFETIME) * 2 + cm_time(CM_RESPONSE_TIMEOUT);
    w.run_for(interval * u32::from(MAX_CM_RETRIES) + interval / 2);
    assert!(w.events_a.is_empty(), "not yet: {:?}", w.events_a);
    w.run_for(interval);
    assert_eq!(w.events_a, [CmEvent::Unreachable { id: active }]);
    assert_eq!(w.sent(A, AttributeId::Req), 1 + usize::from(MAX_CM_RETRIES));
    assert_eq!(w.a.connections(), 0);
    assert_eq!(w.a.poll_timeout(), None, "nothing left armed");
}

#[test]
fn refusals_say_why() {
    // No listener: REJ 8, as rping reports "RDMA_CM_EVENT_REJECTED, error 8".
    let mut w = Wire::new();
    let now = w.now;
    let active = w.a.connect(now, &connect_params(0x20));
    w.run_for(Duration::from_millis(1));
    assert!(matches!(
        w.events_a[..],
        [CmEvent::Rejected { id, reason: RejectReason::InvalidServiceId, .. }] if id == active
    ));
    assert_eq!(w.b.counters().rej_no_listener, 1);
    assert_eq!((w.a.connections(), w.b.connections()), (0, 0));

    // The application refuses, with private data: REJ 28.
    w.b.listen(sid()).unwrap();
    let active = w.a.connect(w.now, &connect_params(0x21));
    w.run_for(Duration::from_millis(1));
    let Some(&CmEvent::ConnectRequest { id: passive, .. }) = w.events_b.last() else {
        panic!()
    };
    w.b.reject(passive, FixedBytes([7; 148])).unwrap();
    w.run_for(Duration::from_millis(1));
    assert_eq!(
        w.events_a.last(),
        Some(&CmEvent::Rejected {
            id: active,
            reason: RejectReason::ConsumerDefined,
            private_data: FixedBytes([7; 148])
        })
    );
    assert!(
        w.b.accept(w.now, passive, &accept_params(0x31)).is_err(),
        "gone"
    );
    assert_eq!((w.a.connections(), w.b.connections()), (0, 0));
}

#[test]
fn a_qp_number_reused_within_timewait_is_stale() {
    let mut w = Wire::new();
    w.b.listen(sid()).unwrap();
    let (active, _) = handshake(&mut w, 0x20);
    w.a.disconnect(w.now, active).unwrap();
    w.run_for(Duration::from_millis(1));
    // A connects again from the same QP at once: B still holds it in timewait.
    let again = w.a.connect(w.now, &connect_params(0x20));
    w.run_for(Duration::from_millis(1));
    assert!(matches!(
        w.events_a.last(),
        Some(&CmEvent::Rejected { id, reason: RejectReason::StaleConnection, .. }) if id == again
    ));
    assert_eq!(w.b.counters().rej_stale, 1);
    // After timewait the same QP connects.
    w.run_for(TIMEWAIT + Duration::from_millis(1));
    let before = w.events_b.len();
    let (_, passive) = handshake(&mut w, 0x20);
    assert_eq!(
        w.events_b.last(),
        Some(&CmEvent::Established { id: passive })
    );
    assert_eq!(w.events_b.len(), before + 2);
}

#[test]
fn a_restarted_peer_is_refused_once_and_its_old_connection_closed() {
    let mut w = Wire::new();
    w.b.listen(sid()).unwrap();
    let (_, old) = handshake(&mut w, 0x20);
    // A crashes and comes back with fresh state and the same QP number.
    w.a = CmEndpoint::new(A, 0x0a, 0x5000);
    w.events_a.clear();
    let retry = w.a.connect(w.now, &connect_params(0x20));
    w.run_for(Duration::from_millis(1));
    assert!(matches!(
        w.events_a[..],
        [CmEvent::Rejected { id, reason: RejectReason::StaleConnection, .. }] if id == retry
    ));
    assert!(w.events_b.contains(&CmEvent::Disconnected { id: old }));
    // B's DREQ for the old connection found nothing on the new A, which answers it anyway.
    assert_eq!(w.sent(A, AttributeId::Drep), 1);
    w.run_for(TIMEWAIT + Duration::from_millis(1));
    let (_, passive) = handshake(&mut w, 0x20);
    assert_eq!(
        w.events_b.last(),
        Some(&CmEvent::Established { id: passive })
    );
}

#[test]
fn both_sides_forgetting_a_connection_leaves_nothing_behind() {
    let mut w = Wire::new();
    w.b.listen(sid()).unwrap();
    let (active, passive) = handshake(&mut w, 0x20);
    assert!(w.a.abandon(active));
    assert!(w.b.abandon(passive));
    assert_eq!((w.a.connections(), w.b.connections()), (0, 0));
    assert_eq!((w.a.poll_timeout(), w.b.poll_timeout()), (None, None));
    // A DREQ naming the wrong QP is dropped, as the kernel drops it.
    let (active, _) = handshake(&mut w, 0x40);
    let dreq = ferroce_proto::cm::Dreq {
        local_comm_id: 0x77,
        remote_comm_id: active.0,
        remote_qpn: Qpn::new(0x99).unwrap(),
        private_data: FixedBytes::ZERO,
    };
    let mut mad = [0; 256];
    CmMessage::Dreq(dreq)
        .emit(&CmMessage::Dreq(dreq).header(1), &mut mad)
        .unwrap();
    w.a.handle_mad(w.now, B, &mad);
    assert_eq!(w.a.counters().dreq_wrong_qpn, 1);
    assert_eq!(w.a.poll_event(), None);
    // Junk is counted, not a panic.
    w.a.handle_mad(w.now, B, &[0xff; 256]);
    w.a.handle_mad(w.now, B, &[1, 2, 3]);
    assert_eq!(w.a.counters().malformed, 2);
}

#[test]
fn sidr_resolves_a_ud_service() {
    let udp = ServiceId::rdma_cm(PortSpace::Udp, 7174);
    let mut w = Wire::new();
    // Nobody listens: status 1, as udaddy reports UNREACHABLE.
    let id = w.a.resolve(w.now, B, udp, FixedBytes::ZERO);
    w.run_for(Duration::from_millis(1));
    assert!(matches!(
        w.events_a[..],
        [CmEvent::SidrReply { id: i, rep }] if i == id && rep.status == SidrStatus::Unsupported
    ));
    w.b.listen(udp).unwrap();
    // A duplicated request is answered once.
    w.rule = Box::new(|_, attr| {
        if attr == AttributeId::SidrReq {
            Fate::Twice
        } else {
            Fate::Deliver
        }
    });
    let id = w.a.resolve(w.now, B, udp, FixedBytes([3; 216]));
    w.run_for(Duration::from_millis(1));
    let requests: Vec<_> = w
        .events_b
        .iter()
        .filter_map(|e| match *e {
            CmEvent::SidrRequest { id, from, req } => Some((id, from, req)),
            _ => None,
        })
        .collect();
    assert_eq!(requests.len(), 1);
    let (theirs, from, req) = requests[0];
    assert_eq!((from, req.private_data.0), (A, [3; 216]));
    w.b.sidr_reply(
        theirs,
        SidrStatus::Success,
        Qpn::new(0x44).unwrap(),
        0x0123_4567,
        FixedBytes::ZERO,
    )
    .unwrap();
    w.run_for(Duration::from_millis(1));
    assert!(matches!(
        w.events_a.last(),
        Some(&CmEvent::SidrReply { id: i, rep })
            if i == id && rep.status == SidrStatus::Success && rep.qpn.value() == 0x44
                && rep.qkey == 0x0123_4567
    ));
    // Unanswered: unreachable after its retries.
    w.rule = Box::new(|from, _| if from == A { Fate::Drop } else { Fate::Deliver });
    let id = w.a.resolve(w.now, B, udp, FixedBytes::ZERO);
    w.run_for(cm_time(CM_RESPONSE_TIMEOUT) * (u32::from(MAX_CM_RETRIES) + 2));
    assert_eq!(w.events_a.last(), Some(&CmEvent::SidrUnreachable { id }));
}

#[test]
fn an_unanswered_dreq_closes_the_connection_after_its_few_retries() {
    use ferroce_proto::cm::machine::DREQ_RETRIES;
    let mut w = Wire::new();
    w.b.listen(sid()).unwrap();
    let (active, _) = handshake(&mut w, 0x20);
    // B is gone: nothing A sends arrives any more.
    w.rule = Box::new(|from, _| if from == A { Fate::Drop } else { Fate::Deliver });
    w.a.disconnect(w.now, active).unwrap();
    let interval = cm_time(PACKET_LIFETIME) * 2 + cm_time(CM_RESPONSE_TIMEOUT);
    w.run_for(interval * u32::from(DREQ_RETRIES) + interval / 2);
    assert!(!w.events_a.contains(&CmEvent::Disconnected { id: active }));
    w.run_for(interval);
    assert!(w.events_a.contains(&CmEvent::Disconnected { id: active }));
    assert_eq!(w.sent(A, AttributeId::Dreq), 1 + usize::from(DREQ_RETRIES));
}

#[test]
fn a_side_that_answered_a_dreq_lingers_until_the_peer_cannot_resend_it() {
    for closer_is_a in [true, false] {
        let mut w = Wire::new();
        w.b.listen(sid()).unwrap();
        let (active, passive) = handshake(&mut w, 0x20);
        // The answering side's first two DREPs are lost; the third arrives.
        let answerer = if closer_is_a { B } else { A };
        let mut lost = 0;
        w.rule = Box::new(move |from, attr| {
            if from == answerer && attr == AttributeId::Drep && lost < 2 {
                lost += 1;
                Fate::Drop
            } else {
                Fate::Deliver
            }
        });
        // The closer resends at its own interval: the active side's is twice the packet
        // lifetime and the response time; the passive side's the response time.
        let closer_interval = if closer_is_a {
            cm_time(PACKET_LIFETIME) * 2 + cm_time(CM_RESPONSE_TIMEOUT)
        } else {
            cm_time(CM_RESPONSE_TIMEOUT)
        };
        let start = w.now;
        if closer_is_a {
            w.a.disconnect(start, active).unwrap();
        } else {
            w.b.disconnect(start, passive).unwrap();
        }
        w.run_for(Duration::from_millis(1));
        let linger = |w: &Wire| {
            if closer_is_a {
                w.b.linger_until(w.now)
            } else {
                w.a.linger_until(w.now)
            }
        };
        let first = linger(&w).expect("a DREP sent is owed until the peer cannot resend");
        assert!(first >= start + closer_interval, "{closer_is_a}");
        // Each resent DREQ is answered and moves the end of the lingering on.
        w.run_for(closer_interval + Duration::from_millis(1));
        let second = linger(&w).expect("still owed after the first resend");
        assert!(second >= first + closer_interval - Duration::from_millis(1));
        w.run_for(closer_interval * 2);
        let answered = if closer_is_a { B } else { A };
        assert_eq!(w.sent(answered, AttributeId::Drep), 3, "{closer_is_a}");
        let (closer_events, id) = if closer_is_a {
            (&w.events_a, active)
        } else {
            (&w.events_b, passive)
        };
        assert_eq!(
            closer_events
                .iter()
                .filter(|e| **e == CmEvent::Disconnected { id })
                .count(),
            1
        );
        // Once no resend can come, nothing is owed, and timewait is long over.
        w.run_for(closer_interval * 2);
        assert_eq!(linger(&w), None);
        assert_eq!(w.a.connections() + w.b.connections(), 0);
    }
}

/// A peer found gone (its process closed its port) is owed nothing more; a DREQ answered
/// after it was seen is owed still.
#[test]
fn a_peer_that_is_gone_is_owed_nothing() {
    let mut w = Wire::new();
    w.b.listen(sid()).unwrap();
    let (active, _) = handshake(&mut w, 0x20);
    w.a.disconnect(w.now, active).unwrap();
    w.run_for(Duration::from_millis(1));
    let owed: Vec<_> = w.b.owed_peers(w.now).collect();
    assert_eq!(owed.len(), 1);
    let (peer, until) = owed[0];
    assert_eq!(Some(until), w.b.linger_until(w.now));
    // Seen with an older deadline (a DREQ answered since moved it on): still owed.
    w.b.peer_gone(peer, until - Duration::from_millis(1));
    assert_eq!(w.b.linger_until(w.now), Some(until));
    w.b.peer_gone(peer, until);
    assert_eq!(w.b.linger_until(w.now), None);
    assert_eq!(w.b.owed_peers(w.now).count(), 0);
}

#[test]
fn a_side_that_closed_first_owes_nothing() {
    let mut w = Wire::new();
    w.b.listen(sid()).unwrap();
    let (active, _) = handshake(&mut w, 0x20);
    w.a.disconnect(w.now, active).unwrap();
    w.run_for(Duration::from_millis(1));
    assert_eq!(w.a.linger_until(w.now), None);
    assert!(w.b.linger_until(w.now).is_some());
}
