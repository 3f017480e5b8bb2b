"""PyTorch gMLP -> ONNX, with every Spatial Gating Unit exported as one `gmlp::SpatialGatingUnit` node.

How (docs/export.md): for the export only, each block's SGU module is wrapped so that its forward
emits a single `torch.onnx.ops.symbolic` node; after the dynamo exporter has run, the function's
body (`build_sgu_function`, written with onnxscript) is attached to the model.
The model code itself knows nothing about ONNX.

In the function (paper section 2; its chain of nodes is in docs/export.md), with h > 1 heads W is
[h, n, n] and b [h, n]: each head's `W_h @ z2_h + b_h` on its slice of z2's channels, the h gates
concatenated over channels. The head count, the activation and the optional inputs (`token_mask`
[batch, L, 1], `attn` [batch, L, d_ffn/2], computed by ordinary nodes before the SGU node) are
fixed per model, so one function per model suffices. A masked LM's function slices W and b to its
input's length itself, so one file serves every length 1 <= L <= n; a classifier's patch grid is
fixed and its W used whole.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any, cast

import onnx_ir as ir
import onnxscript
import torch
from torch import nn

from contract.formats import TOP_K_IDS_OUTPUT, TOP_K_SCORES_OUTPUT
from model.checkpoint import GMLPModel
from model.configs import GMLPConfig, GMLPMaskedLMConfig, GMLPVisionConfig
from model.layers import GMLPBlock, SpatialGatingUnit

OPSET = 20  # opset 20 emits ONNX Gelu, which ORT fuses with the bias into BiasGelu
DOMAIN = "gmlp"
OP_TYPE = "SpatialGatingUnit"
FUNCTION_VERSION = 1


class _SymbolicSGU(nn.Module):
    """Export-time stand-in for a SpatialGatingUnit: one custom-domain node with the same inputs."""

    def __init__(self, sgu: SpatialGatingUnit) -> None:
        super().__init__()
        self.sgu = sgu

    def forward(
        self,
        z: torch.Tensor,
        token_mask: torch.Tensor | None = None,
        gate_residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        inputs = [
            z,
            self.sgu.norm.weight,
            self.sgu.norm.bias,
            self.sgu.spatial_proj.weight,
            self.sgu.spatial_proj.bias,
        ]
        inputs += [t for t in (token_mask, gate_residual) if t is not None]
        shape = (*z.shape[:-1], z.shape[-1] // 2)
        return torch.onnx.ops.symbolic(
            f"{DOMAIN}::{OP_TYPE}", inputs, dtype=z.dtype, shape=shape, version=FUNCTION_VERSION
        )


class _ServedGraph(nn.Module):
    """What the graph computes around the model: fp16 weights and compute behind float32 inputs
    and outputs (`float16`, the fp16 variant, for CUDA), and with `k` > 0 the top-k outputs beside
    the logits: per row (the last axis), the ids of the `k` largest logits, best first, and their
    probabilities, softmax over the whole row.

    Exporting a half-precision copy gives a consistently typed graph; converting an fp32 graph
    afterwards (onnxconverter-common) leaves Cast nodes that still produce float32.

    The top k are selected on the logits, not on probabilities: float32 probabilities can tie where
    the logits do not, and the service's full-row ranking orders by the logits (ONNX TopK breaks
    exact ties by the lower index, as the service does). Computed from float32 logits, also behind
    fp16 compute, with the normaliser accumulated in float64 as the service's full-row path does."""

    def __init__(self, graph: nn.Module, float16: bool, k: int) -> None:
        super().__init__()
        self.inner = graph.half() if float16 else graph
        self.float16 = float16
        self.k = k

    def forward(
        self, first: torch.Tensor, second: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # (pixel_values,) for vision, (input_ids, mask_positions) for the MLM; only pixels are float.
        inputs = [x for x in (first, second) if x is not None]
        if self.float16:
            inputs = [x.half() if x.is_floating_point() else x for x in inputs]
        logits = self.inner(*inputs).float()
        if not self.k:
            return logits
        top, ids = torch.topk(logits, self.k, dim=-1)
        # The normaliser in float64: float32 sums over a 30,522-entry row lose ~1e-4 of a score.
        log_z = torch.logsumexp(logits.double(), dim=-1, keepdim=True)
        scores = torch.exp(top.double() - log_z).float()
        return logits, ids, scores


def graph_top_k(config: GMLPConfig, top_k: int) -> int:
    """K of the top-k outputs for a requested `top_k` (0: none): at most the row's length (the
    vocabulary, or the classes)."""
    if isinstance(config, GMLPMaskedLMConfig):
        return max(0, min(top_k, config.vocab_size))
    return max(0, min(top_k, cast(GMLPVisionConfig, config).num_classes))


def example_inputs(
    config: GMLPConfig, batch: int, seed: int = 0, length: int | None = None, predictions: int | None = None
) -> dict[str, torch.Tensor]:
    """Named example inputs of the graph contract (random but valid), used for export and checks.

    Masked LM: `input_ids [batch, length]` (default n), each row a text of 1/4 to all of `length`
    tokens padded to `length`, as a batch of texts padded to its longest one; `mask_positions
    [batch, predictions]` (default max_predictions) inside each row's text.
    """
    gen = torch.Generator().manual_seed(seed)
    if isinstance(config, GMLPMaskedLMConfig):
        length = config.n if length is None else length
        predictions = config.max_predictions if predictions is None else predictions
        ids = torch.randint(1000, config.vocab_size, (batch, length), generator=gen)
        lengths = torch.randint(max(1, length // 4), length + 1, (batch,), generator=gen)
        ids[torch.arange(length)[None, :] >= lengths[:, None]] = config.pad_token_id
        positions = (torch.rand(batch, predictions, generator=gen) * lengths[:, None]).long()
        return {"input_ids": ids, "mask_positions": positions}
    assert isinstance(config, GMLPVisionConfig)
    pixels = torch.randn(batch, config.in_chans, config.img_size, config.img_size, generator=gen)
    return {"pixel_values": pixels}


# Names of the dynamic axes, in the ONNX graph and in config.json's `inputs` / `outputs`.
BATCH_AXIS, SEQ_AXIS, PREDICTIONS_AXIS = "batch", "seq", "predictions"


def io_spec(config: GMLPConfig, top_k: int = 0) -> tuple[list[dict], list[dict]]:
    """Input and output descriptions for config.json (docs/formats.md): a string names a dynamic
    axis, an int is fixed. A masked LM's `seq` runs from 1 to n and `predictions` from 1 to
    max_predictions; a classifier's patch grid, and so its image size, is fixed. With `top_k`,
    the top-k outputs follow `logits`, shaped like it with K in place of the row."""

    def tensor(name: str, dtype: str, *shape: str | int) -> dict[str, Any]:
        return {"name": name, "dtype": dtype, "shape": list(shape)}

    if isinstance(config, GMLPMaskedLMConfig):
        inputs = [
            tensor("input_ids", "int64", BATCH_AXIS, SEQ_AXIS),
            tensor("mask_positions", "int64", BATCH_AXIS, PREDICTIONS_AXIS),
        ]
        outputs = [tensor("logits", "float32", BATCH_AXIS, PREDICTIONS_AXIS, config.vocab_size)]
    else:
        assert isinstance(config, GMLPVisionConfig)
        size = config.img_size
        inputs = [tensor("pixel_values", "float32", BATCH_AXIS, config.in_chans, size, size)]
        outputs = [tensor("logits", "float32", BATCH_AXIS, config.num_classes)]
    k = graph_top_k(config, top_k)
    if k:
        rows = outputs[0]["shape"][:-1]
        outputs += [
            tensor(TOP_K_IDS_OUTPUT, "int64", *rows, k),
            tensor(TOP_K_SCORES_OUTPUT, "float32", *rows, k),
        ]
    return inputs, outputs


def export_onnx(
    model: GMLPModel,
    path: str | Path,
    *,
    fused: bool = True,
    float16: bool = False,
    metadata: dict[str, str] | None = None,
    top_k: int = 0,
) -> Path:
    """Export `model` (vision or MLM) to `path`; returns the path.

    With `fused`, every block's SGU is one `gmlp::SpatialGatingUnit` node; otherwise it is
    exported as ordinary ops (the "plain export" the benchmark compares against). With
    `float16`, weights and compute are fp16 and the inputs/outputs stay float32. With `top_k`,
    the graph also outputs `topk_ids` and `topk_scores` (`_ServedGraph`, K = `graph_top_k`). The
    exported module is a copy of `model`, whose own forward is the graph contract: (pixel_values)
    or (input_ids [B, L], mask_positions [B, P]), 1 <= L <= n, 1 <= P <= max_predictions.
    """
    config = model.config
    copied = copy.deepcopy(model).float().eval()
    if fused:
        for block in cast("list[GMLPBlock]", copied.blocks):
            block.register_module("sgu", _SymbolicSGU(block.sgu))
    k = graph_top_k(config, top_k)
    graph = _ServedGraph(copied, float16, k) if float16 or k else copied
    inputs = example_inputs(config, batch=2)
    # torch.export's dynamic axes for the graph inputs: the named axes of `io_spec`'s inputs.
    bounds = {BATCH_AXIS: 4096}
    if isinstance(config, GMLPMaskedLMConfig):
        bounds.update({SEQ_AXIS: config.n, PREDICTIONS_AXIS: config.max_predictions})
    dims = {axis: torch.export.Dim(axis, min=1, max=most) for axis, most in bounds.items()}
    dynamic_shapes = tuple(
        {i: dims[axis] for i, axis in enumerate(spec["shape"]) if isinstance(axis, str)}
        for spec in io_spec(config)[0]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            graph,
            args=tuple(inputs.values()),
            dynamo=True,
            opset_version=OPSET,
            input_names=list(inputs),
            output_names=[spec["name"] for spec in io_spec(config, top_k)[1]],
            dynamic_shapes=dynamic_shapes,
            optimize=True,
            verbose=False,
        )
    assert program is not None  # only the TorchScript exporter returns nothing
    onnx_model: ir.Model = program.model
    if fused:
        nodes = [n for n in onnx_model.graph.all_nodes() if n.domain == DOMAIN and n.op_type == OP_TYPE]
        if len(nodes) != config.depth:
            raise RuntimeError(
                f"expected {config.depth} {DOMAIN}::{OP_TYPE} nodes after export, found {len(nodes)}"
            )
        is_mlm = isinstance(config, GMLPMaskedLMConfig)
        function = build_sgu_function(
            epsilon=config.sgu_norm_eps,
            has_mask=is_mlm,
            has_attn=config.attn_dim is not None,
            opset=OPSET,
            variable_length=is_mlm,  # a classifier's patch grid is fixed
            heads=config.heads,
            gate_act=config.gate_act,
        )
        onnx_model.functions[function.identifier()] = function
        onnx_model.opset_imports[DOMAIN] = FUNCTION_VERSION
        onnx_model.opset_imports[""] = OPSET
    for key, value in (metadata or {}).items():
        onnx_model.metadata_props[key] = value
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ir.save(onnx_model, path)
    return path


def build_sgu_function(
    *,
    epsilon: float,
    has_mask: bool,
    has_attn: bool,
    opset: int,
    variable_length: bool = False,
    heads: int = 1,
    gate_act: str = "identity",
) -> ir.Function:
    """The FunctionProto (as an onnx_ir Function) for one model's SGU signature.

    Its default-domain opset must equal the model's, or ONNX Runtime refuses the model. With
    `variable_length`, W and b are sliced to the input's length (masked LM). `heads` and
    `gate_act` are `GMLPConfig`'s (gelu needs opset >= 20).
    """
    names = ["z", "norm_weight", "norm_bias", "spatial_weight", "spatial_bias"]
    names += [name for name, present in (("token_mask", has_mask), ("attn", has_attn)) if present]

    def body(op: onnxscript.OpBuilder, *values: ir.Value) -> ir.Value:
        args = dict(zip(names, values, strict=True))
        z1, z2 = op.Split(args["z"], axis=-1, num_outputs=2, _outputs=2)
        z2 = op.LayerNormalization(z2, args["norm_weight"], args["norm_bias"], axis=-1, epsilon=epsilon)
        if has_mask:
            z2 = op.Mul(z2, args["token_mask"])
        weight, bias = args["spatial_weight"], args["spatial_bias"]
        if variable_length:
            length = op.Shape(args["z"], start=1, end=2)
            weight = op.Slice(
                weight,
                op.Constant(value_ints=[0, 0]),
                op.Concat(length, length, axis=0),
                op.Constant(value_ints=[-2, -1]),
            )
            bias = op.Slice(bias, op.Constant(value_ints=[0]), length, op.Constant(value_ints=[-1]))
        bias = op.Unsqueeze(bias, op.Constant(value_ints=[-1]))
        if heads == 1:
            gate = op.Add(op.MatMul(weight, z2), bias)
        else:
            # Head by head on its channel slice: no Transpose of the activations.
            slices = op.Split(z2, axis=-1, num_outputs=heads, _outputs=heads)
            weights = op.Split(weight, axis=0, num_outputs=heads, _outputs=heads)
            biases = op.Split(bias, axis=0, num_outputs=heads, _outputs=heads)
            gate = op.Concat(
                *(op.Add(op.MatMul(w, z), b) for w, z, b in zip(weights, slices, biases, strict=True)),
                axis=-1,
            )
        if has_attn:
            gate = op.Add(gate, args["attn"])
        # `model.layers.GATE_FUNCTIONS[gate_act]` in ONNX ops.
        if gate_act == "silu":
            gate = op.Mul(gate, op.Sigmoid(gate))
        elif gate_act != "identity":
            gate = {"tanh": op.Tanh, "sigmoid": op.Sigmoid, "relu": op.Relu, "gelu": op.Gelu}[gate_act](gate)
        return op.Mul(z1, gate)

    inputs = [ir.Value(name=name) for name in names]
    return onnxscript.build_function(body, inputs, domain=DOMAIN, name=OP_TYPE, opset_imports={"": opset})
