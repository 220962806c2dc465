#!/bin/bash
# gatherd's own CPU cost at a 1 ms period (target: <= 2% of one core
# with a watched port, user-space sampler; <= 0.1% with the kernel sampler, its BPF
# programs' run time included: the kbpf-* cases' total).
#
# Five cases, T seconds each (default 20):
#   bare-loop     the floor: a C loop that only sleeps to the next 1 ms deadline (compiled
#                 with cc), i.e. what the period's wake-up alone costs on this machine
#   user-port     --sampler user, --watch-port of a `farside backend` (host netns)
#   user-noport   --sampler user, no watched port (host netns)
#   kernel-port   --sampler kernel (XDP on lo of a private netns; root)
#   kernel-noport --sampler kernel, no watched port (same)
#   kbpf-port     --sampler kernel without XDP (the sampler's maps only, host netns),
#                 --bpf-stats, --watch-port of a `farside backend`: gatherd's CPU beside
#                 the BPF programs' own run time (summary `bpf_cpu_pct`) and their sum
#   kbpf-noport   the same without a watched port
# For each it prints gatherd's own `cpu_pct` (exit summary: whole process, from the end
# of its start-up) and, as a cross-check, the process's CPU from /proc/PID/stat
# (utime+stime) over a window of the same run (from its start-up line to 1 s before its
# exit), plus the per-field costs of the summary. With BPF_STATS=1 it turns
# kernel.bpf_stats_enabled on for the kernel cases (restored after), so the summary's
# ktick_ns (kernel time per published record) is filled.
#
# Output: printed, and kept under docs/results/gatherd-cost/<UTC time>/ (each case's
# gatherd log, and summary.txt). The figures mean something only on a quiet machine.
#
# Usage: [B=path/to/farside] [T=20] [CASES="bare-loop user-port user-noport kernel-port kernel-noport kbpf-port kbpf-noport"]
#        [PERIOD_US=1000] [NICE="/work/notes/idle"] bench/gatherd-cost.sh
set -euo pipefail
B=${B:-farside}
T=${T:-20}
PERIOD_US=${PERIOD_US:-1000}
CASES=${CASES:-"bare-loop user-port user-noport kernel-port kernel-noport"}
# A command prefix for gatherd (e.g. an idle-priority wrapper on a shared machine).
NICE=${NICE:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/docs/results/gatherd-cost/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
D=$(mktemp -d)
NS=gcost$$
PORT=39471
UDP_PORT=39472
PIDS=()
BPF_STATS_WAS=""

cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
  if [ -n "$BPF_STATS_WAS" ]; then sysctl -qw kernel.bpf_stats_enabled="$BPF_STATS_WAS"; fi
  rm -rf "$D"
}
trap cleanup EXIT

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

# Run one gatherd ($2...: its extra flags; $1: the case's name; NSEXEC: netns prefix).
run_case() {
  local name=$1; shift
  local log=$OUT/$name.log
  $NSEXEC $NICE "$B" gatherd --period-us "$PERIOD_US" --no-shm --duration-s "$((T + 2))" "$@" >"$log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  # The wrapper (netns exec, nice) execs gatherd: same pid. Wait for its start-up line
  # (XDP's verifier can take seconds on a busy machine).
  local deadline=$((SECONDS + 60))
  until grep -q "start-up" "$log"; do
    if [ $SECONDS -ge $deadline ] || ! kill -0 "$pid" 2>/dev/null; then
      echo "$name: gatherd did not start:"; cat "$log"; return 1
    fi
    sleep 0.1
  done
  local t0 a b
  t0=$(date +%s.%N); a=$(ticks "$pid")
  sleep "$((T - 1))"
  b=$(ticks "$pid"); local t1; t1=$(date +%s.%N)
  wait "$pid" || true
  local summary
  summary=$(grep -o "sampler=.*" "$log" | tail -1)
  local proc_pct
  proc_pct=$(echo "scale=2; ($b - $a) * 100 / $HZ / ($t1 - $t0)" | bc)
  local own
  own=$(echo "$summary" | grep -o " cpu_pct=[0-9.]*" | head -1 | cut -d= -f2)
  local bpf
  bpf=$(echo "$summary" | grep -o "bpf_cpu_pct=[0-9.]*" | head -1 | cut -d= -f2 || true)
  if [ -n "$bpf" ]; then
    printf "%-14s cpu_pct=%-6s /proc/PID/stat=%-6s bpf_cpu_pct=%-6s total=%s %% of one core over %ss\n" "$name" "$own" "$proc_pct" "$bpf" "$(echo "scale=3; $own + $bpf" | bc)" "$((T - 1))" | tee -a "$OUT/summary.txt"
  else
    printf "%-14s cpu_pct=%-6s /proc/PID/stat=%-6s %% of one core over %ss\n" "$name" "$own" "$proc_pct" "$((T - 1))" | tee -a "$OUT/summary.txt"
  fi
  echo "  $summary" | tee -a "$OUT/summary.txt"
}

{
  echo "# gatherd-cost $(date -u +%FT%TZ) $(uname -r), $(nproc) CPUs, loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown) (tree clean: $(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo no || echo yes)); seed: none (no randomness)"
  echo "# binary: $($B --version 2>/dev/null || echo "$B"); period ${PERIOD_US} us; T=${T}s; prefix '${NICE}'"
  echo "# tcp_ehash_entries=$(sysctl -n net.ipv4.tcp_ehash_entries 2>/dev/null) tcp_child_ehash_entries=$(sysctl -n net.ipv4.tcp_child_ehash_entries 2>/dev/null)"
} | tee "$OUT/summary.txt"

# The floor: sleep to absolute deadlines one period apart, nothing else.
bare_loop() {
  if ! command -v cc >/dev/null; then echo "bare-loop: no cc, skipped" | tee -a "$OUT/summary.txt"; return; fi
  cat >"$D/loop.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/prctl.h>
static double secs(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv) {
  long period_ns = atol(argv[1]) * 1000; double T = atof(argv[2]);
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); /* as gatherd's sampler (farside_rmem::Pacer) */
  struct timespec next; clock_gettime(CLOCK_MONOTONIC, &next);
  double w0 = secs(CLOCK_MONOTONIC), c0 = secs(CLOCK_PROCESS_CPUTIME_ID); long n = 0;
  while (secs(CLOCK_MONOTONIC) - w0 < T) {
    next.tv_nsec += period_ns;
    while (next.tv_nsec >= 1000000000) { next.tv_nsec -= 1000000000; next.tv_sec++; }
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL); n++;
  }
  double cpu = secs(CLOCK_PROCESS_CPUTIME_ID) - c0, wall = secs(CLOCK_MONOTONIC) - w0;
  printf("cpu_pct=%.2f wakeups=%ld cpu_per_wakeup_us=%.1f\n", cpu * 100 / wall, n, cpu * 1e6 / n);
  return 0;
}
C
  cc -O2 -o "$D/loop" "$D/loop.c"
  printf "%-14s %s\n" bare-loop "$($NICE "$D/loop" "$PERIOD_US" "$T")" | tee -a "$OUT/summary.txt"
}

for c in $CASES; do
  case $c in
    bare-loop) bare_loop ;;
    user-*)
      NSEXEC=""
      if [ "$c" = user-port ]; then
        "$B" backend --listen 127.0.0.1:$PORT --workers 4 >"$D/be.log" 2>&1 &
        BE=$!; PIDS+=("$BE"); sleep 0.5
        run_case "$c" --sampler user --watch-port $PORT
        kill "$BE"; wait "$BE" 2>/dev/null || true
      else
        run_case "$c" --sampler user
      fi
      ;;
    kbpf-*)
      NSEXEC=""
      if [ "$c" = kbpf-port ]; then
        "$B" backend --listen 127.0.0.1:$PORT --workers 4 >"$D/be.log" 2>&1 &
        BE=$!; PIDS+=("$BE"); sleep 0.5
        run_case "$c" --sampler kernel --bpf-stats --watch-port $PORT
        kill "$BE"; wait "$BE" 2>/dev/null || true
      else
        run_case "$c" --sampler kernel --bpf-stats
      fi
      ;;
    kernel-*)
      if ! ip netns list | grep -qw "$NS"; then
        ip netns add "$NS"
        ip -n "$NS" link set lo up
      fi
      if [ "${BPF_STATS:-0}" = 1 ] && [ -z "$BPF_STATS_WAS" ]; then
        BPF_STATS_WAS=$(sysctl -n kernel.bpf_stats_enabled)
        sysctl -qw kernel.bpf_stats_enabled=1
      fi
      # nsenter, not `ip netns exec`: that remounts /sys, hiding tracefs from the kernel
      # sampler (its tracepoints).
      NSEXEC="nsenter --net=/run/netns/$NS"
      kflags=(--sampler kernel --udp-listen 127.0.0.1:$UDP_PORT --xdp-iface lo --xdp-mode generic)
      if [ "$c" = kernel-port ]; then
        $NSEXEC "$B" backend --listen 127.0.0.1:$PORT --workers 4 >"$D/be.log" 2>&1 &
        BE=$!; PIDS+=("$BE"); sleep 0.5
        run_case "$c" "${kflags[@]}" --watch-port $PORT
        kill "$BE"; wait "$BE" 2>/dev/null || true
      else
        run_case "$c" "${kflags[@]}"
      fi
      ;;
    *) echo "unknown case $c"; exit 2 ;;
  esac
done
echo "kept in $OUT"
