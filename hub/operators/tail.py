"""`taskhub tail`: follow the operator stream (docs/dashboard.md) in a terminal.

The stream is the source of truth and a reconnect resends all of it, so the loop is
simple: connect, fold events into the view (hub/operators/tail_view.py), draw; on any failure say
so, back off and connect again. Refusals that a retry cannot fix (400, 401, 403, 404)
end the command with exit code 2 instead, so a script does not hang on a bad token.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Protocol

import httpx2
import msgspec
from rich.console import Console
from rich.live import Live

from hub.operators import tail_view
from hub.operators.tail_view import Change, TaskChanged, TaskRemoved, View
from hub.options import add_option

EXIT_REFUSED = 2
EXIT_INTERRUPTED = 130
# The hub sends a `fleet` event every 2 s after `synced`; this much silence is a dead peer.
READ_TIMEOUT_S = 30.0
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.5, 10.0
RETRY_AFTER_MAX_S = 30.0
MAX_EVENT_BYTES = 16 << 20
REFRESH_S = 0.25


@dataclass(frozen=True)
class TailOptions:
    url: str = "http://127.0.0.1:8080"
    token: str | None = None
    servers: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    owners: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    until_done: bool = False
    json: bool = False

    @property
    def stream_url(self) -> str:
        return self.url.rstrip("/") + "/operator/stream"

    def params(self) -> httpx2.QueryParams:
        given = {"server": self.servers, "status": self.statuses, "owner": self.owners}
        return httpx2.QueryParams({name: list(v) for name, v in given.items() if v})


def add_tail_options(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    add_option(parser, env, "url", str, TailOptions.url, "the hub")
    add_option(parser, env, "token", str, None, "bearer token for an authenticated hub")
    for flag, what in (("server", "server id"), ("status", "status"), ("owner", "owner")):
        parser.add_argument(
            f"--{flag}",
            action="append",
            default=[],
            help=f"only tasks with this {what}; repeatable or comma-separated (hub-side filter)",
        )
    parser.add_argument("--task", action="append", default=[], help="only this task id; repeatable")
    parser.add_argument(
        "--until-done",
        action="store_true",
        help="exit 0 once every task shown (with --task: every named one) is terminal",
    )
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per task state or removal"
    )


def options_from_namespace(ns: argparse.Namespace) -> TailOptions:
    def split(values: list[str]) -> tuple[str, ...]:
        return tuple(v.strip() for value in values for v in value.split(",") if v.strip())

    return TailOptions(
        url=ns.url,
        token=ns.token or None,
        servers=split(ns.server),
        statuses=split(ns.status),
        owners=split(ns.owner),
        tasks=split(ns.task),
        until_done=ns.until_done,
        json=ns.json,
    )


class Refused(Exception):
    """The hub said no in a way a retry will not change (exit 2)."""


class Unavailable(Exception):
    """The hub answered but cannot serve the stream now; `retry_after` in seconds."""

    def __init__(self, message: str, retry_after: float | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _error_message(response: httpx2.Response) -> str:
    """The `{"error": {"message"}}` of a refusal body, else the reason phrase."""
    with contextlib.suppress(Exception):
        message = response.json()["error"]["message"]
        if isinstance(message, str):
            return message
    return response.reason_phrase


def check_response(response: httpx2.Response, url: str) -> None:
    """Raise `Refused` or `Unavailable` unless the response is the event stream."""
    status = response.status_code
    if status == 200:
        kind = response.headers.get("content-type", "").partition(";")[0].strip()
        if kind != "text/event-stream":
            raise Refused(f"{url} answered {kind or 'no content type'}, not an event stream")
        return
    message = f"{url}: {status} {_error_message(response)}"
    if status == 401:
        raise Refused(message + " (give a token with --token or TASKHUB_TOKEN)")
    if status == 404:
        raise Refused(message + " (is this a taskhub with the operator stream?)")
    if status in (429, 503) or status >= 500:
        retry_after: float | None = None
        with contextlib.suppress(ValueError):
            retry_after = min(float(response.headers.get("retry-after", "")), RETRY_AFTER_MAX_S)
        raise Unavailable(f"{status} {_error_message(response)}", retry_after)
    raise Refused(message)


class Output(Protocol):
    """Where changes go: a live table, plain lines or JSON lines."""

    def changes(self, view: View, changes: list[Change]) -> None: ...
    def connection(self, view: View, line: str) -> None: ...


class JsonOutput:
    """--json: task states and removals on stdout, one flushed line each; nothing else."""

    def __init__(self, out: IO[bytes], err: IO[str]) -> None:
        self.out, self.err = out, err

    def changes(self, view: View, changes: list[Change]) -> None:
        for change in changes:
            if isinstance(change, TaskChanged | TaskRemoved):
                self.out.write(tail_view.json_line(change) + b"\n")
                self.out.flush()

    def connection(self, view: View, line: str) -> None:
        print(f"taskhub tail: {line}", file=self.err, flush=True)


class PlainOutput:
    """Not a terminal: a timestamped line per change, nothing redrawn."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def _line(self, text: str) -> None:
        self.out.write(f"{datetime.now():%H:%M:%S} {text}\n")
        self.out.flush()

    def changes(self, view: View, changes: list[Change]) -> None:
        now = hub_now_ms(view)
        for change in changes:
            self._line(tail_view.plain_line(change, now, owner=operator(view)))

    def connection(self, view: View, line: str) -> None:
        self._line(line)


class LiveOutput:
    """A terminal: the table redrawn in place a few times a second (ages move on)."""

    def __init__(self, live: Live, console: Console) -> None:
        self.live, self.console = live, console

    def changes(self, view: View, changes: list[Change]) -> None:
        pass  # the refresher draws the view as it is

    def connection(self, view: View, line: str) -> None:
        pass  # the status lines of the view say it

    def draw(self, view: View) -> None:
        rows = max(5, self.console.size.height - 8)
        self.live.update(tail_view.render(view, hub_now_ms(view), max_rows=rows), refresh=True)


def operator(view: View) -> bool:
    return view.hello is not None and view.hello.operator


def hub_now_ms(view: View) -> float:
    return time.time() * 1000 + view.clock_offset_ms


class Backoff:
    """0.5 s doubling to 10 s, with jitter so restarted hubs are not stampeded."""

    def __init__(self) -> None:
        self.delay = BACKOFF_FIRST_S

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, BACKOFF_MAX_S)
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self.delay = BACKOFF_FIRST_S


def apply(view: View, event: str, data: str) -> list[Change]:
    """One stream event into the view; unknown events are skipped, malformed ones counted."""
    local_ms = time.time() * 1000
    try:
        if event == "hello":
            view.connect(msgspec.json.decode(data, type=tail_view.Hello), local_ms)
        elif event == "task":
            return view.task(tail_view.decode_entry(data))
        elif event == "removed":
            return view.removed(msgspec.json.decode(data, type=tail_view.Removed).taskId)
        elif event == "synced":
            return view.sync()
        elif event == "fleet":
            return view.fleet_update(msgspec.json.decode(data, type=tail_view.Fleet), local_ms)
    except (msgspec.DecodeError, ValueError):
        view.malformed += 1
    return []


async def events(
    client: httpx2.AsyncClient, options: TailOptions
) -> AsyncGenerator[tuple[str, str]]:
    """The events of one connection, until the hub ends it (`bye` or end of stream)."""
    headers = {"Accept": "text/event-stream", "Cache-Control": "no-store"}
    if options.token:
        headers["Authorization"] = f"Bearer {options.token}"
    request = client.build_request(
        "GET", options.stream_url, params=options.params(), headers=headers
    )
    response = await client.send(request, stream=True)
    try:
        if response.status_code != 200:
            await response.aread()
        check_response(response, options.stream_url)
        async for sse in httpx2.EventSource(response, max_event_size=MAX_EVENT_BYTES):
            yield sse.event, sse.data
            if sse.event == "bye":
                return
    finally:
        await response.aclose()


async def follow(options: TailOptions, output: Output, view: View) -> int:
    """Connect, follow and reconnect until done (0) or refused (2)."""
    backoff = Backoff()
    timeout = httpx2.Timeout(10.0, read=READ_TIMEOUT_S)
    async with httpx2.AsyncClient(timeout=timeout) as client:
        while True:
            retry_after: float | None = None
            try:
                async with contextlib.aclosing(events(client, options)) as stream:
                    async for event, data in stream:
                        changes = apply(view, event, data)
                        if event == "hello":
                            output.connection(view, f"connected to {options.url}")
                        output.changes(view, changes)
                        if event == "synced":
                            backoff.reset()
                        if options.until_done and view.synced and view.done():
                            return 0
                problem = "the hub ended the stream"
            except Unavailable as exc:
                problem, retry_after = str(exc), exc.retry_after
            except httpx2.TransportError as exc:
                problem = str(exc) or type(exc).__name__
            if view.connected or view.problem is None:
                output.connection(view, f"disconnected — reconnecting ({problem})")
            view.disconnect(problem)
            await asyncio.sleep(retry_after if retry_after is not None else backoff.next())


async def run(options: TailOptions) -> int:
    view = View(only=frozenset(options.tasks) or None)
    if options.json:
        return await follow(options, JsonOutput(sys.stdout.buffer, sys.stderr), view)
    if not sys.stdout.isatty():
        return await follow(options, PlainOutput(sys.stdout), view)
    console = Console()
    with Live(console=console, auto_refresh=False, transient=False) as live:
        output = LiveOutput(live, console)

        async def refresh() -> None:
            while True:  # drawn from the loop, never from rich's thread: the view is not shared
                output.draw(view)
                await asyncio.sleep(REFRESH_S)

        refresher = asyncio.create_task(refresh())
        try:
            return await follow(options, output, view)
        finally:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
            output.draw(view)


def tail(options: TailOptions) -> int:
    """The command: 0 when --until-done is met, 2 when refused, 130 on Ctrl-C."""
    try:
        return asyncio.run(run(options))
    except Refused as exc:
        print(f"taskhub tail: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader left (`| head`): that ends the command, quietly. Point stdout at
        # /dev/null so the interpreter's final flush does not complain again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
