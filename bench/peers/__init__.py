"""Established SSE fan-out servers measured beside the hub: nchan, Pushpin, nginx static.

Each peer is started by the bench from its Debian package with a config of the bench's
own (loopback ports, pid, log and temp paths in the run's work dir) and stopped by PID.
A peer that cannot be had is reported as skipped with its reason, never dropped: a
table without nchan must say so, or it reads as a comparison nchan did not win.
"""
