"""End-to-end check of the C++ CPU forward pass against an independent PyTorch model.

  /usr/bin/python3 -m pytest -q tests/python/test_forward_vs_torch.py --dump-bin BUILD/tools/llm-dump

For each tiny random model (see MODELS) this writes an HF model directory, runs
`llm-dump` on (a) single requests and (b) a staggered batch that forces chunked
prefill next to decoding, and asserts for every request and each generated token:
  * C++ logits agree with torch: max|cpp - torch| / max|torch| <= 1e-4 per step;
  * output_ids are exactly torch's greedy continuation of the prompt;
  * the scheduler log is consistent (prefill token counts, budgets, arrivals) and
    the batch run contains a step where one request is mid-prefill while another
    decodes.
A negative check then perturbs one weight and asserts the comparison fails, so
the harness is shown to be able to fail.  The sliding-window models (Mistral,
every layer; Qwen2, layers >= max_window_layers) run prompts plus generations
far longer than their window, and a second negative check asserts that a torch
reference with the window ignored, off by one, or on the wrong layers is
flagged.
"""
import json
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import pytest  # noqa: E402
import torch  # noqa: E402

import hf_model_writer as hw  # noqa: E402
import torch_llama  # noqa: E402

REL_TOL = 1e-4
MAX_NEW = 32

# Each entry covers a different slice of the loader / forward pass.  Seeds (which
# also fix the prompts) were picked so that along every greedy trajectory the
# torch top-1/top-2 logit gap is >= 1e-3 of max|logit|: 10x the tolerance and ~1000x
# fp32 noise, so a correct C++ forward cannot flip a greedy token by rounding.
MODELS = [
    # GQA (4 q heads share 2 kv heads), llama3 RoPE scaling with all three bands hit.
    ("llama_gqa_rope3_f32", hw.ModelSpec(
        arch="llama", dtype="f32", hidden=64, intermediate=128, heads=4, kv_heads=2,
        layers=2, vocab=384, rope_scaling_llama3=True, max_pos=512, seed=6)),
    # bf16 weights in 2 shards + index, tied embeddings (no lm_head), MQA, explicit head_dim.
    ("llama_bf16_tied_2shards", hw.ModelSpec(
        arch="llama", dtype="bf16", hidden=128, intermediate=256, heads=4, kv_heads=1,
        head_dim=32, layers=3, vocab=512, tie=True, shards=2, rope_theta=500000.0, seed=102)),
    # q/k/v biases, plain multi-head attention, head_dim from hidden/heads.
    ("qwen2_mha_bias_f32", hw.ModelSpec(
        arch="qwen2", dtype="f32", hidden=96, intermediate=192, heads=6, kv_heads=6,
        layers=2, vocab=320, rope_theta=1000000.0, rms_norm_eps=1e-6, seed=7)),
    # fp16 weights; head_dim 32 != hidden/heads 16 (q_proj is [128, 64]).
    ("mistral_f16_headdim32", hw.ModelSpec(
        arch="mistral", dtype="f16", hidden=64, intermediate=160, heads=4, kv_heads=2,
        head_dim=32, layers=2, vocab=448, seed=22)),
    # Sliding window 5 on every layer (window_left 4); contexts reach 65 tokens.
    ("mistral_window5", hw.ModelSpec(
        arch="mistral", dtype="f32", hidden=64, intermediate=128, heads=4, kv_heads=2,
        layers=2, vocab=384, sliding_window=5, seed=46)),
    # Qwen2 with use_sliding_window: window 7 on layers 1 and 2 only (max_window_layers 1), MQA.
    ("qwen2_window7_layers12", hw.ModelSpec(
        arch="qwen2", dtype="bf16", hidden=64, intermediate=128, heads=4, kv_heads=1,
        layers=3, vocab=320, sliding_window=7, max_window_layers=1, seed=30)),
]

SINGLE_PROMPT_LENS = [1, 7, 33]  # 33 > max-batched-tokens 32: prefill spans two steps
BATCH = {"lens": [5, 17, 40, 3], "arrivals": [0, 0, 2, 5], "max_batched_tokens": 16}
ENGINE_ARGS = {"block_size": 16, "max_num_seqs": 8, "num_blocks": 256}
# Every layer windowed (Mistral): the batch runs in a pool smaller than its total context (193
# tokens in 8 x 16 slots), which works only because blocks that left the window return to the
# pool; other sequences then overwrite them, so reading one would break the match with torch.
WINDOW_BATCH_BLOCKS = 8


class Failures:
    """Collects failure messages so one run reports everything that differed."""

    def __init__(self, quiet=False):
        self.items, self.quiet = [], quiet

    def add(self, where, msg):
        self.items.append(f"{where}: {msg}")
        if not self.quiet:
            print(f"  FAIL {where}: {msg}")


def run_dump(dump_bin, model_dir, requests, max_batched_tokens, run_dir,
             num_blocks=ENGINE_ARGS["num_blocks"]):
    """Runs llm-dump on [(prompt_ids, arrival_step)]; returns the parsed OUT.json."""
    os.makedirs(run_dir, exist_ok=True)
    req_path, out_path = os.path.join(run_dir, "req.json"), os.path.join(run_dir, "out.json")
    with open(req_path, "w") as f:
        json.dump({"max_new_tokens": MAX_NEW,
                   "requests": [{"prompt_ids": p, "arrival_step": a} for p, a in requests]}, f)
    if os.path.exists(out_path):
        os.remove(out_path)
    cmd = [dump_bin, "--model", model_dir, "--requests", req_path, "--out", out_path,
           "--block-size", str(ENGINE_ARGS["block_size"]),
           "--max-batched-tokens", str(max_batched_tokens),
           "--max-num-seqs", str(ENGINE_ARGS["max_num_seqs"]),
           "--num-blocks", str(num_blocks)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"llm-dump exited with {proc.returncode}\n  cmd: {' '.join(cmd)}\n"
                           f"  stderr (tail): {proc.stderr[-2000:]}")
    with open(out_path) as f:
        return json.load(f)


def compare_request(ref, where, prompt, out, fails, greedy_loop=False):
    """Compares one request of OUT.json with the torch reference.
    Returns (max relative error, min torch top-1/top-2 margin) for the report."""
    ids, cpp_logits = out.get("output_ids", []), out.get("logits", [])
    if out.get("prompt_ids") != prompt:
        fails.add(where, "prompt_ids in OUT.json differ from the request")
        return None, None
    if len(ids) != MAX_NEW or len(cpp_logits) != MAX_NEW:
        fails.add(where, f"expected {MAX_NEW} output_ids/logits, got {len(ids)}/{len(cpp_logits)}")
        return None, None
    if any(len(row) != ref.vocab for row in cpp_logits):
        fails.add(where, f"a logits row does not have vocab_size={ref.vocab} entries")
        return None, None
    if not all(0 <= t < ref.vocab for t in ids):
        fails.add(where, f"output id out of range: {ids}")
        return None, None

    # One causal forward over prompt + outputs[:-1]: row len(prompt)-1+i holds the
    # logits after prompt + outputs[:i], i.e. the reference for step i.
    rows = ref.forward(prompt + ids[:-1])[len(prompt) - 1:]
    cpp = torch.tensor(cpp_logits, dtype=torch.float32)
    if not torch.isfinite(cpp).all():
        fails.add(where, "C++ logits contain NaN/Inf")
        return None, None

    # (1) logits agree step by step, relative to the step's largest |logit|.
    rel = (cpp - rows).abs().max(-1).values / rows.abs().max(-1).values.clamp_min(1e-6)
    bad = (rel > REL_TOL).nonzero().flatten().tolist()
    if bad:
        i = bad[0]
        j = int((cpp[i] - rows[i]).abs().argmax())
        fails.add(where, f"logits differ at {len(bad)}/{MAX_NEW} steps (first: step {i}, "
                         f"rel err {rel[i]:.3e} > {REL_TOL:g}; token {j}: cpp {cpp[i, j]:.6f} "
                         f"torch {rows[i, j]:.6f}); worst rel err {rel.max():.3e}")

    # (2) C++ picked the argmax of its own logits (contract: logits[i] chose output_ids[i]).
    cpp_arg = cpp.argmax(-1).tolist()
    if cpp_arg != ids:
        i = next(k for k in range(MAX_NEW) if cpp_arg[k] != ids[k])
        fails.add(where, f"output_ids[{i}]={ids[i]} is not argmax of its logits ({cpp_arg[i]})")

    # (3) torch's greedy generation equals output_ids.  If every teacher-forced row's
    # argmax equals the C++ token then, by induction, free-running torch greedy
    # produces exactly output_ids; greedy_loop=True also runs the literal loop.
    top2 = rows.topk(2, dim=-1).values
    margin = float(((top2[:, 0] - top2[:, 1]) / rows.abs().max(-1).values).min())
    torch_arg = rows.argmax(-1).tolist()
    if torch_arg != ids:
        i = next(k for k in range(MAX_NEW) if torch_arg[k] != ids[k])
        fails.add(where, f"greedy token {i} differs: C++ {ids[i]}, torch {torch_arg[i]} (torch "
                         f"logits {rows[i, ids[i]]:.5f} vs {rows[i, torch_arg[i]]:.5f}); C++ outputs {ids}")
    elif greedy_loop and ref.greedy(prompt, MAX_NEW) != ids:
        fails.add(where, "torch free-running greedy differs from output_ids")
    return float(rel.max()), margin


def check_steps(where, res, requests, max_batched_tokens, fails, need_mixed):
    """Checks the scheduler log; with need_mixed, asserts chunked prefill ran
    alongside decoding in some step."""
    steps = res.get("steps")
    if not steps:
        fails.add(where, "OUT.json has no 'steps' log")
        return
    n = len(requests)
    prefill_tokens, done_steps, first_step, decode_tokens = [0] * n, [[] for _ in range(n)], [None] * n, [0] * n
    mixed_step = None
    for st in steps:
        seqs = st.get("seqs", [])
        total = sum(s["num_tokens"] for s in seqs)
        if total > max_batched_tokens:
            fails.add(where, f"step {st['step']} schedules {total} tokens > max-batched-tokens {max_batched_tokens}")
        if len(seqs) > ENGINE_ARGS["max_num_seqs"]:
            fails.add(where, f"step {st['step']} has {len(seqs)} seqs > max-num-seqs")
        for s in seqs:
            r = s["request"]
            if not 0 <= r < n:
                fails.add(where, f"step {st['step']} names unknown request {r}")
                return
            if first_step[r] is None:
                first_step[r] = st["step"]
            if s["is_prefill"]:
                prefill_tokens[r] += s["num_tokens"]
                if s["prefill_done"]:
                    done_steps[r].append(st["step"])
            else:
                decode_tokens[r] += s["num_tokens"]
        mid_prefill = any(s["is_prefill"] and not s["prefill_done"] for s in seqs)
        decoding = any(not s["is_prefill"] for s in seqs)
        if mid_prefill and decoding and mixed_step is None:
            mixed_step = st["step"]
    for r, (prompt, arrival) in enumerate(requests):
        w = f"{where} request {r}"
        if first_step[r] is None:
            fails.add(w, "never scheduled")
            continue
        if first_step[r] < arrival:
            fails.add(w, f"scheduled at step {first_step[r]} before its arrival_step {arrival}")
        if prefill_tokens[r] != len(prompt):
            fails.add(w, f"prefill tokens sum to {prefill_tokens[r]}, prompt has {len(prompt)}")
        if len(done_steps[r]) != 1:
            fails.add(w, f"prefill_done reported in {len(done_steps[r])} steps, expected 1")
        # The first output comes from the prefill step; each later one needs one decode token
        # (an engine may also feed the last token back, hence the range).
        if not MAX_NEW - 1 <= decode_tokens[r] <= MAX_NEW:
            fails.add(w, f"{decode_tokens[r]} decode tokens for {MAX_NEW} outputs")
    if need_mixed:
        if mixed_step is None:
            fails.add(where, "no step had a request mid-prefill (is_prefill, not prefill_done) "
                             "together with a decoding request; chunked prefill was not exercised")
        else:
            print(f"  {where}: step {mixed_step} mixes a partial prefill with decoding")


def check_model(dump_bin, workdir, name, spec, fails):
    model_dir = hw.write_model(os.path.join(workdir, name), spec)
    ref = torch_llama.TorchLlama(model_dir)
    rng = random.Random(spec.seed)  # prompts are fixed per model
    worst, min_margin = 0.0, float("inf")
    batch_result = None

    runs = [(f"single_len{n}", [([rng.randrange(spec.vocab) for _ in range(n)], 0)], 32)
            for n in SINGLE_PROMPT_LENS]
    runs.append(("batch", [([rng.randrange(spec.vocab) for _ in range(n)], a)
                           for n, a in zip(BATCH["lens"], BATCH["arrivals"])],
                 BATCH["max_batched_tokens"]))
    for run_name, requests, mbt in runs:
        where = f"{name}/{run_name}"
        try:
            blocks = ENGINE_ARGS["num_blocks"]
            if run_name == "batch" and spec.arch == "mistral" and spec.sliding_window:
                blocks = WINDOW_BATCH_BLOCKS
            res = run_dump(dump_bin, model_dir, requests, mbt,
                           os.path.join(workdir, name + "_runs", run_name), blocks)
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
            fails.add(where, str(e))
            continue
        outs = res.get("requests", [])
        if len(outs) != len(requests):
            fails.add(where, f"OUT.json has {len(outs)} requests, expected {len(requests)}")
            continue
        check_steps(where, res, requests, mbt, fails, need_mixed=(run_name == "batch"))
        if blocks == WINDOW_BATCH_BLOCKS:
            # Without the window release this batch cannot fit and must preempt.
            preempted = sum(st.get("preempted", 0) for st in res.get("steps", []))
            if preempted:
                fails.add(where, f"{preempted} preemptions in a pool that fits the windows")
        for r, ((prompt, _), out) in enumerate(zip(requests, outs)):
            err, margin = compare_request(ref, f"{where} request {r}", prompt, out, fails,
                                          greedy_loop=(run_name != "batch"))
            if err is not None:
                worst, min_margin = max(worst, err), min(min_margin, margin)
        if run_name == "batch":
            batch_result = (requests, outs)
    print(f"  {name}: worst rel logit err {worst:.2e}, smallest torch top-2 margin "
          f"{min_margin:.2e} (relative to max |logit|)")
    return model_dir, batch_result


def perturbed_check(name, batch_result, fails, perturb, make_ref):
    """A copy of the model with one weight nudged (`perturb`; make_ref(perturb) writes it and
    returns its torch reference) must NOT match the C++ output of the original model; otherwise
    the comparison cannot detect anything."""
    if batch_result is None:
        fails.add(f"{name}/negative", "no batch output to check against")
        return
    ref = make_ref(perturb)
    sink = Failures(quiet=True)
    requests, outs = batch_result
    for r, ((prompt, _), out) in enumerate(zip(requests, outs)):
        compare_request(ref, f"request {r}", prompt, out, sink)
    if not sink.items:
        fails.add(f"{name}/negative", f"perturbing {perturb} went unnoticed: the comparison cannot fail")
    else:
        print(f"  negative check ok: perturbed model flagged ({len(sink.items)} findings, e.g. "
              f"{sink.items[0][:110]}...)")


def negative_check(workdir, name, spec, batch_result, fails):
    # 0.05 on one element of layer 0's k_proj: a change that has to travel through
    # RoPE and attention, and still only moves logits by ~1e-3 relative.
    perturb = ("model.layers.0.self_attn.k_proj.weight", (3, 5), 0.05)
    perturbed_check(name, batch_result, fails, perturb, lambda p: torch_llama.TorchLlama(
        hw.write_model(os.path.join(workdir, name + "_perturbed"), spec, perturb=p)))


def window_negative_check(model_dir, name, spec, batch_result, fails):
    """The C++ output of a windowed model must NOT match a torch reference whose window is
    ignored, off by one either way, or applied to the wrong layers."""
    if batch_result is None:
        fails.add(f"{name}/window-negative", "no batch output to check against")
        return
    ref = torch_llama.TorchLlama(model_dir)
    right = list(ref.windows)
    w = spec.sliding_window
    if not any(x is not None for x in right):
        fails.add(f"{name}/window-negative", f"torch reference has no windowed layer: {right}")
        return
    variants = {"ignored": [None] * len(right),
                "W+1": [x and x + 1 for x in right],
                "W-1": [x and x - 1 for x in right]}
    if spec.arch == "qwen2":
        variants["every layer"] = [w] * len(right)
        variants["max_window_layers+1"] = [None if l <= spec.max_window_layers else w
                                           for l in range(len(right))]
    requests, outs = batch_result
    for label, windows in variants.items():
        if windows == right:
            fails.add(f"{name}/window-negative", f"variant {label} equals the real windows")
            continue
        ref.windows = windows
        sink = Failures(quiet=True)
        for r, ((prompt, _), out) in enumerate(zip(requests, outs)):
            compare_request(ref, f"request {r}", prompt, out, sink)
        if not sink.items:
            fails.add(f"{name}/window-negative",
                      f"a torch reference with the window {label} ({windows}) matched too")
    print(f"  window negative check ok: {len(variants)} wrong windowings of {name} flagged")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # tiny matrices: threading overhead dominates


def test_reference_self_check(workdir):
    """Validates the torch reference itself, so a failure below points at C++."""
    torch_llama.self_check(os.path.join(workdir, "selfcheck"), verbose=False)


@pytest.mark.parametrize("name, spec", MODELS, ids=[m[0] for m in MODELS])
def test_model(option, workdir, name, spec):
    fails = Failures()
    model_dir, batch = check_model(option("dump_bin"), str(workdir), name, spec, fails)
    if spec.sliding_window is not None:
        window_negative_check(model_dir, name, spec, batch, fails)
    if name == MODELS[0][0]:
        negative_check(str(workdir), name, spec, batch, fails)
    assert not fails.items, "C++ llm-dump differs from the torch reference:\n  " + \
        "\n  ".join(fails.items)


if __name__ == "__main__":  # the same as /usr/bin/python3 -m pytest THIS_FILE [options]
    sys.exit(pytest.main([__file__] + sys.argv[1:]))
