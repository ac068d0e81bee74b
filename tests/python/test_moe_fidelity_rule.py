"""The MoE fidelity analysis of tools/hf_fixtures/gpu_fidelity.py (issue 51, item 6), in pieces
that run without transformers:

- fidelity_rule.py: which routing differences are first ones, and why each divergence happened
  (near-tie, routing, unexplained) on synthetic gaps, margins and expert sets, including
  divergences the rule must leave unexplained;
- hf_routing.py's RouteHooks on stand-in models whose routers return what transformers 5.x's
  routers return (GptOssTopKRouter, MixtralTopKRouter, Qwen3MoeTopKRouter with its softmax first
  output, a DeepSeek-V3 group-limited router): the recorded logits, experts and margins, the
  forced run's output against one computed by hand, and a router whose weights the rule does not
  give is refused (broken), not analysed.
"""

import json
import os
import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "hf_fixtures"))
import fidelity_rule as R  # noqa: E402
from hf_routing import RouteHooks  # noqa: E402


# ---- fidelity_rule -------------------------------------------------------------------------

def test_first_routing_differences_keep_only_those_with_nothing_upstream():
    E = [0, 1]
    server, hf, margins = {}, {}, {}
    for p in range(9):
        for l in range(1, 5):
            server[(p, l)] = E
            hf[(p, l)] = E
            margins[(p, l)] = 0.1 * p + 0.01 * l
    for key in [(2, 4), (3, 2), (5, 1), (5, 2), (6, 3), (7, 1)]:
        server[key] = [0, 2]
    first = R.first_routing_differences(server, hf, margins)
    # (5, 2) follows (5, 1); (6, 3) follows (5, 1); (7, 1): the same layer at an earlier position
    # is not upstream of it.
    assert [(d["position"], d["layer"]) for d in first] == [(2, 4), (3, 2), (5, 1), (7, 1)]
    assert first[0]["margin"] == pytest.approx(0.24)
    assert first[0]["server"] == [0, 2] and first[0]["hf"] == [0, 1]


def test_first_routing_differences_refuse_one_sided_routing():
    with pytest.raises(ValueError):
        R.first_routing_differences({(0, 1): [0]}, {(0, 1): [0], (1, 1): [1]}, {(0, 1): 0.0})


def steps_with(divergences, n=8):
    s = [{"server": 10 + k, "hf_top": 10 + k, "gap": 0.0, "forced": 0.0} for k in range(n)]
    for k, gap in divergences.items():
        s[k] = {"server": 10 + k, "hf_top": 99, "gap": gap, "forced": 0.01}
    return s


def test_near_tie_routing_and_unexplained():
    prompt_len = 10  # step k's logits come from position 9 + k
    first = [{"position": 12, "layer": 1, "margin": 0.004, "hf": [0, 1], "server": [0, 2]},
             {"position": 15, "layer": 2, "margin": 0.5, "hf": [1, 3], "server": [1, 2]}]
    steps = steps_with({1: 0.3, 3: 2.0, 2: 1.5, 7: 4.0})
    rows = R.classify_steps(steps, prompt_len, first, tie=0.02, max_gap=0.5)
    by_step = {r["step"]: r for r in rows}
    assert sorted(by_step) == [1, 2, 3, 7]
    assert by_step[1]["cause"] == R.NEAR_TIE
    # Step 2 is position 11: the routing difference at 12 comes after it.
    assert by_step[2]["cause"] == R.UNEXPLAINED and by_step[2]["nearest"] is None
    # Step 3 is position 12: the difference at 12 is at or before it and within tie.
    assert by_step[3]["cause"] == R.ROUTING and by_step[3]["nearest"]["position"] == 12
    # Step 7 (position 16): the nearest is still the small margin at 12.
    assert by_step[7]["cause"] == R.ROUTING and by_step[7]["nearest"]["margin"] == 0.004
    assert R.tally(rows) == {"divergences": 4, R.NEAR_TIE: 1, R.ROUTING: 2, R.UNEXPLAINED: 1}


def test_routing_difference_beyond_tie_explains_nothing():
    first = [{"position": 3, "layer": 1, "margin": 0.08, "hf": [0, 1], "server": [0, 2]}]
    rows = R.classify_steps(steps_with({4: 0.9}), 5, first, tie=0.05, max_gap=0.5)
    assert [r["cause"] for r in rows] == [R.UNEXPLAINED]
    line = R.describe("gpt_oss", 5, rows[0], 0.05)
    assert "gpt_oss" in line and "step 4" in line and "gap 0.900" in line
    assert "margin 0.08" in line and "tie 0.05" in line and "forced gap 0.010" in line


def test_gap_at_the_bound_is_not_a_near_tie_and_no_analysis_explains_nothing():
    rows = R.classify_steps(steps_with({0: 0.5}), 3, [], tie=None, max_gap=0.5)
    assert [r["cause"] for r in rows] == [R.UNEXPLAINED]
    first = [{"position": 0, "layer": 1, "margin": 0.0, "hf": [0], "server": [1]}]
    rows = R.classify_steps(steps_with({0: 3.0}), 3, first, tie=None, max_gap=0.5)
    assert [r["cause"] for r in rows] == [R.UNEXPLAINED]
    assert R.classify_steps(steps_with({}), 3, first, tie=1.0, max_gap=0.5) == []


# ---- RouteHooks on stand-ins for transformers 5.x's routers ---------------------------------

H, E = 16, 8


class GptOssTopKRouter(nn.Module):
    """transformers 5.x: logits x W^T + b; top-k logits; softmax of those."""

    def __init__(self, k):
        super().__init__()
        self.top_k = k
        self.weight = nn.Parameter(torch.randn(E, H))
        self.bias = nn.Parameter(torch.randn(E) * 0.2)

    def forward(self, x):
        logits = F.linear(x, self.weight, self.bias)
        top, idx = torch.topk(logits, self.top_k, dim=-1)
        return logits, torch.softmax(top, dim=1), idx


class MixtralTopKRouter(nn.Module):
    def __init__(self, k):
        super().__init__()
        self.top_k = k
        self.weight = nn.Parameter(torch.randn(E, H))

    def forward(self, x):
        logits = F.linear(x, self.weight)
        probs = torch.softmax(logits.float(), dim=-1)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        return logits, top / top.sum(dim=-1, keepdim=True), idx


class Qwen3MoeTopKRouter(nn.Module):
    """transformers 5.0: the first output is softmax(logits) under the name router_logits."""

    def __init__(self, k, norm):
        super().__init__()
        self.top_k, self.norm = k, norm
        self.weight = nn.Parameter(torch.randn(E, H))

    def forward(self, x):
        probs = torch.softmax(F.linear(x, self.weight), dtype=torch.float, dim=-1)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        if self.norm:
            top = top / top.sum(dim=-1, keepdim=True)
        return probs, top, idx


class DeepseekV3TopkRouter(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.randn(E, H) * 0.5)
        self.e_score_correction_bias = nn.Parameter(torch.randn(E) * 0.1)

    def forward(self, x):
        c = self.cfg
        logits = F.linear(x.float(), self.weight.float())
        s = logits.sigmoid()
        choice = s + self.e_score_correction_bias
        g = choice.view(-1, c.n_group, E // c.n_group).topk(2, dim=-1)[0].sum(dim=-1)
        gidx = torch.topk(g, k=c.topk_group, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(g).scatter_(1, gidx, 1)
        mask = mask.unsqueeze(-1).expand(-1, c.n_group, E // c.n_group).reshape(-1, E)
        idx = torch.topk(choice.masked_fill(~mask.bool(), float("-inf")), c.num_experts_per_tok,
                         dim=-1, sorted=False)[1]
        w = s.gather(1, idx)
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return logits, w * c.routed_scaling_factor, idx


class Block(nn.Module):
    """An MoE block: expert e maps x to x A_e; the output is the weighted sum over the chosen."""

    def __init__(self, router, attr="gate"):
        super().__init__()
        setattr(self, attr, router)
        self.attr = attr
        self.experts = nn.Parameter(torch.randn(E, H, H) / H ** 0.5)

    def forward(self, x):
        _, w, idx = getattr(self, self.attr)(x)
        y = torch.einsum("th,tkhd->tkd", x, self.experts[idx])
        return (y * w[..., None].to(y.dtype)).sum(dim=1)


def model_of(config, blocks):
    m = nn.Module()
    m.config = config
    m.model = nn.Module()
    layers = []
    for b in blocks:
        layer = nn.Module()
        layer.mlp = b
        layers.append(layer)
    m.model.layers = nn.ModuleList(layers)
    return m


def forward(m, x):
    for layer in m.model.layers:
        x = x + layer.mlp(x)
    return x


def cfg(model_type, **kw):
    return types.SimpleNamespace(model_type=model_type, **kw)


def make(family):
    torch.manual_seed(7)
    if family == "gpt_oss":
        c = cfg("gpt_oss", num_experts_per_tok=2)
        return c, model_of(c, [Block(GptOssTopKRouter(2), "router") for _ in range(2)])
    if family == "mixtral":
        c = cfg("mixtral", num_experts_per_tok=2)
        return c, model_of(c, [Block(MixtralTopKRouter(2)) for _ in range(2)])
    if family == "qwen3_moe":
        c = cfg("qwen3_moe", num_experts_per_tok=3, norm_topk_prob=True)
        dense = nn.Module()  # a dense layer (mlp_only_layers): no router
        dense.forward = lambda x: torch.zeros_like(x)
        return c, model_of(c, [dense, Block(Qwen3MoeTopKRouter(3, True))])
    c = cfg("deepseek_v3", num_experts_per_tok=2, n_group=4, topk_group=2, norm_topk_prob=True,
            routed_scaling_factor=2.5)
    return c, model_of(c, [Block(DeepseekV3TopkRouter(c)) for _ in range(2)])


def raw_logits(block):
    r = getattr(block, block.attr)
    b = getattr(r, "bias", None)
    return lambda x: F.linear(x, r.weight, b if isinstance(b, torch.Tensor) else None)


@pytest.mark.parametrize("family", ["gpt_oss", "mixtral", "qwen3_moe", "deepseek_v3"])
@torch.no_grad()
def test_hooks_record_and_force_each_family(family):
    c, m = make(family)
    hooks = RouteHooks(m)
    assert hooks.active(), hooks.broken
    moe_layers = [i for i, l in enumerate(m.model.layers) if isinstance(l.mlp, Block)]
    assert hooks.blocks == moe_layers
    T = 12
    x = torch.randn(T, H)
    free = forward(m, x)
    k = c.num_experts_per_tok
    inputs, h = {}, x  # each MoE layer's input, replayed to check what the hooks recorded
    for i, layer in enumerate(m.model.layers):
        inputs[i] = h
        h = h + layer.mlp(h)
    for i in moe_layers:
        logits, chosen = hooks.records[i]
        want = raw_logits(m.model.layers[i].mlp)(inputs[i]).double()
        if family == "qwen3_moe":  # log-probabilities: the logits up to a per-token constant
            logits = logits - logits.mean(dim=1, keepdim=True)
            want = want - want.mean(dim=1, keepdim=True)
        assert torch.allclose(logits, want, atol=1e-5)  # logits, not probabilities
        assert chosen.shape == (T, k)
        if family != "deepseek_v3":
            s = np.sort(want.numpy(), axis=1)[:, ::-1]
            assert np.allclose(hooks.margins(i), (s[:, k - 1] - s[:, k]) / 2)
            assert (hooks.chosen_sets[i] == np.sort(np.argsort(-want.numpy(), 1)[:, :k],
                                                     1)).all()
        else:
            assert (hooks.margins(i) >= 0).all()
    # Force every token to experts transformers did not pick at the first MoE layer.
    first = moe_layers[0]
    forced_sets = {}
    for i in moe_layers:
        own = hooks.chosen_sets[i]
        forced_sets[i] = torch.tensor(
            [sorted([e for e in range(E) if e not in own[t]][:k]) for t in range(T)])
    hooks.force = forced_sets
    forced = forward(m, x)
    hooks.force = None
    assert not torch.allclose(forced, free)
    # The same forward by hand: the rule's weights for the forced experts.
    h = x
    for i, layer in enumerate(m.model.layers):
        if i not in moe_layers:
            h = h + layer.mlp(h)
            continue
        logits = raw_logits(layer.mlp)(h).float()
        idx = forced_sets[i]
        w = hooks.rule.weights(logits, idx)
        y = torch.einsum("th,tkhd->tkd", h, layer.mlp.experts[idx])
        h = h + (y * w[..., None]).sum(dim=1)
    assert torch.allclose(forced, h, atol=1e-5)
    assert hooks.active() and first in hooks.records


def test_forced_weights_follow_each_rule():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    idx = torch.tensor([[1, 3]])
    rules = {
        "gpt_oss": torch.softmax(torch.tensor([1.0, -1.0]), 0),
        "mixtral": torch.softmax(torch.tensor([1.0, -1.0]), 0),
        "qwen3_moe": torch.softmax(logits[0], 0)[[1, 3]],  # norm_topk_prob False
    }
    from hf_routing import rule_for
    for t, want in rules.items():
        c = cfg(t, num_experts_per_tok=2, norm_topk_prob=False)
        got = rule_for(c).weights(logits, idx)[0]
        assert torch.allclose(got, want), t
    c = cfg("deepseek_v2", num_experts_per_tok=2, norm_topk_prob=False, routed_scaling_factor=2.0,
            topk_method="greedy")
    assert torch.allclose(rule_for(c).weights(logits, idx)[0],
                          2.0 * torch.softmax(logits[0], 0)[[1, 3]])


def test_a_router_the_rule_does_not_describe_is_refused():
    torch.manual_seed(3)
    c = cfg("qwen3_moe", num_experts_per_tok=2, norm_topk_prob=True)  # the router does not renorm
    m = model_of(c, [Block(Qwen3MoeTopKRouter(2, False))])
    hooks = RouteHooks(m)
    with torch.no_grad():
        forward(m, torch.randn(5, H))
    assert not hooks.active() and "weight rule" in hooks.broken

    class ReversedTopKRouter(MixtralTopKRouter):  # Mixtral's weights, but the k smallest logits
        def forward(self, x):
            logits = F.linear(x, self.weight)
            idx = torch.topk(-logits, self.top_k, dim=-1)[1]
            p = torch.softmax(logits, dim=-1).gather(1, idx)
            return logits, p / p.sum(dim=-1, keepdim=True), idx

    m = model_of(cfg("mixtral", num_experts_per_tok=2), [Block(ReversedTopKRouter(2))])
    hooks = RouteHooks(m)
    with torch.no_grad():
        forward(m, torch.randn(5, H))
    assert not hooks.active() and "selection rule" in hooks.broken

    class Gate(nn.Module):  # a router of another form: a bare linear layer
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(E, H))

        def forward(self, x):
            return F.linear(x, self.weight)

    m = model_of(cfg("mixtral", num_experts_per_tok=2), [Block(Gate())])
    hooks = RouteHooks(m)
    assert not hooks.active() and "no router module" in hooks.broken


# ---- gpu_fidelity.run end to end on a stand-in model ----------------------------------------

V = 32000  # gpu_fidelity's prompts draw token ids below 32000


class StandInLM(nn.Module):
    """A causal LM of MoE blocks (a running mean mixes positions), with the attributes
    gpu_fidelity and RouteHooks read from a transformers model."""

    def __init__(self, config, blocks):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(V, H)
        self.head = nn.Linear(H, V, bias=False)
        self.model = model_of(config, blocks).model

    def forward(self, input_ids):
        x = self.embed(input_ids[0])
        n = torch.arange(1, x.shape[0] + 1, dtype=x.dtype)[:, None]
        for layer in self.model.layers:
            x = x + layer.mlp(x.cumsum(0) / n + x)
        return types.SimpleNamespace(logits=self.head(x)[None] * 4)


def stand_in(family):
    c, m = make(family)
    torch.manual_seed(11)
    return StandInLM(c, [layer.mlp for layer in m.model.layers])


@pytest.mark.parametrize("family", ["gpt_oss", "mixtral", "qwen3_moe", "deepseek_v3"])
def test_gpu_fidelity_run_on_a_stand_in(family, monkeypatch, tmp_path):
    """The whole analysis of gpu_fidelity.run, with transformers and llm-dump replaced: the
    'server' is the stand-in in bf16 (its greedy path and its routing), transformers' fp32 model
    the stand-in in fp32. Every divergence must be classified and every number finite."""
    for name in ["transformers", "tokenizers", "safetensors", "safetensors.torch"]:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["safetensors"].safe_open = None
    sys.modules["safetensors.torch"].save_file = None
    for name in ["gpu_fidelity", "make_fixtures", "mxfp4", "weights"]:
        monkeypatch.delitem(sys.modules, name, raising=False)
    import gpu_fidelity as G

    fp32 = stand_in(family).eval()
    server = stand_in(family).to(torch.bfloat16).eval()
    with torch.no_grad():  # a server whose routers err a little more than bf16 does
        for layer in server.model.layers:
            if not isinstance(layer.mlp, Block):
                continue
            r = getattr(layer.mlp, layer.mlp.attr)
            r.weight.mul_(1 + 0.03 * torch.randn(r.weight.shape).to(r.weight.dtype))
    cls_name = G.GPU_ARCHS[family][1]
    holder = types.SimpleNamespace(from_pretrained=lambda *a, **k: stand_in(family).to(k["dtype"]))
    monkeypatch.setattr(sys.modules["transformers"], cls_name, holder, raising=False)
    monkeypatch.setattr(G, "build", lambda arch, out_dir: fp32)

    def fake_dump(cmd, **kw):
        args = dict(zip(cmd[::2], cmd[1::2])) if len(cmd) % 2 == 0 else \
            dict(zip(cmd[1::2], cmd[2::2]))
        req = json.load(open(args["--requests"]))
        hooks = RouteHooks(server)
        outs, routes = [], []
        with torch.no_grad():
            for r in req["requests"]:
                ids = list(r["prompt_ids"])
                for _ in range(req["max_new_tokens"]):
                    ids.append(int(server(torch.tensor([ids])).logits[0, -1].float().argmax()))
                out = ids[len(r["prompt_ids"]):]
                server(torch.tensor([ids[:-1]]))  # the positions the server computed
                rows = [[p, l, hooks.chosen_sets[l][p].tolist()] for p in range(len(ids) - 1)
                        for l in hooks.blocks]
                outs.append({"output_ids": out})
                routes.append({"routing": rows})
        json.dump({"requests": outs}, open(args["--out"], "w"))
        json.dump({"requests": routes}, open(args["--routing-out"], "w"))
        return types.SimpleNamespace(returncode=0, stderr="")

    monkeypatch.setattr(G.subprocess, "run", fake_dump)
    monkeypatch.setattr(G, "STEPS", 12)
    res = G.run(family, "llm-dump", 0.5, "auto", str(tmp_path), prompt_lens=(4, 9), device="cpu")
    assert res["status"] in ("ok", "FAIL"), res
    assert "detail" not in res, res["detail"]
    assert res["steps"] == 24
    assert res["divergences"] == res[R.NEAR_TIE] + res[R.ROUTING] + res[R.UNEXPLAINED]
    assert res["status"] == ("ok" if res[R.UNEXPLAINED] == 0 else "FAIL")
    for key in ["forced_max_gap", "tie", "hf_bf16_max_gap", "first_max_margin"]:
        assert np.isfinite(res[key]), key
    assert res["tie"] > 0  # bf16 moves the router logits
    for row in res["rows"]:
        assert row["cause"] in (R.NEAR_TIE, R.ROUTING, R.UNEXPLAINED)
        assert row["forced"] is not None and "hf_bf16_top" in row
    json.dumps(res)  # --json-out writes it
    G.print_report([res])
