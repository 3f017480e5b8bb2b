"""Fill-mask text handling: text -> (input_ids, mask_positions), logits -> HF-pipeline predictions.

The graph reads 1 to n tokens and decodes 1 to `max_predictions` positions (docs/formats.md), so
both limits are checked here, with messages in tokens, before anything is queued. A request keeps
its own length; `collate` pads a batch to its longest text (exact for gMLP, docs/model.md).

Decoding follows Hugging Face's `FillMaskPipeline`: softmax over the whole vocabulary,
`targets` restrict the candidates (scores stay full-vocabulary probabilities), a target that is
not one vocabulary token is replaced by its first wordpiece.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from contract.errors import ErrorCode, InvalidInput
from contract.formats import MASK_TOKEN
from contract.limits import MAX_TOKENIZER_BYTES
from contract.messages import echo
from contract.scores import json_score, log_normalisers, top_probabilities
from contract.spec import SpecError, read_regular

# Batches of texts are padded to a multiple of this many tokens (see `FillMaskCodec.padded_length`).
LENGTH_MULTIPLE = 8


@dataclass(frozen=True)
class EncodedText:
    ids: list[int]  # unpadded, with [CLS]/[SEP]
    mask_positions: list[int]
    feeds: dict[str, np.ndarray]  # per-request graph inputs, unpadded (no batch axis)


def load_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer in `path`, read by us and not by the library: a regular file of at most
    `MAX_TOKENIZER_BYTES` (SpecError otherwise, naming the file). `Tokenizer.from_file` opens the
    path itself while holding the GIL, so a FIFO there would freeze the whole process, and it
    would build a vocabulary of any size."""
    text = read_regular(path, "tokenizer", MAX_TOKENIZER_BYTES)
    try:
        return Tokenizer.from_str(text.decode("utf-8"))
    except Exception as exc:  # the library raises a bare Exception for what it cannot parse
        raise SpecError(f"tokenizer {path}: not a tokenizers JSON file ({str(exc)[:200]})") from None


class FillMaskCodec:
    """Tokenisation and decoding for one served masked-LM."""

    def __init__(self, tokenizer_path: Path, model_config: dict[str, Any], *, model_name: str = "") -> None:
        self.tokenizer = load_tokenizer(tokenizer_path)
        # The shipped tokenizer.json may carry padding/truncation settings; we pad ourselves and a
        # silently truncated text would lose its [MASK]s.
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.model_name = model_name
        self.n = int(model_config["n"])
        self.max_predictions = int(model_config["max_predictions"])
        self.pad_id = int(model_config.get("pad_token_id", 0))
        mask_id = model_config.get("mask_token_id", self.tokenizer.token_to_id(MASK_TOKEN))
        if mask_id is None:
            raise SpecError(
                f"{tokenizer_path} has no {MASK_TOKEN} token and the model config no mask_token_id"
            )
        self.mask_id = int(mask_id)
        self.vocab_size = int(model_config.get("vocab_size", self.tokenizer.get_vocab_size()))
        # A tokenizer id the model has no row for fails only inside the graph, for the requests
        # whose text contains that token (a 500 nobody can correct); a tokenizer that does not
        # belong to the model is a broken served-model directory, refused when it loads. Fewer ids
        # than the model has rows is fine (vocabularies are often padded).
        size = max(self.tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        if size > self.vocab_size:
            model = f"model {model_name}" if model_name else "the model"
            raise SpecError(
                f"{tokenizer_path}: the tokenizer has ids up to {size - 1} ({size} ids), but {model} "
                f"has a vocabulary of {self.vocab_size} (config.json vocab_size); "
                "serve the model with the tokenizer it was exported with"
            )
        self.mask_token = self.tokenizer.id_to_token(self.mask_id) or MASK_TOKEN
        # Special tokens dropped from `sequence`: everything added by the post-processor except [MASK].
        special = {"[CLS]", "[SEP]", "[PAD]", "<s>", "</s>", "<pad>"}
        self._hidden_ids = {i for t in special if (i := self.tokenizer.token_to_id(t)) is not None}
        self._hidden_ids.add(self.pad_id)
        self._hidden_ids.discard(self.mask_id)
        # Each token's own string, decoded once: a response names top_k of them per [MASK], mostly
        # the same few thousand frequent words, and each decode is a call into the tokenizer.
        self._token_strs: dict[int, str] = {}

    def encode(self, text: str) -> EncodedText:
        """Tokenise and validate; InvalidInput when the text does not fit the model's window."""
        ids = self.tokenizer.encode(text).ids
        if len(ids) > self.n:
            raise InvalidInput(
                ErrorCode.TEXT_TOO_LONG,
                f"the text is {len(ids)} tokens including [CLS] and [SEP]; model {self.model_name} "
                f"accepts at most {self.n} tokens",
            )
        positions = [i for i, token in enumerate(ids) if token == self.mask_id]
        if not positions:
            raise InvalidInput(
                ErrorCode.NO_MASK,
                f"the text contains no {self.mask_token} token; put one where a word is missing",
            )
        if len(positions) > self.max_predictions:
            raise InvalidInput(
                ErrorCode.TOO_MANY_MASKS,
                f"the text has {len(positions)} {self.mask_token} tokens; model {self.model_name} "
                f"predicts at most {self.max_predictions} per request",
            )
        feeds = {
            "input_ids": np.asarray(ids, dtype=np.int64),
            "mask_positions": np.asarray(positions, dtype=np.int64),
        }
        return EncodedText(ids, positions, feeds)

    def padded_length(self, length: int, *, fixed: bool = False) -> int:
        """The sequence length a batch whose longest text has `length` tokens runs at.

        Padding is exact for gMLP (padded tokens are masked out of the spatial projection, see
        docs/model.md), so a batch runs at its longest text rounded up to a multiple of
        `LENGTH_MULTIPLE` (few distinct shapes for ONNX Runtime), never more than n; `fixed` runs
        every batch at n, for graphs with static shapes."""
        if fixed:
            return self.n
        return min(self.n, -(-length // LENGTH_MULTIPLE) * LENGTH_MULTIPLE)

    def collate(
        self, items: Sequence[Mapping[str, np.ndarray]], *, fixed: bool = False
    ) -> dict[str, np.ndarray]:
        """Per-request feeds (unpadded, from `encode` or a v2 request) -> one batch of graph inputs.

        `input_ids` are padded with [PAD] to `padded_length`; `mask_positions` with position 0
        ([CLS], whose logits are ignored) to the batch's largest mask count, or to
        `max_predictions` when `fixed`."""
        length = self.padded_length(max(len(item["input_ids"]) for item in items), fixed=fixed)
        slots = self.max_predictions if fixed else max(len(item["mask_positions"]) for item in items)
        input_ids = np.full((len(items), length), self.pad_id, dtype=np.int64)
        positions = np.zeros((len(items), slots), dtype=np.int64)
        for row, item in enumerate(items):
            input_ids[row, : len(item["input_ids"])] = item["input_ids"]
            positions[row, : len(item["mask_positions"])] = item["mask_positions"]
        return {"input_ids": input_ids, "mask_positions": positions}

    def target_ids(self, targets: list[str]) -> list[int]:
        """Candidate ids for `targets`: the token itself, else its first wordpiece (as HF does)."""
        ids: list[int] = []
        for target in targets:
            token_id = self.tokenizer.token_to_id(target)
            if token_id is None:
                pieces = self.tokenizer.encode(target, add_special_tokens=False).ids
                if not pieces:
                    raise InvalidInput(
                        ErrorCode.INVALID_TARGET, f"target {echo(target)} does not tokenize to any token"
                    )
                token_id = pieces[0]
            if token_id not in ids:
                ids.append(token_id)
        return ids

    def decode(
        self,
        encoded: EncodedText,
        logits: np.ndarray,
        top_k: int,
        target_ids: list[int] | None = None,
        log_z: np.ndarray | None = None,
    ) -> list[list[dict[str, Any]]]:
        """logits [slots, vocab] (slots >= the text's masks) -> one ranked list per [MASK], in order.

        `log_z`: the normalisers of the text's mask rows, when computed already (`decode_batch`)."""
        candidates = None if target_ids is None else np.asarray(target_ids)
        results = []
        for slot, position in enumerate(encoded.mask_positions):
            z = None if log_z is None else float(log_z[slot])
            ids, probs = top_probabilities(logits[slot], top_k, candidates, z)
            results.append(
                [
                    self._prediction(encoded, position, int(i), float(p))
                    for i, p in zip(ids, probs, strict=True)
                ]
            )
        return results

    def decode_batch(
        self,
        encoded: Sequence[EncodedText],
        logits: Sequence[np.ndarray],
        top_k: Sequence[int],
        target_ids: Sequence[list[int] | None],
    ) -> list[list[list[dict[str, Any]]]]:
        """`decode` of a batch's texts (each with its logits [slots, vocab], top_k and targets): the
        full-vocabulary normalisers of all their mask rows in one pass, then each text's top k.
        The answers are `decode`'s, text by text."""
        counts = [len(e.mask_positions) for e in encoded]
        rows = np.concatenate([row[:n] for row, n in zip(logits, counts, strict=True)])
        log_z = np.split(log_normalisers(np.asarray(rows, dtype=np.float32)), np.cumsum(counts)[:-1])
        return [
            self.decode(e, row, k, t, z)
            for e, row, k, t, z in zip(encoded, logits, top_k, target_ids, log_z, strict=True)
        ]

    def decode_top(
        self, encoded: EncodedText, ids: np.ndarray, scores: np.ndarray, top_k: int
    ) -> list[list[dict[str, Any]]]:
        """`decode` from a graph's top-k outputs: ids and probabilities [slots, K], best first, of
        which each [MASK] takes its first `top_k` (<= K)."""
        best, probabilities = ids[:, :top_k].tolist(), scores[:, :top_k].tolist()
        return [
            [self._prediction(encoded, position, i, p) for i, p in zip(ids_, ps, strict=True)]
            for position, ids_, ps in zip(encoded.mask_positions, best, probabilities, strict=False)
        ]

    def _prediction(self, encoded: EncodedText, position: int, token_id: int, score: float) -> dict[str, Any]:
        """One candidate of a [MASK] as the answer lists it (a score that is not finite: None)."""
        filled = list(encoded.ids)
        filled[position] = token_id
        visible = [t for t in filled if t not in self._hidden_ids]
        token_str = self._token_strs.get(token_id)
        if token_str is None:
            token_str = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_strs[token_id] = token_str
        return {
            "score": json_score(score),
            "token": token_id,
            "token_str": token_str,
            "sequence": self.tokenizer.decode(visible, skip_special_tokens=False),
        }
