"""A tiny DeepSeek model served end to end over gRPC. Fixtures and options: conftest.py.

    /usr/bin/python3 -m pytest -q tests/python/test_deepseek_serve.py \
        --server-bin BUILD/server/llm-server --dump-bin BUILD/tools/llm-dump \
        --tokenizer BUILD/models/tiny-llama/tokenizer.json --proto-python BUILD/python

Writes a tiny random DeepSeek-V2 style model (q LoRA, yarn, MoE with shared experts; vocab 770
to fit the tiny-llama tokenizer.json copied in), serves it, and checks:
  * GetModelInfo names DeepseekV2ForCausalLM and the cpu_mla attention backend;
  * two concurrent streaming greedy requests (a token-id prompt and a text prompt tokenized by
    the server) return exactly llm-dump's greedy tokens for the same prompt ids, streamed as
    chunks followed by one complete message with finish reason LENGTH;
  * SIGTERM stops the server with exit code 0.
And a tiny DeepSeek-V3 with a multi-token-prediction layer served with --speculative-method mtp:
greedy streams equal llm-dump's tokens, and the MTP layer's drafts are counted.
"""
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import hf_deepseek_writer as dw
from conftest import HANG_S

MAX_TOKENS = 24
BLOCK_SIZE = 16
NUM_KV_BLOCKS = 64
TEXT = "DeepSeek latent attention, served over gRPC."


def run_dump(dump_bin, model_dir, prompts, workdir):
    req, out = os.path.join(workdir, "req.json"), os.path.join(workdir, "out.json")
    with open(req, "w") as f:
        json.dump({"max_new_tokens": MAX_TOKENS,
                   "requests": [{"prompt_ids": p, "arrival_step": 0} for p in prompts]}, f)
    cmd = [dump_bin, "--model", model_dir, "--requests", req, "--out", out,
           "--block-size", str(BLOCK_SIZE), "--num-blocks", str(NUM_KV_BLOCKS)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S * 3)
    assert proc.returncode == 0, f"llm-dump failed ({proc.returncode}): {proc.stderr[-2000:]}"
    with open(out) as f:
        return [r["output_ids"] for r in json.load(f)["requests"]]


def test_deepseek_serve(server, option, workdir, grpc, pb):
    # bos/eos as in the tiny-llama tokenizer's added tokens.
    spec = dw.v2_spec(seed=45, vocab=770, bos=768, eos=769)
    model_dir = dw.write_model(os.path.join(workdir, "tiny-deepseek-v2"), spec,
                               tokenizer_json=option("tokenizer"))
    s = server(["--block-size", BLOCK_SIZE, "--num-kv-blocks", NUM_KV_BLOCKS,
                "--shutdown-grace-s", 1], model=model_dir, name="deepseek")
    stub = s.stub()
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=HANG_S)
    assert info.architecture == "DeepseekV2ForCausalLM"
    assert info.attention_backend == "cpu_mla"
    text_ids = list(stub.Tokenize(pb.TokenizeRequest(text=TEXT), timeout=HANG_S).token_ids)
    prompts = {"ids": [5, 17, 300, 42, 7, 699, 123, 1, 64, 250, 9, 33, 401, 77, 12, 560, 2, 90],
               "text": text_ids}
    expected = dict(zip(prompts, run_dump(option("dump_bin"), model_dir, list(prompts.values()),
                                          str(workdir))))

    results = {}

    def stream(key):
        req = pb.GenerateRequest(request_id=f"ds-{key}")
        req.token_ids.ids.extend(prompts[key])
        req.sampling.temperature = 0.0
        req.stopping.max_tokens = MAX_TOKENS
        req.stopping.ignore_eos = True
        try:
            results[key] = list(stub.Generate(req, timeout=HANG_S))
        except grpc.RpcError as e:
            results[key] = e

    threads = [threading.Thread(target=stream, args=(k,)) for k in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key, msgs in results.items():
        assert not isinstance(msgs, Exception), f"{key}: {msgs.code()}: {msgs.details()}"
        kinds = [m.WhichOneof("response") for m in msgs]
        assert kinds and kinds[-1] == "complete" and kinds.count("complete") == 1, (key, kinds)
        ids = [i for m in msgs[:-1] for i in m.chunk.token_ids] + \
            list(msgs[-1].complete.token_ids)
        assert ids == expected[key], f"{key}: served tokens differ from llm-dump's"
        assert msgs[-1].complete.finish_reason == pb.FINISH_REASON_LENGTH, key
    assert sorted(results) == sorted(prompts)
    assert s.terminate() == 0


def write_mtp_model(out_dir, tokenizer_json):
    """A tiny DeepSeek-V3 with one multi-token-prediction layer: the writer's layer 2 becomes the
    MTP layer's decoder layer (num_hidden_layers 2, num_nextn_predict_layers 1), with its enorm,
    hnorm, eh_proj and shared_head.norm (embedding and head shared with the model)."""
    spec = dw.v3_spec(seed=30, vocab=770, bos=768, eos=769, layers=3)
    weights = dw.make_weights(spec)
    rng = np.random.default_rng(52)
    h, p = spec.hidden, "model.layers.2."
    for n in ("enorm", "hnorm", "shared_head.norm"):
        weights[p + n + ".weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
    weights[p + "eh_proj.weight"] = (rng.standard_normal((h, 2 * h)) / np.sqrt(2 * h)).astype(
        np.float32)
    config = dw.make_config(spec)
    config.update(num_hidden_layers=2, num_nextn_predict_layers=1)
    os.makedirs(out_dir, exist_ok=True)
    dw.hw.write_safetensors(os.path.join(out_dir, "model.safetensors"),
                            {k: (v, "F32") for k, v in weights.items()}, {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(tokenizer_json, "rb") as src, open(os.path.join(out_dir, "tokenizer.json"), "wb") as dst:
        dst.write(src.read())
    return out_dir


def test_deepseek_mtp_serve(server, option, workdir, pb):
    """--speculative-method mtp end to end: greedy streams are llm-dump's tokens (no
    speculation), the MTP layer drafts and the acceptance metrics count its drafts."""
    model_dir = write_mtp_model(os.path.join(workdir, "tiny-deepseek-v3-mtp"), option("tokenizer"))
    s = server(["--block-size", BLOCK_SIZE, "--num-kv-blocks", NUM_KV_BLOCKS,
                "--speculative-method", "mtp", "--num-speculative-tokens", 3,
                "--shutdown-grace-s", 1], model=model_dir, name="deepseek-mtp")
    stub = s.stub()
    prompts = [[5, 17, 300, 42, 7, 699, 123, 1, 64, 250, 9, 33], [9, 8, 7, 6, 5, 4, 3, 2] * 3]
    expected = run_dump(option("dump_bin"), model_dir, prompts, str(workdir))
    for i, prompt in enumerate(prompts):
        req = pb.GenerateRequest(request_id=f"mtp-{i}")
        req.token_ids.ids.extend(prompt)
        req.sampling.temperature = 0.0
        req.stopping.max_tokens = MAX_TOKENS
        req.stopping.ignore_eos = True
        msgs = list(stub.Generate(req, timeout=HANG_S))
        ids = [t for m in msgs[:-1] for t in m.chunk.token_ids] + list(msgs[-1].complete.token_ids)
        assert ids == expected[i], f"prompt {i}: served tokens differ from llm-dump's"
    m = s.metrics()
    assert m["llm_spec_decode_num_drafts_total"] > 0
    assert m["llm_spec_decode_num_accepted_tokens_total"] <= \
        m["llm_spec_decode_num_draft_tokens_total"]
    assert s.terminate() == 0


if __name__ == "__main__":  # the same as /usr/bin/python3 -m pytest THIS_FILE [options]
    sys.exit(pytest.main([__file__] + sys.argv[1:]))
