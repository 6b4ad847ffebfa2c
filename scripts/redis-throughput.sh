#!/usr/bin/env bash
# Issue 24's throughput figure: the demo server's full stack (overload layer + rate limiter,
# `instant` model, a limit nobody reaches) with the limit local, kept in Redis, and kept in
# Redis with the local reservation, side by side: oha against each in turn, rounds
# alternated, the load average before and after. Needs redis-server, oha (cargo install oha)
# and curl. Every process listens on 127.0.0.1 only, is bounded in time, and is stopped by
# its PID.
#
#   cargo build --release -p demo-server
#   bash scripts/redis-throughput.sh [OUT_DIR]
#
# Settings (environment): ROUNDS (3), SECONDS_PER_RUN (5), CONNECTIONS (50), RESERVATION
# (1000 units), BUDGET (1s: on a loaded machine a round trip under oha's load can pass the
# default 5 ms, and the figure would then measure the local fallback; the table counts the
# fallbacks of each run, which must be 0). Writes oha's JSON to OUT_DIR (default
# target/redis-throughput) and a table to stdout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

OUT=${1:-target/redis-throughput}
SERVER=${SERVER:-target/release/demo-server}
OHA=${OHA:-$(command -v oha || echo "$HOME/.cargo/bin/oha")}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
CONNECTIONS=${CONNECTIONS:-50}
RESERVATION=${RESERVATION:-1000}
BUDGET=${BUDGET:-1s}
REDIS_PORT=${REDIS_PORT:-18379}
mkdir -p "$OUT"

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

"$REDIS_SERVER" --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize no --logfile "$OUT/redis.log" &
pids+=($!)
for _ in $(seq 50); do
    [ "$(redis-cli -p "$REDIS_PORT" PING 2>/dev/null)" = PONG ] && break
    sleep 0.1
done

limit=(--model instant --rate-limit 1000000 --burst 1000000 --quiet)
redis=(--redis-url "redis://127.0.0.1:$REDIS_PORT" --redis-budget "$BUDGET")
declare -A port=([local]=18071 [redis]=18072 [reserved]=18073)
"$SERVER" "${limit[@]}" --listen "127.0.0.1:${port[local]}" >"$OUT/local.log" 2>&1 &
pids+=($!)
"$SERVER" "${limit[@]}" "${redis[@]}" --listen "127.0.0.1:${port[redis]}" >"$OUT/redis.log" 2>&1 &
pids+=($!)
"$SERVER" "${limit[@]}" "${redis[@]}" --redis-reservation "$RESERVATION" \
    --listen "127.0.0.1:${port[reserved]}" >"$OUT/reserved.log" 2>&1 &
pids+=($!)
for name in local redis reserved; do
    for _ in $(seq 50); do
        curl -sf "http://127.0.0.1:${port[$name]}/healthz" >/dev/null && break
        sleep 0.1
    done
done

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
calls() { redis-cli -p "$REDIS_PORT" INFO commandstats | tr -d '\r' \
    | sed -n 's/^cmdstat_eval\(sha\)\?:calls=\([0-9]*\).*/\2/p' | paste -sd+ | bc; }
fallbacks() { curl -sf "http://127.0.0.1:$1/metrics" \
    | sed -n 's/^ratelimit_layer_redis_fallbacks_total{[^}]*} \([0-9]*\)$/\1/p' | paste -sd+ | bc; }
printf '| round | local req/s | Redis req/s | Redis / local | reserved req/s | reserved / local | script calls: Redis / reserved | fallbacks: Redis / reserved |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for round in $(seq "$ROUNDS"); do
    declare -A rate=() made=() fell=()
    for name in local redis reserved; do
        before=$(calls || echo 0)
        fell_before=$(fallbacks "${port[$name]}" || echo 0)
        "$OHA" -z "${SECONDS_PER_RUN}s" -c "$CONNECTIONS" --no-tui --output-format json \
            -o "$OUT/$name-$round.json" "http://127.0.0.1:${port[$name]}/api" >/dev/null
        made[$name]=$(( $(calls || echo 0) - before ))
        fell[$name]=$(( $(fallbacks "${port[$name]}" || echo 0) - ${fell_before:-0} ))
        rate[$name]=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(round(d['statusCodeDistribution'].get('200',0)/float(sys.argv[2])))" \
            "$OUT/$name-$round.json" "$SECONDS_PER_RUN")
    done
    python3 - "$round" "${rate[local]}" "${rate[redis]}" "${rate[reserved]}" \
        "${made[redis]}" "${made[reserved]}" "${fell[redis]}" "${fell[reserved]}" <<'PY'
import sys
r, local, redis, reserved, calls_redis, calls_reserved, fell_redis, fell_reserved = sys.argv[1:]
local, redis, reserved = float(local), float(redis), float(reserved)
n = lambda x: f"{int(x):,}".replace(",", " ")
print(f"| {r} | {n(local)} | {n(redis)} | {redis/local:.2f} | {n(reserved)} | "
      f"{reserved/local:.2f} | {n(calls_redis)} / {n(calls_reserved)} | {fell_redis} / {fell_reserved} |")
PY
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
