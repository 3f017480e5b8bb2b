"""Training the demo models (CIFAR-10 classifier, Gutenberg masked LM) on a CPU: data, the loop
both share, the tasks, evaluation and model cards. Nothing here is imported by the service."""
