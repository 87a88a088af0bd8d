"""Runnable examples; run them as modules from the repository root (`python -m examples...`)."""
