#!/usr/bin/env python3
"""Seed the fuzz corpora from the captures in testdata/.

For every UDP packet to port 4791 in ../testdata/*.pcap (classic pcap, Ethernet, IPv4 or
IPv6, optional 802.1Q tags) this writes the IP packet (IP header on, Ethernet padding cut)
to corpus/datagram/ and the UDP payload (BTH through ICRC) to corpus/packet/, each file named
by the SHA-1 of its contents, as libFuzzer names its own corpus files.

corpus/cm/ gets the 256-byte MAD of every UD SEND_ONLY to QP 1 in the captures, and one MAD
per CM attribute made here: the CM header (base version 1, class 0x07, class version 2,
method Send) and an all-zero message, but for the REQ's MTU code (3, as 0 is reserved).
Random bytes almost never reach the message bodies without them.

Usage: python3 fuzz/seed_corpus.py   (from anywhere)
"""
import hashlib
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTDATA = HERE.parent / "testdata"
ROCE_PORT = 4791


def records(path):
    data = path.read_bytes()
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        end = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        end = ">"
    else:
        raise ValueError(f"{path}: not a classic pcap file")
    linktype = struct.unpack(end + "I", data[20:24])[0]
    if linktype != 1:
        raise ValueError(f"{path}: link type {linktype}, expected 1 (Ethernet)")
    at = 24
    while at + 16 <= len(data):
        incl = struct.unpack(end + "I", data[at + 8 : at + 12])[0]
        yield data[at + 16 : at + 16 + incl]
        at += 16 + incl


def roce(frame):
    """(IP packet, UDP payload) of a RoCEv2 frame, or None."""
    at, ethertype = 14, struct.unpack(">H", frame[12:14])[0]
    while ethertype in (0x8100, 0x88A8):
        ethertype = struct.unpack(">H", frame[at + 2 : at + 4])[0]
        at += 4
    ip = frame[at:]
    if ethertype == 0x0800 and len(ip) >= 20 and ip[9] == 17:
        ip = ip[: struct.unpack(">H", ip[2:4])[0]]
        udp = ip[(ip[0] & 0x0F) * 4 :]
    elif ethertype == 0x86DD and len(ip) >= 40 and ip[6] == 17:
        ip = ip[: 40 + struct.unpack(">H", ip[4:6])[0]]
        udp = ip[40:]
    else:
        return None
    if len(udp) < 8 or struct.unpack(">H", udp[2:4])[0] != ROCE_PORT:
        return None
    return ip, udp[8:]


def cm_mad(payload):
    """The MAD of a UD SEND_ONLY (0x64) to QP 1: after the BTH (12) and DETH (8), 256 bytes."""
    if len(payload) < 20 + 256 or payload[0] != 0x64 or payload[5:8] != b"\x00\x00\x01":
        return None
    return payload[20 : 20 + 256]


def cm_seeds():
    for attribute in range(0x10, 0x1B):
        mad = bytearray(256)
        mad[0:4] = bytes([1, 0x07, 2, 0x03])
        mad[16:18] = struct.pack(">H", attribute)
        if attribute == 0x10:
            mad[24 + 50] = 0x30
        yield bytes(mad)


def main():
    names = ("datagram", "packet", "cm")
    out = {name: HERE / "corpus" / name for name in names}
    for d in out.values():
        d.mkdir(parents=True, exist_ok=True)
    written = {name: set() for name in names}

    def write(name, blob):
        digest = hashlib.sha1(blob).hexdigest()
        (out[name] / digest).write_bytes(blob)
        written[name].add(digest)

    for pcap in sorted(TESTDATA.glob("*.pcap")):
        for frame in records(pcap):
            found = roce(frame)
            if found is None:
                continue
            for name, blob in zip(("datagram", "packet"), found):
                write(name, blob)
            mad = cm_mad(found[1])
            if mad is not None:
                write("cm", mad)
    for mad in cm_seeds():
        write("cm", mad)
    for name, digests in written.items():
        print(f"{out[name]}: {len(digests)} distinct inputs", file=sys.stderr)


if __name__ == "__main__":
    main()
