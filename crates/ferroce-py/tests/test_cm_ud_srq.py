"""Pollable descriptors (Cq.fileno, Nic.fileno) with select and asyncio; connection
management with private data (Listener, ConnectRequest, Connection) and its typed errors;
UD queue pairs with address handles, SIDR resolution; shared receive queues and their limit
event; RemoteAddr and QpEndpoint as bytes and through pickle.

Every NIC has an address of its own in 127.0.9.1-127.0.9.90 (this module's block); waits are
bounded and nothing asserts on timing."""

import asyncio
import concurrent.futures
import copy
import gc
import pickle
import select
import struct
import threading

import pytest

import ferroce

pytestmark = pytest.mark.timeout(60)


def ip(host: int) -> str:
    """The test address 127.0.9.<host>."""
    assert 1 <= host <= 90, host
    return f"127.0.9.{host}"


def rc_pair(a, b):
    na, nb = ferroce.Nic(ip(a)), ferroce.Nic(ip(b))
    ca, cb = ferroce.Cq(na), ferroce.Cq(nb)
    qa = ferroce.Qp(na, ferroce.QpType.Rc, ca, ca)
    qb = ferroce.Qp(nb, ferroce.QpType.Rc, cb, cb)
    qa.connect(ferroce.QpEndpoint.from_bytes(bytes(qb.endpoint())))
    qb.connect(ferroce.QpEndpoint.from_bytes(bytes(qa.endpoint())))
    return na, nb, ca, cb, qa, qb


def drain(cq, tries=1000):
    """The next completion, polling (bounded)."""
    for _ in range(tries):
        c = cq.poll()
        if c is not None:
            return c
    return cq.wait(timeout=5.0)


# ---- descriptors -----------------------------------------------------------------------


def test_a_cq_descriptor_turns_readable_for_select():
    na, nb, ca, cb, qa, qb = rc_pair(1, 2)
    with na, nb:
        dst = ferroce.Region(nb, 64)
        assert isinstance(ca.fileno(), int) and ca.fileno() >= 0
        assert ca.take_events() == 0
        ca.req_notify()
        qa.post_send(ferroce.SendWr(7, ferroce.SendOp.write(dst.remote()), b"selected"))
        readable, _, _ = select.select([ca], [], [], 10.0)  # select calls fileno()
        assert readable == [ca]
        assert ca.take_events() >= 1
        c = drain(ca)
        assert c is not None and c.ok and c.wr_id == 7
        assert dst.read(0, 8) == b"selected"
        # Taken: nothing more until armed again.
        assert ca.take_events() == 0
        assert select.select([ca.fileno()], [], [], 0)[0] == []


def test_asyncio_waits_for_a_receive_through_add_reader():
    na, nb, ca, cb, qa, qb = rc_pair(3, 4)
    with na, nb:
        inbox = ferroce.Region(nb, 64)
        qb.post_recv(ferroce.RecvWr(5, inbox.local()))

        async def receive():
            loop = asyncio.get_running_loop()
            ready = loop.create_future()

            def on_readable():
                loop.remove_reader(cb.fileno())
                if not ready.done():
                    ready.set_result(cb.take_events())

            cb.req_notify(solicited_only=False)
            loop.add_reader(cb.fileno(), on_readable)
            qa.post_send(ferroce.SendWr(1, ferroce.SendOp.send(), b"from asyncio"))
            events = await asyncio.wait_for(ready, 10.0)
            return events, drain(cb)

        events, got = asyncio.run(receive())
        assert events >= 1
        assert got.ok and got.opcode == "Recv" and got.wr_id == 5 and got.byte_len == 12
        assert inbox.read(0, 12) == b"from asyncio"
        assert drain(ca).ok


# ---- shared receive queues and async events --------------------------------------------


def test_an_srq_feeds_two_queue_pairs_and_raises_its_limit_event():
    na, nb = ferroce.Nic(ip(5)), ferroce.Nic(ip(6))
    with na, nb:
        ca, cb = ferroce.Cq(na), ferroce.Cq(nb)
        srq = ferroce.Srq(nb, 16)
        qa1 = ferroce.Qp(na, ferroce.QpType.Rc, ca, ca)
        qa2 = ferroce.Qp(na, ferroce.QpType.Rc, ca, ca)
        qb1 = ferroce.Qp(nb, ferroce.QpType.Rc, cb, cb, srq=srq)
        qb2 = ferroce.Qp(nb, ferroce.QpType.Rc, cb, cb, srq=srq)
        for a, b in ((qa1, qb1), (qa2, qb2)):
            a.connect(b.endpoint())
            b.connect(a.endpoint())
        with pytest.raises(ferroce.PostError):
            qb1.post_recv(ferroce.RecvWr(0))
        pool = ferroce.Region(nb, 4 * 64)
        for i in range(4):
            srq.post_recv(ferroce.RecvWr(100 + i, pool.local(i * 64, 64)))
        assert srq.query() == (16, 0, 4)
        srq.arm(4)
        assert srq.query()[1] == 4
        assert nb.poll_event() is None
        assert nb.fileno() == nb.async_fd()

        qa1.post_send(ferroce.SendWr(1, ferroce.SendOp.send(), b"one"))
        qa2.post_send(ferroce.SendWr(2, ferroce.SendOp.send(), b"two"))
        got = [cb.wait(timeout=10.0) for _ in range(2)]
        assert all(c is not None and c.ok and c.opcode == "Recv" for c in got)
        by_qp = {c.qpn: c for c in got}
        assert set(by_qp) == {qb1.qpn(), qb2.qpn()}
        assert by_qp[qb1.qpn()].byte_len == 3 and by_qp[qb2.qpn()].byte_len == 3
        assert srq.query()[2] == 2

        assert select.select([nb], [], [], 10.0)[0] == [nb]
        event = nb.poll_event()
        assert isinstance(event, ferroce.AsyncEvent)
        assert event.kind == "SrqLimitReached" and event.srq_id == srq.id and event.qpn is None
        assert nb.poll_event() is None
        with pytest.raises(ferroce.InvalidArgument):
            srq.arm(16)


# ---- connection management --------------------------------------------------------------


def cm_nics(server, client):
    ns, nc = ferroce.Nic(ip(server)), ferroce.Nic(ip(client))
    cs, cc = ferroce.Cq(ns), ferroce.Cq(nc)
    qs = ferroce.Qp(ns, ferroce.QpType.Rc, cs, cs)
    qc = ferroce.Qp(nc, ferroce.QpType.Rc, cc, cc)
    return ns, nc, cs, cc, qs, qc


def test_connect_accept_with_private_data_then_write_and_disconnect():
    ns, nc, cs, cc, qs, qc = cm_nics(10, 11)
    with ns, nc, ferroce.Listener(ns, 7471) as listener, concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert listener.port == 7471
        dialing = pool.submit(
            ferroce.Connection.connect, nc, qc, ip(10), 7471, b"hello from the client", timeout=20.0
        )
        req = listener.get_request(timeout=20.0)
        assert isinstance(req, ferroce.ConnectRequest)
        assert req.peer == ip(11)
        assert req.private_data.startswith(b"hello from the client")
        server = req.accept(qs, b"welcome")
        assert req.answered
        with pytest.raises(ferroce.Closed):
            req.reject()
        client = dialing.result(timeout=30)
        assert client.private_data.startswith(b"welcome")
        assert client.peer == ip(10) and server.peer == ip(11)
        server.wait_established(timeout=20.0)
        client.wait_established(timeout=1.0)  # the active side is established on return
        assert qs.state() == "Rts" and qc.state() == "Rts"

        # The queue pairs the CM brought up carry data.
        dst = ferroce.Region(ns, 64)
        qc.post_send(ferroce.SendWr(1, ferroce.SendOp.write(dst.remote()), b"over the CM"))
        assert cc.wait(timeout=10.0).ok
        assert dst.read(0, 11) == b"over the CM"

        client.disconnect(timeout=10.0)
        server.wait_disconnected(timeout=20.0)
        assert qs.state() == "Err" and qc.state() == "Err"


def test_a_rejection_carries_its_reason_and_private_data():
    ns, nc, cs, cc, qs, qc = cm_nics(12, 13)
    with ns, nc, ferroce.Listener(ns, 7471) as listener, concurrent.futures.ThreadPoolExecutor(1) as pool:
        dialing = pool.submit(ferroce.Connection.connect, nc, qc, ip(12), 7471, b"let me in", timeout=20.0)
        req = listener.get_request(timeout=20.0)
        req.reject(b"not today")
        with pytest.raises(ferroce.Rejected) as caught:
            dialing.result(timeout=30)
        e = caught.value
        assert isinstance(e, ferroce.CmError) and isinstance(e, ConnectionRefusedError)
        assert e.reason == "ConsumerDefined" and e.reason_code == 28
        assert e.private_data.startswith(b"not today")
        assert e.kind == "CmError::Rejected"

        # Nobody listens on 7472: REJ 8, invalid service ID.
        with pytest.raises(ferroce.Rejected) as caught:
            ferroce.Connection.connect(nc, ferroce.Qp(nc, ferroce.QpType.Rc, cc, cc), ip(12), 7472, timeout=20.0)
        assert caught.value.reason == "InvalidServiceId" and caught.value.reason_code == 8


def test_cm_argument_and_timeout_errors_are_typed():
    ns, nc, cs, cc, qs, qc = cm_nics(14, 15)
    with ns, nc:
        listener = ferroce.Listener(ns, 7000)
        with pytest.raises(ferroce.AddressInUse):
            ferroce.Listener(ns, 7000)
        with pytest.raises(ferroce.Timeout) as caught:
            listener.get_request(timeout=0.2)
        assert isinstance(caught.value, TimeoutError) and isinstance(caught.value, ferroce.FerroceError)
        with pytest.raises(ferroce.InvalidArgument):
            listener.get_sidr_request(timeout=0.1)  # a TCP-space listener hears no SIDR
        with pytest.raises(ferroce.InvalidArgument):
            ferroce.Connection.connect(nc, qc, ip(14), 7000, b"x" * 57, timeout=5.0)
        listener.close()
        listener.close()
        with pytest.raises(ferroce.Closed):
            listener.get_request(timeout=0.1)
        # Closed, the port is free again.
        ferroce.Listener(ns, 7000).close()


def test_a_dropped_connection_disconnects_and_waits_release_the_gil():
    ns, nc, cs, cc, qs, qc = cm_nics(16, 17)
    with ns, nc, ferroce.Listener(ns, 7471) as listener, concurrent.futures.ThreadPoolExecutor(1) as pool:
        # Another Python thread runs while get_request waits.
        ticks = []
        stop = threading.Event()

        def tick():
            while not stop.is_set():
                ticks.append(1)
                stop.wait(0.01)

        ticker = threading.Thread(target=tick)
        ticker.start()
        with pytest.raises(ferroce.Timeout):
            listener.get_request(timeout=0.5)
        stop.set()
        ticker.join()
        assert len(ticks) > 1

        dialing = pool.submit(ferroce.Connection.connect, nc, qc, ip(16), 7471, timeout=20.0)
        server = listener.get_request(timeout=20.0).accept(qs)
        client = dialing.result(timeout=30)
        server.wait_established(timeout=20.0)
        assert client.private_data == bytes(196)  # an empty REP, zero-padded
        # The last reference going disconnects, as rdma_destroy_id does.
        del client, dialing
        gc.collect()
        server.wait_disconnected(timeout=20.0)
        assert qs.state() == "Err"
        server.disconnect()  # closed by the peer already: returns at once


# ---- UD and SIDR ------------------------------------------------------------------------


def test_a_ud_datagram_arrives_after_its_grh_and_is_answered():
    qkey = 0x1111_1111
    na, nb = ferroce.Nic(ip(20)), ferroce.Nic(ip(21))
    with na, nb:
        ca, cb = ferroce.Cq(na), ferroce.Cq(nb)
        qa = ferroce.Qp(na, ferroce.QpType.Ud, ca, ca)
        qb = ferroce.Qp(nb, ferroce.QpType.Ud, cb, cb)
        qa.ready_ud(qkey)
        qb.ready_ud(qkey)
        ra, rb = ferroce.Region(na, 2048), ferroce.Region(nb, 2048)
        qa.post_recv(ferroce.RecvWr(1, ra.local()))
        qb.post_recv(ferroce.RecvWr(2, rb.local()))

        ah = ferroce.AddressHandle(nb.addr())
        assert ah == ferroce.AddressHandle(ip(21)) and ah.addr == (ip(21), 4791)
        dest = ah.dest(qb.qpn(), qkey)
        assert (dest.qpn, dest.qkey, dest.addr) == (qb.qpn(), qkey, (ip(21), 4791))
        qa.post_send(ferroce.SendWr(3, ferroce.SendOp.send_with_imm(42), b"a datagram", dest=dest))
        assert ca.wait(timeout=10.0).ok
        got = cb.wait(timeout=10.0)
        assert got.ok and got.opcode == "Recv" and got.imm == 42
        assert got.byte_len == ferroce.UD_GRH_LEN + 10
        assert got.src_qp == qa.qpn() and got.src_addr == ip(20)
        grh = rb.read(0, ferroce.UD_GRH_LEN)
        assert grh[:20] == bytes(20) and grh[20] == 0x45
        assert grh[32:36] == bytes([127, 0, 9, 20]) and grh[36:40] == bytes([127, 0, 9, 21])
        assert rb.read(ferroce.UD_GRH_LEN, 10) == b"a datagram"

        back = ferroce.AddressHandle.from_completion(got)
        assert back == ferroce.AddressHandle(ip(20))
        qb.post_send(ferroce.SendWr(4, ferroce.SendOp.send(), b"answer", dest=back.dest(got.src_qp, qkey)))
        sent = cb.wait(timeout=10.0)
        assert sent.ok and sent.src_qp is None and sent.src_addr is None
        answer = ca.wait(timeout=10.0)
        assert answer.ok and ra.read(ferroce.UD_GRH_LEN, 6) == b"answer"
        assert answer.src_qp == qb.qpn()

        # A send completion is no UD receive; a UD send needs a destination.
        assert ferroce.AddressHandle.from_completion(sent) is None
        with pytest.raises(ferroce.PostError):
            qa.post_send(ferroce.SendWr(5, ferroce.SendOp.send(), b"nowhere"))
        with pytest.raises(TypeError):
            ferroce.SendWr(6, ferroce.SendOp.send(), b"x", dest="127.0.9.21")


def test_sidr_resolves_a_ud_queue_pair_behind_a_port():
    ns, nc = ferroce.Nic(ip(22)), ferroce.Nic(ip(23))
    with ns, nc, ferroce.Listener(ns, 7474, udp=True) as listener, concurrent.futures.ThreadPoolExecutor(1) as pool:
        cs, cc = ferroce.Cq(ns), ferroce.Cq(nc)
        qs = ferroce.Qp(ns, ferroce.QpType.Ud, cs, cs)
        qc = ferroce.Qp(nc, ferroce.QpType.Ud, cc, cc)
        qs.ready_ud()  # rdma_cm's Q_Key
        qc.ready_ud()
        inbox = ferroce.Region(ns, 512)
        qs.post_recv(ferroce.RecvWr(1, inbox.local()))

        resolving = pool.submit(ferroce.resolve_ud, nc, ip(22), 7474, b"who serves?", timeout=20.0)
        req = listener.get_sidr_request(timeout=20.0)
        assert req.peer == ip(23) and req.private_data.startswith(b"who serves?")
        req.accept(qs)
        peer = resolving.result(timeout=30)
        assert isinstance(peer, ferroce.UdPeer)
        assert peer.qpn == qs.qpn() and peer.qkey == ferroce.RDMA_UDP_QKEY
        assert peer.address == ferroce.AddressHandle(ip(22))
        assert peer.dest() == peer.address.dest(peer.qpn, peer.qkey)

        qc.post_send(ferroce.SendWr(2, ferroce.SendOp.send(), b"resolved", dest=peer))
        assert cc.wait(timeout=10.0).ok
        got = cs.wait(timeout=10.0)
        assert got.ok and inbox.read(ferroce.UD_GRH_LEN, 8) == b"resolved"

        # A refusal, and a port nobody listens on, are rejections with the SIDR status.
        resolving = pool.submit(ferroce.resolve_ud, nc, ip(22), 7474, timeout=20.0)
        listener.get_sidr_request(timeout=20.0).reject()
        with pytest.raises(ferroce.Rejected) as caught:
            resolving.result(timeout=30)
        assert caught.value.reason == "Reject" and caught.value.reason_code == 2
        with pytest.raises(ferroce.Rejected) as caught:
            ferroce.resolve_ud(nc, ip(22), 7475, timeout=20.0)
        assert caught.value.reason == "Unsupported" and caught.value.reason_code == 1


# ---- bytes and pickle -------------------------------------------------------------------


def test_remote_addr_bytes_are_fixed_big_endian_and_picklable():
    r = ferroce.RemoteAddr(0x0102_0304_0506_0708, 0xA1B2_C3D4)
    raw = bytes(r)
    assert raw == r.to_bytes() == struct.pack(">B3xIQ", 1, 0xA1B2_C3D4, 0x0102_0304_0506_0708)
    assert len(raw) == 16
    assert ferroce.RemoteAddr.from_bytes(raw) == r
    assert pickle.loads(pickle.dumps(r)) == r
    assert copy.copy(r) == r and copy.deepcopy(r) == r
    assert hash(ferroce.RemoteAddr.from_bytes(raw)) == hash(r)
    assert r != ferroce.RemoteAddr(0x0102_0304_0506_0708, 1) and r != "not an address"
    assert len({r, ferroce.RemoteAddr.from_bytes(raw)}) == 1
    for bad in (raw[:15], raw + b"\0", b""):
        with pytest.raises(ferroce.InvalidArgument, match="16 bytes"):
            ferroce.RemoteAddr.from_bytes(bad)
    with pytest.raises(ValueError, match="version 2"):
        ferroce.RemoteAddr.from_bytes(b"\x02" + raw[1:])


def test_qp_endpoint_bytes_are_fixed_big_endian_and_picklable():
    nic = ferroce.Nic(ip(30))
    with nic:
        cq = ferroce.Cq(nic)
        qp = ferroce.Qp(nic, ferroce.QpType.Rc, cq, cq)
        e = qp.endpoint()
        raw = bytes(e)
        assert len(raw) == 28 and raw == e.to_bytes()
        version, zero, port, qpn, psn = struct.unpack(">BBHII", raw[:12])
        assert (version, zero, port, qpn, psn) == (1, 0, 4791, qp.qpn(), e.psn)
        assert raw[12:] == bytes(10) + b"\xff\xff" + bytes([127, 0, 9, 30])
        back = ferroce.QpEndpoint.from_bytes(raw)
        assert back == e and back.addr == (ip(30), 4791) and hash(back) == hash(e)
        assert pickle.loads(pickle.dumps(e)) == e and copy.deepcopy(e) == e

    v6 = ferroce.QpEndpoint(0xABCDEF, 0x123456, ("::1", 4792))
    raw6 = bytes(v6)
    assert raw6[12:] == bytes(15) + b"\x01"
    assert ferroce.QpEndpoint.from_bytes(raw6) == v6 and ferroce.QpEndpoint.from_bytes(raw6).addr == ("::1", 4792)
    assert v6 != ferroce.QpEndpoint(0xABCDEF, 0x123457, ("::1", 4792))
    for bad in (raw6[:27], raw6 + b"\0", b"1 2 127.0.9.1:4791"):
        with pytest.raises(ferroce.InvalidArgument, match="28 bytes"):
            ferroce.QpEndpoint.from_bytes(bad)
    with pytest.raises(ValueError, match="version 0"):
        ferroce.QpEndpoint.from_bytes(b"\x00" + raw6[1:])
    with pytest.raises(ferroce.InvalidArgument, match="24 bits"):
        ferroce.QpEndpoint.from_bytes(raw6[:4] + b"\x01\x00\x00\x00" + raw6[8:])
