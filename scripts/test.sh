#!/usr/bin/env bash
# All tests: formatting, lints, layout rules, unit and integration tests, and the kept
# results' re-rendering. Installs what it needs first.
#
# Tests that need root (network namespaces, cgroups, XDP) are #[ignore]d with the reason
# "needs root": as root (CI) this script runs them with --include-ignored; otherwise they
# are listed as ignored and counted as skipped. A test that cannot run for another reason
# (a tool missing) records a skip through farside-testkit: it is counted as skipped, not
# passed, and its reason printed. Under CI=true as root, where the set-up installed every
# tool, a skip fails the test (FARSIDE_NO_SKIP). The last line says
# `N passed, N failed, N skipped`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== layout (no module circle, no product crate linking a test server, file sizes)"
python3 scripts/check-layout.py

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export FARSIDE_SKIP_LOG="$scratch/skips"
: >"$FARSIDE_SKIP_LOG"
root=false
[ "$(id -u)" -eq 0 ] && root=true
set +e
if $root; then
    echo "== cargo test (root: including the root-only tests)"
    [ -n "${CI:-}" ] && export FARSIDE_NO_SKIP=1
    cargo test --workspace --no-fail-fast -- --test-threads=2 --include-ignored 2>&1 | tee "$scratch/test.log"
else
    echo "== cargo test (not root: root-only tests are skipped, listed as ignored)"
    cargo test --workspace --no-fail-fast -- --test-threads=2 2>&1 | tee "$scratch/test.log"
fi
test_status=${PIPESTATUS[0]}
# The verbs back-end (feature verbs; rdma-core loaded at run time): its tests that need
# an RDMA device skip, counted, where none exists (CI has none), so FARSIDE_NO_SKIP is off.
echo "== cargo test --features verbs (the verbs back-end)"
env -u FARSIDE_NO_SKIP cargo test -p farside-rdmahttp --features verbs --test verbs -- --test-threads=2 2>&1 | tee -a "$scratch/test.log"
verbs_status=${PIPESTATUS[0]}
[ "$verbs_status" -ne 0 ] && test_status=$verbs_status
set -e

echo "== kept lab results re-render identically"
reports_status=0
bash scripts/check-reports.sh || reports_status=$?

# `test result: ok. 12 passed; 0 failed; 3 ignored; ...`, one line per test binary.
sum() { grep -E '^test result:' "$scratch/test.log" | grep -oE "[0-9]+ $1" | awk '{s += $1} END {print s + 0}'; }
passed=$(sum passed)
failed=$(sum failed)
ignored=$(sum ignored)
skipped_run=$(sort -u "$FARSIDE_SKIP_LOG" | wc -l)
echo "== summary"
if [ "$skipped_run" -gt 0 ]; then
    echo "skipped at run time (counted as skipped, not passed):"
    sort -u "$FARSIDE_SKIP_LOG" | sed 's/\t/: /; s/^/  /'
fi
if [ "$ignored" -gt 0 ]; then
    if $root; then
        echo "ignored: $ignored (none should be as root: see the log above)"
    else
        echo "ignored (need root; run as root: sudo -E scripts/test.sh, as CI does): $ignored"
    fi
fi
[ "$test_status" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1 && echo "cargo test failed before reporting its counts"
[ "$reports_status" -ne 0 ] && failed=$((failed + 1)) && echo "kept results re-render differently (+1 failed)"
echo "$((passed - skipped_run)) passed, $failed failed, $((skipped_run + ignored)) skipped"
[ "$failed" -eq 0 ]
