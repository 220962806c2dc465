#!/usr/bin/env bash
# Proxy throughput by data-path workers: req/s through `farside proxy
# --workers N` (N = 1, 2 by default; each worker its own thread, runtime and
# SO_REUSEPORT listener) to one `farside backend` on loopback. Closed loop, keep-alive,
# one small generated file. Each point is measured twice: by `farside loadgen` and, as a
# cross-check with an independent client, by wrk (installed with apt if missing).
# The proxy runs without admission (the data path, not the control layer), and its
# per-worker counters show how the kernel spread the connections.
#
#   bench/workers.sh                        # builds `farside` (release) first
#   FARSIDE=target/debug/farside DURATION=2 ROUNDS=1 bench/workers.sh   # a quick check
#
# Knobs (env): WORKERS ("1 2"), CLIENTS (32: loadgen clients = wrk connections),
# DURATION (10, s), WARMUP (2, s), SIZE (1024: bytes of /files/SIZE), ROUNDS (3: the
# worker counts interleaved, so drift in the machine's load hits all alike),
# BACKEND_WORKERS (64, >= CLIENTS so the back-end never queues), LOADGEN_THREADS (2),
# WRK_THREADS (2), FARSIDE (a built binary; default: cargo build --release), OUT (a
# directory for the raw outputs; default a temp dir, removed). Every run is bounded and
# binds 127.0.0.1 on free ports. On a shared or busy machine the figures are noise:
# run it on an otherwise idle one.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
WORKERS=${WORKERS:-"1 2"}
CLIENTS=${CLIENTS:-32}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
SIZE=${SIZE:-1024}
ROUNDS=${ROUNDS:-3}
BACKEND_WORKERS=${BACKEND_WORKERS:-64}
LOADGEN_THREADS=${LOADGEN_THREADS:-2}
WRK_THREADS=${WRK_THREADS:-2}

if ! command -v wrk >/dev/null; then
    echo "wrk missing: installing it (apt)" >&2
    apt-get install -y -q wrk >/dev/null || { apt-get update -q && apt-get install -y -q wrk >/dev/null; }
fi
for tool in wrk curl python3; do
    command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done

cd "$root"
if [ -z "${FARSIDE:-}" ]; then
    cargo build --release -q -p farside
    FARSIDE="${CARGO_TARGET_DIR:-$root/target}/release/farside"
fi
[ -x "$FARSIDE" ] || { echo "not an executable: $FARSIDE" >&2; exit 1; }

tmp=${OUT:-$(mktemp -d /tmp/farside-workers.XXXXXX)}
mkdir -p "$tmp"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    [ -n "${OUT:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_http() { # port: wait (bounded, 10 s) until something answers HTTP there
    for _ in $(seq 100); do
        if curl -fs -o /dev/null "http://127.0.0.1:$1/files/$SIZE"; then return 0; fi
        sleep 0.1
    done
    echo "nothing answers on port $1" >&2
    exit 1
}

bport=$(free_port)
"$FARSIDE" backend --listen "127.0.0.1:$bport" --workers "$BACKEND_WORKERS" \
    --backlog 1024 >"$tmp/backend.log" 2>&1 &
pids+=($!)
wait_http "$bport"

# One point: proxy with $1 workers; appends "workers loadgen_rps wrk_rps spread" to rows.
measure() {
    local w=$1 r=$2 pport proxy lg wrk_rps spread
    pport=$(free_port)
    FARSIDE_LOG=warn "$FARSIDE" proxy --listen "127.0.0.1:$pport" --workers "$w" \
        --backend "127.0.0.1:$bport" --data-port-metrics >"$tmp/proxy-$w-$r.log" 2>&1 &
    proxy=$!
    pids+=("$proxy")
    wait_http "$pport"
    "$FARSIDE" loadgen --target "127.0.0.1:$pport" --clients "$CLIENTS" \
        --duration-s "$DURATION" --warmup-s "$WARMUP" --file-path "/files/$SIZE" \
        --threads "$LOADGEN_THREADS" --json --quiet >"$tmp/loadgen-$w-$r.json"
    lg=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["tps"]))' \
        "$tmp/loadgen-$w-$r.json")
    wrk -t "$WRK_THREADS" -c "$CLIENTS" -d "$((DURATION + WARMUP))s" --latency \
        "http://127.0.0.1:$pport/files/$SIZE" >"$tmp/wrk-$w-$r.txt"
    wrk_rps=$(awk '/^Requests\/sec:/ {printf "%d", $2}' "$tmp/wrk-$w-$r.txt")
    curl -fs "http://127.0.0.1:$pport/farside/metrics" >"$tmp/metrics-$w-$r.txt"
    spread=$(awk -F'[ "]' '/^farside_proxy_worker_requests_total/ {printf "%s%s", sep, $NF; sep="/"}' \
        "$tmp/metrics-$w-$r.txt")
    kill "$proxy"
    wait "$proxy" 2>/dev/null || true
    rows+=("$w $lg $wrk_rps $spread")
}

rows=()
for r in $(seq "$ROUNDS"); do
    for w in $WORKERS; do
        measure "$w" "$r"
    done
done

echo "proxy workers: req/s (closed loop, $CLIENTS keep-alive clients, /files/$SIZE, ${DURATION}s after ${WARMUP}s warm-up, $ROUNDS round(s))"
printf '%-8s %-14s %-14s %s\n' workers loadgen_rps wrk_rps "responses_per_worker (last round)"
for w in $WORKERS; do
    printf '%s\n' "${rows[@]}" | awk -v w="$w" '
        $1 == w { n++; lg += $2; wk += $3; if (lg_s) { lg_s = lg_s "," } lg_s = lg_s $2;
                  if (wk_s) { wk_s = wk_s "," } wk_s = wk_s $3; sp = $4 }
        END { printf "%-8s %-14s %-14s %s\n", w, int(lg / n) " (" lg_s ")", int(wk / n) " (" wk_s ")", sp }'
done
echo "(mean, then each round; raw outputs in $tmp${OUT:+ (kept)})"
