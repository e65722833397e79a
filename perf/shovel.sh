#!/usr/bin/env bash
# Shovel throughput, side by side: a private RabbitMQ node with its shovel plugin and a release
# build of Warren. Each scenario fills a durable queue with COUNT persistent messages of SIZE
# bytes (warren-perf, confirms), then declares a dynamic shovel (on-confirm, prefetch 1000: both
# brokers' defaults) and times it until the destination queue holds them all. It reads each
# broker's CPU time (/proc) across that interval, so the table shows the rate and what the move
# cost each broker per message. Scenarios, each ROUNDS times (the table has medians):
#
#   r2w-warren   RabbitMQ's queue into Warren, the shovel run by Warren
#   r2w-rabbit   RabbitMQ's queue into Warren, the shovel run by RabbitMQ
#   w2w          a Warren queue into another of the same broker, run by Warren
#   r2r          a RabbitMQ queue into another of the same node, run by RabbitMQ
#
#   perf/shovel.sh                          # ROUNDS=3 COUNT=200000 SIZE=1024
#   ROUNDS=1 COUNT=50000 perf/shovel.sh     # a quick look
#
# Ports on 127.0.0.1: RabbitMQ AMQP 5821 (dist 5822, API 5826, its own epmd 5827), Warren AMQP
# 5823 (API 5824).
# Installs Debian's rabbitmq-server if it is missing. SKIP_BUILD=1 uses the binaries in
# target/release as they are.
set -uo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
COUNT=${COUNT:-200000}
SIZE=${SIZE:-1024}
SCENARIOS=${SCENARIOS:-r2w-warren r2w-rabbit w2w r2r}
NAME=shovel
PLUGINS=rabbitmq_shovel,rabbitmq_shovel_management
# shellcheck source=perf/peers.sh
. perf/peers.sh

# fill PORT QUEUE: COUNT persistent messages of SIZE bytes, confirmed.
fill() {
    "$PERF" --uri "amqp://guest:guest@127.0.0.1:$1/%2f" --producer-only --pmessages "$COUNT" \
        --confirm 1000 --size "$SIZE" --persistent --durable-queues --keep --queue "$2" \
        --time 0 --interval 0 >>"$WORK/perf.log" 2>&1 || { say "filling $2 failed; see $WORK/perf.log"; exit 1; }
}

# messages API QUEUE: the queue's messages (ready + unacked) as the API counts them.
messages() {
    curl -sf -u guest:guest "$1/queues/%2F/$2" | python3 -c \
        'import json,sys; print(json.load(sys.stdin).get("messages", 0))' 2>/dev/null || echo 0
}

# shovel API NAME SRC_URI SRC_QUEUE DEST_URI DEST_QUEUE
shovel() {
    curl -sf -u guest:guest -X PUT -H 'content-type: application/json' "$1/parameters/shovel/%2F/$2" \
        -d "{\"value\": {\"src-uri\": \"$3\", \"src-queue\": \"$4\", \"dest-uri\": \"$5\", \"dest-queue\": \"$6\"}}" \
        >/dev/null || { say "cannot declare shovel $2"; exit 1; }
}

delete_queue() { curl -sf -u guest:guest -X DELETE "$1/queues/%2F/$2" >/dev/null; }

RMQ_URI=amqp://guest:guest@127.0.0.1:$RMQ_PORT/%2F
WARREN_URI=amqp://guest:guest@127.0.0.1:$WARREN_PORT/%2F

# run SCENARIO ROUND: one timed move; a line "scenario round seconds rmq_ticks warren_ticks".
run() {
    local s=$1 r=$2 src_port src_api run_api src_uri dest_uri dest_api q=perf-src-$1-$2 d=perf-dst-$1-$2
    case $s in
        r2w-warren) src_port=$RMQ_PORT src_api=$RMQ_API run_api=$WARREN_API dest_api=$WARREN_API
                    src_uri=$RMQ_URI dest_uri=amqp://guest:guest@/%2F ;;
        r2w-rabbit) src_port=$RMQ_PORT src_api=$RMQ_API run_api=$RMQ_API dest_api=$WARREN_API
                    src_uri=amqp:// dest_uri=$WARREN_URI ;;
        w2w)        src_port=$WARREN_PORT src_api=$WARREN_API run_api=$WARREN_API dest_api=$WARREN_API
                    src_uri=amqp://guest:guest@/%2F dest_uri=amqp://guest:guest@/%2F ;;
        r2r)        src_port=$RMQ_PORT src_api=$RMQ_API run_api=$RMQ_API dest_api=$RMQ_API
                    src_uri=amqp:// dest_uri=amqp:// ;;
        *) say "unknown scenario $s"; exit 1 ;;
    esac
    fill "$src_port" "$q"
    sleep 1
    local r0 w0 t0 t1 n
    r0=$(cpu "$RMQ_PID") w0=$(cpu "$WARREN_PID") t0=$(date +%s.%N)
    shovel "$run_api" "perf-$s-$r" "$src_uri" "$q" "$dest_uri" "$d"
    while :; do
        n=$(messages "$dest_api" "$d")
        [ "${n:-0}" -ge "$COUNT" ] && break
        sleep 0.1
    done
    t1=$(date +%s.%N)
    echo "$s $r $(echo "$t1 - $t0" | bc) $(($(cpu "$RMQ_PID") - r0)) $(($(cpu "$WARREN_PID") - w0))" >>"$WORK/results"
    curl -sf -u guest:guest -X DELETE "$run_api/parameters/shovel/%2F/perf-$s-$r" >/dev/null
    sleep 1
    delete_queue "$src_api" "$q"
    delete_queue "$dest_api" "$d"
}

start_rmq
start_warren
TICK=$(getconf CLK_TCK)
for r in $(seq "$ROUNDS"); do
    for s in $SCENARIOS; do
        say "$s, round $r"
        run "$s" "$r"
    done
done

python3 - "$WORK/results" "$COUNT" "$TICK" <<'EOF'
import statistics, sys
path, count, tick = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = {}
for line in open(path):
    s, _r, secs, rt, wt = line.split()
    rows.setdefault(s, []).append((float(secs), int(rt), int(wt)))
names = {
    "r2w-warren": "RabbitMQ -> Warren, Warren shovels",
    "r2w-rabbit": "RabbitMQ -> Warren, RabbitMQ shovels",
    "w2w": "Warren -> Warren, Warren shovels",
    "r2r": "RabbitMQ -> RabbitMQ, RabbitMQ shovels",
}
us = lambda ticks: ticks * 1e6 / tick / count
print(f"\n{'scenario (' + str(count) + ' messages)':44} {'msg/s':>9} {'RabbitMQ us/msg':>16} {'Warren us/msg':>14}")
med = {}
for s, runs in rows.items():
    rate = statistics.median(count / secs for secs, _, _ in runs)
    rc = statistics.median(us(rt) for _, rt, _ in runs)
    wc = statistics.median(us(wt) for _, _, wt in runs)
    med[s] = (rate, rc, wc)
    print(f"{names.get(s, s):44} {rate:9.0f} {rc:16.2f} {wc:14.2f}")
def ratio(a, b, what):
    if a in med and b in med:
        ra, rb = med[a], med[b]
        cpu_a, cpu_b = ra[1] + ra[2], rb[1] + rb[2]
        print(f"{what}: {ra[0] / rb[0]:.2f}x the rate, {cpu_b / cpu_a:.2f}x less CPU per message (both brokers)")
ratio("w2w", "r2r", "a queue moved within one broker, Warren vs RabbitMQ")
ratio("r2w-warren", "r2w-rabbit", "RabbitMQ into Warren, Warren's shovel vs RabbitMQ's")
EOF
