"""The `gmlp::SpatialGatingUnit` ONNX function, written with onnxscript (docs/export.md).

Body (paper section 2, with the exported layout of `model.layers.SpatialGatingUnit`):

    z1, z2 = Split(z, axis=-1, num_outputs=2)
    z2     = LayerNormalization(z2, gamma, beta, epsilon)
    z2     = Mul(z2, token_mask)                      # masked LM only: padding takes no part
    L      = Shape(z, start=1, end=2)                 # masked LM only: this run's length
    W, b   = Slice(W, [0, 0], [L, L], axes=[-2, -1]), Slice(b, [0], L, axes=[-1])
    gate   = Add(MatMul(W, z2), Unsqueeze(b, [-1]))   # W [L, L] broadcast over the batch
    gate   = Add(gate, attn)                          # aMLP only: the tiny attention's output
    gate   = act(gate)                                # a gate activation other than the identity
    out    = Mul(z1, gate)

With h > 1 heads W is [h, n, n] and b [h, n]: each head's `W_h @ z2_h + b_h` on its slice of z2's
channels, the h gates concatenated over channels. The head count, the activation and the optional
inputs (`token_mask` [batch, L, 1], `attn` [batch, L, d_ffn/2], computed by ordinary nodes before
the SGU node) are fixed per model, so one function per model suffices. A masked LM's function
slices W and b to its input's length itself, so one file serves every length 1 <= L <= n; a
classifier's patch grid is fixed and its W used whole.
"""

from __future__ import annotations

import onnx_ir as ir
import onnxscript

DOMAIN = "gmlp"
OP_TYPE = "SpatialGatingUnit"
FUNCTION_VERSION = 1


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
        return op.Mul(z1, _activation(op, gate, gate_act))

    inputs = [ir.Value(name=name) for name in names]
    return onnxscript.build_function(body, inputs, domain=DOMAIN, name=OP_TYPE, opset_imports={"": opset})


def _activation(op: onnxscript.OpBuilder, gate: ir.Value, name: str) -> ir.Value:
    """`model.layers.GATE_FUNCTIONS[name]` in ONNX ops."""
    if name == "identity":
        return gate
    if name == "silu":
        return op.Mul(gate, op.Sigmoid(gate))
    ops = {"tanh": op.Tanh, "sigmoid": op.Sigmoid, "relu": op.Relu, "gelu": op.Gelu}
    return ops[name](gate)
