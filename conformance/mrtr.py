"""SEP-2322 InputRequiredResult fixtures of the conformance suite (input-required-result-*):
tools and a prompt that answer with input requests first and a result once answered."""

from __future__ import annotations

import json
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import (
    CreateMessageResult,
    InputRequest,
    InputRequiredResult,
    ListRootsRequest,
    ListRootsResult,
    TextContent,
)

from conformance.inputs import NAME_SCHEMA, OK_SCHEMA, elicit, elicited, sample


def register_mrtr_tools(server: MCPServer[Any]) -> None:
    """SEP-2322 InputRequiredResult fixtures (input-required-result-* scenarios)."""

    @server.tool()
    async def test_input_required_result_elicitation(ctx: Context) -> str | InputRequiredResult:
        """One elicitation round, then a greeting."""
        responses = ctx.input_responses or {}
        if "user_name" in responses:
            return f"Hello, {elicited(responses['user_name'], 'name') or 'stranger'}!"
        return InputRequiredResult(
            input_requests={"user_name": elicit("What is your name?", NAME_SCHEMA)}
        )

    @server.tool()
    async def test_input_required_result_sampling(ctx: Context) -> str | InputRequiredResult:
        """One sampling round, then what the model said."""
        responses = ctx.input_responses or {}
        if "capital_question" in responses:
            answer = responses["capital_question"]
            text = "?"
            if isinstance(answer, CreateMessageResult) and isinstance(answer.content, TextContent):
                text = answer.content.text
            return f"Model said: {text}"
        question = sample("What is the capital of France?", 100)
        return InputRequiredResult(input_requests={"capital_question": question})

    @server.tool()
    async def test_input_required_result_list_roots(ctx: Context) -> str | InputRequiredResult:
        """One roots/list round, then how many roots there were."""
        responses = ctx.input_responses or {}
        if "client_roots" in responses:
            answer = responses["client_roots"]
            count = len(answer.roots) if isinstance(answer, ListRootsResult) else 0
            return f"Client exposed {count} root(s)."
        return InputRequiredResult(input_requests={"client_roots": ListRootsRequest()})

    @server.tool()
    async def test_input_required_result_request_state(ctx: Context) -> str | InputRequiredResult:
        """The requestState must come back unchanged with the answer."""
        responses = ctx.input_responses or {}
        if "confirm" in responses and ctx.request_state == "request-state-nonce":
            return "state-ok: confirmation received"
        return InputRequiredResult(
            input_requests={"confirm": elicit("Please confirm", OK_SCHEMA)},
            request_state="request-state-nonce",
        )

    @server.tool()
    async def test_input_required_result_multiple_inputs(
        ctx: Context,
    ) -> str | InputRequiredResult:
        """Elicitation, sampling and roots/list in one round."""
        responses = ctx.input_responses or {}
        if {"user_name", "greeting", "client_roots"} <= responses.keys():
            return "All inputs received."
        requests: dict[str, InputRequest] = {
            "user_name": elicit("What is your name?", NAME_SCHEMA),
            "greeting": sample("Generate a greeting", 50),
            "client_roots": ListRootsRequest(),
        }
        return InputRequiredResult(input_requests=requests, request_state="multiple-inputs")

    @server.tool()
    async def test_input_required_result_multi_round(ctx: Context) -> str | InputRequiredResult:
        """Three rounds; requestState says which one this is."""
        state = json.loads(ctx.request_state) if ctx.request_state else {"round": 0}
        responses = ctx.input_responses or {}
        first = InputRequiredResult(
            input_requests={"step1": elicit("Step 1: What is your name?", NAME_SCHEMA)},
            request_state=json.dumps({"round": 1}),
        )
        if state.get("round") == 1 and "step1" in responses:
            color = {
                "type": "object",
                "properties": {"color": {"type": "string"}},
                "required": ["color"],
            }
            return InputRequiredResult(
                input_requests={"step2": elicit("Step 2: What is your favorite color?", color)},
                request_state=json.dumps(
                    {"round": 2, "name": elicited(responses["step1"], "name")}
                ),
            )
        if state.get("round") == 2 and "step2" in responses:
            return f"{state.get('name')} likes {elicited(responses['step2'], 'color')}."
        return first  # round 0, or an answer out of order: start again

    @server.tool()
    async def test_input_required_result_tampered_state(
        ctx: Context,
    ) -> str | InputRequiredResult:
        """The SDK seals requestState; a tampered echo never reaches this body."""
        if ctx.request_state is None:
            return InputRequiredResult(
                input_requests={"confirm": elicit("Please confirm", OK_SCHEMA)},
                request_state="round-1",
            )
        return f"state-ok: {ctx.request_state}"

    @server.tool()
    async def test_input_required_result_capabilities(ctx: Context) -> InputRequiredResult:
        """Asks only for what the request's capabilities cover."""
        capabilities = ctx.client_capabilities
        requests: dict[str, InputRequest] = {}
        if capabilities is None or capabilities.sampling is not None:
            requests["sample"] = sample("Say hello", 50)
        if capabilities is None or capabilities.elicitation is not None:
            requests["ask"] = elicit("What is your name?", NAME_SCHEMA)
        return InputRequiredResult(input_requests=requests, request_state="capability-gated")
