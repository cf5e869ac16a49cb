"""The cache's flush and receive, and a session round trip with a Python coprocessor."""

import threading

import pytest

import ferroce
from ferroce import cache, session
from conftest import ip

pytestmark = pytest.mark.timeout(60)


def in_thread(f):
    out = []
    t = threading.Thread(target=lambda: out.append(f()))
    t.start()
    return t, out


def test_cache_flush_and_receive():
    t, out = in_thread(
        lambda: cache.Context.connect(cache.ContextConfig(ip(41), ip(41) + ":19641", True, timeout=10.0))
    )
    local = cache.Context.connect(cache.ContextConfig(ip(40), ip(41) + ":19641", False, timeout=10.0))
    t.join()
    remote = out[0]
    for n in range(3):
        with local.write_memory(1000) as buf:
            assert len(buf) == 1000 and buf.device() == -1
            message = bytes([n]) * 1000
            buf.write(message)
            local.flush(buf)
        got = remote.receive(timeout=5.0)
        assert got.to_bytes() == message
        got.release()
    stats = local.stats()
    assert stats["hits"] >= 2, stats  # the buffer came back to the cache
    wrapped = local.wrap_user_buffer(b"mine")
    local.flush(wrapped)
    assert remote.receive(5.0).to_bytes() == b"mine"
    assert wrapped.into_user_buffer() == b"mine"
    with pytest.raises(ferroce.Timeout) as e:
        remote.receive(timeout=0.2)
    assert isinstance(e.value, TimeoutError)
    with pytest.raises(ferroce.InvalidArgument) as e:
        local.write_memory(0)
    assert e.value.seed_code == -1
    with pytest.raises(ferroce.NotSupported) as e:
        local.write_memory(64, gpu_id=0)
    assert e.value.seed_code == -2


def test_session_round_trip_with_a_python_coprocessor():
    desc = session.ChannelDesc(4, 512, 512)
    calls = []

    def function(request: bytes) -> bytes:
        calls.append(threading.get_ident())
        if request == b"fail":
            raise ValueError("cannot serve this one")
        return request[::-1]

    def coprocessor():
        c = session.Coprocessor()
        c.connect(session.ConnectInfo(ip(51), ip(51) + ":19651"))
        region = c.alloc_memory(desc.region_bytes())
        peer = c.exchange_keys(region)
        c.establish_channel(desc, region, peer)
        c.set_coprocessor_fn(function)
        c.start()
        return c

    t, out = in_thread(coprocessor)
    ctl = session.Controller()
    with pytest.raises(ferroce.OutOfOrder, match="needs connect first"):
        ctl.start()
    ctl.connect(session.ConnectInfo(ip(50), ip(51) + ":19651"))
    region = ctl.alloc_memory(desc.region_bytes())
    assert region.len() == desc.region_bytes()
    peer = ctl.exchange_keys(region)
    ctl.establish_channel(desc, region, peer)
    ctl.start()
    t.join()
    cop = out[0]
    with ctl, cop:
        for n in range(5):
            request = b"request %d" % n
            rid = ctl.submit(request)
            got_id, reply = ctl.collect(timeout=5.0)
            assert (got_id, reply) == (rid, request[::-1])
        assert ctl.last_rtt_ns() > 0
        # Counted before each reply leaves, so all five are in by now.
        assert cop.served() == 5
        assert ctl.peer_gone() is None and cop.peer_gone() is None
        served_id, served = cop.collect(timeout=5.0)
        assert served == b"request 0"[::-1]

        ctl.submit(b"fail")
        with pytest.raises(ferroce.CoprocessorFailed, match="ValueError: cannot serve this one"):
            ctl.collect(timeout=5.0)
        # The engine goes on serving.
        ctl.submit(b"after")
        out_buf = bytearray(512)
        got = ctl.collect_into(out_buf, timeout=5.0)
        assert bytes(out_buf[: got.bytes]) == b"retfa"
        with pytest.raises(ferroce.InvalidArgument, match="does not fit"):
            ctl.submit(b"x" * 513)
    assert calls and all(c != threading.get_ident() for c in calls)
