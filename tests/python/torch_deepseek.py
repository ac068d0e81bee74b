#!/usr/bin/python3
"""Independent PyTorch reference forward for DeepSeek-V2 / DeepSeek-V3 checkpoints.

Written from the Hugging Face DeepSeek modelling code (modeling_deepseek.py shipped with the
deepseek-ai checkpoints), in its plain non-absorbed form: every token's latent is expanded to
full per-head keys and values, full-sequence causal attention, no cache, float32 (or float64).

  * Attention (MLA): q = q_b_proj(RMSNorm(q_a_proj(x))) or q_proj(x); kv_a_proj_with_mqa(x) ->
    compressed_kv [kv_lora_rank] ++ k_pe [qk_rope_head_dim]; k_nope, v = kv_b_proj(
    RMSNorm(compressed_kv)); q_a_layernorm / kv_a_layernorm use eps 1e-6 (the RMSNorm default,
    as HF constructs them), the decoder norms config.rms_norm_eps.
  * RoPE: apply_rotary_pos_emb first de-interleaves q_pe / k_pe ((d/2, 2) -> transpose), then
    rotate_half with cos/sin = cat(freqs, freqs) * _mscale.
  * YaRN (DeepseekV2YarnRotaryEmbedding): inv_freq blends freq_extra and freq_inter with the
    linear ramp over yarn_find_correction_range(beta_fast, beta_slow); _mscale =
    yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim); softmax_scale =
    qk_head_dim^-0.5 * yarn_get_mscale(factor, mscale_all_dim)^2 when mscale_all_dim is set.
  * MoE (MoEGate + moe_infer): softmax / sigmoid scores; greedy, group_limited_greedy (group =
    max score) or noaux_tc (choice = scores + e_score_correction_bias, group = sum of top-2,
    weights = unbiased scores); masked experts get 0.0; V3 normalizes (norm_topk_prob, top_k > 1)
    then multiplies by routed_scaling_factor, V2 normalizes OR multiplies. Plus shared experts.
  * Layer l is MoE iff n_routed_experts and l >= first_k_dense_replace and l % moe_layer_freq == 0.

Run this file directly to execute its self-checks (no C++ needed).
"""
import json
import math
import os
import sys
from typing import Dict, List, Sequence

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_llama import read_model_weights  # noqa: E402  (numpy safetensors reader)

LATENT_NORM_EPS = 1e-6


def yarn_get_mscale(scale=1.0, mscale=1.0):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_find_correction_dim(num_rotations, dim, base, max_pos):
    return (dim * math.log(max_pos / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_find_correction_range(low_rot, high_rot, dim, base, max_pos):
    low = math.floor(yarn_find_correction_dim(low_rot, dim, base, max_pos))
    high = math.ceil(yarn_find_correction_dim(high_rot, dim, base, max_pos))
    return max(low, 0), min(high, dim - 1)


def yarn_linear_ramp_mask(lo, hi, dim):
    if lo == hi:
        hi += 0.001
    return torch.clamp((torch.arange(dim, dtype=torch.float64) - lo) / (hi - lo), 0, 1)


def rope_params(cfg):
    """(inv_freq [d/2] float64, _mscale) of the rope part, as DeepseekV2(Yarn)RotaryEmbedding."""
    dim, base = cfg["qk_rope_head_dim"], cfg.get("rope_theta", 10000.0)
    freq_extra = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    rs = cfg.get("rope_scaling")
    if rs is None:
        return freq_extra, 1.0
    kind = rs.get("type", rs.get("rope_type"))
    if kind != "yarn":
        raise NotImplementedError(f"rope_scaling {kind}")
    factor = rs["factor"]
    freq_inter = freq_extra / factor
    low, high = yarn_find_correction_range(rs.get("beta_fast", 32), rs.get("beta_slow", 1), dim,
                                           base, rs.get("original_max_position_embeddings", 4096))
    inv_freq_mask = 1.0 - yarn_linear_ramp_mask(low, high, dim // 2)
    inv_freq = freq_inter * (1 - inv_freq_mask) + freq_extra * inv_freq_mask
    mscale = (yarn_get_mscale(factor, rs.get("mscale", 1))
              / yarn_get_mscale(factor, rs.get("mscale_all_dim", 0)))
    return inv_freq, mscale


def softmax_scale_of(cfg):
    scale = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    rs = cfg.get("rope_scaling")
    if rs is not None:
        mad = rs.get("mscale_all_dim", 0)
        if mad:
            m = yarn_get_mscale(rs["factor"], mad)
            scale = scale * m * m
    return scale


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(x, cos, sin):
    """HF DeepSeek: x [..., T, d]; de-interleave the (d/2, 2) pairs, then rotate_half."""
    *lead, d = x.shape
    x = x.reshape(*lead, d // 2, 2).transpose(-1, -2).reshape(*lead, d)
    return x * cos + rotate_half(x) * sin


class TorchDeepseek:
    """Loads a model directory once; `forward(ids)` returns [T, vocab] logits."""

    def __init__(self, model_dir: str, dtype=torch.float32):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        arch = cfg["architectures"][0]
        if arch not in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
            raise ValueError(f"unsupported architecture {arch}")
        self.cfg, self.dtype, self.v3 = cfg, dtype, arch == "DeepseekV3ForCausalLM"
        self.H = cfg["hidden_size"]
        self.n_heads = cfg["num_attention_heads"]
        self.q_lora = cfg.get("q_lora_rank")
        self.kv_lora = cfg["kv_lora_rank"]
        self.nope, self.rope = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
        self.v_dim = cfg["v_head_dim"]
        self.vocab = cfg["vocab_size"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.n_layers = cfg["num_hidden_layers"]
        self.inv_freq, self.mscale = rope_params(cfg)
        self.softmax_scale = softmax_scale_of(cfg)
        self.n_routed = cfg.get("n_routed_experts") or 0
        self.top_k = cfg.get("num_experts_per_tok")
        self.scoring = cfg.get("scoring_func", "sigmoid" if self.v3 else "softmax")
        self.topk_method = cfg.get("topk_method", "noaux_tc" if self.v3 else "greedy")
        if self.topk_method == "gready":
            self.topk_method = "greedy"
        self.n_group = cfg.get("n_group") or 1
        self.topk_group = cfg.get("topk_group") or 1
        self.norm_topk_prob = cfg.get("norm_topk_prob", self.v3)
        self.routed_scaling = cfg.get("routed_scaling_factor", 2.5 if self.v3 else 1.0)
        self.first_dense = cfg.get("first_k_dense_replace", 0)
        self.moe_freq = cfg.get("moe_layer_freq", 1)
        self.routing_margins = None  # a list: gate() appends each call's smallest routing gap

        w = {k: torch.from_numpy(np.array(v)).to(dtype) for k, v in read_model_weights(model_dir).items()}
        self.embed = w["model.embed_tokens.weight"]
        tie = cfg.get("tie_word_embeddings", False)
        self.lm_head = self.embed if tie else w["lm_head.weight"]
        self.final_norm = w["model.norm.weight"]
        self.layers = []
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            self.layers.append({k[len(p):]: v for k, v in w.items() if k.startswith(p)})

    def is_moe(self, i):
        return self.n_routed > 0 and i >= self.first_dense and i % self.moe_freq == 0

    @staticmethod
    def rms_norm(x, w, eps):
        x32 = x.to(torch.float32) if x.dtype != torch.float64 else x
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return w * y.to(x.dtype)

    @staticmethod
    def lin(x, layer, name):
        return x @ layer[name + ".weight"].T

    def cos_sin(self, positions):
        freqs = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.mscale).to(self.dtype), (emb.sin() * self.mscale).to(self.dtype)

    def project(self, x, layer, cos, sin):
        """Per-head q [H, T, qk] and k [H, T, qk], v [H, T, v] (expanded, roped) + the latent."""
        T, Hn = x.shape[0], self.n_heads
        if self.q_lora is None:
            q = self.lin(x, layer, "self_attn.q_proj")
        else:
            qa = self.rms_norm(self.lin(x, layer, "self_attn.q_a_proj"),
                               layer["self_attn.q_a_layernorm.weight"], LATENT_NORM_EPS)
            q = self.lin(qa, layer, "self_attn.q_b_proj")
        q = q.view(T, Hn, self.nope + self.rope).transpose(0, 1)
        q_nope, q_pe = torch.split(q, [self.nope, self.rope], dim=-1)
        ckv = self.lin(x, layer, "self_attn.kv_a_proj_with_mqa")
        compressed, k_pe = torch.split(ckv, [self.kv_lora, self.rope], dim=-1)
        k_pe = k_pe.view(1, T, self.rope)
        c = self.rms_norm(compressed, layer["self_attn.kv_a_layernorm.weight"], LATENT_NORM_EPS)
        kv = self.lin(c, layer, "self_attn.kv_b_proj").view(T, Hn, self.nope + self.v_dim).transpose(0, 1)
        k_nope, v = torch.split(kv, [self.nope, self.v_dim], dim=-1)
        q_pe = apply_rotary_pos_emb(q_pe, cos, sin)
        k_pe = apply_rotary_pos_emb(k_pe, cos, sin)
        query = torch.cat([q_nope, q_pe], dim=-1)
        key = torch.cat([k_nope, k_pe.expand(Hn, T, self.rope)], dim=-1)
        return query, key, v, c, k_pe[0]

    def attention(self, x, layer, cos, sin):
        T = x.shape[0]
        query, key, v, _, _ = self.project(x, layer, cos, sin)
        scores = (query @ key.transpose(1, 2)) * self.softmax_scale  # [H, T, T]
        i = torch.arange(T)
        scores = scores.masked_fill(~(i[None, :] <= i[:, None]), float("-inf"))
        p = torch.softmax(scores, dim=-1)
        out = (p @ v).transpose(0, 1).reshape(T, self.n_heads * self.v_dim)
        return self.lin(out, layer, "self_attn.o_proj")

    def mlp(self, x, layer, prefix):
        g = self.lin(x, layer, prefix + "gate_proj")
        u = self.lin(x, layer, prefix + "up_proj")
        return self.lin(torch.nn.functional.silu(g) * u, layer, prefix + "down_proj")

    def gate(self, x, layer):
        """MoEGate.forward: (topk_idx [T, k], topk_weight [T, k])."""
        n, E = x.shape[0], self.n_routed
        logits = x @ layer["mlp.gate.weight"].T
        if self.scoring == "softmax":
            scores = logits.softmax(dim=-1)
        elif self.scoring == "sigmoid":
            scores = logits.sigmoid()
        else:
            raise NotImplementedError(self.scoring)
        if self.topk_method == "greedy":
            topk_weight, topk_idx = torch.topk(scores, k=self.top_k, dim=-1, sorted=False)
        elif self.topk_method in ("group_limited_greedy", "noaux_tc"):
            noaux = self.topk_method == "noaux_tc"
            choice = scores + layer["mlp.gate.e_score_correction_bias"][None, :] if noaux else scores
            grouped = choice.view(n, self.n_group, -1)
            group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1) if noaux else grouped.max(dim=-1).values
            group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores)
            group_mask.scatter_(1, group_idx, 1)
            score_mask = group_mask.unsqueeze(-1).expand(n, self.n_group, E // self.n_group).reshape(n, -1)
            tmp = choice.masked_fill(~score_mask.bool(), float("-inf"))
            topk_weight, topk_idx = torch.topk(tmp, k=self.top_k, dim=-1, sorted=False)
            if noaux:
                topk_weight = scores.gather(1, topk_idx)
        else:
            raise NotImplementedError(self.topk_method)
        if self.routing_margins is not None:
            grouped_method = self.topk_method != "greedy"
            self._record_margins(tmp if grouped_method else scores,
                                 group_scores if grouped_method else None)
        normalize = self.top_k > 1 and self.norm_topk_prob
        if normalize:
            topk_weight = topk_weight / (topk_weight.sum(dim=-1, keepdim=True) + 1e-20)
        if self.v3 or not normalize:
            topk_weight = topk_weight * self.routed_scaling
        return topk_idx, topk_weight

    def _record_margins(self, selected_from, group_scores):
        """Smallest gaps that decide the routing, per token: k-th vs (k+1)-th selection score
        and topk_group-th vs next group score. A C++ run can only route differently from this
        reference where such a gap is within its rounding noise."""
        v = selected_from.sort(dim=-1, descending=True).values
        gaps = v[:, self.top_k - 1] - v[:, self.top_k]
        if group_scores is not None and self.topk_group < self.n_group:
            gv = group_scores.sort(dim=-1, descending=True).values
            gaps = torch.minimum(gaps, gv[:, self.topk_group - 1] - gv[:, self.topk_group])
        self.routing_margins.append(float(gaps.min()))

    def moe(self, x, layer):
        idx, weight = self.gate(x, layer)
        y = torch.zeros_like(x)
        for e in range(self.n_routed):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel():
                y[rows] += self.mlp(x[rows], layer, f"mlp.experts.{e}.") * weight[rows, slot, None]
        if "mlp.shared_experts.gate_proj.weight" in layer:
            y = y + self.mlp(x, layer, "mlp.shared_experts.")
        return y

    @torch.no_grad()
    def forward(self, token_ids: Sequence[int], start_pos: int = 0) -> torch.Tensor:
        ids = torch.tensor(list(token_ids), dtype=torch.long)
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.vocab:
            raise ValueError("token ids must be non-empty and in [0, vocab)")
        cos, sin = self.cos_sin(torch.arange(ids.numel()) + start_pos)
        h = self.embed[ids]
        for i, layer in enumerate(self.layers):
            h = h + self.attention(self.rms_norm(h, layer["input_layernorm.weight"], self.eps), layer, cos, sin)
            xn = self.rms_norm(h, layer["post_attention_layernorm.weight"], self.eps)
            h = h + (self.moe(xn, layer) if self.is_moe(i) else self.mlp(xn, layer, "mlp."))
        return self.rms_norm(h, self.final_norm, self.eps) @ self.lm_head.T

    @torch.no_grad()
    def greedy(self, prompt: Sequence[int], n: int) -> List[int]:
        ids = list(prompt)
        for _ in range(n):
            ids.append(int(self.forward(ids)[-1].argmax()))
        return ids[len(prompt):]


# ----------------------------------------------------------------------------
# Self-checks against second formulations.


def _complex_rope(x, positions, inv_freq, mscale):
    """transformers' native deepseek_v2 form: adjacent pairs (2i, 2i+1) as complex numbers."""
    xc = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], -1, 2).contiguous())
    rot = torch.polar(torch.full((len(positions), len(inv_freq)), float(mscale), dtype=torch.float64),
                      positions.to(torch.float64)[:, None] * inv_freq[None, :])
    return torch.view_as_real(xc * rot).flatten(-2)


def self_check(workdir: str, verbose: bool = True) -> None:
    import hf_deepseek_writer as dw

    def say(msg):
        if verbose:
            print(f"[torch_deepseek self-check] {msg}")

    g = torch.Generator().manual_seed(0)
    # 1. YaRN inv_freq: the three bands exist for the test config, mscale values as expected.
    cfg = dw.make_config(dw.v3_spec())
    inv, ms = rope_params(cfg)
    base = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))
    ratio = base / inv
    assert (ratio == 1).any() and (ratio == 4).any() and ((ratio > 1) & (ratio < 4)).any(), ratio
    assert abs(ms - (0.1 * math.log(4) + 1) / (0.08 * math.log(4) + 1)) < 1e-12
    assert abs(softmax_scale_of(cfg) - 32 ** -0.5 * (0.08 * math.log(4) + 1) ** 2) < 1e-12
    say(f"yarn inv_freq ratios {ratio.numpy().round(3).tolist()}, mscale {ms:.5f}")

    # 2. De-interleave + rotate_half == complex rotation of adjacent pairs, up to the output
    #    permutation, so q.k is the same in both formulations.
    d = 16
    pos = torch.arange(40) * 3
    cos = torch.cat([pos[:, None] * inv[None, :]] * 2, -1)
    cs, sn = cos.cos() * ms, cos.sin() * ms
    x = torch.randn(2, 40, d, generator=g, dtype=torch.float64)
    y = torch.randn(2, 40, d, generator=g, dtype=torch.float64)
    hf_x, hf_y = apply_rotary_pos_emb(x, cs, sn), apply_rotary_pos_emb(y, cs, sn)
    cx, cy = _complex_rope(x, pos, inv, ms), _complex_rope(y, pos, inv, ms)
    deint = lambda t: t.reshape(*t.shape[:-1], d // 2, 2).transpose(-1, -2).reshape(t.shape)  # noqa: E731
    assert torch.allclose(hf_x, deint(cx), atol=1e-12)
    assert torch.allclose(hf_x @ hf_y.transpose(1, 2), cx @ cy.transpose(1, 2), atol=1e-10)
    say("HF de-interleaved rope == complex pair rope (permuted), dot products equal")

    for name, spec in (("v2", dw.v2_spec(seed=3)), ("v3", dw.v3_spec(seed=4)),
                       ("v3_qlora", dw.v3_spec(seed=5, q_lora_rank=40))):
        mdir = dw.write_model(os.path.join(workdir, f"selfcheck_{name}"), spec)
        m = TorchDeepseek(mdir)
        ids = torch.randint(0, spec.vocab, (30,), generator=g).tolist()
        full = m.forward(ids)
        # 3. Absorbed attention (W_UK into q, W_UV after) == expanded, on layer 0.
        layer = m.layers[0]
        xh = m.embed[torch.tensor(ids)]
        xn = m.rms_norm(xh, layer["input_layernorm.weight"], m.eps)
        cs0, sn0 = m.cos_sin(torch.arange(len(ids)))
        query, key, v, c, k_pe = m.project(xn, layer, cs0, sn0)
        wkv = layer["self_attn.kv_b_proj.weight"].view(m.n_heads, m.nope + m.v_dim, m.kv_lora)
        w_uk, w_uv = wkv[:, :m.nope], wkv[:, m.nope:]
        q_lat = torch.einsum("htn,hnc->htc", query[..., :m.nope], w_uk)
        sc = (q_lat @ c.T + query[..., m.nope:] @ k_pe.T) * m.softmax_scale
        T = len(ids)
        i = torch.arange(T)
        sc = sc.masked_fill(~(i[None, :] <= i[:, None]), float("-inf"))
        out_abs = torch.einsum("htc,hvc->htv", torch.softmax(sc, -1) @ c, w_uv)
        sc2 = (query @ key.transpose(1, 2)) * m.softmax_scale
        out_exp = torch.softmax(sc2.masked_fill(~(i[None, :] <= i[:, None]), float("-inf")), -1) @ v
        err = (out_abs - out_exp).abs().max() / out_exp.abs().max()
        assert err < 1e-5, f"absorbed vs expanded attention {err}"
        # 4. Causal invariance, greedy == teacher forcing, fp32 ~ fp64.
        for t in (1, 9, 20):
            assert torch.allclose(m.forward(ids[:t]), full[:t], rtol=0, atol=1e-4 * full.abs().max())
        out = m.greedy(ids[:5], 8)
        assert m.forward(ids[:5] + out[:-1])[4:].argmax(-1).tolist() == out
        m64 = TorchDeepseek(mdir, dtype=torch.float64)
        e64 = (m64.forward(ids).float() - full).abs().max() / full.abs().max()
        assert e64 < 1e-5, f"fp32 vs fp64 {e64}"
        # 5. The router matters and, for noaux_tc, so does the correction bias (selection only).
        moe_layer = m.layers[1]
        xm = torch.randn(64, m.H, generator=g)
        idx, wt = m.gate(xm, moe_layer)
        if m.topk_method == "noaux_tc":
            bias = moe_layer["mlp.gate.e_score_correction_bias"]
            moe_layer["mlp.gate.e_score_correction_bias"] = torch.zeros_like(bias)
            idx0, _ = m.gate(xm, moe_layer)
            moe_layer["mlp.gate.e_score_correction_bias"] = bias
            changed = (idx.sort(-1).values != idx0.sort(-1).values).any(-1).float().mean()
            assert changed > 0.1, f"bias changes only {changed:.2f} of the routings"
            sig = (xm @ moe_layer["mlp.gate.weight"].T).sigmoid().gather(1, idx)
            assert torch.allclose(wt, sig / sig.sum(-1, keepdim=True) * m.routed_scaling, atol=1e-6)
            say(f"{name}: noaux_tc bias changes {changed:.0%} of routings; weights are unbiased")
        # Every chosen expert lies in one of the topk_group groups.
        per = m.n_routed // m.n_group
        groups = (idx // per)
        assert ((groups.max(-1).values - groups.min(-1).values) == 0).all() or m.topk_group > 1
        say(f"{name}: absorbed == expanded (rel {err:.1e}), causal, greedy, fp32~fp64 ({e64:.1e}) ok")


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        self_check(d)
    print("torch_deepseek self-check passed")
