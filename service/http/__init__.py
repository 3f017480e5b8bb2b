"""The HTTP transport: the task routes, health, /models and /metrics (`routes`), the Hugging Face
inference API (`hf`), request parsing, the middlewares (size limits, connection cap, metrics), the
direct routes and their dispatch, and error rendering, one `ErrorTable` per API.

It imports the wings and `contract` only; the Open Inference Protocol's REST routes
(`service.v2.rest`) are built on its plumbing, and the composition root (`service.app`) puts the
routers together.
"""
