"""confluent-kafka (librdkafka) scenarios for tests/tests/proc_kafka.rs.

Each subcommand runs one scenario against Quire's Kafka listeners and prints one JSON
object on its last stdout line; the Rust test asserts on it. Every wait is bounded.

  idempotent BOOTSTRAP TOPIC N
      Produces the values "0".."N-1" with enable.idempotence=true (acks=all, up to 5
      requests in flight per connection) and prints "HALF" once N/2 are acknowledged, so
      the caller can kill the master mid-stream. Result: delivered, failed, errors.

  group-three BOOTSTRAP GROUP N TOPIC...
      Three members of GROUP subscribe to the topics (one partition each). Waits until each
      member holds one partition, prints "READY" (the caller then produces N records to
      each topic), reads N records of each, commits them, checks
      DescribeGroups (Stable, three members) and ListGroups, closes one member and waits
      until the other two hold every partition. Result: assignments, values read per
      topic, describe and list results.

  admin BOOTSTRAP
      The admin client: CreateTopics (one partition; three; with a topic setting; again;
      validate-only), DescribeConfigs, DescribeCluster, CreatePartitions, DeleteTopics
      (a topic created, a missing one), and the topic list before and after. Result: each
      call's outcome, "OK" or the Kafka error's name.

  times BOOTSTRAP
      100 records to topic timed with timestamps 1,000 s apart, each followed by a record
      to topic untimed; then offsets_for_times (ListOffsets by timestamp) for times before,
      between, at and after them, the record with the largest timestamp (the admin
      client's list_offsets, ListOffsets -3), and a consumer placed past the end (reset to
      the first record). Result: for each, the offset found and the offset expected (from the
      delivery reports).

  live-tail BOOTSTRAP SECONDS
      A consumer reads topic tail-a from its end while a producer writes tail-b, tail-b,
      tail-a every 10 ms, so each fetch of tail-a scans past tail-b's records. Result:
      records read and errors the consumer was given.

  group-resume BOOTSTRAP GROUP N TOPIC...
      One member of GROUP reads N records of each topic from the group's committed
      offsets. Result: values read per topic, and any read past N within 3 s.
"""
import json
import sys
import threading
import time

from confluent_kafka import (
    OFFSET_END,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)

BOUND_S = 60


def idempotent(bootstrap, topic, n):
    p = Producer({
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "linger.ms": 5,
        # Short, so that a request the broker holds (no quorum) is sent again.
        "request.timeout.ms": 1500,
        "message.timeout.ms": 60000,
        "socket.timeout.ms": 10000,
    })
    res = {"delivered": 0, "failed": 0, "errors": {}}
    half = {"said": False}

    def report(err, _msg):
        if err:
            res["failed"] += 1
            res["errors"][str(err)] = res["errors"].get(str(err), 0) + 1
        else:
            res["delivered"] += 1
            if not half["said"] and res["delivered"] >= n // 2:
                half["said"] = True
                print("HALF", flush=True)

    for i in range(n):
        while True:
            try:
                p.produce(topic, value=str(i).encode(), on_delivery=report)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    left = p.flush(BOUND_S * 2)
    res["undelivered"] = left
    return res


def consumer(bootstrap, group, client_id):
    return Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": client_id,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        # Range (the default's first choice) gives every topic's one partition to the same
        # member; round-robin spreads them.
        "partition.assignment.strategy": "roundrobin",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "socket.timeout.ms": 10000,
    })


class Member:
    """One group member, polled on its own thread until closed. librdkafka calls block
    while another thread polls the same consumer, so everything runs on that thread: the
    assignment is tracked by the rebalance callbacks, and a commit is asked for."""

    def __init__(self, bootstrap, group, name, topics):
        self.c = consumer(bootstrap, group, name)
        self.values = {t: [] for t in topics}
        self.assigned = []
        self.errors = []
        self.stop = threading.Event()
        self.commit_asked = threading.Event()
        self.committed = threading.Event()
        self.c.subscribe(topics, on_assign=self.on_assign, on_revoke=self.on_revoke)
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def on_assign(self, _c, partitions):
        self.assigned = sorted((p.topic, p.partition) for p in partitions)

    def on_revoke(self, _c, _partitions):
        self.assigned = []

    def run(self):
        while not self.stop.is_set():
            if self.commit_asked.is_set():
                self.commit_asked.clear()
                try:
                    self.c.commit(asynchronous=False)
                except KafkaException as e:
                    self.errors.append(f"commit: {e}")
                self.committed.set()
            try:
                m = self.c.poll(0.2)
            except KafkaException as e:
                self.errors.append(str(e))
                continue
            if m is None:
                continue
            if m.error():
                self.errors.append(str(m.error()))
                continue
            self.values[m.topic()].append(m.value().decode())
        self.c.close()

    def assignment(self):
        return list(self.assigned)

    def commit(self):
        self.committed.clear()
        self.commit_asked.set()
        if not self.committed.wait(BOUND_S):
            raise SystemExit("commit not done in time")

    def close(self):
        self.stop.set()
        self.t.join(BOUND_S)


def wait_until(what, cond):
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def group_three(bootstrap, group, n, topics):
    members = [Member(bootstrap, group, f"member-{i}", topics) for i in range(3)]
    wait_until(
        "three members holding one partition each",
        lambda: sorted(len(m.assignment()) for m in members) == [1, 1, 1]
        and sorted(sum((m.assignment() for m in members), [])) == sorted((t, 0) for t in topics),
    )
    assignments = [m.assignment() for m in members]
    print("READY", flush=True)
    wait_until(
        f"{n} records of each topic",
        lambda: all(sum(len(m.values[t]) for m in members) >= n for t in topics),
    )
    for m in members:
        m.commit()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(timeout=BOUND_S)
    listed = admin.list_consumer_groups().result(timeout=BOUND_S)
    # No partitions named: OffsetFetch for every topic the group committed in.
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[
        group
    ].result(timeout=BOUND_S)
    committed = sorted(
        [tp.topic, tp.partition, tp.offset] for tp in offsets.topic_partitions
    )
    describe = {
        "state": str(described.state),
        "members": len(described.members),
        "assigned": sorted(
            (tp.topic, tp.partition)
            for mem in described.members
            for tp in mem.assignment.topic_partitions
        ),
    }
    members[0].close()
    rest = members[1:]
    wait_until(
        "two members holding every partition",
        lambda: sorted(sum((m.assignment() for m in rest), [])) == sorted((t, 0) for t in topics),
    )
    after = [m.assignment() for m in rest]
    time.sleep(2)  # time to read anything again, which the caller would see
    for m in rest:
        m.close()
    values = {t: sum((m.values[t] for m in members), []) for t in topics}
    return {
        "assignments": assignments,
        "after_leave": after,
        "values": values,
        "describe": describe,
        "listed": sorted(g.group_id for g in listed.valid),
        "committed": committed,
        "errors": sum((m.errors for m in members), []),
    }


def group_resume(bootstrap, group, n, topics):
    m = Member(bootstrap, group, "resumer", topics)
    wait_until(
        f"{n} records of each topic",
        lambda: all(len(m.values[t]) >= n for t in topics),
    )
    time.sleep(3)
    m.close()
    return {"values": m.values, "errors": m.errors}


def outcomes(futures):
    out = {}
    for key, f in futures.items():
        try:
            f.result(timeout=BOUND_S)
            out[str(key)] = "OK"
        except KafkaException as e:
            out[str(key)] = e.args[0].name()
    return out


def admin(bootstrap):
    a = AdminClient({"bootstrap.servers": bootstrap})
    res = {}
    res["create"] = outcomes(a.create_topics([
        NewTopic("made", 1),
        NewTopic("wide", 3),
        NewTopic("compacted", 1, config={"cleanup.policy": "compact"}),
    ]))
    res["create_again"] = outcomes(a.create_topics([NewTopic("made", 1)]))
    res["validate_only"] = outcomes(a.create_topics([NewTopic("checked", 1)], validate_only=True))
    res["listed"] = sorted(a.list_topics(timeout=BOUND_S).topics)
    configs = a.describe_configs([ConfigResource("topic", "made")])
    res["configs"] = {
        name: entry.value
        for f in configs.values()
        for name, entry in f.result(timeout=BOUND_S).items()
    }
    cluster = a.describe_cluster().result(timeout=BOUND_S)
    res["cluster"] = {"id": cluster.cluster_id, "nodes": len(cluster.nodes),
                      "controller": cluster.controller.id if cluster.controller else None}
    res["partitions"] = outcomes(a.create_partitions([NewPartitions("made", 2)]))
    res["delete"] = outcomes(a.delete_topics(["made", "missing"]))
    res["listed_after"] = sorted(a.list_topics(timeout=BOUND_S).topics)
    return res


def times(bootstrap):
    base = 1_700_000_000_000
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    offsets = []

    def report(err, msg):
        if err is None and msg.topic() == "timed":
            offsets.append(msg.offset())

    for i in range(100):
        p.produce("timed", str(i).encode(), timestamp=base + i * 1_000_000, on_delivery=report)
        p.produce("untimed", b"x", on_delivery=report)
        p.flush(BOUND_S)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "times"})
    asked = {
        "before": (base - 5, offsets[0]),
        "first": (base, offsets[0]),
        "between": (base + 41 * 1_000_000 + 1, offsets[42]),
        "at_last": (base + 99 * 1_000_000, offsets[99]),
        "after": (base + 100 * 1_000_000, -1),
    }
    out = {}
    for name, (t, want) in asked.items():
        # One partition per request: Kafka refuses a partition named twice.
        [tp] = c.offsets_for_times([TopicPartition("timed", 0, t)], timeout=BOUND_S)
        out[name] = {"found": tp.offset, "expected": want}
    c.close()
    # The record with the largest timestamp (ListOffsets -3, KIP-734), through the admin
    # client: the last timed record, though an untimed one follows it in the log.
    a = AdminClient({"bootstrap.servers": bootstrap})
    futures = a.list_offsets({TopicPartition("timed", 0): OffsetSpec.max_timestamp()},
                             request_timeout=BOUND_S)
    [info] = [f.result(timeout=BOUND_S) for f in futures.values()]
    out["max_timestamp"] = {"found": info.offset, "expected": offsets[99]}
    out["max_timestamp_ms"] = {"found": info.timestamp, "expected": base + 99 * 1_000_000}
    # A position past the end: OFFSET_OUT_OF_RANGE, and the consumer resets to the
    # beginning (auto.offset.reset) and reads the first record.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "times-reset",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition("timed", 0, 10**9)])
    first = None
    deadline = time.monotonic() + BOUND_S
    while first is None and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            first = m.offset()
    c.close()
    out["reset_past_the_end"] = {"found": first, "expected": offsets[0]}
    return out


def live_tail(bootstrap, seconds):
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    p.produce("tail-a", b"first")
    p.flush(BOUND_S)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tail", "enable.auto.commit": False})
    c.assign([TopicPartition("tail-a", 0, OFFSET_END)])
    stop = threading.Event()

    def produce():
        while not stop.is_set():
            for topic in ("tail-b", "tail-b", "tail-a"):
                p.produce(topic, b"x")
            p.poll(0)
            time.sleep(0.01)
        p.flush(BOUND_S)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    read, errors = 0, []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        m = c.poll(0.2)
        if m is None:
            continue
        if m.error():
            errors.append(str(m.error()))
        else:
            read += 1
    stop.set()
    t.join(BOUND_S)
    c.close()
    return {"read": read, "errors": errors[:5], "error_count": len(errors)}


def main():
    cmd, bootstrap = sys.argv[1], sys.argv[2]
    if cmd == "idempotent":
        out = idempotent(bootstrap, sys.argv[3], int(sys.argv[4]))
    elif cmd == "group-three":
        out = group_three(bootstrap, sys.argv[3], int(sys.argv[4]), sys.argv[5:])
    elif cmd == "admin":
        out = admin(bootstrap)
    elif cmd == "times":
        out = times(bootstrap)
    elif cmd == "live-tail":
        out = live_tail(bootstrap, float(sys.argv[3]))
    elif cmd == "group-resume":
        out = group_resume(bootstrap, sys.argv[3], int(sys.argv[4]), sys.argv[5:])
    else:
        raise SystemExit(f"unknown scenario {cmd}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
