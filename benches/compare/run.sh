#!/usr/bin/env bash
# HComm's ring allreduce beside OpenMPI's allreduce, in one run, same machine, same
# rank counts, same float32 sum, same timing method (median of ITERS after 2 warm-ups,
# rank 0's clock). Also measures the loopback TCP bandwidth (iperf3) as the physical
# limit. Prints a Markdown table.
#
#   bash benches/compare/run.sh [ITERS]
#
# Installs openmpi-bin, libopenmpi-dev and iperf3 from Debian's packages if missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
iters=${1:-20}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ! command -v mpicc >/dev/null || ! command -v iperf3 >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev iperf3 >/dev/null
fi
out=target/compare
mkdir -p $out
mpicc -O2 -o $out/mpi_allreduce benches/compare/mpi_allreduce.c
cargo build -q --release --bin hcomm --example ring_allreduce
hc=target/release/hcomm
ex=target/release/examples/ring_allreduce

read -r bw bw_cc < <(PORT=5399 bash benches/compare/iperf_best.sh)
echo "loopback TCP (iperf3, 1 stream, 3 s, the best of the system's congestion control, Reno and CUBIC): $bw GB/s under $bw_cc"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), kernel $(uname -r)"
echo "date: $(date -u +%F), iterations: $iters (median)"
echo
echo "| ranks | bytes | HComm tcp ms | HComm uring ms | HComm shm ms | OpenMPI tcp ms | OpenMPI default (sm) ms | HComm tcp / OpenMPI tcp | HComm uring / OpenMPI tcp | HComm shm / OpenMPI sm | ring bound at loopback bw ms |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for n in 2 4; do
    for bytes in 8 65536 1048576 16777216; do
        h_tcp=$($hc run -n $n --no-prefix -- $ex --bytes $bytes --iters $iters | sed -n 's/.*time median \([0-9.]*\) ms.*/\1/p')
        h_ur=$($hc run -n $n --no-prefix -- $ex --bytes $bytes --iters $iters --transport uring | sed -n 's/.*time median \([0-9.]*\) ms.*/\1/p')
        h_sm=$($hc run -n $n --no-prefix -- $ex --bytes $bytes --iters $iters --transport shm | sed -n 's/.*time median \([0-9.]*\) ms.*/\1/p')
        m_tcp=$(mpirun --oversubscribe -n $n --mca btl self,tcp --mca mpi_yield_when_idle 1 $out/mpi_allreduce $bytes $iters | sed -n 's/median_ms //p')
        m_sm=$(mpirun --oversubscribe -n $n --mca mpi_yield_when_idle 1 $out/mpi_allreduce $bytes $iters | sed -n 's/median_ms //p')
        python3 - "$n" "$bytes" "$h_tcp" "$h_ur" "$h_sm" "$m_tcp" "$m_sm" "$bw" <<'PY'
import sys
n, b = int(sys.argv[1]), int(sys.argv[2])
ht, hu, hs, mt, ms, bw = map(float, sys.argv[3:])
bound = 2 * (n - 1) / n * b / (bw * 1e9) * 1e3
print(f"| {n} | {b} | {ht:.3f} | {hu:.3f} | {hs:.3f} | {mt:.3f} | {ms:.3f} | {ht/mt:.2f} | {hu/mt:.2f} | {hs/ms:.2f} | {bound:.3f} |")
PY
    done
done
