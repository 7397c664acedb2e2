#!/usr/bin/env bash
# Regenerates BENCHMARKS.md and benches/results/ in one run: HComm (hcomm-bench) and
# OpenMPI (benches/compare/mpi_coll.c, mpi_p2p.c) on this machine, over TCP and
# shared memory, on 2 and 4 ranks, HComm on tokio's multi-thread runtime with the
# current-thread figures beside it, OSU-style timing (each operation timed alone, an
# untimed barrier after it). MPICH (Debian's `mpich`: `mpicc.mpich`, `mpirun.mpich`)
# is measured beside OpenMPI where it is installed, on as many ranks as there are
# cores: oversubscribed, MPICH 4.0's ch4:ucx device polls without yielding and a
# 4-rank run on 2 cores takes minutes (MPIR_CVAR_POLLS_BEFORE_YIELD does not change it).
#
#   bash scripts/benchmarks.sh            # sizes 8 B .. 16 MiB
#   MAX=64M bash scripts/benchmarks.sh
#
# benches/results/ holds only this run's raw files (the history is in git).
set -euo pipefail
cd "$(dirname "$0")/.."
max=${MAX:-16M}
out=benches/results
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ! command -v mpicc >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi
mkdir -p target/compare
mpicc -O2 -o target/compare/mpi_coll benches/compare/mpi_coll.c
mpicc -O2 -o target/compare/mpi_p2p benches/compare/mpi_p2p.c
mpich=
if command -v mpicc.mpich >/dev/null && command -v mpirun.mpich >/dev/null; then
    mpich=1
    mpicc.mpich -O2 -w -o target/compare/mpich_coll benches/compare/mpi_coll.c
    mpicc.mpich -O2 -w -o target/compare/mpich_p2p benches/compare/mpi_p2p.c
fi
cargo build -q --release -p hcomm-bench
bench=target/release/hcomm-bench
bytes=$(python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$max")

rm -rf "$out"
mkdir -p "$out"
{
    echo "date: $(date -u '+%F %H:%M UTC')"
    # The outputs themselves do not count as changes.
    echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet -- . ':!BENCHMARKS.md' ':!benches/results' || echo ' (with uncommitted changes)')"
    echo "cores: $(nproc)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
    echo "kernel: $(uname -r)"
    echo "openmpi: $(mpirun --version 2>/dev/null | head -1)"
    [ -n "$mpich" ] && echo "mpich: MPICH $(mpichversion | sed -n 's/^MPICH Version:[[:space:]]*//p') ($(mpichversion | sed -n 's/^MPICH Device:[[:space:]]*//p'))"
    echo "max: $max"
} >"$out/machine.txt"

for transport in tcp shm; do
    # OpenMPI's own transports for the same paths: TCP alone, or shared memory (vader);
    # MPICH: local peers through UCX's TCP transport, or its own shared memory.
    case $transport in
    tcp) btl="self,tcp" mpich_env=(MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self) ;;
    shm) btl="self,vader" mpich_env=() ;;
    esac
    for n in 2 4; do
        ops=allreduce,broadcast
        [ "$n" = 2 ] && ops=latency,$ops
        for runtime in multi current; do
            echo "--- hcomm $transport, $n ranks, $runtime runtime" >&2
            "$bench" --ranks "$n" --transport "$transport" --ops "$ops" --min 8 --max "$max" \
                --runtime "$runtime" --timing osu --no-progress \
                --json "$out/hcomm-$transport-$n-$runtime.json" >/dev/null
        done
        echo "--- openmpi $transport, $n ranks" >&2
        mpirun --oversubscribe -n "$n" --mca btl "$btl" target/compare/mpi_coll 8 "$bytes" allreduce,broadcast 1000 osu \
            >"$out/openmpi-$transport-$n.txt"
        if [ "$n" = 2 ]; then
            mpirun -n 2 --mca btl "$btl" target/compare/mpi_p2p 8 "$bytes" 1000 >"$out/openmpi-p2p-$transport.txt"
        fi
        if [ -n "$mpich" ] && [ "$n" -le "$(nproc)" ]; then
            echo "--- mpich $transport, $n ranks" >&2
            env "${mpich_env[@]}" mpirun.mpich -n "$n" target/compare/mpich_coll 8 "$bytes" allreduce,broadcast 1000 osu \
                >"$out/mpich-$transport-$n.txt"
            if [ "$n" = 2 ]; then
                env "${mpich_env[@]}" mpirun.mpich -n 2 target/compare/mpich_p2p 8 "$bytes" 1000 >"$out/mpich-p2p-$transport.txt"
            fi
        fi
    done
done
python3 scripts/benchmarks.py "$out" >BENCHMARKS.md
echo "BENCHMARKS.md and $out/ regenerated" >&2
