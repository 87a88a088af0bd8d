"""The MCP names (and the one task error) hub and bridge both speak, each written once.

Protocol revision, the tasks extension's identifier and the reserved `_meta` keys are
fixed by the specification (docs/protocol.md); a typo in any one of them is a silent
interoperability bug, so every module takes them from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PROTOCOL_VERSION = "2026-07-28"
# The revisions the hub serves at `/mcp` (H10: anything else is -32022).
SUPPORTED_VERSIONS: tuple[str, ...] = (PROTOCOL_VERSION,)

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
# The one -32602 message for unknown, expired and foreign tasks, at the hub and at every
# server alike (H46: the three must not be told apart).
TASK_NOT_FOUND = "Failed to retrieve task: Task not found"

# Keys of `params._meta` and `result._meta`.
PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID_KEY = "io.modelcontextprotocol/subscriptionId"


def declares_tasks(capabilities: Mapping[str, Any]) -> bool:
    """Whether `clientCapabilities` declare the tasks extension: its key under
    `extensions`, with an object as its value (the schema's `{[id]: object}`)."""
    extensions = capabilities.get("extensions")
    if type(extensions) is not dict and not isinstance(extensions, Mapping):  # dict: no ABC check
        return False
    declared = extensions.get(TASKS_EXTENSION)
    return type(declared) is dict or isinstance(declared, Mapping)
