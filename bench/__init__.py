"""taskhub's benchmark: the hub beside a raw-socket ceiling and an `mcp` SDK origin server,
and, as front door, beside the `mcp` SDK server it forwards to, called directly.

Every figure is measured in one run on one machine, against references started in the
same run, so the results read as ratios rather than absolute times on a noisy host.
`python -m bench --help` is the entry point; `bench/scenarios.py` says what each
scenario measures and `bench/sizes.py` how big it runs.
"""
