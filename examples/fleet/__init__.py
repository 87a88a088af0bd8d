"""A two-server MCP fleet writing its tasks through taskhub: see README.md beside this file."""
