#!/usr/bin/python3
"""Tool calls and reasoning on the OpenAI chat API, end to end: the tiny random-weight model
behind real chat templates (Qwen2.5's and Qwen3's), driven by the official `openai` npm client
(tests/node/tool_calls.mjs; the Responses API: tests/node/responses.mjs) and by curl for the raw
SSE frames."""

import json
import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE_DIR = os.path.join(REPO, "tests", "node")
TEMPLATES = os.path.join(REPO, "tests", "fixtures", "chat_templates")


def flags(template):
    return ["--block-size", "16", "--num-kv-blocks", "256", "--shutdown-grace-s", "1",
            "--chat-template", os.path.join(TEMPLATES, template)]


@pytest.fixture(scope="module")
def qwen25(module_server):
    return module_server(flags("qwen2_5.jinja"))


@pytest.fixture(scope="module")
def qwen3(module_server):
    return module_server(flags("qwen3.jinja"))


def post(server, body):
    res = subprocess.run(["curl", "-sS", "-N", "-H", "Content-Type: application/json",
                          "--data-binary", "@-", f"{server.http_base}/v1/chat/completions"],
                         input=json.dumps(body).encode(), capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.decode()


def test_families_are_detected_from_the_template(qwen25, qwen3):
    assert "tool calls: hermes, reasoning: none" in qwen25.log_text()
    assert "tool calls: hermes, reasoning: think" in qwen3.log_text()


def test_streamed_call_never_shows_markup(qwen25):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"],
        "additionalProperties": False}}}]
    text = post(qwen25, {"messages": [{"role": "user", "content": "hi"}], "tools": tools,
                         "tool_choice": "required", "stream": True, "max_tokens": 100,
                         "seed": 1})
    events = [json.loads(e[len("data: "):]) for e in text.split("\n\n")
              if e.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events]
    assert all("<tool_call>" not in d.get("content", "") for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert calls[0]["id"].startswith("call_") and calls[0]["function"]["name"] == "f"
    args = "".join(c["function"].get("arguments", "") for c in calls)
    assert json.loads(args)["a"] in ("x", "y")
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_n_choices_each_parse_their_own_calls(qwen25, pb):
    # Every choice of n = 3 streams its own call: ids, names and arguments per index, never
    # another choice's markup or fragments; finish_reason "tool_calls" on each.
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"],
        "additionalProperties": False}}}]
    text = post(qwen25, {"messages": [{"role": "user", "content": "hi"}], "tools": tools,
                         "tool_choice": "required", "stream": True, "max_tokens": 100,
                         "seed": 3, "n": 3, "temperature": 1.0,
                         "parallel_tool_calls": False})
    events = [json.loads(e[len("data: "):]) for e in text.split("\n\n")
              if e.startswith("data: {")]
    by_index = {}
    for e in events:
        for c in e["choices"]:
            by_index.setdefault(c["index"], []).append(c)
    assert sorted(by_index) == [0, 1, 2]
    for index, chunks in by_index.items():
        deltas = [c["delta"] for c in chunks]
        assert all("<tool_call>" not in d.get("content", "") for d in deltas)
        calls = [t for d in deltas for t in d.get("tool_calls", [])]
        assert calls[0]["id"].startswith("call_") and calls[0]["function"]["name"] == "f"
        assert len({t["id"] for t in calls if "id" in t}) == 1, index
        args = "".join(t["function"].get("arguments", "") for t in calls)
        assert json.loads(args)["a"] in ("x", "y"), (index, args)
        assert chunks[-1]["finish_reason"] == "tool_calls", index
    # gRPC: each choice's own output parsed, on its last chunk or on the final complete.
    msgs = [pb.ChatMessage(role="user", content="hi")]
    req = pb.GenerateRequest(chat=pb.ChatPrompt(messages=msgs, tools_json=json.dumps(tools),
                                                tool_choice="required",
                                                parallel_tool_calls=False), n=3)
    req.stopping.max_tokens = 100
    req.sampling.seed = 3
    req.sampling.temperature = 1.0
    out = list(qwen25.stub().Generate(req, timeout=120))
    parsed = {m.chunk.index: m.chunk.chat_output for m in out[:-1] if m.chunk.finish_reason}
    parsed[out[-1].complete.index] = out[-1].complete.chat_output
    assert sorted(parsed) == [0, 1, 2]
    for index, co in parsed.items():
        assert [c.name for c in co.tool_calls] == ["f"], index
        assert json.loads(co.tool_calls[0].arguments)["a"] in ("x", "y")


def run_node_script(script, qwen25, qwen3):
    """Runs tests/node/<script> against the Qwen2.5 and Qwen3 servers; it must print ALL OK."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True,
                   capture_output=True, timeout=300)
    env = dict(os.environ, TOOLS_URL=f"{qwen25.http_base}/v1", THINK_URL=f"{qwen3.http_base}/v1",
               MODEL="tiny-llama")
    res = subprocess.run(["node", script], cwd=NODE_DIR, env=env, capture_output=True,
                         text=True, timeout=600)
    print(res.stdout, res.stderr)
    assert res.returncode == 0 and "ALL OK" in res.stdout, res.stdout + res.stderr


def test_openai_node_client_tool_calls(qwen25, qwen3):
    run_node_script("tool_calls.mjs", qwen25, qwen3)


def test_openai_node_client_responses(qwen25, qwen3):
    """POST /v1/responses through the openai client (tests/node/responses.mjs)."""
    run_node_script("responses.mjs", qwen25, qwen3)


def grpc_chat(server, pb, chat, **kw):
    req = pb.GenerateRequest(chat=chat, **kw)
    req.stopping.max_tokens = 200
    req.sampling.seed = 7
    out = list(server.stub().Generate(req, timeout=120))
    return out[-1].complete, "".join(m.chunk.text for m in out[:-1]) + out[-1].complete.text


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"],
    "additionalProperties": False}}}]


def test_grpc_chat_carries_tool_calls_and_reasoning(qwen25, qwen3, pb):
    msgs = [pb.ChatMessage(role="user", content="Weather in Paris?")]
    # Forced call: parsed into chat_output, the raw text still in chunks / complete.text.
    chat = pb.ChatPrompt(messages=msgs, tools_json=json.dumps(WEATHER), tool_choice="required",
                         parallel_tool_calls=False)
    done, text = grpc_chat(qwen25, pb, chat)
    assert "<tool_call>" in text
    calls = done.chat_output.tool_calls
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].id.startswith("call_")
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Oslo")
    assert done.chat_output.content.strip() == ""
    # Named, through tool_choice "function".
    chat = pb.ChatPrompt(messages=msgs, tools_json=json.dumps(WEATHER), tool_choice="function",
                         tool_choice_function="get_weather", parallel_tool_calls=False)
    done, _ = grpc_chat(qwen25, pb, chat)
    assert [c.name for c in done.chat_output.tool_calls] == ["get_weather"]
    # Reasoning (Qwen3) from markup a regex writes.
    chat = pb.ChatPrompt(messages=msgs)
    done, _ = grpc_chat(qwen3, pb, chat, regex="<think>\nhm\n</think>\n\nYes\\.")
    assert done.chat_output.reasoning_content == "\nhm\n"
    assert done.chat_output.content == "\n\nYes."
    # template kwargs reach the template; bad tool_choice values are refused.
    on, _ = grpc_chat(qwen3, pb, pb.ChatPrompt(messages=msgs))
    off, _ = grpc_chat(qwen3, pb, pb.ChatPrompt(
        messages=msgs, template_kwargs_json=json.dumps({"enable_thinking": False})))
    assert off.usage.prompt_tokens > on.usage.prompt_tokens
    import grpc
    for bad in [pb.ChatPrompt(messages=msgs, tools_json=json.dumps(WEATHER), tool_choice="x"),
                pb.ChatPrompt(messages=msgs, tool_choice="required"),
                pb.ChatPrompt(messages=msgs, tools_json=json.dumps(WEATHER),
                              tool_choice="function", tool_choice_function="nope")]:
        with pytest.raises(grpc.RpcError) as e:
            grpc_chat(qwen25, pb, bad)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()


# Every family's real template in front of the tiny model: a forced call comes back parsed,
# whole and streamed, and the returned message renders in a follow-up turn with a tool result.
FAMILY_TEMPLATES = {"qwen2_5.jinja": "hermes", "llama3_2.jinja": "llama3_json",
                    "mistral_nemo.jinja": "mistral", "deepseek_v3.jinja": "deepseek_v3",
                    "gptoss.jinja": "harmony"}


def sse_message(text):
    """The streamed message rebuilt from SSE chunks (content, tool calls, finish_reason)."""
    content, calls, finish = "", [], None
    for e in text.split("\n\n"):
        if not e.startswith("data: {"):
            continue
        ch = json.loads(e[len("data: "):])["choices"][0]
        d = ch["delta"]
        content += d.get("content") or ""
        for c in d.get("tool_calls", []):
            if c["index"] == len(calls):
                assert c["id"] and c["function"]["name"], "a call's first delta names it"
                calls.append({"id": c["id"], "type": "function",
                              "function": {"name": c["function"]["name"], "arguments": ""}})
            calls[c["index"]]["function"]["arguments"] += c["function"].get("arguments", "")
        finish = ch["finish_reason"] or finish
    return content, calls, finish


@pytest.mark.parametrize("template", sorted(FAMILY_TEMPLATES))
def test_forced_call_for_every_family(module_server, template):
    s = module_server(flags(template), name=template)
    assert f"tool calls: {FAMILY_TEMPLATES[template]}" in s.log_text()
    user = [{"role": "user", "content": "Weather in Paris?"}]
    for choice in ["required", {"type": "function", "function": {"name": "get_weather"}}]:
        req = {"messages": user, "tools": WEATHER, "tool_choice": choice,
               "parallel_tool_calls": False, "max_tokens": 200, "seed": 5}
        whole = json.loads(post(s, req))
        assert "choices" in whole, whole
        m = whole["choices"][0]["message"]
        assert whole["choices"][0]["finish_reason"] == "tool_calls", whole
        assert len(m["tool_calls"]) == 1, m
        call = m["tool_calls"][0]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Oslo")
        if FAMILY_TEMPLATES[template] == "mistral":
            assert len(call["id"]) == 9 and call["id"].isalnum(), "Mistral's templates need 9"
        content, calls, finish = sse_message(post(s, dict(req, stream=True)))
        assert finish == "tool_calls" and len(calls) == 1
        assert calls[0]["function"] == call["function"], "streamed == whole (same seed)"
        assert "TOOL_CALLS" not in content and "tool" not in content.lower()
    if template == "gptoss.jinja" and m["content"] is None:
        # gpt-oss's template tests `in message.content`; null content is made "" by the
        # message normalization of issue 50 item 3 (another branch), not here.
        m = dict(m, content="")
    follow = user + [m, {"role": "tool", "tool_call_id": call["id"], "content": "12 C"}]
    answer = json.loads(post(s, {"messages": follow, "tools": WEATHER, "max_tokens": 4}))
    assert "choices" in answer, answer
    assert answer["choices"][0]["message"]["role"] == "assistant"
