"""Greedy tokens of tiny models against transformers' own (tests/fixtures/models/, written by
tools/hf_fixtures/make_fixtures.py with transformers 5.17, fp32, eager attention).

Each fixture is materialized (tools/hf_fixtures/weights.py) in the transformers 5 key layout
(config.json as transformers wrote it) and in the transformers 4 layout (config_v4.json), and run
through llm-dump on the CPU: the 64 greedy tokens must equal transformers' for every prompt, and
both layouts must give bit-identical logits. Architectures the server does not implement must be
refused at load with a message naming the architecture.

    LLM_DUMP_BIN=build/cpu/tools/llm-dump /usr/bin/python3 -m pytest tests/python/test_hf_fixtures.py
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "models")
sys.path.insert(0, os.path.join(ROOT, "tools", "hf_fixtures"))
import mxfp4  # noqa: E402
import weights as W  # noqa: E402

# Architectures the server implements; every other fixture must be refused by name.
SUPPORTED = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
             "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "MixtralForCausalLM",
             "Qwen3MoeForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "GptOssForCausalLM"}
# A divergence is accepted only where transformers' own top-2 logits are closer than this:
# fp32 sums in another order can then pick the other token.
NEAR_TIE = 1e-4
# fp32 sums in another order move a logit by far less than this (relative, or absolute below 1).
LOGIT_TOL = 1e-3
TOP_K = 5


def fixture_names():
    return sorted(d for d in os.listdir(FIXTURES)
                  if os.path.exists(os.path.join(FIXTURES, d, "reference.json")))


def load_ref(name):
    with open(os.path.join(FIXTURES, name, "reference.json")) as f:
        return json.load(f)


def dump_bin():
    b = os.environ.get("LLM_DUMP_BIN", os.path.join(ROOT, "build", "cpu", "tools", "llm-dump"))
    if not os.path.exists(b):
        pytest.fail(f"llm-dump not found at {b} (set LLM_DUMP_BIN)")
    return b


def run_dump(model_dir, ref, workdir):
    req = {"max_new_tokens": ref["steps"],
           "requests": [{"prompt_ids": p["prompt_ids"]} for p in ref["prompts"]]}
    req_path = os.path.join(workdir, "requests.json")
    out_path = os.path.join(workdir, "out.json")
    with open(req_path, "w") as f:
        json.dump(req, f)
    longest = max(len(p["prompt_ids"]) for p in ref["prompts"]) + ref["steps"]
    blocks = 4 * (longest // 16 + 2) * len(ref["prompts"])
    proc = subprocess.run([dump_bin(), "--model", model_dir, "--requests", req_path, "--out",
                           out_path, "--logits-top-k", str(TOP_K), "--num-blocks", str(blocks),
                           "--max-batched-tokens", "256"],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return None, proc.stderr
    with open(out_path) as f:
        return json.load(f), proc.stderr


def materialized(tmp_path_factory, name, layout):
    d = tmp_path_factory.mktemp(f"{name}_{layout}")
    model_dir = os.path.join(d, "model")
    W.materialize(os.path.join(FIXTURES, name), model_dir, layout)
    return str(d), model_dir


def check_greedy(ref, out):
    for i, (p, got) in enumerate(zip(ref["prompts"], out["requests"])):
        want = p["greedy"]
        ids = got["output_ids"]
        for step, (a, b) in enumerate(zip(want, ids)):
            if a == b:
                # Greedy tokens alone miss monotonic changes (a final logit soft-cap): the
                # chosen token's logit must be transformers' too.
                ref_logit, got_logit = p["top5"][step][0][1], got["logits"][step][0][1]
                assert abs(ref_logit - got_logit) <= LOGIT_TOL * max(1.0, abs(ref_logit)), (
                    f"prompt {i} step {step}: logit {got_logit}, transformers {ref_logit}")
                continue
            top = p["top5"][step]
            gap = top[0][1] - top[1][1]
            assert gap < NEAR_TIE and b == top[1][0], (
                f"prompt {i} step {step}: server chose {b}, transformers {a} "
                f"(transformers' top-5 {top}; server's top-5 {got['logits'][step]})")
            break  # the paths part at a near-tie: nothing after it is comparable
        else:
            assert len(ids) == len(want), f"prompt {i}: {len(ids)} tokens, want {len(want)}"


@pytest.mark.parametrize("name", fixture_names())
def test_greedy_matches_transformers(name, tmp_path_factory):
    ref = load_ref(name)
    arch = ref["architecture"]
    outs = {}
    for layout in ("v5", "v4"):
        work, model_dir = materialized(tmp_path_factory, name, layout)
        out, err = run_dump(model_dir, ref, work)
        if arch not in SUPPORTED:
            assert out is None, f"{arch} is not implemented but loaded"
            assert arch in err, f"the refusal must name {arch}: {err}"
            return
        assert out is not None, f"{name} ({layout} layout) failed to load or run:\n{err}"
        check_greedy(ref, out)
        outs[layout] = out
    for a, b in zip(outs["v5"]["requests"], outs["v4"]["requests"]):
        assert a["output_ids"] == b["output_ids"] and a["logits"] == b["logits"], (
            "the transformers 4 and 5 key layouts gave different logits")


def test_gpt_oss_mxfp4_experts_load_as_their_dequantized_values(tmp_path):
    """The gpt-oss fixture with its experts stored as MXFP4 (blocks + e8m0 scales in
    transformers' layout, quantization_config mxfp4) gives exactly the logits of the same model
    whose experts hold the dequantized fp32 values (mxfp4.dequantize follows transformers'
    convert routine): the MXFP4 load path adds nothing to what the fp32 path computes, which the
    test above checks against transformers. The gpt_oss_mxfp4 fixture checks an MXFP4 checkpoint
    against transformers itself (made on the GPU machine: make_fixtures.py --only gpt_oss_mxfp4)."""
    fixture = os.path.join(FIXTURES, "gpt_oss")
    ref = load_ref("gpt_oss")
    with open(os.path.join(fixture, "weights.json")) as f:
        manifest = json.load(f)
    with open(os.path.join(fixture, "config.json")) as f:
        cfg = json.load(f)
    quant, deq = [], []
    for name, a in W.tensors_of(manifest):
        if mxfp4.is_gpt_oss_expert(name):
            packed, values = mxfp4.gpt_oss_experts(name, a)
            quant += list(packed.items())
            deq.append((name, values))
        else:
            quant.append((name, a))
            deq.append((name, a))
    outs = []
    for tag, tensors, config in (
            ("mxfp4", quant, dict(cfg, quantization_config={"quant_method": "mxfp4"})),
            ("fp32", deq, cfg)):
        d = tmp_path / tag / "model"
        d.mkdir(parents=True)
        W.write_safetensors(str(d / "model.safetensors"), tensors)
        with open(d / "config.json", "w") as f:
            json.dump(config, f)
        out, err = run_dump(str(d), ref, str(d.parent))
        assert out is not None, f"{tag} checkpoint failed to load or run:\n{err}"
        outs.append(out)
    assert outs[0]["requests"] == outs[1]["requests"], "MXFP4 experts differ from their values"


# Per new architecture, a tensor only it reads: without it the load must fail naming it.
CHARACTERISTIC = {
    "mixtral": "model.layers.1.block_sparse_moe.experts.3.w3.weight",
    "qwen3_moe": "model.layers.1.mlp.gate.weight",
    "gemma2": "model.layers.1.pre_feedforward_layernorm.weight",
    "gemma3": "model.layers.2.self_attn.q_norm.weight",
    "gpt_oss": "model.layers.1.self_attn.sinks",
}


@pytest.mark.parametrize("name", sorted(CHARACTERISTIC))
def test_missing_or_extra_tensor_is_refused_by_name(name, tmp_path):
    ref = load_ref(name)
    with open(os.path.join(FIXTURES, name, "weights.json")) as f:
        manifest = json.load(f)
    tensors = list(W.tensors_of(manifest))
    drop = CHARACTERISTIC[name]
    assert drop in [n for n, _ in tensors]
    extra = ("model.layers.0.self_attn.unexpected.weight", tensors[0][1][:2])
    for tag, ts, want in (("missing", [t for t in tensors if t[0] != drop], drop),
                          ("extra", tensors + [extra], extra[0])):
        d = tmp_path / tag / "model"
        d.mkdir(parents=True)
        W.write_safetensors(str(d / "model.safetensors"), ts)
        with open(os.path.join(FIXTURES, name, "config.json")) as f:
            cfg = json.load(f)
        with open(d / "config.json", "w") as f:
            json.dump(cfg, f)
        out, err = run_dump(str(d), ref, str(d.parent))
        assert out is None, f"{name}: a checkpoint with a {tag} tensor loaded"
        assert want in err, f"{name}: the refusal must name {want}: {err}"


def test_weights_regenerate_as_recorded():
    """The generator reproduces the weights transformers was given (sha256 over the data)."""
    for name in fixture_names():
        path = os.path.join(FIXTURES, name, "weights.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            manifest = json.load(f)
        assert W.data_sha256(manifest) == manifest["sha256"], name
