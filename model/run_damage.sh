#!/bin/sh
# Run every configuration of quire_mc_damage.py (damaged records, issue 15); one log per
# configuration in ./out/. About 15 CPU-minutes, most of it the two K=3 runs (damage-base
# completes at 1,846,499 states; the mutant is stopped at 3,000,000).
cd "$(dirname "$0")" && mkdir -p out
run() {
  echo "== $1"
  python3 quire_mc_damage.py "$@" > "out/damage-$1.txt" 2>&1
  grep -E '^states|VIOLATED|no property' "out/damage-$1.txt"
}
run damage-tiny
run damage-d2
run damage-v2
run damage-base --max-states 3000000
run mut-damaged-absent
run mut-repair-any --max-states 3000000
