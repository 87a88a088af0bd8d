"""The contract between hub/store/nats_internals.py and the installed nats-py.

The adapter reaches into nats-py's client, its TCP transport (and asyncio's stream reader
under it), its subscriptions and its protocol parser. These tests pin what it relies on,
so an upgrade that changes any of it fails here, naming the part, instead of as a watch
that never hears a frame or quietly reads through nats-py's slow path: the names exist on
live objects, the nats-py code whose behaviour the adapter depends on is the code it was
verified against, and on a real nats-server, on asyncio's loop and on uvloop's (the
hub's), an installed parser is fed every read, a subscription's frames carry `sid_of` it,
the reads taken over hold every byte nats-py had not parsed, and control lines still
reach nats-py before and after the cutter takes the connection's reads over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from importlib.metadata import version
from typing import Any

import pytest
import uvloop
from nats.aio.client import Client
from nats.aio.transport import TcpTransport
from nats.protocol.parser import Parser as NatsParser

from hub.store import nats_internals as ni
from hub.store.nats_frames import Frame, FrameCutter
from tests.helpers import eventually, fingerprint

# The nats-py code whose behaviour the adapter relies on, as verified (nats-py 2.16.0): a
# change to one of these needs a reading of the new code against hub/store/nats_internals.py,
# then a new fingerprint here.
VERIFIED = {
    # `parse` handles the control lines in `buf`, one at a time, calling back the client;
    # `__init__` and `reset` make `nc` and `buf`.
    "Parser.__init__": "f2bc0f91",
    "Parser.reset": "742deb8e",
    "Parser.parse": "92797a5a",
    # Every read goes from the transport to `self._ps.parse`, the installed parser.
    "Client._read_loop": "1ef3b1ea",
    # `_io_reader` and `_io_writer` are asyncio's stream reader and writer, TLS's after
    # an upgrade; `read` reads the stream reader.
    "TcpTransport.connect": "835aef7d",
    "TcpTransport.connect_tls": "d1e47af4",
    "TcpTransport.read": "2acd3ee6",
}
OWNERS: dict[str, Any] = {"Parser": NatsParser, "Client": Client, "TcpTransport": TcpTransport}

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,  # the hub's: its transports are no asyncio subclasses
}
Run = Callable[[Coroutine[Any, Any, None]], None]


@pytest.mark.parametrize("name", sorted(VERIFIED))
def test_the_code_the_adapter_relies_on_is_the_verified_one(name: str) -> None:
    owner, method = name.split(".")
    found = fingerprint(getattr(OWNERS[owner], method))
    assert found == VERIFIED[name], (
        f"nats-py {version('nats-py')} changed {name} (fingerprint {found}); read it against "
        "hub/store/nats_internals.py before widening the pinned range"
    )


@pytest.fixture(params=sorted(LOOPS))
def run(request: pytest.FixtureRequest) -> Iterator[Run]:
    """Runs a test's coroutine to its end on a loop of its own, of each kind."""

    def run(coroutine: Coroutine[Any, Any, None]) -> None:
        with asyncio.Runner(loop_factory=LOOPS[request.param]) as runner:
            runner.run(asyncio.wait_for(coroutine, 10))

    yield run


async def cutting(
    nats_url: str, sink: Callable[[list[Frame]], None], **options: Any
) -> tuple[Client, FrameCutter]:
    """A client connected with a `FrameCutter` installed as its parser, cutting to `sink`."""
    nc = Client()
    # Else `install` sets a name nothing reads, and every frame goes to nats-py's parser.
    assert isinstance(getattr(nc, "_ps", None), NatsParser), "Client._ps"
    cutter = FrameCutter(nc, sink)
    cutter.install()
    await nc.connect(servers=[nats_url], allow_reconnect=False, **options)
    assert nc._ps is cutter, "Client._ps"
    return nc, cutter


def test_the_names_the_adapter_uses_exist_on_live_objects(run: Run, nats_url: str) -> None:
    async def check() -> None:
        nc, cutter = await cutting(nats_url, lambda frames: None)
        try:
            for name in ni.CLIENT_ATTRIBUTES:
                assert hasattr(nc, name), f"Client.{name}"
            tcp = nc._transport
            for name in ni.TRANSPORT_ATTRIBUTES:
                assert hasattr(tcp, name), f"{type(tcp).__name__}.{name}"
            assert isinstance(tcp._io_reader, asyncio.StreamReader)
            assert isinstance(tcp._io_writer, asyncio.StreamWriter)
            for name in ni.STREAM_READER_ATTRIBUTES:
                assert hasattr(tcp._io_reader, name), f"StreamReader.{name}"
            assert isinstance(tcp._io_reader._buffer, bytearray)
            for name in ni.PARSER_ATTRIBUTES:
                assert hasattr(cutter, name), f"Parser.{name}"
            assert cutter.nc is nc and isinstance(cutter.buf, bytearray)
            sub = await nc.subscribe(nc.new_inbox())
            for name in ni.SUBSCRIPTION_ATTRIBUTES:
                assert hasattr(sub, name), f"Subscription.{name}"
        finally:
            await nc.close()

    run(check())


def test_an_installed_parser_is_fed_every_read_and_frames_carry_sid_of(
    run: Run, nats_url: str
) -> None:
    """Before `attach`: nats-py's read loop gives the installed parser each read; a frame
    names its subscription as `sid_of` does (only that one's come out with `sid` set);
    control lines reach nats-py's own parser (a flush's PONG, a permissions error)."""

    async def check() -> None:
        got: list[Frame] = []
        errors: list[Exception] = []

        async def error_cb(exc: Exception) -> None:
            errors.append(exc)

        nc, cutter = await cutting(nats_url, got.extend, error_cb=error_cb)
        try:
            other, mine = nc.new_inbox(), nc.new_inbox()
            await nc.subscribe(other)
            sub = await nc.subscribe(mine)
            cutter.sid = ni.sid_of(sub)
            await nc.publish(other, b"not this one")
            await nc.publish(mine, b"this one", headers={"X-Test": "1"})
            await nc.flush(timeout=5)  # its PONG went through `parse` to nats-py's parser
            await eventually(lambda: bool(got), timeout=5)  # (the PONG may come first)
            assert got == [(mine.encode(), b"", b"NATS/1.0\r\nX-Test: 1\r\n\r\n", b"this one")]
            assert sub.pending_msgs == 0  # the frame never reached nats-py's subscription
            await cutter.parse(b"-ERR 'Permissions Violation for Subscription to \"x\"'\r\n")
            assert [str(e) for e in errors] == [
                'nats: permissions violation for subscription to "x"'
            ]
        finally:
            await nc.close()

    run(check())


def test_reads_taken_over_hold_every_byte_nats_py_had_not_parsed(run: Run, nats_url: str) -> None:
    """`take_reads` (through `attach`): the transport under nats-py's stream writer, and
    what the parser and nats-py's stream reader held, in that order, taken out of both;
    then frames are cut in the transport's protocol and control lines still reach
    nats-py."""

    async def check() -> None:
        got: list[Frame] = []
        nc, cutter = await cutting(nats_url, got.extend)
        try:
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            cutter.sid = ni.sid_of(sub)
            await nc.flush(timeout=5)
            reader, transport = nc._transport._io_reader, nc._transport._io_writer.transport
            inner = transport.get_protocol()
            frame = b"MSG %s %s 5\r\nfirst\r\n" % (inbox.encode(), cutter.sid)
            # As if a read had been parsed up to the middle of a frame, and the next read
            # had reached nats-py's stream reader before its read loop took it.
            await cutter.parse(frame[:9])
            reader.feed_data(frame[9:])
            assert cutter.unparsed() == frame[:9] and reader._buffer == frame[9:]
            assert cutter.attach() and transport.get_protocol() is not inner
            assert got == [(inbox.encode(), b"", None, b"first")]
            assert cutter.unparsed() == b"" and reader._buffer == b""
            await nc.publish(inbox, b"second")
            await nc.flush(timeout=5)  # the PONG: from the tap, through nats-py's reader
            await eventually(lambda: len(got) > 1, timeout=5)
            assert got[1:] == [(inbox.encode(), b"", None, b"second")]
            assert sub.pending_msgs == 0
        finally:
            await nc.close()

    run(check())
