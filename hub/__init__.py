"""taskhub: the MCP Tasks push-notification and subscription hub (DESIGN.md)."""
