#!/usr/bin/env bash
# All tests: formatting, lints, unit and integration tests (root-only tests run when root,
# as in CI). Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== cargo test"
cargo test --workspace -- --test-threads=2
