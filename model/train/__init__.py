"""Training the demo models: CIFAR-10 classifier and Gutenberg masked LM on a CPU.

Small modules: `data` (decoding, tokenising, augmentation, BERT masking), `loop` (LR and
time-budget planning, the optimiser and step loop both tasks share), `tasks`
(task-specific batches and losses), `evaluate` (PyTorch checkpoints and ONNX served models),
`card` (model cards). Nothing here is imported by the service.
"""
