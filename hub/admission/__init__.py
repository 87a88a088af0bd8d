"""Who a caller is (a bearer token) and how much it may take (polls, streams, bytes)."""
