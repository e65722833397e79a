#!/usr/bin/env bash
# Runs the same AMQP scenarios against a private RabbitMQ node and a release build of Warren,
# alternately (A B A B ...), and prints a table: throughput or latency per broker, the ratio
# Warren/RabbitMQ (of the medians over the rounds), each broker's RSS and its CPU time per message.
#
# Everything listens on and talks to 127.0.0.1 only. See perf/README.md for the knobs; the main
# ones are environment variables:
#   ROUNDS=2  DURATION=10  SCENARIOS="10 1 2 3 4 5 5p 6 7 8 9"  DRAIN_N=1000000  BACKLOG_N=5000000
#   (9t: scenario 9 with transient messages in a non-durable queue; not in the default set)
#   IDLE_N=1000  IDLE_HOLD=10  WARREN=1 (0: RabbitMQ only)  SKIP_BUILD=0  KEEP_WORK=0
#   RMQ_PORT=5801 RMQ_DIST_PORT=5802 WARREN_PORT=5803  CARGO_TARGET_DIR  WARREN_ARGS=""
#   RMQ_TLS_PORT=5804 WARREN_TLS_PORT=5805 (scenarios 1t and 5t: 1 and 5 over TLS)
# Scenario c5 is scenario 5 on replicated brokers: a 3-node Warren cluster against a 3-node
# RabbitMQ cluster with quorum queues, and their publish-only forms (perf/cluster.sh, run after
# the single-node scenarios with ROUNDS and DURATION; CLUSTER_CATCHUP=1 adds perf/catchup.sh).
#   SCENARIOS="5 c5"
# Streams (x-queue-type=stream over AMQP 0-9-1; not in the default set):
#   st:  publish-only into a stream, 1 KiB, confirms (window 1000)
#   stb: STREAM_N x 1 KiB (default 1000000) filled with confirms (data dir per message), read
#        from the first offset by 1 reader, then by 10 readers at once (prefetch 1000, acks
#        every 100), then the time a consumer takes from basic.consume at the middle offset to
#        its first message (ATTACH, ms; connection set-up included), and the time a run takes
#        to publish one more message and delete the stream. STREAM_READERS="1 10" are
#        the reader counts ("" skips the reads: a 10 GB stream's attach time alone)
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")

ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-10}
SCENARIOS=${SCENARIOS:-"10 1 2 3 4 5 5p 6 7 8 9"}
DRAIN_N=${DRAIN_N:-1000000}
BACKLOG_N=${BACKLOG_N:-5000000}
STREAM_N=${STREAM_N:-1000000}
STREAM_READERS=${STREAM_READERS-1 10}
IDLE_N=${IDLE_N:-1000}
IDLE_HOLD=${IDLE_HOLD:-10}
SETTLE=${SETTLE:-2}
WARREN=${WARREN:-1}
SKIP_BUILD=${SKIP_BUILD:-0}
KEEP_WORK=${KEEP_WORK:-0}
RMQ_PORT=${RMQ_PORT:-5801}
RMQ_DIST_PORT=${RMQ_DIST_PORT:-5802}
WARREN_PORT=${WARREN_PORT:-5803}
WARREN_ARGS=${WARREN_ARGS:-}
RMQ_TLS_PORT=${RMQ_TLS_PORT:-5804}
WARREN_TLS_PORT=${WARREN_TLS_PORT:-5805}
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
PERF_BIN=${PERF_BIN:-$TARGET_DIR/release/warren-perf}
WARREN_BIN=${WARREN_BIN:-$TARGET_DIR/release/warren}
RMQ_SERVER=/usr/lib/rabbitmq/bin/rabbitmq-server

WORK=$(mktemp -d /tmp/warren-compare.XXXXXX)
RES=$WORK/results
mkdir -p "$RES"
LOG=$WORK/runs.log
CLK_TCK=$(getconf CLK_TCK)

RMQ_OK=0
RMQ_PID=
RMQ_DIR=$WORK/rabbitmq
WARREN_OK=0
WARREN_PID=
WARREN_DATA=$WORK/warren-data
EPMD_WAS_RUNNING=0
SAMPLER_PID=

say() { printf '%s compare: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

listener_pid() { # PID of the process listening on 127.0.0.1/0.0.0.0 port $1
    ss -ltnpH "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2
}

port_busy() { [ -n "$(ss -ltnH "sport = :$1" 2>/dev/null)" ]; }

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

cpu_ticks() { # utime + stime of a process, in clock ticks (fields 14 and 15 of /proc/PID/stat)
    local s
    s=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
    s=${s##*) }
    awk '{print $12 + $13}' <<<"$s"
}

stop_pid() { # stop one process by PID: TERM, wait up to $2 s, then KILL
    local pid=$1 wait=${2:-15} i
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < wait * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null
}

stop_sampler() {
    if [ -n "$SAMPLER_PID" ]; then
        kill "$SAMPLER_PID" 2>/dev/null
        wait "$SAMPLER_PID" 2>/dev/null
        SAMPLER_PID=
    fi
}

stop_brokers() { # the single Warren and RabbitMQ nodes, before the cluster scenario
    stop_sampler
    [ -n "$WARREN_PID" ] && stop_pid "$WARREN_PID" 10
    [ -n "$RMQ_PID" ] && stop_pid "$RMQ_PID" 30
    WARREN_PID=
    RMQ_PID=
}

# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
    stop_sampler
    if [ -n "$WARREN_PID" ]; then
        say "stopping Warren (pid $WARREN_PID)"
        stop_pid "$WARREN_PID" 10
        WARREN_PID=
    fi
    if [ -n "$RMQ_PID" ]; then
        say "stopping RabbitMQ (pid $RMQ_PID)"
        stop_pid "$RMQ_PID" 30
        RMQ_PID=
    fi
    # Our node started epmd if none was running before; stop that one too.
    local epmd
    epmd=$(listener_pid 4369)
    if [ "$EPMD_WAS_RUNNING" = 0 ] && [ -n "$epmd" ]; then
        stop_pid "$epmd" 5
    fi
    rm -rf "$RMQ_DIR/mnesia" "$WARREN_DATA"
    if [ "$KEEP_WORK" = 1 ]; then
        say "logs and results kept in $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

uri() { echo "amqp://guest:guest@127.0.0.1:$1/%2f"; }
tls_uri() { echo "amqps://guest:guest@localhost:$1/%2f"; }

# Scenarios 1t and 5t run over TLS: one CA and a server certificate (for localhost and
# 127.0.0.1) that both brokers use.
TLS_DIR=$WORK/tls
wants_tls() { case " $SCENARIOS " in *t\ *) return 0 ;; *) return 1 ;; esac; }
make_certs() {
    mkdir -p "$TLS_DIR" && cd "$TLS_DIR" || return 1
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
        -subj "/CN=compare CA" -keyout ca.key -out ca.pem 2>/dev/null &&
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
            -keyout key.pem -out server.csr 2>/dev/null &&
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >server.ext &&
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
            -extfile server.ext -out cert.pem 2>/dev/null
    local rc=$?
    chmod 644 "$TLS_DIR"/*.pem
    cd - >/dev/null || return 1
    return $rc
}

# ---------------------------------------------------------------------------------------------
# Setup

ensure_rabbitmq() {
    if [ ! -x "$RMQ_SERVER" ]; then
        say "installing rabbitmq-server (Debian package)"
        apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q rabbitmq-server >&2
    fi
    [ -x "$RMQ_SERVER" ]
}

build() {
    [ "$SKIP_BUILD" = 1 ] && return 0
    say "building warren-perf (release)"
    (cd "$REPO" && cargo build --release -p warren-perf --target-dir "$TARGET_DIR") >&2 || return 1
    if [ "$WARREN" = 1 ]; then
        say "building warren (release)"
        if ! (cd "$REPO" && cargo build --release -p warren --target-dir "$TARGET_DIR") >&2; then
            say "Warren did not build: its column will be n/a"
            WARREN=0 # do not run a stale binary
        fi
    fi
}

start_rabbitmq() {
    local port=$RMQ_PORT i
    mkdir -p "$RMQ_DIR/home" "$RMQ_DIR/log" "$RMQ_DIR/mnesia"
    head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$RMQ_DIR/home/.erlang.cookie"
    chmod 400 "$RMQ_DIR/home/.erlang.cookie"
    printf 'listeners.tcp.1 = 127.0.0.1:%s\nloopback_users = none\n' "$port" >"$RMQ_DIR/rabbitmq.conf"
    if wants_tls; then
        printf '%s\n' "listeners.ssl.1 = 127.0.0.1:$RMQ_TLS_PORT" \
            "ssl_options.cacertfile = $TLS_DIR/ca.pem" "ssl_options.certfile = $TLS_DIR/cert.pem" \
            "ssl_options.keyfile = $TLS_DIR/key.pem" "ssl_options.verify = verify_none" \
            "ssl_options.fail_if_no_peer_cert = false" >>"$RMQ_DIR/rabbitmq.conf"
    fi
    echo '[].' >"$RMQ_DIR/enabled_plugins"
    [ -n "$(listener_pid 4369)" ] && EPMD_WAS_RUNNING=1
    say "starting RabbitMQ on 127.0.0.1:$port (dist port $RMQ_DIST_PORT, data in $RMQ_DIR)"
    (
        cd "$RMQ_DIR" || exit 1
        export HOME=$RMQ_DIR/home RABBITMQ_NODENAME=warrencmp$port@localhost \
            RABBITMQ_NODE_PORT=$port RABBITMQ_DIST_PORT=$RMQ_DIST_PORT \
            RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_MNESIA_BASE=$RMQ_DIR/mnesia \
            RABBITMQ_LOG_BASE=$RMQ_DIR/log RABBITMQ_CONFIG_FILE=$RMQ_DIR/rabbitmq \
            RABBITMQ_ENABLED_PLUGINS_FILE=$RMQ_DIR/enabled_plugins
        exec setsid "$RMQ_SERVER" >"$RMQ_DIR/server.out" 2>&1 </dev/null
    ) &
    for ((i = 0; i < 120; i++)); do
        RMQ_PID=$(listener_pid "$port")
        [ -n "$RMQ_PID" ] && break
        sleep 0.5
    done
    if [ -z "$RMQ_PID" ]; then
        say "RabbitMQ did not open its port; last lines of its output:"
        tail -20 "$RMQ_DIR/server.out" >&2
        return 1
    fi
    if "$PERF_BIN" --uri "$(uri "$port")" --check --connect-timeout 60 >/dev/null 2>>"$LOG"; then
        RMQ_OK=1
        say "RabbitMQ is up (beam.smp pid $RMQ_PID, RSS $(($(rss_kb "$RMQ_PID") / 1024)) MiB)"
    else
        say "RabbitMQ does not accept connections"
        return 1
    fi
}

start_warren() {
    local port=$WARREN_PORT i
    if [ "$WARREN" != 1 ]; then
        say "WARREN=0: RabbitMQ only"
        return 1
    fi
    if [ ! -x "$WARREN_BIN" ]; then
        say "no Warren binary at $WARREN_BIN: its column will be n/a"
        return 1
    fi
    mkdir -p "$WARREN_DATA"
    say "starting Warren on port $port (data in $WARREN_DATA)"
    # shellcheck disable=SC2086 # WARREN_ARGS is a list of extra arguments
    (
        ulimit -n 65536 2>/dev/null
        tls=()
        wants_tls && tls=(--amqps-port "$WARREN_TLS_PORT" --tls-cert "$TLS_DIR/cert.pem"
            --tls-key "$TLS_DIR/key.pem" --management-tls-port off --prometheus-tls-port off)
        exec "$WARREN_BIN" --bind 127.0.0.1 --port "$port" --stream-port off --data-dir "$WARREN_DATA" "${tls[@]}" $WARREN_ARGS
    ) >"$WORK/warren.log" 2>&1 </dev/null &
    WARREN_PID=$!
    for ((i = 0; i < 60; i++)); do
        kill -0 "$WARREN_PID" 2>/dev/null || break
        [ "$(listener_pid "$port")" = "$WARREN_PID" ] && break
        sleep 0.5
    done
    if kill -0 "$WARREN_PID" 2>/dev/null && [ "$(listener_pid "$port")" = "$WARREN_PID" ] &&
        "$PERF_BIN" --uri "$(uri "$port")" --check --connect-timeout 20 >/dev/null 2>>"$LOG"; then
        WARREN_OK=1
        say "Warren is up (pid $WARREN_PID, RSS $(($(rss_kb "$WARREN_PID") / 1024)) MiB)"
        return 0
    fi
    say "Warren did not start or does not accept connections: its column will be n/a"
    tail -5 "$WORK/warren.log" >&2
    stop_pid "$WARREN_PID" 5
    WARREN_PID=
    return 1
}

# ---------------------------------------------------------------------------------------------
# Measuring

broker_port() { [ "$1" = rmq ] && echo "$RMQ_PORT" || echo "$WARREN_PORT"; }
broker_tls_port() { [ "$1" = rmq ] && echo "$RMQ_TLS_PORT" || echo "$WARREN_TLS_PORT"; }
# Set while a TLS scenario runs: run_perf connects over amqps.
OVER_TLS=0
broker_pid() { [ "$1" = rmq ] && echo "$RMQ_PID" || echo "$WARREN_PID"; }
broker_up() {
    local pid
    pid=$(broker_pid "$1")
    if [ "$1" = rmq ]; then [ "$RMQ_OK" = 1 ]; else [ "$WARREN_OK" = 1 ]; fi || return 1
    if ! kill -0 "$pid" 2>/dev/null; then
        say "$1 (pid $pid) has died"
        if [ "$1" = rmq ]; then RMQ_OK=0; else WARREN_OK=0; fi
        return 1
    fi
}
data_dir() { [ "$1" = rmq ] && echo "$RMQ_DIR/mnesia" || echo "$WARREN_DATA"; }

# Peak RSS of a PID, sampled every 0.5 s into a file, until stop_sampler.
start_sampler() {
    local pid=$1 out=$2
    echo 0 >"$out"
    (
        peak=0
        while kill -0 "$pid" 2>/dev/null; do
            r=$(rss_kb "$pid")
            if [ "${r:-0}" -gt "$peak" ]; then
                peak=$r
                echo "$peak" >"$out"
            fi
            sleep 0.5
        done
    ) &
    SAMPLER_PID=$!
}

# jget KEY FILE: a number (or null) from warren-perf's one-line JSON output.
jget() { grep -o "\"$1\":[^,}]*" "$2" 2>/dev/null | head -1 | cut -d: -f2; }

# record METRIC BROKER VALUE: one round's value.
record() { echo "$3" >>"$RES/$1.$2"; }

# record_json METRIC BROKER JSONKEY FILE: a value from warren-perf's output, plus the client's CPU
# use in that run (to flag results where the one-thread client, not the broker, was the limit).
record_json() {
    record "$1" "$2" "$(jget "$3" "$4")"
    record "$1.client" "$2" "$(jget client_cpu_percent "$4")"
}

# run_perf BROKER OUT TIMEOUT ARGS...: run warren-perf against a broker, JSON to OUT.
run_perf() {
    local b=$1 out=$2 t=$3
    shift 3
    local target=(--uri "$(uri "$(broker_port "$b")")")
    [ "$OVER_TLS" = 1 ] && target=(--uri "$(tls_uri "$(broker_tls_port "$b")")" --tls-ca "$TLS_DIR/ca.pem")
    echo "== $b: warren-perf ${target[*]} $*" >>"$LOG"
    timeout -k 10 "$t" "$PERF_BIN" "${target[@]}" --json --interval 0 "$@" \
        >"$out" 2>>"$LOG"
    local rc=$?
    cat "$out" >>"$LOG"
    [ $rc = 0 ] || say "$b: warren-perf exited with $rc ($*)"
    return $rc
}

# Brackets a measured phase: CPU ticks and RSS sampling of the broker process.
phase_begin() {
    PHASE_PID=$(broker_pid "$1")
    PHASE_T0=$(cpu_ticks "$PHASE_PID")
    start_sampler "$PHASE_PID" "$WORK/peak"
}

# phase_end BROKER SCENARIO JSONFILE: records broker CPU us/msg and RSS peak/after for the scenario.
phase_end() {
    local b=$1 s=$2 f=$3 t1 pub con n
    t1=$(cpu_ticks "$PHASE_PID")
    stop_sampler
    pub=$(jget published "$f")
    con=$(jget consumed "$f")
    n=$(awk -v a="${pub:-0}" -v b="${con:-0}" 'BEGIN {print (a > b ? a : b) + 0}')
    if [ "$n" -gt 0 ] 2>/dev/null; then
        record "s$s.cpu" "$b" "$(awk -v d=$((t1 - PHASE_T0)) -v hz="$CLK_TCK" -v n="$n" \
            'BEGIN {printf "%.2f", d / hz * 1e6 / n}')"
    fi
    record "s$s.rsspeak" "$b" "$(($(cat "$WORK/peak") / 1024))"
    record "s$s.rssafter" "$b" "$(($(rss_kb "$PHASE_PID") / 1024))"
}

# A plain load scenario: scenario number, metric name(s) to record as key=jsonkey, then args.
load_scenario() {
    local b=$1 s=$2 metrics=$3
    shift 3
    local f=$WORK/s$s.$b.json m
    phase_begin "$b"
    run_perf "$b" "$f" $((DURATION + 60)) --time "$DURATION" --queue "perf-s$s" "$@"
    phase_end "$b" "$s" "$f"
    for m in $metrics; do
        record_json "${m%%=*}" "$b" "${m#*=}" "$f"
    done
}

# backlog_scenario BROKER SCENARIO [--durable-queues [--persistent]]: BACKLOG_N x 1 KiB published
# with confirms (window 1000) into one queue with no consumer, then drained with manual acks.
backlog_scenario() {
    local b=$1 s=$2 pe t f kb durable=()
    shift 2
    [ "${1:-}" = --durable-queues ] && durable=(--durable-queues)
    pe=1000000
    [ "$BACKLOG_N" -lt 2000000 ] && pe=$(((BACKLOG_N + 4) / 5))
    t=$((BACKLOG_N / 500 + 300))
    f=$WORK/s${s}fill.$b.json
    phase_begin "$b"
    run_perf "$b" "$f" "$t" --producer-only --pmessages "$BACKLOG_N" "$@" \
        --confirm 1000 --size 1024 --time 0 --keep --progress-every "$pe" --queue "perf-s$s"
    phase_end "$b" "$s" "$f"
    record_json "s$s" "$b" confirmed_rate "$f"
    record_json "s${s}first" "$b" publish_rate_first_interval "$f"
    record_json "s${s}last" "$b" publish_rate_last_interval "$f"
    record "s${s}blocked" "$b" "$(jget blocked "$f")"
    record "s${s}rss" "$b" "$(($(rss_kb "$(broker_pid "$b")") / 1024))"
    kb=$(du -sk "$(data_dir "$b")" 2>/dev/null | cut -f1)
    record "s${s}disk" "$b" "$((kb / 1024))"
    record "s${s}permsg" "$b" "$(awk -v k="$kb" -v n="$BACKLOG_N" 'BEGIN {printf "%.0f", k * 1024 / n}')"
    f=$WORK/s${s}drain.$b.json
    phase_begin "$b"
    run_perf "$b" "$f" "$t" --consumer-only --drain "${durable[@]}" --multi-ack 100 --qos 1000 \
        --time 0 --queue "perf-s$s"
    phase_end "$b" "${s}d" "$f"
    record_json "s${s}d" "$b" consumed_rate "$f"
}

STREAM=(--durable-queues --queue-arg x-queue-type=stream)

# stream_backlog BROKER: scenario stb (see the top of this file).
stream_backlog() {
    local b=$1 f t kb pe t0 t1 q=perf-stb
    t=$((STREAM_N / 500 + 300))
    pe=$(((STREAM_N + 4) / 5))
    f=$WORK/sstbfill.$b.json
    phase_begin "$b"
    run_perf "$b" "$f" "$t" "${STREAM[@]}" --producer-only --pmessages "$STREAM_N" --persistent \
        --confirm 1000 --size 1024 --time 0 --keep --progress-every "$pe" --queue "$q"
    phase_end "$b" stbfill "$f"
    record_json sstbfill "$b" confirmed_rate "$f"
    kb=$(du -sk "$(data_dir "$b")" 2>/dev/null | cut -f1)
    record sstbpermsg "$b" "$(awk -v k="$kb" -v n="$STREAM_N" 'BEGIN {printf "%.0f", k * 1024 / n}')"
    for readers in $STREAM_READERS; do
        f=$WORK/sstb$readers.$b.json
        phase_begin "$b"
        run_perf "$b" "$f" "$t" "${STREAM[@]}" --consumer-only --consumers "$readers" \
            --cmessages $((STREAM_N * readers)) --qos 1000 --multi-ack 100 \
            --consumer-arg x-stream-offset=first --time 0 --keep --queue "$q"
        phase_end "$b" "stb$readers" "$f"
        record_json "sstb$readers" "$b" consumed_rate "$f"
    done
    f=$WORK/sstbattach.$b.json
    t0=$(date +%s%N)
    run_perf "$b" "$f" 120 "${STREAM[@]}" --consumer-only --consumers 1 --cmessages 1 --qos 10 \
        --consumer-arg "x-stream-offset=$((STREAM_N / 2))" --time 0 --keep --queue "$q"
    t1=$(date +%s%N)
    record sstbattach "$b" "$(((t1 - t0) / 1000000))"
    # Then the stream goes (one more message, and the run deletes what it declared).
    f=$WORK/sstbdelete.$b.json
    t0=$(date +%s%N)
    run_perf "$b" "$f" 300 "${STREAM[@]}" --producer-only --pmessages 1 --confirm 1 --time 0 \
        --queue "$q"
    t1=$(date +%s%N)
    record sstbdelete "$b" "$(((t1 - t0) / 1000000))"
}

scenario() {
    local s=$1 b=$2 f pe t
    case $s in
    1) load_scenario "$b" 1 "s1=consumed_rate" --producers 1 --consumers 1 --size 16 --autoack ;;
    1t)
        OVER_TLS=1
        load_scenario "$b" 1t "s1t=consumed_rate" --producers 1 --consumers 1 --size 16 --autoack
        OVER_TLS=0
        ;;
    5t)
        OVER_TLS=1
        load_scenario "$b" 5t "s5t=confirmed_rate s5tc=consumed_rate" --producers 1 --consumers 1 \
            --size 1024 --persistent --durable-queues --confirm 1000 --multi-ack 100 --qos 1000
        OVER_TLS=0
        ;;
    2) load_scenario "$b" 2 "s2=consumed_rate" --producers 1 --consumers 1 --size 1024 --autoack ;;
    3) load_scenario "$b" 3 "s3=published_rate" --producer-only --producers 1 --size 16 ;;
    4)
        f=$WORK/s4fill.$b.json
        t=$((DRAIN_N / 5000 + 120))
        run_perf "$b" "$f" "$t" --producer-only --pmessages "$DRAIN_N" --confirm 1000 --size 16 \
            --time 0 --keep --queue perf-s4
        record_json s4fill "$b" confirmed_rate "$f"
        record s4rss "$b" "$(($(rss_kb "$(broker_pid "$b")") / 1024))"
        f=$WORK/s4.$b.json
        phase_begin "$b"
        run_perf "$b" "$f" "$t" --consumer-only --drain --autoack --time 0 --queue perf-s4
        phase_end "$b" 4 "$f"
        record_json s4 "$b" consumed_rate "$f"
        ;;
    5) load_scenario "$b" 5 "s5=confirmed_rate s5c=consumed_rate" --producers 1 --consumers 1 \
        --size 1024 --persistent --durable-queues --confirm 1000 --multi-ack 100 --qos 1000 ;;
    5p) load_scenario "$b" 5p "s5p=confirmed_rate" --producer-only --producers 1 --size 1024 \
        --persistent --durable-queues --confirm 1000 ;;
    6) load_scenario "$b" 6 "s6=consumed_rate" --producers 1 --fanout 10 --size 256 --autoack ;;
    7) load_scenario "$b" 7 "s7=consumed_rate" --producers 4 --consumers 4 --queues 4 --size 256 \
        --autoack ;;
    8) load_scenario "$b" 8 "s8=latency_p50_ms s8p99=latency_p99_ms" --producers 1 --consumers 1 \
        --rate 1000 --size 1024 --autoack ;;
    9) backlog_scenario "$b" 9 --durable-queues --persistent ;;
    st) load_scenario "$b" st "sst=confirmed_rate" "${STREAM[@]}" --producer-only --producers 1 \
        --size 1024 --persistent --confirm 1000 ;;
    stb) stream_backlog "$b" ;;
    9t) backlog_scenario "$b" 9t ;;
    10)
        local pid err=$WORK/idle.$b.err base peak=0 r i
        pid=$(broker_pid "$b")
        base=$(rss_kb "$pid")
        f=$WORK/s10.$b.json
        : >"$err"
        echo "== $b: warren-perf --idle-connections $IDLE_N --hold $IDLE_HOLD" >>"$LOG"
        timeout -k 10 $((IDLE_N / 10 + IDLE_HOLD + 120)) "$PERF_BIN" --uri "$(uri "$(broker_port "$b")")" \
            --json --idle-connections "$IDLE_N" --hold "$IDLE_HOLD" --queue perf-s10 >"$f" 2>"$err" &
        local idle_pid=$!
        while kill -0 "$idle_pid" 2>/dev/null && ! grep -q holding "$err"; do sleep 0.2; done
        if grep -q holding "$err"; then
            sleep 1
            for ((i = 0; i < IDLE_HOLD - 2 && i < 5; i++)); do
                r=$(rss_kb "$pid")
                [ "${r:-0}" -gt "$peak" ] && peak=$r
                sleep 0.5
            done
            [ "$peak" = 0 ] && peak=$(rss_kb "$pid")
        fi
        wait "$idle_pid"
        cat "$err" "$f" >>"$LOG"
        if [ "$peak" -gt 0 ]; then
            record s10 "$b" "$(awk -v p="$peak" -v b0="$base" -v n="$IDLE_N" 'BEGIN {printf "%.1f", (p - b0) / n}')"
            record s10.rsspeak "$b" $((peak / 1024))
        fi
        record_json s10open "$b" connections_per_sec "$f"
        record s10.rssafter "$b" "$(($(rss_kb "$pid") / 1024))"
        ;;
    *) say "unknown scenario $s" ;;
    esac
}

# ---------------------------------------------------------------------------------------------
# Report

median() { # median of the numeric lines of a file, or empty
    [ -f "$1" ] || return 0
    grep -E '^-?[0-9.]+(e[-+]?[0-9]+)?$' "$1" | sort -g |
        awk '{v[NR] = $1} END {if (NR == 0) exit; if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

client_bound() { # true if the client used > 90% of its core in any round of metric $1 on broker $2
    [ -f "$RES/$1.client.$2" ] && awk '$1 + 0 > 90 {hit = 1} END {exit !hit}' "$RES/$1.client.$2"
}

fmt() { # value -> compact string, "n/a" when empty
    if [ -z "$1" ]; then
        echo "n/a"
    else
        awk -v v="$1" 'BEGIN {if (v >= 1000) printf "%.0f", v; else if (v >= 10) printf "%.1f", v; else printf "%.3g", v}'
    fi
}

rss_cell() { # "peak/after" MiB for a scenario and broker, or n/a
    local p a
    p=$(median "$RES/$1.rsspeak.$2")
    a=$(median "$RES/$1.rssafter.$2")
    if [ -z "$p" ] && [ -z "$a" ]; then echo "n/a"; else echo "$(fmt "$p")/$(fmt "$a")"; fi
}

row() { # metric label [scenario-for-rss-and-cpu]
    local m=$1 label=$2 s=${3:-} a w ratio ra rw ca cw
    a=$(median "$RES/$m.rmq")
    w=$(median "$RES/$m.warren")
    ratio=
    if [ -n "$a" ] && [ -n "$w" ]; then
        ratio=$(awk -v a="$a" -v w="$w" 'BEGIN {if (a != 0) printf "%.2f", w / a}')
    fi
    ra="-" rw="-" ca="-" cw="-"
    if [ -n "$s" ]; then
        ra=$(rss_cell "s$s" rmq)
        rw=$(rss_cell "s$s" warren)
        ca=$(fmt "$(median "$RES/s$s.cpu.rmq")")
        cw=$(fmt "$(median "$RES/s$s.cpu.warren")")
    fi
    local va vw
    va=$(fmt "$a")
    vw=$(fmt "$w")
    client_bound "$m" rmq && va="*$va"
    client_bound "$m" warren && vw="*$vw"
    printf '%-44s %11s %11s %7s %13s %13s %8s %8s\n' "$label" "$va" "$vw" \
        "${ratio:-n/a}" "$ra" "$rw" "$ca" "$cw"
}

report() {
    local s
    echo
    echo "Warren vs RabbitMQ: rounds=$ROUNDS duration=${DURATION}s, medians of rounds; ratio = Warren/RabbitMQ"
    echo "load average at start: $LOAD_START; at end: $(cut -d' ' -f1-3 /proc/loadavg) (above ~1 means something else competed for the 2 cores)"
    echo "RSS = peak/after the scenario, MiB; CPU = broker utime+stime per message (us), messages = max(published, delivered)"
    printf '%-44s %11s %11s %7s %13s %13s %8s %8s\n' scenario RabbitMQ Warren ratio "RSS RMQ" "RSS Warren" \
        "CPU RMQ" "CPU W"
    row idle "0  idle RSS after start (MiB)"
    for s in $SCENARIOS; do
        case $s in
        1) row s1 "1  1p/1c 16 B autoack (msg/s)" 1 ;;
        1t) row s1t "1t 1 over TLS (msg/s)" 1t ;;
        5t)
            row s5t "5t 5 over TLS (confirmed/s)" 5t
            row s5tc "5t   consumed (msg/s)"
            ;;
        2) row s2 "2  1p/1c 1 KiB autoack (msg/s)" 2 ;;
        3) row s3 "3  publish only 16 B (msg/s)" 3 ;;
        4)
            row s4fill "4  fill $DRAIN_N x 16 B, confirms (msg/s)"
            row s4rss "4  RSS with the backlog queued (MiB)"
            row s4 "4  drain the backlog, autoack (msg/s)" 4
            ;;
        5)
            row s5 "5  persistent 1 KiB confirm+ack (confirmed/s)" 5
            row s5c "5    consumed (msg/s)"
            ;;
        5p) row s5p "5p publish only persistent 1 KiB (confirmed/s)" 5p ;;
        6) row s6 "6  fanout x10 256 B (deliveries/s)" 6 ;;
        7) row s7 "7  4p/4q/4c 256 B (msg/s)" 7 ;;
        8)
            row s8 "8  latency @1000 msg/s 1 KiB p50 (ms)" 8
            row s8p99 "8    p99 (ms, lower is better)"
            ;;
        9 | 9t)
            local what="persistent 1 KiB"
            [ "$s" = 9t ] && what="transient 1 KiB"
            row "s$s" "$s fill $BACKLOG_N $what (msg/s)" "$s"
            row "s${s}first" "    first interval (msg/s)"
            row "s${s}last" "    last interval (msg/s)"
            row "s${s}blocked" "    publishers blocked (times)"
            row "s${s}rss" "    RSS when full (MiB)"
            row "s${s}disk" "    data dir when full (MiB)"
            row "s${s}permsg" "    data dir per message (bytes)"
            row "s${s}d" "$s drain it, manual ack (msg/s)" "${s}d"
            ;;
        st) row sst "st publish 1 KiB into a stream (confirmed/s)" st ;;
        stb)
            row sstbfill "stb fill $STREAM_N x 1 KiB stream (confirmed/s)" stbfill
            row sstbpermsg "    data dir per message (bytes)"
            row sstb1 "    read from first, 1 reader (msg/s)" stb1
            row sstb10 "    read from first, 10 readers (deliveries/s)" stb10
            row sstbattach "    attach at the middle offset (ms)"
            row sstbdelete "    publish one, then delete the stream (ms)"
            ;;
        10)
            row s10 "10 $IDLE_N idle consumers: RSS/conn (KiB)" 10
            row s10open "10   connections opened per second"
            ;;
        esac
    done
    echo "* = the one-thread client used over 90% of its core in a round: the client, not the broker, was the limit"
    local p b c0 c1
    for p in 1 5; do
        case " $SCENARIOS " in *" ${p}t "*) ;; *) continue ;; esac
        for b in rmq warren; do
            c0=$(median "$RES/s$p.cpu.$b")
            c1=$(median "$RES/s${p}t.cpu.$b")
            [ -n "$c0" ] && [ -n "$c1" ] && awk -v p="$p" -v b="$b" -v a="$c0" -v t="$c1" \
                'BEGIN {printf "TLS cost, scenario %s, %s: CPU per message %.2f us plain, %.2f us TLS (x%.2f)\n", p, b, a, t, t / a}'
        done
    done
    [ "$WARREN_OK" = 1 ] || echo "(Warren: n/a — it did not build, start or stay up; see above)"
}

# ---------------------------------------------------------------------------------------------
# Main

for p in "$RMQ_PORT" "$RMQ_DIST_PORT" "$WARREN_PORT" "$RMQ_TLS_PORT" "$WARREN_TLS_PORT"; do
    if port_busy "$p"; then
        say "port $p is already in use; set RMQ_PORT / RMQ_DIST_PORT / WARREN_PORT"
        exit 1
    fi
done
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
ensure_rabbitmq || { say "cannot install rabbitmq-server"; exit 1; }
if wants_tls; then
    make_certs || { say "cannot make TLS certificates (openssl)"; exit 1; }
fi
build || { say "warren-perf did not build"; exit 1; }
[ -x "$PERF_BIN" ] || { say "no warren-perf at $PERF_BIN"; exit 1; }
start_rabbitmq || say "RabbitMQ is not available: its column will be n/a"
start_warren
sleep "$SETTLE"
[ "$RMQ_OK" = 1 ] && record idle rmq $(($(rss_kb "$RMQ_PID") / 1024))
[ "$WARREN_OK" = 1 ] && record idle warren $(($(rss_kb "$WARREN_PID") / 1024))

CLUSTER=0
case " $SCENARIOS " in *" c5 "*) CLUSTER=1 ;; esac
SCENARIOS=$(tr ' ' '\n' <<<"$SCENARIOS" | grep -vx c5 | tr '\n' ' ')
for s in $SCENARIOS; do
    for ((r = 1; r <= ROUNDS; r++)); do
        for b in rmq warren; do
            broker_up "$b" || continue
            say "scenario $s, round $r/$ROUNDS, $([ "$b" = rmq ] && echo RabbitMQ || echo Warren)"
            scenario "$s" "$b"
            sleep "$SETTLE"
        done
    done
done

[ -n "${SCENARIOS// /}" ] && report | tee "$WORK/report.txt"
if [ "$CLUSTER" = 1 ]; then
    # The single nodes stop first: the clusters need the cores and the disk.
    stop_brokers
    say "scenario c5: 3-node clusters (perf/cluster.sh)"
    ROUNDS=$ROUNDS DUR=$DURATION "$HERE/cluster.sh" | tee -a "$WORK/report.txt"
    [ "${CLUSTER_CATCHUP:-0}" = 1 ] && "$HERE/catchup.sh" | tee -a "$WORK/report.txt"
fi
[ -n "${RESULTS_FILE:-}" ] && cp "$WORK/report.txt" "$RESULTS_FILE"
exit 0
