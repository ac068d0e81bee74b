"""GPU fidelity against transformers, teacher-forced along the server's own path (runs on the GPU
machine, which has transformers; shapes the GPU kernels serve, so nothing here is committed).

For each architecture: a tiny transformers model with kernel-sized heads (head_dim 128; MLA with
the 512 + 64 latent), weights from tools/hf_fixtures/weights.py's generator, saved with
save_pretrained; llm-dump runs it greedily on the GPU (bf16 weights and cache); transformers' fp32
eager model then scores the server's whole path in one forward. At every step the gap
`transformers' top-1 logit - transformers' logit of the server's token` must stay below 0.5: a
larger gap is a wrong token, not a bf16 near-tie.

    python3 tools/hf_fixtures/gpu_fidelity.py --dump "DIR/.devpack/run llm-dump" [--only a,b]
        [--max-gap 0.5] [--kv-cache-dtype auto]
"""

import argparse
import copy
import json
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import weights as W  # noqa: E402
from make_fixtures import ARCHS, SEED, YARN_ROPE, LLAMA3_ROPE, scale_for  # noqa: E402

STEPS = 48
GPU_ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=128, vocab_size=32000,
                   max_position_embeddings=131072, rope_parameters=dict(LLAMA3_ROPE))),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=128, vocab_size=32000,
                   tie_word_embeddings=True, use_sliding_window=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                     vocab_size=32000, sliding_window=32,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=128, vocab_size=32000,
                   max_position_embeddings=40960, tie_word_embeddings=True,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # Gemma at head_dim 128 and at the real models' 256 (gemma*_d256, below).
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=128, vocab_size=32000,
                    query_pre_attn_scalar=128, sliding_window=32, attn_logit_softcapping=50.0,
                    final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
                    max_position_embeddings=8192, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=128, vocab_size=32000,
                    query_pre_attn_scalar=128, sliding_window=32,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
                    tie_word_embeddings=True,
                    rope_parameters=copy.deepcopy(ARCHS["gemma3"][3]["rope_parameters"]))),
    "gemma2_d256": ("Gemma2Config", "Gemma2ForCausalLM",
                    dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=256,
                         vocab_size=32000, query_pre_attn_scalar=256, sliding_window=32,
                         attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                         hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192,
                         tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "gemma3_d256": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=256,
                         vocab_size=32000, query_pre_attn_scalar=256, sliding_window=32,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                         hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
                         tie_word_embeddings=True,
                         rope_parameters=copy.deepcopy(ARCHS["gemma3"][3]["rope_parameters"]))),
    # MoE: shapes the CUDA MoE layer tiles (hidden and expert widths multiples of 64).
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(hidden_size=512, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=128, vocab_size=32000,
                     num_local_experts=8, num_experts_per_tok=2, sliding_window=None,
                     max_position_embeddings=32768,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=128, vocab_size=32000, num_experts=16, num_experts_per_tok=4,
                       norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0],
                       max_position_embeddings=40960, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(hidden_size=512, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=8, num_key_value_heads=2, head_dim=64, vocab_size=32000,
                     num_local_experts=8, num_experts_per_tok=4, sliding_window=32,
                     layer_types=["sliding_attention", "full_attention"],
                     max_position_embeddings=131072, tie_word_embeddings=False,
                     rope_parameters=copy.deepcopy(ARCHS["gpt_oss"][3]["rope_parameters"]))),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                    dict(hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=16,
                         n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2,
                         first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=None,
                         qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, head_dim=64,
                         topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False,
                         routed_scaling_factor=1.0, vocab_size=32000,
                         max_position_embeddings=163840, rope_parameters=dict(YARN_ROPE))),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
                         num_hidden_layers=3, num_attention_heads=16, num_key_value_heads=16,
                         n_shared_experts=1, n_routed_experts=16, num_experts_per_tok=4,
                         first_k_dense_replace=1, n_group=4, topk_group=2, kv_lora_rank=512,
                         q_lora_rank=256, qk_rope_head_dim=64, qk_nope_head_dim=128,
                         v_head_dim=128, head_dim=64, norm_topk_prob=True,
                         routed_scaling_factor=2.5, vocab_size=32000,
                         max_position_embeddings=163840, rope_parameters=dict(YARN_ROPE))),
}


def build(arch, out_dir):
    cfg_cls, model_cls, kw = GPU_ARCHS[arch]
    config = getattr(transformers, cfg_cls)(**kw, bos_token_id=1, eos_token_id=2)
    model = getattr(transformers, model_cls)(config)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point() or "inv_freq" in name:
                continue
            sc, off = scale_for(arch, name, list(p.shape))
            p.copy_(torch.from_numpy(W.generate(name, list(p.shape), SEED, sc, off)))
    model.save_pretrained(out_dir)
    m, info = getattr(transformers, model_cls).from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    if any(v for k, v in info.items() if k != "error_msgs"):
        raise RuntimeError(f"{arch}: reload did not consume the checkpoint: {info}")
    return m.eval()


def run(arch, dump, max_gap, kv_dtype, work):
    model_dir = os.path.join(work, arch)
    hf = build(arch, model_dir)
    rng = np.random.default_rng(11)
    prompts = [[1] + [int(x) for x in rng.integers(3, 32000, n)] for n in (7, 33, 150, 400)]
    req = {"max_new_tokens": STEPS, "requests": [{"prompt_ids": p} for p in prompts]}
    rp, op = os.path.join(work, arch + "_req.json"), os.path.join(work, arch + "_out.json")
    with open(rp, "w") as f:
        json.dump(req, f)
    cmd = shlex.split(dump) + ["--model", model_dir, "--requests", rp, "--out", op,
                               "--device", "cuda", "--logits-top-k", "1", "--block-size", "64",
                               "--num-blocks", "64", "--max-batched-tokens", "512",
                               "--kv-cache-dtype", kv_dtype]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return {"arch": arch, "status": "load/run failed", "detail": p.stderr.strip()[-400:]}
    with open(op) as f:
        out = json.load(f)
    worst, diverged, rows = 0.0, 0, []
    for prompt, r in zip(prompts, out["requests"]):
        path = r["output_ids"]
        x = torch.tensor([prompt + path[:-1]])
        with torch.no_grad():
            logits = hf(input_ids=x).logits[0, len(prompt) - 1:].double()
        for k, tok in enumerate(path):
            row = logits[k]
            top = int(row.argmax())
            gap = float(row[top] - row[tok])
            if top != tok:
                diverged += 1
                rank = int((row > row[tok]).sum())
                rows.append({"prompt_len": len(prompt), "step": k, "server": tok, "hf_top": top,
                             "gap": gap, "rank": rank})
            worst = max(worst, gap)
    return {"arch": arch, "status": "ok" if worst <= max_gap else "FAIL", "steps":
            sum(len(r["output_ids"]) for r in out["requests"]), "divergences": diverged,
            "max_gap": worst, "worst": sorted(rows, key=lambda r: -r["gap"])[:5]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--max-gap", type=float, default=0.5)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    archs = [x for x in a.only.split(",") if x] or list(GPU_ARCHS)
    results = []
    with tempfile.TemporaryDirectory() as work:
        for arch in archs:
            try:
                results.append(run(arch, a.dump, a.max_gap, a.kv_cache_dtype, work))
            except Exception as e:  # one architecture's failure must not hide the others
                results.append({"arch": arch, "status": "error", "detail": repr(e)[-400:]})
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(results, f, indent=1)
    print(f"{'arch':14s} {'status':18s} {'steps':>6s} {'diverged':>9s} {'max gap':>8s}")
    for r in results:
        print(f"{r['arch']:14s} {r['status']:18s} {r.get('steps', 0):6d} "
              f"{r.get('divergences', 0):9d} {r.get('max_gap', float('nan')):8.3f}")
        if r["status"] != "ok":
            print("   ", r.get("detail") or r.get("worst"))
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
