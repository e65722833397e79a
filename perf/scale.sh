#!/usr/bin/env bash
# perf/scale.sh: the management plane at scale. Starts a release Warren, gives it QUEUES queues
# (CONNECTIONS of them with a consumer on their own idle connection, the rest without consumers),
# then times the HTTP API and /metrics with curl and reads the broker's RSS and CPU.
#
#   perf/scale.sh                                  # 100,000 queues, 10,000 connections
#   QUEUES=20000 CONNECTIONS=2000 perf/scale.sh    # a quick look
#
# Variables: QUEUES (100000), CONNECTIONS (10000), REPEAT (7 timings per endpoint; the table shows
# the median and the slowest), DURABLE (0; 1 = durable queues, slower to declare), IDLE_SECS (30:
# seconds the broker is watched doing nothing, for its idle CPU), PORT / HTTP_PORT / METRICS_PORT
# (5811 / 15811 / 15812), SKIP_BUILD (0), KEEP_WORK (0), CARGO_TARGET_DIR (target).
# Not part of CI: it takes a few minutes and wants the machine to itself.
set -euo pipefail

QUEUES=${QUEUES:-100000}
CONNECTIONS=${CONNECTIONS:-10000}
REPEAT=${REPEAT:-7}
DURABLE=${DURABLE:-0}
IDLE_SECS=${IDLE_SECS:-30}
PORT=${PORT:-5811}
HTTP_PORT=${HTTP_PORT:-15811}
METRICS_PORT=${METRICS_PORT:-15812}
SKIP_BUILD=${SKIP_BUILD:-0}
KEEP_WORK=${KEEP_WORK:-0}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
WARREN_BIN=$TARGET/release/warren
PERF_BIN=$TARGET/release/warren-perf

if [ "$CONNECTIONS" -ge "$QUEUES" ]; then
    echo "scale.sh: CONNECTIONS must be below QUEUES" >&2
    exit 2
fi
if [ "$SKIP_BUILD" != 1 ]; then
    (cd "$ROOT" && cargo build --release -p warren -p warren-perf)
fi
command -v curl >/dev/null || { echo "scale.sh: needs curl" >&2; exit 2; }

WORK=$(mktemp -d /tmp/warren-scale.XXXXXX)
WARREN_PID=
HOLD_PID=
cleanup() {
    if [ -n "$HOLD_PID" ]; then
        kill "$HOLD_PID" 2>/dev/null || true
        wait "$HOLD_PID" 2>/dev/null || true
    fi
    if [ -n "$WARREN_PID" ]; then
        kill "$WARREN_PID" 2>/dev/null || true
        wait "$WARREN_PID" 2>/dev/null || true
    fi
    if [ "$KEEP_WORK" = 1 ]; then
        echo "scale.sh: logs kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

say() { echo "scale.sh: $*" >&2; }
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
uri="amqp://guest:guest@127.0.0.1:$PORT/%2f"
durable=()
[ "$DURABLE" = 1 ] && durable=(--durable-queues)

say "starting Warren (data in $WORK/data)"
(
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    exec "$WARREN_BIN" --bind 127.0.0.1 --port "$PORT" --stream-port off --data-dir "$WORK/data" \
        --management-bind 127.0.0.1 --management-port "$HTTP_PORT" --prometheus-port "$METRICS_PORT"
) >"$WORK/warren.log" 2>&1 </dev/null &
WARREN_PID=$!
for ((i = 0; i < 60; i++)); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    kill -0 "$WARREN_PID" 2>/dev/null || { say "Warren did not start:"; tail -5 "$WORK/warren.log" >&2; exit 1; }
    sleep 0.5
done
"$PERF_BIN" --uri "$uri" --check --connect-timeout 30 >/dev/null
sleep 1
rss0=$(rss_kb "$WARREN_PID")

extra=$((QUEUES - CONNECTIONS))
say "declaring $extra queues without consumers"
t0=$(date +%s.%N)
"$PERF_BIN" --uri "$uri" --queue scale --idle-connections 1 --idle-queues "$extra" --hold 0 \
    --keep "${durable[@]}" >/dev/null 2>"$WORK/declare.log"
t1=$(date +%s.%N)
sleep 2
rss1=$(rss_kb "$WARREN_PID")

say "opening $CONNECTIONS connections, each consuming from its own queue"
(
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    exec "$PERF_BIN" --uri "$uri" --queue scale --idle-connections "$CONNECTIONS" --hold 86400 \
        --keep "${durable[@]}"
) >/dev/null 2>"$WORK/hold.log" &
HOLD_PID=$!
until grep -q "holding" "$WORK/hold.log"; do
    kill -0 "$HOLD_PID" 2>/dev/null || { say "warren-perf ended early:"; tail -5 "$WORK/hold.log" >&2; exit 1; }
    sleep 1
done
t2=$(date +%s.%N)
sleep 2
rss2=$(rss_kb "$WARREN_PID")

say "watching the broker idle for $IDLE_SECS s"
c0=$(cpu_ticks "$WARREN_PID")
sleep "$IDLE_SECS"
c1=$(cpu_ticks "$WARREN_PID")
hz=$(getconf CLK_TCK)

api="http://127.0.0.1:$HTTP_PORT"
# time URL: REPEAT timings in ms, one per line, after one warm-up request.
time_url() {
    local i
    curl -sf -u guest:guest -o /dev/null "$1" || { say "GET $1 failed"; return 1; }
    for ((i = 0; i < REPEAT; i++)); do
        curl -sf -u guest:guest -o "$WORK/body" -w '%{time_total}\n' "$1"
    done | awk '{printf "%.1f\n", $1 * 1000}'
}
# row LABEL TARGET_MS URL
row() {
    local times median worst size
    times=$(time_url "$3" | sort -n)
    median=$(echo "$times" | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
    worst=$(echo "$times" | tail -1)
    size=$(stat -c %s "$WORK/body")
    printf '| %s | %s | %s | %s | %s |\n' "$1" "$median" "$worst" "$2" "$size"
}

totals=$(curl -sf -u guest:guest "$api/api/overview" |
    python3 -c 'import json,sys; o=json.load(sys.stdin)["object_totals"]; print(o["queues"], o["connections"], o["channels"], o["consumers"])')

echo
echo "Warren $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores," \
    "load average $(cut -d' ' -f1-3 /proc/loadavg); overview object_totals (queues connections" \
    "channels consumers): $totals"
echo
echo "| request | median ms | slowest ms | target ms | bytes |"
echo "| --- | --- | --- | --- | --- |"
row "GET /api/queues?page=1&page_size=100" 200 "$api/api/queues?page=1&page_size=100"
row "GET /api/queues?page=$((QUEUES / 100))&page_size=100 (the last page)" 200 "$api/api/queues?page=$((QUEUES / 100))&page_size=100"
row "GET /api/queues/%2F?page=1&page_size=100&name=scale-idle-99 (name filter)" 200 \
    "$api/api/queues/%2F?page=1&page_size=100&name=scale-idle-99"
row "GET /api/queues?page=1&page_size=100&sort=messages (not by name)" - \
    "$api/api/queues?page=1&page_size=100&sort=messages"
row "GET /api/queues/%2F/scale-idle-7 (one queue)" - "$api/api/queues/%2F/scale-idle-7"
row "GET /api/overview" 50 "$api/api/overview"
ui_list="page=1&page_size=50&use_regex=false&sort_reverse=false"
row "web UI: GET / (the page)" - "$api/"
row "web UI: queue list, first page by name" 200 "$api/api/queues?$ui_list&name=&sort=name"
row "web UI: queue list filtered by name" 200 "$api/api/queues?$ui_list&name=idle-99&sort=name"
row "web UI: queue list sorted by total messages" - "$api/api/queues?$ui_list&name=&sort=messages"
history="lengths_age=600&lengths_incr=5&msg_rates_age=600&msg_rates_incr=5"
row "web UI: overview with ten minutes of samples" 50 "$api/api/overview?$history"
row "web UI: a queue with ten minutes of samples" - "$api/api/queues/%2F/scale-idle-7?$history"
row "GET /api/vhosts" - "$api/api/vhosts"
row "GET /api/connections?page=1&page_size=100" - "$api/api/connections?page=1&page_size=100"
row "GET /api/channels?page=1&page_size=100" - "$api/api/channels?page=1&page_size=100"
row "GET /metrics (aggregated)" 1000 "http://127.0.0.1:$METRICS_PORT/metrics"
row "GET /metrics/per-object" - "http://127.0.0.1:$METRICS_PORT/metrics/per-object"
echo
awk -v r0="$rss0" -v r1="$rss1" -v r2="$rss2" -v q="$extra" -v c="$CONNECTIONS" \
    -v t0="$t0" -v t1="$t1" -v t2="$t2" \
    -v cpu="$(((c1 - c0) * 1000 / hz))" -v idle="$IDLE_SECS" 'BEGIN {
    printf "- RSS: %.1f MiB at start, %.1f MiB with %d queues without consumers, %.1f MiB with %d more connections (one channel, one consumer, one queue each)\n", r0 / 1024, r1 / 1024, q, r2 / 1024, c
    printf "- per idle queue: %.2f KiB (target under 2 KiB); per idle connection with its channel, consumer and queue: %.1f KiB\n", (r1 - r0) / q, (r2 - r1) / c
    printf "- declaring %d queues took %.1f s; opening %d connections %.1f s\n", q, t1 - t0, c, t2 - t1
    printf "- broker CPU while idle: %d ms over %d s (%.1f%% of one core)\n", cpu, idle, cpu / (idle * 10)
}'
if grep -q panicked "$WORK/warren.log"; then
    say "the broker's log says panicked:"
    grep -m3 panicked "$WORK/warren.log" >&2
    exit 1
fi
