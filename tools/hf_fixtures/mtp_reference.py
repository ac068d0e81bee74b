"""Reference logits of DeepSeek-V3's multi-token-prediction (MTP) layer for
tests/fixtures/models/deepseek_v3_mtp (CI: tests/unit/test_mtp_layer_reference.cc).

transformers does not implement the MTP layer, so the glue around it is written here from vLLM's
definition (vllm/model_executor/models/deepseek_mtp.py, DeepSeekMultiTokenPredictorLayer; the
EAGLE proposer in vllm/v1/spec_decode/eagle.py feeds it): a row at position i reads the token
after i, t_{i+1}, and a hidden state h,

    e = embed(t_{i+1}), zeroed where the position is 0
    x = eh_proj(cat([enorm(e), hnorm(h)]))          eh_proj: Linear(2 * hidden, hidden), no bias
    x = decoder layer N (MLA + MoE, its own norms)   N = num_hidden_layers, at position i
    logits = shared_head.head(shared_head.norm(x))

where h is the target's last hidden state at i after its final norm (DeepseekV2Model.forward
returns self.norm(...), which the proposer reads) for the rows over the prompt, and, for the
chained row at position n - 1 (reading the top token of the row at n - 2), that row's x before
shared_head.norm. The decoder layer and the norms come from one of two implementations:

  --impl transformers    transformers' own DeepseekV3DecoderLayer (loaded from the checkpoint by
                         from_pretrained with num_hidden_layers + 1 layers, so transformers
                         converts the MTP layer's expert tensors itself), DeepseekV3RMSNorm and
                         the target's last_hidden_state, eager attention, fp32. Needs
                         transformers 5.x (the GPU machine: torch 2.11, transformers 5.17).
  --impl torch_deepseek  tests/python/torch_deepseek.py, the independent PyTorch DeepSeek forward
                         the CPU tests compare against (torch 1.13 is enough).

The checkpoint itself (config.json, model.safetensors: fp32, a few hundred kilobytes, committed)
is written by --write-checkpoint from tools/hf_fixtures/weights.py's deterministic generator.

    /usr/bin/python3 tools/hf_fixtures/mtp_reference.py --write-checkpoint --impl torch_deepseek
    python3 tools/hf_fixtures/mtp_reference.py --impl transformers     (on the GPU machine)

Each run rewrites tests/fixtures/models/deepseek_v3_mtp/mtp_reference.json, whose "impl" says
which implementation computed it; --impl transformers also prints its largest difference from
torch_deepseek.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import weights as W  # noqa: E402

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "models", "deepseek_v3_mtp")
SEED = 20261206
PROMPTS = [[5, 17, 33, 2, 60, 17, 33, 9], [41, 3, 3, 28, 51, 12, 7, 44, 19, 30, 8, 22],
           [1, 63, 10]]

H, HEADS, KV_LORA, ROPE, NOPE, VDIM, VOCAB = 32, 2, 16, 8, 8, 8, 64
INTER, EXPERTS, MOE_INTER, LAYERS = 48, 8, 16, 2

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": H,
    "intermediate_size": INTER,
    "moe_intermediate_size": MOE_INTER,
    "num_hidden_layers": LAYERS,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": HEADS,
    "num_key_value_heads": HEADS,
    "q_lora_rank": None,
    "kv_lora_rank": KV_LORA,
    "qk_rope_head_dim": ROPE,
    "qk_nope_head_dim": NOPE,
    "v_head_dim": VDIM,
    "n_routed_experts": EXPERTS,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "n_group": 4,
    "topk_group": 2,
    "norm_topk_prob": True,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "vocab_size": VOCAB,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
}


def tensor_specs():
    """(name, shape, scale, offset): uniform(-scale, scale) + offset; linear weights with unit
    variance of their output for unit inputs, norm weights around 1."""
    specs = []

    def lin(name, out_f, in_f):
        specs.append((name, [out_f, in_f], math.sqrt(3.0 / in_f), 0.0))

    def norm(name, n):
        specs.append((name, [n], 0.3, 1.0))

    def layer(i):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        norm(p + "input_layernorm.weight", H)
        norm(p + "post_attention_layernorm.weight", H)
        lin(a + "q_proj.weight", HEADS * (NOPE + ROPE), H)
        lin(a + "kv_a_proj_with_mqa.weight", KV_LORA + ROPE, H)
        norm(a + "kv_a_layernorm.weight", KV_LORA)
        lin(a + "kv_b_proj.weight", HEADS * (NOPE + VDIM), KV_LORA)
        lin(a + "o_proj.weight", H, HEADS * VDIM)
        if i < CONFIG["first_k_dense_replace"]:
            for m, (o, n) in {"gate_proj": (INTER, H), "up_proj": (INTER, H),
                              "down_proj": (H, INTER)}.items():
                lin(p + f"mlp.{m}.weight", o, n)
            return
        specs.append((p + "mlp.gate.weight", [EXPERTS, H], 1.0, 0.0))
        specs.append((p + "mlp.gate.e_score_correction_bias", [EXPERTS], 0.1, 0.0))
        for e in [f"experts.{k}." for k in range(EXPERTS)] + ["shared_experts."]:
            lin(p + "mlp." + e + "gate_proj.weight", MOE_INTER, H)
            lin(p + "mlp." + e + "up_proj.weight", MOE_INTER, H)
            lin(p + "mlp." + e + "down_proj.weight", H, MOE_INTER)

    specs.append(("model.embed_tokens.weight", [VOCAB, H], 1.0, 0.0))
    for i in range(LAYERS):
        layer(i)
    norm("model.norm.weight", H)
    specs.append(("lm_head.weight", [VOCAB, H], 1.0, 0.0))
    # The MTP layer: its own head, the model's embedding (DeepSeek-V3 stores both per layer; a
    # layer without them shares the model's, which the C++ loader also accepts).
    p = f"model.layers.{LAYERS}."
    norm(p + "enorm.weight", H)
    norm(p + "hnorm.weight", H)
    lin(p + "eh_proj.weight", H, 2 * H)
    layer(LAYERS)
    norm(p + "shared_head.norm.weight", H)
    specs.append((p + "shared_head.head.weight", [VOCAB, H], 1.0, 0.0))
    return specs


def write_checkpoint(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")
    arrays = [(n, W.generate(n, s, SEED, sc, off)) for n, s, sc, off in tensor_specs()]
    W.write_safetensors(os.path.join(out_dir, "model.safetensors"), arrays)


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


class TorchDeepseekMtp:
    """The glue over tests/python/torch_deepseek.py's layer functions."""

    def __init__(self, model_dir):
        import torch_deepseek
        from torch_llama import read_model_weights
        self.td = torch_deepseek.TorchDeepseek(model_dir)
        p = f"model.layers.{self.td.n_layers}."
        self.mtp = {k[len(p):]: torch.from_numpy(np.array(v)) for k, v in
                    read_model_weights(model_dir).items() if k.startswith(p)}
        self.embed = self.mtp.get("embed_tokens.weight", self.td.embed)
        self.head = self.mtp.get("shared_head.head.weight", self.td.lm_head)

    @torch.no_grad()
    def target_hidden(self, ids):
        td = self.td
        cos, sin = td.cos_sin(torch.arange(len(ids)))
        h = td.embed[torch.tensor(ids)]
        for i, layer in enumerate(td.layers):
            h = h + td.attention(td.rms_norm(h, layer["input_layernorm.weight"], td.eps), layer,
                                 cos, sin)
            xn = td.rms_norm(h, layer["post_attention_layernorm.weight"], td.eps)
            h = h + (td.moe(xn, layer) if td.is_moe(i) else td.mlp(xn, layer, "mlp."))
        return td.rms_norm(h, td.final_norm, td.eps)

    @torch.no_grad()
    def mtp_rows(self, tokens, hidden):
        """Rows at positions 0..T-1 reading tokens[i] and hidden[i]: (x, logits)."""
        td, m = self.td, self.mtp
        T = len(tokens)
        e = self.embed[torch.tensor(tokens)].clone()
        e[0] = 0.0  # position 0
        x = torch.cat([rms(e, m["enorm.weight"], td.eps), rms(hidden, m["hnorm.weight"], td.eps)],
                      dim=-1) @ m["eh_proj.weight"].T
        cos, sin = td.cos_sin(torch.arange(T))
        x = x + td.attention(td.rms_norm(x, m["input_layernorm.weight"], td.eps), m, cos, sin)
        xn = td.rms_norm(x, m["post_attention_layernorm.weight"], td.eps)
        x = x + (td.moe(xn, m) if td.is_moe(td.n_layers) else td.mlp(xn, m, "mlp."))
        return x, rms(x, m["shared_head.norm.weight"], td.eps) @ self.head.T


class TransformersMtp:
    """transformers' DeepseekV3 modules with the same glue."""

    def __init__(self, model_dir):
        from safetensors.torch import load_file
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm
        kw = dict(dtype=torch.float32, attn_implementation="eager")
        self.target = DeepseekV3ForCausalLM.from_pretrained(model_dir, **kw).eval()
        cfg = DeepseekV3Config.from_pretrained(model_dir)
        n = cfg.num_hidden_layers
        cfg.num_hidden_layers = n + 1  # the MTP layer's decoder layer is layer n of the file
        full = DeepseekV3ForCausalLM.from_pretrained(model_dir, config=cfg, **kw).eval()
        self.block, self.rotary = full.model.layers[n], full.model.rotary_emb
        raw = load_file(os.path.join(model_dir, "model.safetensors"))
        p = f"model.layers.{n}."

        def norm(name):
            mod = DeepseekV3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            mod.weight.data.copy_(raw[p + name])
            return mod.eval()

        self.enorm, self.hnorm, self.shared_norm = (norm("enorm.weight"), norm("hnorm.weight"),
                                                    norm("shared_head.norm.weight"))
        self.eh_proj = torch.nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.eh_proj.weight.data.copy_(raw[p + "eh_proj.weight"])
        self.embed = raw.get(p + "embed_tokens.weight", raw["model.embed_tokens.weight"])
        self.head = raw.get(p + "shared_head.head.weight", raw["lm_head.weight"])

    @torch.no_grad()
    def target_hidden(self, ids):
        out = self.target.model(input_ids=torch.tensor([ids]))
        return out.last_hidden_state[0]

    @torch.no_grad()
    def mtp_rows(self, tokens, hidden):
        T = len(tokens)
        e = self.embed[torch.tensor(tokens)].clone()
        e[0] = 0.0
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(hidden)], dim=-1))[None]
        pos = torch.arange(T)[None]
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        out = self.block(x, attention_mask=mask, position_ids=pos,
                         position_embeddings=self.rotary(x, pos))
        x = (out[0] if isinstance(out, tuple) else out)[0]
        return x, self.shared_norm(x) @ self.head.T


def reference(impl):
    rows = []
    for prompt in PROMPTS:
        n = len(prompt)
        hidden = impl.target_hidden(prompt)  # [n, H]
        x, logits = impl.mtp_rows(prompt[1:], hidden[: n - 1])  # positions 0 .. n-2
        draft = int(logits[-1].argmax())
        # The chained row at n - 1 reads the draft and the last row's x; rows before it are the
        # same inputs again (causal attention: their outputs do not change).
        _, chained = impl.mtp_rows(prompt[1:] + [draft], torch.cat([hidden[: n - 1], x[-1:]]))
        rows.append({"prompt_ids": prompt, "draft": draft,
                     "logits": [[float(v) for v in r] for r in chained.tolist()]})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--impl", choices=["transformers", "torch_deepseek"], required=True)
    ap.add_argument("--write-checkpoint", action="store_true",
                    help="(re)write config.json and model.safetensors first")
    ap.add_argument("--fixture", default=FIXTURE)
    a = ap.parse_args()
    torch.manual_seed(0)
    if a.write_checkpoint:
        write_checkpoint(a.fixture)
    if a.impl == "transformers":
        import transformers
        impl, name = TransformersMtp(a.fixture), f"transformers {transformers.__version__}"
    else:
        impl, name = TorchDeepseekMtp(a.fixture), "tests/python/torch_deepseek.py"
    rows = reference(impl)
    if a.impl == "transformers":
        other = reference(TorchDeepseekMtp(a.fixture))
        diff = max(abs(x - y) for r, o in zip(rows, other)
                   for lr, lo in zip(r["logits"], o["logits"]) for x, y in zip(lr, lo))
        print(f"largest |logit| difference from torch_deepseek: {diff:.3g}")
    out = {"impl": name, "torch": torch.__version__,
           "definition": "vLLM DeepSeekMultiTokenPredictorLayer (see tools/hf_fixtures/"
                         "mtp_reference.py)",
           "rows": "per prompt: logits of the MTP rows at positions 0 .. n-2 (reading the prompt's "
                   "next token and the target's hidden state) then the chained row at n-1",
           "prompts": rows}
    with open(os.path.join(a.fixture, "mtp_reference.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.join(a.fixture, 'mtp_reference.json')} ({name})")


if __name__ == "__main__":
    sys.exit(main())
