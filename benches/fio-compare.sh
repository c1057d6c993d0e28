#!/usr/bin/env bash
# Runs fio and `quire bench disk` with the same parameters on the same directory, one
# case after the other, and prints both figures and their ratio (quire / fio).
#
#   benches/fio-compare.sh [DIR]
#
# DIR defaults to a new directory under ./target (a disk-backed file system; /tmp may be
# tmpfs elsewhere). Environment:
#   DURATION=5         seconds per run (each case runs fio, then quire)
#   REPEAT=5           rounds; each round runs every case once with each tool, back to
#                      back, so both see the same background load; the table shows medians
#                      over the rounds and each round's ratio (the machine may be shared)
#   FILE_MIB=1024      size of each bench file in MiB (both tools prefill theirs first)
#   CASES="256KiB:1:every 64KiB:32:none 4KiB:1:every"   block size : queue depth : fsync
#   QUIRE=path         a built `quire` binary (default: cargo build --release, then use it)
#
# Both tools write sequentially with O_DIRECT through io_uring into a file that was fully
# written and fdatasynced beforehand, wrapping at its end:
#   fio  --ioengine=io_uring --direct=1 --rw=write --bs=B --iodepth=N [--fdatasync=1]
#        --time_based --runtime=D --fallocate=none --scramble_buffers=0, on a file
#        prefilled with dd. fio fills its buffers with random bytes once, like quire;
#        scramble_buffers=0 stops it from rewriting part of every buffer before each write,
#        CPU work that cost fio up to a third of its 64 KiB qd 32 throughput on this 2-core
#        machine and is no part of what the disk can do.
#   quire bench disk --block-size B --qd N --fsync every|none --duration D --file-size S
# With fsync every, fio submits the write and then the fdatasync (not linked); quire links
# the fdatasync behind its write (IOSQE_IO_LINK). Latency: fio's write latency (lat, i.e.
# submission + completion) and its sync latency are reported apart; quire's op latency
# covers write + fdatasync together, from before submission to the last completion.
# MB = 10^6 bytes everywhere.
set -euo pipefail

cd "$(dirname "$0")/.."

DURATION=${DURATION:-5}
REPEAT=${REPEAT:-5}
FILE_MIB=${FILE_MIB:-1024}
CASES=${CASES:-"256KiB:1:every 64KiB:32:none 4KiB:1:every"}

if ! command -v fio >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "fio is missing: installing the Debian package" >&2
    apt-get update -qq && apt-get install -y -qq fio >/dev/null
  else
    echo "fio is required: install it with 'sudo apt-get install fio' (Debian/Ubuntu)" \
      "or your distribution's fio package" >&2
    exit 1
  fi
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "python3 is required to read fio's JSON output" >&2
  exit 1
fi

if [ -z "${QUIRE:-}" ]; then
  cargo build --release -q -p quire-tools --bin quire
  QUIRE="${CARGO_TARGET_DIR:-target}/release/quire"
fi

DIR=${1:-}
if [ -z "$DIR" ]; then
  mkdir -p target
  DIR=$(mktemp -d "$PWD/target/fio-compare.XXXXXX")
  REMOVE_DIR=1
fi
WORK=$(mktemp -d)
FIO_FILE="$DIR/fio-compare.$$.dat"
cleanup() {
  rm -f "$FIO_FILE"
  rm -rf "$WORK"
  if [ -n "${REMOVE_DIR:-}" ]; then rmdir "$DIR" 2>/dev/null || true; fi
}
trap cleanup EXIT

FILE_BYTES=$((FILE_MIB * 1024 * 1024))
FSTYPE=$(findmnt -n -o FSTYPE --target "$DIR" 2>/dev/null || stat -f -c %T "$DIR")
echo "fio-compare: dir $DIR ($FSTYPE), file ${FILE_MIB} MiB, ${DURATION} s per run," \
  "$REPEAT rounds, $(fio --version), quire $("$QUIRE" --version | cut -d' ' -f2)," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

to_bytes() { # 256KiB -> 262144 (binary suffixes only, as the cases use)
  local v=$1
  case $v in
    *KiB) echo $(( ${v%KiB} * 1024 )) ;;
    *MiB) echo $(( ${v%MiB} * 1024 * 1024 )) ;;
    *) echo "$v" ;;
  esac
}

for round in $(seq 1 "$REPEAT"); do
  for case_spec in $CASES; do
    IFS=: read -r bs qd fsync <<<"$case_spec"
    bs_bytes=$(to_bytes "$bs")
    name="$bs qd$qd fsync=$fsync"
    fsync_opt=()
    if [ "$fsync" = every ]; then fsync_opt=(--fdatasync=1); fi

    echo "== round $round: $name: fio" >&2
    dd if=/dev/zero of="$FIO_FILE" bs=1M count="$FILE_MIB" oflag=direct conv=fsync status=none
    fio --name=fio-compare --filename="$FIO_FILE" --size="$FILE_BYTES" \
      --ioengine=io_uring --direct=1 --rw=write --bs="$bs_bytes" --iodepth="$qd" \
      "${fsync_opt[@]}" --time_based --runtime="$DURATION" --fallocate=none \
      --scramble_buffers=0 --lat_percentiles=1 \
      --output-format=json >"$WORK/fio.$round.$bs.$qd.$fsync.json"
    rm -f "$FIO_FILE"

    echo "== round $round: $name: quire" >&2
    "$QUIRE" -q bench disk --dir "$DIR" --block-size "$bs" --qd "$qd" --fsync "$fsync" \
      --duration "$DURATION" --file-size "$FILE_BYTES" --format json \
      >"$WORK/quire.$round.$bs.$qd.$fsync.json"
    echo "$name|$WORK/fio.$round.$bs.$qd.$fsync.json|$WORK/quire.$round.$bs.$qd.$fsync.json" >>"$WORK/index"
  done
done

echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$WORK/index" <<'PY'
import json, statistics, sys

def fio_figures(path):
    job = json.load(open(path))["jobs"][0]
    w = job["write"]
    runtime_s = job["job_runtime"] / 1000.0
    sync = job.get("sync", {}).get("lat_ns", {})
    # Total latency (submission + completion), as quire measures; clat alone starts after
    # io_uring_enter returned and misses the block-layer submission inside it.
    pct = w.get("lat_ns", {}).get("percentile") or w["clat_ns"].get("percentile", {})
    return {
        "mb_per_s": w["bw_bytes"] / 1e6,
        "ops_per_s": w["iops"],
        "fsyncs_per_s": sync.get("N", 0) / runtime_s if runtime_s else 0.0,
        "p50_us": pct.get("50.000000", 0) / 1000.0,
        "p99_us": pct.get("99.000000", 0) / 1000.0,
        "sync_p50_us": sync.get("percentile", {}).get("50.000000", 0) / 1000.0,
    }

cases = {}
for line in open(sys.argv[1]):
    name, fio_path, quire_path = line.rstrip("\n").split("|")
    case = cases.setdefault(name, {"fio": [], "quire": []})
    case["fio"].append(fio_figures(fio_path))
    case["quire"].append(json.load(open(quire_path)))

def med(runs, key):
    return statistics.median(r[key] for r in runs)

def ratio(a, b):
    return a / b if b else float("nan")

print(f"{'case':<22} {'fio MB/s':>9} {'quire MB/s':>10} {'ratio':>6} {'med.r':>6} {'rounds':>26} "
      f"{'fio IOPS':>9} {'quire IOPS':>10} {'fio fsync/s':>11} {'quire fsync/s':>13} "
      f"{'fio p50/p99 write; sync p50 (us)':>33} {'quire p50/p99 op (us)':>22}")
backends = set()
for name, case in cases.items():
    f, q = case["fio"], case["quire"]
    backends |= {r["backend"] for r in q}
    ratios = [ratio(b["mb_per_s"], a["mb_per_s"]) for a, b in zip(f, q)]
    per_round = ",".join(f"{r:.2f}" for r in ratios)
    fio_lat = f"{med(f, 'p50_us'):.0f}/{med(f, 'p99_us'):.0f}; {med(f, 'sync_p50_us'):.0f}"
    quire_lat = f"{med(q, 'p50_us'):.0f}/{med(q, 'p99_us'):.0f}"
    print(f"{name:<22} {med(f, 'mb_per_s'):>9.1f} {med(q, 'mb_per_s'):>10.1f} "
          f"{ratio(med(q, 'mb_per_s'), med(f, 'mb_per_s')):>6.2f} "
          f"{statistics.median(ratios):>6.2f} {per_round:>26} "
          f"{med(f, 'ops_per_s'):>9.0f} {med(q, 'ops_per_s'):>10.0f} "
          f"{med(f, 'fsyncs_per_s'):>11.0f} {med(q, 'fsyncs_per_s'):>13.0f} "
          f"{fio_lat:>33} {quire_lat:>22}")
print()
print("per round, MB/s fio -> quire:")
for name, case in cases.items():
    pairs = "  ".join(f"{a['mb_per_s']:.0f}->{b['mb_per_s']:.0f}" for a, b in zip(case["fio"], case["quire"]))
    print(f"  {name:<22} {pairs}")
print("medians over the rounds; ratio = median quire MB/s / median fio MB/s; med.r = median "
      "of the rounds' ratios; rounds = each round's ratio; "
      "MB = 10^6 bytes; quire backend: " + ", ".join(sorted(backends)))
PY
