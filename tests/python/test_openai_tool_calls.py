#!/usr/bin/python3
"""Tool calls and reasoning on the OpenAI chat API, end to end: the tiny random-weight model
behind real chat templates (Qwen2.5's and Qwen3's), driven by the official `openai` npm client
(tests/node/tool_calls.mjs) and by curl for the raw SSE frames."""

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


def test_openai_node_client_tool_calls(qwen25, qwen3):
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True,
                   capture_output=True, timeout=300)
    env = dict(os.environ, TOOLS_URL=f"{qwen25.http_base}/v1", THINK_URL=f"{qwen3.http_base}/v1",
               MODEL="tiny-llama")
    res = subprocess.run(["node", "tool_calls.mjs"], cwd=NODE_DIR, env=env, capture_output=True,
                         text=True, timeout=600)
    print(res.stdout, res.stderr)
    assert res.returncode == 0 and "ALL OK" in res.stdout, res.stdout + res.stderr
