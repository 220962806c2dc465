#!/usr/bin/env bash
# Cross-checks farside-loadgen against wrk on loopback: same release-built
# farside-backend, same 16 KiB file, same 32 keep-alive connections, 5 s each.
# Usage: crates/loadgen/crosscheck-wrk.sh [workers] [connections] [seconds]
set -euo pipefail
cd "$(dirname "$0")/../.."
WORKERS=${1:-32}
CONNS=${2:-32}
SECS=${3:-5}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/tgt-h1}
command -v wrk >/dev/null || { echo "wrk not installed" >&2; exit 1; }
cargo build -q --release -p farside-backend --example farside-backend
cargo build -q --release -p farside-loadgen --example farside-loadgen
BIN=$CARGO_TARGET_DIR/release/examples
LOG=$(mktemp)
"$BIN/farside-backend" --listen 127.0.0.1:0 --workers "$WORKERS" --backlog 1024 >"$LOG" &
BACKEND=$!
trap 'kill $BACKEND 2>/dev/null; wait $BACKEND 2>/dev/null; rm -f "$LOG"' EXIT
for _ in $(seq 50); do grep -q listening "$LOG" && break; sleep 0.1; done
ADDR=$(awk '/listening on/ {print $3}' "$LOG")
[ -n "$ADDR" ] || { echo "backend did not start" >&2; exit 1; }
echo "backend $ADDR workers=$WORKERS; $CONNS connections, ${SECS}s, GET /file16k"
echo "== wrk -t1 -c$CONNS -d${SECS}s"
timeout $((SECS + 10)) wrk -t1 -c"$CONNS" -d"${SECS}s" --latency "http://$ADDR/file16k"
echo "== farside-loadgen --clients $CONNS --duration-s $SECS --warmup-s 0"
timeout $((SECS + 10)) "$BIN/farside-loadgen" --target "$ADDR" --clients "$CONNS" \
  --duration-s "$SECS" --warmup-s 0 --quiet
echo "== wrk -t1 -c$CONNS -d${SECS}s -H 'Connection: close' (one connection per request)"
timeout $((SECS + 10)) wrk -t1 -c"$CONNS" -d"${SECS}s" -H "Connection: close" "http://$ADDR/file16k"
echo "== farside-loadgen --no-keepalive"
timeout $((SECS + 10)) "$BIN/farside-loadgen" --target "$ADDR" --clients "$CONNS" \
  --duration-s "$SECS" --warmup-s 0 --quiet --no-keepalive
