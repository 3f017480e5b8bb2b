"""The `gmlp` command line: one entry point for convert, export, train, eval, serve, bench, loadtest."""
