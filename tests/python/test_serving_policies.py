#!/usr/bin/python3
"""Serving policies over gRPC: admission control, deadlines, prefix caching, logprobs, and the
resource baseline afterwards (ctest style: exits 1 on the first failed check, printing why).

    /usr/bin/python3 tests/python/test_serving_policies.py --server-bin build/cpu/server/llm-server \
        --model build/cpu/models/tiny-llama --proto-python build/cpu/python
"""

import argparse
import subprocess
import sys
import threading
import time
import urllib.request


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def start_server(args, extra):
    cmd = [args.server_bin, "--model", args.model, "--listen-address", "127.0.0.1:0",
           "--metrics-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0"] + extra
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ports = {}
    deadline = time.monotonic() + 60
    log = []
    while time.monotonic() < deadline and "grpc" not in ports:
        line = proc.stdout.readline()
        if not line:
            break
        log.append(line)
        if line.startswith("METRICS_LISTENING "):
            ports["metrics"] = int(line.split()[1])
        if line.startswith("LISTENING "):
            ports["grpc"] = int(line.split()[1])
    if "grpc" not in ports:
        proc.kill()
        fail("server did not start:\n" + "".join(log[-20:]))
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, ports


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out


def wait_idle(port):
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        m = metrics(port)
        if (m["llm_num_requests_running"] == 0 and m["llm_num_requests_waiting"] == 0
                and m["llm_kv_cache_usage_perc"] == 0):
            return m
        time.sleep(0.1)
    fail(f"resources not back at baseline: {m}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server-bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--proto-python", required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.proto_python)
    import grpc
    from llm.v1 import generation_pb2 as pb
    from llm.v1 import generation_pb2_grpc as pb_grpc

    # One running sequence and a queue of two: the fourth concurrent request must be refused.
    proc, ports = start_server(args, ["--max-num-seqs", "1", "--max-queued-requests", "2",
                                      "--block-size", "16", "--num-kv-blocks", "128"])
    try:
        stub = pb_grpc.GenerationStub(grpc.insecure_channel(f"127.0.0.1:{ports['grpc']}"))

        def long_request(rid):
            return pb.GenerateRequest(
                request_id=rid, token_ids=pb.TokenIds(ids=[5, 6, 7, 8]),
                sampling=pb.SamplingParams(temperature=0.0),
                stopping=pb.StoppingParams(max_tokens=400, ignore_eos=True))

        # 1. Admission control: RESOURCE_EXHAUSTED at once past the queue limit.
        # hold-0 runs (its first token proves it); hold-1 and hold-2 fill the queue.
        streams = [stub.Generate(long_request("hold-0"), timeout=120)]
        next(iter(streams[0]))
        streams += [stub.Generate(long_request(f"hold-{i}"), timeout=120) for i in (1, 2)]
        deadline = time.monotonic() + 30  # both submitted and waiting behind hold-0
        while metrics(ports["metrics"]).get("llm_num_requests_waiting") != 2:
            if time.monotonic() > deadline:
                fail("the two queued requests never showed as waiting")
            time.sleep(0.05)
        try:
            list(stub.Generate(long_request("overflow"), timeout=30))
            fail("a request past max_queued_requests was accepted")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                fail(f"overflow got {e.code()} {e.details()}, expected RESOURCE_EXHAUSTED")
            print(f"ok: admission control -> RESOURCE_EXHAUSTED ({e.details()})")
        for s in streams:
            s.cancel()
        wait_idle(ports["metrics"])

        # 2. Deadline: a request that cannot finish in time ends with DEADLINE_EXCEEDED and its
        #    blocks are freed.
        t0 = time.monotonic()
        try:
            list(stub.Generate(long_request("deadline"), timeout=0.3))
            fail("a 400-token request finished within a 0.3 s deadline")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                fail(f"deadline request got {e.code()}, expected DEADLINE_EXCEEDED")
        if time.monotonic() - t0 > 5:
            fail("the deadline was not honored promptly")
        m = wait_idle(ports["metrics"])
        print("ok: deadline -> DEADLINE_EXCEEDED, KV usage back to 0")

        # 3. Prefix caching: the same 100-token prompt twice; the second reports cached tokens.
        prompt = [(i * 7 + 3) % 700 for i in range(100)]
        usages = []
        for rid in ("prefix-a", "prefix-b"):
            req = pb.GenerateRequest(request_id=rid, token_ids=pb.TokenIds(ids=prompt),
                                     sampling=pb.SamplingParams(temperature=0.0),
                                     stopping=pb.StoppingParams(max_tokens=4, ignore_eos=True))
            last = list(stub.Generate(req, timeout=60))[-1]
            usages.append(last.complete.usage)
        if usages[0].cached_tokens != 0:
            fail(f"first request reported {usages[0].cached_tokens} cached tokens")
        # Full 16-token blocks of the 100-token prompt, leaving at least one token to compute.
        if usages[1].cached_tokens != 96:
            fail(f"second request reported {usages[1].cached_tokens} cached tokens, expected 96")
        hits = metrics(ports["metrics"])["llm_prefix_cache_hits_total"]
        if hits < 6:
            fail(f"llm_prefix_cache_hits_total is {hits}, expected >= 6 blocks")
        print("ok: prefix cache -> cached_tokens 96 on the repeat, hit counter moved")

        # 4. Logprobs: chosen token plus top-N, sorted, the greedy choice on top.
        req = pb.GenerateRequest(request_id="lp", token_ids=pb.TokenIds(ids=[1, 2, 3]),
                                 sampling=pb.SamplingParams(temperature=0.0), logprobs=3,
                                 stopping=pb.StoppingParams(max_tokens=5, ignore_eos=True))
        lps = [lp for msg in stub.Generate(req, timeout=60) if msg.HasField("chunk")
               for lp in msg.chunk.logprobs]
        if len(lps) < 4:
            fail(f"expected a logprob entry per streamed token, got {len(lps)}")
        for lp in lps:
            tops = [t.logprob for t in lp.top]
            if len(tops) != 3 or tops != sorted(tops, reverse=True) or tops[0] > 0:
                fail(f"bad top logprobs {tops}")
            if lp.top[0].token_id != lp.token_id or abs(lp.top[0].logprob - lp.logprob) > 1e-6:
                fail("greedy token is not the top-1 logprob entry")
        print("ok: logprobs -> chosen token and sorted top-3 per token")
        wait_idle(ports["metrics"])

        # 5. Step-phase histograms: every non-empty step observed once in each phase.
        m = metrics(ports["metrics"])
        phases = ("schedule", "prepare", "forward", "sample")
        counts = [m.get(f"llm_engine_step_{p}_seconds_count", -1) for p in phases]
        if len(set(counts)) != 1 or not 0 < counts[0] <= m["llm_engine_steps_total"]:
            fail(f"step-phase counts {counts} vs {m['llm_engine_steps_total']} steps")
        if m["llm_engine_step_forward_seconds_sum"] <= 0:
            fail("no forward time recorded")
        print(f"ok: step phases observed over {int(counts[0])} steps")
        # CUDA-graph replays are counted; the CPU model has none.
        if m.get("llm_engine_graph_steps_total", -1) != 0:
            fail(f"llm_engine_graph_steps_total {m.get('llm_engine_graph_steps_total')} on the CPU")
        print("ok: graph-step counter present (0 on the CPU)")
        # The CPU model runs one step at a time.
        if m.get("llm_engine_overlapped_steps_total", -1) != 0:
            fail(f"llm_engine_overlapped_steps_total "
                 f"{m.get('llm_engine_overlapped_steps_total')} on the CPU")
        print("ok: overlapped-step counter present (0 on the CPU)")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            fail("server did not exit after SIGTERM")
    if proc.returncode != 0:
        fail(f"server exited with {proc.returncode}")
    print("test_serving_policies: OK")


if __name__ == "__main__":
    main()
