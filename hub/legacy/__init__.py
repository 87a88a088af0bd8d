"""The 2025-11-25 door: session-based legacy task clients, kept apart from /mcp."""
