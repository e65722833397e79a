#!/usr/bin/env bash
# How fast a follower that was down catches up: a 3-node Warren cluster, one
# follower stopped (SIGTERM), MSGS persistent 1 KiB messages published with
# confirms to a quorum queue on the leader (kept), then the follower started
# again; the time from its start until its applied index (its own
# Prometheus /metrics) reaches the leader's commit index. Run once with the
# default snapshot policy (the follower replays the log) and once with
# snapshots every 200 entries (it installs a snapshot, then the log's tail).
#
#   perf/catchup.sh              # MSGS=1000000
#   MSGS=200000 perf/catchup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MSGS=${MSGS:-1000000}
W=${W:-/tmp/warren-catchup-bench}
BIN=target/release/warren
PERF=target/release/warren-perf
cargo build --release -q -p warren -p warren-perf

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_port() { for _ in $(seq 1 300); do ss -ltnH "sport = :$1" | grep -q . && return 0; sleep 0.1; done; return 1; }
metric() { # port name
    curl -s "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n {print $2}'
}
peers="1=127.0.0.1:7931,2=127.0.0.1:7932,3=127.0.0.1:7933"
start() { # node-id config
    RUST_LOG=info,openraft=warn "$BIN" --config "$2" --node-id "$1" --raft-port "793$1" --peers "$peers" \
        --cluster-secret-file "$W/secret" --bind 127.0.0.1 \
        --port "593$1" --management-port off --prometheus-port "1593$1" --stream-port off --data-dir "$W/w$1" \
        --log-level info >>"$W/w$1.log" 2>&1 &
    NODE[$1]=$!; PIDS+=($!); disown "$!"
}

run() { # label toml
    rm -rf "$W" && mkdir -p "$W"
    printf '%s\n' "$2" >"$W/warren.toml"
    echo "the benchmark cluster's shared secret" >"$W/secret"
    declare -gA NODE
    for i in 1 2 3; do start $i "$W/warren.toml"; done
    for i in 1 2 3; do wait_port "1593$i"; done
    local leader=0 i
    for _ in $(seq 1 100); do
        for i in 1 2 3; do [ "$(metric 1593$i warren_raft_is_leader)" = 1 ] && leader=$i; done
        [ $leader != 0 ] && break
        sleep 0.1
    done
    local f=$(( leader % 3 + 1 ))
    kill -TERM "${NODE[$f]}"; while kill -0 "${NODE[$f]}" 2>/dev/null; do sleep 0.1; done
    local t0 t1
    t0=$(date +%s.%N)
    "$PERF" --uri "amqp://guest:guest@127.0.0.1:593$leader/%2f" --producers 1 --consumers 0 --size 1024 \
        --persistent --durable-queues --confirm 1000 --pmessages "$MSGS" --time 0 --keep --queue catchup \
        --queue-arg x-queue-type=quorum --json >/dev/null 2>&1
    t1=$(date +%s.%N)
    local target
    target=$(metric "1593$leader" rabbitmq_raft_log_commit_index)
    start $f "$W/warren.toml"
    local s0 applied=0
    s0=$(date +%s.%N)
    while :; do
        applied=$(metric "1593$f" rabbitmq_raft_log_last_applied_index || echo 0)
        [ -n "$applied" ] && [ "$applied" -ge "$target" ] && break
        sleep 0.05
    done
    local s1 how=log
    s1=$(date +%s.%N)
    grep -q "snapshot installed" "$W/w$f.log" && how="snapshot + log"
    python3 - "$1" "$MSGS" "$t0" "$t1" "$s0" "$s1" "$target" "$how" <<'EOF'
import sys
label, n, t0, t1, s0, s1, target, how = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:7]), sys.argv[7], sys.argv[8]
pub, catch = t1 - t0, s1 - s0
print(f"{label}: {n} msgs published in {pub:.1f} s ({n/pub:.0f}/s) while a follower was down;"
      f" it caught up ({how}, to commit index {target}) in {catch:.1f} s from its start: {n/catch:.0f} msg/s")
EOF
    cleanup; PIDS=()
    sleep 1
}

run "log replay" "[cluster]"
run "snapshot" "[cluster]
snapshot_every = 200
log_keep = 50"
