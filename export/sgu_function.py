"""The `gmlp::SpatialGatingUnit` ONNX function, written with onnxscript.

Body (paper section 2, with the exported layout of `model.layers.SpatialGatingUnit`):

    z1, z2 = Split(z, axis=-1, num_outputs=2)
    z2     = LayerNormalization(z2, gamma, beta, epsilon)
    z2     = Mul(z2, token_mask)                      # masked LM only: padding takes no part
    L      = Shape(z, start=1, end=2)                 # masked LM only: this run's length
    W, b   = Slice(W, [0, 0], [L, L]), Slice(b, [0], L)
    gate   = Add(MatMul(W, z2), Unsqueeze(b, [-1]))   # W [L, L] broadcast over the batch
    gate   = Add(gate, attn)                          # aMLP only: the tiny attention's output
    out    = Mul(z1, gate)

Inputs, in order: z, gamma, beta, W, b, then `token_mask` [batch, L, 1] if the model masks
padding, then `attn` [batch, L, d_ffn/2] if it is an aMLP. A model uses one signature for all its
blocks, so one function per model suffices. The tiny attention itself is computed by ordinary
nodes before the SGU node (it reads the block's normalised input, not z), and its output enters
the function as `attn`.

A masked LM's graph takes any length 1 <= L <= n, so the function slices the top-left L x L block
of W (and the first L entries of b) itself, from the shape of its input: one file serves every
length, and for the real tokens this is exactly the fixed window of n tokens with padding masked
out (docs/model.md, "Variable length"). A classifier's patch grid is fixed, so its W is used
whole.

ONNX Runtime inlines the function before optimising, so serving speed equals a plain export;
a runtime with a registered `gmlp::SpatialGatingUnit` kernel may take the node whole instead.
"""

from __future__ import annotations

import onnx_ir as ir
import onnxscript

DOMAIN = "gmlp"
OP_TYPE = "SpatialGatingUnit"
FUNCTION_VERSION = 1


def sgu_input_names(has_mask: bool, has_attn: bool) -> list[str]:
    names = ["z", "norm_weight", "norm_bias", "spatial_weight", "spatial_bias"]
    if has_mask:
        names.append("token_mask")
    if has_attn:
        names.append("attn")
    return names


def build_sgu_function(
    *, epsilon: float, has_mask: bool, has_attn: bool, opset: int, variable_length: bool = False
) -> ir.Function:
    """The FunctionProto (as an onnx_ir Function) for one model's SGU signature.

    Its default-domain opset must equal the model's, or ONNX Runtime refuses the model. With
    `variable_length`, W and b are sliced to the input's length (masked LM).
    """
    names = sgu_input_names(has_mask, has_attn)

    def body(op: onnxscript.OpBuilder, *values: ir.Value) -> ir.Value:
        args = dict(zip(names, values, strict=True))
        z1, z2 = op.Split(args["z"], axis=-1, num_outputs=2, _outputs=2)
        z2 = op.LayerNormalization(z2, args["norm_weight"], args["norm_bias"], axis=-1, epsilon=epsilon)
        if has_mask:
            z2 = op.Mul(z2, args["token_mask"])
        weight, bias = args["spatial_weight"], args["spatial_bias"]
        if variable_length:
            length = op.Shape(args["z"], start=1, end=2)
            weight = op.Slice(weight, op.Constant(value_ints=[0, 0]), op.Concat(length, length, axis=0))
            bias = op.Slice(bias, op.Constant(value_ints=[0]), length)
        bias = op.Unsqueeze(bias, op.Constant(value_ints=[-1]))
        gate = op.Add(op.MatMul(weight, z2), bias)
        if has_attn:
            gate = op.Add(gate, args["attn"])
        return op.Mul(z1, gate)

    inputs = [ir.Value(name=name) for name in names]
    function = onnxscript.build_function(body, inputs, domain=DOMAIN, name=OP_TYPE, opset_imports={"": opset})
    return function
