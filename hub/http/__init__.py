"""The HTTP layer: connections, requests parsed in place, and the uvicorn adapter."""
