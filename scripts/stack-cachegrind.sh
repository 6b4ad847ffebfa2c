#!/usr/bin/env bash
# What the full stack adds to a request of the demo server, counted rather than timed: the
# `instant` model bare (`--stack none`) and behind the full stack (as scripts/stack-cost.sh
# runs them), each under valgrind's cachegrind with one runtime worker, sent the same
# number of oha requests; then the instructions, the first-level instruction-cache misses
# and the first-level data-cache misses per request, of each and added by the stack.
#
# Throughput on a small shared machine swings by 10 % from one run to the next, which hides
# a 5 % cost (BENCHMARKS.md, "The full stack's cost against bare"); these counts hold from
# run to run within a few percent. They include the first-level cache misses, which an
# in-process loop keeps out of sight: in a real server the kernel's networking and hyper run
# between two requests, and the stack's code is cold at each one. User space only, on
# valgrind's model of the host's caches. Needs valgrind (Debian: valgrind), oha (cargo
# install oha), curl and Linux's /proc. Every process listens on 127.0.0.1 only and is
# stopped by its PID (SIGTERM, then SIGKILL after a minute).
#
#   cargo build --release -p demo-server
#   bash scripts/stack-cachegrind.sh
#
# Settings (environment): REQUESTS (20000), CONNECTIONS (1: one request at a time, so that
# every request takes the same path), PORT (18095).
#
# Prints, per request: the bare server's counts, the full stack's, what the full stack adds
# (`added`: the difference of the two processes), and the layers' own functions in the full
# server (`layers`, from cg_annotate: the figure that moves only when the layers' code does).
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

# Whether process $1 runs (a child that has exited stays as a zombie until waited for, and
# `kill -0` would still find it).
alive() {
    local state
    state=$(sed -E 's/.*\) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
    [ -n "$state" ] && [ "$state" != Z ]
}

# Stops the server started last: SIGTERM (it exits, and valgrind writes its summary), then
# SIGKILL if it is still there a minute later.
stop() {
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 600); do
        if ! alive "$pid"; then break; fi
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=
}

# One stack: the server under cachegrind, REQUESTS requests, then the server stopped.
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
        # NOTE: alive first, so that another process already on the port is not taken for
        # ours (ours then fails to bind and exits).
        if ! alive "$pid"; then break; fi
        if curl -sf --max-time 2 -o /dev/null "http://127.0.0.1:$PORT/healthz"; then
            ready=1
            break
        fi
        sleep 0.2
    done
    if [ -z "$ready" ] || ! alive "$pid"; then
        echo "error: the $stack server did not start on 127.0.0.1:$PORT; its output:" >&2
        cat "$out/$stack.log" >&2
        exit 1
    fi
    "$OHA" --no-tui -n "$REQUESTS" -c "$CONNECTIONS" "http://127.0.0.1:$PORT/api" >/dev/null
    stop
}

# A total from valgrind's summary (`I refs`, `I1 misses`, `D1 misses`), or an error.
total() {
    local value
    value=$(grep -E "== $2:" "$out/$1.log" | head -n 1 | sed -E 's/.*:[[:space:]]+([0-9,]+).*/\1/' | tr -d ,)
    if ! [[ "$value" =~ ^[0-9]+$ ]]; then
        echo "error: no '$2' in valgrind's summary for the $1 server; its output:" >&2
        cat "$out/$1.log" >&2
        exit 1
    fi
    echo "$value"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
measure bare --stack none
measure full --stack full --rate-limit 10000000 --burst 10000000
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# NOTE: every total read first, in plain assignments, so that a missing one stops the script.
bare_i=$(total bare 'I[[:space:]]+refs')
bare_im=$(total bare 'I1[[:space:]]+misses')
bare_dm=$(total bare 'D1[[:space:]]+misses')
full_i=$(total full 'I[[:space:]]+refs')
full_im=$(total full 'I1[[:space:]]+misses')
full_dm=$(total full 'D1[[:space:]]+misses')
per_request() {
    awk -v n="$REQUESTS" -v s="$1" -v i="$2" -v im="$3" -v dm="$4" -v tail="${5:-}" \
        'BEGIN { printf "%-6s %14.0f %14.0f %14.0f%s\n", s, i / n, im / n, dm / n, tail }'
}
printf '%-6s %14s %14s %14s\n' stack 'instructions' 'I1 misses' 'D1 misses'
per_request bare "$bare_i" "$bare_im" "$bare_dm"
per_request full "$full_i" "$full_im" "$full_dm"
per_request added "$((full_i - bare_i))" "$((full_im - bare_im))" "$((full_dm - bare_dm))" \
    '   (per request; server start-up included)'

# The layers' own code in the full server: every function of overload-core, overload-signal
# and ratelimit-layer (and whatever the compiler inlined into them), from cachegrind's
# per-function counts, less the same in the bare server. The `added` row above subtracts two
# processes, so it also moves with whatever a new build changes in the rest of the binary
# (allocation, copies, axum's and hyper's inlining: tens to a few hundred instructions a
# request, seen between two builds whose layers cost the same); this row counts the layers
# alone.
# NOTE: the bare server calls a few of those functions too (the demo's own outcome counts
# read the stop signal with `overload_signal::protocol::is_stop_signal`, about 70
# instructions a request): what the bare server spends in them is taken off.
layer_counts() {
    cg_annotate --show=Ir,I1mr --threshold=0.0001 "$out/$1.out" 2>/dev/null | awk '
        match($0, /^ *[0-9,]+ \([^)]*\) +([0-9,]+|\.) /) {
            line = $0
            ir = $1; gsub(",", "", ir)
            rest = line; sub(/^ *[0-9,]+ \([^)]*\) +/, "", rest)
            im = rest; sub(/ .*/, "", im); gsub(",", "", im); if (im == ".") im = 0
            fn = line; sub(/^[^:]*:/, "", fn); sub(/^</, "", fn)
            if (fn ~ /^(overload_signal|ratelimit_layer|overload_core)::/) { i += ir; m += im }
        }
        END { printf "%d %d\n", i, m }'
}
if command -v cg_annotate >/dev/null; then
    read -r full_li full_lm < <(layer_counts full)
    read -r bare_li bare_lm < <(layer_counts bare)
    awk -v n="$REQUESTS" -v i="$((full_li - bare_li))" -v m="$((full_lm - bare_lm))" \
        'BEGIN { printf "%-6s %14.0f %14.0f %14s   (the layers%s own functions: full stack, less what bare runs of them)\n", "layers", i / n, m / n, "-", "\047" }'
fi
