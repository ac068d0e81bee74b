#!/usr/bin/python3
"""The OpenAI HTTP API, API keys and TLS on both front ends, end to end.

Starts llm-server (the shared `server` / `module_server` fixtures of conftest.py) with the tiny
model and drives it with curl (SSE framing, errors, TLS), the official `openai` npm client
(tests/node/openai_client.mjs) and gRPC (API keys, TLS). Run with Debian's interpreter and the
paths conftest.py describes:
  /usr/bin/python3 -m pytest tests/python/test_openai_http.py --server-bin ... --model ...
      --proto-python ...
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import HANG_S, PACED_LONG, PACED_MODEL

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE_DIR = os.path.join(REPO, "tests", "node")
API_KEY = "sk-test-0123456789"
MAX_TOKENS_LIMIT = 512
AUTH = [("authorization", f"Bearer {API_KEY}")]


def flags(*extra):
    """The flags every server of this file runs with, then `extra` (later flags win)."""
    return ["--block-size", "16", "--num-kv-blocks", "96", "--max-tokens-limit",
            str(MAX_TOKENS_LIMIT), "--shutdown-grace-s", "1", *extra]


@pytest.fixture(scope="module")
def shared(module_server):
    return module_server(flags("--api-key", API_KEY, "--max-request-body-bytes", "65536"))


def curl(url, *args, key=API_KEY, data=None):
    """Returns (http status, body bytes)."""
    cmd = ["curl", "-sS", "-N", "-o", "-", "-w", "\n%{http_code}", url] + list(args)
    if key is not None:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    if data is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    res = subprocess.run(cmd, input=data.encode() if isinstance(data, str) else data,
                         capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode()
    body, _, code = res.stdout.rpartition(b"\n")
    return int(code), body


def error_of(body):
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    return err


def test_sse_framing(shared):
    req = {"model": "tiny-llama", "prompt": "Hello there", "max_tokens": 6, "temperature": 0,
           "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    code, body = curl(f"{shared.http_base}/v1/completions", data=json.dumps(req))
    assert code == 200
    text = body.decode()
    assert text.endswith("data: [DONE]\n\n")
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 6
    assert "cached_tokens" in usage["usage"]["prompt_tokens_details"]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks[:-1]]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    # The streamed text is the non-streamed text.
    req.pop("stream"), req.pop("stream_options")
    code, whole = curl(f"{shared.http_base}/v1/completions", data=json.dumps(req))
    assert code == 200
    full = json.loads(whole)
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == full["choices"][0]["text"]
    assert full["usage"]["completion_tokens"] == 6


def test_errors_have_openai_shape_and_status(shared):
    base = shared.http_base
    code, body = curl(base + "/v1/nothing")
    assert code == 404 and error_of(body)["type"] == "invalid_request_error"
    code, body = curl(base + "/v1/completions", data="{not json")
    assert code == 400 and "JSON" in error_of(body)["message"]
    code, body = curl(base + "/v1/completions", data=json.dumps({"prompt": "x", "best_of": 3}))
    assert code == 400 and error_of(body)["param"] == "best_of"
    code, body = curl(base + "/v1/completions", data=json.dumps({"prompt": "x", "top_p": 2}))
    assert code == 400 and "top_p" in error_of(body)["message"]
    code, body = curl(base + "/v1/completions",
                      data=json.dumps({"prompt": "x", "max_tokens": MAX_TOKENS_LIMIT + 1}))
    assert code == 400 and "max_tokens" in error_of(body)["message"]
    code, body = curl(base + "/v1/completions", data=json.dumps({"prompt": "x" * 70000}))
    assert code == 413 and "max_request_body_bytes" in error_of(body)["message"]
    # Fields that cannot change the output are accepted.
    code, body = curl(base + "/v1/completions",
                      data=json.dumps({"prompt": "x", "max_tokens": 1, "user": "u", "n": 1,
                                       "store": False, "metadata": {"a": "b"}}))
    assert code == 200, body


def sse_events(text):
    """[(event name, data)] of a Responses stream: 'event: T' and 'data: J' per frame."""
    out = []
    for frame in text.split("\n\n")[:-1]:
        name, data = frame.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), frame
        out.append((name[len("event: "):], json.loads(data[len("data: "):])))
    return out


def test_responses_api(shared):
    """POST /v1/responses, stateless: whole and streamed, and fields needing state refused."""
    url = f"{shared.http_base}/v1/responses"
    req = {"model": "tiny-llama", "input": [{"role": "user", "content": "Hello"}],
           "instructions": "Be brief", "max_output_tokens": 6, "temperature": 0}
    code, body = curl(url, data=json.dumps(req))
    assert code == 200, body
    whole = json.loads(body)
    assert whole["object"] == "response" and whole["id"].startswith("resp_")
    assert whole["status"] == "incomplete"
    assert whole["incomplete_details"] == {"reason": "max_output_tokens"}
    assert whole["usage"]["output_tokens"] == 6
    usage = whole["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    [item] = whole["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    [part] = item["content"]
    assert part["type"] == "output_text"

    code, body = curl(url, data=json.dumps(dict(req, stream=True)))
    assert code == 200
    text = body.decode()
    assert "[DONE]" not in text  # OpenAI's Responses streams end with the last event
    events = sse_events(text)
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    assert all(e["type"] == name for name, e in events)
    names = [name for name, _ in events]
    assert names[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    deltas = "".join(e["delta"] for name, e in events if name == "response.output_text.delta")
    # temperature 0: the streamed text is the whole response's text
    assert deltas == part["text"]
    final = events[-1][1]["response"]
    assert final["output"][0]["content"][0]["text"] == part["text"]
    assert final["usage"]["output_tokens"] == 6

    for field, value in [("previous_response_id", "resp_1"), ("store", True),
                         ("background", True), ("conversation", "conv_1")]:
        code, body = curl(url, data=json.dumps({"input": "x", field: value}))
        assert code == 400 and error_of(body)["param"] == field, body
    code, body = curl(url, data=json.dumps(dict(req, max_output_tokens=MAX_TOKENS_LIMIT + 1)))
    assert code == 400 and error_of(body)["type"] == "invalid_request_error", body


def test_api_key_on_http(shared):
    base = shared.http_base
    code, body = curl(base + "/v1/models", key=None)
    assert code == 401 and error_of(body)["code"] == "invalid_api_key"
    code, body = curl(base + "/v1/models", key="wrong")
    assert code == 401
    code, body = curl(base + "/v1/completions", key="wrong", data="{not json")
    assert code == 401, "the key is checked before the body is looked at"
    code, _ = curl(base + "/health", key=None)
    assert code == 200
    code, body = curl(base + "/v1/models")
    assert code == 200 and json.loads(body)["data"][0]["id"] == "tiny-llama"


def test_tokenize_detokenize(shared):
    base = shared.http_base
    code, body = curl(base + "/tokenize", data=json.dumps({"prompt": "Hello world"}))
    assert code == 200
    tok = json.loads(body)
    assert tok["count"] == len(tok["tokens"]) > 0
    no_bos = json.loads(curl(base + "/tokenize", data=json.dumps(
        {"prompt": "Hello world", "add_special_tokens": False}))[1])["tokens"]
    assert tok["tokens"][-len(no_bos):] == no_bos
    code, body = curl(base + "/detokenize", data=json.dumps({"tokens": no_bos}))
    assert code == 200 and json.loads(body)["prompt"] == "Hello world"
    code, body = curl(base + "/detokenize", data=json.dumps({"tokens": [10 ** 6]}))
    assert code == 400


def test_message_shapes_and_model_route(shared):
    """content null beside tool_calls, a tool result and text parts render as the strings and
    objects vLLM hands the template; non-text parts are refused by type; GET /v1/models/{id}."""
    base = shared.http_base
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    msgs = [{"role": "user", "content": [{"type": "text", "text": "weather"},
                                         {"type": "text", "text": "in Paris?"}]},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    req = {"messages": msgs, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    code, body = curl(base + "/v1/chat/completions", data=json.dumps(req))
    assert code == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] == 3
    # The parts join with "\n" exactly as the string form would render.
    code, parts = curl(base + "/tokenize", data=json.dumps({"messages": msgs[:1]}))
    code2, joined = curl(base + "/tokenize", data=json.dumps(
        {"messages": [{"role": "user", "content": "weather\nin Paris?"}]}))
    assert code == code2 == 200 and json.loads(parts)["tokens"] == json.loads(joined)["tokens"]
    for part in ({"type": "image_url", "image_url": {"url": "http://x/y.png"}},
                 {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}):
        code, body = curl(base + "/v1/chat/completions", data=json.dumps(
            {"messages": [{"role": "user", "content": [part]}], "max_tokens": 1}))
        err = error_of(body)
        assert code == 400 and err["param"] == "messages", body
        assert f"'{part['type']}' are not supported" in err["message"]
    code, body = curl(base + "/v1/models/tiny-llama")
    assert code == 200 and json.loads(body)["id"] == "tiny-llama"
    assert json.loads(body)["object"] == "model"
    code, body = curl(base + "/v1/models/gpt-4")
    err = error_of(body)
    assert code == 404 and err["code"] == "model_not_found" and "gpt-4" in err["message"]
    code, body = curl(base + "/v1/models/tiny-llama", key="wrong")
    assert code == 401


def test_logit_bias(shared):
    base = shared.http_base
    code, body = curl(base + "/tokenize", data=json.dumps({"prompt": "a",
                                                            "add_special_tokens": False}))
    assert code == 200
    token = json.loads(body)["tokens"][-1]
    req = {"prompt": "Hello", "max_tokens": 4, "temperature": 1.0, "seed": 7, "ignore_eos": True,
           "logit_bias": {str(token): 100}}
    code, body = curl(base + "/v1/completions", data=json.dumps(req))
    assert code == 200, body
    code, want = curl(base + "/detokenize", data=json.dumps({"tokens": [token] * 4}))
    assert json.loads(body)["choices"][0]["text"] == json.loads(want)["prompt"]
    # -100 on the greedy choice bans it.
    greedy = {"prompt": "Hello", "max_tokens": 1, "temperature": 0, "logprobs": 1}
    code, body = curl(base + "/v1/completions", data=json.dumps(greedy))
    first = json.loads(body)["choices"][0]["logprobs"]["tokens"][0]
    code, ids = curl(base + "/tokenize", data=json.dumps({"prompt": first,
                                                           "add_special_tokens": False}))
    banned = json.loads(ids)["tokens"]
    if len(banned) == 1:  # the piece re-tokenizes to itself
        code, body = curl(base + "/v1/completions", data=json.dumps(
            dict(greedy, logit_bias={str(banned[0]): -100})))
        assert code == 200 and json.loads(body)["choices"][0]["logprobs"]["tokens"][0] != first
    for bias, where in (({"1": 100.5}, "[-100, 100]"), ({"abc": 1}, "'abc'"),
                        ({"99999999": 1}, "outside the vocabulary")):
        code, body = curl(base + "/v1/completions", data=json.dumps(
            {"prompt": "x", "max_tokens": 1, "logit_bias": bias}))
        assert code == 400 and where in error_of(body)["message"], body


def test_logit_bias_on_grpc(shared, pb):
    code, body = curl(shared.http_base + "/tokenize", data=json.dumps(
        {"prompt": "a", "add_special_tokens": False}))
    token = json.loads(body)["tokens"][-1]
    req = pb.GenerateRequest(text="Hello", stopping=pb.StoppingParams(max_tokens=3,
                                                                     ignore_eos=True))
    req.sampling.temperature = 1.0
    req.sampling.seed = 3
    req.sampling.logit_bias[token] = 100.0
    out = list(shared.stub().Generate(req, timeout=HANG_S, metadata=AUTH))
    ids = [t for m in out if m.HasField("chunk") for t in m.chunk.token_ids]
    ids += list(out[-1].complete.token_ids)
    assert ids[:3] == [token] * 3, out


def test_n_choices(shared):
    base = shared.http_base
    req = {"prompt": "Hello", "max_tokens": 5, "temperature": 1.0, "seed": 11, "ignore_eos": True,
           "n": 3, "best_of": 3}
    code, body = curl(base + "/v1/completions", data=json.dumps(req))
    assert code == 200, body
    whole = json.loads(body)
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2]
    assert all(c["finish_reason"] == "length" for c in whole["choices"])
    assert whole["usage"]["completion_tokens"] == 15
    # Choice i is the n = 1 request seeded seed + i.
    for i in range(3):
        code, one = curl(base + "/v1/completions", data=json.dumps(
            dict(req, n=1, best_of=1, seed=11 + i)))
        assert json.loads(one)["choices"][0]["text"] == whole["choices"][i]["text"]
    # Streamed: every chunk names its choice; each choice finishes once; usage counts all.
    code, body = curl(base + "/v1/completions", data=json.dumps(
        dict(req, stream=True, stream_options={"include_usage": True})))
    events = [json.loads(e[len("data: "):]) for e in body.decode().split("\n\n")[:-2]]
    texts, finishes = {}, {}
    for e in events[:-1]:
        (c,) = e["choices"]
        texts[c["index"]] = texts.get(c["index"], "") + c["text"]
        if c["finish_reason"] is not None:
            assert c["index"] not in finishes
            finishes[c["index"]] = c["finish_reason"]
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert texts == {i: whole["choices"][i]["text"] for i in range(3)}
    assert events[-1]["usage"]["completion_tokens"] == 15
    assert events[-1]["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    # Chat: greedy choices are identical; each streamed choice opens with its role.
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, "n": 2}
    code, body = curl(base + "/v1/chat/completions", data=json.dumps(chat))
    ch = json.loads(body)["choices"]
    assert len(ch) == 2 and ch[0]["message"]["content"] == ch[1]["message"]["content"]
    code, body = curl(base + "/v1/chat/completions", data=json.dumps(dict(chat, stream=True)))
    events = [json.loads(e[len("data: "):]) for e in body.decode().split("\n\n")[:-2]]
    roles = [e["choices"][0]["index"] for e in events if "role" in e["choices"][0]["delta"]]
    assert sorted(roles) == [0, 1]
    # Bounds.
    code, body = curl(base + "/v1/completions", data=json.dumps({"prompt": "x", "n": 17}))
    assert code == 400 and "--max-n" in error_of(body)["message"], body
    code, body = curl(base + "/v1/completions", data=json.dumps(
        {"prompt": "x", "n": 2, "best_of": 4}))
    assert code == 400 and error_of(body)["param"] == "best_of", body


def test_n_choices_on_grpc(shared, pb):
    req = pb.GenerateRequest(text="Hello", n=3, stopping=pb.StoppingParams(max_tokens=4,
                                                                          ignore_eos=True))
    req.sampling.temperature = 1.0
    req.sampling.seed = 21
    out = list(shared.stub().Generate(req, timeout=HANG_S, metadata=AUTH))
    tokens, finishes = {}, {}
    for m in out[:-1]:
        tokens.setdefault(m.chunk.index, []).extend(m.chunk.token_ids)
        if m.chunk.finish_reason:
            finishes[m.chunk.index] = m.chunk.finish_reason
    done = out[-1].complete
    tokens.setdefault(done.index, []).extend(done.token_ids)
    finishes[done.index] = done.finish_reason
    assert sorted(tokens) == [0, 1, 2] and all(len(t) == 4 for t in tokens.values()), out
    assert set(finishes.values()) == {pb.FINISH_REASON_LENGTH} and len(finishes) == 3
    assert done.usage.completion_tokens == 12
    # Choice 1 is the n = 1 request seeded 22.
    one = pb.GenerateRequest(text="Hello", stopping=pb.StoppingParams(max_tokens=4,
                                                                      ignore_eos=True))
    one.sampling.temperature = 1.0
    one.sampling.seed = 22
    solo = list(shared.stub().Generate(one, timeout=HANG_S, metadata=AUTH))
    assert [t for m in solo[:-1] for t in m.chunk.token_ids] + \
        list(solo[-1].complete.token_ids) == tokens[1]


def test_api_key_on_grpc(shared, grpc, pb):
    ch = shared.channel()
    stub = shared.stub()
    req = pb.GenerateRequest(text="hi", stopping=pb.StoppingParams(max_tokens=2))
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Generate(req, timeout=HANG_S))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as e:
        stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=HANG_S,
                          metadata=[("authorization", "Bearer wrong")])
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    out = list(stub.Generate(req, timeout=HANG_S, metadata=AUTH))
    assert out[-1].complete.usage.completion_tokens == 2
    # The chat form goes through the same renderer as /v1/chat/completions.
    chat = pb.GenerateRequest(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role="user",
                                                                          content="hi")]))
    chat.stopping.max_tokens = 5
    chat.stopping.ignore_eos = True
    chat.sampling.temperature = 0
    out = list(stub.Generate(chat, timeout=HANG_S, metadata=AUTH))
    grpc_text = "".join(m.chunk.text for m in out) + out[-1].complete.text
    code, body = curl(f"{shared.http_base}/v1/chat/completions", data=json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "ignore_eos": True,
         "temperature": 0}))
    http = json.loads(body)
    assert code == 200 and http["choices"][0]["message"]["content"] == grpc_text
    assert http["usage"]["prompt_tokens"] == out[-1].complete.usage.prompt_tokens
    # grpc.health.v1.Health/Check stays open: bytes in, SERVING (b"\x08\x01") out.
    health = ch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=HANG_S)
    assert health == b"\x08\x01"


def test_openai_node_client(shared):
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True,
                   capture_output=True, timeout=300)
    env = dict(os.environ, BASE_URL=f"{shared.http_base}/v1", API_KEY=API_KEY,
               METRICS_URL=f"http://127.0.0.1:{shared.metrics_port}/metrics", MODEL="tiny-llama",
               MAX_TOKENS_LIMIT=str(MAX_TOKENS_LIMIT))
    res = subprocess.run(["node", "openai_client.mjs"], cwd=NODE_DIR, env=env, capture_output=True,
                         text=True, timeout=300)
    print(res.stdout, res.stderr)
    assert res.returncode == 0 and "ALL OK" in res.stdout, res.stdout + res.stderr


def test_tls_on_both_front_ends(server, tls_files, grpc, pb, pb_grpc):
    s = server(flags("--api-key", API_KEY), tls=tls_files)
    assert s.http_base.startswith("https://")
    code, body = curl(f"{s.http_base}/v1/completions", "--cacert", tls_files.ca,
                      data=json.dumps({"prompt": "Hi", "max_tokens": 3, "ignore_eos": True}))
    assert code == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
    # Without the CA the client refuses the certificate; plain HTTP gets no answer.
    res = subprocess.run(["curl", "-sS", f"{s.http_base}/health"], capture_output=True,
                         timeout=60)
    assert res.returncode != 0
    res = subprocess.run(["curl", "-sS", f"http://127.0.0.1:{s.http_port}/health"],
                         capture_output=True, timeout=60)
    assert res.returncode != 0 or b"200" not in res.stdout
    info = s.stub().GetModelInfo(pb.GetModelInfoRequest(), timeout=HANG_S, metadata=AUTH)
    assert info.model_name == "tiny-llama"
    with pytest.raises(grpc.RpcError) as e:
        pb_grpc.GenerationStub(s.insecure_channel()).GetModelInfo(pb.GetModelInfoRequest(),
                                                                  timeout=30)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_non_streaming_disconnect_aborts(server):
    """A client that leaves a non-streaming request frees it too (ended as cancelled). The paced
    model keeps the request running for minutes, so the disconnect always comes first."""
    s = server(flags("--max-tokens-limit", str(PACED_LONG)), model=PACED_MODEL)
    cancelled = 'llm_requests_total{outcome="cancelled"}'
    length = 'llm_requests_total{outcome="length"}'
    m0 = s.metrics()
    body = json.dumps({"prompt": [5, 6, 7, 8], "max_tokens": PACED_LONG,
                       "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", s.http_port), timeout=60)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    s.wait_metrics(lambda m: m.get("llm_num_requests_running") == 1, "the engine runs it")
    sock.close()
    m = s.wait_metrics(lambda m: m.get(cancelled, 0) + m.get(length, 0) >
                       m0.get(cancelled, 0) + m0.get(length, 0), "the request has ended")
    assert m.get(cancelled, 0) == m0.get(cancelled, 0) + 1, "ended by the disconnect"
    # The gauges follow at the end of the engine step that dropped it.
    s.wait_idle()


def open_stream(port, body):
    """Starts a streaming request on a raw socket; returns the socket once the headers came."""
    data = json.dumps(dict(body, stream=True)).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def test_queue_full_429_and_shutdown_503(server):
    """One running request, one waiting: the next gets 429. After SIGTERM, new requests get 503
    while the running one finishes its grace period. The paced model keeps both running for
    minutes."""
    s = server(flags("--max-num-seqs", "1", "--max-queued-requests", "1", "--shutdown-grace-s",
                     "60", "--max-tokens-limit", str(PACED_LONG), "--num-kv-blocks", "1200"),
               model=PACED_MODEL)
    long_req = {"prompt": [5, 6, 7, 8], "max_tokens": PACED_LONG, "ignore_eos": True}
    a = open_stream(s.http_port, long_req)
    s.wait_metrics(lambda m: m.get("llm_num_requests_running") == 1, "the first request runs")
    b = open_stream(s.http_port, long_req)
    s.wait_metrics(lambda m: m.get("llm_num_requests_waiting") == 1, "the second request waits")
    code, body = curl(s.http_base + "/v1/completions", key=None,
                      data=json.dumps({"prompt": [5], "max_tokens": 1}))
    assert code == 429, body
    err = error_of(body)
    assert err["type"] == "rate_limit_error" and "queue" in err["message"]
    b.close()  # the waiting request leaves; then shut down with `a` still running
    s.wait_metrics(lambda m: m.get("llm_num_requests_waiting") == 0, "the second request left")
    s.proc.send_signal(signal.SIGTERM)
    end = time.monotonic() + HANG_S
    while curl(s.http_base + "/health", key=None)[0] != 503:
        assert time.monotonic() < end, "/health never answered 503 after SIGTERM"
        time.sleep(0.01)
    code, body = curl(s.http_base + "/v1/completions", key=None,
                      data=json.dumps({"prompt": [5], "max_tokens": 1}))
    assert code == 503 and "shutting down" in error_of(body)["message"]
    a.close()  # the last request leaves; the server exits without waiting out the grace
    assert s.wait_exit(60) == 0
