#!/usr/bin/env bash
# Point-to-point latency and bandwidth, 2 ranks (one per core), in one run: HComm over
# shared memory and over TCP (hcomm-bench), OpenMPI with its default path (shared
# memory, vader/sm) and over TCP only (`--mca btl self,tcp`), measured the same way
# (benches/compare/mpi_p2p.c). Prints a Markdown table with the ratios.
#
#   bash benches/compare/p2p.sh [ITERS]
#
# Installs openmpi-bin and libopenmpi-dev from Debian's packages if missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
iters=${1:-1000}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ! command -v mpicc >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
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
    $hb --transport $t --ops latency,bw --min $min --max $max --no-progress --csv $out/p2p-hcomm-$t.csv >/dev/null
done
mpirun -n 2 $out/mpi_p2p $min $max $iters >$out/p2p-ompi-sm.txt
mpirun -n 2 --mca btl self,tcp $out/mpi_p2p $min $max $iters >$out/p2p-ompi-tcp.txt
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), kernel $(uname -r)"
echo "date: $(date -u +%F), 2 ranks, one process each; iterations: OpenMPI $iters per size (a tenth from 1 MiB), HComm 64 MiB worth per size (10 to 1000)"
echo
python3 - "$out" <<'PY'
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
hs, ht, ms, mt = hcomm("shm"), hcomm("tcp"), ompi("sm"), ompi("tcp")
print("| op | bytes | HComm shm | OpenMPI sm | HComm shm / OpenMPI sm | HComm tcp | OpenMPI tcp | HComm tcp / OpenMPI tcp |")
print("|---|---|---|---|---|---|---|---|")
for (op, b) in sorted(ms, key=lambda k: (k[0] != "latency", k[1])):
    if (op, b) not in hs or (op, b) not in ht or (op, b) not in mt:
        continue
    if op == "latency":
        f = lambda v: f"{v[0]:.2f} µs"
        ratio = lambda h, m: f"{h[0] / m[0]:.2f}"
    else:
        f = lambda v: f"{v[1]:.3f} GB/s"
        ratio = lambda h, m: f"{h[1] / m[1]:.2f}"
    print(f"| {op} | {b} | {f(hs[(op, b)])} | {f(ms[(op, b)])} | {ratio(hs[(op, b)], ms[(op, b)])} | "
          f"{f(ht[(op, b)])} | {f(mt[(op, b)])} | {ratio(ht[(op, b)], mt[(op, b)])} |")
print()
print("latency ratios are time (lower is better for HComm); bw ratios are GB/s (higher is better).")
PY
