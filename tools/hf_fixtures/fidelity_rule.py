"""Why each divergence from transformers happened (issue 51, item 6): the pure rule of
tools/hf_fixtures/gpu_fidelity.py, on plain Python values (no torch, no transformers), so
tests/python/test_moe_fidelity_rule.py checks it with synthetic inputs.

Along the server's greedy path, step k's logits come from position prompt_len - 1 + k. A step
diverges where transformers' fp32 top-1 is not the server's token; it is explained by
  near-tie  gap (transformers' top-1 logit minus its logit of the server's token) < max_gap, or
  routing   a first routing difference at that position or an earlier one whose transformers
            fp32 decision margin is at most `tie` (what transformers' own bf16 model moves a
            router logit by on the same input, both models forced to the server's routing).
A first routing difference is a (position, layer) where the server's expert set differs from
transformers' fp32 one with no difference at an earlier layer of this or an earlier position:
nothing upstream of it differed, so it is the routing's own decision, not a consequence.
Anything else is unexplained: a wrong token.
"""

NEAR_TIE, ROUTING, UNEXPLAINED = "near-tie", "routing", "unexplained"


def first_routing_differences(server, hf, margins):
    """server, hf: {(position, layer): experts}; margins: {(position, layer): transformers'
    decision margin}. The first routing differences (module docstring), by position then layer,
    as dicts with position, layer, margin, hf and server (expert lists, ascending)."""
    keys = set(server) | set(hf)
    missing = sorted(k for k in keys if k not in server or k not in hf)
    if missing:
        raise ValueError(f"routing known on one side only at (position, layer) {missing[:4]}")
    diffs = sorted(k for k in keys if sorted(server[k]) != sorted(hf[k]))
    out, min_layer_before = [], None  # the smallest differing layer at earlier positions
    i = 0
    while i < len(diffs):
        p = diffs[i][0]
        here = [l for (q, l) in diffs[i:] if q == p]  # ascending layers at position p
        bound = here[0] if min_layer_before is None else min(here[0], min_layer_before)
        for l in here:
            if l <= bound:  # no difference at a smaller layer of this or an earlier position
                out.append({"position": p, "layer": l, "margin": float(margins[(p, l)]),
                            "hf": sorted(int(e) for e in hf[(p, l)]),
                            "server": sorted(int(e) for e in server[(p, l)])})
        min_layer_before = bound
        i += len(here)
    return out


def classify_steps(steps, prompt_len, first_diffs, tie, max_gap):
    """steps: per step of the server's path, dicts with server (token), hf_top, gap and
    optionally forced (the gap with transformers forced to the server's routing). first_diffs:
    first_routing_differences' output for this request; tie: its router error (None: no routing
    analysis). One dict per divergence: step, position, server, hf_top, gap, forced, cause
    (NEAR_TIE, ROUTING or UNEXPLAINED) and nearest, the first routing difference at or before
    the position with the smallest margin (None if there is none)."""
    rows = []
    for k, s in enumerate(steps):
        if s["hf_top"] == s["server"]:
            continue
        pos = prompt_len - 1 + k
        before = [d for d in first_diffs if d["position"] <= pos]
        nearest = min(before, key=lambda d: d["margin"]) if before else None
        if s["gap"] < max_gap:
            cause = NEAR_TIE
        elif nearest is not None and tie is not None and nearest["margin"] <= tie:
            cause = ROUTING
        else:
            cause = UNEXPLAINED
        rows.append({"step": k, "position": pos, "server": s["server"], "hf_top": s["hf_top"],
                     "gap": s["gap"], "forced": s.get("forced"), "cause": cause,
                     "nearest": nearest})
    return rows


def tally(rows):
    """{divergences, near-tie, routing, unexplained} counts of classify_steps' rows."""
    out = {"divergences": len(rows), NEAR_TIE: 0, ROUTING: 0, UNEXPLAINED: 0}
    for r in rows:
        out[r["cause"]] += 1
    return out


def describe(arch, prompt_len, row, tie):
    """One line naming an unexplained (or any) divergence: family, prompt, step, gap and the
    nearest routing margin."""
    n = row["nearest"]
    near = "no routing difference at or before it" if n is None else \
        f"nearest first routing difference: position {n['position']}, layer {n['layer']}, " \
        f"margin {n['margin']:.4g} (tie {tie if tie is None else format(tie, '.4g')}), " \
        f"transformers {n['hf']} vs server {n['server']}"
    forced = "" if row["forced"] is None else f", forced gap {row['forced']:.3f}"
    return (f"{arch}: prompt of {prompt_len} tokens, step {row['step']}: {row['cause']}, "
            f"gap {row['gap']:.3f} (server {row['server']}, transformers {row['hf_top']})"
            f"{forced}; {near}")
