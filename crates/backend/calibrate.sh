#!/usr/bin/env bash
# Calibrates farside-backend's cost model against nginx on this machine.
#
# The rule (crates/backend/src/cost.rs): the test server should cost, per
# request and per byte, what nginx costs as the lab runs it (one worker,
# sendfile on, access_log off). For each server and each file size, a bounded
# wrk run on loopback is bracketed by reads of the server's CPU time
# (/proc/<pid>/stat utime + stime, all threads); CPU per request is fitted by
# least squares as  a + b × bytes. The defaults are
#     --cpu-us-per-request = max(0, a_nginx − a_self)
#     --cpu-ns-per-byte    = max(0, b_nginx − b_self)
# i.e. the emulated part that brings this server's total CPU to nginx's.
#
# Run it while nothing else heavy runs (CPU time is less sensitive to load
# than throughput, but cache and frequency effects remain).
#
# Usage: crates/backend/calibrate.sh
# Environment (all optional):
#   SIZES="1024 16384 65536 262144 1048576"  file sizes, bytes
#   DURATION_S=3        wrk run per size and server, seconds (bounded: 1..60)
#   CONNS=4             wrk connections (and backend workers)
#   BACKEND=path        farside-backend binary; default: builds the release
#                       example `farside-backend` with cargo
set -euo pipefail

SIZES=${SIZES:-"1024 16384 65536 262144 1048576"}
DURATION_S=${DURATION_S:-3}
CONNS=${CONNS:-4}
if ((DURATION_S < 1 || DURATION_S > 60)); then
    echo "calibrate: DURATION_S must be in 1..60" >&2
    exit 2
fi
for tool in nginx wrk awk; do
    command -v "$tool" >/dev/null || { echo "calibrate: $tool not found" >&2; exit 2; }
done

here=$(cd "$(dirname "$0")" && pwd)
if [[ -z ${BACKEND:-} ]]; then
    (cd "$here" && cargo build --quiet --release -p farside-backend --example farside-backend)
    target=${CARGO_TARGET_DIR:-$here/../../target}
    BACKEND=$target/release/examples/farside-backend
fi
[[ -x $BACKEND ]] || { echo "calibrate: $BACKEND is not executable" >&2; exit 2; }

work=$(mktemp -d /tmp/farside-calibrate.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/root" "$work/nginx/tmp" "$work/nginx/logs"
for s in $SIZES; do
    head -c "$s" /dev/urandom >"$work/root/f$s"
done

# A free loopback port: bind port 0 and read back what the kernel chose.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# CPU ticks (utime + stime) of a process, all threads. Field 2 (comm) may
# contain spaces: count fields after the closing parenthesis.
cpu_ticks() {
    sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}
hz=$(getconf CLK_TCK)

wait_port() {
    for _ in $(seq 100); do
        if curl -s -o /dev/null "http://127.0.0.1:$1/"; then return 0; fi
        sleep 0.05
    done
    echo "calibrate: nothing listens on port $1" >&2
    exit 1
}

# measure NAME PID PORT: prints "bytes cpu_us_per_request" per size.
measure() {
    local name=$1 pid=$2 port=$3
    for s in $SIZES; do
        # Warm the page cache and the connection path.
        wrk -t1 -c"$CONNS" -d1s "http://127.0.0.1:$port/f$s" >/dev/null
        local t0 t1 reqs
        t0=$(cpu_ticks "$pid")
        reqs=$(wrk -t1 -c"$CONNS" -d"${DURATION_S}s" "http://127.0.0.1:$port/f$s" |
            awk '/requests in/ {print $1}')
        t1=$(cpu_ticks "$pid")
        awk -v s="$s" -v d="$((t1 - t0))" -v r="$reqs" -v hz="$hz" -v n="$name" \
            'BEGIN { if (r == 0) exit 1; printf "%s %d %.2f\n", n, s, d * 1e6 / hz / r }'
    done
}

# fit: least squares of "name bytes us" lines → "a_us b_ns_per_byte".
fit() {
    awk '{ n++; x += $2; y += $3; xx += $2 * $2; xy += $2 * $3 }
         END { b = (n * xy - x * y) / (n * xx - x * x); a = (y - b * x) / n;
               printf "%.2f %.4f\n", a, b * 1000 }'
}

# nginx, configured as crates/lab/src/nginx.rs runs it.
nport=$(free_port)
cat >"$work/nginx/nginx.conf" <<EOF
$( ((EUID == 0)) && echo "user root;")
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/logs/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000;
    client_body_temp_path $work/nginx/tmp;
    proxy_temp_path $work/nginx/tmp;
    server {
        listen 127.0.0.1:$nport;
        root $work/root;
        location / { }
    }
}
EOF
nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" -g 'daemon off;' 2>"$work/nginx/stderr" &
npid=$!
pids+=("$npid")
wait_port "$nport"
nworker=$(pgrep -P "$npid" | head -1)
[[ -n $nworker ]] || { echo "calibrate: no nginx worker" >&2; exit 1; }

bport=$(free_port)
"$BACKEND" --listen "127.0.0.1:$bport" --root "$work/root" --workers "$CONNS" \
    --cpu-us-per-request 0 --cpu-ns-per-byte 0 >/dev/null &
bpid=$!
pids+=("$bpid")
wait_port "$bport"

echo "# server bytes cpu_us_per_request  (wrk -c$CONNS, ${DURATION_S}s per size, CLK_TCK $hz)"
measure nginx "$nworker" "$nport" | tee "$work/nginx.txt"
measure farside-backend "$bpid" "$bport" | tee "$work/self.txt"
read -r an bn < <(fit <"$work/nginx.txt")
read -r as bs < <(fit <"$work/self.txt")
echo "# fit: cpu per request = a µs + b ns × bytes"
echo "nginx:            a = $an µs, b = $bn ns/B"
echo "farside-backend:  a = $as µs, b = $bs ns/B (zero emulated cost)"
awk -v an="$an" -v bn="$bn" -v as="$as" -v bs="$bs" 'BEGIN {
    a = an - as; if (a < 0) a = 0; b = bn - bs; if (b < 0) b = 0;
    printf "rule: --cpu-us-per-request %.0f --cpu-ns-per-byte %.2f\n", a, b }'
