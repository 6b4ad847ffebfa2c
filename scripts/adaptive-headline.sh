#!/usr/bin/env bash
# Issue 15's real-process headline: demo-server --stack adaptive (no rate configured) under
# oha at three times the model's capacity for 60 s, then the same with the capacity halved
# at run time. Needs oha (cargo install oha) and curl. Every process is bounded in time,
# listens on 127.0.0.1 only, and is stopped by its PID.
#
#   cargo build --release -p demo-server
#   bash scripts/adaptive-headline.sh [OUT_DIR]
#
# Writes oha's JSON (with the success/failure latency breakdown) and the server's status
# lines per run to OUT_DIR (default target/adaptive-headline), and a summary to stdout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

OUT=${1:-target/adaptive-headline}
SERVER=${SERVER:-target/release/demo-server}
OHA=${OHA:-$(command -v oha || echo "$HOME/.cargo/bin/oha")}
PORT=${PORT:-18071}
URL="http://127.0.0.1:$PORT"
mkdir -p "$OUT"

server_pid=""
cleanup() { if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi; }
trap cleanup EXIT

start_server() { # name, args...
    local name=$1; shift
    "$SERVER" --listen "127.0.0.1:$PORT" --stack adaptive --admin "$@" >"$OUT/$name.server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 50); do
        curl -sf "$URL/healthz" >/dev/null && return 0
        sleep 0.1
    done
    echo "the server did not start" >&2; exit 1
}

stop_server() {
    kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""
}

load() { # name, rate, seconds, connections
    "$OHA" -z "$3s" -q "$2" -c "$4" --no-tui --stats-success-breakdown \
        --output-format json -o "$OUT/$1.json" "$URL/api" >/dev/null
}

summary() { # name, seconds
    python3 - "$OUT/$1.json" "$2" "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); secs = float(sys.argv[2]); name = sys.argv[3]
codes = d.get("statusCodeDistribution", {})
ok = codes.get("200", 0)
p = d.get("latencyPercentilesSuccessful") or d.get("latencyPercentiles", {})
ms = lambda k: 1e3 * (p.get(k) or 0)
total = sum(codes.values())
print(f"{name}: goodput {ok/secs:.0f} req/s, admitted p50 {ms('p50'):.0f} ms, p99 {ms('p99'):.0f} ms, "
      f"rejected {100*codes.get('503',0)/max(total,1):.0f} %, codes {codes}")
PY
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for model in article mmc; do
    if [ "$model" = article ]; then rate=900; conns=400; half=15; else rate=600; conns=200; half=5; fi
    extra=(); [ "$model" = mmc ] && extra=(--model mmc --seed 15)

    # 1. Three times the capacity for 60 s.
    start_server "$model-steady" "${extra[@]}"
    load "$model-steady" "$rate" 60 "$conns"
    stop_server
    summary "$model-steady" 60

    # 2. 30 s at full capacity, halve it, 10 s to settle, 20 s measured.
    start_server "$model-halved" "${extra[@]}"
    load "$model-halved-before" "$rate" 30 "$conns"
    curl -sf -X PUT --data "$half" "$URL/admin/capacity"
    load "$model-halved-settling" "$rate" 10 "$conns"
    load "$model-halved-after" "$rate" 20 "$conns"
    stop_server
    summary "$model-halved-before" 30
    summary "$model-halved-settling" 10
    summary "$model-halved-after" 20
    grep -o "adaptive limit: [0-9]*" "$OUT/$model-halved.server.log" | awk '{print $3}' | tr '\n' ' ' \
        > "$OUT/$model-halved.limits"
    echo "$model limit per second: $(cat "$OUT/$model-halved.limits")"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
