"""The peers' table: one column per target (hub, raw ceiling, nchan, Pushpin, nginx static).

A peer that took no part in a scenario shows "—"; one that could not be had shows
"skipped (why)", so a missing comparison is never mistaken for a won one. Every scenario
has a row saying which process ran out of CPU, because on a small machine a client or a
publisher can be what limits a figure, not the server it is printed under.
"""

from __future__ import annotations

from bench.peers.scenarios import PACED, PEERS

Figures = dict[str, float]
TARGETS = {
    "hub": "hub",
    "raw": "raw ceiling",
    "nchan": "nchan",
    "pushpin": "Pushpin",
    "nginx": "nginx static",
}
SATURATED = 0.9  # cores: a single-threaded process at this share of a core is the limit


def header() -> list[str]:
    names = " | ".join(TARGETS.values())
    return [
        f"| scenario | measure | {names} |",
        "|---|---|" + "---|" * len(TARGETS),
    ]


def saturation(r: Figures, prefix: str) -> str:
    """Which process ran out of CPU: one near a whole core, else the machine if its cores
    were all busy, else none; the three busiest processes beside the verdict."""
    cores = {
        key.removeprefix(prefix): value
        for key, value in r.items()
        if key.startswith(prefix) and key != f"{prefix}others"
    }
    if not cores:
        return "not measured"
    others = r.get(f"{prefix}others", 0.0)
    ranked = sorted(cores.items(), key=lambda item: -item[1])
    busiest, top = ranked[0]
    listed = ", ".join(f"{name} {value:.2f}" for name, value in ranked[:3])
    if top >= SATURATED:
        return f"**{busiest}** ({listed} cores)"
    if sum(cores.values()) + others >= SATURATED * r.get("cores", 1.0):
        return f"all {r.get('cores', 1.0):.0f} cores busy ({listed}; others {others:.2f})"
    return f"none ({listed} cores)"


def _row(
    label: str,
    measure: str,
    r: Figures,
    scenario: str,
    skipped: dict[str, str],
    cell: dict[str, str],
) -> str:
    """One table line; `cell` holds the measured targets' text. A skipped peer's reason is
    given on the scenario's first line (the one with a label), "skipped" below it."""
    cells = []
    for target in TARGETS:
        if target in cell:
            cells.append(cell[target])
        elif target not in ("hub", "raw") and target not in PEERS[scenario]:
            cells.append("—")
        elif target in skipped:
            why = skipped[target].replace("|", "/")
            cells.append(f"skipped ({why})" if label else "skipped")
        else:
            cells.append("not measured")
    return f"| {label} | {measure} | " + " | ".join(cells) + " |"


def _measured(r: Figures, scenario: str, key: str) -> list[str]:
    """The targets with figure `key` (`{target}_{key}`) in this scenario's results."""
    return [
        t for t in TARGETS if (t in ("hub", "raw") or t in PEERS[scenario]) and f"{t}_{key}" in r
    ]


def _fanout(r: Figures, skipped: dict[str, str]) -> list[str]:
    scenario = "peers_fanout"
    rates = sorted(
        {
            float(key.split("_r", 1)[1].split("_", 1)[0])
            for key in r
            if key.startswith("hub_r") and key.endswith("_us_per_frame")
        }
    )
    label = (
        f"fan-out beside peers ({r['streams']:,.0f} streams over {r['topics']:.0f} topics, "
        f"{r['streams'] / r['topics']:,.0f} per topic)"
    )
    lines = []
    first = f"r{rates[0]:.0f}" if rates else ""
    sizes = {
        t: f"{r[f'{t}_{first}_frame_bytes']:.0f} B"
        for t in _measured(r, scenario, f"{first}_frame_bytes")
    }
    lines.append(
        _row(label, "frame on the wire (SSE framing included)", r, scenario, skipped, sizes)
    )
    windows = [(f"r{rate:.0f}", f"{rate:,.0f} frames/s offered") for rate in rates]
    if "hub_over_rate" in r:
        windows.append(("over", f"overload, {r['hub_over_offered']:,.0f} frames/s offered"))
    if "hub_paced_rate" in r:
        windows.append(("paced", f"paced at {PACED:.0%} of each one's overload delivery"))
    for k, title in windows:
        cpu: dict[str, str] = {}
        latency: dict[str, str] = {}
        busy: dict[str, str] = {}
        for t in _measured(r, scenario, f"{k}_us_per_frame"):
            nats = r.get(f"{t}_{k}_nats_us_per_frame")
            beside = f" (+{nats:.1f} nats-server)" if nats is not None else ""
            offered = f"{r[f'{t}_{k}_offered']:,.0f} → " if k == "paced" else ""
            cpu[t] = (
                f"{offered}{r[f'{t}_{k}_rate']:,.0f}/s; "
                f"**{r[f'{t}_{k}_us_per_frame']:.1f} µs**{beside}"
            )
            latency[t] = (
                f"{r[f'{t}_{k}_p50_ms']:.1f} / **{r[f'{t}_{k}_p99_ms']:.1f}** / "
                f"{r[f'{t}_{k}_p999_ms']:.1f} ms"
            )
            busy[t] = saturation(r, f"{t}_{k}_cores_")
        lines += [
            _row("", f"{title}: delivered; server CPU per frame", r, scenario, skipped, cpu),
            _row("", "p50 / p99 / p99.9 publish→client", r, scenario, skipped, latency),
            _row("", "which process saturated (cores)", r, scenario, skipped, busy),
        ]
    return lines


def _storm(r: Figures, skipped: dict[str, str]) -> list[str]:
    scenario = "peers_storm"
    wall: dict[str, str] = {}
    rss: dict[str, str] = {}
    busy: dict[str, str] = {}
    for t in _measured(r, scenario, "seconds"):
        origin = r.get(f"{t}_origin_cpu_s", 0.0)
        beside = f" + origin {origin:.2f} s" if origin else ""
        retried = r.get(f"{t}_retried", 0.0)
        again = f"; {retried:,.0f} refused, opened again" if retried else ""
        wall[t] = f"**{r[f'{t}_seconds']:.2f} s** ({r[f'{t}_cpu_s']:.2f} s CPU{beside}{again})"
        rss[t] = f"**{r[f'{t}_kb_per_stream']:.1f} KB**"
        busy[t] = saturation(r, f"{t}_cores_")
    label = f"connect storm beside peers ({r['streams']:,.0f} streams)"
    return [
        _row(
            label, "every stream has its first frame: wall (server CPU)", r, scenario, skipped, wall
        ),
        _row("", "RSS per idle stream", r, scenario, skipped, rss),
        _row("", "which process saturated (cores)", r, scenario, skipped, busy),
    ]


def _poll(r: Figures, skipped: dict[str, str]) -> list[str]:
    scenario = "peers_poll"
    rps: dict[str, str] = {}
    cpu: dict[str, str] = {}
    latency: dict[str, str] = {}
    busy: dict[str, str] = {}
    for t in _measured(r, scenario, "rps"):
        ratio = ""
        if t == "hub":
            ratio = "; " + ", ".join(
                f"{r['hub_rps'] / r[f'{o}_rps']:.2f}× {TARGETS[o]}"
                for o in ("raw", "nginx")
                if r.get(f"{o}_rps")
            )
        rps[t] = f"**{r[f'{t}_rps']:,.0f}**{ratio}"
        cpu[t] = f"{r[f'{t}_us_per_request']:.1f} µs"
        latency[t] = f"{r[f'{t}_p50_ms']:.1f} / **{r[f'{t}_p99_ms']:.1f}** ms"
        busy[t] = saturation(r, f"{t}_cores_")
    label = f"tasks/get beside nginx ({r['connections']:.0f} connections)"
    return [
        _row(label, "req/s", r, scenario, skipped, rps),
        _row("", "server CPU per request", r, scenario, skipped, cpu),
        _row("", "p50 / p99 latency", r, scenario, skipped, latency),
        _row("", "which process saturated (cores)", r, scenario, skipped, busy),
    ]


ROWS = {"peers_fanout": _fanout, "peers_storm": _storm, "peers_poll": _poll}


def table(
    results: dict[str, Figures], skipped: dict[str, str], versions: dict[str, str] | None = None
) -> list[str]:
    """The peers' table for whichever peer scenarios ran; [] if none did."""
    lines: list[str] = []
    for name, rows in ROWS.items():
        if name in results:
            lines += rows(results[name], skipped)
    if not lines:
        return []
    v = versions or {}
    about = (
        f"Peers: nginx {v.get('nginx', '?')} with one worker (nchan {v.get('nchan', '?')}; "
        f"static files), Pushpin {v.get('pushpin', '?')} (condure, zurl, pushpin-proxy, "
        "pushpin-handler: CPU and RSS summed over all). Server CPU excludes the publisher "
        "and load generator; the hub's path also costs nats-server the CPU shown beside it."
    )
    return [about, "", *header(), *lines]
