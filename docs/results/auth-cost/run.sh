#!/bin/bash
# Before/after runs of the cost of authentication, interleaved: every metric is
# measured for each build in turn, ROUNDS times; the whole call runs under /work/wt/measure
# (one lab measurement on the host at a time). Usage:
#   /work/wt/measure run.sh OUT_DIR METRIC ROUNDS VARIANT=BIN_DIR...
# METRIC: xdp | monitor | probe | migrate | softirq, or several, comma-separated. BIN_DIR
# holds the variant's binaries: xdp-perf (crates/xdp/tests/perf.rs), bench_monitor,
# farside, migrate_many. PROBE_SAMPLES (default 5000): samples per probe point.
# softirq: the monitor's CPU with the kernel's receive cost beside it (bench_monitor
# --pin: pollers on CPU 0, responders on CPU 1), unicast and group, 64 and 1,024 back-ends.
set -u
out=$1 metrics=$2 rounds=$3
shift 3
mkdir -p "$out"
for metric in ${metrics//,/ }; do
for r in $(seq 1 "$rounds"); do
	for v in "$@"; do
		name=${v%%=*} bin=${v#*=}
		f="$out/$metric-$name-$r.txt"
		echo "# $metric $name round $r, $(date -u +%FT%TZ)" > "$f"
		case $metric in
		xdp)
			(cd /work/wt/authcost/crates/xdp && "$bin/xdp-perf" --nocapture) >> "$f" 2>&1 ;;
		monitor)
			"$bin/bench_monitor" --backends 64 --seconds 3 --only unicast:udp >> "$f" 2>&1 ;;
		probe)
			"$bin/farside" lab probe --hosts netns --transports icmp,udp,xdp \
				--loads 0 --sizes 192 --samples "${PROBE_SAMPLES:-5000}" --flood-s 0 \
				--out "$out/probe-$name-$r" >> "$f" 2>&1 ;;
		softirq)
			"$bin/bench_monitor" --backends 64,1024 --seconds 10 --group --pin >> "$f" 2>&1 ;;
		migrate)
			flag=; [ "$name" = after ] && flag=--auth
			"$bin/migrate_many" --connections 2000 --concurrency 4 --small $flag \
				--out "$out/migrate-$name-$r.json" >> "$f" 2>&1 ;;
		esac
		echo "# exit $?" >> "$f"
	done
done
done
