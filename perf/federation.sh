#!/usr/bin/env bash
# Queue federation throughput, side by side: a private RabbitMQ node with its federation plugin
# and a release build of Warren. Each scenario fills a durable queue of the upstream's vhost
# perf-up with COUNT persistent messages of SIZE bytes (warren-perf, confirms), then federates
# the queue of the same name in the downstream's vhost / from it (an upstream and a policy:
# on-confirm, prefetch 1000, both brokers' defaults) and starts a consumer there (warren-perf,
# prefetch 1000, acks of 100 at a time), timed until it has consumed them all: the link moves
# the backlog to where the consumer is. It reads each broker's CPU time (/proc) across that
# interval. Scenarios, each ROUNDS times (the table has medians):
#
#   w2w   Warren's perf-up into Warren's /, the link run by Warren
#   r2r   RabbitMQ's perf-up into RabbitMQ's /, the link run by RabbitMQ
#   r2w   RabbitMQ's perf-up into Warren's /, the link run by Warren
#   w2r   Warren's perf-up into RabbitMQ's /, the link run by RabbitMQ
#
#   perf/federation.sh                          # ROUNDS=3 COUNT=200000 SIZE=1024
#   ROUNDS=1 COUNT=50000 perf/federation.sh     # a quick look
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
SCENARIOS=${SCENARIOS:-w2w r2r r2w w2r}
NAME=fed
PLUGINS=rabbitmq_federation,rabbitmq_federation_management
# shellcheck source=perf/peers.sh
. perf/peers.sh

# api METHOD URL [BODY]: a call to a management API as guest.
api() { curl -sf -u guest:guest -X "$1" -H 'content-type: application/json' "$2" ${3:+-d "$3"} >/dev/null; }

# Both brokers get the vhost perf-up, guest allowed in it, and cluster names of their own.
prepare() {
    for a in "$RMQ_API" "$WARREN_API"; do
        api PUT "$a/vhosts/perf-up" || { say "cannot make vhost perf-up at $a"; exit 1; }
        api PUT "$a/permissions/perf-up/guest" '{"configure":".*","write":".*","read":".*"}' ||
            { say "cannot let guest in at $a"; exit 1; }
    done
    api PUT "$RMQ_API/cluster-name" '{"name":"perf-rabbit"}'
    api PUT "$WARREN_API/cluster-name" '{"name":"perf-warren"}'
}

# fill PORT QUEUE: COUNT persistent messages of SIZE bytes into perf-up, confirmed.
fill() {
    "$PERF" --uri "amqp://guest:guest@127.0.0.1:$1/perf-up" --producer-only --pmessages "$COUNT" \
        --confirm 1000 --size "$SIZE" --persistent --durable-queues --keep --queue "$2" \
        --time 0 --interval 0 >>"$WORK/perf.log" 2>&1 || { say "filling $2 failed; see $WORK/perf.log"; exit 1; }
}

# drain PORT QUEUE: a consumer on / takes COUNT messages.
drain() {
    "$PERF" --uri "amqp://guest:guest@127.0.0.1:$1/%2f" --consumer-only --cmessages "$COUNT" \
        --qos 1000 --multi-ack 100 --durable-queues --keep --queue "$2" \
        --time 0 --interval 0 >>"$WORK/perf.log" 2>&1 || { say "draining $2 failed; see $WORK/perf.log"; exit 1; }
}

# run SCENARIO ROUND: one timed move; a line "scenario round seconds rmq_ticks warren_ticks".
run() {
    local s=$1 r=$2 up_port down_port down_api q=perf-fed-$1-$2
    case $s in
        w2w) up_port=$WARREN_PORT down_port=$WARREN_PORT down_api=$WARREN_API ;;
        r2r) up_port=$RMQ_PORT down_port=$RMQ_PORT down_api=$RMQ_API ;;
        r2w) up_port=$RMQ_PORT down_port=$WARREN_PORT down_api=$WARREN_API ;;
        w2r) up_port=$WARREN_PORT down_port=$RMQ_PORT down_api=$RMQ_API ;;
        *) say "unknown scenario $s"; exit 1 ;;
    esac
    local up_api=$RMQ_API
    [ "$up_port" = "$WARREN_PORT" ] && up_api=$WARREN_API
    fill "$up_port" "$q"
    api PUT "$down_api/parameters/federation-upstream/%2F/perf-up" \
        "{\"value\": {\"uri\": \"amqp://guest:guest@127.0.0.1:$up_port/perf-up\"}}" ||
        { say "cannot declare the upstream"; exit 1; }
    api PUT "$down_api/policies/%2F/perf-fed" \
        "{\"pattern\": \"^$q\$\", \"apply-to\": \"queues\", \"definition\": {\"federation-upstream\": \"perf-up\"}}" ||
        { say "cannot declare the policy"; exit 1; }
    sleep 1
    local r0 w0 t0 t1
    r0=$(cpu "$RMQ_PID") w0=$(cpu "$WARREN_PID") t0=$(date +%s.%N)
    drain "$down_port" "$q"
    t1=$(date +%s.%N)
    echo "$s $r $(echo "$t1 - $t0" | bc) $(($(cpu "$RMQ_PID") - r0)) $(($(cpu "$WARREN_PID") - w0))" >>"$WORK/results"
    api DELETE "$down_api/policies/%2F/perf-fed"
    api DELETE "$down_api/parameters/federation-upstream/%2F/perf-up"
    sleep 1
    api DELETE "$up_api/queues/perf-up/$q"
    api DELETE "$down_api/queues/%2F/$q"
}

start_rmq
start_warren
prepare
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
    "w2w": "Warren -> Warren, Warren's link",
    "r2r": "RabbitMQ -> RabbitMQ, RabbitMQ's link",
    "r2w": "RabbitMQ -> Warren, Warren's link",
    "w2r": "Warren -> RabbitMQ, RabbitMQ's link",
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
if "w2w" in med and "r2r" in med:
    a, b = med["w2w"], med["r2r"]
    print(f"queue federation within one broker, Warren vs RabbitMQ: {a[0] / b[0]:.2f}x the rate, "
          f"{(b[1] + b[2]) / (a[1] + a[2]):.2f}x less CPU per message (both brokers)")
EOF
