#!/usr/bin/env bash
# A large stream's restart and deletion on Warren alone: fills N x 1 KiB persistent messages
# (default 10,000,000, about 10 GB) into a stream with confirms, kill -9s the broker, starts it
# again and times how long until a consumer at the middle offset gets its first message; then
# times a run that publishes one message and deletes the stream. Needs the release build
# (cargo build --release) and about N x 1.2 KB of free disk under $WORK (default a temp dir).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
BIN=${WARREN_BIN:-$REPO/target/release/warren}
PERF=${PERF_BIN:-$REPO/target/release/warren-perf}
N=${N:-10000000}
PORT=${WARREN_PORT:-5903}
WORK=${WORK:-$(mktemp -d /tmp/warren-stream-restart.XXXXXX)}
DATA=$WORK/data
mkdir -p "$DATA"
URI="amqp://guest:guest@127.0.0.1:$PORT/%2f"
STREAM=(--uri "$URI" --durable-queues --queue-arg x-queue-type=stream --queue big --json --interval 0)
start() {
    "$BIN" --bind 127.0.0.1 --port "$PORT" --stream-port off --data-dir "$DATA" --management-port off \
        --prometheus-port off >>"$WORK/warren.log" 2>&1 &
    PID=$!
}
ms() { echo $(((($2) - ($1)) / 1000000)); }
start
trap 'kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null; [ "${KEEP_WORK:-0}" = 1 ] || rm -rf "$WORK"' EXIT
until "$PERF" --uri "$URI" --check --connect-timeout 1 >/dev/null 2>&1; do sleep 0.1; done
"$PERF" "${STREAM[@]}" --producer-only --pmessages "$N" --persistent --confirm 1000 --size 1024 \
    --time 0 --keep >"$WORK/fill.json"
echo "filled $N x 1 KiB: $(grep -o '"confirmed_rate":[0-9.]*' "$WORK/fill.json")"
echo "RSS: $(awk '/VmRSS/ {print $2}' "/proc/$PID/status") kB; data dir: $(du -sh "$DATA" | cut -f1)"
kill -9 "$PID"
wait "$PID" 2>/dev/null || true
t0=$(date +%s%N)
start
until "$PERF" --uri "$URI" --check --connect-timeout 1 >/dev/null 2>&1; do sleep 0.05; done
t1=$(date +%s%N)
"$PERF" "${STREAM[@]}" --consumer-only --consumers 1 --cmessages 1 --qos 10 \
    --consumer-arg "x-stream-offset=$((N / 2))" --time 0 --keep >/dev/null
t2=$(date +%s%N)
echo "restart after kill -9: accepting after $(ms t0 t1) ms, a read at the middle after $(ms t0 t2) ms"
t0=$(date +%s%N)
"$PERF" "${STREAM[@]}" --producer-only --pmessages 1 --confirm 1 --time 0 >/dev/null
t1=$(date +%s%N)
echo "publish one and delete the stream: $(ms t0 t1) ms"
