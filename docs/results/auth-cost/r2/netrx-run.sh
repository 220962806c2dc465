#!/bin/bash
# What made r2/netrx-*: three rounds of the NET_RX tracepoint measurement, rows interleaved.
B=${1:?BIN_DIR}
for r in 1 2 3; do
	for row in "64 unicast" "256 unicast" "256 group"; do
		set -- $row
		../netrx.sh "netrx-$1-$2-$r" "$B" "$1" "$2" 4
	done
done
