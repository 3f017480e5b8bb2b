"""gMLP masked language model (paper section 4): token embedding -> gMLP blocks -> LayerNorm ->
vocabulary projection (tied to the embedding unless the config unties it)."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from .configs import GMLPMaskedLMConfig
from .layers import GMLPBlock, build_blocks


class GMLPForMaskedLM(nn.Module):
    """The paper's masked language model (section 4): BERT's pre-training task without attention.

    Token embeddings pass through `depth` gMLP blocks (with aMLP's tiny attention when
    `config.attn_dim` is set). There are no position embeddings: each block's W is position-aware.
    The window is n tokens; a shorter sequence, L <= n, is mixed with the top-left L x L block of W,
    and padding (`pad_token_id`) is masked out of every spatial mixing, so a sentence's predictions
    are the same at any length it is run at (docs/model.md, "Variable length"). The head can decode
    only the requested positions, which is what fill-mask and the exported graph use.

    `checkpoint_info` holds the parsed config.json when the model came from a checkpoint.
    """

    config: GMLPMaskedLMConfig
    checkpoint_info: dict[str, Any]

    def __init__(self, config: GMLPMaskedLMConfig) -> None:
        super().__init__()
        self.config = config
        self.checkpoint_info = {}
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = build_blocks(config)
        self.norm = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        # The decoder shares the embedding matrix (tied weights) unless the config unties it, and
        # adds a per-token bias.
        self.decoder = (
            None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)
        )
        self.decoder_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        nn.init.normal_(self.embed.weight, std=0.02)
        if self.decoder is not None:
            nn.init.normal_(self.decoder.weight, std=0.02)
        for block in cast("list[GMLPBlock]", self.blocks):
            block.init_weights()
        nn.init.zeros_(self.decoder_bias)

    def forward_features(self, input_ids: torch.Tensor) -> torch.Tensor:
        length, n = input_ids.shape[-1], self.config.n
        if not 1 <= length <= n:
            raise ValueError(f"input_ids has {length} tokens; this model reads 1 to n={n} tokens")
        # [batch, L, 1]: 1 for real tokens, 0 for padding.
        mask = (input_ids != self.config.pad_token_id).unsqueeze(-1).to(self.embed.weight.dtype)
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x)

    def forward_head(self, features: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Vocabulary logits, at every position or only at `positions` [batch, k].

        Fill-mask needs a handful of positions, so decoding only those avoids computing
        L x vocab_size logits per sequence (30,522 x 128 floats for the BERT vocabulary at L = 128).
        """
        if positions is not None:
            index = positions.unsqueeze(-1).expand(-1, -1, features.shape[-1])
            features = torch.gather(features, 1, index)
        weight = self.embed.weight if self.decoder is None else self.decoder.weight
        return torch.matmul(features, weight.t()) + self.decoder_bias

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [batch, L, vocab] for `input_ids` [batch, L] (1 <= L <= n), or [batch, k, vocab] at
        `positions` [batch, k] (each < L)."""
        return self.forward_head(self.forward_features(input_ids), positions)
