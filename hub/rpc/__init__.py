"""MCP's JSON-RPC messages: framing and errors, routing headers, a request validated."""
