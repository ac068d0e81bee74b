#!/usr/bin/python3
"""End-to-end test of llm-server over gRPC.

Starts the server on a free loopback port with the tiny random model and a small KV pool, runs a
series of checks against the public API (proto/llm/v1/generation.proto), then stops it with
SIGTERM. Prints one line per check and exits non-zero if any check failed.

Run with Debian's interpreter (it has python3-grpcio and python3-protobuf):
  /usr/bin/python3 tests/python/test_server_e2e.py --server-bin build/cpu/server/llm-server \
      --model build/cpu/models/tiny-llama --proto-python build/cpu/python
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid

# Server sizing. Capacity is NUM_KV_BLOCKS * BLOCK_SIZE = 1536 tokens; every concurrent test
# below keeps its total (prompt + max_tokens) within that, so nothing gets preempted.
BLOCK_SIZE = 16
NUM_KV_BLOCKS = 96
MAX_TOKENS_LIMIT = 512
SHUTDOWN_GRACE_S = 1

STARTUP_TIMEOUT_S = 60
RPC_TIMEOUT_S = 30       # unary calls
STREAM_TIMEOUT_S = 60    # whole Generate streams
WATCHDOG_S = 240         # hard stop for the whole test

grpc = None
pb = None
pb_grpc = None


class CheckFailed(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise CheckFailed(msg)


# ------------------------------------------------------------------------------------------------
# Server process
# ------------------------------------------------------------------------------------------------

class Server:
    def __init__(self, server_bin, model_dir):
        self.log = tempfile.NamedTemporaryFile(prefix="llm-server-e2e-", suffix=".log", delete=False)
        self.log_path = self.log.name
        self.log_lock = threading.Lock()
        self.port = None
        self.cmd = [
            server_bin, "--model", model_dir,
            "--listen-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0",
            "--max-tokens-limit", str(MAX_TOKENS_LIMIT),
            "--kv-cache-memory-mb", "64",
            "--num-kv-blocks", str(NUM_KV_BLOCKS),
            "--block-size", str(BLOCK_SIZE),
            "--shutdown-grace-s", str(SHUTDOWN_GRACE_S),
        ]
        self.proc = None
        self._listening = threading.Event()
        self._reader = None

    def start(self):
        print("starting: " + " ".join(self.cmd), flush=True)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._listening.wait(0.1):
                return
            if self.proc.poll() is not None:
                raise CheckFailed("server exited with code %s before LISTENING" % self.proc.returncode)
        raise CheckFailed("server printed no 'LISTENING <port>' within %d s" % STARTUP_TIMEOUT_S)

    def _read_stdout(self):
        # Drain stdout (and the merged log) for the whole life of the process so it never blocks.
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace")
            with self.log_lock:
                self.log.write(raw)
                self.log.flush()
            if self.port is None and line.startswith("LISTENING "):
                try:
                    self.port = int(line.split()[1])
                    self._listening.set()
                except (IndexError, ValueError):
                    pass

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def expect_alive(self):
        if self.proc.poll() is not None:
            raise CheckFailed("server process died (exit code %s)" % self.proc.returncode)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def tail(self, n=40):
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
            return "\n".join(lines[-n:])
        except OSError:
            return "(no log)"


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------

def make_request(text=None, ids=None, request_id="", temperature=None, top_p=None, top_k=None,
                 min_p=None, seed=None, max_tokens=None, ignore_eos=None, stop=None):
    req = pb.GenerateRequest(request_id=request_id)
    if text is not None:
        req.text = text
    if ids is not None:
        req.token_ids.ids.extend(ids)
        req.token_ids.SetInParent()
    s = req.sampling
    if temperature is not None:
        s.temperature = temperature
    if top_p is not None:
        s.top_p = top_p
    if top_k is not None:
        s.top_k = top_k
    if min_p is not None:
        s.min_p = min_p
    if seed is not None:
        s.seed = seed
    t = req.stopping
    if max_tokens is not None:
        t.max_tokens = max_tokens
    if ignore_eos is not None:
        t.ignore_eos = ignore_eos
    if stop:
        t.stop.extend(stop)
    return req


class StreamResult:
    def __init__(self, msgs, error):
        self.msgs = msgs
        self.error = error  # grpc.RpcError or None

    def code(self):
        return None if self.error is None else self.error.code()

    def details(self):
        return "" if self.error is None else (self.error.details() or "")


def run_stream(stub, req, timeout=STREAM_TIMEOUT_S):
    msgs = []
    try:
        for m in stub.Generate(req, timeout=timeout):
            msgs.append(m)
    except grpc.RpcError as e:
        return StreamResult(msgs, e)
    return StreamResult(msgs, None)


class Generation:
    """A successfully completed stream, validated: chunks, then exactly one complete, last."""

    def __init__(self, res, request_id=None, what="stream"):
        if res.error is not None:
            raise CheckFailed("%s failed: %s: %s" % (what, res.code(), res.details()))
        msgs = res.msgs
        expect(msgs, "%s: no messages and status OK (expected a final complete)" % what)
        kinds = [m.WhichOneof("response") for m in msgs]
        expect(kinds[-1] == "complete",
               "%s: last message is %r, expected 'complete' (kinds=%s)" % (what, kinds[-1], kinds))
        expect(kinds.count("complete") == 1,
               "%s: %d complete messages, expected exactly one" % (what, kinds.count("complete")))
        expect(all(k == "chunk" for k in kinds[:-1]),
               "%s: non-chunk message before complete: %s" % (what, kinds))
        rids = {m.request_id for m in msgs}
        expect(len(rids) == 1 and "" not in rids,
               "%s: request_id in responses not one non-empty value: %s" % (what, rids))
        if request_id:
            expect(rids == {request_id}, "%s: request_id %s != %r" % (what, rids, request_id))
        self.msgs = msgs
        self.complete = msgs[-1].complete
        self.num_chunks = len(msgs) - 1
        self.ids = []
        self.text = ""
        for m in msgs[:-1]:
            self.ids.extend(m.chunk.token_ids)
            self.text += m.chunk.text
        self.ids.extend(self.complete.token_ids)
        self.text += self.complete.text
        self.finish = self.complete.finish_reason
        self.usage = self.complete.usage


def generate(stub, req, what="stream", timeout=STREAM_TIMEOUT_S):
    return Generation(run_stream(stub, req, timeout), req.request_id, what)


def fr_name(v):
    return pb.FinishReason.Name(v)


def expect_rpc_error(fn, code, substrings, what):
    try:
        res = fn()
    except grpc.RpcError as e:
        err = e
    else:
        if isinstance(res, StreamResult):
            err = res.error
            if err is None:
                raise CheckFailed("%s: expected %s, got OK with %d messages"
                                  % (what, code.name, len(res.msgs)))
            if res.msgs:
                raise CheckFailed("%s: expected %s with no messages, got %d messages first"
                                  % (what, code.name, len(res.msgs)))
        else:
            raise CheckFailed("%s: expected %s, got OK" % (what, code.name))
    expect(err.code() == code, "%s: expected %s, got %s: %s"
           % (what, code.name, err.code(), err.details()))
    details = err.details() or ""
    for s in substrings:
        expect(s.lower() in details.lower(),
               "%s: message %r does not mention %r" % (what, details, s))
    return details


def unique_id(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


def wait_until_released(stub, request_id, timeout=10.0):
    """Abort(id) answers found=false once the server has no running or waiting request `id`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not stub.Abort(pb.AbortRequest(request_id=request_id), timeout=RPC_TIMEOUT_S).found:
            return
        time.sleep(0.05)
    raise CheckFailed("request %r still known to the server %.0f s after it ended"
                      % (request_id, timeout))


# ------------------------------------------------------------------------------------------------
# Checks
# ------------------------------------------------------------------------------------------------

class Ctx:
    def __init__(self, server, channel):
        self.server = server
        self.channel = channel
        self.stub = pb_grpc.GenerationStub(channel)
        self.info = None


PROMPT = "Hello world, this is a small test of the decode server."


def check_model_info(c):
    info = c.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=RPC_TIMEOUT_S)
    c.info = info
    expect(info.vocab_size > 0, "vocab_size is %d" % info.vocab_size)
    expect(info.max_context_length > 0, "max_context_length is %d" % info.max_context_length)
    expect(info.attention_backend, "attention_backend is empty")
    expect(info.max_tokens_limit == MAX_TOKENS_LIMIT,
           "max_tokens_limit %d != --max-tokens-limit %d" % (info.max_tokens_limit, MAX_TOKENS_LIMIT))
    expect(info.kv_block_size == BLOCK_SIZE,
           "kv_block_size %d != --block-size %d" % (info.kv_block_size, BLOCK_SIZE))
    expect(info.kv_num_blocks == NUM_KV_BLOCKS,
           "kv_num_blocks %d != --num-kv-blocks %d" % (info.kv_num_blocks, NUM_KV_BLOCKS))
    expect(info.max_context_length <= info.kv_num_blocks * info.kv_block_size,
           "max_context_length %d exceeds the KV capacity %d"
           % (info.max_context_length, info.kv_num_blocks * info.kv_block_size))
    for e in info.eos_token_ids:
        expect(0 <= e < info.vocab_size, "eos id %d outside the vocabulary" % e)
    expect(info.bos_token_id == -1 or 0 <= info.bos_token_id < info.vocab_size,
           "bos_token_id %d invalid" % info.bos_token_id)

    # grpc.health.v1.Health/Check, generic (bytes in, bytes out).
    check = c.channel.unary_unary("/grpc.health.v1.Health/Check")
    resp = check(b"", timeout=RPC_TIMEOUT_S)  # HealthCheckRequest{service: ""}
    expect(resp == b"\x08\x01", "health check returned %r, expected SERVING (b'\\x08\\x01')" % resp)

    # Server reflection: ServerReflectionRequest{list_services: ""} = field 7, length-delimited.
    refl = c.channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    responses = list(refl(iter([b"\x3a\x00"]), timeout=RPC_TIMEOUT_S))
    expect(responses, "reflection returned no response")
    expect(any(b"llm.v1.Generation" in r for r in responses),
           "reflection list_services does not mention llm.v1.Generation: %r" % responses)
    return "vocab %d, context %d, backend %s, kv %d x %d, health SERVING, reflection ok" % (
        info.vocab_size, info.max_context_length, info.attention_backend, info.kv_num_blocks,
        info.kv_block_size)


def check_tokenize(c):
    texts = ["Hello, world! The quick brown fox jumps over the lazy dog 12345.",
             "h\u00e9llo w\u00f6rld \u2014 \u65e5\u672c\u8a9e \U0001F642 \u2211 caf\u00e9"]
    for t in texts:
        ids = list(c.stub.Tokenize(pb.TokenizeRequest(text=t, add_special_tokens=False),
                                   timeout=RPC_TIMEOUT_S).token_ids)
        expect(ids, "Tokenize(%r) returned no ids" % t)
        expect(all(0 <= i < c.info.vocab_size for i in ids),
               "Tokenize(%r) returned ids outside the vocabulary: %s" % (t, ids))
        back = c.stub.Detokenize(pb.DetokenizeRequest(token_ids=ids), timeout=RPC_TIMEOUT_S).text
        expect(back == t, "round trip changed the text: %r -> %s -> %r" % (t, ids, back))
    if c.info.bos_token_id >= 0:
        ids = list(c.stub.Tokenize(pb.TokenizeRequest(text=texts[0]), timeout=RPC_TIMEOUT_S).token_ids)
        expect(ids and ids[0] == c.info.bos_token_id,
               "Tokenize with default add_special_tokens does not start with BOS %d: %s"
               % (c.info.bos_token_id, ids[:5]))
    for bad in (c.info.vocab_size, c.info.vocab_size + 100, -1):
        expect_rpc_error(
            lambda: c.stub.Detokenize(pb.DetokenizeRequest(token_ids=[1, bad]), timeout=RPC_TIMEOUT_S),
            grpc.StatusCode.INVALID_ARGUMENT, ["outside the vocabulary"], "Detokenize([1, %d])" % bad)
    return "ASCII + unicode round trips; out-of-range ids rejected"


def check_streaming(c):
    n = 24
    prompt_ids = list(c.stub.Tokenize(pb.TokenizeRequest(text=PROMPT), timeout=RPC_TIMEOUT_S).token_ids)
    req = make_request(text=PROMPT, temperature=0.0, max_tokens=n, ignore_eos=True)
    g = generate(c.stub, req, "greedy text stream")
    expect(len(g.ids) == n, "got %d token ids, expected %d" % (len(g.ids), n))
    expect(g.usage.completion_tokens == n,
           "usage.completion_tokens %d != %d" % (g.usage.completion_tokens, n))
    expect(g.usage.prompt_tokens == len(prompt_ids),
           "usage.prompt_tokens %d != len(Tokenize(text)) %d" % (g.usage.prompt_tokens, len(prompt_ids)))
    expect(g.finish == pb.FINISH_REASON_LENGTH, "finish_reason %s, expected LENGTH" % fr_name(g.finish))
    expect(g.num_chunks >= 1, "no chunk messages before the complete")
    expect(all(0 <= i < c.info.vocab_size for i in g.ids), "generated ids outside the vocabulary")
    detok = c.stub.Detokenize(pb.DetokenizeRequest(token_ids=g.ids), timeout=RPC_TIMEOUT_S).text
    expect(g.text == detok, "streamed text != Detokenize(ids):\n  streamed   %r\n  detokenize %r\n  ids %s"
           % (g.text, detok, g.ids))

    g2 = generate(c.stub, req, "second greedy text stream")
    expect(g2.ids == g.ids, "greedy run is not reproducible:\n  %s\n  %s" % (g.ids, g2.ids))
    expect(g2.text == g.text, "greedy text differs between runs")

    # Token-id prompt: the same ids as the text prompt tokenizes to must give the same output.
    g3 = generate(c.stub, make_request(ids=prompt_ids, temperature=0.0, max_tokens=n, ignore_eos=True),
                  "greedy token-id stream")
    expect(g3.usage.prompt_tokens == len(prompt_ids),
           "token-id prompt: prompt_tokens %d != %d" % (g3.usage.prompt_tokens, len(prompt_ids)))
    expect(g3.ids == g.ids, "token-id prompt gives different greedy tokens than the text prompt:\n"
           "  text %s\n  ids  %s" % (g.ids, g3.ids))
    # A token-id prompt of arbitrary ids.
    g4 = generate(c.stub, make_request(ids=[5, 17, 300, 42, 7], temperature=0.0, max_tokens=8,
                                       ignore_eos=True), "token-id stream")
    expect(len(g4.ids) == 8 and g4.usage.completion_tokens == 8 and g4.usage.prompt_tokens == 5,
           "token-id prompt: %d ids, usage %s" % (len(g4.ids), g4.usage))
    return "%d ids in %d chunks + complete, prompt_tokens %d, LENGTH, text == Detokenize, " \
           "deterministic, token-id prompts ok" % (n, g.num_chunks, len(prompt_ids))


def seeded_request():
    return make_request(text="Once upon a time", temperature=0.8, top_p=0.9, top_k=50, seed=1234,
                        max_tokens=32, ignore_eos=True)


def check_seeded(c):
    alone = generate(c.stub, seeded_request(), "seeded stream (alone)")
    expect(len(alone.ids) == 32, "seeded stream gave %d ids" % len(alone.ids))
    alone2 = generate(c.stub, seeded_request(), "seeded stream (alone, again)")
    expect(alone2.ids == alone.ids, "seeded run is not reproducible:\n  %s\n  %s" % (alone.ids, alone2.ids))

    rng = random.Random(99)
    results = {}
    errors = []

    def worker(key, req):
        try:
            results[key] = run_stream(c.stub, req)
        except Exception as e:  # noqa: BLE001
            errors.append("%s: %r" % (key, e))

    threads = []
    for i in range(6):
        ids = [rng.randrange(0, c.info.vocab_size - 2) for _ in range(rng.randint(3, 40))]
        req = make_request(ids=ids, temperature=1.0, max_tokens=rng.randint(10, 60), ignore_eos=True)
        threads.append(threading.Thread(target=worker, args=("noise%d" % i, req)))
    threads.insert(3, threading.Thread(target=worker, args=("seeded", seeded_request())))
    for t in threads:
        t.start()
    for t in threads:
        t.join(STREAM_TIMEOUT_S + 10)
    expect(not errors, "client errors: %s" % errors)
    expect(len(results) == 7, "only %d of 7 concurrent streams finished" % len(results))
    for k, r in sorted(results.items()):
        Generation(r, what=k)
    conc = Generation(results["seeded"], what="seeded (concurrent)")
    expect(conc.ids == alone.ids, "seeded sampling differs when batched with other requests:\n"
           "  alone      %s\n  concurrent %s" % (alone.ids, conc.ids))
    return "seed 1234 gives the same 32 tokens alone, again, and among 6 concurrent requests"


def check_abort(c):
    # Abort RPC mid-stream.
    rid = unique_id("abort")
    req = make_request(text=PROMPT, request_id=rid, temperature=0.0, max_tokens=400, ignore_eos=True)
    call = c.stub.Generate(req, timeout=STREAM_TIMEOUT_S)
    msgs = []
    it = iter(call)
    for _ in range(3):
        m = next(it)
        expect(m.WhichOneof("response") == "chunk", "expected chunks first, got %s" % m)
        msgs.append(m)
    found = c.stub.Abort(pb.AbortRequest(request_id=rid), timeout=RPC_TIMEOUT_S).found
    expect(found, "Abort(%r) of a running request returned found=false" % rid)
    try:
        for m in it:
            msgs.append(m)
    except grpc.RpcError as e:
        raise CheckFailed("aborted stream ended with status %s: %s (expected a complete ABORTED)"
                          % (e.code(), e.details()))
    g = Generation(StreamResult(msgs, None), rid, "aborted stream")
    if g.finish == pb.FINISH_REASON_LENGTH:
        expect(len(g.ids) == 400, "aborted stream raced to LENGTH but has %d ids" % len(g.ids))
        note = "complete raced the abort (LENGTH)"
    else:
        expect(g.finish == pb.FINISH_REASON_ABORTED,
               "aborted stream finish_reason %s, expected ABORTED" % fr_name(g.finish))
        expect(len(g.ids) < 400, "aborted stream still produced all 400 tokens")
        expect(g.usage.completion_tokens == len(g.ids),
               "aborted: completion_tokens %d != %d ids received"
               % (g.usage.completion_tokens, len(g.ids)))
        note = "ABORTED after %d tokens" % len(g.ids)
    wait_until_released(c.stub, rid)
    expect(not c.stub.Abort(pb.AbortRequest(request_id=unique_id("nope")), timeout=RPC_TIMEOUT_S).found,
           "Abort of an unknown id returned found=true")
    # The id is free again: reuse it.
    g = generate(c.stub, make_request(text=PROMPT, request_id=rid, temperature=0.0, max_tokens=4,
                                      ignore_eos=True), "request reusing an aborted id")
    expect(len(g.ids) == 4, "reused-id request gave %d ids" % len(g.ids))

    # Client-side cancel.
    cancelled = []
    for k in range(2):
        crid = unique_id("cancel")
        call = c.stub.Generate(make_request(text=PROMPT, request_id=crid, temperature=0.0,
                                            max_tokens=400, ignore_eos=True), timeout=STREAM_TIMEOUT_S)
        it = iter(call)
        for _ in range(2 + k):
            next(it)
        call.cancel()
        try:
            for _ in it:
                pass
            raise CheckFailed("cancelled stream ended normally")
        except grpc.RpcError as e:
            expect(e.code() == grpc.StatusCode.CANCELLED, "cancelled stream: status %s" % e.code())
        cancelled.append(crid)
    for crid in cancelled:
        wait_until_released(c.stub, crid)  # the server dropped the cancelled requests
    c.server.expect_alive()
    g = generate(c.stub, make_request(text=PROMPT, temperature=0.0, max_tokens=16, ignore_eos=True),
                 "request after cancels")
    expect(len(g.ids) == 16 and g.finish == pb.FINISH_REASON_LENGTH,
           "request after cancels: %d ids, %s" % (len(g.ids), fr_name(g.finish)))
    return "%s; unknown id found=false; id reusable; 2 client cancels released; server still serves" % note


def check_concurrent(c):
    n = 16
    rng = random.Random(7)
    specs = []
    for i in range(n):
        max_tokens = [4, 9, 17, 33, 48, 64][i % 6] + rng.randint(0, 3)
        if i % 2:
            req = make_request(text="Request number %d says: %s" % (i, "abc " * (i % 5)),
                               request_id=unique_id("conc%d" % i), temperature=0.0,
                               max_tokens=max_tokens, ignore_eos=True)
        else:
            ids = [rng.randrange(0, c.info.vocab_size - 2) for _ in range(rng.randint(2, 30))]
            req = make_request(ids=ids, request_id=unique_id("conc%d" % i), temperature=0.9,
                               top_k=40, seed=i, max_tokens=max_tokens, ignore_eos=True)
        specs.append(req)
    results = [None] * n
    errors = []

    def worker(i):
        try:
            results[i] = run_stream(c.stub, specs[i])
        except Exception as e:  # noqa: BLE001
            errors.append("%d: %r" % (i, e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(STREAM_TIMEOUT_S + 10)
    expect(not errors, "client errors: %s" % errors)
    total = 0
    for i, (req, res) in enumerate(zip(specs, results)):
        expect(res is not None, "request %d did not finish" % i)
        g = Generation(res, req.request_id, "concurrent request %d" % i)
        want = req.stopping.max_tokens
        expect(len(g.ids) == want and g.usage.completion_tokens == want,
               "concurrent request %d: %d ids, completion_tokens %d, expected %d"
               % (i, len(g.ids), g.usage.completion_tokens, want))
        expect(g.finish == pb.FINISH_REASON_LENGTH,
               "concurrent request %d: finish_reason %s" % (i, fr_name(g.finish)))
        total += want
    return "%d streams, %d tokens in %.1f s" % (n, total, time.monotonic() - start)


def check_invalid(c):
    V = c.info.vocab_size
    L = c.info.max_context_length
    IA = grpc.StatusCode.INVALID_ARGUMENT
    base = dict(temperature=0.0, max_tokens=4)
    cases = [
        ("empty text prompt", make_request(text="", **base), ["empty"]),
        ("empty token-id prompt", make_request(ids=[], **base), ["empty"]),
        ("no prompt", make_request(**base), ["empty"]),
        ("token id vocab+5", make_request(ids=[1, 2, V + 5], **base), ["outside the vocabulary"]),
        ("token id -1", make_request(ids=[-1, 3], **base), ["outside the vocabulary"]),
        ("prompt of max_context_length tokens", make_request(ids=[i % (V - 2) for i in range(L)], **base),
         ["context"]),
        ("max_tokens 0", make_request(text=PROMPT, temperature=0.0, max_tokens=0), ["max_tokens"]),
        ("max_tokens -3", make_request(text=PROMPT, temperature=0.0, max_tokens=-3), ["max_tokens"]),
        ("max_tokens above limit", make_request(text=PROMPT, temperature=0.0,
                                                max_tokens=c.info.max_tokens_limit + 1), ["max_tokens"]),
        ("temperature -1", make_request(text=PROMPT, temperature=-1.0, max_tokens=4), ["temperature"]),
        ("temperature NaN", make_request(text=PROMPT, temperature=float("nan"), max_tokens=4),
         ["temperature"]),
        ("temperature inf", make_request(text=PROMPT, temperature=float("inf"), max_tokens=4),
         ["temperature"]),
        ("top_p 0", make_request(text=PROMPT, top_p=0.0, max_tokens=4), ["top_p"]),
        ("top_p 1.5", make_request(text=PROMPT, top_p=1.5, max_tokens=4), ["top_p"]),
        ("top_k -1", make_request(text=PROMPT, top_k=-1, max_tokens=4), ["top_k"]),
        ("min_p 2", make_request(text=PROMPT, min_p=2.0, max_tokens=4), ["min_p"]),
        ("empty stop string", make_request(text=PROMPT, max_tokens=4, stop=[""]), ["stop"]),
    ]
    for what, req, subs in cases:
        expect_rpc_error(lambda: run_stream(c.stub, req, timeout=RPC_TIMEOUT_S), IA, subs, what)

    # Duplicate request_id while the first is still running.
    rid = unique_id("dup")
    call = c.stub.Generate(make_request(text=PROMPT, request_id=rid, temperature=0.0, max_tokens=400,
                                        ignore_eos=True), timeout=STREAM_TIMEOUT_S)
    try:
        it = iter(call)
        next(it)  # running now
        expect_rpc_error(lambda: run_stream(c.stub, make_request(text=PROMPT, request_id=rid,
                                                                 max_tokens=4), timeout=RPC_TIMEOUT_S),
                         IA, ["already in use"], "duplicate request_id")
        # The rejected duplicate must not have disturbed the original: abort it and expect ABORTED.
        expect(c.stub.Abort(pb.AbortRequest(request_id=rid), timeout=RPC_TIMEOUT_S).found,
               "original request lost after a rejected duplicate id")
        rest = list(it)
        expect(rest and rest[-1].WhichOneof("response") == "complete",
               "original stream did not end with a complete after the duplicate was rejected")
    finally:
        call.cancel()
    wait_until_released(c.stub, rid)
    c.server.expect_alive()
    return "%d bad requests rejected with INVALID_ARGUMENT + a clear message, duplicate id too" % len(cases)


def check_stop(c):
    n = 40
    base = generate(c.stub, make_request(text=PROMPT, temperature=0.0, max_tokens=n, ignore_eos=True),
                    "stop: reference stream")
    T = base.text
    s = None
    if len(T) >= 12:
        mid = len(T) // 2
        for width in (5, 4, 6, 3):
            cand = T[mid:mid + width]
            if len(cand) == width and T.find(cand) >= 3:
                s = cand
                break
    if s is None:
        # Degenerate text: use the text of a later token that first appears after position 0.
        for k in range(len(base.ids) - 1, 0, -1):
            cand = c.stub.Detokenize(pb.DetokenizeRequest(token_ids=[base.ids[k]]),
                                     timeout=RPC_TIMEOUT_S).text
            if cand and T.find(cand) > 0:
                s = cand
                break
    expect(s is not None, "cannot pick a stop string from the generated text %r" % T)
    idx = T.find(s)
    want = T[:idx]
    g = generate(c.stub, make_request(text=PROMPT, temperature=0.0, max_tokens=n, ignore_eos=True,
                                      stop=[s]), "stop: stream with stop=[%r]" % s)
    expect(g.finish == pb.FINISH_REASON_STOP, "finish_reason %s, expected STOP (stop=%r, text %r)"
           % (fr_name(g.finish), s, T))
    expect(g.complete.matched_stop == s, "matched_stop %r != %r" % (g.complete.matched_stop, s))
    expect(g.text == want, "text with stop=%r is %r, expected %r (full text %r)" % (s, g.text, want, T))
    expect(g.ids == base.ids[:len(g.ids)], "stop run generated different tokens")
    expect(len(g.ids) < n, "stop run still generated all %d tokens" % n)
    expect(g.usage.completion_tokens == len(g.ids),
           "completion_tokens %d != %d ids" % (g.usage.completion_tokens, len(g.ids)))
    return "stop=%r at char %d of %d: text cut there, STOP, matched_stop ok (%d tokens)" % (
        s, idx, len(T), len(g.ids))


def check_kv_pool(c):
    info = c.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=RPC_TIMEOUT_S)
    capacity = info.kv_num_blocks * info.kv_block_size
    expect(info.kv_num_blocks == NUM_KV_BLOCKS, "kv_num_blocks changed to %d" % info.kv_num_blocks)
    max_tokens = min(400, info.max_tokens_limit)
    # Leave one block of slack: the request needs (capacity - 16) tokens of the pool.
    prompt_len = min(capacity, info.max_context_length) - info.kv_block_size - max_tokens
    expect(prompt_len > 0, "KV pool too small for this check")
    rng = random.Random(5)
    ids = [rng.randrange(0, info.vocab_size - 2) for _ in range(prompt_len)]
    needed = -(-(prompt_len + max_tokens) // info.kv_block_size)
    start = time.monotonic()
    for rep in range(2):
        g = generate(c.stub, make_request(ids=ids, temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                          request_id=unique_id("kvfill")),
                     "request needing %d of %d KV blocks (run %d)" % (needed, info.kv_num_blocks, rep + 1),
                     timeout=90)
        expect(len(g.ids) == max_tokens and g.usage.completion_tokens == max_tokens
               and g.finish == pb.FINISH_REASON_LENGTH,
               "big request: %d ids, completion %d, %s" % (len(g.ids), g.usage.completion_tokens,
                                                           fr_name(g.finish)))
        expect(g.usage.prompt_tokens == prompt_len, "prompt_tokens %d != %d" % (g.usage.prompt_tokens,
                                                                                prompt_len))
    return "prompt %d + %d tokens (%d of %d blocks) completed twice in %.1f s: no blocks leaked" % (
        prompt_len, max_tokens, needed, info.kv_num_blocks, time.monotonic() - start)


def check_sigterm(c):
    c.server.expect_alive()
    proc = c.server.proc
    rid = unique_id("term")
    # A long prompt makes each decode step slow enough that the stream usually outlives the
    # shutdown grace period, so the engine's abort-on-shutdown path gets exercised; finishing
    # within the grace period (a complete) is fine too.
    info = c.info
    prompt_len = min(info.max_context_length, info.kv_num_blocks * info.kv_block_size) \
        - MAX_TOKENS_LIMIT - 2 * info.kv_block_size
    rng = random.Random(11)
    ids = [rng.randrange(0, info.vocab_size - 2) for _ in range(max(prompt_len, 8))]
    req = make_request(ids=ids, request_id=rid, temperature=0.0, max_tokens=MAX_TOKENS_LIMIT,
                       ignore_eos=True)
    call = c.stub.Generate(req, timeout=STREAM_TIMEOUT_S)
    it = iter(call)
    msgs = [next(it), next(it)]
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    # A request arriving during shutdown must be refused (UNAVAILABLE), not accepted.
    time.sleep(0.3)
    late = run_stream(c.stub, make_request(text=PROMPT, max_tokens=4), timeout=10)
    error = None
    try:
        for m in it:
            msgs.append(m)
    except grpc.RpcError as e:
        error = e
    kinds = [m.WhichOneof("response") for m in msgs]
    expect(kinds.count("complete") <= 1, "in-flight stream got %d completes" % kinds.count("complete"))
    if "complete" in kinds:
        expect(kinds[-1] == "complete", "messages after the complete: %s" % kinds)
        expect(error is None, "stream had a complete and then status %s" % (error and error.code()))
        g = Generation(StreamResult(msgs, None), rid, "in-flight stream at SIGTERM")
        outcome = "complete %s after %d tokens" % (fr_name(g.finish), len(g.ids))
    else:
        expect(error is not None, "in-flight stream ended with OK and no complete message")
        outcome = "status %s (%s)" % (error.code().name, error.details())
    try:
        rc = proc.wait(15)
    except subprocess.TimeoutExpired:
        raise CheckFailed("server still running %.0f s after SIGTERM" % (time.monotonic() - t0))
    elapsed = time.monotonic() - t0
    expect(rc == 0, "server exited with code %s after SIGTERM, expected 0" % rc)
    expect(late.error is not None and late.error.code() == grpc.StatusCode.UNAVAILABLE,
           "request sent during shutdown: expected UNAVAILABLE, got %s" %
           ("OK (%d messages)" % len(late.msgs) if late.error is None else late.error.code()))
    return "in-flight stream ended with %s; late request UNAVAILABLE; exit 0 after %.1f s" % (
        outcome, elapsed)


# ------------------------------------------------------------------------------------------------

def main():
    global grpc, pb, pb_grpc
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server-bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--proto-python", required=True)
    args = ap.parse_args()

    sys.path.insert(0, os.path.abspath(args.proto_python))
    try:
        import grpc as _grpc
        from llm.v1 import generation_pb2 as _pb
        from llm.v1 import generation_pb2_grpc as _pb_grpc
    except ImportError as e:
        print("FAIL: cannot import grpc / generated protos (%s); run with /usr/bin/python3 and "
              "build llm_proto_python" % e)
        return 1
    grpc, pb, pb_grpc = _grpc, _pb, _pb_grpc

    for p in (args.server_bin, args.model):
        if not os.path.exists(p):
            print("FAIL: %s does not exist (build llm-server and tiny_model first)" % p)
            return 1

    server = Server(os.path.abspath(args.server_bin), os.path.abspath(args.model))

    def watchdog():
        print("FAIL: watchdog: the test ran longer than %d s; killing the server" % WATCHDOG_S,
              flush=True)
        print("---- server log tail ----\n" + server.tail(), flush=True)
        server.kill()
        os._exit(3)

    timer = threading.Timer(WATCHDOG_S, watchdog)
    timer.daemon = True
    timer.start()

    checks = [
        ("1 model info, health, reflection", check_model_info),
        ("2 tokenize/detokenize", check_tokenize),
        ("3 streaming greedy", check_streaming),
        ("4 seeded sampling", check_seeded),
        ("5 abort and cancel", check_abort),
        ("6 16 concurrent streams", check_concurrent),
        ("7 invalid arguments", check_invalid),
        ("8 stop strings", check_stop),
        ("9 KV pool not leaked", check_kv_pool),
        ("10 SIGTERM shutdown", check_sigterm),
    ]
    failures = []
    t_start = time.monotonic()
    channel = None
    try:
        try:
            server.start()
        except CheckFailed as e:
            print("FAIL  server start: %s" % e)
            print("---- server log tail ----\n" + server.tail())
            return 1
        print("server listening on 127.0.0.1:%d (log %s)" % (server.port, server.log_path), flush=True)
        channel = grpc.insecure_channel("127.0.0.1:%d" % server.port)
        ready = grpc.channel_ready_future(channel)
        deadline = time.monotonic() + 30
        while True:
            try:
                ready.result(timeout=0.5)
                break
            except grpc.FutureTimeoutError:
                if not server.alive() or time.monotonic() > deadline:
                    print("FAIL  server start: cannot connect to 127.0.0.1:%d (server %s)"
                          % (server.port, "running" if server.alive()
                             else "exited with code %s" % server.proc.returncode))
                    print("---- server log tail ----\n" + server.tail())
                    return 1
        ctx = Ctx(server, channel)
        for name, fn in checks:
            if ctx.info is None and fn is not check_model_info:
                try:
                    ctx.info = ctx.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=RPC_TIMEOUT_S)
                except grpc.RpcError:
                    pass
            if not server.alive():
                failures.append(name)
                print("FAIL  %-34s server is not running (exit code %s)"
                      % (name, server.proc.returncode), flush=True)
                continue
            t0 = time.monotonic()
            try:
                summary = fn(ctx)
                if fn is not check_sigterm:
                    server.expect_alive()
                print("PASS  %-34s %s (%.1f s)" % (name, summary, time.monotonic() - t0), flush=True)
            except CheckFailed as e:
                failures.append(name)
                print("FAIL  %-34s %s (%.1f s)" % (name, e, time.monotonic() - t0), flush=True)
            except grpc.RpcError as e:
                failures.append(name)
                print("FAIL  %-34s unexpected RPC error %s: %s (%.1f s)"
                      % (name, e.code(), e.details(), time.monotonic() - t0), flush=True)
            except Exception as e:  # noqa: BLE001 - a test bug or a broken server; report, go on
                failures.append(name)
                print("FAIL  %-34s unexpected exception %r (%.1f s)" % (name, e, time.monotonic() - t0),
                      flush=True)
                traceback.print_exc()
    finally:
        if channel is not None:
            channel.close()
        crashed = server.proc is not None and server.proc.poll() not in (None, 0)
        server.kill()
        timer.cancel()
    if crashed and not failures:
        failures.append("server exit code %s" % server.proc.returncode)
    if failures:
        print("---- server log tail (%s) ----\n%s" % (server.log_path, server.tail()))
        print("FAILED %d of %d checks: %s (%.1f s)" % (len(failures), len(checks), ", ".join(failures),
                                                       time.monotonic() - t_start))
        return 1
    os.unlink(server.log_path)
    print("ALL %d CHECKS PASSED (%.1f s)" % (len(checks), time.monotonic() - t_start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
