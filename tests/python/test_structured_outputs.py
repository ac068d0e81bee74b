#!/usr/bin/python3
"""Structured outputs end to end (issue 49): response_format, vLLM's structured_outputs and
guided_* fields on the OpenAI HTTP API, and the gRPC `constraint` oneof, against the tiny
random-weight model. From random weights only the grammar's mask can make the output parse,
validate (python3-jsonschema) and end with finish_reason "stop".
"""

import json
import re
import urllib.error
import urllib.request

import jsonschema
import pytest

from conftest import HANG_S

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def srv(module_server):
    return module_server(["--block-size", "16", "--num-kv-blocks", "256",
                          "--max-tokens-limit", "512", "--shutdown-grace-s", "1"])


def post(srv, path, body):
    """Returns (http status, parsed JSON body)."""
    req = urllib.request.Request(f"{srv.http_base}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=HANG_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def completion(srv, seed, **fields):
    body = {"model": "tiny-llama", "prompt": "Describe a person as JSON:", "max_tokens": 400,
            "temperature": 1.0, "seed": seed, **fields}
    code, out = post(srv, "/v1/completions", body)
    assert code == 200, out
    return out["choices"][0]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("strict", [True, False])
def test_response_format_json_schema(srv, endpoint, strict):
    rf = {"type": "json_schema",
          "json_schema": {"name": "person", "schema": SCHEMA, "strict": strict}}
    for seed in range(3):
        body = {"model": "tiny-llama", "max_tokens": 400, "temperature": 1.0, "seed": seed,
                "response_format": rf}
        if endpoint == "chat":
            body["messages"] = [{"role": "user", "content": "Describe a person as JSON."}]
            code, out = post(srv, "/v1/chat/completions", body)
            assert code == 200, out
            text = out["choices"][0]["message"]["content"]
        else:
            body["prompt"] = "Describe a person as JSON:"
            code, out = post(srv, "/v1/completions", body)
            assert code == 200, out
            text = out["choices"][0]["text"]
        assert out["choices"][0]["finish_reason"] == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_and_vllm_fields(srv):
    # Any JSON object has unbounded strings and nesting, so a random model may run to the limit:
    # every output that stops must be an object, and some stop.
    stopped = 0
    for seed in range(8):
        c = completion(srv, seed, response_format={"type": "json_object"})
        if c["finish_reason"] == "stop":
            stopped += 1
            assert isinstance(json.loads(c["text"]), dict), c["text"]
    assert stopped >= 1

    c = completion(srv, 2, structured_outputs={"json": SCHEMA})
    assert c["finish_reason"] == "stop"
    jsonschema.validate(json.loads(c["text"]), SCHEMA)

    c = completion(srv, 3, structured_outputs={"regex": "[a-z]{2,5}@[0-9]{3}"})
    assert c["finish_reason"] == "stop"
    assert re.fullmatch("[a-z]{2,5}@[0-9]{3}", c["text"]), c["text"]

    c = completion(srv, 4, guided_choice=["red", "green", "blue"])
    assert c["finish_reason"] == "stop" and c["text"] in ("red", "green", "blue"), c

    c = completion(srv, 5, guided_grammar='root ::= "id-" [0-9]+ ";"')
    assert c["finish_reason"] == "stop"
    assert re.fullmatch("id-[0-9]+;", c["text"]), c["text"]

    c = completion(srv, 6, guided_json=json.dumps(SCHEMA))
    assert c["finish_reason"] == "stop"
    jsonschema.validate(json.loads(c["text"]), SCHEMA)

    c = completion(srv, 7, guided_regex="(yes|no)")
    assert c["finish_reason"] == "stop" and c["text"] in ("yes", "no"), c


def test_streamed_json_schema(srv):
    body = {"model": "tiny-llama", "prompt": "JSON:", "max_tokens": 400, "seed": 11,
            "stream": True, "response_format": {"type": "json_schema",
                                                "json_schema": {"name": "p", "schema": SCHEMA}}}
    req = urllib.request.Request(f"{srv.http_base}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=HANG_S) as r:
        events = [line[len(b"data: "):] for line in r.read().split(b"\n\n") if line]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)


def bad(srv, **fields):
    body = {"model": "tiny-llama", "prompt": "x", "max_tokens": 4, **fields}
    code, out = post(srv, "/v1/completions", body)
    assert code == 400, out
    return out["error"]["message"]


def test_refusals_name_what_is_wrong(srv):
    schema = {"type": "object", "patternProperties": {"^a": {"type": "string"}}}
    msg = bad(srv, response_format={"type": "json_schema",
                                    "json_schema": {"name": "x", "schema": schema}})
    assert "patternProperties" in msg
    msg = bad(srv, response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    assert "schema" in msg
    msg = bad(srv, response_format={"type": "structural_tag"})
    assert "structural_tag" in msg
    msg = bad(srv, guided_regex="a+", guided_choice=["a"])
    assert "guided_regex" in msg and "guided_choice" in msg
    msg = bad(srv, response_format={"type": "json_object"}, structured_outputs={"regex": "a"})
    assert "response_format" in msg and "structured_outputs" in msg
    msg = bad(srv, structured_outputs={"regex": "a", "choice": ["a"]})
    assert "regex" in msg and "choice" in msg
    msg = bad(srv, structured_outputs={"whitespace_pattern": " "})
    assert "whitespace_pattern" in msg
    msg = bad(srv, guided_regex="(?=a)b")
    assert "regex" in msg
    msg = bad(srv, guided_regex="a" * 70000)
    assert "max_constraint_bytes" in msg


def test_grpc_constraint(srv, pb):
    stub = srv.stub()
    req = pb.GenerateRequest(text="JSON:", json_schema=json.dumps(SCHEMA))
    req.sampling.seed = 5
    req.stopping.max_tokens = 400
    text, complete = "", None
    for m in stub.Generate(req, timeout=HANG_S):
        if m.HasField("chunk"):
            text += m.chunk.text
        else:
            complete = m.complete
    text += complete.text
    assert complete.finish_reason == pb.FINISH_REASON_STOP
    jsonschema.validate(json.loads(text), SCHEMA)

    req = pb.GenerateRequest(text="pick:")
    req.choice.choices.extend(["alpha", "beta"])
    req.stopping.max_tokens = 50
    text = ""
    for m in stub.Generate(req, timeout=HANG_S):
        text += m.chunk.text if m.HasField("chunk") else m.complete.text
    assert text in ("alpha", "beta")
