"""RegionAccess is an enum.Flag: every OR of the remote rights grants exactly those rights on
a region and on a queue pair, and nothing more. Addresses 127.0.4.11 and 127.0.4.12, one port
per pair (a refused operation is fatal to its pair)."""

import enum
import functools
import itertools
import operator

import pytest

import ferroce

pytestmark = pytest.mark.timeout(120)

A = ferroce.RegionAccess
SINGLE = [A.RemoteWrite, A.RemoteRead, A.RemoteAtomic]
# All eight sets, each built with `|` from the single rights (the empty OR is Local).
ALL = [
    functools.reduce(operator.or_, combo, A.Local)
    for n in range(4)
    for combo in itertools.combinations(SINGLE, n)
]
_port = itertools.count(26000)


def test_region_access_is_a_flag():
    assert issubclass(A, enum.Flag)
    rw = A.RemoteWrite | A.RemoteRead
    assert A.RemoteWrite in rw and A.RemoteRead in rw and A.RemoteAtomic not in rw
    assert rw != A.RemoteAtomic
    assert A.RemoteWrite | A.RemoteRead | A.RemoteAtomic == A.Remote
    assert A.Local | A.RemoteWrite == A.RemoteWrite
    assert rw & A.RemoteRead == A.RemoteRead
    assert sorted(a.value for a in ALL) == list(range(8))
    assert len({a.value for a in ALL}) == 8


def op_status(region_grant, qp_grant, op):
    """One WRITE, READ or fetch-and-add from a fresh pair into a region granting
    `region_grant` through QPs granting `qp_grant`: the completion and whether the target's
    bytes changed."""
    port = next(_port)
    na = ferroce.Nic(f"127.0.4.11:{port}")
    nb = ferroce.Nic(f"127.0.4.12:{port}")
    with na, nb:
        ca, cb = ferroce.Cq(na), ferroce.Cq(nb)
        qa = ferroce.Qp(na, ferroce.QpType.Rc, ca, ca)
        qb = ferroce.Qp(nb, ferroce.QpType.Rc, cb, cb)
        qa.connect(qb.endpoint(), access=qp_grant)
        qb.connect(qa.endpoint(), access=qp_grant)
        local = ferroce.Region(na, bytes(range(1, 65)), A.Local)
        target = ferroce.Region(nb, 64, region_grant)
        remote = target.remote()
        if op == "write":
            send = ferroce.SendOp.write(remote)
            sge = local.local(0, 64)
        elif op == "read":
            send = ferroce.SendOp.read(remote)
            sge = local.local(0, 64)
        else:
            send = ferroce.SendOp.fetch_add(remote, 1)
            sge = local.local(0, 8)
        qa.post_send(ferroce.SendWr(1, send, sge))
        c = ca.wait(timeout=10.0)
        assert c is not None
        return c, target.read(0, 64) != bytes(64)


@pytest.mark.parametrize("grant", ALL, ids=lambda a: str(a.value))
def test_every_or_grants_exactly_that(grant):
    for right, op in [(A.RemoteWrite, "write"), (A.RemoteRead, "read"), (A.RemoteAtomic, "atomic")]:
        granted = right in grant
        # Granted by the region; the QP grants everything.
        if grant == A.Local:
            with pytest.raises(ferroce.FerroceError):
                ferroce.Region(ferroce.Nic("127.0.4.11:25999"), 64, grant).remote()
        else:
            c, changed = op_status(grant, A.Remote, op)
            assert c.ok == granted, (grant, op, c.status)
            if not granted:
                assert c.status == "RemAccessErr", (grant, op)
                assert "rkey" in c.hint and "grant" in c.hint, c.hint
            else:
                assert c.hint is None, "a success needs no hint"
            assert changed == (granted and op != "read")
        # Granted by the QP; the region grants everything.
        c, changed = op_status(A.Remote, grant, op)
        assert c.ok == granted, (grant, op, c.status)
        if not granted:
            assert c.status == "RemInvReqErr", (grant, op)
        assert changed == (granted and op != "read")


def test_access_by_name_and_wrong_access():
    with ferroce.Nic("127.0.4.11:25998") as nic:
        assert ferroce.Region(nic, 64, "RemoteWrite|RemoteRead").remote() is not None
        with pytest.raises(ValueError):
            ferroce.Region(nic, 64, "Everything")
        with pytest.raises(TypeError):
            ferroce.Region(nic, 64, 3)
