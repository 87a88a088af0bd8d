"""Scenario (g), the front door: closed-loop `tools/call` on C keep-alive connections to an
`mcp` SDK server (bench/upstream.py), called directly, through `taskhub serve --upstream`
and through nginx's `proxy_pass` (the peer a user would otherwise put there,
bench/peers/nginx.py; left out when nginx is not installed) in turn, the order rotating
per repetition: req/s, p50/p99, and CPU per call of the proxy and of the upstream, for
each answer form (FRONT_DOOR_CALLS).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from bench.control import Worker
from bench.harness import Harness, HarnessError, Server, bucket_name, server_stats
from bench.peers import nginx
from bench.peers.server import PeerServer
from bench.peers.server import stop as stop_peer
from bench.peers.tree import ProcessTree
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


@dataclass(frozen=True)
class Leg:
    """One way to the upstream: where the load generator connects, and the CPU seconds of
    the proxy on the way (None: the upstream itself)."""

    name: str  # direct | hub | nginx
    port: int
    proxy_cpu: Callable[[], float] | None
    hub: Server | None = None  # profiled with --profile


async def _tools_call_window(
    h: Harness,
    loadgen: Worker,
    s: Sizes,
    call: FrontDoorCall,
    leg: Leg,
    path: str,
    upstream: Server,
) -> Metrics:
    """Closed-loop tools/call along `leg`: req/s, latency, and CPU per call of the proxy
    (if any) and of the upstream."""
    recording = None
    if leg.hub is not None:
        recording = await h.record(
            leg.hub, f"front-door-{call.key}", s.warmup_seconds + s.front_door_seconds
        )
    seen = await server_stats(upstream)
    sources = [upstream.child.cpu_seconds] + ([leg.proxy_cpu] if leg.proxy_cpu else [])
    cpu = [source() for source in sources]
    result = await loadgen.call(
        "tools_call",
        s.front_door_seconds + 120,
        port=leg.port,
        path=path,
        tool=call.tool,
        progress=call.progress,
        connections=s.front_door_connections,
        warmup=s.warmup_seconds,
        seconds=s.front_door_seconds,
    )
    cpu = [source() - before for source, before in zip(sources, cpu, strict=True)]
    await h.report_profile(recording)
    stats = await server_stats(upstream)
    reached = stats["requests"] - seen["requests"]
    calls = max(1, result["all_requests"])
    where = "direct" if leg.proxy_cpu is None else f"through {leg.name}"
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
        "upstream_us_per_request": cpu[0] / calls * 1e6,
        # Connections the upstream saw for the first time: direct, the load generator's
        # (new each window); through a proxy, its pool's (~0 once warm, if it keeps them).
        "new_upstream_connections": stats["connections"] - seen["connections"],
    }
    if leg.proxy_cpu is not None:
        window["us_per_request"] = cpu[1] / calls * 1e6  # the proxy's, per forwarded call
    return window


async def _nginx_proxy(h: Harness, routes: dict[str, int]) -> PeerServer | None:
    if not await h.peers.available("nginx"):
        return None
    try:
        return await nginx.start_proxy(h, routes)
    except (HarnessError, OSError) as exc:
        h.peers.skip("nginx", f"did not start: {str(exc).splitlines()[0][:160]}")
        return None


def _tree_cpu(tree: ProcessTree) -> Callable[[], float]:
    return lambda: sum(tree.cpu_by_member().values())


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
    json_path = f"/servers/{FRONT_DOOR_JSON_NAME}/mcp"
    proxy = await _nginx_proxy(h, {"/mcp": default.port, json_path: json_mode.port})
    runs: list[Metrics] = []
    for rep in range(repeat):
        run: Metrics = {"connections": s.front_door_connections}
        for call in FRONT_DOOR_CALLS:
            upstream = json_mode if call.json_response else default
            path = json_path if call.json_response else "/mcp"
            legs = [
                (Leg("direct", upstream.port, None), "/mcp"),
                (Leg("hub", hub.port, hub.child.cpu_seconds, hub), path),
            ]
            if proxy is not None:
                legs.append((Leg("nginx", proxy.port, _tree_cpu(proxy.tree)), path))
            # Rotate which goes first, so drift within a repetition evens out.
            legs = legs[rep % len(legs) :] + legs[: rep % len(legs)]
            for leg, leg_path in legs:
                window = await _tools_call_window(h, loadgen, s, call, leg, leg_path, upstream)
                prefix = f"{call.key}_{leg.name}_"
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
                if leg.name == "direct":
                    run[f"{call.key}_direct_us_per_request"] = window["upstream_us_per_request"]
                else:
                    run[prefix + "us_per_request"] = window["us_per_request"]
                    run[prefix + "upstream_us_per_request"] = window["upstream_us_per_request"]
            direct = run[f"{call.key}_direct_rps"]
            run[f"{call.key}_ratio"] = run[f"{call.key}_hub_rps"] / max(direct, 1e-9)
            if proxy is not None:
                run[f"{call.key}_nginx_ratio"] = run[f"{call.key}_nginx_rps"] / max(direct, 1e-9)
            h.log(
                f"front_door #{rep + 1} {call.key}: direct {run[f'{call.key}_direct_rps']:,.0f}/s, "
                f"through the hub {run[f'{call.key}_hub_rps']:,.0f}/s "
                f"({run[f'{call.key}_ratio']:.2f}×)"
            )
        runs.append(run)
    if proxy is not None:
        await stop_peer(h, proxy.tree)
    for server in (hub, default, json_mode):
        await h.stop(server)
    await h.close_worker(loadgen)
    return medians(runs)
