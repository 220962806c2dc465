#!/usr/bin/env bash
# Issue "Production hardening", first section: admission control with the proxy's
# DEFAULT upstream pooling under open-loop overload, tried as a user would.
#
# Two `farside backend` nodes (16 workers, 1.5 ms CPU per request) with a gatherd each
# (shm regions), both on the last CPU; `farside proxy --admission` with every other
# setting at its default (unless METRIC / LIMIT say otherwise), loadgen on CPU 0. Phases:
#   capacity  closed loop, 32 clients, admission OFF: the back-ends' capacity C (served/s)
#   rate R    open loop at 0.9·C, 1.5·C, 3·C with admission ON (goodput, drop rate, p99)
#   recovery  after the overload stops: time until the next request is admitted (200)
# Result: one JSON object per phase in $OUT/lockout.jsonl (first line: commit, kernel, CPU,
# settings; a "proxy" line: the metric and limit the admission proxy says it used, from
# its start-up log) and a table on stdout; `bench/lockout-table.py FILE` prints it again.
#
# Knobs (env): DURATION (20 s per phase), WARMUP (2 s), METRIC (admission metric; unset or
# empty = the proxy's default), LIMIT (admission limit; unset = the proxy's default),
# OUT (out/lockout), CARGO_TARGET_DIR (~/.cache/farside-target).
# Everything binds 127.0.0.1; every run is bounded.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
DURATION=${DURATION:-20}
WARMUP=${WARMUP:-2}
OUT=${OUT:-$root/out/lockout}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/farside-target}
cd "$root"
cargo build --release -q -p farside
F="$CARGO_TARGET_DIR/release/farside"
mkdir -p "$OUT"
: >"$OUT/lockout.jsonl"
meta() { # one JSON line: what ran, where
    python3 - "$@" <<'PY'
import json, os, platform, subprocess, sys
def sh(*c):
    try: return subprocess.run(c, capture_output=True, text=True, cwd=sys.argv[1]).stdout.strip()
    except OSError: return ""
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
print(json.dumps({"phase": "meta", "commit": sh("git", "rev-parse", "HEAD"),
    "dirty": bool(sh("git", "status", "--porcelain", "--untracked-files=no")),
    "kernel": platform.release(), "cpu_model": cpu, "cpus": os.cpu_count(),
    "duration_s": float(sys.argv[2]), "warmup_s": float(sys.argv[3]), "limit": sys.argv[4] or "proxy default", "metric": sys.argv[5] or "proxy default",
    "backends": "2 x farside backend --workers 16 --cpu-us-per-request 1500, gatherd shm, on the last CPU"}))
PY
}
meta "$root" "$DURATION" "$WARMUP" "${LIMIT:-}" "${METRIC:-}" >>"$OUT/lockout.jsonl"
tmp=$(mktemp -d /tmp/farside-lockout.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
last=$(( $(nproc) - 1 ))
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { # url: bounded wait until it answers
    for _ in $(seq 100); do curl -s -o /dev/null "$1" && return 0; sleep 0.1; done
    echo "nothing answers at $1" >&2; exit 1
}
backs=()
for i in 1 2; do
    p=$(free_port)
    taskset -c "$last" "$F" backend --listen 127.0.0.1:$p --workers 16 --cpu-us-per-request 1500 \
        >"$tmp/backend$i.log" 2>&1 & pids+=($!)
    taskset -c "$last" "$F" gatherd --node-id $i --watch-port $p --shm "$tmp/region$i" \
        --sampler-nice -20 >"$tmp/gatherd$i.log" 2>&1 & pids+=($!)
    backs+=(--backend "127.0.0.1:$p,region=shm:$tmp/region$i")
    wait_http "http://127.0.0.1:$p/file16k"
done
start_proxy() { # admission flags...
    local port; port=$(free_port)
    taskset -c 0 "$F" proxy --listen 127.0.0.1:$port "${backs[@]}" "$@" \
        >"$tmp/proxy.log" 2>&1 & proxy_pid=$!; pids+=($proxy_pid)
    proxy_addr=127.0.0.1:$port
    for _ in $(seq 100); do [ -s "$tmp/region1" ] && [ -s "$tmp/region2" ] && \
        curl -s -o /dev/null "http://$proxy_addr/file16k" && return 0; sleep 0.1; done
    echo "proxy did not come up: $(cat "$tmp/proxy.log")" >&2; exit 1
}
steal() { # per-CPU steal ticks (USER_HZ) from /proc/stat, space-separated
    awk '/^cpu[0-9]/ {printf "%s ", $9}' /proc/stat
}
phase() { # name loadgen-args...
    local name=$1; shift
    echo "== $name" >&2
    local s0; s0=$(steal)
    taskset -c 0 "$F" loadgen --target "$proxy_addr" --duration-s "$DURATION" \
        --warmup-s "$WARMUP" --json --quiet "$@" >"$tmp/$name.json"
    # steal_ms: CPU time the hypervisor took from each CPU during the phase (a phase
    # where one CPU lost > 1% of it is flagged by lockout-table.py).
    python3 - "$name" "$tmp/$name.json" "$s0" "$(steal)" "$(getconf CLK_TCK)" \
        >>"$OUT/lockout.jsonl" <<'PY'
import json, sys
s = json.load(open(sys.argv[2])); s.pop("series", None); s["phase"] = sys.argv[1]
a, b, hz = sys.argv[3].split(), sys.argv[4].split(), float(sys.argv[5])
s["steal_ms"] = [(int(y) - int(x)) * 1000.0 / hz for x, y in zip(a, b)]
print(json.dumps(s))
PY
}
start_proxy
phase capacity --clients 32
cap=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["tps"])' "$OUT/lockout.jsonl")
kill "$proxy_pid"; wait "$proxy_pid" 2>/dev/null || true
adm=(--admission)
[ -n "${METRIC:-}" ] && adm+=(--metric "$METRIC")
[ -n "${LIMIT:-}" ] && adm+=(--limit "$LIMIT")
start_proxy "${adm[@]}"
# What the proxy actually used: its start-up line "admission on (metric M, limit L...)".
python3 - "$tmp/proxy.log" >>"$OUT/lockout.jsonl" <<'PY'
import json, re, sys
line = next((l for l in open(sys.argv[1]) if "admission on (" in l), "")
m = re.search(r"admission on \(metric (\S+), limit ([^;)]*?)(?:, target delay [^)]*)?\);", line)
print(json.dumps({"phase": "proxy", "metric": m.group(1) if m else "?",
                  "limit": m.group(2) if m else "?", "log": line.strip()}))
PY
tail -n1 "$OUT/lockout.jsonl" >&2
for f in 0.9 1.5 3; do
    r=$(python3 -c "print(round($cap*$f))")
    phase "open-${f}x" --rate "$r"
done
# Recovery: the overload has stopped; poll once per 10 ms for at most 10 s.
t0=$(date +%s%N); code=0
for _ in $(seq 1000); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://$proxy_addr/file16k" || true)
    [ "$code" = 200 ] && break
    sleep 0.01
done
t1=$(date +%s%N)
echo "{\"phase\":\"recovery\",\"status\":$code,\"ms_to_admit\":$(( (t1-t0)/1000000 ))}" >>"$OUT/lockout.jsonl"
python3 "$here/lockout-table.py" "$OUT/lockout.jsonl"
