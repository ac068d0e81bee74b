"""GPU fidelity against transformers, teacher-forced along the server's own path (runs on the GPU
machine, which has transformers; shapes the GPU kernels serve, so nothing here is committed).

For each architecture: a tiny transformers model with kernel-sized heads (head_dim 128; MLA with
the 512 + 64 latent), weights from tools/hf_fixtures/weights.py's generator, saved with
save_pretrained; llm-dump runs it greedily on the GPU (bf16 weights and cache); transformers' fp32
eager model then scores the server's whole path in one forward. At every step the gap
`transformers' top-1 logit - transformers' logit of the server's token` must stay below 0.5: a
larger gap is a wrong token, not a bf16 near-tie.

MoE models whose blocks route through `route_tokens_to_experts` (DeepSeek-V2 / V3) are also
checked routing by routing (tools/hf_fixtures/hf_routing.py; llm-dump --routing-out gives the
server's expert sets). A bf16 model's router logits differ from fp32 ones, so at a router
near-tie it may take another expert set, after which the whole step's logits move by whole logits
in a random tiny model: the literal gap then says nothing about the arithmetic. For these models:
  forced  transformers' fp32 model with the server's expert set at every (token, layer): every
          step's gap must stay below --max-gap (the arithmetic, routing held equal);
  routing every first routing difference (no difference at an earlier layer of this or an earlier
          position) must sit at a transformers decision margin (router-logit units) no larger
          than `tie`: the largest router-logit difference between transformers' own bf16 and
          fp32 models, both forced to the server's routing (what bf16 moves a router logit by);
  peer    transformers' own bf16 model decoding greedily, scored by the fp32 model along its own
          path: the literal gap a bf16 implementation of the reference reaches (reported).
The literal (free) gap is reported beside them.

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
from hf_routing import RouteHooks  # noqa: E402
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


def teacher_forced_gaps(model, prompt, path):
    """Per step of `path`: (gap, top-1, rank of the path's token) under `model` (fp32 logits)."""
    dev = next(model.parameters()).device
    x = torch.tensor([prompt + path[:-1]], device=dev)
    with torch.no_grad():
        logits = model(input_ids=x).logits[0, len(prompt) - 1:].double().cpu()
    out = []
    for k, tok in enumerate(path):
        row = logits[k]
        top = int(row.argmax())
        out.append((float(row[top] - row[tok]), top, int((row > row[tok]).sum())))
    return out


def greedy(model, prompt, steps):
    dev = next(model.parameters()).device
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids], device=dev)).logits[0, -1]
            ids.append(int(logits.float().argmax()))
    return ids[len(prompt):]


def routing_check(hf, hooks, hf16, hooks16, prompt, path, server_rows):
    """The routing comparison of one request (see the module docstring)."""
    L = len(prompt) + len(path) - 1
    srv = {}
    for pos, layer, experts in server_rows:
        srv[(pos, layer)] = sorted(experts)
    force = {}
    for layer in hooks.blocks:
        sets = [srv.get((p, layer)) for p in range(L)]
        if any(v is None for v in sets):
            raise RuntimeError(f"the server's routing lacks positions of layer {layer}")
        force[layer] = torch.tensor(sets, dtype=torch.long)
    # Free run: transformers' own routing and its margins.
    free = teacher_forced_gaps(hf, prompt, path)
    if not hooks.active():
        return None
    chosen = {l: hooks.records[l][1] for l in hooks.blocks}
    margin = {l: hooks.margins(l, hf) for l in hooks.blocks}
    # Forced runs, fp32 and bf16: the arithmetic under the server's routing, and bf16's router
    # logit error.
    hooks.force = force
    forced = teacher_forced_gaps(hf, prompt, path)
    l32 = {l: hooks.records[l][0] for l in hooks.blocks}
    hooks.force = None
    hooks16.force = force
    teacher_forced_gaps(hf16, prompt, path)
    hooks16.force = None
    if not (hooks.active() and hooks16.active()):
        return None
    tie = max(float((hooks16.records[l][0] - l32[l]).abs().max()) for l in hooks.blocks)
    diffs = sorted((p, l) for l in hooks.blocks for p in range(L)
                   if sorted(int(e) for e in chosen[l][p]) != srv[(p, l)])
    primary = [(p, l) for (p, l) in diffs
               if not any(p2 <= p and l2 < l for (p2, l2) in diffs)]
    return {"free": free, "forced": forced, "tie": tie, "diffs": len(diffs),
            "primary": [{"position": p, "layer": l, "margin": float(margin[l][p]),
                         "hf": sorted(int(e) for e in chosen[l][p]), "server": srv[(p, l)]}
                        for (p, l) in primary]}


def run(arch, dump, max_gap, kv_dtype, work, prompt_lens=(7, 33, 150, 400), device="cuda"):
    model_dir = os.path.join(work, arch)
    hf = build(arch, model_dir)
    hooks = RouteHooks(hf)
    rng = np.random.default_rng(11)
    prompts = [[1] + [int(x) for x in rng.integers(3, 32000, n)] for n in prompt_lens]
    req = {"max_new_tokens": STEPS, "requests": [{"prompt_ids": p} for p in prompts]}
    rp, op = os.path.join(work, arch + "_req.json"), os.path.join(work, arch + "_out.json")
    rop = os.path.join(work, arch + "_routing.json")
    with open(rp, "w") as f:
        json.dump(req, f)
    cmd = shlex.split(dump) + ["--model", model_dir, "--requests", rp, "--out", op,
                               "--device", device, "--logits-top-k", "1", "--block-size", "64",
                               "--num-blocks", "64", "--max-batched-tokens", "512",
                               "--kv-cache-dtype", kv_dtype]
    if hooks.active():
        cmd += ["--routing-out", rop]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return {"arch": arch, "status": "load/run failed", "detail": p.stderr.strip()[-400:]}
    with open(op) as f:
        out = json.load(f)
    routing = None
    if hooks.active():
        with open(rop) as f:
            routing = json.load(f)["requests"]
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        hf16 = getattr(transformers, GPU_ARCHS[arch][1]).from_pretrained(
            model_dir, dtype=torch.bfloat16, attn_implementation="eager").to(dev).eval()
        hooks16 = RouteHooks(hf16)
    worst, worst_forced, diverged, rows = 0.0, 0.0, 0, []
    tie, n_diffs, primary, peer = 0.0, 0, [], 0.0
    for i, (prompt, r) in enumerate(zip(prompts, out["requests"])):
        path = r["output_ids"]
        rc = None
        if routing is not None and hooks.active() and hooks16.active():
            rc = routing_check(hf, hooks, hf16, hooks16, prompt, path, routing[i]["routing"])
        if rc is not None:
            free, forced = rc["free"], rc["forced"]
            tie = max(tie, rc["tie"])
            n_diffs += rc["diffs"]
            primary += [dict(x, prompt_len=len(prompt)) for x in rc["primary"]]
            worst_forced = max([worst_forced] + [g for g, _, _ in forced])
            own = greedy(hf16, prompt, len(path))
            peer = max([peer] + [g for g, _, _ in teacher_forced_gaps(hf, prompt, own)])
        else:
            free = teacher_forced_gaps(hf, prompt, path)
        for k, (gap, top, rank) in enumerate(free):
            if top != path[k]:
                diverged += 1
                rows.append({"prompt_len": len(prompt), "step": k, "server": path[k],
                             "hf_top": top, "gap": gap, "rank": rank})
            worst = max(worst, gap)
    res = {"arch": arch, "steps": sum(len(r["output_ids"]) for r in out["requests"]),
           "divergences": diverged, "max_gap": worst,
           "worst": sorted(rows, key=lambda r: -r["gap"])[:5]}
    if routing is None or not hooks.active() or not hooks16.active():
        res["status"] = "ok" if worst <= max_gap else "FAIL"
        if hooks.broken or (routing is not None and hooks16.broken):
            res["detail"] = "routing hooks off: " + str(hooks.broken or hooks16.broken)
        return res
    worst_margin = max([x["margin"] for x in primary], default=0.0)
    res.update({"forced_max_gap": worst_forced, "routing_diffs": n_diffs,
                "primary_diffs": len(primary), "primary_max_margin": worst_margin, "tie": tie,
                "hf_bf16_max_gap": peer,
                "primary": sorted(primary, key=lambda x: -x["margin"])[:8]})
    ok = worst <= max_gap or (worst_forced <= max_gap and worst_margin <= tie)
    res["status"] = "ok" if ok else "FAIL"
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--max-gap", type=float, default=0.5)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--json-out")
    ap.add_argument("--prompt-lens", default="7,33,150,400",
                    help="prompt lengths after the BOS token")
    ap.add_argument("--device", default="cuda", help="the server's device (cpu: the oracle)")
    a = ap.parse_args()
    archs = [x for x in a.only.split(",") if x] or list(GPU_ARCHS)
    results = []
    with tempfile.TemporaryDirectory() as work:
        for arch in archs:
            try:
                lens = [int(x) for x in a.prompt_lens.split(",")]
                results.append(run(arch, a.dump, a.max_gap, a.kv_cache_dtype, work, lens,
                                   a.device))
            except Exception as e:  # one architecture's failure must not hide the others
                results.append({"arch": arch, "status": "error", "detail": repr(e)[-400:]})
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(results, f, indent=1)
    print(f"{'arch':14s} {'status':18s} {'steps':>6s} {'diverged':>9s} {'max gap':>8s} "
          f"{'forced':>7s} {'route diffs':>11s} {'primary':>8s} {'max margin':>10s} "
          f"{'tie':>7s} {'hf bf16':>8s}")
    nan = float("nan")
    for r in results:
        print(f"{r['arch']:14s} {r['status']:18s} {r.get('steps', 0):6d} "
              f"{r.get('divergences', 0):9d} {r.get('max_gap', nan):8.3f} "
              f"{r.get('forced_max_gap', nan):7.3f} {r.get('routing_diffs', 0):11d} "
              f"{r.get('primary_diffs', 0):8d} {r.get('primary_max_margin', nan):10.4f} "
              f"{r.get('tie', nan):7.4f} {r.get('hf_bf16_max_gap', nan):8.3f}")
        if r["status"] != "ok" or r.get("primary"):
            print("   ", r.get("detail") or r.get("worst"))
            if r.get("primary"):
                print("    primary routing differences:", r["primary"])
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
