#!/usr/bin/env bash
# Every kept lab run re-renders to the same bytes.
#
# For each run kept under docs/results (a directory with a summary.json), copies its
# summary.json and points.jsonl (when present) into a scratch directory, runs
# `farside lab report` there and takes the SHA-256 of every file it writes and of the
# table it prints. The digests are compared with docs/results/report-digests.txt, so a
# change to the lab that moves a kept figure, a CSV column or a plot is caught.
#
#   scripts/check-reports.sh            compare (exit 1 on any difference)
#   scripts/check-reports.sh --record   write docs/results/report-digests.txt anew
#
# Then checks that docs/RESULTS.md is what `farside lab report --book` makes of the kept
# files (with --record: writes it anew).
#
# FARSIDE_BIN names the binary (default: $CARGO_TARGET_DIR/debug/farside, built first).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=compare
case "${1:-}" in
  --record) mode=record ;;
  "") ;;
  *) echo "usage: $0 [--record]" >&2; exit 2 ;;
esac

if [ -z "${FARSIDE_BIN:-}" ]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/farside-target}"
  cargo build --quiet -p farside
  FARSIDE_BIN="$CARGO_TARGET_DIR/debug/farside"
fi
[ -x "$FARSIDE_BIN" ] || { echo "check-reports: no binary at $FARSIDE_BIN" >&2; exit 2; }

golden=docs/results/report-digests.txt
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
now="$scratch/digests.txt"
: >"$now"

runs=0
while IFS= read -r summary; do
  run=$(dirname "$summary")
  rel=${run#docs/results/}
  work="$scratch/run"
  rm -rf "$work"
  mkdir -p "$work"
  cp "$run/summary.json" "$work/"
  [ -f "$run/points.jsonl" ] && cp "$run/points.jsonl" "$work/"
  if ! "$FARSIDE_BIN" lab report "$work" >"$scratch/table.out" 2>"$scratch/report.err"; then
    echo "$rel (report) FAILED: $(tail -1 "$scratch/report.err")" >>"$now"
  else
    echo "$rel (stdout) $(sha256sum <"$scratch/table.out" | cut -d' ' -f1)" >>"$now"
    (cd "$work" && find . -type f | LC_ALL=C sort | while IFS= read -r f; do
      echo "$rel ${f#./} $(sha256sum <"$f" | cut -d' ' -f1)"
    done) >>"$now"
  fi
  runs=$((runs + 1))
done < <(find docs/results -name summary.json -not -path '*/logs/*' | LC_ALL=C sort)

if [ "$mode" = record ]; then
  cp "$now" "$golden"
  echo "check-reports: recorded $(wc -l <"$golden") digests of $runs kept runs in $golden"
  "$FARSIDE_BIN" lab report --book
  exit 0
fi

book_ok=0
"$FARSIDE_BIN" lab report --book --check || book_ok=1

[ -f "$golden" ] || { echo "check-reports: no $golden (run with --record on a good build)" >&2; exit 2; }
if diff -u "$golden" "$now" >"$scratch/diff"; then
  echo "check-reports: $runs kept runs re-render identically ($(wc -l <"$golden") digests)"
  exit "$book_ok"
else
  echo "check-reports: kept runs re-render differently (- recorded, + now):" >&2
  grep -E '^[-+][^-+]' "$scratch/diff" >&2 || true
  exit 1
fi
