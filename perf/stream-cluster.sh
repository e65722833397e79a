#!/usr/bin/env bash
# Publishing over the stream protocol to a 3-node Warren cluster, beside a
# single node: COUNT messages of each size in SIZES, in batches of 100
# with confirms (warren-stream-perf, no reads), into a new stream through
# the leader, then the same into the single node; ROUNDS rounds. Prints
# the publish rate and each node's CPU per message (leader first).
#
#   perf/stream-cluster.sh                     # COUNT=1000000 SIZES="16 1024" ROUNDS=2
#   BIN=/path/to/warren perf/stream-cluster.sh # another build
#
# The load generator, the four nodes and the disk share this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${COUNT:-1000000}
SIZES=${SIZES:-16 1024}
ROUNDS=${ROUNDS:-2}
W=${W:-/tmp/warren-stream-cluster}
BIN=${BIN:-target/release/warren}
PERF=target/release/warren-stream-perf
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

peers="1=127.0.0.1:7921,2=127.0.0.1:7922,3=127.0.0.1:7923"
echo "the benchmark cluster's shared secret" >"$W/secret"
for i in 1 2 3; do
    "$BIN" --node-id $i --raft-port 792$i --peers "$peers" --cluster-secret-file "$W/secret" \
        --bind 127.0.0.1 --port 594$i --management-port off --prometheus-port off \
        --stream-port 595$i --data-dir "$W/w$i" --log-level info >"$W/w$i.log" 2>&1 &
    PIDS+=($!)
done
"$BIN" --bind 127.0.0.1 --port 5940 --management-port off --prometheus-port off \
    --stream-port 5950 --data-dir "$W/single" --log-level info >"$W/single.log" 2>&1 &
PIDS+=($!)
for p in 5941 5942 5943 5950; do wait_port $p; done
LEADER=
for _ in $(seq 1 100); do
    for i in 1 2 3; do grep -q "leading: serving clients" "$W/w$i.log" && LEADER=$i; done
    [ -n "$LEADER" ] && break
    sleep 0.2
done
[ -n "$LEADER" ] || { echo "no leader" >&2; exit 1; }
ORDER=("$LEADER")
for i in 1 2 3; do [ "$i" = "$LEADER" ] || ORDER+=("$i"); done

# run NAME PORT STREAM SIZE PID...: one publish phase, CPU of each PID.
run() {
    local name=$1 port=$2 stream=$3 size=$4 p t0=() t1=() out
    shift 4
    for p in "$@"; do t0+=("$(ticks "$p")"); done
    # A stream declare on a new cluster waits for the version streams need.
    for _ in $(seq 1 30); do
        out=$("$PERF" --port "$port" --stream "$stream" --count "$COUNT" --size "$size" \
            --readers "" 2>&1) && out=${out%%$'\n'*} && [[ $out == publish:* ]] && break
        sleep 1
    done
    for p in "$@"; do t1+=("$(ticks "$p")"); done
    python3 - "$name" "$size" "$COUNT" "$HZ" "$out" "${t0[@]}" "${t1[@]}" <<'EOF'
import re, sys
name, size, n, hz, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
t = list(map(int, sys.argv[6:]))
k = len(t) // 2
us = [(t[k + i] - t[i]) / hz * 1e6 / n for i in range(k)]
rate = re.search(r"= (\d+) msg/s", out)
rate = f"{int(rate.group(1)):,}" if rate else "failed: " + out
print(f"| {name} | {size} B | {rate} | " + " + ".join(f"{u:.2f}" for u in us) + f" = {sum(us):.2f} |")
EOF
}

echo "| publish to | body | msg/s | CPU us a message (leader + followers) |"
echo "|---|---|---|---|"
for r in $(seq 1 "$ROUNDS"); do
    for size in $SIZES; do
        run "3 nodes" "595$LEADER" "c-$r-$size" "$size" \
            "${PIDS[$((ORDER[0] - 1))]}" "${PIDS[$((ORDER[1] - 1))]}" "${PIDS[$((ORDER[2] - 1))]}"
        run "single node" 5950 "s-$r-$size" "$size" "${PIDS[3]}"
    done
done
if grep -l panicked "$W"/*.log; then
    echo "a node panicked" >&2
    exit 1
fi
