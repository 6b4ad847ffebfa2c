#!/usr/bin/env bash
# Issue 23's cost figure: the demo server's `instant` model bare (`--stack none`) and behind
# the full stack (overload layer, deadline layer and a token bucket nobody reaches), oha
# against each in turn, rounds alternated; each round's throughput, p99, and the server's
# CPU time per request (user + system, from /proc), then the medians and their ratio.
# Needs oha (cargo install oha) and Linux's /proc. Every process listens on 127.0.0.1 only,
# is bounded in time, and is stopped by its PID.
#
#   cargo build --release -p demo-server
#   bash scripts/stack-cost.sh
#
# Settings (environment): ROUNDS (6), SECONDS_PER_RUN (5), CONNECTIONS (50), PINNED (0).
# With PINNED=1 each server runs one runtime worker on CPU 1 and oha runs on CPU 0 (taskset),
# so that the figure is the server's own cost rather than how the scheduler shares the
# cores between oha and the server's workers (BENCHMARKS.md, "The full stack's cost against
# bare", says why both are given).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SERVER=${SERVER:-target/release/demo-server}
OHA=${OHA:-$(command -v oha || echo "$HOME/.cargo/bin/oha")}
ROUNDS=${ROUNDS:-6}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
CONNECTIONS=${CONNECTIONS:-50}
PINNED=${PINNED:-0}
BARE_PORT=${BARE_PORT:-18070}
FULL_PORT=${FULL_PORT:-18071}

for tool in "$SERVER" "$OHA"; do
    if ! [ -x "$tool" ]; then
        echo "error: $tool is missing (cargo build --release -p demo-server; cargo install oha)" >&2
        exit 1
    fi
done
if [ "$PINNED" = 1 ] && ! command -v taskset >/dev/null; then
    echo "error: PINNED=1 needs taskset (Debian: util-linux)" >&2
    exit 1
fi

server_prefix=()
oha_prefix=()
if [ "$PINNED" = 1 ]; then
    server_prefix=(env TOKIO_WORKER_THREADS=1 taskset -c 1)
    oha_prefix=(taskset -c 0)
fi

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

"${server_prefix[@]}" "$SERVER" --model instant --stack none --quiet \
    --listen "127.0.0.1:$BARE_PORT" &
bare_pid=$!
pids+=("$bare_pid")
"${server_prefix[@]}" "$SERVER" --model instant --stack full --rate-limit 10000000 \
    --burst 10000000 --quiet --listen "127.0.0.1:$FULL_PORT" &
full_pid=$!
pids+=("$full_pid")

for port in "$BARE_PORT" "$FULL_PORT"; do
    for _ in $(seq 1 50); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
        sleep 0.1
    done
done

ticks=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# A number from oha's JSON output: the first value of `"name":`, after `"section":` when
# a section is given.
json_number() {
    local text
    text=$(tr -d ' \n')
    if [ -n "${2:-}" ]; then text=${text#*\"$2\":}; fi
    grep -o "\"$1\":[0-9.e+-]*" <<<"$text" | head -n 1 | cut -d: -f2
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-6s %12s %10s %16s\n' round stack 'req/s' 'p99 ms' 'server us/req'
bare_rates=()
full_rates=()
for round in $(seq 1 "$ROUNDS"); do
    for stack in bare full; do
        if [ "$stack" = bare ]; then pid=$bare_pid port=$BARE_PORT; else pid=$full_pid port=$FULL_PORT; fi
        before=$(cpu_ticks "$pid")
        json=$("${oha_prefix[@]}" "$OHA" --no-tui --output-format json -z "${SECONDS_PER_RUN}s" \
            -c "$CONNECTIONS" "http://127.0.0.1:$port/api")
        after=$(cpu_ticks "$pid")
        rate=$(json_number requestsPerSec <<<"$json")
        p99=$(json_number p99 latencyPercentiles <<<"$json")
        took=$(json_number total <<<"$json")
        line=$(awk -v r="$rate" -v p="$p99" -v t="$((after - before))" -v hz="$ticks" \
            -v s="$took" -v round="$round" -v stack="$stack" 'BEGIN {
                printf "%-6s %-6s %12.0f %10.2f %16.2f", round, stack, r, p * 1000, t / hz / (r * s) * 1e6 }')
        echo "$line"
        if [ "$stack" = bare ]; then bare_rates+=("$rate"); else full_rates+=("$rate"); fi
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {
    if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
bare_median=$(median "${bare_rates[@]}")
full_median=$(median "${full_rates[@]}")
awk -v b="$bare_median" -v f="$full_median" 'BEGIN {
    printf "medians: bare %.0f req/s, full stack %.0f req/s; full / bare %.3fx\n", b, f, f / b }'
