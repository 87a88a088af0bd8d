"""The `taskhub` commands: serve (one process or workers), demo, tail."""
