"""A first read: every task's latest value, in bulk, before the watch."""
