"""The tasks: one adapter per task (image classification, fill-mask) holding its pre- and
post-processing on top of the engine, and the model card summary. The transports call the
adapters; they never switch on a task's type.
"""
