#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target into tests/fuzz/corpus/<target>/.

Seeds are small valid and near-valid inputs in each target's input format
(see the comment at the top of fuzz_<target>.cc). The layouts below mirror
src/core/wire.{h,cc}, transport/tcp/connection.h, transport/shm/inbox.h and
transport/shm/endpoint.cc
(little-endian, natural alignment). Run again after changing a format:
    python3 tests/fuzz/make_corpus.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

# The fixed identities the targets check against.
SECRET = (0x0123456789ABCDEF, 0xFEDCBA9876543210)
COMM_HASH = 0x5EED5EED5EED5EED
HELLO_MAGIC, REPLY_MAGIC, ID_MAGIC, FRAME_MAGIC = 0x6C6C6548, 0x6C706552, 0x4D4F4F4C, 0x4D4F4F4C
KIND_JOIN, KIND_RING, KIND_DATA, KIND_NOTICE = 1, 2, 3, 4


def addr_v4(a, port):
    return bytes([4, 0]) + struct.pack(">H", port) + bytes(a) + bytes(20)


def addr_v6(a16, port, scope=0, flow=0):
    return bytes([6, 0]) + struct.pack(">H", port) + bytes(a16) + struct.pack("<I", scope) + struct.pack(">I", flow)


def hello(kind, from_rank, to_rank, channel=0, index=0, count=0, payload=0, secret=SECRET, comm=COMM_HASH,
          magic=HELLO_MAGIC):
    return struct.pack("<IIQQQIIIIII", magic, kind, secret[0], secret[1], comm, from_rank, to_rank, channel, index,
                       count, payload)


def pci_path(ids):
    return struct.pack("<I", len(ids)) + b"".join(struct.pack("<I", len(i)) + i for i in ids)


# wire::kRankInfoVersion; tests/unit/core/wire_test.cc checks that the
# rank_info seed below still decodes.
RANK_INFO_VERSION = 7


def rank_info(addr, pid, host, host_hash=0x1234, mode=0, cuda=0xFFFFFFFF, uuid=b"", version=RANK_INFO_VERSION,
              numa=0, path=(), nics=(), transports=0, flags=0, cpu_mask=(0x3,), channels=1):
    # nics: (name, speed Mbit/s, numa, pci path) tuples
    topo = struct.pack("<I", numa & 0xFFFFFFFF) + pci_path(path) + struct.pack("<I", len(nics)) + b"".join(
        struct.pack("<I", len(n)) + n + struct.pack("<QI", speed, nn & 0xFFFFFFFF) + pci_path(p)
        for n, speed, nn, p in nics)
    tail = struct.pack("<III", transports, flags, len(cpu_mask)) + b"".join(struct.pack("<Q", w) for w in cpu_mask)
    return (struct.pack("<I", version) + addr + struct.pack("<IQIII", pid, host_hash, mode, cuda, len(uuid)) + uuid +
            topo + struct.pack("<I", len(host)) + host + tail + struct.pack("<I", channels))


def table(*blobs):
    return b"".join(struct.pack("<I", len(b)) + b for b in blobs)


def shm_endpoint(nonce=77, inbox_bytes=1 << 20, pid=4242, memfd=5, wake_fd=6, layout=2, version=1,
                 magic=0x637344686D536F4C):
    return struct.pack("<IQQQiiiI", version, magic, nonce, inbox_bytes, pid, memfd, wake_fd, layout)


def cudaipc_endpoint(nonce=99, address=0x7F0000000000, slot_bytes=512 << 10, slots=8, version=1):
    control = shm_endpoint()
    return (struct.pack("<IQQ", version, nonce, address) + bytes(range(64)) +
            struct.pack("<QII", slot_bytes, slots, len(control)) + control)


def ib_endpoint(qpns=(0x11, 0x12), psn=0x123456, lid=0, mtu=3, ethernet=1, address=0x7F0000001000, rkey=0x55,
                slots=8, stride=131072, device=b"rxe0:1", version=1):
    return (struct.pack("<II", version, len(qpns)) + b"".join(struct.pack("<I", q) for q in qpns) +
            struct.pack("<IH", psn, lid) + bytes([0xfe, 0x80] + [0] * 14) + struct.pack("<BBQIII", mtu, ethernet,
            address, rkey, slots, stride) + struct.pack("<I", len(device)) + device)


def reply(status, length, magic=REPLY_MAGIC):
    return struct.pack("<IIII", magic, status, length, 0)


def seeds_hello():
    info = rank_info(addr_v4([127, 0, 0, 1], 40000), 4242, b"node-a")
    info2 = rank_info(addr_v6([0] * 15 + [1], 40001), 4243, b"node-b")
    notice = b"rank 0 (host a, pid 1) failed: AllReduce #3 timed out"
    return {
        "data_hello": bytes([3]) + hello(KIND_DATA, 0, 1, channel=0, index=1, count=2),
        "ring_hello": bytes([3]) + hello(KIND_RING, 0, 1, count=1),
        "abort_notice": bytes([3]) + hello(KIND_NOTICE, 3, 1, payload=len(notice)) + notice,
        "wrong_secret": bytes([3]) + hello(KIND_DATA, 0, 1, count=1, secret=(1, 2)),
        "oversized_payload": bytes([3]) + hello(KIND_NOTICE, 2, 1, payload=5000) + b"x" * 16,
        "join_sent_to_rank": bytes([3]) + hello(KIND_JOIN, 0, 1, payload=len(info)) + info,
        "reply_table": bytes([1]) + reply(0, len(table(info, info2))) + table(info, info2),
        "reply_failure": bytes([0]) + reply(1, 28) + b"rank 3 joined twice (pids 1)",
        "reply_oversized": bytes([7]) + reply(2, 100000) + b"init failed",
        "reply_short_table": bytes([4]) + reply(0, len(table(info))) + table(info),
    }


def seeds_root_join():
    def join(rank, nranks, host=b"host", payload=None, secret=SECRET, kind=KIND_JOIN, version=RANK_INFO_VERSION):
        info = rank_info(addr_v4([10, 0, 0, rank & 255], 29500 + (rank & 1023)), 1000 + rank, host, version=version)
        return hello(kind, rank, nranks, payload=len(info) if payload is None else payload, secret=secret,
                     comm=0) + info
    return {
        "one_rank": bytes([0]) + join(0, 1),
        "four_ranks": bytes([0]) + join(2, 4) + join(0, 4) + join(3, 4) + join(1, 4),
        "nranks_differ": bytes([4]) + join(1, 4) + join(2, 8),
        "same_rank_twice": bytes([2]) + join(1, 2) + join(1, 2),
        "long_host": bytes([0]) + join(0, 2, host=b"A" * 255),
        "too_long_host": bytes([0]) + join(0, 2, host=b"A" * 256),
        "other_version": bytes([0]) + join(0, 2, version=2),
        "bad_payload": bytes([0]) + join(0, 2, payload=7),
        "rank_out_of_range": bytes([0]) + join(5, 5),
        "wrong_secret": bytes([0]) + join(0, 2, secret=(SECRET[0], 0)),
        "max_ranks": bytes([0]) + join((1 << 20) - 1, 1 << 20),
    }


def seeds_endpoints():
    info = rank_info(addr_v4([127, 0, 0, 1], 40000), 4242, b"node-a")
    info2 = rank_info(addr_v6([0] * 15 + [1], 40001), 4243, b"node-b", mode=1, cuda=0,
                      uuid=b"0123456789abcdef0123456789abcdef", numa=1,
                      path=(b"0000:15:00.0", b"0000:18:00.0"),
                      nics=((b"mlx5_0", 400000, 1, (b"0000:15:00.0", b"0000:1a:00.0")), (b"eth0", 25000, -1, ())))
    return {
        "shm": bytes([0]) + shm_endpoint(),
        "shm_other_version": bytes([0]) + shm_endpoint(version=2),
        "shm_short": bytes([0]) + shm_endpoint()[:20],
        "rank_info": bytes([1]) + info,
        "rank_info_trailing": bytes([1]) + info + b"\0",
        "rank_info_empty_host": bytes([1]) + rank_info(addr_v4([10, 1, 2, 3], 1), 1, b""),
        "table_two": bytes([2, 1]) + table(info, info2),
        "rank_info_topology": bytes([1]) + info2,
        "table_one_of_three": bytes([2, 2]) + table(info),
        "cudaipc": bytes([3]) + cudaipc_endpoint(),
        "cudaipc_truncated": bytes([3]) + cudaipc_endpoint()[:-4],
        # mode 4: the expected slot stride (u32), then a verbs endpoint
        "ib": bytes([4]) + struct.pack("<I", 131072) + ib_endpoint(),
        "ib_one_qp_infiniband": bytes([4]) + struct.pack("<I", 131072) + ib_endpoint(qpns=(7,), lid=3, ethernet=0),
        "ib_other_stride": bytes([4]) + struct.pack("<I", 65536) + ib_endpoint(),
        "ib_bad_psn": bytes([4]) + struct.pack("<I", 131072) + ib_endpoint(psn=1 << 24),
    }


def seeds_comm_id():
    def unique_id(addr, secret=(0xA, 0xB), version=1, magic=ID_MAGIC):
        body = struct.pack("<IIQQ", magic, version, secret[0], secret[1]) + addr + bytes(4) + struct.pack("<Q", 77)
        return body + bytes(128 - len(body))
    text = {
        "text_v4": b"127.0.0.1:29500",
        "text_v6": b"[::1]:1234",
        "text_v6_scope": b"[fe80::1%1]:80",
        "text_v4_mapped": b"[::ffff:10.1.2.3]:65535",
        "text_name": b"localhost:80",
        "text_bad_port": b"10.0.0.1:99999",
        "text_no_host": b":80",
        "text_v6_unbracketed": b"::1:80",
    }
    out = {k: bytes([0]) + v for k, v in text.items()}
    out.update({
        "addr_v4": bytes([1]) + addr_v4([192, 168, 1, 2], 8080),
        "addr_v6": bytes([1]) + addr_v6([0xFE, 0x80] + [0] * 13 + [1], 443, scope=2, flow=0x12345),
        "addr_empty": bytes([1]) + bytes(28),
        "addr_bad_tag": bytes([1]) + bytes([5, 0]) + bytes(26),
        "id_v4": bytes([2]) + unique_id(addr_v4([127, 0, 0, 1], 29500)),
        "id_v6": bytes([2]) + unique_id(addr_v6([0] * 15 + [1], 29501)),
        "id_port_zero": bytes([2]) + unique_id(addr_v4([127, 0, 0, 1], 0)),
        "id_bad_version": bytes([2]) + unique_id(addr_v4([127, 0, 0, 1], 1), version=2),
    })
    return out


def seeds_settings():
    return {
        "conf_only": b"# loom\nNCCL_DEBUG=INFO\n  LOOM_SOCKETS_PER_PEER = 4  \nNCCL_SHM_DISABLE=yes\n",
        "env_only": b"\0NCCL_SOCKET_IFNAME=^docker,lo\nLOOM_TIMEOUT_S=0x10\nNCCL_COMM_BLOCKING=0\n",
        "env_over_conf": b"LOOM_INIT_TIMEOUT_S=10\nNCCL_COMM_ID=1.2.3.4:5\0LOOM_INIT_TIMEOUT_S=20\n",
        "bad_numbers": b"NCCL_BUFFSIZE=12abc\nLOOM_CHUNK_BYTES=99999999999999999999999\n\0"
                       b"NCCL_SHM_DISABLE=maybe\nLOOM_SHM_FIFO_BYTES=-1\n",
        "odd_lines": b"=novalue\nNOEQUALS\n\r\n\t# x=y\nLOOM_DEVICE==host\nLOOM_CPU_ISA=\n",
    }


def frame(seq, total, piece):
    return struct.pack("<IIQQ", FRAME_MAGIC, seq, total, piece)


def chunk(sock, data):
    return bytes([sock]) + struct.pack("<H", len(data)) + data


def fill(sock, n, byte):
    return bytes([0x80 | sock]) + struct.pack("<H", n) + bytes([byte])


def tcp_input(sockets, close, stripe_sel, sizes, chunks):
    flags = (sockets - 1) | (close << 2) | (stripe_sel << 5)
    head = bytes([flags, len(sizes) - 1]) + b"".join(struct.pack("<H", s) for s in sizes)
    return head + b"".join(chunks)


def plan(seq, nbytes, sockets, stripe_min):
    """Mirrors transport/tcp/connection.cc planMessage."""
    if sockets == 1 or nbytes == 0 or nbytes < stripe_min:
        return [(seq % sockets, 0, nbytes)]
    piece = -(-(-(-nbytes // sockets)) // 4096) * 4096
    out = []
    for i in range(sockets):
        off = i * piece
        if off >= nbytes:
            break
        out.append(((seq % sockets + i) % sockets, off, min(piece, nbytes - off)))
    return out


def seeds_tcp_frames():
    msg = bytes(range(100))
    striped = []
    for sock, off, length in plan(0, 10000, 2, 64):
        striped.append(chunk(sock, frame(0, 10000, length)))
        striped.append(fill(sock, length, 0x33))
    return {
        "one_message": tcp_input(1, 0, 0, [100], [chunk(0, frame(0, 100, 100) + msg)]),
        "three_messages": tcp_input(1, 0, 3, [0, 10, 5000], [
            chunk(0, frame(0, 0, 0) + frame(1, 10, 10) + b"0123456789" + frame(2, 5000, 5000)),
            fill(0, 5000, 0x41)]),
        "split_header": tcp_input(1, 0, 0, [8], [
            chunk(0, frame(0, 8, 8)[:5]), chunk(0, frame(0, 8, 8)[5:] + b"abcd"), chunk(0, b"efgh")]),
        "striped_two_sockets": tcp_input(2, 0, 1, [10000], striped),
        "eof_mid_message": tcp_input(1, 1, 0, [64], [chunk(0, frame(0, 64, 64) + b"x" * 20)]),
        "reset_mid_message": tcp_input(1, 2, 0, [64], [chunk(0, frame(0, 64, 64) + b"y" * 30)]),
        "bad_magic": tcp_input(1, 0, 0, [4], [chunk(0, struct.pack("<IIQQ", 0xDEADBEEF, 0, 4, 4) + b"abcd")]),
        "wrong_seq": tcp_input(1, 0, 0, [4], [chunk(0, frame(1, 4, 4) + b"abcd")]),
        "wrong_size": tcp_input(1, 0, 0, [4], [chunk(0, frame(0, 40, 40) + b"abcd" * 10)]),
        "three_sockets": tcp_input(3, 0, 3, [16, 16, 16], [
            chunk(0, frame(0, 16, 16) + b"a" * 16), chunk(2, frame(2, 16, 16) + b"c" * 16),
            chunk(1, frame(1, 16, 16) + b"b" * 16)]),
    }


# shm_inbox operations (enum Op in fuzz_shm_inbox.cc).
(TAIL_REL, TAIL_ABS, DESC, SLOT_DATA, OWN_HDR, PEER_HDR, PEER_HEAD, PEER_FLAG, RECV, SEND, PEER_SEND, PROGRESS,
 PEER_PROGRESS) = range(13)
COPY, PULL, INLINE = 1, 2, 3


def slot_desc(seq, total, offset, piece, kind, addr=0, inline=b""):
    return struct.pack("<QQQQII", seq, total, offset, addr, piece, kind) + inline + bytes(24 - len(inline))


def op(code, *parts):
    return bytes([code]) + b"".join(parts)


def u8(v):
    return bytes([v])


def u16(v):
    return struct.pack("<H", v & 0xFFFF)


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def seeds_shm_inbox():
    return {
        "peer_sends_small": u8(0) + op(PEER_SEND, u32(100)) + op(RECV, u8(0), u32(100)) + op(PROGRESS),
        "peer_sends_multi_slot": u8(0) + op(RECV, u8(1), u32(10000)) + op(PEER_SEND, u32(10000)) + op(PROGRESS)
                                 + op(PEER_PROGRESS) + op(PROGRESS) + op(PEER_PROGRESS) + op(PROGRESS),
        "hostile_inline": u8(0) + op(DESC, u8(0), slot_desc(0, 5, 0, 5, INLINE, inline=b"hello"))
                          + op(TAIL_REL, u16(1)) + op(RECV, u8(0), u32(5)) + op(PROGRESS),
        "hostile_copy": u8(0) + op(SLOT_DATA, u8(0), u16(0), u8(100), b"z" * 100)
                        + op(DESC, u8(0), slot_desc(0, 100, 0, 100, COPY)) + op(TAIL_REL, u16(1))
                        + op(RECV, u8(1), u32(100)) + op(PROGRESS),
        "huge_tail": u8(0) + op(TAIL_ABS, u64(1 << 50)) + op(RECV, u8(0), u32(10)) + op(PROGRESS),
        "huge_piece": u8(0) + op(DESC, u8(0), slot_desc(0, 8192, 0, 0xFFFFFFFF, COPY)) + op(TAIL_REL, u16(1))
                      + op(RECV, u8(0), u32(8192)) + op(PROGRESS),
        "pull_bad_address": u8(1) + op(DESC, u8(0), slot_desc(0, 4096, 0, 0, PULL, addr=0x1000))
                            + op(TAIL_REL, u16(1)) + op(RECV, u8(0), u32(4096)) + op(PROGRESS),
        "pull_refused": u8(0) + op(DESC, u8(0), slot_desc(0, 64, 0, 0, PULL, addr=0x1000))
                        + op(TAIL_REL, u16(1)) + op(RECV, u8(0), u32(64)) + op(PROGRESS),
        "single_copy_pair": u8(3) + op(PEER_SEND, u32(70000)) + op(RECV, u8(0), u32(70000)) + op(PROGRESS)
                            + op(PEER_PROGRESS) + op(PROGRESS),
        "send_bad_head": u8(0) + op(SEND, u32(100)) + op(PROGRESS) + op(PEER_HEAD, u16(5)) + op(SEND, u32(50000))
                         + op(PROGRESS),
        "peer_closed": u8(0) + op(PEER_FLAG, u8(0), u32(1)) + op(RECV, u8(0), u32(10)) + op(PROGRESS),
        "scribble_headers": u8(0) + op(OWN_HDR, u16(320), u8(8), u64(3)) + op(PEER_HDR, u16(128), u8(4), u32(1))
                            + op(RECV, u8(0), u32(10)) + op(PROGRESS),
        # Descriptor fuzzing: [which] [fields] [scribbles].
        "desc_fds_swapped": u8(4) + u8(0x01 | (0 << 2)) + u8(0) + op(PROGRESS),
        "desc_own_inbox": u8(4) + u8(0x02 | (3 << 2)) + u8(0),
        "desc_bad_magic": u8(4) + u8(0x10 | (1 << 2)) + u64(1) + u8(0),
        "desc_scribbled_header": u8(4) + u8(1 << 2) + u8(1) + u8(24) + u8(8) + u64(1 << 40),
    }


def seeds_topology_xml():
    fixtures = os.path.join(os.path.dirname(CORPUS), "..", "topology", "fixtures")
    seeds = {}
    for name in sorted(os.listdir(fixtures)):
        with open(os.path.join(fixtures, name), "rb") as f:
            seeds[name] = f.read()
    seeds["entities.xml"] = b'<system version="1"><cpu numaid="0" vendor="a&amp;b&#65;&#x42;">' \
        b'<pci busid="1:0.0" class="0x020000"/></cpu></system>'
    seeds["comment-cdata.xml"] = b'<?xml version="1.0"?><!DOCTYPE x><system><!-- c --><cpu numaid="3">' \
        b'<![CDATA[ text ]]><nic><net name="e" speed="1000"/></nic></cpu></system>'
    return seeds


def main():
    targets = {
        "topology_xml": seeds_topology_xml(),
        "hello": seeds_hello(), "root_join": seeds_root_join(), "comm_id": seeds_comm_id(),
        "settings": seeds_settings(), "tcp_frames": seeds_tcp_frames(), "shm_inbox": seeds_shm_inbox(),
        "endpoints": seeds_endpoints(),
    }
    for target, seeds in targets.items():
        # Inputs a fuzzer added (files named by their SHA-1) stay.
        folder = os.path.join(CORPUS, target)
        os.makedirs(folder, exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        print(f"{target}: {len(seeds)} seeds, {sum(len(d) for d in seeds.values())} bytes")


if __name__ == "__main__":
    main()
