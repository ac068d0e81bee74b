#!/usr/bin/python3
"""A tiny DeepSeek model served end to end over gRPC.

  /usr/bin/python3 tests/python/test_deepseek_serve.py --server-bin BUILD/server/llm-server \
      --dump-bin BUILD/tools/llm-dump --tokenizer BUILD/models/tiny-llama/tokenizer.json \
      --proto-python BUILD/python --workdir DIR

Writes a tiny random DeepSeek-V2 style model (q LoRA, yarn, MoE with shared experts; vocab 770
to fit the tiny-llama tokenizer.json copied in), starts llm-server on free loopback ports, and
checks:
  * GetModelInfo names DeepseekV2ForCausalLM and the cpu_mla attention backend;
  * two concurrent streaming greedy requests (a token-id prompt and a text prompt tokenized by
    the server) return exactly llm-dump's greedy tokens for the same prompt ids, streamed as
    chunks followed by one complete message with finish reason LENGTH;
then stops the server with SIGTERM. Exit status 0 = pass, 1 = fail.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hf_deepseek_writer as dw  # noqa: E402

MAX_TOKENS = 24
BLOCK_SIZE = 16
NUM_KV_BLOCKS = 64
STARTUP_TIMEOUT_S = 60
STREAM_TIMEOUT_S = 60
TEXT = "DeepSeek latent attention, served over gRPC."


def run_dump(dump_bin, model_dir, prompts, workdir):
    req, out = os.path.join(workdir, "req.json"), os.path.join(workdir, "out.json")
    with open(req, "w") as f:
        json.dump({"max_new_tokens": MAX_TOKENS,
                   "requests": [{"prompt_ids": p, "arrival_step": 0} for p in prompts]}, f)
    cmd = [dump_bin, "--model", model_dir, "--requests", req, "--out", out,
           "--block-size", str(BLOCK_SIZE), "--num-blocks", str(NUM_KV_BLOCKS)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"llm-dump failed ({proc.returncode}): {proc.stderr[-2000:]}")
    with open(out) as f:
        return [r["output_ids"] for r in json.load(f)["requests"]]


class Server:
    def __init__(self, server_bin, model_dir, log_path):
        self.cmd = [server_bin, "--model", model_dir,
                    "--listen-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0",
                    "--block-size", str(BLOCK_SIZE), "--num-kv-blocks", str(NUM_KV_BLOCKS),
                    "--shutdown-grace-s", "1"]
        self.log = open(log_path, "wb")
        self.port = None
        self._ready = threading.Event()
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._ready.wait(0.1):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before LISTENING")
        raise RuntimeError("server printed no 'LISTENING <port>'")

    def _read(self):
        for raw in iter(self.proc.stdout.readline, b""):
            self.log.write(raw)
            self.log.flush()
            line = raw.decode("utf-8", "replace")
            if self.port is None and line.startswith("LISTENING "):
                self.port = int(line.split()[1])
                self._ready.set()

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server-bin", required=True)
    ap.add_argument("--dump-bin", required=True)
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json with <= 770 tokens")
    ap.add_argument("--proto-python", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.proto_python))
    try:
        import grpc
        from llm.v1 import generation_pb2 as pb
        from llm.v1 import generation_pb2_grpc as pb_grpc
    except ImportError as e:
        print(f"FAIL: cannot import grpc / generated protos: {e}")
        return 1
    os.makedirs(args.workdir, exist_ok=True)
    t0 = time.time()
    # bos/eos as in the tiny-llama tokenizer's added tokens.
    spec = dw.v2_spec(seed=45, vocab=770, bos=768, eos=769)
    model_dir = dw.write_model(os.path.join(args.workdir, "tiny-deepseek-v2"), spec,
                               tokenizer_json=args.tokenizer)
    server = Server(os.path.abspath(args.server_bin), model_dir,
                    os.path.join(args.workdir, "server.log"))
    failures = []
    try:
        server.start()
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        stub = pb_grpc.GenerationStub(channel)
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
        print(f"model info: {info.architecture}, vocab {info.vocab_size}, backend "
              f"{info.attention_backend}, context {info.max_context_length}")
        if info.architecture != "DeepseekV2ForCausalLM":
            failures.append(f"architecture {info.architecture!r}")
        if info.attention_backend != "cpu_mla":
            failures.append(f"attention_backend {info.attention_backend!r}, expected cpu_mla")
        text_ids = list(stub.Tokenize(pb.TokenizeRequest(text=TEXT), timeout=30).token_ids)
        prompts = {"ids": [5, 17, 300, 42, 7, 699, 123, 1, 64, 250, 9, 33, 401, 77, 12, 560, 2, 90],
                   "text": text_ids}
        expected = dict(zip(prompts, run_dump(os.path.abspath(args.dump_bin), model_dir,
                                              list(prompts.values()), args.workdir)))

        results = {}

        def stream(key):
            req = pb.GenerateRequest(request_id=f"ds-{key}")
            req.token_ids.ids.extend(prompts[key])
            req.sampling.temperature = 0.0
            req.stopping.max_tokens = MAX_TOKENS
            req.stopping.ignore_eos = True
            try:
                results[key] = list(stub.Generate(req, timeout=STREAM_TIMEOUT_S))
            except grpc.RpcError as e:
                results[key] = e

        threads = [threading.Thread(target=stream, args=(k,)) for k in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(STREAM_TIMEOUT_S + 10)
        for key, msgs in results.items():
            if isinstance(msgs, Exception):
                failures.append(f"{key}: stream failed: {msgs.code()}: {msgs.details()}")
                continue
            kinds = [m.WhichOneof("response") for m in msgs]
            if not kinds or kinds[-1] != "complete" or kinds.count("complete") != 1:
                failures.append(f"{key}: bad message sequence {kinds}")
                continue
            ids = [i for m in msgs[:-1] for i in m.chunk.token_ids] + list(msgs[-1].complete.token_ids)
            fr = pb.FinishReason.Name(msgs[-1].complete.finish_reason)
            print(f"  {key}: prompt {len(prompts[key])} ids, {len(msgs) - 1} chunks, "
                  f"{len(ids)} tokens, {fr}; tokens == llm-dump: {ids == expected[key]}")
            if ids != expected[key]:
                failures.append(f"{key}: served {ids} != llm-dump {expected[key]}")
            if fr != "FINISH_REASON_LENGTH":
                failures.append(f"{key}: finish reason {fr}")
        if len(results) != len(prompts):
            failures.append(f"only {len(results)} of {len(prompts)} streams finished")
        channel.close()
    except Exception as e:  # noqa: BLE001
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        rc = server.stop()
        print(f"server stopped (exit {rc}); log {os.path.join(args.workdir, 'server.log')}")
    if rc not in (0, None):
        failures.append(f"server exited with {rc} after SIGTERM")
    print(f"elapsed {time.time() - t0:.1f}s")
    if failures:
        print("FAILED:")
        for f in failures:
            print(f"  - {f}")
        with open(os.path.join(args.workdir, "server.log"), "rb") as f:
            print(f.read().decode("utf-8", "replace")[-3000:])
        return 1
    print("PASSED: tiny DeepSeek served over gRPC, greedy tokens equal llm-dump's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
