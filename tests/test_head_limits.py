"""hub/http/head_limits.py: what refuses a head, once its parts are in."""

from __future__ import annotations

import pytest

from hub.http.head_limits import judge
from hub.settings import HeadLimits, rest_for

LIMITS = HeadLimits(target=10, field=10, fields=3, head=100)


@pytest.mark.parametrize(
    ("target", "fields", "refused"),
    [
        (b"/" * 10, [(b"a", b"b" * 8)] * 3, None),  # every part at its limit
        (b"/" * 11, [], (414, "target longer than 10 bytes")),
        (b"/", [(b"a", b"b")] * 4, (431, "More than 3 header fields")),
        (b"/", [(b"a", b"b" * 9)], (431, "larger than 10 bytes")),  # "a:bbbbbbbbb": 11
    ],
)
def test_a_head_is_refused_for_the_first_part_over_its_limit(
    target: bytes, fields: list[tuple[bytes, bytes]], refused: tuple[int, str] | None
) -> None:
    refusal = judge(LIMITS, target, fields)
    if refused is None:
        assert refusal is None
    else:
        assert refusal is not None and refusal.status == refused[0]
        assert refused[1] in refusal.message and refusal.message.isascii()


def test_what_a_request_may_send_after_its_head_is_well_over_its_body() -> None:
    assert HeadLimits().rest == rest_for(1 << 20) > 2 * (1 << 20)
