"""transformers' MoE routing, observed and forced (tools/hf_fixtures/gpu_fidelity.py).

RouteHooks wraps the router module of every MoE block of a transformers model (`mlp.gate`, or
gpt-oss's `mlp.router`, whose class name ends in TopKRouter / TopkRouter; a layer without one,
a dense layer, is not an MoE layer). In transformers 5.x
these return (router_logits, top-k weights, top-k indices) and the block hands the last two to
its experts:
  GptOssTopKRouter    logits = x W^T + b; top-k of the logits; weights softmax(top-k logits)
  MixtralTopKRouter   logits = x W^T; top-k of softmax(logits); weights renormalized to sum 1
  Qwen3MoeTopKRouter  as Mixtral, renormalized only with norm_topk_prob; its first output is
                      softmax(logits) under the name router_logits (5.0): its log stands for the
                      logits (the same up to a per-token constant, which no decision, margin or
                      weight sees; where a probability underflows to 0 the logits are recomputed
                      from the router's input with its own weight, and checked)
  DeepseekV2 router   softmax top-k (topk_method greedy), times routed_scaling_factor
  DeepseekV3 router   sigmoid + e_score_correction_bias, top-2 sums pick topk_group of n_group
                      groups, top-k inside them; weights sigmoid, renormalized, scaled
One hook serves them all: each family is a RouterRule (its selection with its margin, and its
weight rule). At every call the hook recomputes transformers' weights for transformers' own
experts with the rule and its selection from the logits, and gives up (broken, with the reason)
where either disagrees, so a forced run is transformers' arithmetic with only the choice replaced.
Told to (force), it hands the block other expert sets (the server's) with the weights the rule
gives those experts, in the dtype and layout transformers used ([T, k], or the older [T, E]
scatter with a 2-tuple).

Margins are in router-logit units: the smallest change of every router logit (each moving by at
most m) that reorders the deciding pair to first order, i.e. half the logit gap between the k-th
and (k+1)-th expert for top-k of the logits, and for DeepSeek-V3 the score gap over the summed
sigmoid slopes of the deciding pair (the last kept and first dropped group, or expert). That is
the unit of `tie`, the largest change bf16 makes to any one router logit.
"""

import numpy as np
import torch
import torch.nn.functional as F


class Unsupported(Exception):
    """The router is not of the form a rule here describes."""


class TopKRule:
    """Top-k of the router logits (or of a monotone function of them, softmax)."""

    def __init__(self, config, weights):
        self.k = int(config.num_experts_per_tok)
        self._weights = weights

    def weights(self, logits, idx):
        return self._weights(logits, idx)

    def select(self, l, bias=None):
        T, E = l.shape
        order = np.argsort(-l, axis=1, kind="stable")
        chosen = np.sort(order[:, :self.k], axis=1)
        if self.k >= E:
            return chosen, np.full(T, np.inf)
        s = np.take_along_axis(l, order, 1)
        return chosen, (s[:, self.k - 1] - s[:, self.k]) / 2.0


class SigmoidGroupsRule:
    """DeepSeek-V3: sigmoid scores plus the correction bias choose; groups by their top-2 sums."""

    def __init__(self, config):
        self.k = int(config.num_experts_per_tok)
        self.n_group, self.topk_group = int(config.n_group), int(config.topk_group)
        self.norm = bool(getattr(config, "norm_topk_prob", False))
        self.scale = float(getattr(config, "routed_scaling_factor", 1.0))

    def weights(self, logits, idx):
        w = logits.sigmoid().gather(1, idx)
        if self.norm and idx.shape[1] > 1:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return w * self.scale

    def select(self, l, bias=None):
        T, E = l.shape
        per = E // self.n_group
        chosen, out = np.empty((T, self.k), dtype=np.int64), np.empty(T)
        for t in range(T):
            sg = 1.0 / (1.0 + np.exp(-l[t]))
            slope = sg * (1.0 - sg)
            ch = sg + (bias if bias is not None else 0.0)
            g = ch.reshape(self.n_group, per)
            top2 = np.argsort(-g, axis=1, kind="stable")[:, :2]
            gs = np.take_along_axis(g, top2, 1).sum(1)
            gorder = np.argsort(-gs, kind="stable")
            m = np.inf
            if self.topk_group < self.n_group:
                a, b = gorder[self.topk_group - 1], gorder[self.topk_group]
                sl = slope.reshape(self.n_group, per)
                d = sl[a, top2[a]].sum() + sl[b, top2[b]].sum()
                m = min(m, (gs[a] - gs[b]) / max(d, 1e-12))
            keep = np.zeros(E, dtype=bool)
            for grp in gorder[:self.topk_group]:
                keep[grp * per:(grp + 1) * per] = True
            masked = np.where(keep, ch, -np.inf)  # dropped groups never compete
            eorder = np.argsort(-masked, kind="stable")
            chosen[t] = np.sort(eorder[:self.k])
            if self.k < E:
                i, j = eorder[self.k - 1], eorder[self.k]
                if keep[j]:
                    m = min(m, (masked[i] - masked[j]) / max(slope[i] + slope[j], 1e-12))
            out[t] = m
        return chosen, out


def _softmax_topk(renorm, eps=0.0, scale=1.0):
    def w(logits, idx):
        p = logits.softmax(dim=-1).gather(1, idx)
        if renorm:
            p = p / (p.sum(dim=-1, keepdim=True) + eps)
        return p * scale
    return w


def rule_for(config):
    """The RouterRule of a transformers config, or None for a model without routed experts."""
    t = getattr(config, "model_type", "")
    if t == "gpt_oss":
        return TopKRule(config, lambda logits, idx: logits.gather(1, idx).softmax(dim=-1))
    if t == "mixtral":
        return TopKRule(config, _softmax_topk(True))
    if t == "qwen3_moe":
        return TopKRule(config, _softmax_topk(bool(config.norm_topk_prob)))
    if t == "deepseek_v2":
        if getattr(config, "topk_method", "greedy") != "greedy":
            raise Unsupported(f"deepseek_v2 topk_method {config.topk_method} (greedy only)")
        norm = bool(getattr(config, "norm_topk_prob", False)) and config.num_experts_per_tok > 1
        return TopKRule(config, _softmax_topk(norm, 1e-20,
                                              float(getattr(config, "routed_scaling_factor", 1.0))))
    if t == "deepseek_v3":
        return SigmoidGroupsRule(config)
    return None


def _is_distribution(x):
    return bool((x >= 0).all()) and bool(torch.allclose(x.sum(dim=-1), torch.ones_like(x[:, 0]),
                                                        atol=1e-3))


class RouteHooks:
    # A selection transformers made where its margin exceeds this must match the rule's.
    SELECT_CHECK_MARGIN = 1e-4

    def __init__(self, model):
        self.config = model.config
        self.records = {}  # layer -> (logits fp64 [T, E], chosen [T, k] int64), of the last forward
        self.chosen_sets = {}  # layer -> np [T, k]: transformers' experts, ascending
        self.margin = {}  # layer -> np [T]
        self.force = None  # layer -> int64 [T, k]: expert sets to use instead of the chosen ones
        self.blocks = []
        self.gates = {}
        self.broken = None  # why the hooks gave up, or None
        try:
            self.rule = rule_for(model.config)
        except Unsupported as e:
            self.rule, self.broken = None, str(e)
        if self.rule is None:
            return
        for i, layer in enumerate(model.model.layers):
            # The MoE block: `mlp` in transformers 5 (Mixtral's was block_sparse_moe in 4.x).
            gates = [getattr(getattr(layer, b, None), g, None)
                     for b in ("mlp", "block_sparse_moe") for g in ("gate", "router")]
            gates = [g for g in gates if g is not None and
                     type(g).__name__.lower().endswith("topkrouter")]
            if gates:
                self.blocks.append(i)
                self.gates[i] = gates[0]
                gates[0].forward = self._wrap(i, gates[0], gates[0].forward)
        if not self.blocks:
            self.broken = (f"{self.config.model_type}: no router module (mlp.gate / mlp.router "
                           "of a *TopKRouter class) in any layer")

    def active(self):
        return bool(self.blocks) and self.broken is None

    def margins(self, layer, model=None):
        """Per token of the last forward: the decision's margin (module docstring)."""
        return self.margin[layer]

    def _bias(self, gate):
        b = getattr(gate, "e_score_correction_bias", None)
        return None if b is None else b.detach().double().cpu().numpy()

    def _raw_logits(self, gate, x2, first, T):
        w = gate.weight
        E = w.shape[0]
        b = getattr(gate, "bias", None)
        b = b if isinstance(b, torch.Tensor) else None
        if isinstance(first, torch.Tensor) and first.numel() == T * E:
            f = first.reshape(T, E).float()
            if not _is_distribution(f):
                return f
            if bool((f > 0).all()):
                # The logits up to a per-token constant, exactly as transformers chose from them
                # (what decisions, margins, weights and tie depend on).
                return f.log()
            raw = F.linear(x2, w, b).float()
            if not torch.allclose(raw.softmax(dim=-1), f, rtol=1e-3, atol=1e-5):
                raise Unsupported("the router's first output is a distribution but not "
                                  "softmax(x W^T) of its input")
            return raw
        return F.linear(x2, w, b).float()

    def _observe(self, layer, gate, hidden_states, out):
        if not (isinstance(out, tuple) and len(out) in (2, 3)):
            raise Unsupported(f"the router returned {type(out).__name__}, not (router_logits, "
                              "weights, indices) or (weights, indices)")
        w, idx = out[-2], out[-1]
        tensors = isinstance(w, torch.Tensor) and isinstance(idx, torch.Tensor)
        if not tensors or idx.is_floating_point() or not w.is_floating_point():
            raise Unsupported(f"the router's last two outputs are {type(w).__name__} / "
                              f"{getattr(w, 'dtype', None)} and {type(idx).__name__} / "
                              f"{getattr(idx, 'dtype', None)}, not (weights, expert indices)")
        k = idx.shape[-1]
        idx2 = idx.reshape(-1, k).long()
        T = idx2.shape[0]
        x2 = hidden_states.reshape(-1, hidden_states.shape[-1])
        if x2.shape[0] != T:
            raise Unsupported(f"{x2.shape[0]} router inputs for {T} decisions")
        logits = self._raw_logits(gate, x2, out[0] if len(out) == 3 else None, T)
        E = logits.shape[1]
        if w.numel() == T * k:
            scatter, w_tk = False, w.reshape(T, k).float()
        elif w.numel() == T * E:
            scatter, w_tk = True, w.reshape(T, E).float().gather(1, idx2)
        else:
            raise Unsupported(f"weights of shape {tuple(w.shape)} for {T} x {k} decisions")
        own = self.rule.weights(logits, idx2)
        rtol = 1e-4 if w.dtype == torch.float32 else 1e-2  # a bf16 model's bf16 weights
        if not torch.allclose(own, w_tk, rtol=rtol, atol=1e-6):
            raise Unsupported("the expert-weight rule here does not give transformers' weights "
                              f"(max diff {(own - w_tk).abs().max():.3e})")
        l64 = logits.detach().double().cpu()
        sets, margin = self.rule.select(l64.numpy(), self._bias(gate))
        theirs = np.sort(idx2.detach().cpu().numpy(), axis=1)
        # Only where transformers chose in fp32 (a bf16 model's selection may round its scores
        # first; only its logits are used, for tie).
        fp32 = w.dtype == torch.float32 and (
            len(out) == 2 or getattr(out[0], "dtype", None) == torch.float32)
        bad = (sets != theirs).any(axis=1) & (margin > self.SELECT_CHECK_MARGIN) & fp32
        if bad.any():
            t = int(np.argmax(bad))
            raise Unsupported(f"the selection rule here picks {sets[t].tolist()} where "
                              f"transformers picked {theirs[t].tolist()} (token {t}, margin "
                              f"{margin[t]:.3g})")
        self.records[layer] = (l64, idx2.detach().cpu())
        self.chosen_sets[layer] = theirs
        self.margin[layer] = margin
        if self.force is None or layer not in self.force:
            return out
        f = self.force[layer].to(idx.device).long()
        if f.shape != idx2.shape:
            raise RuntimeError(f"layer {layer}: forced routing of shape {tuple(f.shape)} for "
                               f"{tuple(idx2.shape)} decisions")
        nw = self.rule.weights(logits, f).to(w.dtype)
        if scatter:
            nw = torch.zeros(T, E, dtype=w.dtype, device=w.device).scatter(1, f, nw)
        return out[:-2] + (nw.reshape(w.shape), f.to(idx.dtype).reshape(idx.shape))

    def _wrap(self, layer, gate, orig):
        def route(hidden_states, *args, **kwargs):
            out = orig(hidden_states, *args, **kwargs)
            if self.broken is not None:
                return out
            try:
                return self._observe(layer, gate, hidden_states, out)
            except Unsupported as e:
                self.broken = f"layer {layer}: {e}"
                return out
        return route
