#!/bin/sh
# Renice every thread of every running `farside specd` to $1 until killed.
N=$1
while true; do
  for p in $(pgrep -f "farside.* specd"); do
    for t in /proc/$p/task/*; do
      tid=${t##*/}
      cur=$(awk '{print $19}' $t/stat 2>/dev/null)
      [ "$cur" = "$N" ] || renice -n $N -p $tid >/dev/null 2>&1
    done
  done
  sleep 0.3
done
