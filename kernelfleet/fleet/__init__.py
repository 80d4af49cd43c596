"""The fleet layer: the agent loop, the embedded store, the Prometheus exporter, the HTTP server."""
