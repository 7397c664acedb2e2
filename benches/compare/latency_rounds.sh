#!/usr/bin/env bash
# Small-message latency in interleaved rounds: each round runs OpenMPI's default path
# (shared memory) once, then each given hcomm-bench binary over shared memory (8 B by
# default), then OpenMPI again, and reports per binary the median latency and the
# median of its per-round ratios to OpenMPI's mean in that round. On this shared VM
# the cross-core latency moves by a factor of two or three over minutes (the host
# places the two virtual CPUs differently), so only ratios taken in the same minutes
# compare; a sweep that runs OpenMPI once and HComm minutes later does not.
#
#   bash benches/compare/latency_rounds.sh ROUNDS ITERS BYTES HCOMM_BENCH...
#
# HCOMM_SHM_POLL_US is passed through (unset: the default, no polling receive).
# Example, an old and a new build side by side:
#   HCOMM_SHM_POLL_US=50 bash benches/compare/latency_rounds.sh 10 30000 8 old/hcomm-bench target/release/hcomm-bench
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:?rounds}
iters=${2:?iterations}
bytes=${3:?bytes}
shift 3
[ $# -gt 0 ] || { echo "give at least one hcomm-bench binary" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ! command -v mpicc >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi
out=target/compare
mkdir -p $out
mpicc -O2 -o $out/mpi_p2p benches/compare/mpi_p2p.c
log=$out/latency-rounds.txt
: >$log
ompi() {
    mpirun --allow-run-as-root -n 2 $out/mpi_p2p "$bytes" "$bytes" "$iters" | awk -v r="$1" '/^latency/{print r, "OpenMPI", $3}' >>$log
}
for r in $(seq "$rounds"); do
    ompi "$r"
    for b in "$@"; do
        "$b" --transport shm --ops latency --min "$bytes" --max "$bytes" --iters "$iters" --no-progress 2>&1 |
            awk -v r="$r" -v b="$b" '/^ +latency /{print r, b, $4}' >>$log
    done
    ompi "$r"
done
echo "date: $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), kernel $(uname -r)"
echo "$rounds rounds of $iters ping-pongs of $bytes B; HCOMM_SHM_POLL_US=${HCOMM_SHM_POLL_US:-unset}"
python3 - "$log" <<'PY'
import collections, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
base = collections.defaultdict(list)
for r, b, v in rows:
    if b == "OpenMPI":
        base[r].append(float(v))
vals, ratios = collections.defaultdict(list), collections.defaultdict(list)
for r, b, v in rows:
    vals[b].append(float(v))
    if b != "OpenMPI":
        ratios[b].append(float(v) / statistics.mean(base[r]))
for b, v in vals.items():
    line = f"{b}: median {statistics.median(v):.3f} us (min {min(v):.3f}, max {max(v):.3f})"
    if b in ratios:
        q = ratios[b]
        line += f"; / OpenMPI in the same round: median {statistics.median(q):.2f} (min {min(q):.2f}, max {max(q):.2f})"
    print(line)
PY
