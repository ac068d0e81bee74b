"""Checks the CPU FMHA reference (kernels/cpu/cpu_fmha.cc) against PyTorch.

  /usr/bin/python3 -m pytest -q tests/python/test_fmha_vs_torch.py \
      --fmha-ref-bin BUILD/tools/llm-fmha-ref [--workdir DIR] [--seed N]

The torch side is written from the semantics in kernels/fmha/fmha_params.h, not from the C++:
K/V are gathered per sequence into [seqlen_k, heads, d] through the block table (or the cache
row), the mask is built from the written visibility rule, scores are float64, a learned sink is
an extra softmax column with a zero value vector, LSE comes from torch.logsumexp.

Every case writes q/k/v as raw bf16/fp16 bits plus a JSON header, runs `llm-fmha-ref`, and asserts
  * max|out_cpp - out_torch| <= 1e-5 * max|out_torch| and |lse diff| <= 1e-5 * max(1, |lse|);
  * rows with no visible key: out exactly 0, lse exactly -inf (or the sink logit when present).
K/V slots no sequence may read (unused blocks, slots past seqlen_k, unused cache rows) hold NaN,
so a read outside the block table shows up as NaN. The categorical features cycle with the case
index so every mode is covered for any seed; sizes and optional features are random.
Then a few torch variants with one semantic broken (window off by one, sinks ignored, ALiBi
top-left everywhere, ...) must each be flagged by some case, so the harness can fail, and some
malformed inputs must make the tool exit 1 with a precise message.
"""
import json
import math
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

REL_TOL = 1e-5
MASKS = ["none", "causal_top_left", "causal_bottom_right", "window"]
NAN_BITS = {"bf16": 0x7FC0, "fp16": 0x7E00}
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}


def f32(x):
    """Rounds to fp32 so JSON carries exactly the value the tool will use."""
    return float(np.float32(x))


def rand_bits(gen, shape, dtype, scale=1.0):
    """Random values rounded to `dtype`; returned as int16 bits (numpy has no bf16)."""
    x = torch.randn(*shape, generator=gen) * scale
    return x.to(TORCH_DTYPE[dtype]).view(torch.int16)


def make_case(i, rng, gen):
    """Case i: categorical features cycle with i, sizes and optional features are random."""
    c = {}
    dtype = ["bf16", "fp16"][(i // 5) % 2]
    paged = i % 2 == 0
    mask = MASKS[(i // 2) % 4]
    ratio = [1, 4, 8][i % 3]
    d = [64, 128][(i // 3) % 2]
    group_mode = (i // 7) % 2 == 1 or i % 11 == 0
    kv_heads = rng.choice([1, 2])
    hq = kv_heads * ratio
    batch = rng.randint(1, 4)

    # Lengths: decode rows, prefill chunks, more queries than keys (bottom-right rows with no key).
    seqlen_k = [rng.choice([rng.randint(1, 24), rng.randint(24, 300)]) for _ in range(batch)]
    no_key = rng.randrange(batch) if i % 5 == 4 else None
    if no_key is not None:
        seqlen_k[no_key] = 0  # a sequence with no key: every row is empty
    if group_mode:
        sq = [rng.choice([0, 1, rng.randint(1, 40), rng.randint(1, sk + 8)]) for sk in seqlen_k]
        sq[no_key if no_key is not None else 0] = max(sq[0 if no_key is None else no_key], 3)
    else:
        s = rng.choice([1, rng.randint(2, 64)])
        sq = [s] * batch
    c.update(dtype=dtype, batch=batch, num_q_heads=hq, num_kv_heads=kv_heads, head_dim=d,
             seqlen_k=seqlen_k)
    if group_mode:
        c["seqstart_q"] = [0] + list(np.cumsum(sq).tolist())
    else:
        c["seqlen_q"] = sq[0]
    total_q = sum(sq)

    m = {"type": mask}
    if mask == "window":
        m["window_left"] = rng.choice([-1, 0, rng.randint(1, 8), rng.randint(8, 64)])
        m["window_right"] = rng.choice([-1, 0, 0, rng.randint(1, 12)])
    if mask != "none" and ((i // 8) % 2 == 0 or rng.random() < 0.3):
        m["sink_tokens"] = rng.randint(1, 6)
    c["mask"] = m
    c["softmax_scale"] = f32(rng.uniform(0.5, 2.0) / math.sqrt(d))
    if rng.random() < 0.4:
        c["softcap"] = f32(rng.uniform(0.5, 4.0))
    if (i // 8) % 2 == 1 or rng.random() < 0.2:
        c["alibi_slopes"] = [f32(2.0 ** (-8.0 * (h + 1) / hq) * rng.uniform(0.2, 1.5))
                             for h in range(hq)]
    if (i % 10 == 9) or (i % 10 != 4 and rng.random() < 0.4):
        c["sink_logits"] = [f32(rng.gauss(0.0, 2.0)) for _ in range(hq)]

    q = rand_bits(gen, (total_q, hq, d), dtype, scale=rng.uniform(0.8, 2.5))
    nan = NAN_BITS[dtype]
    if paged:
        bs = [16, 32, 64][(i // 2) % 3]
        need = [(sk + bs - 1) // bs for sk in seqlen_k]
        mbps = max(max(need), 1) + rng.randint(0, 2)
        num_blocks = sum(need) + rng.randint(1, 4)  # spare blocks stay NaN: never read
        ids = list(range(num_blocks))
        rng.shuffle(ids)
        table = []
        for b in range(batch):
            row = [ids.pop() for _ in range(need[b])]
            table += row + [-1] * (mbps - need[b])  # padding entries are never followed
        k = torch.full((num_blocks, kv_heads, bs, d), nan, dtype=torch.int16)
        v = k.clone()
        for b in range(batch):
            for j0 in range(0, seqlen_k[b], bs):
                n = min(bs, seqlen_k[b] - j0)
                blk = table[b * mbps + j0 // bs]
                k[blk, :, :n] = rand_bits(gen, (kv_heads, n, d), dtype)
                v[blk, :, :n] = rand_bits(gen, (kv_heads, n, d), dtype)
        c.update(block_size=bs, num_blocks=num_blocks, max_blocks_per_seq=mbps,
                 block_table=table)
    else:
        rows = batch + rng.randint(0, 3)
        cache_seqlen = max(seqlen_k) + rng.randint(0, 9)
        cbi = rng.sample(range(rows), batch) if (i // 2) % 3 != 2 else None
        k = torch.full((rows, cache_seqlen, kv_heads, d), nan, dtype=torch.int16)
        v = k.clone()
        for b in range(batch):
            r = cbi[b] if cbi is not None else b
            k[r, :seqlen_k[b]] = rand_bits(gen, (seqlen_k[b], kv_heads, d), dtype)
            v[r, :seqlen_k[b]] = rand_bits(gen, (seqlen_k[b], kv_heads, d), dtype)
        c.update(block_size=0, num_cache_rows=rows, cache_seqlen=cache_seqlen)
        if cbi is not None:
            c["cache_batch_idx"] = cbi
    return c, q, k, v


def widen(bits, dtype):
    return bits.view(TORCH_DTYPE[dtype]).to(torch.float64)


def torch_fmha(c, q_bits, k_bits, v_bits, brk=None):
    """fmha_params.h in tensor ops. `brk` names one deliberately broken semantic (self-check)."""
    dt = c["dtype"]
    hq, hkv = c["num_q_heads"], c["num_kv_heads"]
    group = hq // hkv
    q, k, v = widen(q_bits, dt), widen(k_bits, dt), widen(v_bits, dt)
    m = c["mask"]
    mtype = m["type"]
    wl, wr = m.get("window_left", -1), m.get("window_right", 0)
    sink_tokens = m.get("sink_tokens", 0)
    if brk == "window_off_by_one" and mtype == "window" and wl >= 0:
        wl += 1
    if brk == "sink_tokens_ignored":
        sink_tokens = 0
    slopes = torch.tensor(c["alibi_slopes"], dtype=torch.float64) if "alibi_slopes" in c else None
    sinks = torch.tensor(c["sink_logits"], dtype=torch.float64) if "sink_logits" in c else None
    if brk == "sinks_ignored":
        sinks = None
    if "seqstart_q" in c:
        starts = c["seqstart_q"]
    else:
        starts = [b * c["seqlen_q"] for b in range(c["batch"] + 1)]
    total_q = starts[-1]
    out = torch.zeros(total_q, hq, c["head_dim"], dtype=torch.float64)
    lse = torch.full((total_q, hq), -math.inf, dtype=torch.float64)

    for b in range(c["batch"]):
        sq, sk = starts[b + 1] - starts[b], c["seqlen_k"][b]
        if sq == 0:
            continue
        j = torch.arange(sk)
        # Gather this sequence's keys into [sk, hkv, d].
        if c["block_size"] > 0:
            bs, mbps = c["block_size"], c["max_blocks_per_seq"]
            table = torch.tensor(c["block_table"][b * mbps:(b + 1) * mbps], dtype=torch.long)
            blk, slot = table[j // bs], j % bs
            kb, vb = k[blk, :, slot, :], v[blk, :, slot, :]
        else:
            row = c["cache_batch_idx"][b] if "cache_batch_idx" in c else b
            kb, vb = k[row, :sk], v[row, :sk]
        # Query head h reads KV head h // group.
        kb = kb.repeat_interleave(group, dim=1)
        vb = vb.repeat_interleave(group, dim=1)
        qb = q[starts[b]:starts[b + 1]]

        s = torch.einsum("ihd,jhd->hij", qb, kb) * c["softmax_scale"]
        if c.get("softcap", 0.0) > 0 and brk != "softcap_ignored":
            s = c["softcap"] * torch.tanh(s / c["softcap"])
        i = torch.arange(sq)
        top_left = mtype == "causal_top_left" or brk == "alibi_top_left_always"
        p_alibi = i if top_left else i + sk - sq
        p = i if mtype == "causal_top_left" else i + sk - sq
        if slopes is not None:
            s = s + slopes[:, None, None] * (j[None, None, :] - p_alibi[None, :, None])
        jj, pp = j[None, :], p[:, None]
        if mtype == "none":
            right_ok = torch.ones(sq, sk, dtype=torch.bool)
            left_ok = right_ok
        elif mtype in ("causal_top_left", "causal_bottom_right"):
            right_ok = jj <= pp
            left_ok = torch.ones(sq, sk, dtype=torch.bool)
        else:
            right_ok = (jj <= pp + wr) if wr >= 0 else torch.ones(sq, sk, dtype=torch.bool)
            left_ok = (jj >= pp - wl) if wl >= 0 else torch.ones(sq, sk, dtype=torch.bool)
        # Sink tokens are visible wherever the right bound allows them.
        visible = right_ok & (left_ok | (jj < sink_tokens))
        s = s.masked_fill(~visible[None], -math.inf)
        if sinks is not None:
            s = torch.cat([s, sinks[:, None, None].expand(hq, sq, 1)], dim=-1)
        row_lse = torch.logsumexp(s, dim=-1)  # [hq, sq]; -inf when nothing is visible
        finite = torch.isfinite(row_lse)
        w = torch.where(finite[..., None], torch.exp(s - row_lse[..., None]), torch.zeros_like(s))
        o = torch.einsum("hij,jhd->ihd", w[..., :sk], vb)  # the sink's value vector is zero
        out[starts[b]:starts[b + 1]] = o
        lse[starts[b]:starts[b + 1]] = row_lse.T
    return out, lse


def visible_any(c, q_bits, k_bits, v_bits):
    """[total_q, hq] bool: rows with at least one visible key (sinks off, zero inputs)."""
    c2 = dict(c)
    c2.pop("sink_logits", None)
    c2.pop("alibi_slopes", None)
    c2.pop("softcap", None)
    zero = torch.zeros_like
    _, lse = torch_fmha(c2, zero(q_bits), zero(k_bits), zero(v_bits))
    return torch.isfinite(lse)


WORST = {"out": 0.0, "lse": 0.0}  # largest relative errors seen by passing comparisons


def compare(c, out_c, lse_c, out_t, lse_t, has_key, stats=False):
    """Returns a list of failure strings (empty = agree)."""
    errs = []
    if torch.isnan(out_c).any() or torch.isnan(lse_c).any():
        return ["C++ output holds NaN (a K/V slot outside the table was read?)"]
    empty = ~has_key
    if empty.any():
        if (out_c[empty] != 0).any() or (out_t[empty] != 0).any():
            errs.append("rows with no visible key must be exactly 0")
        if "sink_logits" in c:
            sink = torch.tensor(c["sink_logits"], dtype=torch.float64)[None].expand_as(lse_t)
            if (lse_t[empty] != sink[empty]).any():
                errs.append("torch: an empty row's lse is not the sink logit")
        elif not (torch.isinf(lse_c[empty]).all() and (lse_c[empty] < 0).all()):
            errs.append("rows with no visible key and no sink must have lse exactly -inf")
    if torch.isfinite(lse_t).any() or torch.isfinite(lse_c).any():
        fin_t, fin_c = torch.isfinite(lse_t), torch.isfinite(lse_c)
        if not torch.equal(fin_t, fin_c):
            errs.append("-inf lse rows differ: %d in C++, %d in torch"
                        % (int((~fin_c).sum()), int((~fin_t).sum())))
        else:
            d = (lse_c[fin_t] - lse_t[fin_t]).abs() / lse_t[fin_t].abs().clamp(min=1.0)
            if stats and d.numel():
                WORST["lse"] = max(WORST["lse"], d.max().item())
            if d.numel() and d.max() > REL_TOL:
                errs.append("lse rel err %.3g" % d.max())
    scale = out_t.abs().max().item()
    if scale > 0:
        rel = (out_c - out_t).abs().max().item() / scale
        if stats:
            WORST["out"] = max(WORST["out"], rel)
        if rel > REL_TOL:
            errs.append("out rel err %.3g" % rel)
    elif (out_c != 0).any():
        errs.append("out must be all zero")
    return errs


def run_tool(ref_bin, case_path, workdir):
    out_p, lse_p = os.path.join(workdir, "out.f32"), os.path.join(workdir, "lse.f32")
    r = subprocess.run([ref_bin, case_path, out_p, lse_p], capture_output=True, text=True)
    return r, out_p, lse_p


def write_case(workdir, name, c, q, k, v):
    for key, t in (("q", q), ("k", k), ("v", v)):
        t.numpy().astype("<i2").tofile(os.path.join(workdir, "%s.%s.bin" % (name, key)))
        c[key] = "%s.%s.bin" % (name, key)
    path = os.path.join(workdir, name + ".json")
    with open(path, "w") as f:
        json.dump(c, f)
    return path


def tags(c, has_key):
    t = {"dtype:" + c["dtype"], "d:%d" % c["head_dim"], "mask:" + c["mask"]["type"],
         "gqa:%d" % (c["num_q_heads"] // c["num_kv_heads"])}
    if c["block_size"] > 0:
        t |= {"paged", "bs:%d" % c["block_size"]}
        used = [x for x in c["block_table"] if x >= 0]
        if used != sorted(used):
            t.add("shuffled_table")
    else:
        t.add("contiguous")
        cbi = c.get("cache_batch_idx")
        t.add("cbi_permuted" if cbi and cbi != list(range(len(cbi))) else "cbi_identity")
    if "seqstart_q" in c:
        lens = np.diff(c["seqstart_q"])
        t.add("group_ragged" if len(set(lens.tolist())) > 1 else "group")
    else:
        t.add("batch_mode")
    for key in ("softcap", "alibi_slopes", "sink_logits"):
        if key in c:
            t.add(key)
    if "alibi_slopes" in c:
        t.add("alibi+" + c["mask"]["type"])
    if c["mask"].get("sink_tokens", 0) and c["mask"]["type"] == "window":
        t.add("window_sink_tokens")
    if (~has_key).any():
        t.add("empty_rows+sink" if "sink_logits" in c else "empty_rows")
    return t


REQUIRED = ({"dtype:bf16", "dtype:fp16", "d:64", "d:128", "gqa:1", "gqa:4", "gqa:8", "paged",
             "bs:16", "bs:32", "bs:64", "shuffled_table", "contiguous", "cbi_permuted",
             "cbi_identity", "batch_mode", "group_ragged", "softcap", "alibi_slopes",
             "sink_logits", "window_sink_tokens", "empty_rows", "empty_rows+sink"}
            | {"mask:" + m for m in MASKS} | {"alibi+" + m for m in MASKS})
BREAKS = ["window_off_by_one", "sink_tokens_ignored", "sinks_ignored", "softcap_ignored",
          "alibi_top_left_always"]


def check_bad_inputs(ref_bin, workdir, good_case):
    """Malformed inputs: exit status 1 (not a signal) and a message naming the problem."""
    with open(good_case) as f:
        base = json.load(f)
    paged = base["block_size"] > 0
    # One element: shorter than any k the case declares (the q file can be as long as k).
    with open(os.path.join(workdir, "short.bin"), "wb") as f:
        f.write(b"\0\0")
    bad = [
        ("not json", None, "not a JSON object"),
        ("dtype", dict(base, dtype="fp8"), "dtype \"fp8\" is not bf16 or fp16"),
        ("heads", dict(base, num_kv_heads=3, num_q_heads=4), "multiple of num_kv_heads"),
        ("mask", dict(base, mask={"type": "diagonal"}), "mask type \"diagonal\""),
        ("missing q", dict(base, q="nope.bin"), "cannot open q file"),
        ("short k", dict(base, k="short.bin"), "k file"),
        ("seqlen_k", dict(base, seqlen_k=[10 ** 6] * base["batch"]), "seqlen_k[0] = 1000000"),
    ]
    if paged:
        table = list(base["block_table"])
        table[0] = base["num_blocks"]
        bad.append(("table", dict(base, block_table=table), "block_table[0][0]"))
    else:
        bad.append(("cbi", dict(base, cache_batch_idx=[base["num_cache_rows"]] * base["batch"]),
                    "reads cache row"))
    fails = []
    for name, c, want in bad:
        if name != "not json" and c is None:
            continue
        path = os.path.join(workdir, "bad.json")
        with open(path, "w") as f:
            f.write("{" if c is None else json.dumps(c))
        r, _, _ = run_tool(ref_bin, path, workdir)
        if r.returncode != 1 or want not in r.stderr:
            fails.append("bad input %r: rc %d, stderr %r" % (name, r.returncode, r.stderr))
    return fails


CASES = 40


def test_fmha_vs_torch(option, workdir, seed):
    ref_bin, workdir = option("fmha_ref_bin"), str(workdir)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    failures, covered, results = [], set(), []
    n_rows = n_empty = 0
    for i in range(CASES):
        c, q, k, v = make_case(i, rng, gen)
        name = "case%02d" % i
        path = write_case(workdir, name, dict(c), q, k, v)
        r, out_p, lse_p = run_tool(ref_bin, path, workdir)
        if r.returncode != 0:
            failures.append("%s: llm-fmha-ref rc %d: %s" % (name, r.returncode, r.stderr.strip()))
            continue
        out_c = torch.from_numpy(np.fromfile(out_p, dtype="<f4").astype(np.float64))
        lse_c = torch.from_numpy(np.fromfile(lse_p, dtype="<f4").astype(np.float64))
        out_t, lse_t = torch_fmha(c, q, k, v)
        out_c, lse_c = out_c.reshape(out_t.shape), lse_c.reshape(lse_t.shape)
        has_key = visible_any(c, q, k, v)
        covered |= tags(c, has_key)
        errs = compare(c, out_c, lse_c, out_t, lse_t, has_key, stats=True)
        n_rows += has_key.numel()
        n_empty += int((~has_key).sum())
        if errs:
            failures.append("%s (%s): %s" % (name, path, "; ".join(errs)))
        results.append((c, q, k, v, out_c, lse_c, has_key))
    print("%d cases, %d (row, head) pairs of which %d see no key, %d features covered; worst rel "
          "err out %.2g lse %.2g" % (CASES, n_rows, n_empty, len(covered), WORST["out"],
                                     WORST["lse"]))
    assert not failures, "seed %d:\n  %s" % (seed, "\n  ".join(failures))
    assert not REQUIRED - covered, "features not covered: %s" % sorted(REQUIRED - covered)
    # The harness must be able to fail: each broken oracle has to disagree with some case.
    for brk in BREAKS:
        assert any(compare(c, oc, lc, *torch_fmha(c, q, k, v, brk=brk), hk)
                   for c, q, k, v, oc, lc, hk in results), \
            "self-check: a torch reference with %s still passes (seed %d)" % (brk, seed)


def test_bad_inputs(option, workdir, seed):
    """Malformed inputs make the tool exit 1 with a precise message."""
    workdir = str(workdir)
    c, q, k, v = make_case(0, random.Random(seed), torch.Generator().manual_seed(seed))
    good = write_case(workdir, "case00", dict(c), q, k, v)
    failures = check_bad_inputs(option("fmha_ref_bin"), workdir, good)
    assert not failures, "\n  ".join(failures)


if __name__ == "__main__":  # the same as /usr/bin/python3 -m pytest THIS_FILE [options]
    sys.exit(pytest.main([__file__] + sys.argv[1:]))
