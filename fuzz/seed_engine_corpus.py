#!/usr/bin/env python3
"""Seed the `engine` target's corpus (corpus/engine/) from the captures in testdata/ and the
`packet` corpus.

An `engine` input is a sequence of records: a 6-byte header (sel, arg, back, time, length as
big-endian u16) and a UDP payload; src/engine.rs documents the bits. This writes

- flows: the request packets of each capture, in order, in chunks of 8, sent by the peer to
  the RC or UC queue pair (by the opcode's transport) with the PSN set to the one expected,
  the RETH/AtomicETH key and va set to a region's (each of the four choices on the first
  chunk), and the ICRC re-sealed; the first chunk again from the stranger, and again with the
  clock advancing after each packet;
- requester answers: READ responses, atomic ACKs and ACKs from the captures with PSNs that
  answer the RC queue pair's outstanding READ (PSNs 0x200-0x203), FETCH_ADD (0x204),
  COMPARE_SWAP (0x205) and the rest (to 0x209), and the RNR NAK capture's ACKs;
- one record per file of corpus/packet/: as is, and rewritten to the RC or UC queue pair
  (PSN, key to the remote region, ICRC);
- paths the captures alone do not reach, from packets built here: a READ request answered,
  then sent again as a duplicate (the READ replayed; whole and from its middle, after other
  requests); SENDs and a WRITE with immediate to an RC queue pair reconnected with no receive
  posted (RNR NAKs sent); a request ahead of the expected PSN (a sequence NAK sent); RNR NAKs
  to the RC requester until its RNR retries run out; sequence, invalid-request, access and
  operational-error NAKs to it; and the RC requester's batch answered promptly, then left to
  stall short of the ACK timeout. (No early resend: the harness's ACK timeout, about 1 ms, is
  less than twice the engine's MIN_EARLY_RESEND, so the engine arms none.)

Files are named by the SHA-1 of their contents. Usage: python3 fuzz/seed_engine_corpus.py
"""
import hashlib
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from seed_corpus import TESTDATA, records, roce  # noqa: E402

OUT = HERE / "corpus" / "engine"
PACKETS = HERE / "corpus" / "packet"

SRC_STRANGER = 0x01
QP_RC = 0x02
QP_UC = 0x04
RESEAL = 0x08
KEY = 0x10
PSN = 0x80

# The RC requester's outstanding PSNs run 0x200..0x209; its next PSN is 0x20a, and a
# response's PSN is 0x20a - 1 - back.
RC_NEXT_PSN = 0x20A


def back_for(psn):
    return RC_NEXT_PSN - 1 - psn


def record(sel, payload, arg=0, back=0, time=0):
    return struct.pack(">BBBBH", sel, arg, back, time, len(payload)) + payload


def is_response(op):
    return 0x0D <= (op & 0x1F) <= 0x12 and op >> 5 == 0


def qp_bits(op):
    return QP_UC if op >> 5 == 1 else QP_RC


# Packets built here: BTH (P_Key 0xffff, AckReq, destination QP and PSN zero unless given: the
# harness rewrites them), the extension headers, the payload and a zero ICRC (re-sealed).
RC_SEND_ONLY = 0x04
RC_WRITE_ONLY = 0x0A
RC_WRITE_ONLY_IMM = 0x0B
RC_READ_REQUEST = 0x0C
RC_ACK = 0x11
# The PSN the RC and UC responders expect first (RQ_PSN in src/engine.rs).
RQ_PSN = 0x100
HOLD = 0x01  # arg bit 0 with KEY clear: no receive posted during the record


def bth(op, payload_len=0, psn=0):
    pad = -payload_len % 4
    return bytes([op, pad << 4, 0xFF, 0xFF, 0, 0, 0, 0, 0x80]) + psn.to_bytes(3, "big")


def built(op, ext=b"", payload=b"", psn=0):
    return bth(op, len(payload), psn) + ext + payload + bytes(-len(payload) % 4) + bytes(4)


def reth(length, va=0, rkey=0):
    return struct.pack(">QII", va, rkey, length)


def ack(syndrome, msn=0):
    return built(RC_ACK, bytes([syndrome]) + msn.to_bytes(3, "big"))


def built_seeds():
    """Records that reach the paths the captures alone do not."""
    seeds = []
    rc = PSN | RESEAL | QP_RC
    for key in (0, 1):
        sel = rc | KEY | key << 5
        # READ replay: a READ of 1 and of 4 PSNs answered, then sent again as a duplicate:
        # whole, and from its third PSN as a requester resends the rest of a READ (the va
        # 2048 bytes on, arg 128, and the length 2048 less).
        for length, span in ((64, 1), (4096, 4)):
            read = built(RC_READ_REQUEST, reth(length))
            seeds.append(record(sel, read) + record(sel, read, back=span, time=0x01))
        rest = built(RC_READ_REQUEST, reth(2048))
        read = built(RC_READ_REQUEST, reth(4096))
        seeds.append(record(sel, read) + record(sel, rest, arg=128, back=2, time=0x01))
        # After a WRITE and a SEND: the READ is three requests back.
        read = built(RC_READ_REQUEST, reth(1024))
        write = built(RC_WRITE_ONLY, reth(32), bytes(range(32)))
        send = built(RC_SEND_ONLY, payload=b"ping" * 4)
        seeds.append(
            record(sel, read)
            + record(rc | KEY, write)
            + record(rc, send)
            + record(sel, read, back=3, time=0x02)
            + record(sel, read, back=3, time=0x2C)
        )
    # RNR NAKs sent: a WRITE with the local region's key (an access NAK; the responder goes to
    # ERR), the RC queue pair reconnected with no receive posted, then SENDs and a WRITE with
    # immediate that find none; receives come back on a later record.
    bad_write = built(RC_WRITE_ONLY, reth(16), bytes(16))
    send = built(RC_SEND_ONLY, payload=b"rnr!" * 4)
    write_imm = built(RC_WRITE_ONLY_IMM, reth(16) + struct.pack(">I", 7), bytes(16))
    reconnect = record(0, b"", arg=HOLD, time=0x80)
    rnr = [record(rc | KEY | 3 << 5, bad_write), reconnect]
    seeds.append(b"".join(rnr + [record(rc, send, arg=HOLD)]))
    seeds.append(
        b"".join(
            rnr
            + [
                record(rc, send, arg=HOLD, time=0x05),
                record(rc, send, arg=HOLD, time=0x0A),
                record(rc | KEY, write_imm, arg=HOLD, time=0x0A),
                record(rc, send, time=0xC0),
                record(rc, send),
            ]
        )
    )
    # A sequence NAK: a SEND five PSNs ahead, then the expected one.
    ahead = built(RC_SEND_ONLY, payload=b"ahead!!!", psn=RQ_PSN + 5)
    seeds.append(record(RESEAL | QP_RC, ahead) + record(rc, send))
    # To the RC requester (its batch holds PSNs 0x200-0x209): RNR NAKs for the READ until the
    # RNR retries (3) run out, the clock jumping to each retry.
    rnr_nak = ack(0x20 | 1)
    seeds.append(b"".join(record(rc, rnr_nak, back=back_for(0x200), time=0x20) for _ in range(6)))
    # NAKs: sequence (at the atomic, 0x204), invalid request, access, operational error.
    for syndrome, psn in ((0x60, 0x204), (0x61, 0x200), (0x62, 0x200), (0x63, 0x200)):
        seeds.append(record(rc, ack(syndrome), back=back_for(psn), time=0x20))
    # The READ and atomics answered at once, then a stall shorter than the ACK timeout, then
    # the timeout.
    read_resp = [
        built(0x0D, bytes([0x1F, 0, 0, 0]), bytes(1024)),
        built(0x0E, b"", bytes(1024)),
        built(0x0E, b"", bytes(1024)),
        built(0x0F, bytes([0x1F, 0, 0, 0]), bytes(1024)),
    ]
    atomic_ack = built(0x12, bytes([0x1F, 0, 0, 0]) + bytes(8))
    answers = [record(rc, p, back=back_for(0x200 + i), time=0x02) for i, p in enumerate(read_resp)]
    answers += [record(rc, atomic_ack, back=back_for(0x204 + i), time=0x02) for i in range(2)]
    for stall in (0x06, 0x08, 0x09):
        seeds.append(b"".join(answers + [record(0, b"", time=stall)] * 6))
    return seeds


def capture_packets():
    for pcap in sorted(TESTDATA.glob("*.pcap")):
        payloads = []
        for frame in records(pcap):
            found = roce(frame)
            if found is not None and len(found[1]) >= 16:
                payloads.append(found[1])
        yield pcap.stem, payloads


def chunks(items, n):
    for i in range(0, len(items), n):
        yield items[i : i + n]


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    seeds = set()

    captures = dict(capture_packets())
    for name, payloads in captures.items():
        requests = [p for p in payloads if not is_response(p[0])]
        for i, chunk in enumerate(chunks(requests, 8)):
            base = [PSN | KEY | RESEAL | qp_bits(p[0]) for p in chunk]
            seeds.add(b"".join(record(s, p) for s, p in zip(base, chunk)))
            if i == 0:
                for key in (1, 2, 3):
                    seeds.add(b"".join(record(s | key << 5, p) for s, p in zip(base, chunk)))
                seeds.add(b"".join(record(s | SRC_STRANGER, p) for s, p in zip(base, chunk)))
                seeds.add(
                    b"".join(record(s, p, arg=4, time=0x0C) for s, p in zip(base, chunk))
                )
                # A gap: the second packet's PSN is one ahead (sequence NAK), then recovery.
                if len(chunk) > 1:
                    recs = [record(base[0], chunk[0]), record(base[1], chunk[1], back=0xFF)]
                    recs += [record(s, p, time=0xA5) for s, p in zip(base[1:], chunk[1:])]
                    seeds.add(b"".join(recs))

    # Answers to the RC requester's batch.
    read_resp = [p for p in captures.get("rc_read_bw_4KB", []) if 0x0D <= p[0] <= 0x10][:4]
    atomic_acks = [p for p in captures.get("rc_atomic_fadd", []) if p[0] == 0x12][:2]
    acks = [p for p in captures.get("rc_send_64B", []) if p[0] == 0x11][:1]
    answer = RESEAL | PSN | QP_RC
    if len(read_resp) == 4 and len(atomic_acks) == 2 and acks:
        recs = [record(answer, p, back=back_for(0x200 + i)) for i, p in enumerate(read_resp)]
        recs.append(record(answer, atomic_acks[0], back=back_for(0x204)))
        recs.append(record(answer, atomic_acks[1], back=back_for(0x205)))
        recs.append(record(answer, acks[0], back=back_for(0x209)))
        seeds.add(b"".join(recs))
        # Again, re-posting the batch after each answer once nothing is outstanding.
        seeds.add(b"".join(r[:3] + bytes([0x40]) + r[4:] for r in recs))
        # Responses out of order, and a timeout in the middle.
        seeds.add(b"".join([recs[1], recs[0], recs[4]]))
        seeds.add(b"".join([recs[0], record(answer, read_resp[1], back=back_for(0x201), time=0x2C)]
                           + recs[2:]))
    rnr_acks = [p for p in captures.get("rc_rnr_nak", []) if p[0] == 0x11]
    for chunk in list(chunks(rnr_acks, 8))[:3]:
        seeds.add(b"".join(record(answer, p, back=8 - i, time=0x20) for i, p in enumerate(chunk)))

    seeds.update(built_seeds())

    # Single packets from the packet corpus.
    if PACKETS.is_dir():
        for path in sorted(PACKETS.iterdir()):
            p = path.read_bytes()[:4096]
            if not p:
                continue
            seeds.add(record(0, p))
            seeds.add(record(PSN | KEY | RESEAL | qp_bits(p[0]), p))

    for blob in seeds:
        (OUT / hashlib.sha1(blob).hexdigest()).write_bytes(blob)
    sizes = sorted(len(b) for b in seeds)
    print(f"{OUT}: {len(seeds)} inputs, largest {sizes[-1]} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
