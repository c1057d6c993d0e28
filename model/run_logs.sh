#!/bin/sh
# Run every configuration of quire_mc_logs.py; one log per configuration in ./out/.
# The design's configurations search their whole space; a mutant's stops at the first
# violation of the property it must break (its shortest trace is then known).
cd "$(dirname "$0")" && mkdir -p out
run() {
  echo "== $1"
  python3 quire_mc_logs.py "$@" > "out/$1.txt" 2>&1
  grep -E '^states|VIOLATED|no property' "out/$1.txt"
}
run logs-tiny
run logs-restart
run logs-values
run logs-base --max-states 4000000
run mut-shared-promise --stop-at P7
run mut-promise-one-slot --stop-at "P1,P2,P4'"
