"""taskhub: the MCP Tasks push-notification and subscription hub (docs/architecture.md)."""
