"""The HTTP transport: the task routes, the Hugging Face inference API, and the plumbing the Open
Inference Protocol's REST routes are built on (docs/service.md's module map). It imports the wings
and `contract` only."""
