"""bench/: the smoke run end to end, and the byte-wise readers the load generators rely on.

The smoke run is `python -m bench --smoke --json` in a subprocess, exactly as a user runs
it: its own nats-server, hubs, reference servers and load generators, tiny sizes. It
asserts the shape of the output (every acceptance key, numeric), never a timing.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import instructions, protocol, report
from bench.front_door import FRONT_DOOR_CALLS
from bench.operator_stream import PROCESSES
from bench.peers import nginx, pushpin, setup
from bench.peers import report as peers_report
from bench.peers.scenarios import PEERS
from bench.sizes import SMOKE
from bench.stats import latency_summary, percentile

REPO_ROOT = Path(__file__).resolve().parent.parent

REQUIRED = {
    "fanout": ("hub_rate", "raw_rate", "ratio", "p50_ms", "p99_ms", "p999_ms"),
    "storm": ("streams", "seconds", "kb_per_stream"),
    "poll": ("hub_rps", "raw_rps", "origin_rps", "hub_p99_ms"),
    "push_vs_poll": (
        "fleet_requests_poll",
        "fleet_requests_push",
        "staleness_poll_ms",
        "staleness_push_ms",
    ),
    "cold_start": (
        "tasks",
        "seconds",
        "rss_mb",
        "rss_per_task",
        "json_bytes",
        "restart_seconds",
        "restart_rss_per_task",
        "checkpoint_mb",
        "crash_seconds",
    ),
    "writes": ("updates_per_s", "always_updates_per_s", "always_nats_cpu_cores"),
    "front_door": tuple(
        f"{call.key}_{key}"
        for call in FRONT_DOOR_CALLS
        for key in (
            "hub_rps",
            "direct_rps",
            "ratio",
            "hub_p50_ms",
            "hub_p99_ms",
            "direct_p50_ms",
            "direct_p99_ms",
            "hub_us_per_request",
            "hub_upstream_us_per_request",
            "direct_us_per_request",
        )
    ),
    "operator": (
        "dashboards",
        "tasks",
        "initial_seconds",
        "initial_p50_seconds",
        "initial_mb",
        *(
            f"{window}_{key}"
            for window in ("paced1", "flat")
            for key in (
                "offered",
                "written",
                "rate",
                "per_dashboard",
                "share",
                "share_min",
                "p50_ms",
                "p99_ms",
                "us_per_frame",
                *(f"{process}_cpu_cores" for process in (*PROCESSES, "others")),
            )
        ),
    ),
    "upstream_tasks": (
        "ratio",
        "hub_reads_per_interval",
        *(
            f"{side}_{key}"
            for side in ("direct", "hub")
            for key in (
                "upstream_gets_per_s",
                "upstream_cpu_s",
                "hub_cpu_s",
                "nats_cpu_s",
                "staleness_p50_ms",
                "staleness_p99_ms",
                "poll_staleness_p99_ms",
                "errors",
            )
        ),
        "hub_listen_staleness_p50_ms",
        "hub_listen_staleness_p99_ms",
    ),
    # The hub and the raw ceiling take part in every peer scenario; each peer is either
    # measured or named in `run.skipped` (PEER_FIGURE).
    "peers_fanout": tuple(
        f"{target}_r{rate:.0f}_{key}"
        for target in ("hub", "raw")
        for rate in SMOKE.peer_rates
        for key in ("rate", "us_per_frame", "p50_ms", "p99_ms", "p999_ms", "frame_bytes")
    ),
    "peers_storm": tuple(
        f"{target}_{key}" for target in ("hub", "raw") for key in ("seconds", "kb_per_stream")
    ),
    "peers_poll": tuple(
        f"{target}_{key}"
        for target in ("hub", "raw")
        for key in ("rps", "us_per_request", "p99_ms")
    ),
}
# The figure that says a peer was measured in each peer scenario.
PEER_FIGURE = {
    "peers_fanout": f"r{SMOKE.peer_rates[0]:.0f}_us_per_frame",
    "peers_storm": "seconds",
    "peers_poll": "rps",
}
# Operator-stream figures that must be above zero in any run: the dashboards synced, every
# window wrote changes and delivered them. CPU figures may round to 0 in a smoke window.
OPERATOR_POSITIVE = tuple(
    key for key in REQUIRED["operator"] if "cpu" not in key and "per_frame" not in key
)


@pytest.mark.timeout(150)
def test_smoke_run_prints_one_json_object_with_every_key() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--json", "--repeat", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=140,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)  # the whole of stdout is one JSON object
    for scenario, keys in REQUIRED.items():
        for key in keys:
            value = result[scenario][key]
            assert isinstance(value, int | float) and not isinstance(value, bool), (scenario, key)
    assert result["fanout"]["hub_rate"] > 0 and result["poll"]["hub_rps"] > 0
    dashboards = result["operator"]
    assert all(math.isfinite(value) and value >= 0 for value in dashboards.values()), dashboards
    assert all(dashboards[key] > 0 for key in OPERATOR_POSITIVE), dashboards
    assert result["push_vs_poll"]["fleet_requests_push"] == 0  # the hub spares the fleet
    assert result["push_vs_poll"]["fleet_requests_poll"] > 0
    front = result["front_door"]
    assert front["default_hub_rps"] > 0 and front["default_direct_rps"] > 0
    # The answer forms the scenario claims: SSE only where the tool reports progress, and
    # the same form through the hub as direct.
    for leg in ("direct", "hub"):
        assert front[f"default_{leg}_sse_fraction"] == 0
        assert front[f"json_{leg}_sse_fraction"] == 0
        assert front[f"sse_{leg}_sse_fraction"] == 1
    kept = result["upstream_tasks"]
    assert all(math.isfinite(value) and value >= 0 for value in kept.values()), kept
    # Both sides' clients reached the upstream (directly, or by the hub's reads).
    assert kept["direct_upstream_gets_per_s"] > 0 and kept["hub_upstream_gets_per_s"] > 0
    assert "| hub: 10 poll, 10 listen |" in done.stderr  # its own table, under the main one
    assert result["machine"]["cores"] >= 1
    assert result["machine"]["versions"]["mcp"] == "2.3.0"
    assert "| scenario |" in done.stderr  # the table goes to stderr under --json
    # Every peer is measured or skipped with a reason, in the JSON and in the table.
    skipped = result["run"]["skipped"]
    peer_lines = [
        line
        for line in done.stderr.splitlines()
        if line.startswith("| ") and "beside" in line.split(" | ")[0]
    ]
    for scenario, peers in PEERS.items():
        for peer in peers:
            measured = f"{peer}_{PEER_FIGURE[scenario]}" in result[scenario]
            assert measured or skipped.get(peer), (scenario, peer, skipped)
    assert len(peer_lines) == len(PEERS)  # one labelled row per peer scenario
    for line in peer_lines:
        cells = line.split(" | ")[2:]
        assert len(cells) == len(peers_report.TARGETS)
        assert all(c.strip(" |") and c.strip(" |") != "not measured" for c in cells), line


def test_response_reader_splits_keep_alive_responses_both_framings() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    sized = b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nabc"
    reader = protocol.ResponseReader()
    stream = chunked + sized
    answers: list[tuple[int, bytes]] = []
    for i in range(0, len(stream), 7):  # split anywhere, as TCP may
        answers += reader.feed(stream[i : i + 7])
    assert answers == [(200, b"hello world"), (404, b"abc")]


def test_sse_scanner_yields_whole_events_and_their_stamps() -> None:
    stamp = protocol.stamp()
    frame = (
        b'data: {"method":"notifications/tasks","params":{"taskId":"x","statusMessage":"'
        + stamp.encode()
        + b'"}}\n\n'
    )
    ack = b'data: {"method":"notifications/subscriptions/acknowledged"}\n\n'
    body = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    body += b"%x\r\n%b\r\n" % (len(ack + frame), ack + frame)
    scanner = protocol.SseScanner()
    events = b"".join(scanner.feed(body[i : i + 5]) for i in range(0, len(body), 5))
    assert scanner.status == 200
    assert protocol.ACK_MARK in events
    assert events.count(protocol.STAMP_MARK) == 1
    assert protocol.frame_stamps(events) == [stamp.removeprefix("t=").encode()]


@pytest.mark.parametrize("progress", [False, True])
def test_tools_call_request_carries_the_routing_headers_and_meta(progress: bool) -> None:
    request = protocol.tools_call(8101, "echo", {"text": "hi"}, 7, progress=progress)
    head, body = request.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /mcp HTTP/1.1"
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert headers["MCP-Protocol-Version"] == protocol.PROTOCOL
    assert headers["Mcp-Method"] == "tools/call" and headers["Mcp-Name"] == "echo"
    assert int(headers["Content-Length"]) == len(body)
    message = json.loads(body)
    assert message["id"] == 7 and message["method"] == "tools/call"
    params = message["params"]
    assert params["name"] == "echo" and params["arguments"] == {"text": "hi"}
    meta = params["_meta"]
    assert meta["io.modelcontextprotocol/protocolVersion"] == protocol.PROTOCOL
    assert "io.modelcontextprotocol/clientCapabilities" in meta
    assert ("progressToken" in meta) is progress
    routed = protocol.tools_call(8101, "echo", {}, path="/servers/json/mcp")
    assert routed.startswith(b"POST /servers/json/mcp HTTP/1.1\r\n")


def test_front_door_rows_show_each_answer_form_beside_the_direct_call() -> None:
    figures = dict.fromkeys(REQUIRED["front_door"], 1.0)
    figures["connections"] = 64.0
    for call in FRONT_DOOR_CALLS:
        figures[f"{call.key}_hub_new_upstream_connections"] = 0.0
        figures[f"{call.key}_hub_rps"] = 500.0
        figures[f"{call.key}_direct_rps"] = 1000.0
        figures[f"{call.key}_ratio"] = 0.5
    versions = dict.fromkeys(
        ("taskhub", "uvicorn", "uvloop", "httptools", "starlette", "msgspec", "nats-py"), "0"
    )
    machine = {"cores": 2, "cpu": "x", "memory_gb": 1, "os": "x", "python": "x"}
    run = {"command": "python -m bench", "sizes": "full", "repeat": 3, "seconds": 1.0}
    table = report.markdown(
        {"front_door": figures},
        {**machine, "versions": {**versions, "mcp": "2.3.0", "nats-server": "0"}},
        {**run, "load_before": 0.0, "load_after": 0.0},
    )
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 2 * len(FRONT_DOOR_CALLS)
    assert all(len(row) == 5 for row in rows)  # scenario | measure | hub | reference | target
    assert rows[0][0] == "| front door (64 connections, tools/call)"
    assert all(row[0] == "| " for row in rows[1:])
    rate_rows = rows[::2]
    assert [row[1].split(":")[0] for row in rate_rows] == [c.label for c in FRONT_DOOR_CALLS]
    assert all("**500**" in row[2] and "→ **0.50×**" in row[3] for row in rate_rows)
    assert all("✗ missed" in row[4] for row in rate_rows)  # 0.50× direct misses its floor
    assert all("nginx" not in row[3] for row in rows)  # no nginx figures: no nginx column


def test_front_door_rows_hold_the_hub_to_nginx_and_the_upstream() -> None:
    r = dict.fromkeys(REQUIRED["front_door"], 1.0)
    r["connections"] = 64.0
    for call in FRONT_DOOR_CALLS:
        k = call.key
        r.update({f"{k}_hub_new_upstream_connections": 0.0, f"{k}_ratio": 1.0})
        r.update({f"{k}_hub_us_per_request": 120.0, f"{k}_direct_us_per_request": 600.0})
        r.update({f"{k}_nginx_rps": 1.0, f"{k}_nginx_p50_ms": 1.0, f"{k}_nginx_p99_ms": 1.0})
        r.update({f"{k}_nginx_ratio": 1.0, f"{k}_nginx_upstream_us_per_request": 600.0})
        r[f"{k}_nginx_us_per_request"] = 50.0  # the hub at 2.4× nginx: over its target
    rows = report._front_door(r)
    cpu_rows = {call.key: rows[2 * i + 1] for i, call in enumerate(FRONT_DOOR_CALLS)}
    assert "hub **2.4×** nginx" in cpu_rows["json"][3]
    assert "≤ 0.25× upstream ✓" in cpu_rows["json"][4]  # 120 of 600 µs
    assert "≤ 2× nginx ✗ missed" in cpu_rows["json"][4]
    assert cpu_rows["sse"][4] == ""  # SSE answers have a rate target only


def _upstream_tasks_figures(**figures: float) -> dict[str, float]:
    r = dict.fromkeys(REQUIRED["upstream_tasks"], 1.0)
    for side in ("direct", "hub"):
        for key in ("client_requests_per_s", "loadgen_cpu_cores", "others_cpu_cores"):
            r[f"{side}_{key}"] = 0.1
    r.update(
        clients=500.0,
        tasks=50.0,
        poll_interval_ms=500.0,
        change_interval_ms=2000.0,
        seconds=30.0,
        cores=2.0,
        hub_frames_per_s=125.0,
        hub_streams_lost=0.0,
        hub_poll_staleness_p50_ms=300.0,
        hub_listen_staleness_p50_ms=250.0,
        direct_upstream_gets_per_s=1000.0,
        hub_upstream_gets_per_s=99.0,
        ratio=1000 / 99,
        hub_reads_per_interval=0.99,
        hub_staleness_p99_ms=650.0,
        hub_poll_staleness_p99_ms=700.0,
        hub_listen_staleness_p99_ms=520.0,
    )
    r.update(figures)
    return r


def test_upstream_tasks_table_has_a_row_per_side_and_says_which_targets_were_met() -> None:
    versions = dict.fromkeys(
        ("taskhub", "uvicorn", "uvloop", "httptools", "starlette", "msgspec", "nats-py"), "0"
    )
    machine = {"cores": 2, "cpu": "x", "memory_gb": 1, "os": "x", "python": "x"}
    run = {"command": "python -m bench", "sizes": "full", "repeat": 3, "seconds": 1.0}
    table = report.markdown(
        {"upstream_tasks": _upstream_tasks_figures()},
        {**machine, "versions": {**versions, "mcp": "2.3.0", "nats-server": "0"}},
        {**run, "load_before": 0.0, "load_after": 0.0},
    )
    assert "| scenario | measure |" not in table  # only this scenario ran: no empty main table
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ")]
    assert rows[0][0] == "| upstream_tasks" and len(rows[0]) == 6
    assert [row[0] for row in rows[1:]] == [
        "| direct: 500 poll the upstream (no listen there)",
        "| hub: 250 poll, 250 listen",
    ]
    assert all(len(row) == 6 for row in rows)
    assert rows[2][1] == "**99.0**" and rows[1][3] == "—"
    notes = table[table.index("Targets:") :]
    assert "**10.10×**: ≥ 10× at 10 clients per task ✓" in notes
    assert "= 600 ms: all clients 650 ✗ missed, polling 700 ✗ missed, listening 520 ✓" in notes


def _operator_figures(**cores: float) -> dict[str, float]:
    figures = dict.fromkeys(REQUIRED["operator"], 1.0)
    figures.update(dashboards=100.0, tasks=10_000.0, cores=2.0, flat_in_flight=64.0)
    for window in ("paced1", "flat"):
        for process in (*PROCESSES, "others"):
            figures[f"{window}_{process}_cpu_cores"] = cores.get(process, 0.1)
    return figures


@pytest.mark.parametrize(
    ("cores", "verdict"),
    [
        ({"hub": 0.97}, "saturated: **hub at 0.97 cores"),
        ({"writer": 0.6, "others": 1.3}, "saturated: all 2 cores busy (writer at 0.60 cores"),
        ({}, "none saturated (hub at 0.10 cores"),
    ],
)
def test_operator_rows_say_which_process_saturated(cores: dict[str, float], verdict: str) -> None:
    rows = report._operator(_operator_figures(**cores))
    assert rows[0][0] == "operator stream (100 dashboards, 10,000 tasks)"
    assert [row[1].split(":")[0] for row in rows[1:]] == [
        "offered 1/s",
        "flat out (64 writes in flight)",
    ]
    assert all(len(row) == 5 and verdict in row[3] for row in rows[1:])


def test_percentiles_are_nearest_rank() -> None:
    samples = list(range(1, 1001))
    assert percentile(samples, 50) == 500
    assert percentile(samples, 99) == 990
    assert percentile(samples, 99.9) == 999
    assert percentile([], 99) == 0.0
    summary = latency_summary([1_000_000] * 10)
    assert summary["p99_ms"] == 1.0 and summary["samples"] == 10


def _run_module(module: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    """`python -m module args` from the repository root, within 80 s, exited 0."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.mark.timeout(90)
def test_latency_against_rate_prints_a_row_per_rate() -> None:
    args = ["--streams", "20", "--tasks", "2", "--rates", "200", "400", "--seconds", "1"]
    done = _run_module("bench.latency", args)
    rows = [
        line
        for line in done.stdout.splitlines()
        if line.startswith("| 2") or line.startswith("| 4")
    ]
    assert [row.split(" | ")[0] for row in rows] == ["| 200", "| 400"]
    assert all(row.count(" ms") == 2 for row in rows)  # hub and raw, each p50 / p99


@pytest.mark.timeout(90)
def test_the_store_floor_prints_a_row_per_watcher_and_rate() -> None:
    args = ["--rates", "20", "--seconds", "1"]
    done = _run_module("bench.store_floor", args)
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| nobody", "| one"))]
    assert [row.split(" | ")[0] for row in rows] == ["| nobody", "| one hub"]
    shape = re.compile(r"\| 20 \([1-9]\d*\) \| \d+ µs \| [\d.]+ µs \|$")  # some writes done
    assert all(shape.search(row) for row in rows), rows


@pytest.mark.timeout(90)
def test_the_forward_instructions_probe_forwards_every_call() -> None:
    done = _run_module("bench.forward_instructions", ["--probe", "--calls", "300"])
    assert "300 of 300 calls answered 200" in done.stdout


def _peer_figures() -> dict[str, float]:
    figures = {"streams": 10_000.0, "cores": 2.0}
    for target in ("hub", "raw", "nchan"):
        figures.update(
            {
                f"{target}_seconds": 1.5,
                f"{target}_cpu_s": 0.5,
                f"{target}_kb_per_stream": 14.0,
                f"{target}_cores_{target}": 0.95 if target == "nchan" else 0.2,
                f"{target}_cores_load generator": 0.3,
                f"{target}_cores_others": 0.0,
            }
        )
    return figures


def test_peer_rows_show_every_target_measured_skipped_or_absent() -> None:
    lines = peers_report.table({"peers_storm": _peer_figures()}, {"pushpin": "not installed"})
    assert lines[0].startswith("Peers: nginx ? with one worker")
    header, rows = lines[2], [line.split(" | ") for line in lines[4:]]
    assert header.count(" | ") == 1 + len(peers_report.TARGETS)
    assert rows[0][0] == "| connect storm beside peers (10,000 streams)"
    columns = {t: [row[2 + i] for row in rows] for i, t in enumerate(peers_report.TARGETS)}
    assert columns["nchan"][0] == "**1.50 s** (0.50 s CPU)"
    assert columns["pushpin"][0] == "skipped (not installed)"
    assert all(cell.strip(" |") == "skipped" for cell in columns["pushpin"][1:])
    assert all(cell.strip(" |") == "—" for cell in columns["nginx"])  # not in this scenario
    verdicts = rows[2][2:]
    assert verdicts[0].startswith("none (")
    assert verdicts[2].startswith("**nchan** (nchan 0.95")


def test_peer_configs_stay_on_loopback_and_in_the_work_dir(tmp_path: Path) -> None:
    conf = nginx.config(tmp_path, 8123, nginx.NCHAN_LOCATIONS, [Path("/m/nchan.so")])
    assert "worker_processes 1;" in conf and "listen 127.0.0.1:8123" in conf
    assert "load_module /m/nchan.so;" in conf
    files = [w.rstrip(";") for w in conf.split() if w.startswith("/") and w not in ("/pub", "/sub")]
    assert all(f.startswith(str(tmp_path)) or f == "/m/nchan.so" for f in files), files
    ini = pushpin.config(tmp_path, 8124, 8125)
    assert "http_port=127.0.0.1:8124" in ini and "push_in_http_port=8125" in ini
    assert "push_in_http_addr=127.0.0.1" in ini
    assert "/var/" not in ini and "/etc/" not in ini and "tcp://" not in ini


def test_sse_scanner_reads_peer_frames_with_id_lines_and_comments() -> None:
    stamp = protocol.stamp()
    frame = b'data: {"statusMessage":"' + stamp.encode() + b'"}\n\n'
    nchan = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n: hi\n\nid: 1:0\n" + frame
    scanner = protocol.SseScanner()
    events = b"".join(scanner.feed(nchan[i : i + 9]) for i in range(0, len(nchan), 9))
    assert scanner.status == 200 and events.count(protocol.STAMP_MARK) == 1
    assert protocol.frame_stamps(events) == [stamp.removeprefix("t=").encode()]


async def test_a_missing_peer_is_skipped_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = setup.Requirement((Path("/nonexistent/nginx"),), ("nginx-light",))
    monkeypatch.setitem(setup.REQUIREMENTS, "nchan", missing)
    logged: list[str] = []
    peers = setup.PeerSetup(logged.append, may_install=False)
    assert not await peers.available("nchan")
    assert peers.skipped["nchan"] == "/nonexistent/nginx missing; this run installs nothing"
    assert logged == ["nchan: skipped (/nonexistent/nginx missing; this run installs nothing)"]
    assert not await peers.available("nchan")  # looked up once, the reason kept
    assert len(logged) == 1


@pytest.mark.parametrize("target", instructions.TARGETS)
def test_the_instruction_probe_delivers_every_revision_to_every_stream(target: str) -> None:
    """`python -m bench.instructions` counts a path only if it did the work: its probe,
    run without valgrind, gets each revision to each follower as one frame (the hub's
    streams also get their ack)."""
    frames, counted = instructions.run_probe(target, streams=4, revisions=25, valgrind=[])
    assert frames == 4 * 25 + (4 if target == "hub" else 0)
    assert counted == 0  # no valgrind, no count


def test_cpu_seconds_are_not_counted_in_clock_ticks() -> None:
    """A server's CPU over a window is a difference of two readings: in clock ticks (10 ms)
    each was truncated, which moved a 3 s window's CPU per frame by up to 3%."""
    import os
    import time

    from bench.processes import cpu_seconds

    errors = []
    for _ in range(5):
        before, started = cpu_seconds(os.getpid()), time.thread_time()
        while time.thread_time() - started < 0.025:  # about 25 ms of this thread's CPU
            pass
        spent = time.thread_time() - started
        errors.append(abs(cpu_seconds(os.getpid()) - before - spent))
    assert min(errors) < 0.002, errors  # ticks: off by 5 ms on average, never under 2 ms
