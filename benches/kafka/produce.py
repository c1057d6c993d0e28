"""librdkafka (confluent-kafka) produce load for benches/kafka-vs-native.sh.

Produces MESSAGES of SIZE bytes with acks=all to TOPIC for DURATION seconds (after WARMUP
seconds not counted), records each message's delivery latency (produce() call to delivery
report), and prints one JSON object: ops_per_s, p50_us, p99_us, delivered, failed.
Every wait is bounded: flush() at the end waits at most 30 s.

Usage: python3 produce.py BOOTSTRAP TOPIC SIZE DURATION_S WARMUP_S [QUEUE [BATCH]]

QUEUE: librdkafka's queue.buffering.max.messages, the messages queued or in flight at most
(default 1024, the native run's window: 4 producers x 4 batches x 64). BATCH: librdkafka's
batch.num.messages (default 10000, librdkafka's).
"""
import json
import sys
import time

from confluent_kafka import Producer

bootstrap, topic = sys.argv[1], sys.argv[2]
size, duration, warmup = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
queue = int(sys.argv[6]) if len(sys.argv) > 6 else 1024
batch = int(sys.argv[7]) if len(sys.argv) > 7 else 10000
payload = b"x" * size
latencies = []
counted = {"ok": 0, "failed": 0}
start = time.monotonic()
measure_from = start + warmup
measure_to = measure_from + duration


def report(err, msg, sent):
    now = time.monotonic()
    if err is not None:
        counted["failed"] += 1
        return
    if measure_from <= sent and now <= measure_to:
        counted["ok"] += 1
        latencies.append(now - sent)


p = Producer({
    "bootstrap.servers": bootstrap,
    "acks": "all",
    "enable.idempotence": False,  # not served yet (docs/kafka.md)
    "linger.ms": 5,
    # By default at most 1,024 messages queued or in flight, as the native run's window:
    # latency is then the broker's, not time spent in a deep client queue.
    "queue.buffering.max.messages": queue,
    "batch.num.messages": batch,
    "message.timeout.ms": 30000,
})
while True:
    now = time.monotonic()
    if now >= measure_to:
        break
    try:
        p.produce(topic, payload, on_delivery=lambda e, m, s=now: report(e, m, s))
    except BufferError:
        p.poll(0.001)
        continue
    p.poll(0)
left = p.flush(30)
latencies.sort()


def pct(q):
    return int(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e6) if latencies else 0


print(json.dumps({
    "ops_per_s": counted["ok"] / duration,
    "p50_us": pct(0.50),
    "p99_us": pct(0.99),
    "delivered": counted["ok"],
    "failed": counted["failed"],
    "unflushed": left,
}))
