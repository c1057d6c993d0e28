/*
 * librdkafka produce load for benches/kafka-vs-native.sh, in C: what benches/kafka/produce.py
 * does, without Python's cost per message (a produce() call, a closure and a callback
 * through the interpreter each), so that the client is not the bottleneck the ratio
 * measures.
 *
 * Produces SIZE-byte messages with acks=all to TOPIC for DURATION seconds (after WARMUP
 * seconds not counted), records each message's delivery latency (produce call to delivery
 * report), and prints one JSON object: ops_per_s, p50_us, p99_us, delivered, failed,
 * unflushed. Every wait is bounded: the flush at the end waits at most 30 s.
 *
 * Usage: produce BOOTSTRAP TOPIC SIZE DURATION_S WARMUP_S [QUEUE [BATCH]]
 *
 * QUEUE: queue.buffering.max.messages (default 1024); BATCH: batch.num.messages (default
 * 10000, librdkafka's).
 * Build: cc -O2 -o produce produce.c -lrdkafka   (Debian: apt-get install librdkafka-dev)
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Delivery latencies of the messages sent and reported inside the measured window, in
 * microseconds. */
static uint32_t *latencies;
static size_t latencies_len, latencies_cap;
static uint64_t measure_from, measure_to;
static uint64_t failed;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    (void)opaque;
    uint64_t now = now_ns();
    uint64_t sent = (uint64_t)(uintptr_t)m->_private;
    if (m->err) {
        if (failed++ == 0)
            fprintf(stderr, "produce: first failed delivery: %s\n", rd_kafka_err2str(m->err));
        return;
    }
    if (sent < measure_from || now > measure_to)
        return;
    if (latencies_len == latencies_cap) {
        latencies_cap = latencies_cap ? latencies_cap * 2 : 1 << 20;
        latencies = realloc(latencies, latencies_cap * sizeof *latencies);
        if (!latencies) {
            fprintf(stderr, "produce: out of memory\n");
            exit(1);
        }
    }
    latencies[latencies_len++] = (uint32_t)((now - sent) / 1000);
}

static int by_value(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static uint32_t pct(double q) {
    if (!latencies_len)
        return 0;
    size_t i = (size_t)(q * (double)latencies_len);
    return latencies[i < latencies_len ? i : latencies_len - 1];
}

static void set(rd_kafka_conf_t *conf, const char *key, const char *value) {
    char err[512];
    if (rd_kafka_conf_set(conf, key, value, err, sizeof err) != RD_KAFKA_CONF_OK) {
        fprintf(stderr, "produce: %s=%s: %s\n", key, value, err);
        exit(2);
    }
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: produce BOOTSTRAP TOPIC SIZE DURATION_S WARMUP_S [QUEUE [BATCH]]\n");
        return 2;
    }
    const char *topic = argv[2];
    size_t size = strtoul(argv[3], NULL, 10);
    double duration = atof(argv[4]), warmup = atof(argv[5]);
    const char *queue = argc > 6 ? argv[6] : "1024";
    const char *batch = argc > 7 ? argv[7] : "10000";
    char *payload = malloc(size ? size : 1);
    if (!payload)
        return 1;
    memset(payload, 'x', size);

    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    set(conf, "bootstrap.servers", argv[1]);
    set(conf, "acks", "all");
    set(conf, "linger.ms", "5");
    /* As produce.py: at most QUEUE messages queued or in flight (the native run's window). */
    set(conf, "queue.buffering.max.messages", queue);
    set(conf, "batch.num.messages", batch);
    set(conf, "message.timeout.ms", "30000");
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    char err[512];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!rk) {
        fprintf(stderr, "produce: %s\n", err);
        return 1;
    }

    uint64_t start = now_ns();
    measure_from = start + (uint64_t)(warmup * 1e9);
    measure_to = measure_from + (uint64_t)(duration * 1e9);
    for (;;) {
        uint64_t now = now_ns();
        if (now >= measure_to)
            break;
        rd_kafka_resp_err_t e = rd_kafka_producev(
            rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_VALUE(payload, size),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE((void *)(uintptr_t)now),
            RD_KAFKA_V_END);
        if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            rd_kafka_poll(rk, 1);
            continue;
        }
        if (e) {
            fprintf(stderr, "produce: %s\n", rd_kafka_err2str(e));
            return 1;
        }
        rd_kafka_poll(rk, 0);
    }
    rd_kafka_flush(rk, 30000);
    int unflushed = rd_kafka_outq_len(rk);
    rd_kafka_destroy(rk);
    qsort(latencies, latencies_len, sizeof *latencies, by_value);
    printf("{\"ops_per_s\": %.1f, \"p50_us\": %" PRIu32 ", \"p99_us\": %" PRIu32
           ", \"delivered\": %zu, \"failed\": %" PRIu64 ", \"unflushed\": %d}\n",
           (double)latencies_len / duration, pct(0.50), pct(0.99), latencies_len, failed,
           unflushed);
    return 0;
}
