"""Is a gpt-oss GPU logit spike bf16's own error or the server's? (issue 51, item 6)

`gpu_tests "[gpt_oss_dump]"` (LLM_OSS_DUMP_DIR=DIR) writes the issue-shape random gpt-oss
checkpoint (DIR/model), the CPU decoder's greedy paths (which are transformers' fp32 paths) and
the server's CUDA per-step logit errors against the CPU, teacher-forced along those paths
(DIR/paths.json). This script runs transformers' GptOssForCausalLM along the same paths in fp32
and in bf16 (eager attention, TF32 off) and prints, per step, the relative L2 error of
transformers' own bf16 logits against its fp32 logits beside the server's: where transformers'
bf16 model shows the same spike on the same tokens, the spike is the model's sensitivity to bf16
rounding (random routers at top-2 amplify it), not a server bug.

    python3 tools/hf_fixtures/gpt_oss_bf16_error.py DIR [--spike 0.1]
"""

import argparse
import json
import os

import torch
import transformers


def rel_l2(a, b):
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


@torch.no_grad()
def step_logits(model, prompt, tokens):
    """Logits of the 64 greedy steps along prompt + tokens (one causal forward)."""
    ids = torch.tensor([prompt + tokens[:-1]], device="cuda")
    out = model(input_ids=ids).logits[0].float()
    return out[len(prompt) - 1:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--spike", type=float, default=0.1)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with open(os.path.join(args.dir, "paths.json")) as f:
        paths = json.load(f)["prompts"]
    mdir = os.path.join(args.dir, "model")
    fp32 = transformers.GptOssForCausalLM.from_pretrained(
        mdir, dtype=torch.float32, attn_implementation="eager").cuda().eval()
    bf16 = transformers.GptOssForCausalLM.from_pretrained(
        mdir, dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
    rows = []
    for i, p in enumerate(paths):
        ref = step_logits(fp32, p["prompt_ids"], p["cpu_tokens"])
        low = step_logits(bf16, p["prompt_ids"], p["cpu_tokens"])
        greedy_same = sum(int(a) == b for a, b in zip(ref.argmax(-1).tolist(), p["cpu_tokens"]))
        hf_rel = [rel_l2(low[k], ref[k]) for k in range(len(p["cpu_tokens"]))]
        ours = p["gpu_rel_l2"]
        print(f"prompt {i} (len {len(p['prompt_ids'])}): transformers fp32 greedy equals the "
              f"CPU's at {greedy_same}/{len(p['cpu_tokens'])} steps")
        for k, (h, g) in enumerate(zip(hf_rel, ours)):
            if h > args.spike or g > args.spike:
                print(f"  step {k}: server rel L2 {g:.4f}, transformers bf16 rel L2 {h:.4f}")
        rows.append((i, max(ours), max(hf_rel), sum(g > args.spike for g in ours),
                     sum(h > args.spike for h in hf_rel),
                     sum(g > args.spike and h > args.spike for g, h in zip(ours, hf_rel)),
                     sorted(ours)[len(ours) // 2], sorted(hf_rel)[len(hf_rel) // 2]))
    print(f"\nper prompt (spike: rel L2 above {args.spike}):")
    print("prompt | server max | hf bf16 max | server spikes | hf bf16 spikes | both | "
          "server median | hf bf16 median")
    for r in rows:
        print(f"{r[0]} | {r[1]:.4f} | {r[2]:.4f} | {r[3]} | {r[4]} | {r[5]} | {r[6]:.4f} | "
              f"{r[7]:.4f}")


if __name__ == "__main__":
    main()
