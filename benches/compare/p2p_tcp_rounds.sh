#!/usr/bin/env bash
# Point to point over TCP in interleaved rounds, 2 ranks: each round runs OpenMPI over
# TCP (`--mca btl self,tcp`, benches/compare/mpi_p2p.c, 1000 iterations per size),
# then each given hcomm-bench binary over tcp (`--ops latency,bw`), 8 B to 1 MiB, and
# prints one Markdown table: per size, the median of each over the rounds, the median
# of each binary's per-round ratio to OpenMPI, and (with two binaries) the median
# per-round ratio of the second to the first. `latency` is half a round trip; `bw` is
# the time per message in windows of 64. On this shared VM speeds move over minutes,
# so only ratios taken in the same round compare.
#
#   bash benches/compare/p2p_tcp_rounds.sh HCOMM_BENCH...
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -gt 0 ] || { echo "give at least one hcomm-bench binary" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ! command -v mpicc >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi
out=target/compare/p2p-tcp-rounds
rm -rf $out
mkdir -p $out
mpicc -O2 -o $out/mpi_p2p benches/compare/mpi_p2p.c
for r in 1 2 3; do
    mpirun -n 2 --mca btl self,tcp $out/mpi_p2p 8 1048576 1000 >$out/ompi-$r.txt
    b=0
    for bin in "$@"; do
        b=$((b + 1))
        "$bin" --transport tcp --ops latency,bw --min 8 --max 1M --no-progress --csv $out/h$b-$r.csv >/dev/null
    done
done
python3 - $out $# <<'PY'
import csv, sys, statistics as st
out, nb = sys.argv[1], int(sys.argv[2])
def om(r):
    d = {}
    for l in open(f"{out}/ompi-{r}.txt"):
        f = l.split()
        d[(f[0], int(f[1]))] = float(f[2])
    return d
def hc(b, r):
    return {(x["op"], int(x["bytes"])): float(x["avg_us"]) for x in csv.DictReader(open(f"{out}/h{b}-{r}.csv"))}
O = [om(r) for r in (1, 2, 3)]
H = [[hc(b, r) for r in (1, 2, 3)] for b in range(1, nb + 1)]
hdr = "| op | bytes | OpenMPI tcp µs | " + " | ".join(f"HComm {b} µs | {b} / OpenMPI" for b in range(1, nb + 1)) + " | 2 / 1 |"
print(hdr); print("|" + "---|" * (hdr.count("|") - 1))
for k in sorted(O[0], key=lambda k: (k[0] != "latency", k[1])):
    if any(k not in h for hb in H for h in hb): continue
    row = [k[0], str(k[1]), f"{st.median(o[k] for o in O):.2f}"]
    for hb in H:
        row += [f"{st.median(h[k] for h in hb):.2f}", f"{st.median(h[k] / o[k] for h, o in zip(hb, O)):.2f}"]
    if nb == 2:
        row.append(f"{st.median(b[k] / a[k] for a, b in zip(H[0], H[1])):.2f}")
    print("| " + " | ".join(row) + " |")
PY
