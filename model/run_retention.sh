#!/bin/sh
# The retention configurations of quire_mc_retention.py, one at a time; logs in ./out/.
# Single-threaded CPython 3.11 on the 2-core CI machine: about 25 CPU-minutes in all
# (retention-fix-k3-known is capped at 1.5 million states: INCOMPLETE by design).
cd "$(dirname "$0")" && mkdir -p out
run() { c=$1; shift; echo "== $c $*"; timeout 900 python3 quire_mc_retention.py "$c" "$@" > "out/$c.txt" 2>&1; grep -E '^states|VIOLATED|no property|observ' "out/$c.txt"; }
run retention-nofix --max-states 2000000
run retention-fix --max-states 2000000
run retention-fix-k3-known --max-states 1500000
run mut-trim-unstabilized --max-states 1500000
run mut-start-any-checkpoint
run retention-fix-parts
run mut-parts-above-before
python3 quire_mc_retention.py --replay retention-fix-k4 scenarios/r1-hidden-divergence.txt | tail -3
python3 quire_mc_retention.py --replay retention-fix-k4-known scenarios/r1-hidden-divergence.txt | tail -3
