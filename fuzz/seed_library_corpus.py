#!/usr/bin/env python3
"""Seed the corpora of the targets over the ferroce library's parsers: corpus/capture/,
corpus/control/ and corpus/exchange/.

capture: from every capture in testdata/ and testdata/cm/, its first 6 frames as a classic
pcap (as the file has it) and as a pcapng file (a section header, an interface description
and enhanced packet blocks, then a simple packet block and an obsolete packet block with the
same frames); its first frame again under every link type the reader strips (Ethernet with
802.1Q and 802.1ad tags, Linux cooked v1 and v2, raw IP, BSD loopback in host and network
order), as a big-endian nanosecond pcap; and the 6 frames cut to 64 bytes with their
original lengths kept and a snap length of 64, as `tcpdump -s 64` writes them.

control: session hellos for both roles (and another version, and a role missing), channel
descriptions, and a file of several such lines.

exchange: ibv_rc_pingpong's 52-byte message (IPv4-mapped and IPv6 GIDs), ferroce's exchange
text (IPv4, IPv6 with a scope, no region, two regions, another version, an unknown line) and
one followed by the bytes a peer sends next.

Files are named by the SHA-1 of their contents. Usage: python3 fuzz/seed_library_corpus.py
"""
import hashlib
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTDATA = HERE.parent / "testdata"
CORPUS = HERE / "corpus"
FRAMES = 6


def read_pcap(path):
    """(endianness, nanosecond?, linktype, [(sec, frac, orig_len, data)]) of a classic pcap."""
    data = path.read_bytes()
    magic = data[:4]
    end = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    linktype = struct.unpack(end + "I", data[20:24])[0]
    frames = []
    at = 24
    while at + 16 <= len(data):
        sec, frac, incl, orig = struct.unpack(end + "IIII", data[at : at + 16])
        frames.append((sec, frac, orig, data[at + 16 : at + 16 + incl]))
        at += 16 + incl
    return end, nano, linktype, frames


def pcap(frames, linktype, end="<", nano=False, snaplen=262144):
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out = struct.pack(end + "IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype)
    for sec, frac, orig, data in frames:
        out += struct.pack(end + "IIII", sec, frac, len(data), orig) + data
    return out


def block(kind, body):
    body += bytes(-len(body) % 4)
    length = 12 + len(body)
    return struct.pack("<II", kind, length) + body + struct.pack("<I", length)


def pcapng(frames, linktype, nano):
    out = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    out += block(1, struct.pack("<HHI", linktype, 0, 262144))
    for sec, frac, orig, data in frames:
        # The default resolution is microseconds.
        ts = sec * 1_000_000 + (frac // 1000 if nano else frac)
        epb = struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, len(data), orig) + data
        out += block(6, epb)
    for _, _, orig, data in frames[:2]:
        out += block(3, struct.pack("<I", orig) + data)
    for sec, frac, orig, data in frames[:2]:
        ts = sec * 1_000_000 + (frac // 1000 if nano else frac)
        pb = struct.pack("<HHIIII", 0, 0, ts >> 32, ts & 0xFFFFFFFF, len(data), orig) + data
        out += block(2, pb)
    return out


def relinked(frame):
    """The first frame's IP packet under each link type: (linktype, frame bytes)."""
    data = frame
    at, ethertype = 14, struct.unpack(">H", data[12:14])[0]
    while ethertype in (0x8100, 0x88A8):
        ethertype = struct.unpack(">H", data[at + 2 : at + 4])[0]
        at += 4
    ip = data[at:]
    macs = data[:12]
    family = 2 if ethertype == 0x0800 else 10
    yield 1, macs + struct.pack(">HHHH", 0x88A8, 5, 0x8100, 7) + struct.pack(">H", ethertype) + ip
    yield 113, struct.pack(">HHH", 0, 1, 6) + macs[:8] + struct.pack(">H", ethertype) + ip
    yield 276, struct.pack(">HHIHBB", ethertype, 0, 2, 1, 0, 6) + macs[:8] + ip
    yield 101, ip
    yield 0, struct.pack("<I", family) + ip
    yield 108, struct.pack(">I", family) + ip


def capture_seeds():
    seeds = set()
    for path in sorted(TESTDATA.glob("*.pcap")) + sorted(TESTDATA.glob("cm/*.pcap")):
        end, nano, linktype, frames = read_pcap(path)
        first = frames[:FRAMES]
        if not first:
            continue
        seeds.add(pcap(first, linktype, end, nano))
        seeds.add(pcapng(first, linktype, nano))
        snapped = [(s, f, o, d[:64]) for s, f, o, d in first]
        seeds.add(pcap(snapped, linktype, end, nano, snaplen=64))
        if linktype == 1:
            sec, frac, orig, data = first[0]
            for kind, frame in relinked(data):
                seeds.add(pcap([(sec, frac, len(frame), frame)], kind, ">", True))
    return seeds


def control_seeds():
    lines = [
        "ferroce-session/1 role=controller mtu=1024",
        "ferroce-session/1 role=coprocessor mtu=4096",
        "ferroce-session/2 role=controller mtu=1024",
        "ferroce-session/1 mtu=1024",
        "channel slots=8 request=4096 reply=4096",
        "channel slots=1024 request=1073741824 reply=1",
        "channel slots=0 request=64 reply=64",
        "ready",
    ]
    seeds = {line.encode() for line in lines}
    seeds.add("\n".join(lines).encode())
    return seeds


def exchange_seeds():
    v4 = b"0000:000011:5f2841:00000000000000000000ffff0a000001\0"
    v6 = b"0000:0000a2:000001:fd000000000000000000000000000002\0"
    texts = [
        "ferroce-exchange/1\nqp qpn=0x000012 psn=0xabcdef addr=10.0.0.2:4791\n"
        "region va=0x7f0000001000 rkey=0xdeadbeef len=65536\n\n",
        "ferroce-exchange/1\nqp qpn=0x000012 psn=0x000001 addr=[fe80::2%3]:4791\n\n",
        "ferroce-exchange/1\nqp qpn=0x000001 psn=0x000000 addr=[fd00::1]:4791\n"
        "region va=0x0 rkey=0x1 len=0\nregion va=0xffffffffffffffff rkey=0xffffffff "
        "len=18446744073709551615\nlater key=value\n\n",
        "ferroce-exchange/2\nqp qpn=0x000012 psn=0x000001 addr=10.0.0.2:4791\n\n",
    ]
    seeds = {v4, v6}
    seeds.update(t.encode() for t in texts)
    seeds.add(texts[0].encode() + b"ready\nhb")
    return seeds


def main():
    for name, seeds in (
        ("capture", capture_seeds()),
        ("control", control_seeds()),
        ("exchange", exchange_seeds()),
    ):
        out = CORPUS / name
        out.mkdir(parents=True, exist_ok=True)
        for blob in seeds:
            (out / hashlib.sha1(blob).hexdigest()).write_bytes(blob)
        sizes = sorted(len(b) for b in seeds)
        print(f"{out}: {len(seeds)} inputs, largest {sizes[-1]} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
