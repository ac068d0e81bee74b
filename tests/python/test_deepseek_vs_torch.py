"""DeepSeek-V2 / V3 C++ CPU forward (llm-dump) against the independent PyTorch reference.

  /usr/bin/python3 -m pytest -q tests/python/test_deepseek_vs_torch.py --dump-bin BUILD/tools/llm-dump

Same contract and checks as test_forward_vs_torch.py (its helpers are reused): for each tiny
random model (MODELS) it runs llm-dump on single requests and on a staggered batch with chunked
prefill next to decoding, and asserts for every request and each of 32 generated tokens that the
fp32 logits agree with torch_deepseek within 1e-4 relative to the step's max |logit|, and that
the greedy tokens are torch's. The batch uses max-batched-tokens 16, so prefill chunks of more
than 4 rows (expanded-heads path) and of 1..4 rows (absorbed MLA kernel path) both occur.

Then:
  * fp8 latent cache: the V2 model with config "mla_cache_dtype": "fp8_e4m3" and per-layer
    `self_attn.kv_scale` tensors must stay close to torch fp32 (median per-step relative error;
    the median because an 8-bit latent can flip a near-tied MoE routing at some step, which
    moves that step's logits a lot) yet not match it to fp32 accuracy (the cache is really
    8-bit), and an absurd checkpoint scale must hurt clearly (the checkpoint scale is used).
  * negative check: one nudged kv_b_proj weight must make the comparison fail.
"""
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import pytest  # noqa: E402
import torch  # noqa: E402

import hf_deepseek_writer as dw  # noqa: E402
import test_forward_vs_torch as fvt  # noqa: E402  (run_dump, compare_request, check_steps, ...)
import torch_deepseek  # noqa: E402

# Seeds (which also fix the prompts) were picked so that along every greedy trajectory the
# torch top-1/top-2 logit gap is >= 1e-3 of max |logit| (10x the tolerance) and every MoE routing
# decision (k-th vs (k+1)-th expert score, last kept vs first dropped group) has a gap >= 1e-4,
# ~100x fp32 noise, so rounding cannot flip a token or an expert choice.
MODELS = [
    # q LoRA, softmax, group_limited_greedy, 2 shared experts, layer 0 dense, yarn with
    # mscale == mscale_all_dim (softmax scale * mscale^2, cos/sin factor 1).
    ("deepseek_v2_qlora_yarn", dw.v2_spec(seed=45)),
    # No q LoRA (q_proj), sigmoid + noaux_tc with correction bias, normalized top-k times 2.5,
    # 1 shared expert, yarn with mscale != mscale_all_dim, rms_norm_eps 1e-5.
    ("deepseek_v3_noaux_tc", dw.v3_spec(seed=30)),
    # V3 routing with q LoRA, bf16 weights, tied embeddings, no rope scaling, every other
    # layer MoE (moe_layer_freq 2), 4 layers, plain greedy top-k over sigmoid scores.
    ("deepseek_v3_qlora_bf16_tied", dw.v3_spec(
        seed=25, q_lora_rank=40, dtype="bf16", tie=True, yarn=None, layers=4,
        first_k_dense_replace=0, moe_layer_freq=2, topk_method="greedy")),
]
FP8_MEDIAN_BOUND = 0.08  # fp8 e4m3 latent vs fp32 torch: median over steps of rel err


def fp8_check(dump_bin, workdir, fails):
    """fp8 latent cache sanity: close to fp32 torch, not fp32-exact, and sensitive to the
    checkpoint's kv_scale."""
    name, spec = MODELS[0]
    rng = random.Random(11)
    prompt = [rng.randrange(spec.vocab) for _ in range(21)]
    ref = torch_deepseek.TorchDeepseek(dw.write_model(os.path.join(workdir, name), spec))
    med = {}
    # 0.02: |latent| <= ~3.5 maps to <= ~175 < 448. 1000: every latent below one e4m3 step.
    for tag, scale in (("good", 0.02), ("bad", 1000.0)):
        fspec = dw.v2_spec(seed=spec.seed, mla_cache_dtype="fp8_e4m3", kv_scale=scale)
        mdir = dw.write_model(os.path.join(workdir, f"{name}_fp8_{tag}"), fspec)
        try:
            res = fvt.run_dump(dump_bin, mdir, [(prompt, 0)], 32, os.path.join(workdir, f"fp8_{tag}"))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            fails.add(f"fp8/{tag}", str(e))
            return
        out = res["requests"][0]
        ids, cpp = out["output_ids"], torch.tensor(out["logits"])
        rows = ref.forward(prompt + ids[:-1])[len(prompt) - 1:]  # teacher-forced on fp8's tokens
        med[tag] = float(((cpp - rows).abs().max(-1).values / rows.abs().max(-1).values).median())
    print(f"  fp8 latent cache: median rel logit err vs fp32 torch {med['good']:.2e} "
          f"(kv_scale 0.02), {med['bad']:.2e} (kv_scale 1000)")
    if not 1e-4 < med["good"] < FP8_MEDIAN_BOUND:
        fails.add("fp8", f"median rel err {med['good']:.2e} with kv_scale 0.02 outside "
                         f"(1e-4, {FP8_MEDIAN_BOUND})")
    if not med["bad"] > 5 * med["good"]:
        fails.add("fp8", "kv_scale 1000 did not hurt accuracy: is the checkpoint scale used?")


def negative_check(workdir, name, spec, batch_result, fails):
    # One W_UK element of head 0 in layer 0: reaches the logits only through the latent
    # expansion / absorption.
    perturb = ("model.layers.0.self_attn.kv_b_proj.weight", (3, 5), 0.05)
    fvt.perturbed_check(name, batch_result, fails, perturb, lambda p: torch_deepseek.TorchDeepseek(
        dw.write_model(os.path.join(workdir, name + "_perturbed"), spec, perturb=p)))


def check_model(dump_bin, workdir, name, spec, fails):
    model_dir = dw.write_model(os.path.join(workdir, name), spec)
    ref = torch_deepseek.TorchDeepseek(model_dir)
    ref.routing_margins = []
    rng = random.Random(spec.seed)
    worst, min_margin, batch_result = 0.0, float("inf"), None
    runs = [(f"single_len{n}", [([rng.randrange(spec.vocab) for _ in range(n)], 0)], 32)
            for n in fvt.SINGLE_PROMPT_LENS]
    runs.append(("batch", [([rng.randrange(spec.vocab) for _ in range(n)], a)
                           for n, a in zip(fvt.BATCH["lens"], fvt.BATCH["arrivals"])],
                 fvt.BATCH["max_batched_tokens"]))
    for run_name, requests, mbt in runs:
        where = f"{name}/{run_name}"
        try:
            res = fvt.run_dump(dump_bin, model_dir, requests, mbt,
                               os.path.join(workdir, name + "_runs", run_name))
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
            fails.add(where, str(e))
            continue
        outs = res.get("requests", [])
        if len(outs) != len(requests):
            fails.add(where, f"OUT.json has {len(outs)} requests, expected {len(requests)}")
            continue
        fvt.check_steps(where, res, requests, mbt, fails, need_mixed=(run_name == "batch"))
        for r, ((prompt, _), out) in enumerate(zip(requests, outs)):
            err, margin = fvt.compare_request(ref, f"{where} request {r}", prompt, out, fails,
                                              greedy_loop=(run_name == "single_len7"))
            if err is not None:
                worst, min_margin = max(worst, err), min(min_margin, margin)
        if run_name == "batch":
            batch_result = (requests, outs)
    routing = min(ref.routing_margins) if ref.routing_margins else float("nan")
    print(f"  {name}: worst rel logit err {worst:.2e}, smallest torch top-2 margin "
          f"{min_margin:.2e} (relative to max |logit|), smallest routing gap {routing:.2e}")
    return batch_result


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def test_reference_self_check(workdir):
    torch_deepseek.self_check(os.path.join(workdir, "selfcheck"), verbose=False)


@pytest.mark.parametrize("name, spec", MODELS, ids=[m[0] for m in MODELS])
def test_model(option, workdir, name, spec):
    fails = fvt.Failures()
    batch = check_model(option("dump_bin"), str(workdir), name, spec, fails)
    if name == MODELS[0][0]:
        negative_check(str(workdir), name, spec, batch, fails)
    assert not fails.items, "DeepSeek llm-dump differs from torch:\n  " + "\n  ".join(fails.items)


def test_fp8_latent_cache(option, workdir):
    fails = fvt.Failures()
    fp8_check(option("dump_bin"), str(workdir), fails)
    assert not fails.items, "\n  ".join(fails.items)


if __name__ == "__main__":  # the same as /usr/bin/python3 -m pytest THIS_FILE [options]
    sys.exit(pytest.main([__file__] + sys.argv[1:]))
