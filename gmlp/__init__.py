"""The `gmlp` command line: convert-timm, info, export, train, eval, model-card, serve, loadtest and tune."""
