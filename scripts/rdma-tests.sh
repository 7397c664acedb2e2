#!/usr/bin/env bash
# The RDMA transport's tests (cargo feature `rdma`) on a real soft-RoCE device: this
# machine has no RDMA device and its kernel no InfiniBand support, so the tests are
# built here and run in the throw-away QEMU guest of ../shared/rdma-vm (rdma_rxe on a
# dummy netdev; one boot runs every test binary). Needs libibverbs-dev,
# librdmacm-dev and libclang-dev to build (.ci/run installs them).
#
# Also checks that the default build pulls in nothing of async-rdma (GPL-3.0).
set -euo pipefail
cd "$(dirname "$0")/.."

if cargo tree -e normal -p hcomm -p hcomm-bench | grep -qE 'async-rdma|rdma-sys'; then
    echo "FAILED: the default build depends on async-rdma" >&2
    exit 1
fi
echo "ok: the default build has no async-rdma in its dependency tree"

vm=${RXE_VM:-../shared/rdma-vm/run-in-rxe-vm.sh}
cargo test -p hcomm --features rdma --test rdma --no-run
# The test binary's path, from cargo's JSON messages.
bin=$(cargo test -p hcomm --features rdma --test rdma --no-run --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*rdma-[^"]*"' | tail -1 | cut -d'"' -f4)
[[ -x $bin ]] || { echo "FAILED: no rdma test binary" >&2; exit 1; }
"$vm" --dir "$PWD" --timeout 1200 --sh "$bin --test-threads 1 --nocapture"
