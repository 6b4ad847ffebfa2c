#!/usr/bin/env python3
"""A gRPC client in another language, retrying as its service config says.

Python's `grpcio` (the C-core client that Python, Ruby, PHP and C++ share) calls
`grpc.health.v1.Health/Check` on one channel, with a service config whose `retryPolicy`
retries `UNAVAILABLE` and `RESOURCE_EXHAUSTED` up to `maxAttempts` times and whose
`retryThrottling` throttles retries as gRPC A6 says. Calls start at a fixed rate, many at
once, bounded in count (`--calls`) and in time (each call has a deadline, `--timeout`),
and each carries its own number in the metadata `x-call-id` (which every retry of it
repeats), so that the server can count the attempts of each call.

The retries are the channel's own: C-core sends `grpc-previous-rpc-attempts` on each
retry, never retries an answer whose `grpc-retry-pushback-ms` is negative, and waits at
least a positive one.

Prints one JSON object on stdout:

    {"calls": 900, "offered_per_s": 179.6, "elapsed_s": 5.4,
     "codes": {"OK": 310, "UNAVAILABLE": 590},
     "stop_signals": 590,          # failed calls whose final answer carried x-overloaded
     "attempts_started": 1012,     # attempts the channel started (channelz), or null
     "results": [[0, "OK", false], [1, "UNAVAILABLE", true], ...],  # id, code, stop signal
     "grpcio": "1.85.3"}

Exit status: 0 when every call ended (whatever its status), 2 for bad arguments, 3 when
`grpcio` or `grpcio-health-checking` is missing.
"""

import argparse
import asyncio
import json
import sys
import time

try:
    import grpc
    import grpc.aio
    from grpc_health.v1 import health_pb2, health_pb2_grpc
except ImportError as e:  # pragma: no cover - what the Rust test reports
    print(
        f"missing Python package: {e}; install grpcio and grpcio-health-checking "
        "(scripts/test does, into the repository's .venv)",
        file=sys.stderr,
    )
    sys.exit(3)


def service_config(args):
    """The service config: retries as a user of grpcio writes them (gRPC A6)."""
    return {
        "methodConfig": [
            {
                "name": [{"service": "grpc.health.v1.Health"}],
                "retryPolicy": {
                    "maxAttempts": args.max_attempts,
                    "initialBackoff": args.initial_backoff,
                    "maxBackoff": args.max_backoff,
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"],
                },
            }
        ],
        "retryThrottling": {
            "maxTokens": args.max_tokens,
            "tokenRatio": args.token_ratio,
        },
    }


def attempts_started():
    """Attempts the process's channels started, from channelz: each attempt (the first
    and every retry) is one call on a subchannel. `None` when this grpcio does not say."""
    try:
        from grpc._cython import cygrpc

        total = 0
        channels = json.loads(cygrpc.channelz_get_top_channels(0)).get("channel", [])
        for channel in channels:
            refs = list(channel.get("subchannelRef", []))
            # Some versions hang the subchannels under the channel's children.
            for child in channel.get("channelRef", []):
                sub = json.loads(cygrpc.channelz_get_channel(int(child["channelId"])))
                refs.extend(sub.get("channel", {}).get("subchannelRef", []))
            for ref in refs:
                sub = json.loads(
                    cygrpc.channelz_get_subchannel(int(ref["subchannelId"]))
                )
                total += int(sub["subchannel"]["data"].get("callsStarted", 0))
        return total
    except Exception:  # noqa: BLE001 - an internal interface: a figure, not a requirement
        return None


async def run(args):
    options = [
        ("grpc.service_config", json.dumps(service_config(args))),
        ("grpc.enable_retries", 1),
        ("grpc.enable_channelz", 1),
    ]
    results = [None] * args.calls
    limit = asyncio.Semaphore(args.concurrency)
    async with grpc.aio.insecure_channel(args.target, options=options) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout=10)
        stub = health_pb2_grpc.HealthStub(channel)

        async def one(i):
            try:
                await stub.Check(
                    health_pb2.HealthCheckRequest(service=""),
                    metadata=(("x-call-id", str(i)),),
                    timeout=args.timeout,
                )
                results[i] = [i, "OK", False]
            except grpc.aio.AioRpcError as e:
                trailers = dict(e.trailing_metadata() or ())
                stop = "x-overloaded" in trailers
                results[i] = [i, e.code().name, stop]
            finally:
                limit.release()

        start = time.monotonic()
        tasks = []
        for i in range(args.calls):
            delay = start + i / args.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await limit.acquire()
            tasks.append(asyncio.create_task(one(i)))
        offered = time.monotonic() - start
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - start
        started = attempts_started()

    codes = {}
    for _, code, _ in results:
        codes[code] = codes.get(code, 0) + 1
    return {
        "calls": args.calls,
        "offered_per_s": round(args.calls / offered, 1) if offered > 0 else None,
        "elapsed_s": round(elapsed, 2),
        "codes": codes,
        "stop_signals": sum(1 for r in results if r[2]),
        "attempts_started": started,
        "results": results,
        "grpcio": grpc.__version__,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="host:port of the gRPC server")
    p.add_argument("--calls", type=int, default=900, help="calls in all (900)")
    p.add_argument("--rate", type=float, default=180.0, help="calls started per second (180)")
    p.add_argument("--concurrency", type=int, default=500, help="calls in flight at most (500)")
    p.add_argument("--timeout", type=float, default=10.0, help="each call's deadline, seconds (10)")
    p.add_argument("--max-attempts", type=int, default=5, help="retryPolicy.maxAttempts (5)")
    p.add_argument("--initial-backoff", default="0.05s", help="retryPolicy.initialBackoff (0.05s)")
    p.add_argument("--max-backoff", default="0.5s", help="retryPolicy.maxBackoff (0.5s)")
    p.add_argument("--max-tokens", type=int, default=1000, help="retryThrottling.maxTokens (1000)")
    p.add_argument("--token-ratio", type=float, default=0.1, help="retryThrottling.tokenRatio (0.1)")
    args = p.parse_args()
    if args.calls < 1 or args.rate <= 0 or args.concurrency < 1 or args.timeout <= 0:
        p.error("--calls, --rate, --concurrency and --timeout must be positive")
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
