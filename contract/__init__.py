"""The served-model contract: what `export`, training, `service` and `loadtests` agree on.

A served-model directory (docs/formats.md) is the only thing that travels from the torch side to
the serving side. Everything both sides must read the same way lives here, once: the format and
task names (`formats`), reading a directory's config (`spec`), the image transform (`image`), the
fill-mask text codec (`text`), the scores (`scores`) and the transport-free errors they raise
(`errors`). Nothing here knows about HTTP, gRPC, ONNX Runtime or torch: it needs numpy, Pillow
and tokenizers only, so the serving image and the exporter import the same code.
"""
