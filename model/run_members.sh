#!/bin/sh
# Voter-set changes (issue 15 item 2): quire_mc_members.py as copied from shared/model/, and
# its extension quire_mc_members_x.py (wiped stores replaced through changes, snapshot start
# positions, damaged entries repaired before a store votes again). Every run's output goes
# to ./out/members-NAME.txt; the script checks each result against what it must be and
# exits 1 on the first that differs.
#
#   sh run_members.sh quick   about 1 CPU-minute, under 300 MB; tests/tests/model_members.rs
#                             runs it in CI: the m1, m4 and snapshot replays (each mutant
#                             must break a property, the rule as built must block the
#                             scenario), the wipe and damage mutants by search, the smallest
#                             original configuration and the smallest combined extension.
#   sh run_members.sh full    about 40 CPU-minutes and 6 GB of memory (k2m2v1 alone takes 13
#                             minutes and 5.6 GB): every K=2 configuration of the original,
#                             mutants m2 and m3 by search, every extension configuration.
#                             Results are in docs/protocol.md, "Membership changes".
set -u
cd "$(dirname "$0")" && mkdir -p out
mode=${1:-quick}
failed=0

# run EXPECT FILE CONFIG [ARGS...]: EXPECT is "safe" (no property violated), "violated",
# "blocked" (a replay that must not be playable) or "broken" (a replay that must break a
# property); a "safe" run also names the goals it must reach after the arguments, as
# goal:NAME.
run() {
  expect=$1 file=$2 config=$3
  shift 3
  args="" goals=""
  for a in "$@"; do
    case $a in
      goal:*) goals="$goals ${a#goal:}" ;;
      *) args="$args $a" ;;
    esac
  done
  log="out/members-$config$(echo "$args" | tr ' /' '_-').txt"
  start=$(date +%s)
  # shellcheck disable=SC2086
  python3 "$file" "$config" $args > "$log" 2>&1
  took=$(( $(date +%s) - start ))
  ok=1
  case $expect in
    safe) grep -q '^no property violated' "$log" || ok=0 ;;
    violated) grep -q 'VIOLATED' "$log" || ok=0 ;;
    blocked) grep -q 'BLOCKED' "$log" || ok=0 ;;
    broken) grep -q 'a property was violated' "$log" || ok=0 ;;
  esac
  for g in $goals; do
    grep -q "^goals reached:.*\\b$g\\b" "$log" || ok=0
  done
  summary=$(grep -E '^states|VIOLATED|BLOCKED|property was violated|^goals' "$log" | head -3 | tr '\n' ' ')
  if [ $ok = 1 ]; then
    echo "ok    $expect  $config$args (${took}s): $summary"
  else
    echo "FAIL  expected $expect$goals: $config$args (${took}s): $summary (see model/$log)"
    failed=1
  fi
}

orig=quire_mc_members.py
ext=quire_mc_members_x.py

# The hand-built counterexamples: each mutant breaks P1; the rules as built block them.
run broken  $orig m1-k3m3v0 --replay scenarios/m1.txt
run blocked $orig k3m3v0 --replay scenarios/m1.txt
run broken  $orig m4-k3m2v0 --replay scenarios/m4.txt
run blocked $orig k3m2v0 --replay scenarios/m4.txt
run broken  $ext mut-snap-unstable --replay scenarios/x-snap-unstable.txt
run blocked $ext snap-k3m0v1 --replay scenarios/x-snap-unstable.txt
# Mutants by search (stopped at the first violation: its trace is a shortest one).
run violated $ext mut-wipe-rejoin --first
run violated $ext mut-damaged-absent --first
# The smallest configurations, exhaustive.
run safe $orig k2m1v0
run safe $ext snap-k2m0v0 goal:snap-voter
run safe $ext damage-k2m0v0 goal:voted-after-repair

if [ "$mode" = full ]; then
  run violated $ext m2-k2m2v0 --first
  run violated $ext m3-k2m2v0 --first
  run safe $orig k2m1v1
  run safe $orig k2m2v0
  run safe $orig k2m2v1
  run safe $ext wipe-k2m1v0
  run safe $ext replace-k2m2v0 goal:replaced
  run safe $ext snap-k2m1v0 goal:snap-voter
  run safe $ext all-k2m0v0 goal:voted-after-repair goal:snap-voter
  run safe $ext damage-k2m1v0 --max-states 5000000 goal:voted-after-repair
fi
exit $failed
