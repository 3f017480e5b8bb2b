"""What the service tells its operators: Prometheus metrics (with the v2 statistics), the recent
traffic sampler, OpenTelemetry tracing and the log lines.
"""
