#!/usr/bin/env bash
# The stream protocol, side by side: a private RabbitMQ node with its stream plugin
# (rabbitmq_stream) and a release build of Warren, each driven by warren-stream-perf (RabbitMQ's
# Rust stream client): publish COUNT messages in batches of 100 with confirms, then read the
# stream from the first offset with 1 and with 10 readers; messages of 16 B and 1 KiB. Brokers
# alternate per run (RabbitMQ, Warren, RabbitMQ, Warren ...); the table has the medians of ROUNDS
# runs: rates, the ratio Warren/RabbitMQ, and each broker's CPU time per message (from /proc).
# Then, once per size, what a stream of FOOT_COUNT messages (10M; 0 skips it) takes: its bytes
# on disk and in the broker's RSS (each one's growth over the phase), per message.
#
#   perf/stream.sh                       # ROUNDS=3 COUNT=1000000 SIZES="16 1024"
#   ROUNDS=1 COUNT=200000 perf/stream.sh # a quick look
#
# Ports: RabbitMQ AMQP 5811 (dist 5812) and stream 5813, Warren AMQP 5814 and stream 5815; all
# on 127.0.0.1. Installs Debian's rabbitmq-server if it is missing. SKIP_BUILD=1 uses the
# binaries in target/release as they are.
set -uo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
COUNT=${COUNT:-1000000}
SIZES=${SIZES:-16 1024}
READERS=${READERS:-1,10}
RMQ_PORT=${RMQ_PORT:-5811}
RMQ_DIST_PORT=${RMQ_DIST_PORT:-5812}
RMQ_STREAM_PORT=${RMQ_STREAM_PORT:-5813}
WARREN_PORT=${WARREN_PORT:-5814}
WARREN_STREAM_PORT=${WARREN_STREAM_PORT:-5815}
TARGET=${CARGO_TARGET_DIR:-target}
RMQ_SERVER=/usr/lib/rabbitmq/bin/rabbitmq-server
WORK=$(mktemp -d /tmp/warren-stream.XXXXXX)

say() { printf '%s stream: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
listener_pid() { ss -ltnpH "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2; }

RMQ_PID= WARREN_PID=
cleanup() {
    for p in $WARREN_PID $RMQ_PID; do
        kill "$p" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$p" 2>/dev/null
    done
    [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT

if [ ! -x "$RMQ_SERVER" ]; then
    say "installing rabbitmq-server"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null) ||
        { say "could not install rabbitmq-server"; exit 1; }
fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    cargo build --release --bin warren 2>&1 | tail -1
    cargo build --release -p warren-perf --bin warren-stream-perf 2>&1 | tail -1
fi
PERF=$TARGET/release/warren-stream-perf

start_rmq() {
    local d=$WORK/rmq
    mkdir -p "$d/home"
    echo warrenstreamcookie >"$d/home/.erlang.cookie"
    chmod 400 "$d/home/.erlang.cookie"
    printf 'listeners.tcp.1 = 127.0.0.1:%s\nloopback_users = none\nstream.listeners.tcp.1 = 127.0.0.1:%s\nstream.advertised_host = 127.0.0.1\nstream.advertised_port = %s\n' \
        "$RMQ_PORT" "$RMQ_STREAM_PORT" "$RMQ_STREAM_PORT" >"$d/rabbitmq.conf"
    echo '[rabbitmq_stream].' >"$d/enabled_plugins"
    (
        cd "$d" || exit 1
        export HOME=$d/home RABBITMQ_NODENAME=warrenstream@localhost RABBITMQ_NODE_PORT=$RMQ_PORT \
            RABBITMQ_DIST_PORT=$RMQ_DIST_PORT RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
            RABBITMQ_MNESIA_BASE=$d/mnesia RABBITMQ_LOG_BASE=$d/log RABBITMQ_CONFIG_FILE=$d/rabbitmq \
            RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins
        exec setsid "$RMQ_SERVER" >"$d/server.out" 2>&1 </dev/null
    ) &
    for _ in $(seq 120); do
        RMQ_PID=$(listener_pid "$RMQ_STREAM_PORT")
        [ -n "$RMQ_PID" ] && break
        sleep 0.5
    done
    [ -n "$RMQ_PID" ] || { say "RabbitMQ's stream port did not open"; tail -20 "$d/server.out" >&2; exit 1; }
    say "RabbitMQ is up (beam.smp pid $RMQ_PID)"
}

start_warren() {
    mkdir -p "$WORK/warren"
    "$TARGET/release/warren" --bind 127.0.0.1 --port "$WARREN_PORT" --stream-port "$WARREN_STREAM_PORT" \
        --management-port off --prometheus-port off --data-dir "$WORK/warren" >"$WORK/warren.log" 2>&1 </dev/null &
    WARREN_PID=$!
    for _ in $(seq 60); do
        [ "$(listener_pid "$WARREN_STREAM_PORT")" = "$WARREN_PID" ] && break
        sleep 0.5
    done
    [ "$(listener_pid "$WARREN_STREAM_PORT")" = "$WARREN_PID" ] || { say "Warren did not start"; exit 1; }
    say "Warren is up (pid $WARREN_PID)"
}

start_rmq
start_warren

# run BROKER SIZE ROUND: one warren-stream-perf run, its JSON kept.
run() {
    local b=$1 size=$2 r=$3 port pid out
    if [ "$b" = rabbitmq ]; then port=$RMQ_STREAM_PORT pid=$RMQ_PID; else port=$WARREN_STREAM_PORT pid=$WARREN_PID; fi
    out=$WORK/$b.$size.$r.json
    for attempt in 1 2 3; do
        if "$PERF" --port "$port" --pid "$pid" --count "$COUNT" --size "$size" --readers "$READERS" \
            --stream "perf-$size-$r" >"$out" 2>>"$WORK/perf.log"; then
            return 0
        fi
        say "$b size $size round $r failed (attempt $attempt), see $WORK/perf.log"
        sleep 2
    done
    return 1
}

for size in $SIZES; do
    for r in $(seq "$ROUNDS"); do
        for b in rabbitmq warren; do
            say "$b, $size B, round $r"
            run "$b" "$size" "$r"
        done
    done
done

# footprint BROKER SIZE: publish FOOT_COUNT messages into a stream that stays; how much the data
# dir and the RSS grew, in bytes per message (the stream is deleted after).
FOOT_COUNT=${FOOT_COUNT:-10000000}
footprint() {
    local b=$1 size=$2 port pid dir d0 d1 r0 r1
    if [ "$b" = rabbitmq ]; then port=$RMQ_STREAM_PORT pid=$RMQ_PID dir=$WORK/rmq/mnesia; else port=$WARREN_STREAM_PORT pid=$WARREN_PID dir=$WORK/warren; fi
    d0=$(du -sb "$dir" | cut -f1)
    r0=$(awk '/VmRSS/ {print $2 * 1024}' "/proc/$pid/status")
    "$PERF" --port "$port" --count "$FOOT_COUNT" --size "$size" --readers "" --keep \
        --stream "foot-$size" >/dev/null 2>>"$WORK/perf.log" || { say "$b footprint $size failed"; return 1; }
    sleep 5 # what is buffered reaches the disk
    d1=$(du -sb "$dir" | cut -f1)
    r1=$(awk '/VmRSS/ {print $2 * 1024}' "/proc/$pid/status")
    echo "$b $size $(( (d1 - d0) / FOOT_COUNT )) $(( (r1 - r0) / FOOT_COUNT ))" >>"$WORK/footprint"
    # Deleted by a run that creates it again, reads nothing and publishes nothing.
    "$PERF" --port "$port" --count 0 --readers "" --stream "foot-$size" >/dev/null 2>>"$WORK/perf.log"
}
if [ "$FOOT_COUNT" -gt 0 ]; then
    for size in $SIZES; do
        for b in rabbitmq warren; do
            say "$b, $size B, footprint of $FOOT_COUNT messages"
            footprint "$b" "$size"
        done
    done
fi

# median BROKER SIZE FIELD: the median over the rounds of one JSON field (jq-less: python3).
median() {
    python3 - "$WORK" "$1" "$2" "$3" <<'EOF'
import glob, json, statistics, sys
work, broker, size, field = sys.argv[1:]
vals = []
for f in glob.glob(f"{work}/{broker}.{size}.*.json"):
    try:
        d = json.load(open(f))
        phase, key = field.split(".")
        v = d[phase][key]
        if v is not None:
            vals.append(v)
    except (ValueError, KeyError):
        pass
print(f"{statistics.median(vals):.4f}" if vals else "nan")
EOF
}

printf '\n%-34s %14s %14s %8s %16s %16s %8s\n' "scenario ($COUNT messages)" "RabbitMQ" "Warren" "ratio" \
    "RabbitMQ us/msg" "Warren us/msg" "ratio"
for size in $SIZES; do
    for phase in publish $(echo "$READERS" | tr ',' ' ' | sed 's/\([0-9]*\)/read\1/g'); do
        rr=$(median rabbitmq "$size" "$phase.rate")
        wr=$(median warren "$size" "$phase.rate")
        rc=$(median rabbitmq "$size" "$phase.broker_cpu_us_per_msg")
        wc=$(median warren "$size" "$phase.broker_cpu_us_per_msg")
        awk -v n="$phase, $size B" -v rr="$rr" -v wr="$wr" -v rc="$rc" -v wc="$wc" 'BEGIN {
            printf "%-34s %14.0f %14.0f %7.2fx %16.2f %16.2f %7.2fx\n", n " (msg/s)", rr, wr,
                (rr > 0 ? wr / rr : 0), rc, wc, (wc > 0 ? rc / wc : 0) }'
    done
done
echo "(rates: Warren/RabbitMQ, higher is better; CPU: RabbitMQ/Warren, higher is better)"
if [ -s "$WORK/footprint" ]; then
    printf '\n%-34s %14s %14s %8s\n' "a stream of $FOOT_COUNT messages" "RabbitMQ" "Warren" "ratio"
    python3 -c '
import sys
v = {}
for line in sys.stdin:
    b, size, disk, rss = line.split()
    v.setdefault(size, {})[b] = (int(disk), int(rss))
for size, by in v.items():
    for col, what in ((0, "disk"), (1, "RSS")):
        r = by.get("rabbitmq", (None, None))[col]
        w = by.get("warren", (None, None))[col]
        ratio = f"{r / w:7.2f}x" if r and w and r > 0 and w > 0 else "    n/a"
        name = f"{what} per message, {size} B (bytes)"
        print(f"{name:<34} {str(r):>14} {str(w):>14} {ratio}")
' <"$WORK/footprint"
    echo "(footprint ratio: RabbitMQ/Warren, higher is better)"
fi
