"""The MCP endpoint: `POST /mcp` validated, authenticated, limited and answered."""
