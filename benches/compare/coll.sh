#!/usr/bin/env bash
# Every collective hcomm-bench measures (allreduce, broadcast, allgather,
# reduce_scatter, alltoall; float32, sum), HComm beside OpenMPI and MPICH, at 2 and 4
# ranks, in one run, timed the same way (benches/compare/mpi_coll.c copies
# hcomm-bench's method: sizes doubling, 64 MiB worth of iterations between 10 and 1000,
# a tenth as warm-up, a barrier, the mean per operation on each rank, the mean over
# ranks reported).
#
#   bash benches/compare/coll.sh [MAX_BYTES]      (default 16777216)
#
# HComm over tcp, uring and shm (hcomm-bench, ranks as processes); OpenMPI over TCP
# only (`--mca btl self,tcp`) and with its default (shared memory), both with
# `mpi_yield_when_idle 1`; MPICH with its defaults (busy polling, no yield setting
# found; at most 20 iterations per size when oversubscribed). 4 ranks oversubscribe a 2-core
# machine for everyone. Installs OpenMPI and MPICH from Debian's packages if missing
# (both can be installed: their commands are called by their suffixed names). Prints
# Markdown tables, one per rank count and operation, with the ratios HComm / peer
# (time: below 1 is HComm faster).
set -euo pipefail
cd "$(dirname "$0")/../.."
max=${1:-16777216}
ops=allreduce,broadcast,allgather,reduce_scatter,alltoall
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
need=()
command -v mpicc.openmpi >/dev/null || need+=(openmpi-bin libopenmpi-dev)
command -v mpicc.mpich >/dev/null || need+=(mpich libmpich-dev)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
out=target/compare
mkdir -p $out
mpicc.openmpi -O2 -o $out/mpi_coll_ompi benches/compare/mpi_coll.c
mpicc.mpich -O2 -o $out/mpi_coll_mpich benches/compare/mpi_coll.c
cargo build -q --release -p hcomm-bench
hb=target/release/hcomm-bench
for n in 2 4; do
    for t in tcp uring shm; do
        $hb --ranks $n --transport $t --ops $ops --min 8 --max $max --no-progress --csv $out/coll-hcomm-$t-$n.csv >/dev/null
    done
    mpirun.openmpi --oversubscribe -n $n --mca btl self,tcp --mca mpi_yield_when_idle 1 \
        $out/mpi_coll_ompi 8 $max $ops >$out/coll-ompi-tcp-$n.txt
    mpirun.openmpi --oversubscribe -n $n --mca mpi_yield_when_idle 1 $out/mpi_coll_ompi 8 $max $ops >$out/coll-ompi-sm-$n.txt
    # MPICH (ch4:ucx in Debian) busy-polls: oversubscribed, one 8-byte allreduce takes
    # 5-13 ms, so it gets at most 20 iterations per size there.
    cap=1000
    if [ "$n" -gt "$(nproc)" ]; then cap=20; fi
    mpirun.mpich -n $n $out/mpi_coll_mpich 8 $max $ops $cap >$out/coll-mpich-$n.txt
done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), kernel $(uname -r)"
echo "date: $(date -u +%F); $(mpirun.openmpi --version | head -1); MPICH $(mpichversion 2>/dev/null | sed -n 's/MPICH Version:\s*//p')"
echo
python3 - "$out" "$ops" <<'PY'
import csv, sys
out, ops = sys.argv[1], sys.argv[2].split(",")
def hcomm(t, n):
    return {(r["op"], int(r["bytes"])): float(r["avg_us"]) for r in csv.DictReader(open(f"{out}/coll-hcomm-{t}-{n}.csv"))}
def mpi(name, n):
    rows = {}
    for line in open(f"{out}/coll-{name}-{n}.txt"):
        f = line.split()
        if len(f) == 6:
            rows[(f[0], int(f[1]))] = float(f[3])
    return rows
def us(v):
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"
for n in (2, 4):
    h = {t: hcomm(t, n) for t in ("tcp", "uring", "shm")}
    m = {k: mpi(k, n) for k in ("ompi-tcp", "ompi-sm", "mpich")}
    for op in ops:
        print(f"#### {op}, {n} ranks (µs per operation)")
        print()
        print("| bytes | HComm tcp | HComm uring | HComm shm | OpenMPI tcp | OpenMPI sm | MPICH | tcp / OpenMPI tcp | uring / OpenMPI tcp | shm / OpenMPI sm | shm / MPICH |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        sizes = sorted(b for (o, b) in m["ompi-tcp"] if o == op)
        for b in sizes:
            k = (op, b)
            if any(k not in d for d in (*h.values(), *m.values())):
                continue
            ht, hu, hs = h["tcp"][k], h["uring"][k], h["shm"][k]
            mt, ms, mm = m["ompi-tcp"][k], m["ompi-sm"][k], m["mpich"][k]
            print(f"| {b} | {us(ht)} | {us(hu)} | {us(hs)} | {us(mt)} | {us(ms)} | {us(mm)} | "
                  f"{ht / mt:.2f} | {hu / mt:.2f} | {hs / ms:.2f} | {hs / mm:.2f} |")
        print()
PY
