"""What the conformance fixture asks clients for: form schemas, and the input requests
(elicitation, sampling) its tools put in an InputRequiredResult or a task's inputRequests."""

from __future__ import annotations

from typing import Any

from mcp_types import (
    CreateMessageRequest,
    CreateMessageRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    SamplingMessage,
    TextContent,
)

NAME_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}},
    "required": ["name"],
}
CONFIRM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean", "title": "Go ahead?"}},
    "required": ["confirm"],
}
OK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
}


def elicit(message: str, schema: dict[str, Any]) -> ElicitRequest:
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


def sample(prompt: str, max_tokens: int) -> CreateMessageRequest:
    message = SamplingMessage(role="user", content=TextContent(type="text", text=prompt))
    return CreateMessageRequest(
        params=CreateMessageRequestParams(messages=[message], max_tokens=max_tokens)
    )


def elicited(answer: object, field: str) -> Any:
    """`content[field]` of an accepted elicitation answer, else None."""
    if isinstance(answer, ElicitResult) and answer.content:
        return answer.content.get(field)
    return None
