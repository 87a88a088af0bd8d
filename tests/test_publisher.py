"""The bridge's acked JetStream publisher against a real nats-server: acks, refusals,
missing streams and deadlines, each surfacing as nats-py's own result or error type."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError, NoStreamResponseError

from bridge.publisher import AckedPublisher
from bridge.wire import kv_stream, kv_subject
from tests.helpers import new_task_id

WRONG_LAST_SEQUENCE = 10071


async def test_an_ack_returns_the_stream_sequence(nc: nats.NATS, js: Any, bucket: str) -> None:
    publisher = AckedPublisher(nc, timeout=5)
    try:
        subject = kv_subject(bucket, new_task_id())
        sequences = await asyncio.gather(
            *(publisher.publish(subject, b"{}", {}) for _ in range(50))
        )
        assert sorted(sequences) == list(range(1, 51))  # each its own ack, none lost
        stored = await js.get_msg(kv_stream(bucket), subject=subject)
        assert stored.seq == 50
    finally:
        await publisher.close()


async def test_a_refused_write_raises_the_jetstream_error(
    nc: nats.NATS, js: Any, bucket: str
) -> None:
    publisher = AckedPublisher(nc, timeout=5)
    try:
        subject = kv_subject(bucket, new_task_id())
        first = await publisher.publish(subject, b"1", {"Nats-Expected-Last-Subject-Sequence": "0"})
        with pytest.raises(APIError) as refused:
            await publisher.publish(subject, b"2", {"Nats-Expected-Last-Subject-Sequence": "0"})
        assert refused.value.err_code == WRONG_LAST_SEQUENCE
        assert (await js.get_msg(kv_stream(bucket), subject=subject)).seq == first
    finally:
        await publisher.close()


async def test_a_subject_no_stream_holds_raises_no_stream_response(nc: nats.NATS) -> None:
    publisher = AckedPublisher(nc, timeout=5)
    try:
        with pytest.raises(NoStreamResponseError):
            await publisher.publish(f"nowhere.{new_task_id()}", b"x", {})
    finally:
        await publisher.close()


async def test_an_unanswered_publish_times_out_and_frees_its_slot(nc: nats.NATS) -> None:
    subject = f"silent.{new_task_id()}"
    silent = await nc.subscribe(subject)  # a listener that never replies: no 503 either
    publisher = AckedPublisher(nc, timeout=0.3)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(NatsTimeoutError):
            await publisher.publish(subject, b"x", {})
        assert 0.3 <= loop.time() - started < 2.0
        assert not publisher._pending
    finally:
        await publisher.close()
        await silent.unsubscribe()
