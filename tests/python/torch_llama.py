#!/usr/bin/python3
"""Independent PyTorch reference forward for Llama / Mistral / Qwen2 checkpoints.

Deliberately simple: float32, full-sequence causal attention (with the sliding
window of Mistral / Qwen2 as a mask), no KV cache, no paging.  Follows the
Hugging Face modelling code conventions:
  * RMSNorm: x * rsqrt(mean(x^2) + eps) * w, computed in fp32.
  * RoPE in the "rotate_half" layout (first half / second half of each head,
    NOT interleaved pairs), inv_freq = 1/theta^(2i/d), llama3 scaling as in
    transformers' `_compute_llama3_parameters`.
  * GQA by repeating each kv head for its group of query heads.
  * SiLU(gate) * up MLP, tied embeddings when lm_head.weight is absent.
  * Sliding window W (transformers' sliding_window_overlay): a windowed layer's
    query i sees keys j with i - W < j <= i.  Mistral: every layer when
    sliding_window is not null.  Qwen2: only with use_sliding_window, on the
    layers layer_types calls "sliding_attention", or else on layers
    l >= max_window_layers (default 28); see layer_windows().

Reads safetensors with its own numpy parser (bf16 -> fp32 by shifting the 16
bits into the high half of a uint32).

  logits(model_dir, token_ids) -> torch.Tensor [len(token_ids), vocab]

Run this file directly to execute its self-checks (no C++ needed).
"""
import json
import math
import os
import struct
import sys
from typing import Dict, List, Sequence

import numpy as np
import torch

SUPPORTED_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


# ----------------------------------------------------------------------------
# safetensors reading


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    """Returns {name: fp32 numpy array} for one .safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[base + begin:base + end]
        shape, dt = info["shape"], info["dtype"]
        if dt == "F32":
            arr = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)  # exact
        elif dt == "BF16":
            # bf16 is the top half of an fp32: shift into place, reinterpret.
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        if arr.size != int(np.prod(shape)):
            raise ValueError(f"{path}: tensor {name}: {arr.size} elements for shape {shape}")
        out[name] = arr.reshape(shape)
    return out


def read_model_weights(model_dir: str) -> Dict[str, np.ndarray]:
    """Loads model.safetensors, or all shards named by the index file."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        weights = {}
        for fname in sorted(set(weight_map.values())):
            weights.update(read_safetensors(os.path.join(model_dir, fname)))
        missing = set(weight_map) - set(weights)
        if missing:
            raise ValueError(f"index names tensors not in shards: {sorted(missing)[:5]}")
        return weights
    return read_safetensors(os.path.join(model_dir, "model.safetensors"))


# ----------------------------------------------------------------------------
# RoPE


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """inv_freq[i] = 1 / theta^(2i/d), i = 0 .. d/2-1 (computed in float64)."""
    exps = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return 1.0 / (theta ** exps)


def llama3_inv_freq(inv_freq: torch.Tensor, rs: dict) -> torch.Tensor:
    """Vectorised llama3 frequency scaling, as transformers' _compute_llama3_parameters."""
    factor = rs["factor"]
    low, high = rs["low_freq_factor"], rs["high_freq_factor"]
    old_ctx = rs["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (low frequencies) are divided by `factor`...
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    # ...short ones are kept, and the band in between is interpolated smoothly.
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype=torch.float32):
    """cos/sin of shape [T, d] in the rotate_half layout (frequencies repeated twice)."""
    freqs = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [T, d/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [heads, T, d]; pairs dimension i with i + d/2 (HF convention)."""
    return x * cos + rotate_half(x) * sin


# ----------------------------------------------------------------------------
# Sliding window


def layer_windows(cfg: dict, n_layers: int) -> List:
    """Window size W of each layer, or None for full causal attention, as transformers
    reads the config (absent sliding_window: the config class default 4096)."""
    arch = cfg["architectures"][0]
    if arch == "MistralForCausalLM":
        return [cfg.get("sliding_window", 4096)] * n_layers
    if arch != "Qwen2ForCausalLM" or not cfg.get("use_sliding_window", False):
        return [None] * n_layers
    w = cfg.get("sliding_window", 4096)
    types = cfg.get("layer_types")
    if types is None:
        first = cfg.get("max_window_layers", 28)
        types = ["sliding_attention" if l >= first else "full_attention" for l in range(n_layers)]
    if len(types) != n_layers:
        raise ValueError(f"layer_types has {len(types)} entries for {n_layers} layers")
    return [w if t == "sliding_attention" else None for t in types]


# ----------------------------------------------------------------------------
# Model


class TorchLlama:
    """Loads a model directory once; `forward(ids)` returns [T, vocab] logits."""

    def __init__(self, model_dir: str, dtype=torch.float32):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        self.cfg, self.dtype = cfg, dtype
        arch = cfg["architectures"][0]
        if arch not in SUPPORTED_ARCHS:
            raise ValueError(f"unsupported architecture {arch}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError("only silu is supported")
        self.H = cfg["hidden_size"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg.get("num_key_value_heads") or self.n_heads
        self.head_dim = cfg.get("head_dim") or self.H // self.n_heads
        self.n_layers = cfg["num_hidden_layers"]
        self.windows = layer_windows(cfg, self.n_layers)  # per layer: W or None
        self.vocab = cfg["vocab_size"]
        self.eps = cfg["rms_norm_eps"]

        inv_freq = default_inv_freq(self.head_dim, cfg.get("rope_theta", 10000.0))
        rs = cfg.get("rope_scaling")
        if rs is not None:
            kind = rs.get("rope_type", rs.get("type"))
            if kind == "llama3":
                inv_freq = llama3_inv_freq(inv_freq, rs)
            elif kind != "default":
                raise NotImplementedError(f"rope_scaling type {kind}")
        self.inv_freq = inv_freq

        w = {k: torch.from_numpy(np.array(v)).to(dtype) for k, v in read_model_weights(model_dir).items()}
        self.embed = w["model.embed_tokens.weight"]
        tie = cfg.get("tie_word_embeddings", False)
        if tie and "lm_head.weight" in w:
            raise ValueError("tie_word_embeddings is true but lm_head.weight is present")
        self.lm_head = self.embed if tie else w["lm_head.weight"]
        self.final_norm = w["model.norm.weight"]
        self.layers = []
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            layer = {k[len(p):]: v for k, v in w.items() if k.startswith(p)}
            if arch == "Qwen2ForCausalLM":
                for n in ("q", "k", "v"):
                    if f"self_attn.{n}_proj.bias" not in layer:
                        raise ValueError(f"Qwen2 layer {i} lacks self_attn.{n}_proj.bias")
            self.layers.append(layer)
        assert self.embed.shape == (self.vocab, self.H), self.embed.shape

    def rms_norm(self, x, w):
        x32 = x.to(torch.float32)
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * w.to(torch.float32)).to(x.dtype)

    @staticmethod
    def linear(x, layer, name):
        y = x @ layer[name + ".weight"].T  # HF weights are [out, in]
        b = layer.get(name + ".bias")
        return y if b is None else y + b

    def attention(self, x, layer, cos, sin, window=None):
        T, D = x.shape[0], self.head_dim
        q = self.linear(x, layer, "self_attn.q_proj").view(T, self.n_heads, D).transpose(0, 1)
        k = self.linear(x, layer, "self_attn.k_proj").view(T, self.n_kv, D).transpose(0, 1)
        v = self.linear(x, layer, "self_attn.v_proj").view(T, self.n_kv, D).transpose(0, 1)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = self.n_heads // self.n_kv  # query heads h*group .. (h+1)*group-1 share kv head h
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(D)  # [heads, T, T]
        i = torch.arange(T)
        allowed = i[None, :] <= i[:, None]  # key position <= query position
        if window is not None:
            allowed &= i[:, None] - i[None, :] < window
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.softmax(scores.to(torch.float32), dim=-1).to(x.dtype) @ v  # [heads, T, D]
        return self.linear(out.transpose(0, 1).reshape(T, self.n_heads * D), layer, "self_attn.o_proj")

    def mlp(self, x, layer):
        gate = self.linear(x, layer, "mlp.gate_proj")
        up = self.linear(x, layer, "mlp.up_proj")
        return self.linear(torch.nn.functional.silu(gate) * up, layer, "mlp.down_proj")

    @torch.no_grad()
    def forward(self, token_ids: Sequence[int], start_pos: int = 0) -> torch.Tensor:
        """start_pos offsets RoPE positions (only used by the self-check)."""
        ids = torch.tensor(list(token_ids), dtype=torch.long)
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.vocab:
            raise ValueError("token ids must be non-empty and in [0, vocab)")
        positions = torch.arange(ids.numel()) + start_pos
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.dtype)
        h = self.embed[ids]
        for layer, window in zip(self.layers, self.windows):
            h = h + self.attention(self.rms_norm(h, layer["input_layernorm.weight"]), layer, cos, sin,
                                   window)
            h = h + self.mlp(self.rms_norm(h, layer["post_attention_layernorm.weight"]), layer)
        return self.rms_norm(h, self.final_norm) @ self.lm_head.T

    @torch.no_grad()
    def greedy(self, prompt: Sequence[int], n: int) -> List[int]:
        """Plain greedy decoding: full forward each step, argmax of the last row."""
        ids = list(prompt)
        for _ in range(n):
            ids.append(int(self.forward(ids)[-1].argmax()))
        return ids[len(prompt):]


_CACHE: Dict[str, TorchLlama] = {}


def load(model_dir: str) -> TorchLlama:
    """Cached TorchLlama for a directory (weights are read once)."""
    key = os.path.realpath(model_dir)
    if key not in _CACHE:
        _CACHE[key] = TorchLlama(model_dir)
    return _CACHE[key]


def logits(model_dir: str, token_ids: Sequence[int]) -> torch.Tensor:
    """[len(token_ids), vocab] fp32 logits; row t predicts token t+1."""
    return load(model_dir).forward(token_ids)


# ----------------------------------------------------------------------------
# Self-checks: verify the reference against second formulations.


def _llama3_scalar(freqs, factor, low, high, old_ctx):
    """Meta's original per-frequency loop (llama-models `apply_scaling`)."""
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old_ctx / high:
            out.append(f)
        elif wavelen > old_ctx / low:
            out.append(f / factor)
        else:
            s = (old_ctx / wavelen - low) / (high - low)
            out.append((1 - s) * f / factor + s * f)
    return torch.tensor(out, dtype=torch.float64)


def _rope_complex_interleaved(x, positions, inv_freq):
    """Meta-style RoPE: adjacent pairs (2i, 2i+1) as complex numbers times e^{i*pos*f}."""
    xc = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], -1, 2).contiguous())
    rot = torch.polar(torch.ones(len(positions), len(inv_freq), dtype=torch.float64),
                      positions.to(torch.float64)[:, None] * inv_freq[None, :])
    return torch.view_as_real(xc * rot).flatten(-2)


def _hf_to_interleaved(x):
    """HF checkpoints are Meta's q/k rows permuted (convert_llama_weights_to_hf);
    this undoes it on the head dim: [x0..x_{d/2-1}, y0..] -> [x0, y0, x1, y1, ...]."""
    d = x.shape[-1]
    return x.reshape(*x.shape[:-1], 2, d // 2).transpose(-1, -2).reshape(x.shape)


def self_check(workdir: str, verbose: bool = True) -> None:
    """Raises AssertionError when the reference disagrees with itself."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hf_model_writer as hw

    def say(msg):
        if verbose:
            print(f"[torch self-check] {msg}")

    # 1. llama3 scaling: vectorised HF form == Meta's scalar loop, and all three
    #    branches (kept / interpolated / divided) are exercised by the test config.
    rs = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
    base = default_inv_freq(16, 10000.0)
    ours = llama3_inv_freq(base, rs)
    meta = _llama3_scalar(base, 8.0, 1.0, 4.0, 64)
    assert torch.allclose(ours, meta, rtol=1e-12, atol=0), (ours, meta)
    ratio = base / ours
    assert (ratio == 1).any() and (ratio == 8).any() and ((ratio > 1) & (ratio < 8)).any(), ratio
    say(f"llama3 inv_freq matches scalar loop; base/scaled ratios {ratio.numpy().round(3).tolist()}")

    # 2. rotate_half RoPE on HF layout == complex RoPE on Meta (interleaved) layout.
    g = torch.Generator().manual_seed(0)
    for inv in (base, ours, default_inv_freq(32, 500000.0)):
        d = 2 * len(inv)
        x = torch.randn(3, 50, d, generator=g, dtype=torch.float64)
        pos = torch.arange(50) * 7  # include large angles
        cos, sin = rope_cos_sin(pos, inv, torch.float64)
        hf = apply_rope(x, cos, sin)
        meta_out = _rope_complex_interleaved(_hf_to_interleaved(x), pos, inv)
        assert torch.allclose(_hf_to_interleaved(hf), meta_out, atol=1e-10), "RoPE mismatch"
    say("rotate_half RoPE == complex interleaved RoPE on permuted layout")

    # 3. safetensors round trip, including the writer's bf16 rounding vs torch's.
    x = (torch.randn(1000, generator=g) * 3).to(torch.float32)
    x[:4] = torch.tensor([1.00390625, 1.01171875, -1.00390625, 0.0])  # exact ties
    bits_ref = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(hw.f32_to_bf16_bits(x.numpy()), bits_ref), "bf16 rounding != torch"
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "selfcheck.safetensors")
    hw.write_safetensors(path, {"a": (x.numpy().reshape(10, 100), "BF16"),
                                "b": (x.numpy()[:6].reshape(2, 3), "F16"),
                                "c": (x.numpy()[:5], "F32")}, {"format": "pt"})
    back = read_safetensors(path)
    assert np.array_equal(back["a"].ravel(), x.to(torch.bfloat16).float().numpy())
    assert np.array_equal(back["b"].ravel(), x[:6].half().float().numpy())
    assert np.array_equal(back["c"], x[:5].numpy())
    say("safetensors round trip (F32/F16/BF16) exact; bf16 rounding == torch")

    # 4. Whole model: causal invariance (appending tokens never changes earlier
    #    rows), greedy == argmax of teacher-forced rows, and fp32 vs fp64 agree.
    for spec in (hw.ModelSpec(arch="llama", rope_scaling_llama3=True, seed=11),
                 hw.ModelSpec(arch="qwen2", heads=4, kv_heads=4, tie=True, seed=12)):
        mdir = hw.write_model(os.path.join(workdir, f"selfcheck_{spec.arch}"), spec)
        m = TorchLlama(mdir)
        ids = torch.randint(0, spec.vocab, (40,), generator=g).tolist()
        full = m.forward(ids)
        for t in (1, 9, 25):
            assert torch.allclose(m.forward(ids[:t]), full[:t], rtol=0, atol=1e-4 * full.abs().max()), \
                f"{spec.arch}: logits at positions < {t} depend on later tokens"
        out = m.greedy(ids[:7], 10)
        tf = m.forward(ids[:7] + out[:-1])[6:]
        assert tf.argmax(-1).tolist() == out, "greedy != argmax of teacher-forced logits"
        m64 = TorchLlama(mdir, dtype=torch.float64)
        err = (m64.forward(ids).float() - full).abs().max() / full.abs().max()
        assert err < 1e-5, f"fp32 vs fp64 relative error {err}"
        # RoPE encodes relative positions: shifting all positions changes nothing...
        shifted = m64.forward(ids, start_pos=100).float()
        assert (shifted - full).abs().max() < 1e-4 * full.abs().max(), "RoPE not shift invariant"
        # ...but order matters: without RoPE, attention ignores key order and
        # swapping two earlier tokens would leave the last row unchanged.
        swapped = m.forward([ids[1], ids[0]] + ids[2:8])[-1]
        assert (swapped - full[7]).abs().max() > 1e-2 * full.abs().max(), "token order has no effect"
        say(f"{spec.arch}: causal invariance, greedy == teacher forcing, RoPE shift invariance, "
            f"fp32~fp64 (rel {err:.1e}) ok")

    # 5. Sliding window, by its receptive field: a windowed layer's row i sees rows i-W+1..i, so
    #    after L windowed layers the last row depends on exactly the last L*(W-1)+1 tokens (fp64,
    #    same absolute positions, so any difference beyond rounding is a dependency).
    W, L = 4, 3
    ids = torch.randint(0, 384, (30,), generator=g).tolist()
    for arch, first in (("mistral", None), ("qwen2", 0)):
        spec = hw.ModelSpec(arch=arch, layers=L, sliding_window=W, max_window_layers=first, seed=13)
        m = TorchLlama(hw.write_model(os.path.join(workdir, f"selfcheck_window_{arch}"), spec),
                       dtype=torch.float64)
        assert m.windows == [W] * L, m.windows
        full = m.forward(ids)[-1]
        keep = L * (W - 1) + 1
        s = len(ids) - keep
        cut = m.forward(ids[s:], start_pos=s)[-1]
        assert (cut - full).abs().max() < 1e-9 * full.abs().max(), f"{arch}: window reaches too far"
        shorter = m.forward(ids[s + 1:], start_pos=s + 1)[-1]
        assert (shorter - full).abs().max() > 1e-6 * full.abs().max(), f"{arch}: window too short"
        # A window wider than the sequence is plain causal attention.
        m.windows = [len(ids)] * L
        wide = m.forward(ids)
        m.windows = [None] * L
        assert torch.equal(wide, m.forward(ids)), f"{arch}: a wide window changes the result"
    say(f"window {W} over {L} layers: the last row depends on exactly the last {keep} tokens")
    # Qwen2 per layer: with the window only on layers >= 1, layer 0 still sees everything, so
    # the cut that was exact above now changes the last row.
    spec = hw.ModelSpec(arch="qwen2", layers=L, sliding_window=W, max_window_layers=1, seed=13)
    m = TorchLlama(hw.write_model(os.path.join(workdir, "selfcheck_window_qwen2_l1"), spec),
                   dtype=torch.float64)
    assert m.windows == [None, W, W], m.windows
    s = len(ids) - keep
    cut = m.forward(ids[s:], start_pos=s)[-1]
    full = m.forward(ids)[-1]
    assert (cut - full).abs().max() > 1e-6 * full.abs().max(), "qwen2: layer 0 was windowed"
    say("qwen2 max_window_layers=1: layer 0 attends to the whole prefix")


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        self_check(d)
    print("torch_llama self-check passed")
