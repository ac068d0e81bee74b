"""MXFP4 (OCP microscaling FP4) as gpt-oss checkpoints store their experts, in numpy.

dequantize() follows transformers' integrations/mxfp4.py convert_moe_packed_tensors: the FP4
(e2m1) value table, exponent = scale byte - 127, the low nibble of each byte holding the even
element; blocks [..., rows, cols / 32, 16] u8 and scales [..., rows, cols / 32] u8 give
[..., rows, cols] (transformers then transposes the last two dimensions into the parameter's
[E, in, out] layout). quantize() is its inverse for weights that round to FP4: one power-of-two
scale per 32 values, chosen so that the group's largest magnitude fits 6.0, nearest FP4 value.
"""

import numpy as np

FP4_VALUES = np.array([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


def dequantize(blocks, scales):
    blocks = np.asarray(blocks, dtype=np.uint8)
    vals = np.empty(blocks.shape[:-1] + (32,), dtype=np.float32)
    vals[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    vals[..., 1::2] = FP4_VALUES[blocks >> 4]
    exp = np.asarray(scales, dtype=np.int32)[..., None] - 127
    out = np.ldexp(vals.astype(np.float64), exp).astype(np.float32)
    return out.reshape(blocks.shape[:-2] + (blocks.shape[-2] * 32,))


def quantize(w):
    """(blocks, scales) of w [..., rows, cols], cols a multiple of 32."""
    w = np.asarray(w, dtype=np.float64)
    if w.shape[-1] % 32:
        raise ValueError(f"MXFP4 needs a multiple of 32 columns, got {w.shape}")
    g = w.reshape(w.shape[:-1] + (w.shape[-1] // 32, 32))
    amax = np.abs(g).max(axis=-1)
    safe = np.where(amax > 0, amax, 1.0)
    exp = np.where(amax > 0, np.ceil(np.log2(safe / 6.0)), -127).astype(np.int32)
    exp = np.clip(exp, -127, 127)
    scaled = g / np.exp2(exp)[..., None]
    mags = FP4_VALUES[:8].astype(np.float64)
    code = np.abs(np.abs(scaled)[..., None] - mags).argmin(axis=-1)
    code = code | np.where(np.signbit(scaled), 8, 0)
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).astype(np.uint8)
    return blocks, (exp + 127).astype(np.uint8)


def gpt_oss_experts(name, w):
    """The MXFP4 tensors of one stacked gpt-oss expert parameter (gate_up_proj [E, H, 2I] or
    down_proj [E, I, H]) and the fp32 [E, in, out] values they dequantize to."""
    blocks, scales = quantize(np.swapaxes(w, 1, 2))
    deq = np.swapaxes(dequantize(blocks, scales), 1, 2)
    return {name + "_blocks": blocks, name + "_scales": scales}, np.ascontiguousarray(deq)


def is_gpt_oss_expert(name):
    return name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj")
