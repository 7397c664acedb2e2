#!/usr/bin/env bash
# Collectives over TCP in interleaved rounds, 2 ranks (or RANKS, as processes that
# oversubscribe the cores above 2): each round runs OpenMPI over
# TCP (`--mca btl self,tcp --mca mpi_yield_when_idle 1`, benches/compare/mpi_coll.c),
# then each given hcomm-bench binary over tcp, over the same sizes, and prints one
# Markdown table (after the floor of one small message, `msg_ceiling.c`): per size, the median time of each, the median of each binary's
# per-round ratio to OpenMPI, and (with two binaries) the median per-round ratio of the
# second to the first. For allreduce and broadcast each round also runs the floor
# (benches/compare/floor_coll.c): the plainest C ring allreduce and chain broadcast over
# the same loopback TCP, and those operations' bytes alone; the table gives both as
# ratios to OpenMPI's time. On this shared VM speeds move over minutes, so only ratios
# taken in the same round compare.
#
#   bash benches/compare/coll_rounds.sh ROUNDS OPS MIN_BYTES MAX_BYTES HCOMM_BENCH...
#
# Example, an old and a new build side by side:
#   bash benches/compare/coll_rounds.sh 5 broadcast,allreduce 8 16777216 old/hcomm-bench target/release/hcomm-bench
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=${RANKS:-2}
rounds=${1:?rounds}
ops=${2:?operations}
min=${3:?smallest size}
max=${4:?largest size}
shift 4
[ $# -gt 0 ] || { echo "give at least one hcomm-bench binary" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ! command -v mpicc >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi
out=target/compare/coll-rounds
rm -rf $out
mkdir -p $out
mpicc -O2 -o target/compare/mpi_coll benches/compare/mpi_coll.c
# The floor: the same operations by the plainest C over the same sockets, and their
# bytes alone (benches/compare/floor_coll.c), for allreduce and broadcast.
cc -O3 -march=native -o target/compare/floor_coll benches/compare/floor_coll.c
floor_ops=$(tr ',' '\n' <<<"$ops" | grep -xE 'allreduce|broadcast' | sed 'p;s/$/_bytes/' | paste -sd, || true)
for r in $(seq 1 "$rounds"); do
    mpirun --oversubscribe -n "$ranks" --mca btl self,tcp --mca mpi_yield_when_idle 1 target/compare/mpi_coll "$min" "$max" "$ops" >$out/ompi-$r.txt
    if [ -n "$floor_ops" ]; then
        target/compare/floor_coll "$ranks" "$min" "$max" "$floor_ops" >$out/floor-$r.txt
    else
        : >$out/floor-$r.txt
    fi
    b=0
    for bin in "$@"; do
        b=$((b + 1))
        "$bin" --ranks "$ranks" --transport tcp --ops "$ops" --min "$min" --max "$max" --no-progress 2>&1 | grep -v '^#' >$out/hcomm$b-$r.txt
    done
done
# The floor of small messages: one writev per message, back to back, to a reader that
# polls (as the peers' leaves do) and to one that sleeps (benches/compare/msg_ceiling.c).
cc -O2 -o target/compare/msg_ceiling benches/compare/msg_ceiling.c
target/compare/msg_ceiling 8 300000 80 polls,sleeps | sed 's/^/floor of one writev per message, /'
echo "ranks: $ranks (processes); TCP congestion control: $(cat /proc/sys/net/ipv4/tcp_congestion_control) (system default)"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), kernel $(uname -r); $(date -u +%F)"
python3 - "$out" "$rounds" "$#" <<'PY'
import sys, statistics as st
out, rounds, nbin = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(path):
    # op bytes iters avg ...: the average time per operation, in µs, is the 4th column.
    rows = {}
    for line in open(path):
        f = line.split()
        if len(f) > 3:
            try:
                rows[(f[0], int(f[1]))] = float(f[3])
            except ValueError:
                pass
    return rows
runs = [[load(f"{out}/ompi-{r}.txt")] + [load(f"{out}/hcomm{b}-{r}.txt") for b in range(1, nbin + 1)]
        for r in range(1, rounds + 1)]
floors = [load(f"{out}/floor-{r}.txt") for r in range(1, rounds + 1)]
keys = sorted({k for run in runs for k in run[0] if all(k in t for t in run)})
has_floor = any(floors)
head = ["op", "bytes", "OpenMPI tcp µs"] + [f"HComm {b} µs" for b in range(1, nbin + 1)]
head += [f"HComm {b} / OpenMPI" for b in range(1, nbin + 1)]
if nbin == 2:
    head.append("2 / 1")
if has_floor:
    head += ["plain C / OpenMPI", "bytes alone / OpenMPI"]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
def floor_ratio(key, floor_key):
    """Median over the rounds of the floor's `floor_key` time over OpenMPI's `key` time."""
    rs = [f[floor_key] / run[0][key] for f, run in zip(floors, runs) if floor_key in f]
    return "%.2f" % st.median(rs) if len(rs) == len(runs) else "-"
for k in keys:
    cells = [k[0], str(k[1])]
    cells += ["%.1f" % st.median(run[i][k] for run in runs) for i in range(nbin + 1)]
    cells += ["%.2f" % st.median(run[i][k] / run[0][k] for run in runs) for i in range(1, nbin + 1)]
    if nbin == 2:
        cells.append("%.2f" % st.median(run[2][k] / run[1][k] for run in runs))
    if has_floor:
        cells += [floor_ratio(k, k), floor_ratio(k, (k[0] + "_bytes", k[1]))]
    print("| " + " | ".join(cells) + " |")
if has_floor:
    print()
    print("plain C: benches/compare/floor_coll.c, the ring allreduce and the chain broadcast with no library;")
    print("bytes alone: the same operation's bytes, each rank's sent and received in one stream, no steps, no reduction.")
PY
