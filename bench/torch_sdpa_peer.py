"""Peer measurement for the C8 attention benchmark: torch SDPA (cuDNN and FlashAttention
backends) on contiguous KV, same shapes, same GPU, same run. Run on the GPU machine:
    python3 bench/torch_sdpa_peer.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def bench(fn, iters=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def case(name, batch, q_len, kv_len, causal, backend):
    hq, hkv, d = 32, 8, 128
    q = torch.randn(batch, hq, q_len, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, hkv, kv_len, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, hkv, kv_len, d, device="cuda", dtype=torch.bfloat16)
    try:
        with sdpa_kernel(backend):
            ms = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                              enable_gqa=True))
    except RuntimeError as e:
        return f"| {name} | {backend.name} | n/a ({str(e).splitlines()[0][:60]}) | | |"
    kv_bytes = 2 * batch * kv_len * hkv * d * 2
    pairs = q_len * kv_len / (2 if causal else 1)
    flops = 4 * batch * hq * d * pairs
    return (f"| {name} | {backend.name} | {ms * 1000:.1f} | {kv_bytes / ms / 1e9:.2f} | "
            f"{flops / ms / 1e9:.1f} |")


print("| case | backend | time (us) | KV TB/s | TFLOP/s |\n|---|---|---|---|---|")
for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
    print(case("decode 64x4096", 64, 1, 4096, False, backend))
    print(case("decode 1x4096", 1, 1, 4096, False, backend))
    print(case("decode 32x16384", 32, 1, 16384, False, backend))
    print(case("prefill 1x4096 causal", 1, 4096, 4096, True, backend))
    print(case("prefill 4x4096 causal", 4, 4096, 4096, True, backend))
