#!/usr/bin/python3
"""Writes tiny random DeepSeek-V2 / DeepSeek-V3 style Hugging Face model directories.

config.json (DeepseekV2ForCausalLM / DeepseekV3ForCausalLM fields), generation_config.json and
model.safetensors with HF tensor names:
  model.layers.N.self_attn.{q_proj | q_a_proj, q_a_layernorm, q_b_proj}, kv_a_proj_with_mqa,
      kv_a_layernorm, kv_b_proj, o_proj
  model.layers.N.mlp.{gate,up,down}_proj                     (dense layers: N < first_k_dense_replace)
  model.layers.N.mlp.gate.weight (+ .e_score_correction_bias for noaux_tc),
      mlp.experts.E.{gate,up,down}_proj, mlp.shared_experts.{gate,up,down}_proj   (MoE layers)
The safetensors writer is hf_model_writer's.

Scales follow hf_model_writer's reasoning (projections std 1/sqrt(fan_in), embeddings std 1,
norms 1 + 0.1 N(0,1)) so attention is far from uniform and the logits have a clear top-1. The
router gets std 1/sqrt(hidden) (gate logits ~N(0,1), so routing depends on the input), and the
V3 correction bias is N(0, 0.2): comparable to the sigmoid score gaps, so it changes which
experts are chosen for a good share of tokens.

CLI:  python3 tests/python/hf_deepseek_writer.py OUT_DIR --variant v2|v3
"""
import argparse
import dataclasses
import json
import os
import sys
from typing import Dict, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model_writer as hw  # noqa: E402


@dataclasses.dataclass
class DeepseekSpec:
    variant: str = "v2"             # v2 -> DeepseekV2ForCausalLM, v3 -> DeepseekV3ForCausalLM
    dtype: str = "f32"              # f32 | bf16 | f16 (hf_model_writer.DTYPES)
    hidden: int = 64
    intermediate: int = 128         # dense layers
    moe_intermediate: int = 32
    heads: int = 4
    layers: int = 3
    vocab: int = 300
    q_lora_rank: Optional[int] = 48  # None: q_proj
    kv_lora_rank: int = 32
    qk_rope_head_dim: int = 16
    qk_nope_head_dim: int = 16
    v_head_dim: int = 16
    n_routed_experts: int = 8
    n_shared_experts: Optional[int] = 2
    num_experts_per_tok: int = 2
    n_group: int = 2
    topk_group: int = 1
    routed_scaling_factor: float = 2.0
    scoring_func: str = "softmax"   # softmax | sigmoid
    topk_method: str = "group_limited_greedy"  # greedy | group_limited_greedy | noaux_tc
    norm_topk_prob: bool = False
    first_k_dense_replace: int = 1
    moe_layer_freq: int = 1
    rope_theta: float = 10000.0
    # yarn rope_scaling; None: no scaling. original_max_position_embeddings is tiny so that, at
    # qk_rope_head_dim 16, some frequencies stay, some are interpolated, some divided by factor.
    yarn: Optional[dict] = dataclasses.field(default_factory=lambda: {
        "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 32, "beta_slow": 1,
        "mscale": 0.707, "mscale_all_dim": 0.707})
    max_pos: int = 256
    rms_norm_eps: float = 1e-6
    tie: bool = False
    bos: int = 1
    eos: int = 2
    mla_cache_dtype: Optional[str] = None  # our extension: "fp8_e4m3" selects the fp8 latent cache
    kv_scale: Optional[float] = None        # writes self_attn.kv_scale (fp8 dequant scale) per layer
    seed: int = 0


def v2_spec(**kw) -> DeepseekSpec:
    """DeepSeek-V2 style: q LoRA, softmax scores, group_limited_greedy, 2 shared experts,
    norm_topk_prob false (real V2), yarn with mscale == mscale_all_dim (as V2 ships)."""
    return DeepseekSpec(**kw)


def v3_spec(**kw) -> DeepseekSpec:
    """DeepSeek-V3 style: sigmoid scores, noaux_tc with e_score_correction_bias, normalized top-k
    times routed_scaling_factor, 1 shared expert; no q LoRA by default; yarn with
    mscale != mscale_all_dim so the cos/sin factor differs from 1."""
    base = dict(variant="v3", q_lora_rank=None, scoring_func="sigmoid", topk_method="noaux_tc",
                norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=1,
                yarn={"factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 32,
                      "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8},
                rms_norm_eps=1e-5)
    base.update(kw)
    return DeepseekSpec(**base)


def is_moe_layer(spec: DeepseekSpec, i: int) -> bool:
    return (spec.n_routed_experts > 0 and i >= spec.first_k_dense_replace
            and i % spec.moe_layer_freq == 0)


def make_config(spec: DeepseekSpec) -> dict:
    v3 = spec.variant == "v3"
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v3" if v3 else "deepseek_v2",
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "moe_intermediate_size": spec.moe_intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.heads,
        "q_lora_rank": spec.q_lora_rank,
        "kv_lora_rank": spec.kv_lora_rank,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "qk_nope_head_dim": spec.qk_nope_head_dim,
        "v_head_dim": spec.v_head_dim,
        "n_routed_experts": spec.n_routed_experts,
        "n_shared_experts": spec.n_shared_experts,
        "num_experts_per_tok": spec.num_experts_per_tok,
        "routed_scaling_factor": spec.routed_scaling_factor,
        "scoring_func": spec.scoring_func,
        "topk_method": spec.topk_method,
        "n_group": spec.n_group,
        "topk_group": spec.topk_group,
        "norm_topk_prob": spec.norm_topk_prob,
        "first_k_dense_replace": spec.first_k_dense_replace,
        "moe_layer_freq": spec.moe_layer_freq,
        "aux_loss_alpha": 0.001,
        "seq_aux": True,
        "hidden_act": "silu",
        "rope_theta": spec.rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": spec.rms_norm_eps,
        "vocab_size": spec.vocab,
        "max_position_embeddings": spec.max_pos,
        "tie_word_embeddings": spec.tie,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "torch_dtype": hw.DTYPES[spec.dtype][1],
        "bos_token_id": spec.bos,
        "eos_token_id": spec.eos,
    }
    if spec.yarn is not None:
        cfg["rope_scaling"] = dict(type="yarn", **spec.yarn)
    if spec.mla_cache_dtype is not None:
        cfg["mla_cache_dtype"] = spec.mla_cache_dtype
    return cfg


def make_weights(spec: DeepseekSpec) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(spec.seed)
    H, V = spec.hidden, spec.vocab
    qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim

    def proj(out_f, in_f):
        return (rng.standard_normal((out_f, in_f)) / np.sqrt(in_f)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def mlp(prefix, inter):
        w[prefix + "gate_proj.weight"] = proj(inter, H)
        w[prefix + "up_proj.weight"] = proj(inter, H)
        w[prefix + "down_proj.weight"] = proj(H, inter)

    embed_std = 1.0 / np.sqrt(H) if spec.tie else 1.0
    w = {"model.embed_tokens.weight": (embed_std * rng.standard_normal((V, H))).astype(np.float32)}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        w[p + "input_layernorm.weight"] = norm(H)
        if spec.q_lora_rank is None:
            w[a + "q_proj.weight"] = proj(spec.heads * qk, H)
        else:
            w[a + "q_a_proj.weight"] = proj(spec.q_lora_rank, H)
            w[a + "q_a_layernorm.weight"] = norm(spec.q_lora_rank)
            w[a + "q_b_proj.weight"] = proj(spec.heads * qk, spec.q_lora_rank)
        w[a + "kv_a_proj_with_mqa.weight"] = proj(spec.kv_lora_rank + spec.qk_rope_head_dim, H)
        w[a + "kv_a_layernorm.weight"] = norm(spec.kv_lora_rank)
        w[a + "kv_b_proj.weight"] = proj(
            spec.heads * (spec.qk_nope_head_dim + spec.v_head_dim), spec.kv_lora_rank)
        w[a + "o_proj.weight"] = proj(H, spec.heads * spec.v_head_dim)
        if spec.kv_scale is not None:
            w[a + "kv_scale"] = np.array(spec.kv_scale, dtype=np.float32)  # scalar, shape []
        w[p + "post_attention_layernorm.weight"] = norm(H)
        if is_moe_layer(spec, i):
            E = spec.n_routed_experts
            w[p + "mlp.gate.weight"] = proj(E, H)
            if spec.topk_method == "noaux_tc":
                w[p + "mlp.gate.e_score_correction_bias"] = (
                    0.2 * rng.standard_normal(E)).astype(np.float32)
            for e in range(E):
                mlp(p + f"mlp.experts.{e}.", spec.moe_intermediate)
            if spec.n_shared_experts:
                mlp(p + "mlp.shared_experts.", spec.moe_intermediate * spec.n_shared_experts)
        else:
            mlp(p + "mlp.", spec.intermediate)
    w["model.norm.weight"] = norm(H)
    if not spec.tie:
        w["lm_head.weight"] = proj(V, H)
    return w


def write_model(out_dir: str, spec: DeepseekSpec, perturb=None, tokenizer_json: Optional[str] = None) -> str:
    """Writes the directory; perturb=(tensor, index, delta) nudges one element (negative
    checks); tokenizer_json is copied in as tokenizer.json."""
    os.makedirs(out_dir, exist_ok=True)
    weights = make_weights(spec)
    if perturb is not None:
        name, idx, delta = perturb
        weights[name][idx] += np.float32(delta)
    st = hw.DTYPES[spec.dtype][0]
    # The correction bias and kv_scale stay fp32 as in the real checkpoints.
    tensors = {k: (v, "F32" if k.endswith(("e_score_correction_bias", "kv_scale")) else st)
               for k, v in weights.items()}
    hw.write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(make_config(spec), f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": spec.bos, "eos_token_id": spec.eos, "do_sample": False}, f,
                  indent=2)
    if tokenizer_json is not None:
        with open(tokenizer_json, "rb") as src, open(os.path.join(out_dir, "tokenizer.json"), "wb") as dst:
            dst.write(src.read())
    return out_dir


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--variant", choices=["v2", "v3"], default="v2")
    ap.add_argument("--no-q-lora", action="store_true")
    ap.add_argument("--vocab", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    make = v2_spec if a.variant == "v2" else v3_spec
    spec = make(vocab=a.vocab, seed=a.seed)
    if a.no_q_lora:
        spec.q_lora_rank = None
    write_model(a.out_dir, spec)
    print(f"wrote DeepSeek-{a.variant} tiny model to {a.out_dir}")


if __name__ == "__main__":
    main()
