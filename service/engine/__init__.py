"""The engine: ONNX Runtime sessions (or OpenVINO's runtime), the dynamic batcher, a batch's rows,
deadlines and the request context. It knows no task, no transport and no other part of `service`: a
pipeline hands it rows and gets rows back, so it can be measured (the bare-pipeline benchmark) and
reused alone.
"""
