"""A poll-only MCP Tasks server that keeps its own tasks in memory (no NATS): server.py."""
