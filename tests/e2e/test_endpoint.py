"""`POST /mcp` over real HTTP: the header and error matrix of docs/protocol.md#validation-order.

The pure rules are unit-tested in tests/test_protocol*.py; this table proves the HTTP
layer maps each to the right status, body and headers, before any SSE byte, both when
the connection answers in place and through the ASGI app (tests/conftest.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers import PROTOCOL, HubHarness, envelope, headers_for, new_task_id, rpc

TID = "0123456789abcdef0123"  # well-formed, never written


@pytest.fixture
def hub(hub_on_both: HubHarness) -> HubHarness:
    return hub_on_both


def listen(**notifications: Any) -> dict[str, Any]:
    return rpc("subscriptions/listen", {"notifications": notifications}, id="L")


def case(
    body: Any,
    *,
    drop: tuple[str, ...] = (),
    set: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[Any, tuple[str, ...], dict[str, str], bytes | None]:
    return body, drop, set or {}, raw


# (request, expected HTTP status, expected JSON-RPC code or None, id echoed?)
MATRIX = {
    "parse-error": (case(None, raw=b"{not json"), 400, -32700, False),
    "not-utf8": (case(None, raw=b'{"a":"\xff"}'), 400, -32700, False),
    "batch": (case(None, raw=b"[]"), 400, -32600, False),
    "response-object": (case(None, raw=b'{"jsonrpc":"2.0","id":1,"result":{}}'), 400, -32600,
                        False),
    "null-id": (case(None, raw=b'{"jsonrpc":"2.0","id":null,"method":"tasks/get"}'), 400,
                -32600, False),
    "no-version-header": (case(rpc("server/discover"), drop=("MCP-Protocol-Version",)), 400,
                          -32020, True),
    "no-meta": (case({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}}),
                400, -32602, True),
    "version-mismatch": (case(rpc("server/discover"), set={"MCP-Protocol-Version": "2025-11-25"}),
                         400, -32020, True),
    "no-method-header": (case(rpc("server/discover"), drop=("Mcp-Method",)), 400, -32020, True),
    "method-header-case": (case(rpc("tasks/get", {"taskId": TID}), set={"Mcp-Method": "Tasks/Get"}),
                           400, -32020, True),
    "unknown-method": (case(rpc("tools/call", {"name": "x"})), 404, -32601, True),
    "legacy-tasks-result": (case(rpc("tasks/result", {"taskId": TID})), 404, -32601, True),
    "tasks-list": (case(rpc("tasks/list")), 404, -32601, True),
    "no-name-header": (case(rpc("tasks/get", {"taskId": TID}), drop=("Mcp-Name",)), 400, -32020,
                       True),
    "name-mismatch": (case(rpc("tasks/get", {"taskId": TID}), set={"Mcp-Name": "other"}), 400,
                      -32020, True),
    "bad-sentinel": (case(rpc("tasks/get", {"taskId": TID}), set={"Mcp-Name": "=?base64?@@?="}),
                     400, -32020, True),
    "no-extension": (case(rpc("tasks/get", {"taskId": TID}, caps={})), 400, -32021, True),
    "listen-no-extension": (case(rpc("subscriptions/listen", {"notifications": {"taskIds": []}},
                                     caps={})), 400, -32021, True),
    "listen-no-filter": (case(rpc("subscriptions/listen")), 200, -32602, True),
    "listen-bad-ids": (case(listen(taskIds="nope")), 200, -32602, True),
    "listen-json-only": (case(listen(taskIds=[]), set={"Accept": "application/json"}), 400,
                         -32600, True),
    "task-id-not-string": (case(rpc("tasks/get", {"taskId": 5}), set={"Mcp-Name": "5"}), 200,
                           -32602, True),
    "unknown-task": (case(rpc("tasks/get", {"taskId": TID})), 200, -32602, True),
}  # fmt: skip


@pytest.mark.parametrize(("request_case", "status", "code", "echo"), MATRIX.values(),
                         ids=list(MATRIX))  # fmt: skip
async def test_error_matrix(
    hub: HubHarness,
    request_case: tuple[Any, tuple[str, ...], dict[str, str], bytes | None],
    status: int,
    code: int,
    echo: bool,
) -> None:
    body, drop, extra, raw = request_case
    headers = headers_for(body) if body else {"MCP-Protocol-Version": PROTOCOL}
    for name in drop:
        headers.pop(name)
    headers.update(extra)
    content = raw if raw is not None else json.dumps(body).encode()
    response = await hub.client.post(hub.url + "/mcp", content=content, headers=headers)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    error = response.json()
    assert error["jsonrpc"] == "2.0" and error["error"]["code"] == code
    assert error["error"]["message"]
    assert ("id" in error) == echo
    if echo:
        assert error["id"] == body["id"]
    if code == -32021:
        assert error["error"]["data"] == {
            "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}
        }
    # Whatever came before, the hub still answers correctly.
    assert (await hub.call(rpc("server/discover"))).status_code == 200


async def test_unsupported_version_lists_what_is_supported(hub: HubHarness) -> None:
    body = rpc("server/discover", id="v")
    body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "1900-01-01"
    response = await hub.call(body, **{"MCP-Protocol-Version": "1900-01-01"})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": -32022,
        "message": "Unsupported protocol version",
        "data": {"supported": ["2026-07-28"], "requested": "1900-01-01"},
    }


async def test_legacy_initialize_is_told_the_supported_versions(hub: HubHarness) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {}},
    }
    response = await hub.client.post(hub.url + "/mcp", json=body)  # no 2026 headers at all
    assert response.status_code == 404
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": 0,
        "error": {
            "code": -32601,
            "message": "Method not found: initialize (removed in 2026-07-28; 2025-11-25 "
            "clients: the legacy endpoint beside this one, /legacy/mcp)",
            "data": {"supported": ["2026-07-28"], "requested": "2025-11-25"},
        },
    }


@pytest.mark.parametrize("method", ["GET", "DELETE", "PUT"])
async def test_non_post_is_405(hub: HubHarness, method: str) -> None:
    response = await hub.client.request(method, hub.url + "/mcp")
    assert response.status_code == 405 and response.headers["allow"] == "POST"


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://10.0.0.1:8080"])
async def test_foreign_origin_is_403_without_id(hub: HubHarness, origin: str) -> None:
    response = await hub.call(rpc("server/discover"), Origin=origin)
    assert response.status_code == 403
    assert "id" not in response.json()


@pytest.mark.parametrize("origin", ["http://localhost:3000", "http://127.0.0.1", "http://[::1]:1"])
async def test_loopback_origin_is_allowed(hub: HubHarness, origin: str) -> None:
    assert (await hub.call(rpc("server/discover"), Origin=origin)).status_code == 200


async def test_notification_is_202_with_no_body(hub: HubHarness) -> None:
    body = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    response = await hub.client.post(
        hub.url + "/mcp", json=body, headers={"MCP-Protocol-Version": PROTOCOL}
    )
    assert response.status_code == 202 and response.content == b""


async def test_huge_body_is_413(hub: HubHarness) -> None:
    body = rpc("server/discover")
    body["params"]["pad"] = "x" * (2 << 20)
    response = await hub.call(body)
    assert response.status_code == 413


async def test_discover_result(hub: HubHarness) -> None:
    response = await hub.call(rpc("server/discover", id="d"))
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    result = response.json()["result"]
    assert result["resultType"] == "complete"
    assert result["supportedVersions"] == ["2026-07-28"]
    assert result["capabilities"] == {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    assert result["cacheScope"] == "public" and result["ttlMs"] >= 0
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "taskhub"
    assert "tasks" not in result["capabilities"]  # H28: no legacy capability


async def test_session_headers_are_ignored_and_never_minted(
    hub: HubHarness, js: Any, bucket: str
) -> None:
    from bridge.wire import kv_subject

    tid = new_task_id()
    await js.publish(kv_subject(bucket, tid), envelope(tid))
    response = await hub.call(
        rpc("tasks/get", {"taskId": tid}), **{"Mcp-Session-Id": "abc", "Last-Event-ID": "3"}
    )
    assert response.status_code == 200 and "mcp-session-id" not in response.headers


async def test_sentinel_encoded_name_is_decoded(hub: HubHarness, js: Any, bucket: str) -> None:
    import base64

    from bridge.wire import kv_subject

    tid = new_task_id()
    await js.publish(kv_subject(bucket, tid), envelope(tid))
    encoded = "=?base64?" + base64.b64encode(tid.encode()).decode() + "?="
    response = await hub.call(rpc("tasks/get", {"taskId": tid}), **{"Mcp-Name": encoded})
    assert response.status_code == 200 and response.json()["result"]["taskId"] == tid


async def test_store_outage_is_an_internal_error(
    nats_url: str, bucket: str, tmp_path: Any, js: Any
) -> None:
    from tests.helpers import start_hub

    harness = await start_hub(nats_url, bucket, tmp_path)
    try:
        await harness.hub.source.wait_caught_up(10)
        await harness.hub.source.nc.close()  # type: ignore[union-attr]
        response = await harness.get_task(new_task_id(), id=3)
        assert response.status_code == 500
        assert response.json()["error"]["code"] == -32603 and response.json()["id"] == 3
        assert (await harness.client.get(harness.url + "/readyz")).status_code == 503
    finally:
        await harness.stop()
