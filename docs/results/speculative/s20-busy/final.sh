#!/bin/sh
# Stop 20 final measurement: same relative grid (fractions 0.85..1.05 of the system's
# formula capacity: one node 98.5, two nodes 197) for the single server and the 75/25 pair.
set -e
B=$1; OUT=$2
flock /tmp/farside-root.lock $B lab speculative --out $OUT/single --experiment single --accept-queues 64 \
  --rates 83.7,86.2,88.7,91.1,93.6,96.0,98.5,101.0,103.4 --duration-s 20 --repeat 2
flock /tmp/farside-root.lock $B lab speculative --out $OUT/split --experiment split --splits 75/25 \
  --systems spec32,spec32g --rates 167.5,172.4,177.3,182.2,187.2,192.1,197.0,201.9,206.9 --duration-s 20 --repeat 2
flock /tmp/farside-root.lock $B lab speculative --out $OUT/acc64 --experiment split --splits 75/25 \
  --systems acc64 --rates 246.3,295.6 --duration-s 20 --repeat 2
