#!/usr/bin/env bash
# Issue 32's table: the demo server's M/M/10 model (`--model mmc`, about 200 req/s) behind a
# real Envoy (`demo-client envoy`, Envoy from the repository's .venv or ENVOY) with two route
# retry policies, Istio's default (`istio`: 503, 2 retries) and one that also retries 429
# (`rate-limits`: 429 and 503, 3 retries), against each server stack; oha sends three times
# the capacity (600 req/s, 200 connections, no retries of its own) for 20 s per row. Per row:
# the requests oha sent, the attempts the server received per request by Envoy's counters
# (upstream_rq_total / downstream_rq_total) and by the server's own (/metrics), Envoy's
# upstream_rq_retry, the stop signals the server sent, and the goodput (2xx a second).
#
# `none` is the bare model, which never rejects (it queues): Envoy has nothing to retry, and
# the row shows what the queue does to latency instead. `full, stop off` and `adaptive, stop
# off` are the limits with the stop signal switched off (`--stop-retry-share 0.99`), the
# amplification the stop signal removes.
#
#   cargo build --release -p demo-server -p demo-client
#   bash scripts/behind-envoy.sh
#
# Needs oha (cargo install oha), curl and Envoy (scripts/test installs it into .venv).
# Every process listens on 127.0.0.1 only, is bounded in time, and is stopped by its PID.
# Settings (environment): SECONDS_PER_RUN (20), RATE (600), CONNECTIONS (200), ROWS (all:
# a space-separated subset of the row names below, such as "full:istio adaptive:istio").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SERVER=${SERVER:-target/release/demo-server}
CLIENT=${CLIENT:-target/release/demo-client}
OHA=${OHA:-$(command -v oha || echo "$HOME/.cargo/bin/oha")}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-20}
RATE=${RATE:-600}
CONNECTIONS=${CONNECTIONS:-200}
PORT=${PORT:-18170}
ROWS=${ROWS:-"none:istio none:rate-limits full:istio full:rate-limits adaptive:istio \
adaptive:rate-limits full-stop-off:rate-limits adaptive-stop-off:istio"}
OUT=${OUT:-target/behind-envoy}

for tool in "$SERVER" "$CLIENT" "$OHA"; do
    if ! [ -x "$tool" ]; then
        echo "error: $tool is missing (cargo build --release -p demo-server -p demo-client;" \
            "cargo install oha)" >&2
        exit 1
    fi
done
command -v curl >/dev/null || { echo "error: curl is missing" >&2; exit 1; }
mkdir -p "$OUT"

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids=()
}
trap cleanup EXIT

# The sum of the samples of a Prometheus metric whose line contains $2 (or all of them).
metric_sum() {
    awk -v n="$1" -v l="${2:-}" '(index($0, n "{") == 1 || index($0, n " ") == 1) &&
        (l == "" || index($0, l)) { s += $NF } END { printf "%d", s }'
}
# An Envoy counter from the admin interface's plain-text /stats.
envoy_stat() {
    awk -v n="$1: " 'index($0, n) == 1 { print $2 }'
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-20s %-12s %9s %10s %10s %10s %8s %8s %9s\n' stack policy sent \
    'att/req E' 'att/req S' 'retries' 'stops' '2xx/s' 'p50 ms'
for row in $ROWS; do
    stack=${row%%:*}
    policy=${row#*:}
    case "$stack" in
        none) args=(--stack none) ;;
        full) args=(--stack full) ;;
        adaptive) args=(--stack adaptive) ;;
        full-stop-off) args=(--stack full --stop-retry-share 0.99) ;;
        adaptive-stop-off) args=(--stack adaptive --stop-retry-share 0.99) ;;
        *) echo "error: unknown stack in row $row" >&2; exit 1 ;;
    esac
    "$SERVER" --model mmc "${args[@]}" --quiet --listen "127.0.0.1:$PORT" \
        >"$OUT/$row.server.log" 2>&1 &
    pids+=("$!")
    for _ in $(seq 1 50); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then break; fi
        sleep 0.1
    done
    "$CLIENT" envoy --upstream "127.0.0.1:$PORT" --retry "$policy" --dir "$OUT/$row.envoy" \
        >"$OUT/$row.envoy.out" 2>"$OUT/$row.envoy.err" &
    envoy_pid=$!
    pids+=("$envoy_pid")
    line=
    for _ in $(seq 1 300); do
        line=$(grep -m1 "^envoy listening on" "$OUT/$row.envoy.out" 2>/dev/null || true)
        if [ -n "$line" ] || ! kill -0 "$envoy_pid" 2>/dev/null; then break; fi
        sleep 0.1
    done
    if [ -z "$line" ]; then
        echo "error: Envoy did not start for $row:" >&2
        cat "$OUT/$row.envoy.err" >&2
        exit 1
    fi
    url=$(awk '{print $4}' <<<"$line")
    admin=$(awk '{print $6}' <<<"$line" | tr -d '()')
    json=$("$OHA" --no-tui --output-format json -z "${SECONDS_PER_RUN}s" -q "$RATE" \
        -c "$CONNECTIONS" "$url/api")
    printf '%s\n' "$json" >"$OUT/$row.oha.json"
    # The server answers what is still queued (the bare model's queue) before it is read,
    # for at most 10 s.
    for _ in $(seq 1 100); do
        inside=$(curl -sf "http://127.0.0.1:$PORT/metrics" | metric_sum demo_server_concurrency)
        if [ "$inside" = 0 ]; then break; fi
        sleep 0.1
    done
    stats=$(curl -sf "$admin/stats")
    metrics=$(curl -sf "http://127.0.0.1:$PORT/metrics")
    cleanup
    downstream=$(envoy_stat http.ingress.downstream_rq_total <<<"$stats")
    upstream=$(envoy_stat cluster.upstream.upstream_rq_total <<<"$stats")
    retries=$(envoy_stat cluster.upstream.upstream_rq_retry <<<"$stats")
    attempts=$(metric_sum demo_server_requests_total <<<"$metrics")
    stops=$(metric_sum demo_server_requests_total 'outcome="stop_signal"' <<<"$metrics")
    flat=$(tr -d ' \n' <<<"$json")
    codes=$(grep -o '"statusCodeDistribution":{[^}]*}' <<<"$flat" || true)
    ok=$(grep -o '"2[0-9][0-9]":[0-9]*' <<<"$codes" | cut -d: -f2 | awk '{s += $1} END {print s + 0}')
    p50=$(grep -o '"latencyPercentiles":{[^}]*}' <<<"$flat" | grep -o '"p50":[0-9.e+-]*' | cut -d: -f2)
    awk -v st="$stack" -v po="$policy" -v d="$downstream" -v u="$upstream" -v r="$retries" \
        -v a="$attempts" -v s="$stops" -v ok="$ok" -v t="$SECONDS_PER_RUN" -v p50="${p50:-0}" 'BEGIN {
        printf "%-20s %-12s %9d %10.2f %10.2f %10d %8d %8.0f %9.0f\n",
            st, po, d, u / d, a / d, r, s, ok / t, p50 * 1000 }'
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
