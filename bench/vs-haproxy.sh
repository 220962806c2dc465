#!/usr/bin/env bash
# Side-by-side data-path benchmark on loopback: wrk straight at nginx, through
# HAProxy (nbthread 1) and through farside (workers 1), for one 16 KiB file.
#
#   bench/vs-haproxy.sh                     # `farside proxy`, admission control on, monitor running
#   FARSIDE=example bench/vs-haproxy.sh     # the bare data path (bench_proxy example, no control layer)
#
# With the CLI (default), a `farside gatherd` watches nginx's port and publishes its region
# in shared memory, and the proxy runs `--admission --metric backlog --limit 1000` with the
# monitor reading that region every 1 ms: the full control layer is on the request path.
#
# With the CLI, a second farside proxy runs with `--busy-poll-us $BUSY_POLL_US` (default 10;
# 0 = leave it out): a worker spins that long before sleeping, sparing nginx and wrk the cost
# of waking it. Here that cost decides req/s: wrk and nginx share CPU 0, which is the
# bottleneck, and each wake-up of a sleeping proxy is an IPI they pay for.
#
# Knobs (env): DURATION (5s), WARMUP (1s), CONNS (32), THREADS (1), SIZE (16384),
# ROUNDS (3: each target measured ROUNDS times, interleaved), PIN (1: wrk+nginx+gatherd on
# CPU 0, proxy on CPU 1, so both proxies get the same placement), ADMISSION (1),
# VERBOSE (unset: 1 prints every round), CARGO_TARGET_DIR (~/.cache/farside-target).
# Everything binds 127.0.0.1; every run is bounded.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
DURATION=${DURATION:-5s}
WARMUP=${WARMUP:-1s}
CONNS=${CONNS:-32}
THREADS=${THREADS:-1}
SIZE=${SIZE:-16384}
ROUNDS=${ROUNDS:-3}
PIN=${PIN:-1}
FARSIDE=${FARSIDE:-cli}
BUSY_POLL_US=${BUSY_POLL_US:-10}
ADMISSION=${ADMISSION:-1}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/farside-target}
NGINX=${NGINX:-/usr/sbin/nginx}
HAPROXY=${HAPROXY:-/usr/sbin/haproxy}

for tool in wrk "$NGINX" "$HAPROXY" python3; do
    command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done

cd "$root"
if [ "$FARSIDE" = cli ]; then
    cargo build --release -q -p farside
    farside_cmd=("$CARGO_TARGET_DIR/release/farside" proxy)
else
    cargo build --release -q -p farside-proxy --example bench_proxy
    farside_cmd=("$CARGO_TARGET_DIR/release/examples/bench_proxy")
fi

tmp=$(mktemp -d /tmp/farside-vs-haproxy.XXXXXX)
# nginx workers drop to an unprivileged user when started as root: let them read.
chmod 755 "$tmp"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
pin() { # pin CPU cmd...  (exec: under `&`, $! must be the server itself, for cleanup)
    if [ "$PIN" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
        exec taskset -c "$1" "${@:2}"
    else
        exec "${@:2}"
    fi
}
wait_port() { # port: wait (bounded) until something answers HTTP there
    for _ in $(seq 100); do
        if curl -fs -o /dev/null "http://127.0.0.1:$1/f"; then return 0; fi
        sleep 0.1
    done
    echo "nothing answers on port $1" >&2
    exit 1
}

ng_port=$(free_port)
hp_port=$(free_port)
fs_port=$(free_port)
fsb_port=$(free_port)
mkdir -p "$tmp/www" "$tmp/logs"
head -c "$SIZE" /dev/urandom >"$tmp/www/f"

cat >"$tmp/nginx.conf" <<CONF
worker_processes 1;
pid $tmp/nginx.pid;
error_log $tmp/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    sendfile on;
    tcp_nodelay on;
    keepalive_timeout 65;
    keepalive_requests 1000000;
    client_body_temp_path $tmp/cb;
    proxy_temp_path $tmp/pt;
    fastcgi_temp_path $tmp/ft;
    uwsgi_temp_path $tmp/ut;
    scgi_temp_path $tmp/st;
    server {
        listen 127.0.0.1:$ng_port;
        root $tmp/www;
    }
}
CONF

cat >"$tmp/haproxy.cfg" <<CONF
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    option http-keep-alive
    http-reuse always
    timeout connect 2s
    timeout client 60s
    timeout server 30s
    timeout http-request 10s
    timeout http-keep-alive 60s
frontend fe
    bind 127.0.0.1:$hp_port
    default_backend be
backend be
    server nginx 127.0.0.1:$ng_port maxconn 1000
CONF

pin 0 "$NGINX" -p "$tmp" -c "$tmp/nginx.conf" -g 'daemon off;' 2>"$tmp/logs/nginx.err" &
pids+=($!)
pin 1 "$HAPROXY" -f "$tmp/haproxy.cfg" -db >"$tmp/logs/haproxy.log" 2>&1 &
pids+=($!)
hp_pid=$!
fs_args=(--listen "127.0.0.1:$fs_port" --backend "127.0.0.1:$ng_port" --workers 1)
if [ "$FARSIDE" = cli ] && [ "$ADMISSION" = 1 ]; then
    pin 0 "${farside_cmd[0]}" gatherd --watch-port "$ng_port" --shm "$tmp/node.region" \
        >"$tmp/logs/gatherd.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do [ -f "$tmp/node.region" ] && break; sleep 0.05; done
    fs_args=(--listen "127.0.0.1:$fs_port" --workers 1
        --backend "127.0.0.1:$ng_port,region=shm:$tmp/node.region"
        --admission --metric backlog --limit 1000 --monitor-period-us 1000)
fi
pin 1 "${farside_cmd[@]}" "${fs_args[@]}" >"$tmp/logs/farside.log" 2>&1 &
pids+=($!)
fs_pid=$!
busy=()
if [ "$FARSIDE" = cli ] && [ "$BUSY_POLL_US" != 0 ]; then
    fsb_args=("${fs_args[@]}")
    fsb_args[1]="127.0.0.1:$fsb_port"
    pin 1 "${farside_cmd[@]}" "${fsb_args[@]}" --busy-poll-us "$BUSY_POLL_US" \
        >"$tmp/logs/farside-busy.log" 2>&1 &
    pids+=($!)
    busy=("farside-busy$BUSY_POLL_US:$fsb_port:$!")
fi
wait_port "$ng_port"
wait_port "$hp_port"
wait_port "$fs_port"
[ ${#busy[@]} -eq 0 ] || wait_port "$fsb_port"
ng_pid=$(cat "$tmp/nginx.pid")

# CPU time (user+sys, in clock ticks) of a process and all its threads/children so far.
cpu_ticks() { # pid
    local total=0 t
    for t in /proc/"$1"/task/*/stat; do
        total=$((total + $(awk '{print $14 + $15}' "$t")))
    done
    # nginx's worker is a child of the master.
    for c in $(pgrep -P "$1" || true); do
        total=$((total + $(awk '{print $14 + $15}' /proc/"$c"/stat)))
    done
    echo "$total"
}

# wrk's --latency output -> "req_s avg_ms p99_ms non2xx"
measure() { # port duration pid-whose-cpu-to-charge
    local out before after
    before=$(cpu_ticks "$3")
    out=$(pin 0 wrk -t"$THREADS" -c"$CONNS" -d"$2" --latency "http://127.0.0.1:$1/f")
    after=$(cpu_ticks "$3")
    awk -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" '
        function ms(v) {
            if (v ~ /us$/) { sub(/us$/, "", v); return v / 1000 }
            if (v ~ /ms$/) { sub(/ms$/, "", v); return v }
            if (v ~ /s$/)  { sub(/s$/, "", v);  return v * 1000 }
            return v
        }
        /^ *Latency / && !avg { avg = ms($2) }
        /^ *99%/ { p99 = ms($2) }
        /^Requests\/sec:/ { rps = $2 }
        /Non-2xx or 3xx/ { bad = $NF }
        /^ *[0-9]+ requests in/ { n = $1 }
        END { printf "%.0f %.3f %.3f %d %.1f\n", rps, avg, p99, bad, n ? ticks / hz * 1e6 / n : 0 }
    ' <<<"$out"
}

# name:port:pid whose CPU time is charged (for nginx-direct: nginx itself).
declare -A rps avg p99 bad cpu
targets=("nginx-direct:$ng_port:$ng_pid" "haproxy:$hp_port:$hp_pid" "farside:$fs_port:$fs_pid" "${busy[@]}")
for t in "${targets[@]}"; do
    IFS=: read -r name port pid <<<"$t"
    measure "$port" "$WARMUP" "$pid" >/dev/null
done
for round in $(seq "$ROUNDS"); do
    for t in "${targets[@]}"; do
        IFS=: read -r name port pid <<<"$t"
        read -r r a p b c < <(measure "$port" "$DURATION" "$pid")
        [ -z "${VERBOSE:-}" ] || echo "round $round $name: $r req/s avg $a ms p99 $p ms cpu $c us/req" >&2
        rps[$name]+="$r "; avg[$name]+="$a "; p99[$name]+="$p "; bad[$name]+="$b "; cpu[$name]+="$c "
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
printf '\n%s, %d B file, wrk -t%s -c%s -d%s, %s round(s), median shown\n' \
    "$(uname -r)" "$SIZE" "$THREADS" "$CONNS" "$DURATION" "$ROUNDS"
# cpu_us/req: CPU time of the serving process (the proxy; nginx for nginx-direct) per
# request: robust to other load on the machine, unlike req/s.
printf '%-14s %12s %10s %10s %8s %12s\n' target req/s avg_ms p99_ms non2xx cpu_us/req
for t in "${targets[@]}"; do
    name=${t%%:*}
    printf '%-14s %12s %10s %10s %8s %12s\n' "$name" \
        "$(median <<<"${rps[$name]}")" "$(median <<<"${avg[$name]}")" \
        "$(median <<<"${p99[$name]}")" "$(median <<<"${bad[$name]}")" \
        "$(median <<<"${cpu[$name]}")"
done
