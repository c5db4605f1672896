"""What operators watch the pool with: its Prometheus rules (``alerts``)."""
