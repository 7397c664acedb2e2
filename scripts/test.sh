#!/usr/bin/env bash
# The test command of the README: the whole cargo test suite (and the `tls` feature's
# tests), then the ring-allreduce
# example launched for real, as 4 processes by `hcomm run` and by OpenMPI's `mpirun`
# (HComm taking its ranks from OMPI's environment).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --all-targets
cargo test --workspace --doc
# The opt-in TLS data path (cargo feature `tls`): its unit tests (no plaintext on the
# wire, another job's key refused) and the suite over encrypted connections.
cargo test -p hcomm-transport --features tls --lib tls::
cargo test -p hcomm --features tls --lib --test tls

cargo build --release --bin hcomm --example ring_allreduce
bin=target/release/hcomm
ex=target/release/examples/ring_allreduce
passed=0
failed=0
# expect NAME PATTERN COMMAND...: runs COMMAND (at most 300 s) and passes if its output,
# lines joined by spaces, matches the extended regex PATTERN.
expect() {
    local name=$1 pattern=$2
    shift 2
    echo "--- launch check: $name"
    if out=$(timeout 300 "$@" 2>&1) && grep -qE "$pattern" <<<"$(tr '\n' ' ' <<<"$out")"; then
        echo "$out" | tail -3
        echo "ok: $name"
        passed=$((passed + 1))
    else
        echo "$out" | tail -20
        echo "FAILED: $name"
        failed=$((failed + 1))
    fi
}
# check NAME COMMAND...: an example run that must report its result verified.
check() {
    expect "$1" "verified:" "${@:2}"
}

check "hcomm run -n 4 (tcp)" "$bin" run -n 4 -- "$ex" --bytes 4M --iters 3
check "hcomm run -n 4 (uring)" "$bin" run -n 4 -- "$ex" --bytes 4M --iters 3 --transport uring
check "hcomm run -n 4 (shm)" "$bin" run -n 4 -- "$ex" --bytes 4M --iters 3 --transport shm
check "ring_allreduce --transport mem" "$ex" --bytes 4M --iters 3 --transport mem
check "hcomm run -n 3, HCOMM_ALGO_ALLREDUCE=rabenseifner" env HCOMM_ALGO_ALLREDUCE=rabenseifner "$bin" run -n 3 -- "$ex" --bytes 1M --iters 3 --algo auto
cargo build --release --example overlap --example algo_sweep --example halo_exchange
# Its ranks call hcomm::init, which measures the cost model first (HCOMM_CALIBRATE).
check "overlap (2 ranks, HCOMM_CALIBRATE=1)" env HCOMM_CALIBRATE=1 target/release/examples/overlap --ranks 2 --iters 1 --buckets 3
check "halo_exchange 2x2 (shm, grid hint)" "$bin" run -n 4 -- target/release/examples/halo_exchange --grid 2x2 --cells 64 --steps 20
if command -v mpirun >/dev/null; then
    # Ranks above 2 oversubscribe this 2-core machine.
    check "mpirun -n 4 (OpenMPI environment)" mpirun --allow-run-as-root --oversubscribe -n 4 "$ex" --bytes 4M --iters 3
else
    echo "--- launch check skipped: mpirun not installed (apt-get install openmpi-bin)"
fi
# The job's topology as rank 0 prints it: every rank in the rack HCOMM_RACK names.
expect "hcomm topo" "3 ranks on 1 hosts in 1 racks rack r1 " env HCOMM_RACK=r1 "$bin" run -n 3 --no-prefix -- "$bin" topo
echo "launch checks: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
