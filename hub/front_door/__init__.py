"""The front door: what the hub does not answer itself, forwarded to an upstream."""
