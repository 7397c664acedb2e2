#!/usr/bin/env bash
# Point-to-point bandwidth over loopback TCP against iperf3, in alternated rounds, 2
# ranks: each round runs `iperf_best.sh` (one iperf3 stream for 3 s under each
# congestion control, the best), then `hcomm-bench --ops bw,bw_bytes` from MIN to MAX
# bytes (windows of 64 messages, as OSU's osu_bw). `bw` sends slices and receives each
# message of a window into a buffer of its own (64 of them, at most 1 GiB in all, as an
# application's posted receives); `bw_bytes` hands owned buffers over
# (`send_bytes`/`recv_bytes`): the sender's one buffer and the receiver's pooled ones
# are used over and over, as iperf3's and osu_bw's single buffers are. Prints one
# Markdown table: per size, the median GB/s of each, and the median of the per-round
# ratios to the same round's iperf3. On this shared VM speeds move over minutes, so only
# ratios taken in the same round compare.
#
#   bash benches/compare/bw_rounds.sh [ROUNDS] [MIN] [MAX] [HCOMM_BENCH]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
min=${2:-1M}
max=${3:-16M}
hb=${4:-target/release/hcomm-bench}
if ! command -v iperf3 >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null
fi
out=target/compare/bw-rounds
rm -rf $out
mkdir -p $out
for r in $(seq 1 "$rounds"); do
    bash benches/compare/iperf_best.sh >$out/iperf-$r.txt
    "$hb" --transport tcp --ops bw,bw_bytes --min "$min" --max "$max" --no-progress --csv $out/h-$r.csv >/dev/null
done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), kernel $(uname -r); $(date -u +%F)"
python3 - "$out" "$rounds" <<'PY'
import csv, sys, statistics as st
out, rounds = sys.argv[1], int(sys.argv[2])
iperf = [float(open(f"{out}/iperf-{r}.txt").read().split()[0]) for r in range(1, rounds + 1)]
print(f"iperf3 (best congestion control per round), GB/s: {', '.join(f'{x:.2f}' for x in iperf)}; median {st.median(iperf):.2f}")
runs = []
for r in range(1, rounds + 1):
    rows = {}
    with open(f"{out}/h-{r}.csv") as f:
        for row in csv.DictReader(f):
            # Bytes over time per message: the algbw column is GB/s.
            rows[(row["op"], int(row["bytes"]))] = float(row["algbw_gbs"])
    runs.append(rows)
sizes = sorted({b for rows in runs for (_, b) in rows})
print()
print("| bytes | bw GB/s | bw_bytes GB/s | bw / iperf3 | bw_bytes / iperf3 |")
print("|---|---|---|---|---|")
for b in sizes:
    cells = []
    for op in ("bw", "bw_bytes"):
        cells.append(st.median(rows[(op, b)] for rows in runs))
    ratios = [st.median(rows[(op, b)] / iperf[i] for i, rows in enumerate(runs)) for op in ("bw", "bw_bytes")]
    rng = [(min(rows[(op, b)] / iperf[i] for i, rows in enumerate(runs)), max(rows[(op, b)] / iperf[i] for i, rows in enumerate(runs))) for op in ("bw", "bw_bytes")]
    print(f"| {b} | {cells[0]:.2f} | {cells[1]:.2f} | {ratios[0]:.2f} ({rng[0][0]:.2f}-{rng[0][1]:.2f}) | {ratios[1]:.2f} ({rng[1][0]:.2f}-{rng[1][1]:.2f}) |")
PY
