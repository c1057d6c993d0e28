#!/usr/bin/env bash
# The Kafka listener against the native client, same cluster, same run (issue 14).
#
#   benches/kafka-vs-native.sh [--duration 10s] [--warmup 2s] [--rounds 2] [--size 1024]
#                              [--kafka-queue 1024] [--kafka-batch 256] [--client c|python]
#                              [--dir PARENT]
#
# Starts one local cluster (quire cluster up --detach: 3 stores + 2 brokers on 127.0.0.1,
# each broker with a Kafka listener), then alternates, --rounds times: the native client
# (quire bench cluster: 4 producers, batches of 64, 4 in flight) and librdkafka (one
# producer, acks=all, linger.ms=5, at most --kafka-queue messages queued or in flight: by
# default 1,024, the native run's window; batches of at most --kafka-batch messages: by
# default 256, a quarter of the window, as each native producer's 4 batches in flight),
# each producing SIZE-byte messages for --duration after --warmup, to a
# topic of its own. Prints every run, the medians and the ratio kafka / native of
# throughput, p50 and p99 (acked messages; latency from send to stabilized ack or
# delivery report). The last stdout line is one JSON object.
#
# Why --kafka-batch: librdkafka's own default (batch.num.messages 10,000) is larger than the
# whole window, so no batch ever fills, each waits out linger.ms, and the run measures the
# linger rather than the broker (about 0.8 of native instead of 0.9+; --kafka-batch 10000
# shows it).
#
# The librdkafka client is, with --client c (the default), benches/kafka/produce.c built
# here with cc against the system's librdkafka (Debian: apt-get install librdkafka-dev);
# with --client python, benches/kafka/produce.py on confluent-kafka (pip install
# confluent-kafka), whose interpreter costs a few microseconds a message on a core the
# cluster shares: on 2 cores it, not the listener, bounds the Kafka run.
#
# Disk: the 3 stores keep every message, about 0.16 GB per store and second of each run at
# 1 KiB: some 14 GB per default round; the script warns when less is free.
#
# Environment: QUIRE=path (a built quire; default target/release/quire, built if missing);
# PYTHON=path (default python3). Everything runs on
# 127.0.0.1; every wait is bounded; an exit or Ctrl-C stops the cluster and removes it.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
usage() { sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "kafka-vs-native: error: $*" >&2; exit 1; }
note() { echo "== $*" >&2; }

DURATION=10 WARMUP=2 ROUNDS=2 SIZE=1024 QUEUE=1024 BATCH=256 PARENT="" CLIENT=c
PYTHON=${PYTHON:-python3}
secs() { local v=${1%s}; [[ "$v" =~ ^[0-9]+$ ]] || die "durations are whole seconds (10s), not $1"; echo "$v"; }
while [ $# -gt 0 ]; do
  case $1 in
    --duration) DURATION=$(secs "${2:?}"); shift 2 ;;
    --warmup) WARMUP=$(secs "${2:?}"); shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --size) SIZE=${2:?}; shift 2 ;;
    --kafka-queue) QUEUE=${2:?}; shift 2 ;;
    --kafka-batch) BATCH=${2:?}; shift 2 ;;
    --client) CLIENT=${2:?}; shift 2 ;;
    --dir) PARENT=${2:?}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
case $CLIENT in
  c) [ -f /usr/include/librdkafka/rdkafka.h ] || die "--client c needs librdkafka's headers (Debian: apt-get install librdkafka-dev), or use --client python" ;;
  python) "$PYTHON" -c 'import confluent_kafka' 2>/dev/null || die "$PYTHON needs confluent-kafka (pip install confluent-kafka)" ;;
  *) die "--client is c or python, not $CLIENT" ;;
esac
PARENT=${PARENT:-$REPO/target}
mkdir -p "$PARENT"
QUIRE=${QUIRE:-$REPO/target/release/quire}
if [ ! -x "$QUIRE" ]; then
  note "building quire (release)"
  (cd "$REPO" && cargo build --release --bin quire >&2)
fi
# Every message is kept by each of the 3 stores: about 0.16 GB per store and second of a
# run at 1 KiB (measured: 3 rounds of 12 s wrote 35 GB). A full disk fails the produces
# (nothing acknowledged is lost), and the figures with them: say so before starting.
NEED_GB=$(( ROUNDS * 2 * (DURATION + WARMUP) * 3 * 16 / 100 + 1 ))
FREE_GB=$(df -BG --output=avail "$PARENT" | tail -n 1 | tr -dc 0-9)
if [ "${FREE_GB:-0}" -lt "$NEED_GB" ]; then
  note "warning: $FREE_GB GB free under $PARENT; this run may write about $NEED_GB GB (fewer --rounds or a shorter --duration write less)"
fi
WORK=$(mktemp -d "$PARENT/kafka-vs-native.XXXXXX")
CLUSTER="$WORK/cluster"
cleanup() {
  [ -f "$CLUSTER/cluster.json" ] && "$QUIRE" cluster down --dir "$CLUSTER" --timeout 10s >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if [ "$CLIENT" = c ]; then
  cc -O2 -o "$WORK/produce" "$HERE/kafka/produce.c" -lrdkafka || die "cannot build benches/kafka/produce.c"
  KAFKA_LOAD=("$WORK/produce")
else
  KAFKA_LOAD=("$PYTHON" "$HERE/kafka/produce.py")
fi

"$QUIRE" cluster up --detach --dir "$CLUSTER" --ready-timeout 30s >/dev/null
read -r BROKERS KAFKA < <(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(",".join(c["brokers"]), ",".join(c["kafka"]))' "$CLUSTER/cluster.json")
[ -n "$KAFKA" ] || die "the cluster has no Kafka listeners"
RESULTS="$WORK/results.jsonl"
: > "$RESULTS"
for round in $(seq 1 "$ROUNDS"); do
  note "round $round: native"
  timeout $((DURATION + WARMUP + 60)) "$QUIRE" bench cluster --brokers "$BROKERS" --topic "native-$round" \
    --producers 4 --event-size "$SIZE" --batch 64 --in-flight 4 --duration "${DURATION}s" \
    --warmup "${WARMUP}s" --format json \
    | tail -n 1 | python3 -c 'import json,sys; r=json.load(sys.stdin); print(json.dumps({"mode":"native","ops_per_s":r["ops_per_s"],"p50_us":r["p50_us"],"p99_us":r["p99_us"]}))' >> "$RESULTS"
  note "round $round: kafka (librdkafka, $CLIENT)"
  timeout $((DURATION + WARMUP + 60)) "${KAFKA_LOAD[@]}" "$KAFKA" "kafka-$round" "$SIZE" "$DURATION" "$WARMUP" "$QUEUE" "$BATCH" \
    | tail -n 1 | python3 -c 'import json,sys; r=json.load(sys.stdin); r["mode"]="kafka"; print(json.dumps(r))' >> "$RESULTS"
done

python3 - "$RESULTS" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
fields = ["ops_per_s", "p50_us", "p99_us"]
print(f"{'mode':7} {'msgs/s':>10} {'p50 us':>9} {'p99 us':>9}")
for r in runs:
    print(f"{r['mode']:7} {r['ops_per_s']:10.0f} {r['p50_us']:9d} {r['p99_us']:9d}" + (f"  failed {r['failed']}" if r.get('failed') else ""))
med = {m: {f: statistics.median(r[f] for r in runs if r['mode'] == m) for f in fields} for m in ("native", "kafka")}
for m, v in med.items():
    print(f"median {m:7} {v['ops_per_s']:10.0f} msgs/s  p50 {v['p50_us']:.0f} us  p99 {v['p99_us']:.0f} us")
ratio = {f: med['kafka'][f] / med['native'][f] if med['native'][f] else None for f in fields}
print("kafka / native: " + "  ".join(f"{f} {ratio[f]:.3f}" for f in fields if ratio[f] is not None))
print(json.dumps({"bench": "kafka-vs-native", "runs": runs, "median": med, "ratio_kafka_over_native": ratio}))
PY
