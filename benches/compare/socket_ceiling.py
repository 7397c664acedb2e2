#!/usr/bin/env python3
"""Loopback TCP bandwidth of a plain socket pair, with the buffer pattern of `bw`.

iperf3 sends and receives one buffer of at most 1 MiB over and over, which stays
in the caches; `hcomm-bench --ops bw` and the MPI `bw` (benches/compare/mpi_p2p.c)
receive each message of a window into a buffer of its own (64 of them), as an
application's posted receives do. This measures the kernel's copy with both
patterns: one process sends blocks of each size for 2 s (`sendall`), the other
receives them (`recv_into`), with 1 buffer on each side and then with 64 rotating
buffers (never more than 1 GiB). Reno, as HComm's connections use by default.

    python3 benches/compare/socket_ceiling.py
"""
import os
import socket
import time


def run(block, nbufs, secs=2.0):
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    port = ls.getsockname()[1]
    pid = os.fork()
    if pid == 0:
        s = socket.socket()
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"reno")
        s.connect(("127.0.0.1", port))
        bufs = [bytearray(os.urandom(1024)) * (block // 1024) for _ in range(nbufs)]
        t0, i = time.time(), 0
        while time.time() - t0 < secs:
            s.sendall(bufs[i % nbufs])
            i += 1
        s.close()
        os._exit(0)
    c, _ = ls.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"reno")
    bufs = [bytearray(block) for _ in range(nbufs)]
    got, t0, i = 0, time.time(), 0
    while True:
        mv, off = memoryview(bufs[i % nbufs]), 0
        while off < block:
            n = c.recv_into(mv[off:])
            if n == 0:
                break
            off += n
        got += off
        i += 1
        if off < block:
            break
    dt = time.time() - t0
    os.waitpid(pid, 0)
    return got / dt / 1e9


print("| buffers | block | GB/s |")
print("|---|---|---|")
for nbufs in (1, 64):
    for block in (128 << 10, 1 << 20, 2 << 20, 4 << 20, 16 << 20):
        if nbufs * block <= 1 << 30:
            print(f"| {nbufs} | {block >> 10} KiB | {run(block, nbufs):.2f} |", flush=True)
