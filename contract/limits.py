"""The bounds on the files a model repository brings, in one place (docs/security.md, "Limits at a
glance", lists them).

Whoever can write to the repository decides what these files hold, and the service reads them
into memory when it scans or loads a version: a 400 MiB card or a vocabulary of millions of
added tokens would cost the server that much memory (a tokenizer several times its file's size).
Each file is therefore read only if its size, taken from the open descriptor before anything is
read, is within its bound; over it, the version is refused with a reason naming the file, its
size and the bound (`contract.spec.read_regular`). The bounds are generous for real models: an
export's config.json is a few KiB, a model card a few KiB, the labels of ImageNet-21k's 21,843
classes under 1 MiB, BERT's tokenizer.json about 700 KB.

The ONNX files and the recorded check are not bounded here: their size is the model's own (the
graphs are handed to the runtime, the check is read array by array); they are opened as regular
files only, like every other file of a model.
"""

from __future__ import annotations

KIB, MIB = 1 << 10, 1 << 20

MAX_CONFIG_BYTES = 1 * MIB  # config.json
MAX_POLICY_BYTES = 64 * KIB  # a model's policy.json
MAX_CARD_BYTES = 1 * MIB  # README.md, the model card (only a summary of it is shown)
MAX_LABELS_BYTES = 4 * MIB  # labels.json, a classifier's class names
MAX_TOKENIZER_BYTES = 16 * MIB  # tokenizer.json, a masked LM's vocabulary and rules
