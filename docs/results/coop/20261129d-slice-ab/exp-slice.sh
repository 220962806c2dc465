#!/usr/bin/env bash
# A/B: CFS bandwidth slice 5000 us (kernel default) vs 1000 us, W99 check config.
B=/root/.cache/ft-main/release/farside
cd /work/main
run() { name=$1; slice=$2; shift 2; echo "== $name slice $slice $(date -u +%T)"; echo $slice > /proc/sys/kernel/sched_cfs_bandwidth_slice_us; FREEZE_BUILDS=1 /work/wt/measure $B lab coop --nodes 4 --systems press-tcp,press-xdp,press-udp,press-shm --load closed --cache-bytes 7700000 --warmup-s 5 --duration-s 8 --repeat 3 --out /tmp/exp/$name > /tmp/exp/$name.out 2> /tmp/exp/$name.err; echo "exit $? $(date -u +%T)"; }
run base1 5000
run slice1 1000
run base2 5000
run slice2 1000
echo 5000 > /proc/sys/kernel/sched_cfs_bandwidth_slice_us
