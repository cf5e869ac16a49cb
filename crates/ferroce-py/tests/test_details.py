"""What a new user meets first (issue 25, item 6): NumPy a dependency, QpEndpoint from what
`.addr` gives, real defaults in signatures, member docstrings of their own, errno on address
errors. Addresses 127.0.4.21-127.0.4.23."""

import errno
import inspect
import pathlib
import re

import pytest

import ferroce
import ferroce.cache
import ferroce.frames

pytestmark = pytest.mark.timeout(60)

PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_numpy_is_a_dependency():
    # (tomllib is 3.11's; the package supports 3.10.)
    deps = re.search(r"^dependencies = \[(.*)\]$", PYPROJECT.read_text(), re.M)
    assert deps and '"numpy' in deps.group(1), deps
    # And the installed distribution says so, as pip installs it.
    from importlib.metadata import requires

    assert any(r.startswith("numpy") for r in requires("ferroce") or []), requires("ferroce")


def test_endpoint_from_its_own_addr_tuple_and_from_text():
    with ferroce.Nic("127.0.4.21") as nic:
        cq = ferroce.Cq(nic)
        qp = ferroce.Qp(nic, ferroce.QpType.Rc, cq, cq)
        e = qp.endpoint()
        assert e.addr == ("127.0.4.21", 4791)
        again = ferroce.QpEndpoint(e.qpn, e.psn, e.addr)
        assert bytes(again) == bytes(e)
        assert bytes(ferroce.QpEndpoint(e.qpn, e.psn, "127.0.4.21:4791")) == bytes(e)
        assert bytes(ferroce.QpEndpoint(e.qpn, e.psn, "127.0.4.21")) == bytes(e)
        with pytest.raises(TypeError):
            ferroce.QpEndpoint(e.qpn, e.psn, 4791)
        with pytest.raises(ValueError):
            ferroce.QpEndpoint(e.qpn, e.psn, ("not an address", 4791))


def all_callables():
    seen = set()
    for module in (ferroce, ferroce.frames, ferroce.cache):
        for name in dir(module):
            cls = getattr(module, name)
            if not isinstance(cls, type) or cls in seen or issubclass(cls, BaseException):
                continue
            seen.add(cls)
            yield cls.__name__, cls
            for attr, value in vars(cls).items():
                if not attr.startswith("_") and callable(value):
                    yield f"{cls.__name__}.{attr}", getattr(cls, attr)


def test_no_signature_shows_ellipsis():
    bad = []
    for name, obj in all_callables():
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            continue
        if any(p.default is Ellipsis for p in sig.parameters.values()):
            bad.append(f"{name}{sig}")
    assert not bad, bad


def test_defaults_say_what_is_granted():
    region = inspect.signature(ferroce.Region).parameters
    assert region["access"].default == "Remote" and region["order"].default == "InOrder"
    connect = inspect.signature(ferroce.Qp.connect).parameters
    assert connect["access"].default == "Remote" and connect["mtu"].default == 1024
    cfg = inspect.signature(ferroce.cache.ContextConfig).parameters
    assert cfg["max_message"].default == 1 << 20
    # The names shown are accepted as they are.
    with ferroce.Nic("127.0.4.22") as nic:
        r = ferroce.Region(nic, 64, region["access"].default, region["order"].default)
        assert r.remote() is not None


def test_members_have_their_own_docstrings():
    for cls in (ferroce.RegionAccess, ferroce.WriteOrder, ferroce.QpType, ferroce.frames.Pattern):
        for member in cls.__members__.values():
            assert member.__doc__ and member.__doc__ != cls.__doc__, (cls, member)
    assert "WRITE" in ferroce.RegionAccess.RemoteWrite.__doc__
    assert ferroce.frames.Pattern.Counter.fill(3, 16) != ferroce.frames.Pattern.Zeros.fill(3, 16)
    assert ferroce.frames.Pattern.Zeros.fill(3, 16) == bytes(16)


def test_address_errors_carry_errno():
    with pytest.raises(ferroce.AddressNotAvailable) as not_here:
        ferroce.Nic("192.0.2.1")  # TEST-NET-1: no host has it
    assert not_here.value.errno == errno.EADDRNOTAVAIL
    with ferroce.Nic("127.0.4.23"):
        with pytest.raises(ferroce.AddressInUse) as in_use:
            ferroce.Nic("127.0.4.23")
        assert in_use.value.errno == errno.EADDRINUSE


def test_devices_lists_the_soft_nic_first():
    """``ferroce.devices()`` (``ibv_get_device_list``): the soft NIC, always there, first."""
    names = ferroce.devices()
    assert names[0] == "ferroce0"
    assert len(names) == len(set(names))
    assert all(isinstance(n, str) and n for n in names)
