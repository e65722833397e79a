# Shared by perf/shovel.sh and perf/federation.sh (sourced, after they set NAME and PLUGINS):
# the ports, a work dir removed at exit, a private RabbitMQ node with the management plugin and
# PLUGINS (start_rmq), and a release build of Warren (start_warren).
RMQ_PORT=${RMQ_PORT:-5821}
RMQ_DIST_PORT=${RMQ_DIST_PORT:-5822}
RMQ_API_PORT=${RMQ_API_PORT:-5826}
EPMD_PORT=${EPMD_PORT:-5827}
WARREN_PORT=${WARREN_PORT:-5823}
WARREN_API_PORT=${WARREN_API_PORT:-5824}
TARGET=${CARGO_TARGET_DIR:-target}
RMQ_SERVER=/usr/lib/rabbitmq/bin/rabbitmq-server
WORK=$(mktemp -d "/tmp/warren-$NAME.XXXXXX")
RMQ_API=http://127.0.0.1:$RMQ_API_PORT/api
WARREN_API=http://127.0.0.1:$WARREN_API_PORT/api

say() { printf "%s $NAME: %s\n" "$(date +%H:%M:%S)" "$*" >&2; }
listener_pid() { ss -ltnpH "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2; }

RMQ_PID= WARREN_PID=
cleanup() {
    for p in $WARREN_PID $RMQ_PID; do
        kill "$p" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$p" 2>/dev/null
    done
    # The epmd the node started, on a port of its own.
    local epmd
    epmd=$(listener_pid "$EPMD_PORT")
    [ -n "$epmd" ] && [ "$(cat "/proc/$epmd/comm" 2>/dev/null)" = epmd ] && kill "$epmd"
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
    cargo build --release -p warren-perf --bin warren-perf 2>&1 | tail -1
fi
PERF=$TARGET/release/warren-perf

start_rmq() {
    local d=$WORK/rmq
    mkdir -p "$d/home"
    echo "warren${NAME}cookie" >"$d/home/.erlang.cookie"
    chmod 400 "$d/home/.erlang.cookie"
    printf 'listeners.tcp.1 = 127.0.0.1:%s\nloopback_users = none\nmanagement.tcp.port = %s\nmanagement.tcp.ip = 127.0.0.1\ncollect_statistics_interval = 500\n' \
        "$RMQ_PORT" "$RMQ_API_PORT" >"$d/rabbitmq.conf"
    echo "[rabbitmq_management,$PLUGINS]." >"$d/enabled_plugins"
    (
        cd "$d" || exit 1
        export HOME=$d/home ERL_EPMD_PORT=$EPMD_PORT ERL_EPMD_ADDRESS=127.0.0.1 RABBITMQ_NODENAME=warren$NAME@localhost RABBITMQ_NODE_PORT=$RMQ_PORT \
            RABBITMQ_DIST_PORT=$RMQ_DIST_PORT RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
            RABBITMQ_MNESIA_BASE=$d/mnesia RABBITMQ_LOG_BASE=$d/log RABBITMQ_CONFIG_FILE=$d/rabbitmq \
            RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins
        exec setsid "$RMQ_SERVER" >"$d/server.out" 2>&1 </dev/null
    ) &
    for _ in $(seq 120); do
        curl -sf -u guest:guest "$RMQ_API/overview" >/dev/null && break
        sleep 0.5
    done
    RMQ_PID=$(listener_pid "$RMQ_PORT")
    [ -n "$RMQ_PID" ] || { say "RabbitMQ did not start"; tail -20 "$d/server.out" >&2; exit 1; }
    say "RabbitMQ is up (beam.smp pid $RMQ_PID)"
}

start_warren() {
    mkdir -p "$WORK/warren"
    "$TARGET/release/warren" --bind 127.0.0.1 --port "$WARREN_PORT" --stream-port off \
        --management-port "$WARREN_API_PORT" --prometheus-port off \
        --data-dir "$WORK/warren" >"$WORK/warren.log" 2>&1 </dev/null &
    WARREN_PID=$!
    for _ in $(seq 60); do
        curl -sf -u guest:guest "$WARREN_API/overview" >/dev/null && break
        sleep 0.5
    done
    [ "$(listener_pid "$WARREN_PORT")" = "$WARREN_PID" ] || { say "Warren did not start"; exit 1; }
    say "Warren is up (pid $WARREN_PID)"
}

# cpu PID: user+system clock ticks so far.
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
