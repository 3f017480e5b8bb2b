"""Load tests for the gMLP service: a locust workload and a headless runner with a report.

Importing this package is cheap on purpose (no locust, matplotlib or onnxruntime): `gmlp --help`
imports `loadtests.cli` in every image, including the serving one, which lacks those.
"""
