"""`gmlp tune`: serving settings searched on the real server under a p99 latency SLO."""
