"""The store side: NATS JetStream read into the snapshot cache (docs/architecture.md)."""
