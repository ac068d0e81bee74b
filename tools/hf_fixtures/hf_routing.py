"""transformers' MoE routing, observed and forced (tools/hf_fixtures/gpu_fidelity.py).

RouteHooks wraps the router (`mlp.gate`, gpt-oss's `mlp.router`) of every MoE block of a
transformers model: in transformers 5.17 the DeepSeek-V2 / V3 and Mixtral routers return
(router_logits, topk_weights, topk_indices).
It records the router logits and the experts transformers chose at every token, and, when told
to, makes the block use other expert sets (the server's) with the weights transformers' own rule
gives those experts. The rule is
checked against transformers' own weights on its own choice at every call, so a forced run is
transformers' arithmetic with only the choice replaced.

margins() says how close each decision was to changing, in router-logit units: the smallest
first-order change of the logits that reorders the deciding pair (the k-th and (k+1)-th expert,
or for group-limited routing the last kept and first dropped group).
"""

import numpy as np
import torch


def family_of(config):
    t = getattr(config, "model_type", "")
    return {"deepseek_v3": "sigmoid_groups", "deepseek_v2": "softmax", "mixtral": "softmax_renorm",
            "qwen3_moe": "softmax_renorm", "gpt_oss": "softmax_of_topk"}.get(t)


class RouteHooks:
    def __init__(self, model):
        self.config = model.config
        self.family = family_of(model.config)
        self.records = {}  # layer -> (logits fp64 [T, E], chosen [T, k] int64), of the last forward
        self.force = None  # layer -> int64 [T, k]: expert sets to use instead of the chosen ones
        self.blocks = []
        self.broken = None  # why the hooks gave up (a router of another form), or None
        if self.family is None:
            return
        for i, layer in enumerate(model.model.layers):
            mlp = getattr(layer, "mlp", None)
            gate = getattr(mlp, "gate", None) or getattr(mlp, "router", None)
            if gate is not None and type(gate).__name__.lower().endswith("topkrouter"):
                self.blocks.append(i)
                gate.forward = self._wrap(i, gate.forward)

    def active(self):
        return bool(self.blocks) and self.broken is None

    def weights_for(self, logits, idx):
        """transformers' expert weights for the experts idx [T, k] of router logits [T, E]."""
        c = self.config
        if self.family == "softmax_of_topk":
            return logits.gather(1, idx).softmax(dim=-1)
        if self.family == "sigmoid_groups":
            w = logits.sigmoid().gather(1, idx)
        else:
            w = logits.softmax(dim=-1).gather(1, idx)
        if self.family == "softmax_renorm" and (
                getattr(c, "model_type", "") == "mixtral" or getattr(c, "norm_topk_prob", False)):
            return w / w.sum(dim=-1, keepdim=True)
        if getattr(c, "norm_topk_prob", False) and idx.shape[1] > 1:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return w * getattr(c, "routed_scaling_factor", 1.0)

    def _wrap(self, layer, orig):
        def route(hidden_states):
            out = orig(hidden_states)
            if self.broken is not None:
                return out
            if not (isinstance(out, tuple) and len(out) == 3):
                self.broken = (f"layer {layer}: the router returned {type(out).__name__}, not "
                               "(router_logits, topk_weights, topk_indices)")
                return out
            router_logits, w, idx = out
            flat = router_logits.reshape(-1, router_logits.shape[-1]).float()
            idx2 = idx.reshape(flat.shape[0], -1)
            own = self.weights_for(flat, idx2.long())
            rtol = 1e-4 if w.dtype == torch.float32 else 1e-2  # a bf16 model's bf16 weights
            if own.numel() != w.numel() or not torch.allclose(
                    own, w.reshape(own.shape).float(), rtol=rtol, atol=1e-6):
                self.broken = f"layer {layer}: the expert-weight rule here does not give " \
                              "transformers' weights"
                return out
            self.records[layer] = (flat.detach().double().cpu(), idx2.detach().long().cpu())
            if self.force is None or layer not in self.force:
                return out
            f = self.force[layer].to(idx.device)
            if f.shape != idx2.shape:
                raise RuntimeError(f"layer {layer}: forced routing of shape {tuple(f.shape)} for "
                                   f"{tuple(idx2.shape)} decisions")
            nw = self.weights_for(flat, f).to(w.dtype)
            return router_logits, nw.reshape(w.shape), f.to(idx.dtype).reshape(idx.shape)
        return route

    def bias(self, layer, model):
        gate = model.model.layers[layer].mlp.gate
        b = getattr(gate, "e_score_correction_bias", None)
        return None if b is None else b.detach().double().cpu().numpy()

    def margins(self, layer, model):
        """Per token: the decision's margin in router-logit units (see the module docstring)."""
        logits, _ = self.records[layer]
        l = logits.numpy()
        c = self.config
        k = c.num_experts_per_tok
        T, E = l.shape
        out = np.empty(T)
        if self.family != "sigmoid_groups":  # top-k of the softmax (or logits): the logits' order
            s = -np.sort(-l, axis=1)
            return s[:, k - 1] - s[:, k]
        bias = self.bias(layer, model)
        n_group, topk_group = c.n_group, c.topk_group
        per = E // n_group
        for t in range(T):
            sg = 1.0 / (1.0 + np.exp(-l[t]))
            slope = sg * (1.0 - sg)
            ch = sg + (bias if bias is not None else 0.0)
            g = ch.reshape(n_group, per)
            top2 = np.argsort(-g, axis=1, kind="stable")[:, :2]
            gs = np.take_along_axis(g, top2, 1).sum(1)
            gorder = np.argsort(-gs, kind="stable")
            m = np.inf
            if topk_group < n_group:
                a, b = gorder[topk_group - 1], gorder[topk_group]
                sl = slope.reshape(n_group, per)
                d = sl[a, top2[a]].sum() + sl[b, top2[b]].sum()
                m = min(m, (gs[a] - gs[b]) / max(d, 1e-12))
            keep = np.zeros(E, dtype=bool)
            for grp in gorder[:topk_group]:
                keep[grp * per:(grp + 1) * per] = True
            masked = np.where(keep, ch, -np.inf)  # dropped groups never compete
            eorder = np.argsort(-masked, kind="stable")
            i, j = eorder[k - 1], eorder[k]
            if keep[j]:
                m = min(m, (masked[i] - masked[j]) / max(slope[i] + slope[j], 1e-12))
            out[t] = m
        return out
