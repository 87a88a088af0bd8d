"""The push side: each change of the snapshot out to the listen streams that follow it."""
