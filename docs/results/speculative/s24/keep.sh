#!/bin/sh
# keep.sh SRC_DIR DEST_DIR: the result files behind the figures (as in s23: points, summaries, tables, front-end logs, specd summaries)
SRC=$1; DST=$2
for d in $SRC/*/; do
  n=$(basename $d); mkdir -p $DST/$n
  for f in points.jsonl summary.json speculative.csv table.txt; do [ -f $d/$f ] && cp $d/$f $DST/$n/; done
  if [ -d $d/logs ]; then mkdir -p $DST/$n/logs; cp $d/logs/*frontend.log $d/logs/*specd*.json $DST/$n/logs/ 2>/dev/null; fi
done
cp $SRC/*.log $DST/ 2>/dev/null
true
