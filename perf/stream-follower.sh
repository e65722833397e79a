#!/usr/bin/env bash
# Stream readers on a 3-node Warren cluster, where they attach: STREAM_N
# persistent 1 KiB messages are published into a stream through the
# leader (confirms, window 1000), then READERS readers read all of it from
# `first` (qos 1000, acks every 100), attached to the leader, then to a
# follower (which serves them from its own copy), then to both followers
# (READERS each). Prints the deliveries a second and each node's CPU per
# delivery in each phase: a follower's readers cost the leader nothing.
#
#   perf/stream-follower.sh                     # STREAM_N=1000000 READERS=4
#   BIN=/path/to/warren perf/stream-follower.sh # another build
#
# The load generator, the three nodes and the disk share this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
STREAM_N=${STREAM_N:-1000000}
READERS=${READERS:-4}
W=${W:-/tmp/warren-stream-follower}
BIN=${BIN:-target/release/warren}
PERF=target/release/warren-perf
rm -rf "$W" && mkdir -p "$W"
cargo build --release -q -p warren-perf
[ "$BIN" != target/release/warren ] || cargo build --release -q -p warren

ticks() {
    local s
    s=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
    s=${s##*) }
    awk '{print $12 + $13}' <<<"$s"
}
HZ=$(getconf CLK_TCK)
wait_port() { for _ in $(seq 1 300); do ss -ltnH "sport = :$1" | grep -q . && return 0; sleep 0.1; done; return 1; }

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

peers="1=127.0.0.1:7911,2=127.0.0.1:7912,3=127.0.0.1:7913"
echo "the benchmark cluster's shared secret" >"$W/secret"
for i in 1 2 3; do
    "$BIN" --node-id $i --raft-port 791$i --peers "$peers" --cluster-secret-file "$W/secret" \
        --bind 127.0.0.1 --port 593$i --management-port off --prometheus-port off --stream-port off \
        --data-dir "$W/w$i" --log-level info >"$W/w$i.log" 2>&1 &
    PIDS+=($!)
done
for i in 1 2 3; do wait_port 593$i; done
LEADER=
for _ in $(seq 1 100); do
    for i in 1 2 3; do grep -q "leading: serving clients" "$W/w$i.log" && LEADER=$i; done
    [ -n "$LEADER" ] && break
    sleep 0.2
done
[ -n "$LEADER" ] || { echo "no leader" >&2; exit 1; }
FOLLOWERS=()
for i in 1 2 3; do [ "$i" = "$LEADER" ] || FOLLOWERS+=("$i"); done
uri() { echo "amqp://guest:guest@127.0.0.1:593$1/%2f"; }
STREAM=(--durable-queues --queue-arg x-queue-type=stream --queue perf-sf)

# A stream declare waits for the cluster version streams need.
for _ in $(seq 1 60); do
    "$PERF" --uri "$(uri "$LEADER")" "${STREAM[@]}" --producer-only --pmessages 1 --confirm 1 \
        --size 16 --time 0 --keep --json >/dev/null 2>&1 && break
    sleep 1
done
echo "filling: $STREAM_N messages through node $LEADER (the leader)"
"$PERF" --uri "$(uri "$LEADER")" "${STREAM[@]}" --producer-only --pmessages "$STREAM_N" \
    --persistent --confirm 1000 --size 1024 --time 0 --keep --json >"$W/fill.json" 2>/dev/null
sleep 2
TOTAL=$((STREAM_N + 1))

# phase NAME NODE...: READERS readers on each NODE at once.
phase() {
    local name=$1 n i t0=() t1=() s0 s1 got=() pids=()
    shift
    for i in 1 2 3; do t0[$i]=$(ticks "${PIDS[$((i - 1))]}"); done
    s0=$(date +%s%N)
    for n in "$@"; do
        "$PERF" --uri "$(uri "$n")" "${STREAM[@]}" --consumer-only --consumers "$READERS" \
            --cmessages $((TOTAL * READERS)) --qos 1000 --multi-ack 100 \
            --consumer-arg x-stream-offset=first --time 0 --keep --json >"$W/$name.$n.json" 2>/dev/null &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i"; done
    s1=$(date +%s%N)
    for i in 1 2 3; do t1[$i]=$(ticks "${PIDS[$((i - 1))]}"); done
    local delivered=$((TOTAL * READERS * $#))
    python3 - "$name" "$delivered" "$s0" "$s1" "$HZ" "$LEADER" \
        "${t0[1]}" "${t1[1]}" "${t0[2]}" "${t1[2]}" "${t0[3]}" "${t1[3]}" <<'EOF'
import sys
name, n, s0, s1, hz, leader = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
t = list(map(int, sys.argv[7:]))
secs = (s1 - s0) / 1e9
us = [(t[2 * i + 1] - t[2 * i]) / hz * 1e6 / n for i in range(3)]
lead = int(leader) - 1
cells = [us[lead]] + [u for i, u in enumerate(us) if i != lead]
print(f"| {name} | {n / secs:,.0f} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
EOF
}

echo "| readers on | deliveries/s | CPU us per delivery: leader | follower A | follower B |"
echo "|---|---|---|---|---|"
phase "the leader" "$LEADER"
phase "follower A" "${FOLLOWERS[0]}"
phase "both followers" "${FOLLOWERS[@]}"
