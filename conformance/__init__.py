"""The MCP conformance suite against taskhub: a fixture server and the script that runs it.

See conformance/README.md.
"""
