"""The building blocks of gMLP (Liu et al. 2021, "Pay Attention to MLPs", figure 1 and section 2).

    shortcut = x
    x = norm(x)
    z = gelu(x @ U)                      # channel projection, d_model -> d_ffn
    z = sgu(z [, tiny_attn(x)])          # spatial gating unit, d_ffn -> d_ffn / 2
    out = shortcut + z @ V               # channel projection, d_ffn / 2 -> d_model

    sgu(z): z1, z2 = split(z); z2 = norm(z2); return z1 * (W @ z2 + b [+ tiny_attn(x)])

W is an n x n matrix over *tokens*, so W carries position and n is the longest sequence a model
reads. A masked LM may read fewer tokens, L <= n: the spatial projection is then the top-left
L x L block of W (and the first L entries of b), which gives the real tokens exactly what padding
to n would (docs/model.md, "Variable length").

The options of g-mlp-pytorch (docs/model.md, "Public gMLP layouts") are here too: a multi-head SGU
(W [heads, n, n], each head mixing its own slice of the gate's channels), an activation of the gate
and a token shift of the normalised block input.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .configs import GMLPConfig

GATE_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda gate: gate,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": F.relu,
    "gelu": F.gelu,
    "silu": F.silu,
}


class SpatialGatingUnit(nn.Module):
    """Split the channels in two halves and gate the first with a spatial projection of the second.

    The spatial projection is applied as `W @ z2 + b` with W [n, n] broadcast over the batch (rather
    than a Linear over the transposed tokens, as timm writes it): the same arithmetic with no
    transpose of the activations, here as one `baddbmm` and in the exported SGU function as one
    MatMul (docs/model.md).

    `token_mask` (1 for real tokens, 0 for padding) zeroes the padded rows of the normalised gate
    input, so padding contributes nothing through W's columns and a short padded sentence is mixed
    exactly as the same tokens followed by nothing would be.

    With `heads` > 1, W is [heads, n, n] and b [heads, n]: head h mixes the h-th of `heads` equal
    slices of the gate's channels. `gate_act` is applied to the gate (after the tiny attention's
    output is added) before it multiplies z1.
    """

    def __init__(
        self, d_ffn: int, seq_len: int, norm_eps: float = 1e-5, heads: int = 1, gate_act: str = "identity"
    ) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.heads = heads
        self.gate_act = gate_act
        self.norm = nn.LayerNorm(d_ffn // 2, eps=norm_eps)
        self.spatial_proj = nn.Linear(seq_len, seq_len) if heads == 1 else HeadsProjection(heads, seq_len)

    def init_weights(self) -> None:
        # Paper section 2: W near zero and b = 1, so at init the unit computes z1 * 1 and every
        # block starts as a plain FFN; this is what makes deep gMLPs trainable.
        nn.init.normal_(self.spatial_proj.weight, std=1e-6)
        nn.init.ones_(self.spatial_proj.bias)

    def forward(
        self,
        z: torch.Tensor,
        token_mask: torch.Tensor | None = None,
        gate_residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        z1, z2 = z.chunk(2, dim=-1)
        z2 = self.norm(z2)
        if token_mask is not None:
            z2 = z2 * token_mask
        gate = self.spatial_projection(z2)
        if gate_residual is not None:
            gate = gate + gate_residual
        return z1 * GATE_FUNCTIONS[self.gate_act](gate)

    def spatial_projection(self, z2: torch.Tensor) -> torch.Tensor:
        """`W @ z2 + b` over tokens, for z2 [B, L, e] with L <= n: one batched GEMM on z2 as it lies
        (W expanded over the batch is a stride-0 view; docs/model.md says why not `W @ z2 + b`).

        A shorter sequence uses the views `W[:L, :L]` and `b[:L]`; at the full length nothing is
        sliced, so training at n has no slice in the gradient's path. Under torch.export L is
        symbolic and the slice is always taken (a no-op at L = n), so the graph serves every length.
        """
        length = z2.shape[1]
        weight: torch.Tensor = self.spatial_proj.weight
        bias: torch.Tensor = self.spatial_proj.bias
        if not statically_known_true(length == self.seq_len):
            weight, bias = weight[..., :length, :length], bias[..., :length]
        if self.heads == 1:
            return torch.baddbmm(bias[:, None], weight.expand(z2.shape[0], -1, -1), z2)
        per_head = z2.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # [B, heads, L, e / heads]
        gate = torch.matmul(weight, per_head) + bias[..., None]
        return gate.transpose(1, 2).flatten(2)


class HeadsProjection(nn.Module):
    """The multi-head SGU's W [heads, n, n] and b [heads, n], named as `nn.Linear`'s."""

    def __init__(self, heads: int, seq_len: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(heads, seq_len, seq_len))
        self.bias = nn.Parameter(torch.empty(heads, seq_len))


def shift_tokens(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Move the first 2s + 1 channel groups (width d // (2s + 1)) of x [B, L, d] by -s..s tokens,
    zero-filled at the ends; leftover channels stay. Group k reads token i - (k - s)."""
    width = x.shape[-1] // (2 * shift + 1)
    groups = list(x.split(width, dim=-1))
    for k, amount in enumerate(range(-shift, shift + 1)):
        group = groups[k]
        if amount:
            zeros = group.new_zeros(group.shape[0], abs(amount), group.shape[2])
            # Concatenate and cut back to L: valid at every length, L = 1 included.
            padded = torch.cat((zeros, group) if amount > 0 else (group, zeros), dim=1)
            groups[k] = padded[:, : group.shape[1]] if amount > 0 else padded[:, -amount:]
    return torch.cat(groups, dim=-1)


class TinyAttention(nn.Module):
    """aMLP's single-head attention (paper section 4.3): its output is added to the SGU's gate.

    It reads the block's normalised input (width d_model) and writes d_ffn / 2 channels.
    """

    def __init__(self, d_model: int, d_out: int, attn_dim: int) -> None:
        super().__init__()
        self.attn_dim = attn_dim
        self.qkv = nn.Linear(d_model, 3 * attn_dim)
        self.proj = nn.Linear(attn_dim, d_out)

    def forward(self, x: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.attn_dim))
        if token_mask is not None:
            # token_mask is [batch, L, 1]; padded keys get no weight.
            scores = scores.masked_fill(token_mask.transpose(-1, -2) == 0, torch.finfo(scores.dtype).min)
        return self.proj(torch.matmul(scores.softmax(dim=-1), v))


class DropPath(nn.Module):
    """Stochastic depth (Huang et al. 2016): drop a sample's whole residual branch while training."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1.0 - self.p)
        return x * keep / (1.0 - self.p)


class GMLPBlock(nn.Module):
    """One gMLP block: pre-norm, channel expansion, GELU, SGU (+ tiny attention), projection back."""

    def __init__(
        self,
        d_model: int,
        d_ffn: int,
        seq_len: int,
        attn_dim: int | None = None,
        norm_eps: float = 1e-6,
        sgu_norm_eps: float = 1e-5,
        drop_path: float = 0.0,
        heads: int = 1,
        gate_act: str = "identity",
        token_shift: int = 0,
    ) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=norm_eps)
        self.token_shift = token_shift
        self.proj_in = nn.Linear(d_model, d_ffn)  # U
        self.sgu = SpatialGatingUnit(d_ffn, seq_len, norm_eps=sgu_norm_eps, heads=heads, gate_act=gate_act)
        self.attn = TinyAttention(d_model, d_ffn // 2, attn_dim) if attn_dim else None
        self.proj_out = nn.Linear(d_ffn // 2, d_model)  # V
        self.drop_path = DropPath(drop_path)

    def init_weights(self) -> None:
        attn = [] if self.attn is None else [self.attn.qkv, self.attn.proj]
        for linear in [self.proj_in, self.proj_out, *attn]:
            nn.init.xavier_uniform_(linear.weight)
            nn.init.normal_(linear.bias, std=1e-6)
        self.sgu.init_weights()

    def forward(self, x: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        shortcut = x
        x = self.norm(x)
        if self.token_shift:
            # Padding is zeroed first, so a text shifts in zeros at its end at any padded length.
            x = shift_tokens(x if token_mask is None else x * token_mask, self.token_shift)
        gate_residual = self.attn(x, token_mask) if self.attn is not None else None
        z = F.gelu(self.proj_in(x))
        z = self.sgu(z, token_mask=token_mask, gate_residual=gate_residual)
        return shortcut + self.drop_path(self.proj_out(z))


def build_blocks(config: GMLPConfig) -> nn.ModuleList:
    """The stack of `config.depth` blocks, stochastic depth increasing linearly to drop_path_rate."""
    depth = config.depth
    rates = [config.drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
    return nn.ModuleList(
        GMLPBlock(
            config.d_model,
            config.d_ffn,
            config.seq_len,
            attn_dim=config.attn_dim,
            norm_eps=config.norm_eps,
            sgu_norm_eps=config.sgu_norm_eps,
            drop_path=rate,
            heads=config.heads,
            gate_act=config.gate_act,
            token_shift=config.shift_tokens,
        )
        for rate in rates
    )
