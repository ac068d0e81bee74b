"""Writes the Hugging Face reference fixtures that CI compares against (run where transformers
and tokenizers are installed; CI itself has neither):

  tests/fixtures/tokenizers/NAME.json   HF tokenizers / transformers encodings and decodings of
                                        tests/fixtures/tokenizers/corpus.json
  tests/fixtures/models/ARCH/           a tiny model per architecture: config.json as
                                        transformers saved it, config_v4.json (the same model in
                                        the transformers 4 key layout), generation_config.json,
                                        weights.json (tools/hf_fixtures/weights.py regenerates the
                                        weights), reference.json (fp32 greedy tokens and top-5
                                        logits per step, by transformers)
  tests/fixtures/models/fp8_*/          pre-quantized fp8 checkpoints (weights committed) with
                                        references computed on their dequantized weights
  tests/fixtures/models/gpt_oss_mxfp4/  gpt-oss with MXFP4 experts (weights committed),
                                        reference over the dequantized experts

    python3 tools/hf_fixtures/make_fixtures.py --tokenizers DIR --out DIR [--only a,b]

DIR/NAME/tokenizer.json come from scripts/fetch_tokenizers.sh.
"""

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import traceback

import numpy as np
import torch
import transformers
import tokenizers
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mxfp4  # noqa: E402
import weights as W  # noqa: E402

torch.set_num_threads(max(1, os.cpu_count() or 1))
SEED = 20261202
STEPS = 64
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "日本語と English を混ぜた文章です。",
    "Once upon a time, in a land far away, there lived a dragon who loved to read books "
    "about the stars, the sea and the long winter nights.",
]

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
YARN_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
             "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
             "mscale": 0.707, "mscale_all_dim": 0.707}
DENSE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16)

# name: (config class, model class, tokenizer, config kwargs)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "llama3",
              dict(DENSE, max_position_embeddings=131072, rms_norm_eps=1e-5,
                   tie_word_embeddings=False, rope_parameters=dict(LLAMA3_ROPE))),
    "mistral": ("MistralConfig", "MistralForCausalLM", "llama2",
                dict(DENSE, max_position_embeddings=32768, sliding_window=24,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "qwen2_5",
              dict(DENSE, max_position_embeddings=32768, tie_word_embeddings=True,
                   use_sliding_window=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", "deepseek_v3",
                    dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2,
                         first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=None,
                         qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, head_dim=8,
                         topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False,
                         routed_scaling_factor=1.0, max_position_embeddings=163840,
                         tie_word_embeddings=False, rope_parameters=dict(YARN_ROPE))),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", "deepseek_v3",
                    dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                         n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2,
                         first_k_dense_replace=1, n_group=2, topk_group=1, kv_lora_rank=32,
                         q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                         head_dim=8, norm_topk_prob=True, routed_scaling_factor=2.5,
                         max_position_embeddings=163840, tie_word_embeddings=False,
                         rope_parameters=dict(YARN_ROPE))),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "qwen3",
              dict(DENSE, max_position_embeddings=40960, tie_word_embeddings=True,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "qwen3",
                  dict(DENSE, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                       norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0],
                       max_position_embeddings=40960, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", "llama2",
                dict(DENSE, num_local_experts=4, num_experts_per_tok=2,
                     max_position_embeddings=32768, sliding_window=None,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "gemma2",
               dict(DENSE, query_pre_attn_scalar=16, sliding_window=16,
                    attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192,
                    tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", "gemma3",
               dict(DENSE, num_hidden_layers=3, query_pre_attn_scalar=16, sliding_window=16,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
                    tie_word_embeddings=True,
                    rope_parameters={
                        "full_attention": {"rope_type": "linear", "factor": 8.0,
                                           "rope_theta": 1000000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", "gptoss",
                dict(DENSE, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                     sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                     max_position_embeddings=131072, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0,
                                      "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "original_max_position_embeddings": 4096,
                                      "truncate": False})),
}


def jdump(obj, path):
    with open(path, "w") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


# ---------------------------------------------------------------------------------------------
# Tokenizers


def tokenizer_fixture(name, tok_dir, corpus):
    fast = transformers.AutoTokenizer.from_pretrained(tok_dir)
    raw = tokenizers.Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    cases = []
    for text in corpus:
        ids = fast(text)["input_ids"]
        ids_ns = fast(text, add_special_tokens=False)["input_ids"]
        raw_ids = raw.encode(text, add_special_tokens=True).ids
        raw_ids_ns = raw.encode(text, add_special_tokens=False).ids
        cases.append({
            "text": text,
            "ids": ids,
            "ids_no_special": ids_ns,
            "raw_ids": raw_ids,
            "raw_ids_no_special": raw_ids_ns,
            "decoded": fast.decode(ids_ns),
            "decoded_with_special": fast.decode(ids),
            "decoded_skip_special": fast.decode(ids, skip_special_tokens=True),
            "raw_decoded": raw.decode(raw_ids_ns, skip_special_tokens=False),
        })
    return {
        "tokenizer": name,
        "transformers_version": transformers.__version__,
        "tokenizers_version": tokenizers.__version__,
        "tokenizer_class": type(fast).__name__,
        "bos_token": fast.bos_token, "bos_token_id": fast.bos_token_id,
        "eos_token": fast.eos_token, "eos_token_id": fast.eos_token_id,
        "add_bos_token": getattr(fast, "add_bos_token", None),
        "add_eos_token": getattr(fast, "add_eos_token", None),
        "clean_up_tokenization_spaces": getattr(fast, "clean_up_tokenization_spaces", None),
        "len": len(fast),
        "cases": cases,
    }


# ---------------------------------------------------------------------------------------------
# Models


def scale_for(arch, name, shape):
    """(scale, offset) of a tensor's uniform values: peaky logits, norms near their identity."""
    gemma = arch.startswith("gemma")
    if len(shape) == 1 and "norm" in name:
        return (0.3, 0.0) if gemma else (0.3, 1.0)
    if name.endswith("e_score_correction_bias"):
        return 0.5, 0.0
    if "bias" in name.split(".")[-1]:
        return 0.2, 0.0
    if name.endswith("sinks"):
        return 1.0, 0.0
    if "embed_tokens" in name or "lm_head" in name:
        return 1.0, 0.0
    if len(shape) >= 2:
        fan_in = shape[-1] if len(shape) == 2 else shape[-2]
        gain = 2.5 if (name.endswith("gate.weight") or "router" in name) else 1.5
        return gain / math.sqrt(fan_in), 0.0
    return 0.3, 0.0


def header_of(path):
    with safe_open(path, "pt") as f:
        return [(k, list(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype())
                for k in f.keys()]


def to_v4(cfg):
    """The transformers 4 key layout of a transformers 5 config: top-level rope_theta and
    rope_scaling (and Gemma 3's rope_local_base_freq) instead of rope_parameters."""
    d = json.loads(json.dumps(cfg))
    rp = d.pop("rope_parameters", None)
    if rp is None:
        return d
    if all(isinstance(v, dict) for v in rp.values()):  # per layer type
        full = dict(rp.get("full_attention", {}))
        slide = rp.get("sliding_attention", {})
        d["rope_theta"] = full.pop("rope_theta")
        if "rope_theta" in slide:
            d["rope_local_base_freq"] = slide["rope_theta"]
        d["rope_scaling"] = None if full.get("rope_type", "default") == "default" else full
        return d
    rp = dict(rp)
    d["rope_theta"] = rp.pop("rope_theta")
    d["rope_scaling"] = None if rp.get("rope_type", "default") == "default" and len(rp) <= 1 \
        else rp
    return d


def load_hf(model_cls, model_dir):
    m, info = getattr(transformers, model_cls).from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"}
    if bad or info.get("error_msgs"):
        raise RuntimeError(f"from_pretrained did not consume the checkpoint exactly: {info}")
    return m.eval()


@torch.no_grad()
def greedy(model, prompt_ids, steps=STEPS):
    ids = list(prompt_ids)
    out, tops, gaps = [], [], []
    for _ in range(steps):
        x = torch.tensor([ids])
        logits = model(input_ids=x, logits_to_keep=1).logits[0, -1].float()
        v, i = torch.topk(logits, 5)
        out.append(int(i[0]))
        tops.append([[int(a), float(b)] for a, b in zip(i.tolist(), v.tolist())])
        gaps.append(float(v[0] - v[1]))
        ids.append(int(i[0]))
    return out, tops, min(gaps)


def model_fixture(arch, tok_root, out_root):
    cfg_cls, model_cls, tok_name, kw = ARCHS[arch]
    tok = transformers.AutoTokenizer.from_pretrained(os.path.join(tok_root, tok_name))
    vocab = ((len(tok) + 63) // 64) * 64
    kw = dict(kw, vocab_size=vocab)
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = getattr(tok, k, None)
        if v is not None:
            kw[k] = v
    config = getattr(transformers, cfg_cls)(**kw)
    model = getattr(transformers, model_cls)(config)
    nparams = sum(p.numel() for p in model.parameters())
    if nparams > 80_000_000:
        raise RuntimeError(f"{arch}: {nparams} parameters: a config key was not taken")
    fixture = os.path.join(out_root, "models", arch)
    os.makedirs(fixture, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        files = sorted(os.listdir(tmp))
        st = [f for f in files if f.endswith(".safetensors")]
        if st != ["model.safetensors"]:
            raise RuntimeError(f"{arch}: unexpected checkpoint files {files}")
        header = header_of(os.path.join(tmp, "model.safetensors"))
        with open(os.path.join(tmp, "config.json")) as f:
            cfg_json = json.load(f)
        shutil.copyfile(os.path.join(tmp, "config.json"), os.path.join(fixture, "config.json"))
        if os.path.exists(os.path.join(tmp, "generation_config.json")):
            shutil.copyfile(os.path.join(tmp, "generation_config.json"),
                            os.path.join(fixture, "generation_config.json"))
    tensors = []
    for name, shape, dtype in header:
        scale, offset = scale_for(arch, name, shape)
        tensors.append({"name": name, "shape": shape, "hf_dtype": dtype, "scale": scale,
                        "offset": offset})
    manifest = {"seed": SEED, "generator": "splitmix64-uniform-f32 (tools/hf_fixtures/weights.py)",
                "tensors": tensors}
    manifest["sha256"] = W.data_sha256(manifest)
    jdump(manifest, os.path.join(fixture, "weights.json"))
    jdump(to_v4(cfg_json), os.path.join(fixture, "config_v4.json"))
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    jdump({"tokenizer": tok_name}, os.path.join(fixture, "reference.json"))
    with tempfile.TemporaryDirectory() as mdir, tempfile.TemporaryDirectory() as mdir4:
        W.materialize(fixture, mdir, "v5")
        W.materialize(fixture, mdir4, "v4")
        hf = load_hf(model_cls, mdir)
        refs = []
        min_gap = 1e9
        for p in prompts:
            toks, tops, gap = greedy(hf, p)
            min_gap = min(min_gap, gap)
            refs.append({"prompt_ids": p, "greedy": toks, "top5": tops, "min_gap": gap})
        # transformers itself must read the 4.x layout as the same model.
        hf4 = load_hf(model_cls, mdir4)
        x = torch.tensor([prompts[3]])
        with torch.no_grad():
            a = hf(input_ids=x).logits
            b = hf4(input_ids=x).logits
        v4_same = bool(torch.equal(a, b))
        v4_maxdiff = float((a - b).abs().max())
    ref = {"tokenizer": tok_name, "transformers_version": transformers.__version__,
           "torch_version": torch.__version__, "architecture": model_cls,
           "attn_implementation": "eager", "dtype": "float32", "steps": STEPS,
           "ignore_eos": True, "config_v4_identical_in_transformers": v4_same,
           "config_v4_max_abs_diff": v4_maxdiff, "min_gap": min_gap, "prompts": refs}
    jdump(ref, os.path.join(fixture, "reference.json"))
    return f"{arch}: {nparams} params, vocab {vocab}, min top1-top2 gap {min_gap:.4f}, " \
           f"v4 identical {v4_same} (max diff {v4_maxdiff:.3g})"


# ---------------------------------------------------------------------------------------------
# Pre-quantized fp8 checkpoints (weights committed: vocabulary 512, no tokenizer)

E4M3_MAX = 448.0


def quantize(w, scheme):
    """(e4m3 tensor, scale tensor, dequantized fp32) of a [out, in] weight."""
    if scheme == "channel":
        s = (w.abs().amax(dim=1, keepdim=True) / E4M3_MAX).clamp(min=1e-12)
        q = (w / s).to(torch.float8_e4m3fn)
        return q, s.float(), q.float() * s
    if scheme == "tensor":
        s = (w.abs().max() / E4M3_MAX).clamp(min=1e-12).reshape(1)
        q = (w / s).to(torch.float8_e4m3fn)
        return q, s.float(), q.float() * s
    if scheme == "block":
        o, i = w.shape
        bo, bi = (o + 127) // 128, (i + 127) // 128
        s = torch.zeros(bo, bi)
        q = torch.zeros(o, i, dtype=torch.float8_e4m3fn)
        deq = torch.zeros(o, i)
        for r in range(bo):
            for c in range(bi):
                blk = w[r * 128:(r + 1) * 128, c * 128:(c + 1) * 128]
                sc = (blk.abs().max() / E4M3_MAX).clamp(min=1e-12)
                qb = (blk / sc).to(torch.float8_e4m3fn)
                s[r, c] = sc
                q[r * 128:(r + 1) * 128, c * 128:(c + 1) * 128] = qb
                deq[r * 128:(r + 1) * 128, c * 128:(c + 1) * 128] = qb.float() * sc
        return q, s, deq
    raise ValueError(scheme)


def compressed_tensors_config(weights, activations, dynamic):
    """A compressed-tensors fp8 quantization_config: weight `weights` strategy (channel or
    tensor, static), input activation `activations` strategy, dynamic or static."""
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": weights,
                            "symmetric": True, "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": activations,
                                      "symmetric": True, "dynamic": dynamic}}},
            "ignore": ["lm_head"]}


FP8_FIXTURES = {
    # name: (arch of ARCHS, quantization_config, weight scheme, scale tensor name, extra tensors)
    "fp8_compressed_tensors_channel": (
        "llama", compressed_tensors_config("channel", "token", True), "channel", "weight_scale",
        False),
    "fp8_compressed_tensors_tensor": (
        "llama", compressed_tensors_config("tensor", "tensor", False), "tensor", "weight_scale",
        True),
    "fp8_modelopt": (
        "llama", {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": None,
                  "exclude_modules": ["lm_head"]}, "tensor", "weight_scale", True),
    "fp8_fbgemm": (
        "llama", {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                  "modules_to_not_convert": ["lm_head"]}, "channel", "weight_scale", False),
    "fp8_deepseek_v3_block": (
        "deepseek_v3", {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                        "weight_block_size": [128, 128]}, "block", "weight_scale_inv", False),
}


def fp8_fixture(name, out_root):
    arch, qcfg, scheme, scale_name, input_scale = FP8_FIXTURES[name]
    cfg_cls, model_cls, _, kw = ARCHS[arch]
    kw = dict(kw, vocab_size=512, bos_token_id=1, eos_token_id=2)
    if arch == "deepseek_v3":  # big enough for several 128x128 blocks, some of them partial
        kw.update(hidden_size=256, intermediate_size=320, moe_intermediate_size=192,
                  kv_lora_rank=160, q_lora_rank=144)
    config = getattr(transformers, cfg_cls)(**kw)
    model = getattr(transformers, model_cls)(config)
    fixture = os.path.join(out_root, "models", name)
    os.makedirs(fixture, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        header = header_of(os.path.join(tmp, "model.safetensors"))
        with open(os.path.join(tmp, "config.json")) as f:
            cfg_json = json.load(f)
    deq_state, q_state = {}, {}
    for tname, shape, _ in header:
        sc, off = scale_for(arch, tname, shape)
        w = torch.from_numpy(W.generate(tname, shape, SEED, sc, off))
        leaf = tname.split(".")[-2] if tname.endswith(".weight") else ""
        quantized = (len(shape) == 2 and tname.endswith(".weight") and "embed" not in tname
                     and "lm_head" not in tname and not tname.endswith("mlp.gate.weight")
                     and "norm" not in tname and leaf != "gate")
        if not quantized:
            q_state[tname] = w
            deq_state[tname] = w
            continue
        q, s, deq = quantize(w, scheme)
        if scheme == "tensor" and qcfg["quant_method"] == "modelopt":
            s = s.reshape(())
        q_state[tname] = q
        q_state[tname[:-len("weight")] + scale_name] = s.contiguous()
        if input_scale:
            q_state[tname[:-len("weight")] + "input_scale"] = (
                torch.tensor(0.05) if qcfg["quant_method"] == "modelopt"
                else torch.tensor([0.05]))
        deq_state[tname] = deq
    q_state = {k: v.contiguous() for k, v in q_state.items()}  # numpy views of transposes
    save_file(q_state, os.path.join(fixture, "model.safetensors"), metadata={"format": "pt"})
    qcfg_json = dict(cfg_json, quantization_config=qcfg)
    jdump(qcfg_json, os.path.join(fixture, "config.json"))
    jdump(to_v4(qcfg_json), os.path.join(fixture, "config_v4.json"))
    with tempfile.TemporaryDirectory() as tmp:  # from_pretrained maps checkpoint names
        save_file(deq_state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        jdump(cfg_json, os.path.join(tmp, "config.json"))
        model = load_hf(model_cls, tmp)
    rng = np.random.default_rng(7)
    refs, min_gap = [], 1e9
    for n in (5, 17, 40):
        p = [1] + [int(x) for x in rng.integers(3, 512, n)]
        toks, tops, gap = greedy(model, p)
        min_gap = min(min_gap, gap)
        refs.append({"prompt_ids": p, "greedy": toks, "top5": tops, "min_gap": gap})
    jdump({"tokenizer": None, "transformers_version": transformers.__version__,
           "torch_version": torch.__version__, "architecture": model_cls,
           "dtype": "float32 over the dequantized weights (e4m3 value * scale)",
           "quantization": qcfg, "steps": STEPS, "ignore_eos": True, "min_gap": min_gap,
           "prompts": refs}, os.path.join(fixture, "reference.json"))
    return f"{name}: {len(q_state)} tensors, min gap {min_gap:.4f}"


# ---------------------------------------------------------------------------------------------
# gpt-oss with MXFP4 experts (weights committed: vocabulary 512, no tokenizer)


def mxfp4_fixture(out_root):
    """gpt-oss with its stacked experts as MXFP4 blocks + e8m0 scales (transformers' checkpoint
    layout, quantization_config mxfp4); the reference is transformers' fp32 model over the
    dequantized values, and transformers' own MXFP4 loader (Mxfp4Config(dequantize=True)) must
    give the same logits."""
    arch = "gpt_oss"
    cfg_cls, model_cls, _, kw = ARCHS[arch]
    # intermediate != hidden: a transposed expert matrix cannot pass the shape checks.
    kw = dict(kw, vocab_size=512, bos_token_id=1, eos_token_id=2, intermediate_size=128)
    config = getattr(transformers, cfg_cls)(**kw)
    model = getattr(transformers, model_cls)(config)
    fixture = os.path.join(out_root, "models", "gpt_oss_mxfp4")
    os.makedirs(fixture, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        header = header_of(os.path.join(tmp, "model.safetensors"))
        with open(os.path.join(tmp, "config.json")) as f:
            cfg_json = json.load(f)
    deq_state, q_state = {}, {}
    for tname, shape, _ in header:
        sc, off = scale_for(arch, tname, shape)
        w = W.generate(tname, shape, SEED, sc, off)
        if mxfp4.is_gpt_oss_expert(tname):
            packed, values = mxfp4.gpt_oss_experts(tname, w)
            q_state.update({k: torch.from_numpy(v) for k, v in packed.items()})
            deq_state[tname] = torch.from_numpy(values)
        else:
            q_state[tname] = torch.from_numpy(w)
            deq_state[tname] = torch.from_numpy(w)
    qcfg = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    q_state = {k: v.contiguous() for k, v in q_state.items()}  # numpy views of transposes
    save_file(q_state, os.path.join(fixture, "model.safetensors"), metadata={"format": "pt"})
    qcfg_json = dict(cfg_json, quantization_config=qcfg)
    jdump(qcfg_json, os.path.join(fixture, "config.json"))
    jdump(to_v4(qcfg_json), os.path.join(fixture, "config_v4.json"))
    with tempfile.TemporaryDirectory() as tmp:
        save_file(deq_state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        jdump(cfg_json, os.path.join(tmp, "config.json"))
        model = load_hf(model_cls, tmp)
    rng = np.random.default_rng(11)
    refs, min_gap = [], 1e9
    for n in (5, 17, 40):
        # Of a few random prompts, the one whose 64 greedy steps stay furthest from a tie: a
        # near-tie ends what the CI comparison can check.
        best = None
        for _ in range(6):
            p = [1] + [int(x) for x in rng.integers(3, 512, n)]
            toks, tops, gap = greedy(model, p)
            if best is None or gap > best["min_gap"]:
                best = {"prompt_ids": p, "greedy": toks, "top5": tops, "min_gap": gap}
        min_gap = min(min_gap, best["min_gap"])
        refs.append(best)
    hf_loader = None
    try:  # transformers' own MXFP4 reading of the committed checkpoint
        hfq = getattr(transformers, model_cls).from_pretrained(
            fixture, dtype=torch.float32, attn_implementation="eager",
            quantization_config=transformers.Mxfp4Config(dequantize=True)).eval()
        ours, theirs = dict(model.named_parameters()), dict(hfq.named_parameters())
        weight_diff = {k: float((ours[k].float() - theirs[k].float()).abs().max())
                       for k in ours if mxfp4.is_gpt_oss_expert(k)}
        dtypes = sorted({str(theirs[k].dtype) for k in weight_diff})
        x = torch.tensor([refs[2]["prompt_ids"]])
        with torch.no_grad():
            a, b = model(input_ids=x).logits, hfq(input_ids=x).logits
        hf_loader = {"logits_identical": bool(torch.equal(a, b)),
                     "max_abs_logit_diff": float((a - b).abs().max()),
                     "max_abs_expert_weight_diff": max(weight_diff.values()),
                     "expert_dtypes": dtypes}
    except Exception as e:  # recorded, not fatal: the reference above does not depend on it
        hf_loader = f"not run: {type(e).__name__}: {e}"
    jdump({"tokenizer": None, "transformers_version": transformers.__version__,
           "torch_version": torch.__version__, "architecture": model_cls,
           "dtype": "float32 over the dequantized experts (FP4 value * 2^(scale - 127))",
           "quantization": qcfg, "steps": STEPS, "ignore_eos": True, "min_gap": min_gap,
           "transformers_mxfp4_loader": hf_loader,
           "prompts": refs}, os.path.join(fixture, "reference.json"))
    return f"gpt_oss_mxfp4: {len(q_state)} tensors, min gap {min_gap:.4f}, " \
           f"transformers' MXFP4 loader: {hf_loader}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizers", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    only = set(x for x in a.only.split(",") if x)
    here = os.path.dirname(os.path.abspath(__file__))
    corpus_path = os.path.join(here, "..", "..", "tests", "fixtures", "tokenizers", "corpus.json")
    with open(corpus_path) as f:
        corpus = json.load(f)
    summary, failures = [], 0
    os.makedirs(os.path.join(a.out, "tokenizers"), exist_ok=True)
    for name in sorted(os.listdir(a.tokenizers)):
        if only and name not in only and "tokenizers" not in only:
            continue
        try:
            fx = tokenizer_fixture(name, os.path.join(a.tokenizers, name), corpus)
            jdump(fx, os.path.join(a.out, "tokenizers", name + ".json"))
            summary.append(f"tokenizer {name}: {fx['tokenizer_class']}, {len(fx['cases'])} cases")
        except Exception:
            failures += 1
            summary.append(f"tokenizer {name}: FAILED\n{traceback.format_exc()}")
    for arch in ARCHS:
        if only and arch not in only and "models" not in only:
            continue
        try:
            summary.append(model_fixture(arch, a.tokenizers, a.out))
        except Exception:
            failures += 1
            summary.append(f"{arch}: FAILED\n{traceback.format_exc()}")
    for name in FP8_FIXTURES:
        if only and name not in only and "fp8" not in only:
            continue
        try:
            summary.append(fp8_fixture(name, a.out))
        except Exception:
            failures += 1
            summary.append(f"{name}: FAILED\n{traceback.format_exc()}")
    if not only or "gpt_oss_mxfp4" in only:
        try:
            summary.append(mxfp4_fixture(a.out))
        except Exception:
            failures += 1
            summary.append(f"gpt_oss_mxfp4: FAILED\n{traceback.format_exc()}")
    print("\n".join(summary))
    print(f"make_fixtures: {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
