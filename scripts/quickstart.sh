#!/usr/bin/env bash
# Follows the README's quick start as a new user would: installs the `hcomm` command,
# makes a fresh crate outside the workspace from the README's Cargo.toml lines and
# example program, builds it, and runs it as 2 ranks under `hcomm run`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

echo "--- quick start: cargo install --path crates/hcomm-cli"
cargo install -q --locked --path crates/hcomm-cli --root "$dir/bin" --target-dir target
cargo new -q --bin --vcs none "$dir/my_program"
python3 - "$root" "$dir/my_program" <<'PY'
import re
import sys

root, crate = sys.argv[1], sys.argv[2]
readme = open(f"{root}/README.md").read()
program = re.search(r"```rust\n(.*?)```", readme, re.S).group(1)
deps = re.search(r"```toml\n(.*?)```", readme, re.S).group(1)
# The README points at a checkout beside the user's crate; this one is here.
deps = re.sub(r'path = "[^"]*crates/hcomm"', f'path = "{root}/crates/hcomm"', deps)
manifest = open(f"{crate}/Cargo.toml").read()
assert manifest.rstrip().endswith("[dependencies]"), manifest
open(f"{crate}/Cargo.toml", "w").write(manifest.rstrip()[: -len("[dependencies]")] + deps)
open(f"{crate}/src/main.rs", "w").write(program)
PY
echo "--- quick start: cargo build --release (a crate outside the workspace)"
(cd "$dir/my_program" && cargo build -q --release --target-dir "$root/target/quickstart")
echo "--- quick start: hcomm run -n 2 -- my_program"
"$dir/bin/bin/hcomm" run -n 2 -- "$root/target/quickstart/release/my_program"
echo "ok: the README's quick start builds and runs"
