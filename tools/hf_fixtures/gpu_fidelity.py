"""GPU fidelity against transformers, teacher-forced along the server's own path (runs on the GPU
machine, which has transformers; shapes the GPU kernels serve, so nothing here is committed).

For each architecture: a tiny transformers model with kernel-sized heads (head_dim 128; MLA with
the 512 + 64 latent; gpt_oss_issue at issue 51's shape), weights from
tools/hf_fixtures/weights.py's generator, saved with save_pretrained; llm-dump runs it greedily on
the GPU (bf16 weights and cache); transformers' fp32 eager model then scores the server's whole
path in one forward. At every step the gap is `transformers' top-1 logit - transformers' logit of
the server's token`.

Every divergence (transformers' fp32 top-1 is not the server's token) must be explained
(tools/hf_fixtures/fidelity_rule.py), else the script exits 1 naming the family, prompt, step,
gap and the nearest routing margin:
  near-tie the gap is below --max-gap (0.5): a bf16 near-tie, not a wrong token;
  routing  (MoE families) a first routing difference (the server's expert set is not
           transformers' fp32 one, with no difference at an earlier layer of this or an earlier
           position) at or before the step's position, whose transformers decision margin
           (router-logit units, tools/hf_fixtures/hf_routing.py) is at most `tie`: the largest
           router-logit difference between transformers' own bf16 and fp32 models, both forced to
           the server's routing, on the same prompt and path (what bf16 moves a router logit by).
A bf16 model's router logits differ from fp32 ones, so at a router near-tie it may take another
expert set, after which the whole step's logits move by whole logits in a random tiny model: the
literal gap then says nothing about the arithmetic. Reported beside the rule for MoE families
(tools/hf_fixtures/hf_routing.py hooks every family's router: gpt-oss, Mixtral, Qwen3-MoE,
DeepSeek-V2 / V3):
  forced   transformers' fp32 model with the server's expert set at every (token, layer): the
           gap with the routing held equal (the arithmetic), per divergence and its worst step;
  hf bf16  transformers' own bf16 model decoding greedily, scored by the fp32 model along its own
           path: the literal gap a bf16 implementation of the reference reaches; and per
           divergence whether transformers' bf16 model, along the server's path, takes the
           server's token too.

    python3 tools/hf_fixtures/gpu_fidelity.py --dump "DIR/.devpack/run llm-dump" [--only a,b]
        [--moe] [--max-gap 0.5] [--kv-cache-dtype auto] [--json-out F]
--moe runs every MoE family (MOE_ARCHS); --only picks entries of GPU_ARCHS; neither runs all.
"""

import argparse
import copy
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fidelity_rule as R  # noqa: E402
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
    # Issue 51's case (tests/gpu/test_gpt_oss_fidelity.cc's IssueShape): hidden 128, 4 layers, 4
    # query / 2 KV heads, head_dim 64, 8 experts top-2, expert intermediate 64, window 16, YaRN
    # rope_theta 150000, untied embeddings, GptOssConfig's vocabulary and positions. The CUDA MoE
    # layer serves it (MoeGemmShapeOk: gate_up n_out 64 % 32, down n_out 128 % 64, k 128 and 64
    # % 64).
    "gpt_oss_issue": ("GptOssConfig", "GptOssForCausalLM",
                      dict(hidden_size=128, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                           vocab_size=201088, num_local_experts=8, num_experts_per_tok=2,
                           sliding_window=16,
                           layer_types=["sliding_attention", "full_attention"] * 2,
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
    """One request's routing analysis (module docstring): None where the hooks gave up, else
    the free and forced fp32 steps, tie, the count of routing differences and the first ones."""
    L = len(prompt) + len(path) - 1  # positions the server computed (the last token is not fed)
    srv = {}
    for pos, layer, experts in server_rows:
        if pos < L:
            srv[(pos, layer)] = sorted(experts)
    layers = sorted({l for (_, l) in srv})
    if layers != sorted(hooks.blocks):
        raise RuntimeError(f"the server routes at layers {layers}, transformers at "
                           f"{sorted(hooks.blocks)}")
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
    hf_sets = {(p, l): hooks.chosen_sets[l][p].tolist() for l in hooks.blocks for p in range(L)}
    margins = {(p, l): float(hooks.margins(l)[p]) for l in hooks.blocks for p in range(L)}
    # Forced runs, fp32 and bf16: the arithmetic under the server's routing, and bf16's router
    # logit error.
    hooks.force = force
    try:
        forced = teacher_forced_gaps(hf, prompt, path)
    finally:
        hooks.force = None
    l32 = {l: hooks.records[l][0] for l in hooks.blocks}
    hooks16.force = force
    try:
        teacher_forced_gaps(hf16, prompt, path)
    finally:
        hooks16.force = None
    if not (hooks.active() and hooks16.active()):
        return None
    tie = max(float((hooks16.records[l][0] - l32[l]).abs().max()) for l in hooks.blocks)
    return {"free": free, "forced": forced, "tie": tie,
            "diffs": sum(srv[k] != hf_sets[k] for k in srv),
            "first": R.first_routing_differences(srv, hf_sets, margins)}


def run(arch, dump, max_gap, kv_dtype, work, prompt_lens=(7, 33, 150, 400), device="cuda"):
    model_dir = os.path.join(work, arch)
    hf = build(arch, model_dir)
    hooks = RouteHooks(hf)
    moe = hooks.rule is not None or hooks.broken is not None  # a family with routed experts
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
    if moe:
        cmd += ["--routing-out", rop]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return {"arch": arch, "status": "load/run failed", "detail": p.stderr.strip()[-400:]}
    with open(op) as f:
        out = json.load(f)
    routing, hf16, hooks16 = None, None, None
    if moe:
        with open(rop) as f:
            routing = json.load(f)["requests"]
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        hf16 = getattr(transformers, GPU_ARCHS[arch][1]).from_pretrained(
            model_dir, dtype=torch.bfloat16, attn_implementation="eager").to(dev).eval()
        hooks16 = RouteHooks(hf16)
    res = {"arch": arch, "steps": 0, "max_gap": 0.0, "rows": []}
    ties, firsts, n_diffs, worst_forced, peer = [], [], 0, 0.0, 0.0
    for i, (prompt, r) in enumerate(zip(prompts, out["requests"])):
        path = r["output_ids"]
        res["steps"] += len(path)
        rc = None
        if moe and hooks.active() and hooks16.active():
            rc = routing_check(hf, hooks, hf16, hooks16, prompt, path, routing[i]["routing"])
        if rc is not None:
            free, forced, tie, first = rc["free"], rc["forced"], rc["tie"], rc["first"]
            ties.append(tie)
            n_diffs += rc["diffs"]
            firsts += [dict(x, prompt_len=len(prompt), tie=tie) for x in first]
            worst_forced = max([worst_forced] + [g for g, _, _ in forced])
            own = greedy(hf16, prompt, len(path))
            peer = max([peer] + [g for g, _, _ in teacher_forced_gaps(hf, prompt, own)])
        else:
            free = teacher_forced_gaps(hf, prompt, path)
            forced, tie, first = None, None, []
        steps = [{"server": path[k], "hf_top": top, "gap": gap,
                  "forced": None if forced is None else forced[k][0]}
                 for k, (gap, top, _) in enumerate(free)]
        rows = R.classify_steps(steps, len(prompt), first, tie, max_gap)
        if rows and hf16 is not None:
            # Information only: does transformers' own bf16 model, along the same path, take the
            # server's token where its fp32 model does not?
            low = teacher_forced_gaps(hf16, prompt, path)
            for row in rows:
                row["hf_bf16_top"] = low[row["step"]][1]
        res["rows"] += [dict(x, prompt_len=len(prompt), tie=tie) for x in rows]
        res["max_gap"] = max([res["max_gap"]] + [g for g, _, _ in free])
    res.update(R.tally(res["rows"]))
    res["status"] = "ok" if res[R.UNEXPLAINED] == 0 else "FAIL"
    if moe and not (hooks.active() and hooks16 is not None and hooks16.active()):
        res["status"] = "FAIL"
        res["detail"] = "routing hooks off: " + str(hooks.broken or hooks16.broken)
        return res
    if moe:
        res.update({"forced_max_gap": worst_forced, "routing_diffs": n_diffs,
                    "first_diffs": len(firsts),
                    "first_max_margin": max([x["margin"] for x in firsts], default=0.0),
                    "first_beyond_tie": [x for x in firsts if x["margin"] > x["tie"]],
                    "tie": max(ties, default=0.0), "hf_bf16_max_gap": peer})
    return res


MOE_ARCHS = ["mixtral", "qwen3_moe", "gpt_oss", "gpt_oss_issue", "deepseek_v2", "deepseek_v3"]


def print_report(results):
    nan = float("nan")
    print(f"{'arch':14s} {'status':7s} {'steps':>5s} {'diverged':>8s} {'near-tie':>8s} "
          f"{'routing':>7s} {'unexpl.':>7s} {'max gap':>7s} {'forced':>7s} {'route diffs':>11s} "
          f"{'first':>5s} {'max margin':>10s} {'tie':>7s} {'hf bf16':>7s}")
    for r in results:
        print(f"{r['arch']:14s} {r['status']:7s} {r.get('steps', 0):5d} "
              f"{r.get('divergences', 0):8d} {r.get(R.NEAR_TIE, 0):8d} {r.get(R.ROUTING, 0):7d} "
              f"{r.get(R.UNEXPLAINED, 0):7d} {r.get('max_gap', nan):7.3f} "
              f"{r.get('forced_max_gap', nan):7.3f} {r.get('routing_diffs', 0):11d} "
              f"{r.get('first_diffs', 0):5d} {r.get('first_max_margin', nan):10.4f} "
              f"{r.get('tie', nan):7.4f} {r.get('hf_bf16_max_gap', nan):7.3f}")
    for r in results:
        if r.get("detail"):
            print(f"{r['arch']}: {r['status']}: {r['detail']}")
        for row in r.get("rows", []):
            line = R.describe(r["arch"], row["prompt_len"], row, row["tie"])
            if "hf_bf16_top" in row:
                same = row["hf_bf16_top"] == row["server"]
                line += f"; transformers' bf16 model {'also takes' if same else 'does not take'} " \
                        "the server's token here"
            print(("UNEXPLAINED " if row["cause"] == R.UNEXPLAINED else "  ") + line)
        for x in r.get("first_beyond_tie", []):
            print(f"  {r['arch']}: note: a first routing difference beyond tie (no divergence "
                  f"follows from it unless listed above): prompt of {x['prompt_len']} tokens, "
                  f"position {x['position']}, layer {x['layer']}, margin {x['margin']:.4g} > tie "
                  f"{x['tie']:.4g}, transformers {x['hf']} vs server {x['server']}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--only", default="", help="comma-separated entries of GPU_ARCHS")
    ap.add_argument("--moe", action="store_true",
                    help="every MoE family (" + ", ".join(MOE_ARCHS) + "), besides --only's")
    ap.add_argument("--max-gap", type=float, default=0.5)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--json-out")
    ap.add_argument("--prompt-lens", default="7,33,150,400",
                    help="prompt lengths after the BOS token")
    ap.add_argument("--device", default="cuda", help="the server's device (cpu: the oracle)")
    a = ap.parse_args()
    archs = [x for x in a.only.split(",") if x]
    if a.moe:
        archs += [x for x in MOE_ARCHS if x not in archs]
    archs = archs or list(GPU_ARCHS)
    unknown = [x for x in archs if x not in GPU_ARCHS]
    if unknown:
        ap.error(f"unknown entries {unknown}; known: {', '.join(GPU_ARCHS)}")
    results = []
    lens = [int(x) for x in a.prompt_lens.split(",")]
    with tempfile.TemporaryDirectory() as work:
        for arch in archs:
            t0 = time.time()
            try:
                results.append(run(arch, a.dump, a.max_gap, a.kv_cache_dtype, work, lens,
                                   a.device))
            except Exception as e:  # one architecture's failure must not hide the others
                results.append({"arch": arch, "status": "error", "detail": repr(e)[-400:]})
            results[-1]["seconds"] = time.time() - t0
            print(f"{arch}: {results[-1]['status']} ({results[-1]['seconds']:.0f} s)", flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(results, f, indent=1)
    print_report(results)
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
