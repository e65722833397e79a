"""Queue and exchange deduplication (x-message-deduplication) as pika
sees it. Driven by tests/broker/deduplication.rs and
tests/cluster/cluster_deduplication.rs, which start the brokers:

    python3 dedup.py URI behaviour
    python3 dedup.py URI before NAME   # declare NAME, publish k0..k9
    python3 dedup.py URI after NAME    # publish k0..k9 again and k10

Every publish waits for its confirm (a duplicate is confirmed too); a
failed check exits 1 with what went wrong.
"""
import sys
import time

import pika

DEDUP = "x-message-deduplication"
HEADER = "x-deduplication-header"


def channel(uri):
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    ch = conn.channel()
    ch.confirm_delivery()
    return conn, ch


def publish(ch, queue, body, headers=None, message_id=None, exchange=""):
    props = pika.BasicProperties(
        delivery_mode=2, headers=headers, message_id=message_id
    )
    # Raises if the broker nacks or returns the message.
    ch.basic_publish(exchange, queue, body, props, mandatory=True)


def bodies(ch, queue):
    out = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body.decode())


def expect(what, got, want):
    if got != want:
        sys.exit(f"{what}: got {got!r}, want {want!r}")


def behaviour(uri):
    conn, ch = channel(uri)
    # By the header, and by message-id when there is no header.
    ch.queue_declare("pika-by-key", arguments={DEDUP: True})
    ch.queue_purge("pika-by-key")
    publish(ch, "pika-by-key", "h1", headers={HEADER: "k1"})
    publish(ch, "pika-by-key", "h1 again", headers={HEADER: "k1"})
    publish(ch, "pika-by-key", "m1", message_id="id-1")
    publish(ch, "pika-by-key", "m1 again", message_id="id-1")
    publish(ch, "pika-by-key", "no key")
    publish(ch, "pika-by-key", "no key")
    expect("by header and message-id", bodies(ch, "pika-by-key"),
           ["h1", "m1", "no key", "no key"])

    # A header of the queue's choosing.
    ch.queue_declare("pika-custom", arguments={DEDUP: True, "x-deduplication-header": "order"})
    publish(ch, "pika-custom", "o1", headers={"order": 17})
    publish(ch, "pika-custom", "o1 again", headers={"order": 17})
    publish(ch, "pika-custom", "other header", headers={HEADER: "x"})
    publish(ch, "pika-custom", "other header", headers={HEADER: "x"})
    expect("custom header", bodies(ch, "pika-custom"),
           ["o1", "other header", "other header"])

    # The cache keeps x-cache-size keys: the oldest is forgotten.
    ch.queue_declare("pika-size", arguments={DEDUP: True, "x-cache-size": 3})
    for k in ["a", "b", "c", "d"]:
        publish(ch, "pika-size", k, headers={HEADER: k})
    publish(ch, "pika-size", "d again", headers={HEADER: "d"})
    publish(ch, "pika-size", "a again", headers={HEADER: "a"})
    expect("cache size", bodies(ch, "pika-size"), ["a", "b", "c", "d", "a again"])

    # x-cache-ttl (ms), and a message's own x-cache-ttl header.
    ch.queue_declare("pika-ttl", arguments={DEDUP: True, "x-cache-ttl": 400})
    publish(ch, "pika-ttl", "t1", headers={HEADER: "t"})
    publish(ch, "pika-ttl", "t1 again", headers={HEADER: "t"})
    publish(ch, "pika-ttl", "long", headers={HEADER: "l", "x-cache-ttl": 60000})
    time.sleep(0.8)
    publish(ch, "pika-ttl", "t1 later", headers={HEADER: "t"})
    publish(ch, "pika-ttl", "long again", headers={HEADER: "l"})
    expect("cache ttl", bodies(ch, "pika-ttl"), ["t1", "long", "t1 later"])

    # On an exchange: dropped before routing, not returned though
    # mandatory, and confirmed.
    ch.exchange_declare("pika-dedup-x", "fanout", arguments={DEDUP: True})
    ch.queue_declare("pika-x-q")
    ch.queue_bind("pika-x-q", "pika-dedup-x")
    publish(ch, "", "e1", headers={HEADER: "e"}, exchange="pika-dedup-x")
    publish(ch, "", "e1 again", headers={HEADER: "e"}, exchange="pika-dedup-x")
    expect("exchange", bodies(ch, "pika-x-q"), ["e1"])

    # Arguments nothing would act on are refused.
    try:
        ch.queue_declare("pika-bad", arguments={"x-cache-size": 5})
        sys.exit("x-cache-size without x-message-deduplication was taken")
    except pika.exceptions.ChannelClosedByBroker as e:
        expect("refusal code", e.reply_code, 406)
    conn.close()


def before(uri, name):
    conn, ch = channel(uri)
    ch.queue_declare(name, durable=True, arguments={DEDUP: True, "x-cache-size": 100})
    for i in range(10):
        publish(ch, name, f"k{i}", headers={HEADER: f"k{i}"})
    conn.close()


def after(uri, name):
    conn, ch = channel(uri)
    for i in range(11):
        publish(ch, name, f"k{i} again", headers={HEADER: f"k{i}"})
    expect("after", bodies(ch, name), [f"k{i}" for i in range(10)] + ["k10 again"])
    conn.close()


if __name__ == "__main__":
    uri, phase = sys.argv[1], sys.argv[2]
    if phase == "behaviour":
        behaviour(uri)
    elif phase == "before":
        before(uri, sys.argv[3])
    elif phase == "after":
        after(uri, sys.argv[3])
    else:
        sys.exit(f"unknown phase {phase}")
    print("ok")
