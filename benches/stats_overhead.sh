#!/usr/bin/env bash
# Overhead of HCOMM_STATS: a 1 MiB f32 allreduce (ring), 2 ranks as processes over
# loopback TCP, statistics off and on (level 1) in alternation, RUNS runs each of
# ITERS allreduces; prints each run's median and the median of the runs.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-7}
iters=${ITERS:-200}
cargo build --release --quiet --bin hcomm --example ring_allreduce
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
one() {
    target/release/hcomm run -n 2 -- target/release/examples/ring_allreduce --bytes 1M --iters "$iters" --algo ring |
        grep -o 'time median [0-9.]*' | awk '{print $3}'
}
for i in $(seq "$runs"); do
    off=$(one)
    on=$(HCOMM_STATS=1 HCOMM_STATS_LEVEL=1 HCOMM_STATS_FILE="$tmp/s.%r.json" one)
    echo "run $i: off $off ms, on $on ms"
    echo "$off" >>"$tmp/off"
    echo "$on" >>"$tmp/on"
done
med() { sort -g "$1" | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
off=$(med "$tmp/off")
on=$(med "$tmp/on")
echo "median of $runs runs: off $off ms, on $on ms, on/off $(awk -v a="$on" -v b="$off" 'BEGIN {printf "%.3f", a/b}')"
