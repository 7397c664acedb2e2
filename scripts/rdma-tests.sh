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

# The crates the feature adds (async-rdma's own dependencies, build-time ones
# included) must all be absent from the default build's tree.
tree() { cargo tree -e normal,build --prefix none --format '{p}' "$@" | sed 's/ (.*//' | sort -u; }
tree -p hcomm -p hcomm-bench >/tmp/hcomm-tree-default
tree -p hcomm -p hcomm-bench --features hcomm/rdma >/tmp/hcomm-tree-rdma
added=$(comm -13 /tmp/hcomm-tree-default /tmp/hcomm-tree-rdma)
grep -q '^async-rdma ' <<<"$added" || { echo "FAILED: the rdma feature adds no async-rdma?" >&2; exit 1; }
if grep -qE '^(async-rdma|rdma-sys|tikv-jemalloc-sys|bindgen) ' /tmp/hcomm-tree-default; then
    echo "FAILED: the default build depends on async-rdma or its native parts" >&2
    exit 1
fi
echo "ok: the default build has none of the $(wc -l <<<"$added") crates the rdma feature adds"

vm=${RXE_VM:-../shared/rdma-vm/run-in-rxe-vm.sh}
cargo test -p hcomm --features rdma --test rdma --no-run
# The test binary's path, from cargo's JSON messages.
bin=$(cargo test -p hcomm --features rdma --test rdma --no-run --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*rdma-[^"]*"' | tail -1 | cut -d'"' -f4)
[[ -x $bin ]] || { echo "FAILED: no rdma test binary" >&2; exit 1; }
"$vm" --dir "$PWD" --timeout 1200 --sh "$bin --test-threads 1 --nocapture"
