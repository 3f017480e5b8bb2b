"""gMLP masked LM on the Gutenberg corpus: BERT masking, full windows mixed with short padded
sentences.

The service sends one short sentence, `[CLS] ... [SEP]` padded to n; the padding is removed from
the spatial mixing, but W's rows for late positions and the model's sense of "sentence ends here"
are only learnt if such inputs are seen in training, hence `short_frac` of every batch. A short
row costs as much as a full window but carries a sixth of its masked tokens, so the share is kept
small (the recipes compared are in the model card).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from contract.formats import MLM_TASK

from .data import SpecialIds, TokenCorpus, full_window, load_corpus, mask_tokens, short_window
from .loop import loop_config_from_args, train_loop

log = logging.getLogger(__name__)


@dataclass
class MLMTask:
    """Each batch: round(short_frac * B) short padded sentences, the rest full n-token windows.

    No defaults here: `gmlp train-mlm`'s flags are the one place the demo run's values live."""

    corpus: TokenCorpus
    short_pool: np.ndarray
    special: SpecialIds
    n: int
    batch_size: int
    max_predictions: int
    seed: int
    short_frac: float

    def make_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, step])
        n_short = int(round(self.short_frac * self.batch_size)) if len(self.short_pool) else 0
        rows = [
            short_window(self.corpus, int(i), self.n, self.special)
            for i in rng.choice(self.short_pool, n_short)
        ]
        starts = rng.integers(0, self.corpus.num_sentences, self.batch_size - n_short)
        rows += [full_window(self.corpus, int(i), self.n, self.special) for i in starts]
        ids, positions, labels = mask_tokens(np.stack(rows), rng, self.special, self.max_predictions)
        return torch.from_numpy(ids), torch.from_numpy(positions), torch.from_numpy(labels)

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, tuple[float, float]]]:
        ids, positions, labels = batch
        logits = model(ids, positions=positions).float()
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        used = labels >= 0
        correct = float(((logits.detach().argmax(-1) == labels) & used).sum())
        return loss, {"acc": (correct, float(used.sum()))}


def corpus_files(corpus_dir: Path) -> tuple[list[Path], Path]:
    """Training shards and the held-out shard; valid-000 is never trained on."""
    train = sorted(Path(corpus_dir).glob("train-*.txt.gz"))
    valid = Path(corpus_dir) / "valid-000.txt.gz"
    if not train or not valid.is_file():
        raise FileNotFoundError(f"{corpus_dir} lacks train-*.txt.gz or valid-000.txt.gz")
    return train, valid


def train_mlm(args: Any) -> dict[str, Any]:
    """Train, evaluate on held-out text and write the checkpoint; returns the run summary."""
    from contract.calibration import write_calibration_set
    from model import GMLPMaskedLMConfig, build_model, save_checkpoint

    from .card import finish_run
    from .evaluate import evaluate_mlm, open_predictor

    torch.manual_seed(args.seed)
    cache = Path(args.cache_dir)
    special = SpecialIds.from_tokenizer(args.tokenizer)
    train_files, valid_file = corpus_files(args.corpus)
    corpus = load_corpus(train_files, args.tokenizer, cache, max_sentences=args.limit_train)
    n = args.n
    max_pred = max(args.max_predictions, int(round(0.15 * (n - 2))))
    config = GMLPMaskedLMConfig(
        depth=args.depth,
        d_model=args.d_model,
        d_ffn=args.d_ffn,
        drop_path_rate=args.drop_path,
        attn_dim=args.attn_dim or None,
        vocab_size=special.vocab_size,
        n=n,
        pad_token_id=special.pad,
        mask_token_id=special.mask,
        max_predictions=max_pred,
    )
    model = build_model(config)
    task = MLMTask(
        corpus,
        corpus.short_sentences(max_tokens=n - 2),
        special,
        n,
        args.batch_size,
        max_pred,
        args.seed,
        args.short_frac,
    )
    loop_cfg = loop_config_from_args(args, "mlm", betas=(0.9, 0.98))
    log.info("corpus: %s tokens, %s sentences", f"{len(corpus.ids):,}", f"{corpus.num_sentences:,}")
    log.info("model: %s, %s parameters", config, f"{sum(p.numel() for p in model.parameters()):,}")
    result = train_loop(model, task, loop_cfg)
    out = save_checkpoint(model, args.out, tokenizer=args.tokenizer, name=Path(args.out).name)
    write_calibration_set(out, MLM_TASK, train_files[0])  # training prose, for static int8
    valid = load_corpus([valid_file], args.tokenizer, cache, max_sentences=args.limit_valid_sentences)
    scores = evaluate_mlm(open_predictor(out), valid, windows=args.eval_windows, short=args.eval_short)
    tokens_seen = result.steps * args.batch_size * n
    return finish_run(
        out,
        args,
        result,
        {"heldout_valid_000": scores},
        data=f"Gutenberg {len(train_files)} train shards ({len(corpus.ids):,} tokens); valid-000 held out",
        epochs=tokens_seen / max(len(corpus.ids), 1),
    )
