#!/usr/bin/env bash
# Loopback TCP bandwidth, the physical limit of the TCP rows: one iperf3 stream for
# 3 s under each congestion control a process may pick (the system's default, Reno,
# CUBIC; BBR's pacing gave 2.6 GB/s where Reno gave 7.3 on this machine, see
# BENCHMARKS.md). Prints the best in GB/s and the congestion control it came from:
#
#   7.28 reno
#
# PORT (default 5397) is the port iperf3's server takes on 127.0.0.1.
set -euo pipefail
port=${PORT:-5397}
best=0
from=none
for cc in "$(cat /proc/sys/net/ipv4/tcp_congestion_control)" reno cubic; do
    iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
    server=$!
    sleep 0.5
    if gbs=$(iperf3 -c 127.0.0.1 -p "$port" -t 3 -C "$cc" -J 2>/dev/null |
        python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9))'); then
        if python3 -c "import sys; sys.exit(0 if $gbs > $best else 1)"; then
            best=$gbs
            from=$cc
        fi
    fi
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
done
echo "$best $from"
