#!/usr/bin/env bash
# What the full stack adds to a request of the demo server, counted rather than timed: the
# `instant` model bare (`--stack none`) and behind the full stack (as scripts/stack-cost.sh
# runs them), each under valgrind's cachegrind with one runtime worker, sent the same
# number of oha requests; then the instructions, the first-level instruction-cache misses
# and the first-level data-cache misses per request, of each and added by the stack.
#
# Throughput on a small shared machine swings by 10 % from one run to the next, which hides
# a 5 % cost (BENCHMARKS.md, issue 23); these counts are the same from run to run within a
# few percent, and the misses are what the stack's time goes to on a real server, whose
# caches the kernel's networking and the rest of the request path keep cold for it. They
# count user space only, on valgrind's model of the host's caches. Needs valgrind (Debian:
# valgrind), oha (cargo install oha) and curl. Every process listens on 127.0.0.1 only and
# is stopped by its PID.
#
#   cargo build --release -p demo-server
#   bash scripts/stack-cachegrind.sh
#
# Settings (environment): REQUESTS (20000), CONNECTIONS (1: one request at a time, so that each takes the same path), PORT (18095).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SERVER=${SERVER:-target/release/demo-server}
OHA=${OHA:-$(command -v oha || echo "$HOME/.cargo/bin/oha")}
REQUESTS=${REQUESTS:-20000}
CONNECTIONS=${CONNECTIONS:-1}
PORT=${PORT:-18095}

for tool in "$SERVER" "$OHA"; do
    if ! [ -x "$tool" ]; then
        echo "error: $tool is missing (cargo build --release -p demo-server; cargo install oha)" >&2
        exit 1
    fi
done
for tool in valgrind curl; do
    if ! command -v "$tool" >/dev/null; then
        echo "error: $tool is missing (Debian: apt-get install $tool)" >&2
        exit 1
    fi
done

out=$(mktemp -d)
pid=
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$out"
}
trap cleanup EXIT

# One stack: the server under cachegrind, REQUESTS requests, then the server stopped
# (SIGINT: it exits, and valgrind writes its summary).
measure() {
    local stack=$1
    shift
    TOKIO_WORKER_THREADS=1 valgrind --tool=cachegrind --cache-sim=yes \
        --cachegrind-out-file="$out/$stack.out" \
        "$SERVER" --model instant --quiet --listen "127.0.0.1:$PORT" "$@" \
        >"$out/$stack.log" 2>&1 &
    pid=$!
    local ready=
    for _ in $(seq 1 100); do
        if curl -sf -o /dev/null "http://127.0.0.1:$PORT/healthz"; then ready=1; break; fi
        sleep 0.2
    done
    if [ -z "$ready" ]; then
        echo "error: the $stack server did not answer; its output:" >&2
        cat "$out/$stack.log" >&2
        exit 1
    fi
    "$OHA" --no-tui -n "$REQUESTS" -c "$CONNECTIONS" "http://127.0.0.1:$PORT/api" >/dev/null
    kill -INT "$pid"
    wait "$pid" || true
    pid=
}

# A total from valgrind's summary: `I refs`, `I1 misses`, `D1 misses`.
total() {
    grep -E "== $2:" "$out/$1.log" | head -n 1 | sed -E 's/.*:[[:space:]]+([0-9,]+).*/\1/' | tr -d ,
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
measure bare --stack none
measure full --stack full --rate-limit 10000000 --burst 10000000
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

printf '%-6s %14s %14s %14s\n' stack 'instructions' 'I1 misses' 'D1 misses'
for stack in bare full; do
    awk -v n="$REQUESTS" -v s="$stack" -v i="$(total "$stack" 'I[[:space:]]+refs')" \
        -v im="$(total "$stack" 'I1[[:space:]]+misses')" -v dm="$(total "$stack" 'D1[[:space:]]+misses')" \
        'BEGIN { printf "%-6s %14.0f %14.0f %14.0f\n", s, i / n, im / n, dm / n }'
done
awk -v n="$REQUESTS" \
    -v i="$(( $(total full 'I[[:space:]]+refs') - $(total bare 'I[[:space:]]+refs') ))" \
    -v im="$(( $(total full 'I1[[:space:]]+misses') - $(total bare 'I1[[:space:]]+misses') ))" \
    -v dm="$(( $(total full 'D1[[:space:]]+misses') - $(total bare 'D1[[:space:]]+misses') ))" \
    'BEGIN { printf "%-6s %14.0f %14.0f %14.0f   (per request; server start-up included)\n", "added", i / n, im / n, dm / n }'
