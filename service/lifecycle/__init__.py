"""The models' lifecycle: the version table (states, leases, loads beside the serving version,
drains), the repository poller and `ServiceState`, which loads, swaps and resolves models.
"""
