"""Scenario (g), the front door: closed-loop `tools/call` on C keep-alive connections to an
`mcp` SDK server (bench/upstream.py), called directly and through `taskhub serve --upstream`
in turn: req/s, p50/p99, and CPU per call of the hub and of the upstream, for each answer
form (FRONT_DOOR_CALLS).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from bench.control import Worker
from bench.harness import Harness, Server, bucket_name, server_stats
from bench.sizes import Sizes
from bench.stats import Metrics, medians


@dataclass(frozen=True)
class FrontDoorCall:
    """One answer form of the front door's upstream, measured direct and through the hub."""

    key: str  # the JSON keys' prefix
    label: str  # the table's
    json_response: bool  # which upstream process: SDK default mode, or json_response=True
    tool: str
    progress: bool  # send a progressToken (the tool then reports progress once)


# The SDK's default mode (json_response=False) runs the handler beside the request and
# answers JSON if it finishes before emitting anything, as `echo` does; a tool that reports
# progress commits the answer to SSE, which the hub relays chunk by chunk. With
# json_response=True the SDK answers JSON from the request's own task.
FRONT_DOOR_CALLS = (
    FrontDoorCall("default", "SDK default mode, JSON answer", False, "echo", False),
    FrontDoorCall(
        "sse", "SDK default mode, SSE answer (1 progress event)", False, "echo_progress", True
    ),
    FrontDoorCall("json", "json_response=True, JSON answer", True, "echo", False),
)
FRONT_DOOR_JSON_NAME = "json"  # the json_response=True upstream at /servers/json/mcp


async def _tools_call_window(
    h: Harness,
    loadgen: Worker,
    s: Sizes,
    call: FrontDoorCall,
    target: Server,
    path: str,
    upstream: Server,
) -> Metrics:
    """Closed-loop tools/call at `target` (the upstream itself, or the hub in front of it):
    req/s, latency, and CPU per call of every server on the path."""
    path_servers = [target] if target is upstream else [target, upstream]
    recording = None
    if target is not upstream:
        recording = await h.record(
            target, f"front-door-{call.key}", s.warmup_seconds + s.front_door_seconds
        )
    seen = await server_stats(upstream)
    cpu = [server.child.cpu_seconds() for server in path_servers]
    result = await loadgen.call(
        "tools_call",
        s.front_door_seconds + 120,
        port=target.port,
        path=path,
        tool=call.tool,
        progress=call.progress,
        connections=s.front_door_connections,
        warmup=s.warmup_seconds,
        seconds=s.front_door_seconds,
    )
    cpu = [
        server.child.cpu_seconds() - before
        for server, before in zip(path_servers, cpu, strict=True)
    ]
    await h.report_profile(recording)
    stats = await server_stats(upstream)
    reached = stats["requests"] - seen["requests"]
    calls = max(1, result["all_requests"])
    where = "direct" if target is upstream else "through the hub"
    # A rare failed call is a finding to report (the hub's error names the fault), not a
    # reason to lose the run; many mean the setup is broken.
    if result["all_errors"]:
        h.log(
            f"  front door {call.key} {where}: {result['all_errors']} of {calls} tools/call "
            f"failed, first: {result['first_error']}"
        )
    if result["all_errors"] > max(1, 0.01 * calls):
        raise RuntimeError(f"front door {call.key} {where}: too many failed tools/call")
    if reached < result["all_requests"] - result["all_errors"]:
        raise RuntimeError(
            f"front door {call.key} {where}: {result['all_requests']} answers but only "
            f"{reached} requests reached the upstream"
        )
    window: Metrics = {
        "rps": result["rps"],
        "errors": result["all_errors"],
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "sse_fraction": result["sse_answers"] / max(1, result["requests"]),
        "client_cpu_cores": result["client_cpu_s"] / (s.warmup_seconds + s.front_door_seconds),
        # Upstream CPU per call: the last server on the path.
        "upstream_us_per_request": cpu[-1] / calls * 1e6,
        # Connections the upstream saw for the first time: direct, the load generator's
        # (new each window); through the hub, the pool's (~0 once warm, if it keeps them).
        "new_upstream_connections": stats["connections"] - seen["connections"],
    }
    if target is not upstream:
        window["us_per_request"] = cpu[0] / calls * 1e6  # the hub's, per forwarded call
    return window


async def front_door(h: Harness, s: Sizes, repeat: int) -> Metrics:
    """One hub in front of two upstream processes (SDK default mode at `/mcp`, JSON mode
    at `/servers/json/mcp`); each answer form is called direct, then through the hub (or
    the other way round, alternating per repetition), same load generator and load."""
    bucket = await h.bucket(bucket_name("front"))
    loadgen = await h.loadgen()
    default, json_mode = await asyncio.gather(
        h.start_upstream(), h.start_upstream(json_response=True)
    )
    hub = await h.start_hub(
        bucket,
        max_streams=100,
        upstreams=[
            f"http://127.0.0.1:{default.port}/mcp",
            f"{FRONT_DOOR_JSON_NAME}=http://127.0.0.1:{json_mode.port}/mcp",
        ],
    )
    runs: list[Metrics] = []
    for rep in range(repeat):
        run: Metrics = {"connections": s.front_door_connections}
        for call in FRONT_DOOR_CALLS:
            upstream = json_mode if call.json_response else default
            hub_path = f"/servers/{FRONT_DOOR_JSON_NAME}/mcp" if call.json_response else "/mcp"
            legs = [("direct", upstream, "/mcp"), ("hub", hub, hub_path)]
            if rep % 2:  # alternate which goes first, so drift within a repetition evens out
                legs.reverse()
            for leg, target, path in legs:
                window = await _tools_call_window(h, loadgen, s, call, target, path, upstream)
                prefix = f"{call.key}_{leg}_"
                keys = (
                    "rps",
                    "errors",
                    "p50_ms",
                    "p99_ms",
                    "sse_fraction",
                    "client_cpu_cores",
                    "new_upstream_connections",
                )
                for key in keys:
                    run[prefix + key] = window[key]
                if leg == "hub":
                    run[f"{call.key}_hub_us_per_request"] = window["us_per_request"]
                    run[f"{call.key}_upstream_us_per_request"] = window["upstream_us_per_request"]
                else:
                    run[f"{call.key}_direct_us_per_request"] = window["upstream_us_per_request"]
            run[f"{call.key}_ratio"] = run[f"{call.key}_hub_rps"] / max(
                run[f"{call.key}_direct_rps"], 1e-9
            )
            h.log(
                f"front_door #{rep + 1} {call.key}: direct {run[f'{call.key}_direct_rps']:,.0f}/s, "
                f"through the hub {run[f'{call.key}_hub_rps']:,.0f}/s "
                f"({run[f'{call.key}_ratio']:.2f}×)"
            )
        runs.append(run)
    for server in (hub, default, json_mode):
        await h.stop(server)
    await h.close_worker(loadgen)
    return medians(runs)
