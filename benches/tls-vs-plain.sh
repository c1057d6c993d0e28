#!/usr/bin/env bash
# Quire with TLS on every link against plaintext, same machine, same load, runs interleaved.
#
#   benches/tls-vs-plain.sh [--duration 15s] [--warmup 2s] [--rounds 3] [--size 1024]
#                           [--producers 4] [--batch 64] [--in-flight 4] [--rate R]
#                           [--dir PARENT] [--acl]
#
# --acl adds a third mode, acl: TLS with the brokers enforcing ACL entries
# (authorization = "acl"), the load produced by a user logged in with SCRAM-SHA-256 whose
# one entry lets it produce to the bench's topic; its ratios are printed against tls.
#
# Each run starts a fresh local cluster (quire cluster up --detach: 3 stores + 2 brokers on
# 127.0.0.1, data under PARENT, default ./target), with --tls or without, loads it with
# quire bench cluster --cluster-dir (closed loop, or --rate R messages/s), stops it and
# deletes its data. Runs go plain, TLS, plain, TLS ... for --rounds rounds. It prints every
# run, the median of each mode, and the ratios TLS / plaintext of throughput, p50, p99 and
# the servers' CPU microseconds per message. The last stdout line is one JSON object.
#
# Environment: QUIRE=path (a built quire; default target/release/quire, built if missing).
# Everything runs on 127.0.0.1; every wait is bounded (cluster up's --ready-timeout, the
# bench's own duration, cluster down's timeout); an exit, error or Ctrl-C stops the cluster
# it started and removes its directory.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"

usage() { sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "tls-vs-plain: error: $*" >&2; exit 1; }
note() { echo "== $*" >&2; }

DURATION=15s WARMUP=2s ROUNDS=3 SIZE=1024 PRODUCERS=4 BATCH=64 IN_FLIGHT=4 RATE="" PARENT="" MODES="plain tls"
while [ $# -gt 0 ]; do
  case $1 in
    --duration) DURATION=${2:?}; shift 2 ;;
    --warmup) WARMUP=${2:?}; shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --size) SIZE=${2:?}; shift 2 ;;
    --producers) PRODUCERS=${2:?}; shift 2 ;;
    --batch) BATCH=${2:?}; shift 2 ;;
    --in-flight) IN_FLIGHT=${2:?}; shift 2 ;;
    --rate) RATE=${2:?}; shift 2 ;;
    --dir) PARENT=${2:?}; shift 2 ;;
    --acl) MODES="plain tls acl"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
PARENT=${PARENT:-$REPO/target}
mkdir -p "$PARENT"
QUIRE=${QUIRE:-$REPO/target/release/quire}
if [ ! -x "$QUIRE" ]; then
  note "building quire (release)"
  (cd "$REPO" && cargo build --release --bin quire >&2)
fi

WORK=$(mktemp -d "$PARENT/tls-vs-plain.XXXXXX")
CLUSTER=""
cleanup() {
  if [ -n "$CLUSTER" ] && [ -f "$CLUSTER/cluster.json" ]; then
    "$QUIRE" cluster down --dir "$CLUSTER" --timeout 10s >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

RESULTS="$WORK/results.jsonl"
: > "$RESULTS"
run() { # $1: plain|tls|acl, $2: round
  local mode=$1 round=$2 tls_up=() tls_client=() acl_env=()
  CLUSTER="$WORK/$mode-$round"
  if [ "$mode" != plain ]; then
    tls_up=(--tls)
    tls_client=(--tls-ca "$CLUSTER/tls/ca.pem" --tls-cert "$CLUSTER/tls/client.pem"
                --tls-key "$CLUSTER/tls/client.key")
  fi
  [ "$mode" = acl ] && acl_env=(QUIRE_BROKER_AUTHORIZATION=acl QUIRE_BROKER_SUPER_USERS=client)
  env "${acl_env[@]}" "$QUIRE" cluster up --detach --dir "$CLUSTER" --ready-timeout 30s "${tls_up[@]}" >/dev/null
  local brokers
  brokers=$(python3 -c 'import json,sys; print(",".join(json.load(open(sys.argv[1]))["brokers"]))' \
    "$CLUSTER/cluster.json")
  local rate=()
  [ -n "$RATE" ] && rate=(--rate "$RATE")
  if [ "$mode" = acl ]; then
    # The certificate "client" is the super user: it adds the user the load runs as.
    QUIRE_NEW_PASSWORD=bench-pw "$QUIRE" user add bencher --brokers "$brokers" "${tls_client[@]}" >/dev/null
    "$QUIRE" acl add --principal bencher --operation produce --topic bench \
      --brokers "$brokers" "${tls_client[@]}" >/dev/null
    tls_client=(--tls-ca "$CLUSTER/tls/ca.pem" --user bencher)
    export QUIRE_PASSWORD=bench-pw
  fi
  note "round $round: $mode"
  "$QUIRE" bench cluster --brokers "$brokers" "${tls_client[@]}" --producers "$PRODUCERS" \
    --event-size "$SIZE" --batch "$BATCH" --in-flight "$IN_FLIGHT" --duration "$DURATION" \
    --warmup "$WARMUP" --cluster-dir "$CLUSTER" "${rate[@]}" --format json \
    | tail -n 1 | python3 -c 'import json,sys; r=json.load(sys.stdin); r["tls_mode"]=sys.argv[1]; print(json.dumps(r))' "$mode" \
    >> "$RESULTS"
  unset QUIRE_PASSWORD
  "$QUIRE" cluster down --dir "$CLUSTER" --timeout 10s >/dev/null
  rm -rf "$CLUSTER"
  CLUSTER=""
}

for round in $(seq 1 "$ROUNDS"); do
  for mode in $MODES; do
    run "$mode" "$round"
  done
done

python3 - "$RESULTS" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
fields = ["ops_per_s", "p50_us", "p99_us", "servers_cpu_us_per_msg"]
print(f"{'mode':6} {'msgs/s':>10} {'p50 us':>9} {'p99 us':>9} {'server CPU-us/msg':>18}")
for r in runs:
    print(f"{r['tls_mode']:6} {r['ops_per_s']:10.0f} {r['p50_us']:9d} {r['p99_us']:9d} {r['servers_cpu_us_per_msg'] or 0:18.2f}")
modes = [m for m in ("plain", "tls", "acl") if any(r['tls_mode'] == m for r in runs)]
med = {m: {f: statistics.median(r[f] or 0 for r in runs if r['tls_mode'] == m) for f in fields}
       for m in modes}
for m in modes:
    v = med[m]
    print(f"median {m:6} {v['ops_per_s']:10.0f} msgs/s  p50 {v['p50_us']:.0f} us  p99 {v['p99_us']:.0f} us  {v['servers_cpu_us_per_msg']:.2f} CPU-us/msg")
def ratios(a, b):
    return {f: (med[a][f] / med[b][f] if med[b][f] else None) for f in fields}
ratio = ratios('tls', 'plain')
print("tls / plain: " + "  ".join(f"{f} {ratio[f]:.3f}" for f in fields if ratio[f] is not None))
out = {"bench": "tls-vs-plain", "runs": runs, "median": med, "ratio_tls_over_plain": ratio}
if "acl" in modes:
    acl = ratios('acl', 'tls')
    print("acl / tls:   " + "  ".join(f"{f} {acl[f]:.3f}" for f in fields if acl[f] is not None))
    out["ratio_acl_over_tls"] = acl
print(json.dumps(out))
EOF
