#!/bin/bash
# README "Running on real hosts", end to end on one machine (root): network namespaces
# stand in for the three hosts of the shipped example, with its own addresses
# (proxy 10.0.0.1, back-ends 10.0.0.11 and 10.0.0.12 running nginx, each host's NIC
# named eth0, joined by a bridge in a fourth namespace; nothing touches the machine's own
# network). The daemons are started with the Exec lines of the shipped unit files and
# the shipped configuration files, unmodified except for three paths (the binary, the
# files' install location /etc/farside, and gatherd's RuntimeDirectory) and gatherd's
# XDP mode (generic on a veth, see below), each as user
# 65534 holding exactly the unit's AmbientCapabilities (setpriv), so the run proves
# the units' commands and capability lists work. Checks: requests pass through the
# proxy with admission on, both back-ends' load is fresh in /metrics
# (farside_backend_load >= 0), admission decided by fresh load, a reload (ExecReload)
# is applied, and SIGTERM stops the proxy within the unit's TimeoutStopSec.
#
# Usage: deploy/walkthrough.sh [FARSIDE_BINARY]   (default: `farside` in PATH)
# Needs: ip, nsenter, setpriv, capsh, curl, nginx. Removes everything it made on exit.
set -euo pipefail

DEPLOY=$(cd "$(dirname "$0")" && pwd)
FARSIDE=$(command -v "${1:-farside}" || true)
say() { echo "walkthrough: $*"; }
die() { echo "walkthrough: FAILED: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (network namespaces, XDP)"
[ -x "$FARSIDE" ] || die "no farside binary (give its path)"
for t in ip nsenter setpriv capsh curl nginx; do
    command -v "$t" >/dev/null || die "needs $t"
done

# Bounds of the waits below: every step is local and takes milliseconds to a second.
READY_TIMEOUT_S=20   # a daemon listening / a fresh view (XDP verify is the slow step)
REQUESTS=50          # requests sent through the proxy
KILL_AFTER_S=15      # clean-up: SIGKILL what SIGTERM has not stopped by then

T=fw$(($$ % 100000))             # names of this run (interfaces: at most 15 characters)
SW=${T}sw P=${T}p B1=${T}b1 B2=${T}b2
WORK=$(mktemp -d /tmp/farside-walkthrough.XXXXXX)
chmod 755 "$WORK"
# The rmem keys, made as an operator makes them (/etc/farside/rmem-N.key, 0600, owned by
# the units' user), here in this run's directory; proxy.toml names them, so it is read
# from here too, with the key paths rewritten.
for n in 11 12; do
    (umask 077; od -An -tx1 -N16 /dev/urandom | tr -d ' \n' > "$WORK/rmem-$n.key")
    chown 65534:65534 "$WORK/rmem-$n.key"
done
sed "s#/etc/farside/rmem-#$WORK/rmem-#g" "$DEPLOY/proxy.toml" > "$WORK/proxy.toml"
chmod 644 "$WORK/proxy.toml"
PIDS=()
GATHERD_PIDS=()

cleanup() {
    local rc=$?
    local p end=$((SECONDS + KILL_AFTER_S))
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do
        while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    for ns in "$P" "$B1" "$B2" "$SW"; do ip netns del "$ns" 2>/dev/null || true; done
    if [ "$rc" != 0 ]; then
        for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 20 "$f"; }; done
    fi
    rm -rf "$WORK"
    [ "$rc" = 0 ] && say "cleaned up" || say "cleaned up after a failure (exit $rc)"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- hosts: one namespace each, eth0 on a bridge in the switch namespace ------------
ip netns add "$SW"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
ip -n "$SW" link set lo up
host() { # NAME IP
    local ns=$1 ip=$2
    ip netns add "$ns"
    ip -n "$SW" link add "${ns}x" type veth peer name "${ns}e"
    ip -n "$SW" link set "${ns}e" netns "$ns"
    ip -n "$ns" link set "${ns}e" name eth0
    ip -n "$ns" addr add "$ip/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$SW" link set "${ns}x" master br0 up
}
host "$P" 10.0.0.1
host "$B1" 10.0.0.11
host "$B2" 10.0.0.12
say "hosts: proxy 10.0.0.1 ($P), back-ends 10.0.0.11 ($B1) and 10.0.0.12 ($B2)"

# nsenter --net (not `ip netns exec`, which remounts /sys and hides tracefs).
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" "$@"; }

# ---- the unit files' Exec lines and capabilities -----------------------------------
# Paths rewritten: the binary, /etc/farside (the shipped files themselves), and the
# gatherd's RuntimeDirectory (a directory of this run owned by the unit's user).
unit_lines() { sed -n "s/^$2=//p" "$DEPLOY/$1"; }
caps_of() { # UNIT -> setpriv list, e.g. +bpf,+net_admin
    unit_lines "$1" AmbientCapabilities | tr ' ' '\n' | sed 's/^CAP_/+/' | tr 'A-Z' 'a-z' |
        paste -sd, -
}
rewrite() { # LINE RUNDIR
    local l=${1//\/usr\/local\/bin\/farside/$FARSIDE}
    l=${l//\/etc\/farside\/proxy.toml/$WORK/proxy.toml}
    l=${l//\/etc\/farside\/rmem-/$WORK/rmem-}
    echo "${l//\/run\/farside-gatherd/$2}"
}
# Run one Exec line as the unit's user would (uid 65534, only the unit's capabilities),
# words split as systemd splits an unquoted $VAR. With a LOG, in the background: the
# daemon's pid (nsenter and setpriv exec it) is appended to PIDS.
as_unit() { # NS CAPS LINE [LOG]
    local ns=$1 caps=$2 line=$3 log=${4:-}
    eval "set -- $line"
    local priv=(setpriv --reuid=65534 --regid=65534 --clear-groups
        "--inh-caps=-all,$caps" "--ambient-caps=-all,$caps" "--bounding-set=-all,$caps"
        --no-new-privs --)
    if [ -n "$log" ]; then
        nsenter --net="/run/netns/$ns" "${priv[@]}" "$@" >"$log" 2>&1 &
        PIDS+=($!)
    else
        in_ns "$ns" "${priv[@]}" "$@"
    fi
}
# SIGTERM a daemon as `systemctl stop` does; it must exit 0 within TimeoutStopSec.
stop_unit() { # PID UNIT WHAT
    local pid=$1 limit t0=$SECONDS rc=0
    limit=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s$/\1/p' "$DEPLOY/$2")
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do
        [ $((SECONDS - t0)) -lt "$limit" ] || die "$3 still running ${limit} s after SIGTERM"
        sleep 0.05
    done
    wait "$pid" || rc=$?
    [ "$rc" = 0 ] || die "$3 exited $rc after SIGTERM"
    say "SIGTERM: $3 exited 0 in $((SECONDS - t0)) s (TimeoutStopSec ${limit} s)"
}
wait_for() { # WHAT COMMAND...
    local what=$1 end=$((SECONDS + READY_TIMEOUT_S))
    shift
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || die "$what: not within ${READY_TIMEOUT_S} s"
        sleep 0.1
    done
}

GCAPS=$(caps_of farside-gatherd.service)
PCAPS=$(caps_of farside-proxy.service)
say "gatherd unit capabilities: $GCAPS; proxy unit capabilities: $PCAPS"

# ---- back-end hosts: nginx, then gatherd as its unit runs it ------------------------
backend() { # NS IP
    local ns=$1 ip=$2 d=$WORK/$1
    mkdir -p "$d/www" "$d/run"
    chown 65534 "$d/run"
    echo "hello from $ip" >"$d/www/index.html"
    cat >"$d/nginx.conf" <<EOF
user nobody nogroup;
worker_processes 1;
daemon off;
pid $d/nginx.pid;
error_log $d/nginx-error.log;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path $d/tmp-body;
    proxy_temp_path $d/tmp-proxy;
    fastcgi_temp_path $d/tmp-fastcgi;
    uwsgi_temp_path $d/tmp-uwsgi;
    scgi_temp_path $d/tmp-scgi;
    server { listen $ip:80; root $d/www; }
}
EOF
    nsenter --net="/run/netns/$ns" nginx -c "$d/nginx.conf" >"$WORK/nginx-$ns.log" 2>&1 &
    PIDS+=($!)
    wait_for "nginx on $ip" in_ns "$ns" curl -fsS "http://$ip/"

    # EnvironmentFile: the back-end's shipped env file.
    local GATHERD_FLAGS
    GATHERD_FLAGS=$(sed -n 's/^GATHERD_FLAGS="\(.*\)"$/\1/p' "$DEPLOY/gatherd-$ip.env")
    [ -n "$GATHERD_FLAGS" ] || die "no GATHERD_FLAGS in gatherd-$ip.env"
    GATHERD_FLAGS=$(rewrite "$GATHERD_FLAGS" "$d/run")
    # The one change to the flags: a veth's native XDP attaches, but its XDP_TX replies
    # are lost on the way back through the bridge (measured: every read timed out), so
    # the hosts' eth0 here runs XDP in generic mode, as `farside lab --hosts netns` does.
    # On a real NIC `auto` picks native mode.
    GATHERD_FLAGS=${GATHERD_FLAGS/--xdp-mode auto/--xdp-mode generic}
    local pre start
    pre=$(rewrite "$(unit_lines farside-gatherd.service ExecStartPre)" "$d/run")
    start=$(rewrite "$(unit_lines farside-gatherd.service ExecStart)" "$d/run")
    out=$(as_unit "$ns" "$GCAPS" "$pre" 2>&1) || die "$ip ExecStartPre: $out"
    say "$ip ExecStartPre: $out"
    as_unit "$ns" "$GCAPS" "$start" "$WORK/gatherd-$ns.log"
    GATHERD_PIDS+=("${PIDS[-1]}")
    wait_for "gatherd on $ip serving metrics" in_ns "$ns" curl -fsS http://127.0.0.1:9101/metrics
    wait_for "gatherd on $ip attaching XDP" grep -q "answered in the kernel" "$WORK/gatherd-$ns.log"
    sampler=$(in_ns "$ns" curl -fsS http://127.0.0.1:9101/metrics |
        sed -n 's/^farside_gatherd_sampler{mode="\([a-z]*\)"} 1$/\1/p')
    say "$ip gatherd: $(grep -o 'XDP responder on [^:]*' "$WORK/gatherd-$ns.log"), sampler $sampler"
}
backend "$B1" 10.0.0.11
backend "$B2" 10.0.0.12

# ---- proxy host: the proxy as its unit runs it ---------------------------------------
pre=$(rewrite "$(unit_lines farside-proxy.service ExecStartPre)" "")
start=$(rewrite "$(unit_lines farside-proxy.service ExecStart)" "")
out=$(as_unit "$P" "$PCAPS" "$pre" 2>&1) || die "proxy ExecStartPre: $out"
say "proxy ExecStartPre: $out"
as_unit "$P" "$PCAPS" "$start" "$WORK/proxy.log"
MAINPID=${PIDS[-1]}
metrics() { in_ns "$P" curl -fsS http://127.0.0.1:9100/metrics; }
wait_for "proxy admin listener" metrics
fresh() { # both back-ends' load known (>= 0; -1 means stale or unknown)
    [ "$(metrics | grep -c '^farside_backend_load{.*} [0-9]')" = 2 ]
}
wait_for "a fresh view of both back-ends" fresh
# monitor.nice -10 needs the unit's CAP_SYS_NICE (without it: a warning, nice 0).
nice_line=$(grep -m1 -E 'monitor.*nice -10' "$WORK/proxy.log" || true)
case "$nice_line" in
    *"thread at nice -10"*) say "proxy monitor threads at nice -10 (CAP_SYS_NICE)" ;;
    *) die "monitor.nice -10 not applied: ${nice_line:-no log line}" ;;
esac

# Who runs what, with which capabilities (the processes themselves, not the units).
for pid in "${PIDS[@]}"; do
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline")
    case "$cmd" in "$FARSIDE "*) ;; *) continue ;; esac
    eff=$(sed -n 's/^CapEff:\t//p' "/proc/$pid/status")
    say "  uid $(sed -n 's/^Uid:\t\([0-9]*\).*/\1/p' "/proc/$pid/status") \
caps $(capsh --decode="$eff" | sed 's/.*=//'): farside${cmd#"$FARSIDE"}"
done

# ---- requests through the proxy, admission on -----------------------------------------
ok=0
for _ in $(seq "$REQUESTS"); do
    code=$(in_ns "$P" curl -s -o /dev/null -w '%{http_code}' http://10.0.0.1/)
    [ "$code" = 200 ] && ok=$((ok + 1))
done
[ "$ok" = "$REQUESTS" ] || die "$ok of $REQUESTS requests answered 200"
say "$ok/$REQUESTS requests answered 200 through the proxy"
fresh || die "a back-end's load went stale"
m=$(metrics)
echo "$m" | grep -E '^farside_backend_load\{' | sed 's/^/walkthrough:   /'
admitted=$(echo "$m" | grep '^farside_admission_checks_total{' | grep 'decided="below_limit"' |
    awk '{s += $2} END {print s + 0}')
[ "$admitted" -gt 0 ] || die "no admission check decided by fresh load below the limit"
say "admission on: $admitted checks decided below_limit on fresh load"
echo "$m" | grep -E '^farside_admission_checks_total\{' | grep -v ' 0$' | sed 's/^/walkthrough:   /'

# ---- reload as `systemctl reload` runs it -------------------------------------------
reloads() { metrics | sed -n 's/^farside_proxy_config_reloads_total{outcome="ok"} //p'; }
before=$(reloads)
while read -r line; do
    l=$(rewrite "$line" "")
    as_unit "$P" "$PCAPS" "$l" >/dev/null
done < <(unit_lines farside-proxy.service ExecReload)
reloaded() { [ "$(reloads)" -gt "${before:-0}" ]; }
wait_for "the reload applied" reloaded
say "ExecReload: check passed, SIGHUP applied (reloads ok: ${before:-0} -> $(reloads))"
wait_for "a fresh view after the reload" fresh

# ---- stop as `systemctl stop` does ----------------------------------------------------
stop_unit "$MAINPID" farside-proxy.service "proxy (drained)"
for pid in "${GATHERD_PIDS[@]}"; do stop_unit "$pid" farside-gatherd.service gatherd; done
say "OK"
