#!/usr/bin/env bash
# Scenario 5 (persistent 1 KiB, confirms window 1000, manual ack multi 100,
# qos 1000, one producer and one consumer) on replicated brokers, side by
# side in one run: a 3-node Warren cluster (quorum queue; the client on a
# follower, whose connection is carried to the leader, and on the leader),
# a single Warren node (classic durable queue), and a 3-node RabbitMQ
# 3.10.8 cluster with a quorum queue (../shared/PEERS.md's recipe). Every
# broker and the load generator share this machine's cores and disk.
#
# Prints confirmed msg/s and broker CPU per confirmed message (the sum of
# every node's utime+stime) as medians of ROUNDS rounds, and the ratios.
# With a consumer keeping up, Warren never writes (nor replicates) most
# messages: they are acked before the next commit, which their confirms
# still wait for. The publish-only rows (no consumer) write every one.
#
#   perf/cluster.sh                 # ROUNDS=3 DUR=10
#   SKIP_RABBIT=1 perf/cluster.sh   # Warren only
#   BIN=/path/to/warren perf/cluster.sh   # another build (before/after)
#
# Also prints, for the 3-node cluster (quorum queue, client on the
# leader), the latency from publish to delivery at a fixed 10,000 msg/s
# (p50 and p99 over DUR seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-10}
SKIP_RABBIT=${SKIP_RABBIT:-0}
W=${W:-/tmp/warren-cluster-bench}
BIN=${BIN:-target/release/warren}
PERF=target/release/warren-perf
rm -rf "$W" && mkdir -p "$W"
cargo build --release -q -p warren-perf
[ "$BIN" != target/release/warren ] || cargo build --release -q -p warren

cpu_ticks() {
    local s
    s=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
    s=${s##*) }
    awk '{print $12 + $13}' <<<"$s"
}
sum_ticks() { local t=0 p; for p in "$@"; do t=$((t + $(cpu_ticks "$p"))); done; echo $t; }
HZ=$(getconf CLK_TCK)
wait_port() { for _ in $(seq 1 300); do ss -ltnH "sport = :$1" | grep -q . && return 0; sleep 0.1; done; return 1; }

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# One run of scenario 5: "rate cpu_us_per_msg" on stdout.
run5() { # uri queue-type-args... ; NODES holds the broker pids
    local uri=$1; shift
    local t0 t1 out rate
    t0=$(sum_ticks "${NODES[@]}")
    out=$("$PERF" --uri "$uri" --producers 1 --consumers 1 --size 1024 --persistent \
        --durable-queues --confirm 1000 --multi-ack 100 --qos 1000 --time "$DUR" --json "$@" 2>/dev/null | tail -n 1)
    t1=$(sum_ticks "${NODES[@]}")
    rate=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["confirmed_rate"])' "$out")
    python3 -c 'import sys; r,t0,t1,hz,d=map(float,sys.argv[1:]); print(f"{r:.0f} {((t1-t0)/hz*1e6)/(r*d) if r else 0:.2f}")' \
        "$rate" "$t0" "$t1" "$HZ" "$DUR"
}

# Warren, 3 nodes.
start_warren_cluster() {
    local peers="1=127.0.0.1:7901,2=127.0.0.1:7902,3=127.0.0.1:7903" i
    WPIDS=()
    mkdir -p "$W" && echo "the benchmark cluster's shared secret" >"$W/secret"
    for i in 1 2 3; do
        "$BIN" --node-id $i --raft-port 790$i --peers "$peers" --cluster-secret-file "$W/secret" \
            --bind 127.0.0.1 --port 590$i \
            --management-port off --prometheus-port off --stream-port off --data-dir "$W/w$i" --log-level warn \
            >"$W/w$i.log" 2>&1 &
        WPIDS+=($!); PIDS+=($!)
    done
    for i in 1 2 3; do wait_port 590$i; done
    sleep 3
}
warren_leader_port() { # the node whose AMQP port is the broker's own (not proxied)
    local i
    for i in 1 2 3; do grep -q "leading: serving clients" "$W/w$i.log" 2>/dev/null && echo 590$i && return; done
    echo 5901
}

# Warren, 1 node.
start_warren_single() {
    "$BIN" --bind 127.0.0.1 --port 5910 --management-port off --prometheus-port off --stream-port off \
        --data-dir "$W/single" --log-level warn >"$W/single.log" 2>&1 &
    SPID=$!; PIDS+=($!)
    wait_port 5910
}

# RabbitMQ, 3 nodes (PEERS.md).
start_rabbit_cluster() {
    local n port dist d
    RPIDS=()
    for n in qa qb qc; do
        case $n in qa) port=5921; dist=25921 ;; qb) port=5922; dist=25922 ;; qc) port=5923; dist=25923 ;; esac
        d="$W/$n"; mkdir -p "$d/home"
        echo -n WARRENBENCHCOOKIE >"$d/home/.erlang.cookie"; chmod 400 "$d/home/.erlang.cookie"
        printf 'listeners.tcp.1 = 127.0.0.1:%s\nloopback_users = none\n' $port >"$d/rabbitmq.conf"
        echo '[].' >"$d/enabled_plugins"
        HOME=$d/home RABBITMQ_NODENAME=$n@localhost RABBITMQ_NODE_PORT=$port RABBITMQ_DIST_PORT=$dist \
            RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_MNESIA_BASE=$d/mnesia RABBITMQ_LOG_BASE=$d/log \
            RABBITMQ_CONFIG_FILE=$d/rabbitmq RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins \
            setsid /usr/lib/rabbitmq/bin/rabbitmq-server >"$d/out.log" 2>&1 &
        wait_port $port
    done
    sleep 5
    for n in qb qc; do
        HOME=$W/$n/home /usr/lib/rabbitmq/bin/rabbitmqctl -n $n@localhost stop_app >/dev/null
        HOME=$W/$n/home /usr/lib/rabbitmq/bin/rabbitmqctl -n $n@localhost join_cluster qa@localhost >/dev/null
        HOME=$W/$n/home /usr/lib/rabbitmq/bin/rabbitmqctl -n $n@localhost start_app >/dev/null
    done
    for port in 5921 5922 5923; do
        RPIDS+=("$(ss -ltnpH "sport = :$port" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)")
    done
    PIDS+=("${RPIDS[@]}")
}

declare -A R
record() { R[$1]="${R[$1]:-} $2"; }
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

start_warren_single
start_warren_cluster
[ "$SKIP_RABBIT" = 1 ] || start_rabbit_cluster
LEADER=$(warren_leader_port)
FOLLOWER=$([ "$LEADER" = 5901 ] && echo 5902 || echo 5901)
QQ=(--queue-arg x-queue-type=quorum)
for r in $(seq 1 "$ROUNDS"); do
    NODES=("$SPID")
    read -r rate cpu < <(run5 amqp://guest:guest@127.0.0.1:5910/%2f --queue "single-$r")
    record single_rate "$rate"; record single_cpu "$cpu"
    NODES=("${WPIDS[@]}")
    read -r rate cpu < <(run5 "amqp://guest:guest@127.0.0.1:$FOLLOWER/%2f" --queue "qqf-$r" "${QQ[@]}")
    record wf_rate "$rate"; record wf_cpu "$cpu"
    read -r rate cpu < <(run5 "amqp://guest:guest@127.0.0.1:$LEADER/%2f" --queue "qql-$r" "${QQ[@]}")
    record wl_rate "$rate"; record wl_cpu "$cpu"
    NODES=("$SPID")
    read -r rate cpu < <(run5 amqp://guest:guest@127.0.0.1:5910/%2f --queue "psingle-$r" --producer-only)
    record ps_rate "$rate"; record ps_cpu "$cpu"
    NODES=("${WPIDS[@]}")
    read -r rate cpu < <(run5 "amqp://guest:guest@127.0.0.1:$LEADER/%2f" --queue "pqq-$r" "${QQ[@]}" --producer-only)
    record pl_rate "$rate"; record pl_cpu "$cpu"
    if [ "$SKIP_RABBIT" != 1 ]; then
        NODES=("${RPIDS[@]}")
        read -r rate cpu < <(run5 amqp://guest:guest@127.0.0.1:5921/%2f --queue "rqq-$r" "${QQ[@]}")
        record rq_rate "$rate"; record rq_cpu "$cpu"
        read -r rate cpu < <(run5 amqp://guest:guest@127.0.0.1:5921/%2f --queue "prqq-$r" "${QQ[@]}" --producer-only)
        record prq_rate "$rate"; record prq_cpu "$cpu"
    fi
    echo "round $r done" >&2
done
# Publish to delivery at a fixed rate, on the leader (quorum queue).
LAT=$("$PERF" --uri "amqp://guest:guest@127.0.0.1:$LEADER/%2f" --queue lat --producers 1 --consumers 1 \
    --size 1024 --persistent --durable-queues --confirm 1000 --multi-ack 100 --qos 1000 \
    --rate 10000 --time "$DUR" --json "${QQ[@]}" 2>/dev/null | tail -n 1)

m() { median "${R[$1]:-0}"; }
printf '%-44s %12s %16s\n' "scenario 5, medians of $ROUNDS x ${DUR}s" "confirmed/s" "broker CPU us/msg"
printf '%-44s %12s %16s\n' "Warren single node, classic durable" "$(m single_rate)" "$(m single_cpu)"
printf '%-44s %12s %16s\n' "Warren 3 nodes, quorum, via a follower" "$(m wf_rate)" "$(m wf_cpu)"
printf '%-44s %12s %16s\n' "Warren 3 nodes, quorum, on the leader" "$(m wl_rate)" "$(m wl_cpu)"
[ "$SKIP_RABBIT" = 1 ] || printf '%-44s %12s %16s\n' "RabbitMQ 3.10.8 3 nodes, quorum" "$(m rq_rate)" "$(m rq_cpu)"
printf '%-44s %12s %16s\n' "publish-only: Warren single node" "$(m ps_rate)" "$(m ps_cpu)"
printf '%-44s %12s %16s\n' "publish-only: Warren 3 nodes, on the leader" "$(m pl_rate)" "$(m pl_cpu)"
python3 -c 'import json,sys; j=json.loads(sys.argv[1]); p50=j["latency_p50_ms"]; p99=j["latency_p99_ms"]; print(f"Warren 3 nodes at 10,000 msg/s: publish to delivery p50 {p50} ms, p99 {p99} ms")' "$LAT"
[ "$SKIP_RABBIT" = 1 ] || printf '%-44s %12s %16s\n' "publish-only: RabbitMQ 3 nodes, quorum" "$(m prq_rate)" "$(m prq_cpu)"
python3 - "$(m single_rate)" "$(m single_cpu)" "$(m wl_rate)" "$(m wl_cpu)" "$(m wf_rate)" "$(m rq_rate)" "$(m rq_cpu)" \
    "$(m ps_rate)" "$(m ps_cpu)" "$(m pl_rate)" "$(m pl_cpu)" "$(m prq_rate)" "$(m prq_cpu)" <<'EOF'
import sys
s, sc, l, lc, f, q, qc, ps, psc, pl, plc, pq, pqc = map(float, sys.argv[1:])
if s and sc:
    print(f"Warren 3 nodes (leader) / single node: rate x{l/s:.2f}, CPU per msg x{lc/sc:.2f}")
if ps and psc:
    print(f"publish-only, Warren 3 nodes / single node: rate x{pl/ps:.2f}, CPU per msg x{plc/psc:.2f}")
if q and lc:
    print(f"Warren 3 nodes / RabbitMQ 3 nodes quorum: rate x{l/q:.2f} (via a follower x{f/q:.2f}), CPU per msg x{qc/lc:.2f} less")
if pq and plc:
    print(f"publish-only, Warren 3 nodes / RabbitMQ 3 nodes quorum: rate x{pl/pq:.2f}, CPU per msg x{pqc/plc:.2f} less")
EOF
