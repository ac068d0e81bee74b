#!/usr/bin/python3
"""A chat with tool calls renders the same prompt on both front ends.

The server runs the tiny model with a real tool-calling template from the fixtures (Qwen3's, and
the Llama 3.x one). For one OpenAI conversation (tool definitions, an assistant tool call with
empty content, the tool's result with tool_call_id and name, an answer, a new question):
  - HTTP /tokenize of the messages is the tokenization of Python jinja2's rendering of the
    template (tests/python/chat_template_reference.py) over the messages as vLLM hands them to
    the template (tool-call arguments parsed from JSON text into objects), so the HTTP prompt is
    the reference;
  - the gRPC ChatPrompt of the same conversation generates exactly what that prompt's token ids
    generate (prompt length, greedy tokens and their logprobs, which depend on every prompt
    token), and what /v1/chat/completions generates;
  - the same gRPC chat without its tool fields does not, so the comparison can fail.
"""

import json
import os
import urllib.request

import pytest

import chat_template_reference as ref
from conftest import HANG_S

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "chat_templates")
MAX_TOKENS = 4

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "description": "City name"},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}]
ARGS = '{"city": "Paris", "unit": "celsius"}'
# Keys in the order the gRPC front end writes them (role, content, name, tool_calls,
# tool_call_id), so even a template that iterates a message sees the same thing.
MESSAGES = [
    {"role": "system", "content": "You answer weather questions."},
    {"role": "user", "content": "How warm is it in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0001", "type": "function",
         "function": {"name": "get_weather", "arguments": ARGS}}]},
    {"role": "tool", "content": '{"temperature": 21}', "name": "get_weather",
     "tool_call_id": "call_0001"},
    {"role": "assistant", "content": "It is 21 degrees in Paris."},
    {"role": "user", "content": "And tomorrow?"},
]


def as_vllm_renders(messages):
    """vLLM's preprocessing before the template: tool-call `arguments` text parsed to objects
    (templates write `arguments | tojson`), content null as ""."""
    out = json.loads(json.dumps(messages))
    for m in out:
        if m.get("content") is None:
            m["content"] = ""
        for c in m.get("tool_calls") or []:
            args = c["function"].get("arguments")
            c["function"]["arguments"] = json.loads(args) if args else {}
    return out


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=HANG_S) as r:
        return json.loads(r.read())


def grpc_messages(pb, messages, with_tool_fields=True):
    out = []
    for m in messages:
        g = pb.ChatMessage(role=m["role"])
        if m.get("content") is not None:  # None: the field left unset
            g.content = m["content"]
        if with_tool_fields:
            if "name" in m:
                g.name = m["name"]
            for c in m.get("tool_calls", []):
                g.tool_calls.add(id=c["id"], name=c["function"]["name"],
                                 arguments=c["function"]["arguments"])
            if "tool_call_id" in m:
                g.tool_call_id = m["tool_call_id"]
        out.append(g)
    return out


def generate(pb, stub, **prompt):
    req = pb.GenerateRequest(**prompt, logprobs=1)
    req.sampling.temperature = 0
    req.stopping.max_tokens = MAX_TOKENS
    req.stopping.ignore_eos = True
    out = list(stub.Generate(req, timeout=HANG_S))
    done = out[-1].complete
    ids = [t for m in out[:-1] for t in m.chunk.token_ids] + list(done.token_ids)
    logprobs = [t.logprob for m in out[:-1] for t in m.chunk.logprobs] + \
        [t.logprob for t in done.logprobs]
    assert len(logprobs) == len(ids), "one logprob per generated token, the last step's included"
    text = "".join(m.chunk.text for m in out[:-1]) + done.text
    return {"prompt_tokens": done.usage.prompt_tokens, "ids": ids, "logprobs": logprobs,
            "text": text}


@pytest.fixture(scope="module", params=["qwen3", "llama3_2"])
def chat_server(request, module_server):
    name = request.param
    path = os.path.join(FIXTURES, name + ".jinja")
    return name, path, module_server(["--chat-template", path], name=f"server-{name}")


def test_grpc_chat_with_tool_calls_renders_as_http(chat_server, pb):
    name, path, s = chat_server
    stub = s.stub()
    # The special tokens the server passes come from the model's tokenizer.
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=HANG_S)
    special = {"bos_token": stub.Detokenize(pb.DetokenizeRequest(
        token_ids=[info.bos_token_id], skip_special_tokens=False), timeout=HANG_S).text,
               "eos_token": stub.Detokenize(pb.DetokenizeRequest(
        token_ids=[info.eos_token_ids[0]], skip_special_tokens=False), timeout=HANG_S).text}
    with open(path) as f:
        compiled = ref.compile_template(f.read())
    conv = {"messages": as_vllm_renders(MESSAGES), "tools": TOOLS, "add_generation_prompt": True}
    expected = ref.render(compiled, conv, special)
    assert "get_weather" in expected.split("How warm")[1] and "Paris" in expected, expected
    expected_ids = post(s.http_port, "/tokenize",
                        {"prompt": expected, "add_special_tokens": False})["tokens"]
    http_ids = post(s.http_port, "/tokenize", {"messages": MESSAGES, "tools": TOOLS})["tokens"]
    assert http_ids == expected_ids, f"{name}: HTTP renders differently from jinja2"

    chat = pb.ChatPrompt(messages=grpc_messages(pb, MESSAGES), tools_json=json.dumps(TOOLS))
    via_chat = generate(pb, stub, chat=chat)
    via_ids = generate(pb, stub, token_ids=pb.TokenIds(ids=expected_ids))
    assert via_chat["prompt_tokens"] == len(expected_ids)
    assert via_chat["ids"] == via_ids["ids"] and len(via_chat["ids"]) == MAX_TOKENS
    # Equal to float rounding (the second request may reuse the first's cached prefix); a prompt
    # one token apart moves them far more.
    assert len(via_chat["logprobs"]) == MAX_TOKENS
    assert via_chat["logprobs"] == pytest.approx(via_ids["logprobs"], rel=1e-5)

    http = post(s.http_port, "/v1/chat/completions",
                {"messages": MESSAGES, "tools": TOOLS, "max_tokens": MAX_TOKENS,
                 "temperature": 0, "ignore_eos": True, "logprobs": True})
    assert http["usage"]["prompt_tokens"] == len(expected_ids)
    assert http["choices"][0]["message"]["content"] == via_chat["text"]
    http_logprobs = [t["logprob"] for t in http["choices"][0]["logprobs"]["content"]]
    assert http_logprobs == pytest.approx(via_chat["logprobs"], rel=1e-5)

    # Without the tool fields the prompt differs: the comparison above can fail.
    bare = pb.ChatPrompt(messages=grpc_messages(pb, MESSAGES, with_tool_fields=False),
                         tools_json=json.dumps(TOOLS))
    try:
        without = generate(pb, stub, chat=bare)
    except Exception as e:  # a template may refuse a tool message without its call
        assert "chat template" in str(e), e
    else:
        assert without["prompt_tokens"] != via_chat["prompt_tokens"] or (
            without["logprobs"] != pytest.approx(via_chat["logprobs"], rel=1e-3))


def test_grpc_empty_tools_is_no_tools(chat_server, pb):
    """tools_json "[]" renders as no tools, as an HTTP request with "tools": [] does."""
    _, _, s = chat_server
    stub = s.stub()
    msgs = MESSAGES[:2]
    none = post(s.http_port, "/tokenize", {"messages": msgs})["tokens"]
    assert post(s.http_port, "/tokenize", {"messages": msgs, "tools": []})["tokens"] == none
    got = generate(pb, stub, chat=pb.ChatPrompt(messages=grpc_messages(pb, msgs), tools_json="[]"))
    ref_ids = generate(pb, stub, token_ids=pb.TokenIds(ids=none))
    assert got["prompt_tokens"] == len(none)
    assert got["logprobs"] == pytest.approx(ref_ids["logprobs"], rel=1e-5)


def test_template_that_tests_null_content_gets_the_api_shape(module_server, pb):
    """DeepSeek-V3's template renders an assistant turn's calls only when its content is None and
    writes the arguments as the OpenAI strings they are: given vLLM's shapes ("" and objects) it
    would drop the calls without an error. The server hands it the turn as the API sends it, and
    renders what jinja2 renders from that (on both front ends)."""
    path = os.path.join(FIXTURES, "deepseek_v3.jinja")
    s = module_server(["--chat-template", path], name="server-deepseek_v3")
    stub = s.stub()
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=HANG_S)
    special = {"bos_token": stub.Detokenize(pb.DetokenizeRequest(
        token_ids=[info.bos_token_id], skip_special_tokens=False), timeout=HANG_S).text,
               "eos_token": stub.Detokenize(pb.DetokenizeRequest(
        token_ids=[info.eos_token_ids[0]], skip_special_tokens=False), timeout=HANG_S).text}
    messages = json.loads(json.dumps(MESSAGES))
    messages[2]["content"] = None  # the assistant turn exactly as the API returned it
    with open(path) as f:
        compiled = ref.compile_template(f.read())
    expected = ref.render(compiled, {"messages": messages, "tools": TOOLS,
                                     "add_generation_prompt": True}, special)
    assert "get_weather" in expected and ARGS in expected, expected  # the call is rendered
    expected_ids = post(s.http_port, "/tokenize",
                        {"prompt": expected, "add_special_tokens": False})["tokens"]
    http_ids = post(s.http_port, "/tokenize", {"messages": messages, "tools": TOOLS})["tokens"]
    assert http_ids == expected_ids, "HTTP renders differently from jinja2"
    # gRPC: a ChatMessage without content is the null content.
    grpc_msgs = grpc_messages(pb, messages)
    via_chat = generate(pb, stub, chat=pb.ChatPrompt(messages=grpc_msgs,
                                                      tools_json=json.dumps(TOOLS)))
    assert via_chat["prompt_tokens"] == len(expected_ids)
