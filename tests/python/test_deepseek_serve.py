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
"""
import json
import os
import subprocess
import sys
import threading

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


if __name__ == "__main__":  # the same as /usr/bin/python3 -m pytest THIS_FILE [options]
    sys.exit(pytest.main([__file__] + sys.argv[1:]))
