#!/usr/bin/env bash
# Point-to-point latency and bandwidth, 2 ranks (one per core), in one run: HComm over
# shared memory and over TCP (hcomm-bench), OpenMPI with its default path (shared
# memory, vader/sm) and over TCP only (`--mca btl self,tcp`), measured the same way
# (benches/compare/mpi_p2p.c), and loopback TCP bandwidth (iperf3) as the ceiling of
# the TCP rows. HComm runs twice per transport: with `send`/`recv_into` (slices,
# copied in and out, as MPI's API) and with `send_bytes`/`recv_bytes` (buffers handed
# over, no copy in user space). Shared memory runs twice: as configured by default, and
# with HCOMM_SHM_POLL_US=50 ("shm poll": receives keep reading the ring inside their
# poll). Prints a Markdown table with the ratios.
#
#   bash benches/compare/p2p.sh [ITERS]
#
# Installs openmpi-bin and libopenmpi-dev from Debian's packages if missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
iters=${1:-1000}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ! command -v mpicc >/dev/null || ! command -v iperf3 >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev iperf3 >/dev/null
fi
out=target/compare
mkdir -p $out
mpicc -O2 -o $out/mpi_p2p benches/compare/mpi_p2p.c
cargo build -q --release -p hcomm-bench
hb=target/release/hcomm-bench
min=8
max=4194304
for t in shm tcp; do
    # hcomm-bench's own iteration count: 64 MiB worth per size, 10 to 1000.
    $hb --transport $t --ops latency,bw,latency_bytes,bw_bytes --min $min --max $max --no-progress --csv $out/p2p-hcomm-$t.csv >/dev/null
done
# Shared memory again with receives that keep polling the ring for up to 50 µs inside
# their poll (holding the thread, as a blocking MPI receive does).
HCOMM_SHM_POLL_US=50 $hb --transport shm --ops latency,bw,latency_bytes,bw_bytes --min $min --max $max --no-progress --csv $out/p2p-hcomm-shmpoll.csv >/dev/null
mpirun -n 2 $out/mpi_p2p $min $max $iters >$out/p2p-ompi-sm.txt
mpirun -n 2 --mca btl self,tcp $out/mpi_p2p $min $max $iters >$out/p2p-ompi-tcp.txt
read -r iperf iperf_cc < <(PORT=5398 bash benches/compare/iperf_best.sh)
echo "loopback TCP (iperf3, 1 stream, 3 s, the best of the system's congestion control, Reno and CUBIC): $iperf GB/s under $iperf_cc"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), kernel $(uname -r)"
echo "date: $(date -u +%F), 2 ranks, one process each; iterations: OpenMPI $iters per size (a tenth from 1 MiB), HComm 64 MiB worth per size (10 to 1000)"
echo
python3 - "$out" "$iperf" <<'PY'
import csv, sys
out = sys.argv[1]
def hcomm(t):
    rows = {}
    for r in csv.DictReader(open(f"{out}/p2p-hcomm-{t}.csv")):
        rows[(r["op"], int(r["bytes"]))] = (float(r["avg_us"]), float(r["algbw_gbs"]))
    return rows
def ompi(t):
    rows = {}
    for line in open(f"{out}/p2p-ompi-{t}.txt"):
        f = line.split()
        if f[0] == "latency":
            rows[("latency", int(f[1]))] = (float(f[2]), int(f[1]) / float(f[2]) / 1e3)
        elif f[0] == "bw":
            rows[("bw", int(f[1]))] = (float(f[2]), float(f[3]))
    return rows
iperf = float(sys.argv[2])
h, m = {t: hcomm(t) for t in ("shm", "shmpoll", "tcp")}, {t: ompi(t) for t in ("sm", "tcp")}
print("| op | bytes | OpenMPI sm | HComm shm | ratio | HComm shm bytes | ratio | HComm shm poll | ratio | HComm shm poll bytes | ratio | OpenMPI tcp | HComm tcp | ratio | HComm tcp bytes | ratio | HComm tcp bytes / iperf3 |")
print("|" + "---|" * 17)
for (op, b) in sorted(m["sm"], key=lambda k: (k[0] != "latency", k[1])):
    ob = op + "_bytes"
    if any(k not in h[t] for t in h for k in ((op, b), (ob, b))) or (op, b) not in m["tcp"]:
        continue
    if op == "latency":
        f = lambda v: f"{v[0]:.2f} µs"
        ratio = lambda x, y: f"{x[0] / y[0]:.2f}"
        ceiling = ""
    else:
        f = lambda v: f"{v[1]:.3f} GB/s"
        ratio = lambda x, y: f"{x[1] / y[1]:.2f}"
        ceiling = f"{h['tcp'][(ob, b)][1] / iperf:.2f}"
    cells = [op, str(b)]
    for mpi, t in (("sm", "shm"), ("sm", "shmpoll"), ("tcp", "tcp")):
        base = m[mpi][(op, b)]
        if t != "shmpoll":
            cells.append(f(base))
        cells += [f(h[t][(op, b)]), ratio(h[t][(op, b)], base), f(h[t][(ob, b)]), ratio(h[t][(ob, b)], base)]
    cells.append(ceiling)
    print("| " + " | ".join(cells) + " |")
print()
print(f"ratios are HComm / OpenMPI: time for latency (lower is better for HComm), GB/s for bw (higher is better); the last column is HComm tcp bytes against iperf3's {iperf:.3f} GB/s.")
PY
