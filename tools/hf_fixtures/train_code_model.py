"""Trains the small code models that give speculative decoding real acceptance (issue 52), on the
GPU machine, from text that is there (the Python standard library's sources), and writes them as
fixtures that CI checks against transformers like every other model fixture:

  tests/fixtures/models/code_llama/        the target: LlamaForCausalLM, 4 layers, hidden 256
  tests/fixtures/models/code_llama_draft/  the draft: the same tokenizer, 2 layers, hidden 128
  bench/workloads/code_edit.jsonl          the code-editing workload (held-out files)

Each model directory holds what save_pretrained wrote (bf16 weights), config_v4.json, the trained
byte-level BPE tokenizer (tokenizer.json, tokenizer_config.json) and reference.json:
transformers' fp32 greedy tokens and top-5 logits over 64 steps for four workload prompts (the
format of make_fixtures.py).

The corpus: every .py file of the standard library, in path order; one in ten files (by a hash
of its path) is held out for the workload. Training text interleaves the files with "edit
blocks": a chunk of a file, a request to rename one identifier in it, and the chunk with the
identifier renamed; the workload asks for the same on held-out files, so the prompt holds most
of what the model writes (the text n-gram and draft-model speculation can find).

    python3 tools/hf_fixtures/train_code_model.py --out OUT [--target-steps N --draft-steps N]
"""

import argparse
import builtins
import hashlib
import json
import keyword
import math
import os
import random
import re
import shutil
import sys
import sysconfig
import tempfile
import time

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import greedy, jdump, to_v4  # noqa: E402

EOS = "<|endoftext|>"
VOCAB = 4096
SEQ = 1024
SEED = 52
# Edit blocks per training file: enough different chunks and names that the model learns to copy
# with the rename rather than memorize the blocks.
EDITS_PER_FILE = 12
IDENT = re.compile(r"\b[a-z_][a-z0-9_]{2,}\b")
SKIP = set(keyword.kwlist) | set(dir(builtins)) | {"self", "cls", "args", "kwargs"}

TARGET = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2)
DRAFT = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1)


def held_out(rel):
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 10 == 0


def read_corpus():
    root = sysconfig.get_paths()["stdlib"]
    train, held = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages",
                                                              "__pycache__"))
        for fn in sorted(filenames):
            if not fn.endswith(".py"):
                continue
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, root)
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (UnicodeDecodeError, OSError):
                continue
            if EOS in text or not text.strip():
                continue
            (held if held_out(rel) else train).append((rel, text))
    return root, train, held


def random_name(rng):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))


def edit_block(rng, rel, text, max_lines=30, disguise=0):
    """A chunk of `text` and the same chunk with one identifier renamed, or None. Returns
    (request, result): the request ends where the model starts writing. `disguise` more
    identifiers get random names in both parts, so a model that memorized the file must still copy
    the request to write the result (training blocks; the workload's files are held out)."""
    lines = text.splitlines(keepends=True)
    if len(lines) < 8:
        return None
    n = rng.randint(8, max_lines)
    start = rng.randint(0, max(0, len(lines) - n))
    chunk = "".join(lines[start:start + n])
    counts = {}
    for w in IDENT.findall(chunk):
        if w not in SKIP:
            counts[w] = counts.get(w, 0) + 1
    names = sorted(w for w, c in counts.items() if c >= 2)
    if not names:
        return None
    for w in rng.sample(sorted(counts), min(disguise, len(counts))):
        chunk = re.sub(r"\b%s\b" % re.escape(w), random_name(rng), chunk)
    counts = {w: c for w, c in counts.items() if re.search(r"\b%s\b" % re.escape(w), chunk)}
    names = sorted(w for w, c in counts.items() if c >= 2)
    if not names:
        return None
    old = rng.choice(names)
    new = old + rng.choice(["_new", "_v2", "_tmp", "_old", "2"])
    result = re.sub(r"\b%s\b" % re.escape(old), new, chunk)
    request = (f"# ---- {rel}: rename {old} to {new} ----\n{chunk}"
               f"# ---- result ----\n")
    return request, result + "# ---- end ----\n"


def train_tokenizer(texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def token_stream(tok, train, rng):
    """The training text as one token stream: files with edit blocks between them."""
    pieces = []
    for rel, text in train:
        pieces.append(text)
        for _ in range(EDITS_PER_FILE):
            b = edit_block(rng, rel, text, disguise=4)
            if b:
                pieces.append(b[0] + b[1])
    eos = tok.token_to_id(EOS)
    ids = []
    for enc in tok.encode_batch(pieces):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)


def train_model(cfg_kw, data, steps, batch, lr, eos, log):
    torch.manual_seed(SEED)
    config = transformers.LlamaConfig(vocab_size=VOCAB, max_position_embeddings=2048,
                                      tie_word_embeddings=True, bos_token_id=eos,
                                      eos_token_id=eos, rope_theta=10000.0, **cfg_kw)
    model = transformers.LlamaForCausalLM(config).cuda()
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(SEED)
    data = data.cuda()
    t0 = time.time()
    model.train()
    for step in range(steps):
        warm = min(1.0, (step + 1) / 200)
        cos = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps))
        for g in opt.param_groups:
            g["lr"] = lr * warm * cos
        starts = torch.randint(0, data.numel() - SEQ - 1, (batch,), generator=gen).cuda()
        idx = starts[:, None] + torch.arange(SEQ + 1, device="cuda")[None, :]
        x = data[idx]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x[:, :-1], labels=x[:, :-1]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 250 == 0 or step == steps - 1:
            log(f"  step {step}: loss {loss.item():.3f} ({time.time() - t0:.0f} s)")
    model.eval()
    return model.to(torch.bfloat16).cpu(), nparams, time.time() - t0


def write_fixture(model, tok, out_dir, name, prompts, log):
    fixture = os.path.join(out_dir, "tests", "fixtures", "models", name)
    os.makedirs(fixture, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        for fn in ("config.json", "generation_config.json", "model.safetensors"):
            shutil.copyfile(os.path.join(tmp, fn), os.path.join(fixture, fn))
        with open(os.path.join(tmp, "config.json")) as f:
            cfg_json = json.load(f)
    jdump(to_v4(cfg_json), os.path.join(fixture, "config_v4.json"))
    tok.save(os.path.join(fixture, "tokenizer.json"))
    jdump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS,
           "model_max_length": 2048},
          os.path.join(fixture, "tokenizer_config.json"))
    hf = transformers.LlamaForCausalLM.from_pretrained(
        fixture, dtype=torch.float32, attn_implementation="eager").eval()
    refs, min_gap = [], 1e9
    for p in prompts:
        toks, tops, gap = greedy(hf, p)
        min_gap = min(min_gap, gap)
        refs.append({"prompt_ids": p, "greedy": toks, "top5": tops, "min_gap": gap})
    ref = {"tokenizer": name, "transformers_version": transformers.__version__,
           "torch_version": torch.__version__, "architecture": "LlamaForCausalLM",
           "attn_implementation": "eager", "dtype": "float32", "steps": 64,
           "ignore_eos": True, "config_v4_identical_in_transformers": True,
           "config_v4_max_abs_diff": 0.0, "min_gap": min_gap, "prompts": refs}
    jdump(ref, os.path.join(fixture, "reference.json"))
    log(f"{name}: min top1-top2 gap {min_gap:.4f}; greedy of prompt 0: "
        f"{tok.decode(refs[0]['greedy'])!r}")
    return hf


@torch.no_grad()
def copy_rate(model, tok, work, n=16):
    """Share of the expected result's tokens the model's greedy output reproduces position by
    position (a measure of what speculation can accept)."""
    model = model.cuda()
    same = total = 0
    for w in work[:n]:
        ids = tok.encode(w["prompt"]).ids
        want = tok.encode(w["expected"]).ids
        out = model.generate(torch.tensor([ids]).cuda(), max_new_tokens=len(want),
                             do_sample=False)[0, len(ids):].tolist()
        same += sum(a == b for a, b in zip(out, want))
        total += len(want)
    model.cpu()
    return same / max(total, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--target-steps", type=int, default=3000)
    ap.add_argument("--draft-steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workload", type=int, default=64, help="workload requests")
    args = ap.parse_args()
    logf = open(os.path.join(args.out, "train_log.txt"), "w")

    def log(s):
        print(s, flush=True)
        logf.write(s + "\n")

    rng = random.Random(SEED)
    root, train, held = read_corpus()
    log(f"corpus {root}: {len(train)} training files, {len(held)} held out, "
        f"{sum(len(t) for _, t in train) / 1e6:.1f} MB of training text")
    t0 = time.time()
    tok = train_tokenizer([t for _, t in train])
    eos = tok.token_to_id(EOS)
    log(f"tokenizer: vocab {tok.get_vocab_size()}, EOS {eos} ({time.time() - t0:.0f} s)")
    data = token_stream(tok, train, rng)
    log(f"training stream: {data.numel() / 1e6:.1f} M tokens")

    # The workload: edit requests on held-out files (prompt = the request; max_tokens = the
    # result's length in tokens).
    wrng = random.Random(SEED + 1)
    work = []
    for rel, text in wrng.sample(held, len(held)):
        b = edit_block(wrng, rel, text, max_lines=24)
        if not b:
            continue
        n_req, n_res = len(tok.encode(b[0]).ids), len(tok.encode(b[1]).ids)
        if n_req > 900 or n_res > 512:
            continue
        work.append({"prompt": b[0], "max_tokens": n_res, "expected": b[1]})
        if len(work) == args.workload:
            break
    wdir = os.path.join(args.out, "bench", "workloads")
    os.makedirs(wdir, exist_ok=True)
    with open(os.path.join(wdir, "code_edit.jsonl"), "w") as f:
        for w in work:
            f.write(json.dumps(w) + "\n")
    log(f"workload: {len(work)} requests, mean max_tokens "
        f"{sum(w['max_tokens'] for w in work) / len(work):.0f}")
    prompts = [tok.encode(w["prompt"]).ids for w in work[:4]]

    for name, kw, steps, lr in (("code_llama", TARGET, args.target_steps, 2e-3),
                                ("code_llama_draft", DRAFT, args.draft_steps, 3e-3)):
        log(f"training {name} ({steps} steps of {args.batch} x {SEQ} tokens)")
        model, nparams, secs = train_model(kw, data, steps, args.batch, lr, eos, log)
        log(f"{name}: {nparams / 1e6:.2f} M parameters, {secs:.0f} s")
        hf = write_fixture(model, tok, args.out, name, prompts, log)
        log(f"{name}: greedy reproduces {100 * copy_rate(hf, tok, work):.1f}% of the expected "
            f"edit results' tokens (16 workload requests, position by position)")


if __name__ == "__main__":
    main()
