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

  group-resume BOOTSTRAP GROUP N TOPIC...
      One member of GROUP reads N records of each topic from the group's committed
      offsets. Result: values read per topic, and any read past N within 3 s.
"""
import json
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

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


def main():
    cmd, bootstrap = sys.argv[1], sys.argv[2]
    if cmd == "idempotent":
        out = idempotent(bootstrap, sys.argv[3], int(sys.argv[4]))
    elif cmd == "group-three":
        out = group_three(bootstrap, sys.argv[3], int(sys.argv[4]), sys.argv[5:])
    elif cmd == "group-resume":
        out = group_resume(bootstrap, sys.argv[3], int(sys.argv[4]), sys.argv[5:])
    else:
        raise SystemExit(f"unknown scenario {cmd}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
