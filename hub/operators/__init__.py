"""What operators see: the operator stream, the dashboard and `taskhub tail`."""
