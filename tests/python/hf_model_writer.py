#!/usr/bin/python3
"""Writes tiny random Hugging Face style model directories (numpy only).

Produces config.json, generation_config.json and model.safetensors (or several
shards plus model.safetensors.index.json) for LlamaForCausalLM,
MistralForCausalLM and Qwen2ForCausalLM.  The safetensors writer is our own, so
the test does not depend on the `safetensors` package.

Weight scales are chosen on purpose so the network is *not* nearly trivial:
  * q/k/v/o and MLP projections use std = 1/sqrt(fan_in) (not the usual 0.02):
    with 0.02 at hidden 64 the attention scores are ~0.03 and softmax is almost
    uniform, so RoPE or causal-mask bugs would be invisible in the logits.
  * embeddings use std 1.0 (1/sqrt(H) when tied, see make_weights) and norms
    1 + 0.1*N(0,1), so every layer's output is comparable to the residual
    stream and logits have a clear top-1 (greedy margins far above fp32 noise).

CLI example:
  python3 tests/python/hf_model_writer.py OUT_DIR --arch llama --dtype bf16 --shards 2
"""
import argparse
import dataclasses
import json
import os
import struct
from typing import Dict, Optional, Tuple

import numpy as np

ARCHS = {
    "llama": ("LlamaForCausalLM", "llama"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
}
# dtype name -> (safetensors dtype, config torch_dtype)
DTYPES = {
    "f32": ("F32", "float32"),
    "bf16": ("BF16", "bfloat16"),
    "f16": ("F16", "float16"),
}
DTYPE_ALIASES = {"fp32": "f32", "float32": "f32", "bfloat16": "bf16",
                 "fp16": "f16", "float16": "f16"}


@dataclasses.dataclass
class ModelSpec:
    arch: str = "llama"            # llama | mistral | qwen2
    dtype: str = "f32"             # f32 | bf16 | f16
    hidden: int = 64
    intermediate: int = 128
    heads: int = 4
    kv_heads: int = 2
    layers: int = 2
    vocab: int = 384
    head_dim: Optional[int] = None  # None: key omitted, default hidden/heads
    tie: bool = False
    rope_theta: float = 10000.0
    rope_scaling_llama3: bool = False
    max_pos: int = 512
    rms_norm_eps: float = 1e-5
    shards: int = 1
    seed: int = 0
    # Sliding window W (a windowed layer's query i sees keys j with i - j < W). mistral: every
    # layer; qwen2: use_sliding_window, on layers l >= max_window_layers (None: 0, all layers).
    sliding_window: Optional[int] = None
    max_window_layers: Optional[int] = None


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns, round-to-nearest-even on the dropped 16 bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    # Adding 0x7FFF plus the lowest kept bit rounds half-way cases to even.
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def encode(x: np.ndarray, st_dtype: str) -> bytes:
    """Little-endian raw bytes of `x` (fp32 values) in the safetensors dtype."""
    if st_dtype == "F32":
        return np.ascontiguousarray(x, dtype="<f4").tobytes()
    if st_dtype == "F16":
        return np.ascontiguousarray(x, dtype="<f2").tobytes()
    if st_dtype == "BF16":
        return f32_to_bf16_bits(x).astype("<u2").tobytes()
    raise ValueError(f"unsupported dtype {st_dtype}")


def write_safetensors(path: str, tensors: Dict[str, Tuple[np.ndarray, str]],
                      metadata: Optional[Dict[str, str]] = None) -> int:
    """Writes {name: (fp32 array, st_dtype)}; returns the data size in bytes."""
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (arr, st_dtype) in tensors.items():
        blob = encode(arr, st_dtype)
        header[name] = {"dtype": st_dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    hdr = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hdr += b" " * (-len(hdr) % 8)  # pad like the reference library: 8-byte aligned data
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for blob in blobs:
            f.write(blob)
    return offset


def head_dim_of(spec: ModelSpec) -> int:
    return spec.head_dim if spec.head_dim is not None else spec.hidden // spec.heads


def make_config(spec: ModelSpec) -> dict:
    arch_name, model_type = ARCHS[spec.arch]
    cfg = {
        "architectures": [arch_name],
        "model_type": model_type,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "num_hidden_layers": spec.layers,
        "vocab_size": spec.vocab,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "max_position_embeddings": spec.max_pos,
        "tie_word_embeddings": spec.tie,
        "torch_dtype": DTYPES[spec.dtype][1],
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if spec.head_dim is not None:
        cfg["head_dim"] = spec.head_dim
    if spec.arch == "llama":
        cfg["attention_bias"] = False
        cfg["mlp_bias"] = False
    if spec.arch == "mistral":
        cfg["sliding_window"] = spec.sliding_window
    if spec.arch == "qwen2":
        if spec.sliding_window is None:
            # As in real Qwen2 configs: window present but disabled.
            cfg["use_sliding_window"] = False
            cfg["sliding_window"] = 4096
            cfg["max_window_layers"] = spec.layers
        else:
            cfg["use_sliding_window"] = True
            cfg["sliding_window"] = spec.sliding_window
            cfg["max_window_layers"] = spec.max_window_layers or 0
    if spec.rope_scaling_llama3:
        # original_max_position_embeddings is tiny so that, for head_dim 16 and
        # theta 1e4, some frequencies stay, some are interpolated, some divided.
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 64}
    return cfg


def make_weights(spec: ModelSpec) -> Dict[str, np.ndarray]:
    """Random fp32 weights in HF naming; deterministic in spec.seed."""
    rng = np.random.default_rng(spec.seed)
    H, I, V, D = spec.hidden, spec.intermediate, spec.vocab, head_dim_of(spec)
    q_dim, kv_dim = spec.heads * D, spec.kv_heads * D

    def proj(out_f, in_f):  # HF Linear layout [out, in]
        return (rng.standard_normal((out_f, in_f)) / np.sqrt(in_f)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    # Tied models reuse the embedding as lm_head; with std 1 a token's own
    # embedding dominates the final hidden state and greedy decoding just repeats
    # the last token, so there the embedding gets std 1/sqrt(H) (logits std ~1).
    embed_std = 1.0 / np.sqrt(H) if spec.tie else 1.0
    w = {"model.embed_tokens.weight": (embed_std * rng.standard_normal((V, H))).astype(np.float32)}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "self_attn.q_proj.weight"] = proj(q_dim, H)
        w[p + "self_attn.k_proj.weight"] = proj(kv_dim, H)
        w[p + "self_attn.v_proj.weight"] = proj(kv_dim, H)
        if spec.arch == "qwen2":
            for n, d in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                w[p + f"self_attn.{n}_proj.bias"] = (0.5 * rng.standard_normal(d)).astype(np.float32)
        w[p + "self_attn.o_proj.weight"] = proj(H, q_dim)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        w[p + "mlp.gate_proj.weight"] = proj(I, H)
        w[p + "mlp.up_proj.weight"] = proj(I, H)
        w[p + "mlp.down_proj.weight"] = proj(H, I)
    w["model.norm.weight"] = norm(H)
    if not spec.tie:
        w["lm_head.weight"] = proj(V, H)
    return w


def write_model(out_dir: str, spec: ModelSpec,
                perturb: Optional[Tuple[str, Tuple[int, ...], float]] = None) -> str:
    """Writes the model directory. `perturb=(tensor, index, delta)` adds delta to
    one element (used by the test's negative check)."""
    os.makedirs(out_dir, exist_ok=True)
    weights = make_weights(spec)
    if perturb is not None:
        name, idx, delta = perturb
        weights[name][idx] += np.float32(delta)
    st_dtype = DTYPES[spec.dtype][0]

    # Remove files of an earlier write so a switch single <-> sharded is clean.
    for f in os.listdir(out_dir):
        if f.endswith(".safetensors") or f == "model.safetensors.index.json":
            os.remove(os.path.join(out_dir, f))

    names = list(weights)
    n = max(1, spec.shards)
    meta = {"format": "pt"}
    if n == 1:
        write_safetensors(os.path.join(out_dir, "model.safetensors"),
                          {k: (weights[k], st_dtype) for k in names}, meta)
    else:
        # Contiguous groups of roughly equal size (by element count).
        sizes = np.cumsum([weights[k].size for k in names])
        bounds = [int(np.searchsorted(sizes, sizes[-1] * j / n, side="right")) for j in range(1, n)]
        groups = np.split(np.arange(len(names)), bounds)
        weight_map, total = {}, 0
        for j, grp in enumerate(groups):
            fname = f"model-{j + 1:05d}-of-{n:05d}.safetensors"
            part = {names[g]: (weights[names[g]], st_dtype) for g in grp}
            assert part, "too many shards for this model"
            total += write_safetensors(os.path.join(out_dir, fname), part, meta)
            weight_map.update({k: fname for k in part})
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)

    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(make_config(spec), f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, f, indent=2)
    return out_dir


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--arch", choices=sorted(ARCHS), default="llama")
    ap.add_argument("--dtype", default="f32", help="f32 | bf16 | f16")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=384)
    ap.add_argument("--head-dim", type=int, default=None)
    ap.add_argument("--tie", action="store_true", help="tie_word_embeddings (no lm_head.weight)")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--rope-scaling", choices=["none", "llama3"], default="none")
    ap.add_argument("--max-pos", type=int, default=512)
    ap.add_argument("--rms-norm-eps", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sliding-window", type=int, default=None,
                    help="mistral: every layer; qwen2: layers >= --max-window-layers")
    ap.add_argument("--max-window-layers", type=int, default=None)
    a = ap.parse_args()
    dtype = DTYPE_ALIASES.get(a.dtype, a.dtype)
    if dtype not in DTYPES:
        ap.error(f"--dtype must be one of {sorted(DTYPES)}")
    spec = ModelSpec(arch=a.arch, dtype=dtype, hidden=a.hidden, intermediate=a.intermediate,
                     heads=a.heads, kv_heads=a.kv_heads, layers=a.layers, vocab=a.vocab,
                     head_dim=a.head_dim, tie=a.tie, rope_theta=a.rope_theta,
                     rope_scaling_llama3=(a.rope_scaling == "llama3"), max_pos=a.max_pos,
                     rms_norm_eps=a.rms_norm_eps, shards=a.shards, seed=a.seed,
                     sliding_window=a.sliding_window, max_window_layers=a.max_window_layers)
    write_model(a.out_dir, spec)
    print(f"wrote {a.arch} ({dtype}, {a.shards} shard(s)) to {a.out_dir}")


if __name__ == "__main__":
    main()
