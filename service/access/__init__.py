"""Who may do what: the scopes, the API keys file and its decisions (per-key rate limits), the TLS
files, and re-reading changed files. The transports enforce these; nothing here knows HTTP or gRPC.
"""
