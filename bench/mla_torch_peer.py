#!/usr/bin/env python3
"""Floor peer for bench/mla_decode_bench.cu: the absorbed MLA decode in plain torch.

bf16 matmuls on contiguous latents (no paging, no fp8), one query token per sequence:
    scores = (q_latent @ c^T + q_pe @ kpe^T) * scale     [b, h, L]
    out    = softmax(scores) @ c                          [b, h, 512]
on the same shapes as the CUDA bench, timed with CUDA events (median of N after warm-up),
inputs rotated over several copies so the 60 MB L2 does not serve small shapes.

Usage: python3 bench/mla_torch_peer.py [--iters N]
The last lines are "MLA_BENCH impl=torch ..." rows in the CUDA bench's format.
"""
import argparse
import statistics

import torch

LATENT, ROPE = 512, 64
SHAPES = [  # (name, heads, batch, kv_len)
    ("h128_b128_compute", 128, 128, 4096),
    ("h16_b128_memory", 16, 128, 4096),
    ("h128_b1_latency", 128, 1, 4096),
]


def run(name, heads, batch, kv_len, iters, bw_tbps, peak_tflops):
    dev = torch.device("cuda")
    cache_bytes = batch * kv_len * (LATENT + ROPE) * 2
    copies = max(1, min(16, (256 << 20) // cache_bytes + 1))
    scale = 0.0721688
    data = []
    for _ in range(copies):
        c = torch.randn(batch, kv_len, LATENT, device=dev, dtype=torch.bfloat16)
        kpe = torch.randn(batch, kv_len, ROPE, device=dev, dtype=torch.bfloat16)
        ql = torch.randn(batch, heads, LATENT, device=dev, dtype=torch.bfloat16)
        qp = torch.randn(batch, heads, ROPE, device=dev, dtype=torch.bfloat16)
        data.append((c, kpe, ql, qp))

    def step(k):
        c, kpe, ql, qp = data[k]
        s = (torch.matmul(ql, c.transpose(1, 2)) + torch.matmul(qp, kpe.transpose(1, 2))) * scale
        p = torch.softmax(s.float(), dim=-1).to(torch.bfloat16)
        return torch.matmul(p, c)

    with torch.no_grad():
        for i in range(5):
            step(i % copies)
        torch.cuda.synchronize()
        times = []
        for i in range(iters):
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            step(i % copies)
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) * 1e-3)
    med, mn = statistics.median(times), min(times)
    flops = 2.0 * batch * heads * kv_len * (LATENT + ROPE + LATENT)
    floor = max(cache_bytes / (bw_tbps * 1e12), flops / (peak_tflops * 1e12))
    r = dict(shape=name, heads=heads, batch=batch, kv_len=kv_len, cache="bf16",
             median_us=med * 1e6, min_us=mn * 1e6, tflops=flops / med * 1e-12,
             cache_tbps=cache_bytes / med * 1e-12, floor_us=floor * 1e6)
    print(f"{name:18s} heads={heads:3d} batch={batch:3d} L={kv_len} bf16 copies={copies}: "
          f"median {r['median_us']:.1f} us (min {r['min_us']:.1f})  {r['tflops']:.1f} TFLOP/s  "
          f"{r['cache_tbps']:.2f} TB/s  floor {r['floor_us']:.1f} us")
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--bw-tbps", type=float, default=4.3)
    ap.add_argument("--tflops", type=float, default=790.0)
    args = ap.parse_args()
    results = [run(*s, args.iters, args.bw_tbps, args.tflops) for s in SHAPES]
    print(f"\n# torch peer, median of {args.iters} (floor: {args.bw_tbps:.2f} TB/s, "
          f"{args.tflops:.0f} TFLOP/s)")
    for r in results:
        print("MLA_BENCH impl=torch shape={shape} heads={heads} batch={batch} kv_len={kv_len} "
              "cache={cache} median_us={median_us:.2f} min_us={min_us:.2f} tflops={tflops:.1f} "
              "cache_tbps={cache_tbps:.3f} floor_us={floor_us:.2f}".format(**r))


if __name__ == "__main__":
    main()
