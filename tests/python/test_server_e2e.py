"""End-to-end tests of llm-server over gRPC (proto/llm/v1/generation.proto).

One server with the tiny random model and a small KV pool serves most cases; the cases that need a
request to still be running when they act on it (abort, cancel, a duplicate id, SIGTERM) use the
paced synthetic model (conftest.PACED_MODEL), so they hold on a machine of any speed.

    /usr/bin/python3 -m pytest -q tests/python/test_server_e2e.py \
        --server-bin build/cpu/server/llm-server --model build/cpu/models/tiny-llama \
        --proto-python build/cpu/python [-k abort]
"""

import random
import signal
import sys
import threading
import time
import uuid

import pytest

from conftest import HANG_S, PACED_LONG, PACED_MODEL

# Server sizing. Capacity is NUM_KV_BLOCKS * BLOCK_SIZE = 1536 tokens; every concurrent test
# below keeps its total (prompt + max_tokens) within that, so nothing gets preempted.
BLOCK_SIZE = 16
NUM_KV_BLOCKS = 96
MAX_TOKENS_LIMIT = 512
SERVER_FLAGS = ["--max-tokens-limit", MAX_TOKENS_LIMIT, "--kv-cache-memory-mb", 64,
                "--num-kv-blocks", NUM_KV_BLOCKS, "--block-size", BLOCK_SIZE]
PACED_FLAGS = ["--max-tokens-limit", PACED_LONG, "--block-size", BLOCK_SIZE]

# Limits that only guard against a hang.
RPC_TIMEOUT_S = HANG_S
STREAM_TIMEOUT_S = HANG_S

# Set from the fixtures below, so the helpers can build requests.
grpc = None
pb = None
pb_grpc = None


@pytest.fixture(scope="module", autouse=True)
def _modules(grpc, pb, pb_grpc):
    globals().update(grpc=grpc, pb=pb, pb_grpc=pb_grpc)


class Ctx:
    def __init__(self, server, info=None):
        self.server = server
        self.channel = server.channel()
        self.stub = pb_grpc.GenerationStub(self.channel)
        self.info = info or self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=RPC_TIMEOUT_S)


@pytest.fixture(scope="module")
def c(module_server, _modules):
    """The shared tiny-model server."""
    return Ctx(module_server(SERVER_FLAGS, name="tiny"))


@pytest.fixture(scope="module")
def paced(module_server, _modules):
    """A server whose requests run at a pace: PACED_LONG tokens take minutes."""
    return Ctx(module_server(PACED_FLAGS, model=PACED_MODEL, name="paced"))


@pytest.fixture(autouse=True)
def _servers_alive(request):
    """Every case leaves the servers it used running (SIGTERM uses a server of its own)."""
    yield
    for name in ("c", "paced"):
        if name in request.fixturenames:
            ctx = request.getfixturevalue(name)
            assert ctx.server.alive(), "server died (exit code %s)" % ctx.server.proc.poll()


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
            pytest.fail("%s failed: %s: %s" % (what, res.code(), res.details()))
        msgs = res.msgs
        assert msgs, "%s: no messages and status OK (expected a final complete)" % what
        kinds = [m.WhichOneof("response") for m in msgs]
        assert kinds[-1] == "complete", (
            "%s: last message is %r, expected 'complete' (kinds=%s)" % (what, kinds[-1], kinds))
        assert kinds.count("complete") == 1, (
            "%s: %d complete messages, expected exactly one" % (what, kinds.count("complete")))
        assert all(k == "chunk" for k in kinds[:-1]), (
            "%s: non-chunk message before complete: %s" % (what, kinds))
        rids = {m.request_id for m in msgs}
        assert len(rids) == 1 and "" not in rids, (
            "%s: request_id in responses not one non-empty value: %s" % (what, rids))
        if request_id:
            assert rids == {request_id}, "%s: request_id %s != %r" % (what, rids, request_id)
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
                pytest.fail("%s: expected %s, got OK with %d messages"
                                  % (what, code.name, len(res.msgs)))
            if res.msgs:
                pytest.fail("%s: expected %s with no messages, got %d messages first"
                                  % (what, code.name, len(res.msgs)))
        else:
            pytest.fail("%s: expected %s, got OK" % (what, code.name))
    assert err.code() == code, ("%s: expected %s, got %s: %s"
           % (what, code.name, err.code(), err.details()))
    details = err.details() or ""
    for s in substrings:
        assert s.lower() in details.lower(), (
            "%s: message %r does not mention %r" % (what, details, s))
    return details


def unique_id(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


def wait_until_released(stub, request_id, timeout=HANG_S):
    """Abort(id) answers found=false once the server has no running or waiting request `id`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not stub.Abort(pb.AbortRequest(request_id=request_id), timeout=RPC_TIMEOUT_S).found:
            return
        time.sleep(0.05)
    pytest.fail("request %r still known to the server %.0f s after it ended"
                      % (request_id, timeout))


# ------------------------------------------------------------------------------------------------
# Cases
# ------------------------------------------------------------------------------------------------

PROMPT = "Hello world, this is a small test of the decode server."


def test_model_info(c):
    info = c.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=RPC_TIMEOUT_S)
    assert info.vocab_size > 0, "vocab_size is %d" % info.vocab_size
    assert info.max_context_length > 0, "max_context_length is %d" % info.max_context_length
    assert info.attention_backend, "attention_backend is empty"
    assert info.max_tokens_limit == MAX_TOKENS_LIMIT, (
        "max_tokens_limit %d != --max-tokens-limit %d" % (info.max_tokens_limit, MAX_TOKENS_LIMIT))
    assert info.kv_block_size == BLOCK_SIZE, (
        "kv_block_size %d != --block-size %d" % (info.kv_block_size, BLOCK_SIZE))
    assert info.kv_num_blocks == NUM_KV_BLOCKS, (
        "kv_num_blocks %d != --num-kv-blocks %d" % (info.kv_num_blocks, NUM_KV_BLOCKS))
    assert info.max_context_length <= info.kv_num_blocks * info.kv_block_size, ("max_context_length %d exceeds the KV capacity %d"
           % (info.max_context_length, info.kv_num_blocks * info.kv_block_size))
    for e in info.eos_token_ids:
        assert 0 <= e < info.vocab_size, "eos id %d outside the vocabulary" % e
    assert info.bos_token_id == -1 or 0 <= info.bos_token_id < info.vocab_size, (
        "bos_token_id %d invalid" % info.bos_token_id)

    # grpc.health.v1.Health/Check, generic (bytes in, bytes out).
    check = c.channel.unary_unary("/grpc.health.v1.Health/Check")
    resp = check(b"", timeout=RPC_TIMEOUT_S)  # HealthCheckRequest{service: ""}
    assert resp == b"\x08\x01", "health check returned %r, expected SERVING (b'\\x08\\x01')" % resp

    # Server reflection: ServerReflectionRequest{list_services: ""} = field 7, length-delimited.
    refl = c.channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    responses = list(refl(iter([b"\x3a\x00"]), timeout=RPC_TIMEOUT_S))
    assert responses, "reflection returned no response"
    assert any(b"llm.v1.Generation" in r for r in responses), (
        "reflection list_services does not mention llm.v1.Generation: %r" % responses)
    print("vocab %d, context %d, backend %s, kv %d x %d, health SERVING, reflection ok" % (
        info.vocab_size, info.max_context_length, info.attention_backend, info.kv_num_blocks,
        info.kv_block_size))


def test_tokenize(c):
    texts = ["Hello, world! The quick brown fox jumps over the lazy dog 12345.",
             "h\u00e9llo w\u00f6rld \u2014 \u65e5\u672c\u8a9e \U0001F642 \u2211 caf\u00e9"]
    for t in texts:
        ids = list(c.stub.Tokenize(pb.TokenizeRequest(text=t, add_special_tokens=False),
                                   timeout=RPC_TIMEOUT_S).token_ids)
        assert ids, "Tokenize(%r) returned no ids" % t
        assert all(0 <= i < c.info.vocab_size for i in ids), (
            "Tokenize(%r) returned ids outside the vocabulary: %s" % (t, ids))
        back = c.stub.Detokenize(pb.DetokenizeRequest(token_ids=ids), timeout=RPC_TIMEOUT_S).text
        assert back == t, "round trip changed the text: %r -> %s -> %r" % (t, ids, back)
    if c.info.bos_token_id >= 0:
        ids = list(c.stub.Tokenize(pb.TokenizeRequest(text=texts[0]), timeout=RPC_TIMEOUT_S).token_ids)
        assert ids and ids[0] == c.info.bos_token_id, ("Tokenize with default add_special_tokens does not start with BOS %d: %s"
               % (c.info.bos_token_id, ids[:5]))
    for bad in (c.info.vocab_size, c.info.vocab_size + 100, -1):
        expect_rpc_error(
            lambda: c.stub.Detokenize(pb.DetokenizeRequest(token_ids=[1, bad]), timeout=RPC_TIMEOUT_S),
            grpc.StatusCode.INVALID_ARGUMENT, ["outside the vocabulary"], "Detokenize([1, %d])" % bad)
    print("ASCII + unicode round trips; out-of-range ids rejected")


def test_streaming(c):
    n = 24
    prompt_ids = list(c.stub.Tokenize(pb.TokenizeRequest(text=PROMPT), timeout=RPC_TIMEOUT_S).token_ids)
    req = make_request(text=PROMPT, temperature=0.0, max_tokens=n, ignore_eos=True)
    g = generate(c.stub, req, "greedy text stream")
    assert len(g.ids) == n, "got %d token ids, expected %d" % (len(g.ids), n)
    assert g.usage.completion_tokens == n, (
        "usage.completion_tokens %d != %d" % (g.usage.completion_tokens, n))
    assert g.usage.prompt_tokens == len(prompt_ids), (
        "usage.prompt_tokens %d != len(Tokenize(text)) %d" % (g.usage.prompt_tokens, len(prompt_ids)))
    assert g.finish == pb.FINISH_REASON_LENGTH, (
        "finish_reason %s, expected LENGTH" % fr_name(g.finish))
    assert g.num_chunks >= 1, "no chunk messages before the complete"
    assert all(0 <= i < c.info.vocab_size for i in g.ids), "generated ids outside the vocabulary"
    detok = c.stub.Detokenize(pb.DetokenizeRequest(token_ids=g.ids), timeout=RPC_TIMEOUT_S).text
    assert g.text == detok, ("streamed text != Detokenize(ids):\n  streamed   %r\n  detokenize %r\n  ids %s"
           % (g.text, detok, g.ids))

    g2 = generate(c.stub, req, "second greedy text stream")
    assert g2.ids == g.ids, "greedy run is not reproducible:\n  %s\n  %s" % (g.ids, g2.ids)
    assert g2.text == g.text, "greedy text differs between runs"

    # Token-id prompt: the same ids as the text prompt tokenizes to must give the same output.
    g3 = generate(c.stub, make_request(ids=prompt_ids, temperature=0.0, max_tokens=n, ignore_eos=True),
                  "greedy token-id stream")
    assert g3.usage.prompt_tokens == len(prompt_ids), (
        "token-id prompt: prompt_tokens %d != %d" % (g3.usage.prompt_tokens, len(prompt_ids)))
    assert g3.ids == g.ids, ("token-id prompt gives different greedy tokens than the text prompt:\n"
           "  text %s\n  ids  %s" % (g.ids, g3.ids))
    # A token-id prompt of arbitrary ids.
    g4 = generate(c.stub, make_request(ids=[5, 17, 300, 42, 7], temperature=0.0, max_tokens=8,
                                       ignore_eos=True), "token-id stream")
    assert len(g4.ids) == 8 and g4.usage.completion_tokens == 8 and g4.usage.prompt_tokens == 5, (
        "token-id prompt: %d ids, usage %s" % (len(g4.ids), g4.usage))
    print("%d ids in %d chunks + complete, prompt_tokens %d, LENGTH, text == Detokenize, " \
           "deterministic, token-id prompts ok" % (n, g.num_chunks, len(prompt_ids)))


def seeded_request():
    return make_request(text="Once upon a time", temperature=0.8, top_p=0.9, top_k=50, seed=1234,
                        max_tokens=32, ignore_eos=True)


def test_seeded(c):
    alone = generate(c.stub, seeded_request(), "seeded stream (alone)")
    assert len(alone.ids) == 32, "seeded stream gave %d ids" % len(alone.ids)
    alone2 = generate(c.stub, seeded_request(), "seeded stream (alone, again)")
    assert alone2.ids == alone.ids, (
        "seeded run is not reproducible:\n  %s\n  %s" % (alone.ids, alone2.ids))

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
    assert not errors, "client errors: %s" % errors
    assert len(results) == 7, "only %d of 7 concurrent streams finished" % len(results)
    for k, r in sorted(results.items()):
        Generation(r, what=k)
    conc = Generation(results["seeded"], what="seeded (concurrent)")
    assert conc.ids == alone.ids, ("seeded sampling differs when batched with other requests:\n"
           "  alone      %s\n  concurrent %s" % (alone.ids, conc.ids))
    print("seed 1234 gives the same 32 tokens alone, again, and among 6 concurrent requests")


PACED_PROMPT = [5, 17, 300, 42, 7]


def test_abort(paced):
    """The Abort RPC mid-stream ends the stream with a complete ABORTED; the id is free again."""
    c = paced
    rid = unique_id("abort")
    req = make_request(ids=PACED_PROMPT, request_id=rid, temperature=0.0, max_tokens=PACED_LONG,
                       ignore_eos=True)
    call = c.stub.Generate(req, timeout=STREAM_TIMEOUT_S)
    msgs = []
    it = iter(call)
    for _ in range(3):
        m = next(it)
        assert m.WhichOneof("response") == "chunk", "expected chunks first, got %s" % m
        msgs.append(m)
    found = c.stub.Abort(pb.AbortRequest(request_id=rid), timeout=RPC_TIMEOUT_S).found
    assert found, "Abort(%r) of a running request returned found=false" % rid
    try:
        for m in it:
            msgs.append(m)
    except grpc.RpcError as e:
        pytest.fail("aborted stream ended with status %s: %s (expected a complete ABORTED)"
                    % (e.code(), e.details()))
    g = Generation(StreamResult(msgs, None), rid, "aborted stream")
    assert g.finish == pb.FINISH_REASON_ABORTED, fr_name(g.finish)
    assert 3 <= len(g.ids) < PACED_LONG
    assert g.usage.completion_tokens == len(g.ids)
    wait_until_released(c.stub, rid)
    assert not c.stub.Abort(pb.AbortRequest(request_id=unique_id("nope")),
                            timeout=RPC_TIMEOUT_S).found, "Abort of an unknown id found one"
    # The id is free again: reuse it.
    g = generate(c.stub, make_request(ids=PACED_PROMPT, request_id=rid, temperature=0.0,
                                      max_tokens=4, ignore_eos=True),
                 "request reusing an aborted id")
    assert len(g.ids) == 4
    c.server.wait_idle()


def test_client_cancel(paced):
    """A client cancel mid-stream ends the call CANCELLED and the server drops the request."""
    c = paced
    cancelled = []
    for k in range(2):
        crid = unique_id("cancel")
        call = c.stub.Generate(make_request(ids=PACED_PROMPT, request_id=crid, temperature=0.0,
                                            max_tokens=PACED_LONG, ignore_eos=True),
                               timeout=STREAM_TIMEOUT_S)
        it = iter(call)
        for _ in range(2 + k):
            next(it)
        call.cancel()
        with pytest.raises(grpc.RpcError) as e:
            for _ in it:
                pass
        assert e.value.code() == grpc.StatusCode.CANCELLED
        cancelled.append(crid)
    for crid in cancelled:
        wait_until_released(c.stub, crid)  # the server dropped the cancelled requests
    c.server.wait_idle()
    g = generate(c.stub, make_request(ids=PACED_PROMPT, temperature=0.0, max_tokens=16,
                                      ignore_eos=True), "request after cancels")
    assert len(g.ids) == 16 and g.finish == pb.FINISH_REASON_LENGTH, fr_name(g.finish)


def test_concurrent(c):
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
    assert not errors, "client errors: %s" % errors
    total = 0
    for i, (req, res) in enumerate(zip(specs, results)):
        assert res is not None, "request %d did not finish" % i
        g = Generation(res, req.request_id, "concurrent request %d" % i)
        want = req.stopping.max_tokens
        assert len(g.ids) == want and g.usage.completion_tokens == want, ("concurrent request %d: %d ids, completion_tokens %d, expected %d"
               % (i, len(g.ids), g.usage.completion_tokens, want))
        assert g.finish == pb.FINISH_REASON_LENGTH, (
            "concurrent request %d: finish_reason %s" % (i, fr_name(g.finish)))
        total += want
    print("%d streams, %d tokens in %.1f s" % (n, total, time.monotonic() - start))


def test_invalid(c):
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

    print("%d bad requests rejected with INVALID_ARGUMENT + a clear message" % len(cases))


def test_duplicate_request_id(paced):
    """A request_id already in use by a running request is refused; the original goes on."""
    c = paced
    IA = grpc.StatusCode.INVALID_ARGUMENT
    rid = unique_id("dup")
    call = c.stub.Generate(make_request(ids=PACED_PROMPT, request_id=rid, temperature=0.0,
                                        max_tokens=PACED_LONG, ignore_eos=True),
                           timeout=STREAM_TIMEOUT_S)
    try:
        it = iter(call)
        next(it)  # running now
        expect_rpc_error(lambda: run_stream(c.stub, make_request(ids=PACED_PROMPT, request_id=rid,
                                                                 max_tokens=4),
                                            timeout=RPC_TIMEOUT_S),
                         IA, ["already in use"], "duplicate request_id")
        # The rejected duplicate must not have disturbed the original: abort it, expect ABORTED.
        assert c.stub.Abort(pb.AbortRequest(request_id=rid), timeout=RPC_TIMEOUT_S).found, \
            "original request lost after a rejected duplicate id"
        rest = list(it)
        assert rest and rest[-1].WhichOneof("response") == "complete"
        assert rest[-1].complete.finish_reason == pb.FINISH_REASON_ABORTED
    finally:
        call.cancel()
    wait_until_released(c.stub, rid)


def test_stop(c):
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
    assert s is not None, "cannot pick a stop string from the generated text %r" % T
    idx = T.find(s)
    want = T[:idx]
    g = generate(c.stub, make_request(text=PROMPT, temperature=0.0, max_tokens=n, ignore_eos=True,
                                      stop=[s]), "stop: stream with stop=[%r]" % s)
    assert g.finish == pb.FINISH_REASON_STOP, ("finish_reason %s, expected STOP (stop=%r, text %r)"
           % (fr_name(g.finish), s, T))
    assert g.complete.matched_stop == s, "matched_stop %r != %r" % (g.complete.matched_stop, s)
    assert g.text == want, (
        "text with stop=%r is %r, expected %r (full text %r)" % (s, g.text, want, T))
    assert g.ids == base.ids[:len(g.ids)], "stop run generated different tokens"
    assert len(g.ids) < n, "stop run still generated all %d tokens" % n
    assert g.usage.completion_tokens == len(g.ids), (
        "completion_tokens %d != %d ids" % (g.usage.completion_tokens, len(g.ids)))
    print("stop=%r at char %d of %d: text cut there, STOP, matched_stop ok (%d tokens)" % (
        s, idx, len(T), len(g.ids)))


def test_kv_pool(c):
    info = c.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=RPC_TIMEOUT_S)
    capacity = info.kv_num_blocks * info.kv_block_size
    assert info.kv_num_blocks == NUM_KV_BLOCKS, "kv_num_blocks changed to %d" % info.kv_num_blocks
    max_tokens = min(400, info.max_tokens_limit)
    # Leave one block of slack: the request needs (capacity - 16) tokens of the pool.
    prompt_len = min(capacity, info.max_context_length) - info.kv_block_size - max_tokens
    assert prompt_len > 0, "KV pool too small for this check"
    rng = random.Random(5)
    ids = [rng.randrange(0, info.vocab_size - 2) for _ in range(prompt_len)]
    needed = -(-(prompt_len + max_tokens) // info.kv_block_size)
    start = time.monotonic()
    for rep in range(2):
        g = generate(c.stub, make_request(ids=ids, temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                          request_id=unique_id("kvfill")),
                     "request needing %d of %d KV blocks (run %d)" % (needed, info.kv_num_blocks, rep + 1),
                     timeout=STREAM_TIMEOUT_S)
        assert (len(g.ids) == max_tokens and g.usage.completion_tokens == max_tokens
               and g.finish == pb.FINISH_REASON_LENGTH), ("big request: %d ids, completion %d, %s" % (len(g.ids), g.usage.completion_tokens,
                                                           fr_name(g.finish)))
        assert g.usage.prompt_tokens == prompt_len, ("prompt_tokens %d != %d" % (g.usage.prompt_tokens,
                                                                                prompt_len))
    print("prompt %d + %d tokens (%d of %d blocks) completed twice in %.1f s: no blocks leaked" % (
        prompt_len, max_tokens, needed, info.kv_num_blocks, time.monotonic() - start))


def test_sigterm(server, _modules):
    """SIGTERM: a request sent after the server stopped accepting is refused (UNAVAILABLE), the
    in-flight one outlives the grace period and gets exactly one final status, exit code 0."""
    s = server(PACED_FLAGS + ["--shutdown-grace-s", 1], model=PACED_MODEL, name="paced-term")
    c = Ctx(s)
    rid = unique_id("term")
    req = make_request(ids=PACED_PROMPT, request_id=rid, temperature=0.0, max_tokens=PACED_LONG,
                       ignore_eos=True)
    call = c.stub.Generate(req, timeout=STREAM_TIMEOUT_S)
    it = iter(call)
    msgs = [next(it), next(it)]
    s.proc.send_signal(signal.SIGTERM)
    assert s.wait_for_log("stopped accepting requests"), "no shutdown line in the server log"
    late = run_stream(c.stub, make_request(ids=PACED_PROMPT, max_tokens=4), timeout=RPC_TIMEOUT_S)
    assert late.error is not None and late.error.code() == grpc.StatusCode.UNAVAILABLE, (
        "request sent during shutdown: expected UNAVAILABLE, got %s"
        % ("OK (%d messages)" % len(late.msgs) if late.error is None else late.error.code()))
    error = None
    try:
        for m in it:
            msgs.append(m)
    except grpc.RpcError as e:
        error = e
    kinds = [m.WhichOneof("response") for m in msgs]
    assert kinds.count("complete") <= 1, kinds
    if "complete" in kinds:
        assert kinds[-1] == "complete" and error is None, (kinds, error)
        g = Generation(StreamResult(msgs, None), rid, "in-flight stream at SIGTERM")
        # PACED_LONG tokens take minutes: the grace period ended it, not its length.
        assert g.finish == pb.FINISH_REASON_ABORTED, fr_name(g.finish)
    else:
        assert error is not None, "in-flight stream ended with OK and no complete message"
    assert s.wait_exit() == 0


if __name__ == "__main__":  # the same as /usr/bin/python3 -m pytest THIS_FILE [options]
    sys.exit(pytest.main([__file__] + sys.argv[1:]))
