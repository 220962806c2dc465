#!/usr/bin/env bash
# The main job: build farside and run the admission-control lab demo (quick sweep) on
# this machine. Output: out/admission/{summary.json,points.jsonl,points.csv,*.svg,report.html}
# (`farside lab report out/admission` re-renders them; `--resume out/admission` continues a
# broken sweep).
# Every point starts from an empty tier, checked and recorded (`start` of each record in
# points.jsonl; the progress line says `start empty after N ms`): docs/lab.md.
# Extra arguments go to `farside lab admission` (e.g. without --quick for the full sweep).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
cargo build --release -p farside
exec "$CARGO_TARGET_DIR/release/farside" lab admission --quick --out out/admission "$@"
