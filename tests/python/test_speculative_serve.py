#!/usr/bin/python3
"""Speculative decoding (n-gram and draft model) served end to end: greedy completions are the
same with and without it (and with a request that opts out), the model as its own draft has every
draft accepted, the opt-out field is type-checked, the methods that do not run yet and incomplete
options are refused at start-up, and tools/loadgen.py reports the acceptance read from /metrics.
Fixtures and options: conftest.py.

    /usr/bin/python3 -m pytest -q tests/python/test_speculative_serve.py --server-bin \\
        build/cpu/server/llm-server --model build/cpu/models/tiny-llama \\
        --proto-python build/cpu/python
"""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from conftest import HANG_S

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOADGEN = os.path.join(REPO, "tools", "loadgen.py")
SPEC_FLAGS = ["--speculative-method", "ngram", "--num-speculative-tokens", "3"]


def post(base, path, body):
    """(http status, parsed JSON body)."""
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=HANG_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def completion(base, prompt, **extra):
    code, body = post(base, "/v1/completions", {"prompt": prompt, "max_tokens": 40,
                                                "temperature": 0, "ignore_eos": True, **extra})
    assert code == 200, body
    return body["choices"][0]["text"], body["usage"]["completion_tokens"]


def test_greedy_output_is_unchanged(server):
    spec, plain = server(SPEC_FLAGS, name="speculative"), server(name="plain")
    # Prompts that repeat themselves, so that the proposer drafts.
    prompts = [[5, 6, 7, 8] * 6, [40, 41] * 10 + [40], list(range(100, 130)) * 2]
    for p in prompts:
        want = completion(plain.http_base, p)
        assert completion(spec.http_base, p) == want
        assert completion(spec.http_base, p, speculative_decoding=False) == want
    m = spec.metrics()
    assert m["llm_spec_decode_num_drafts_total"] > 0
    assert m["llm_spec_decode_num_accepted_tokens_total"] <= \
        m["llm_spec_decode_num_draft_tokens_total"]
    assert m["llm_engine_step_draft_seconds_count"] > 0
    assert plain.metrics()["llm_spec_decode_num_drafts_total"] == 0
    spec.wait_idle()


def test_draft_model_greedy_output_is_unchanged(server, option):
    # The served model as its own draft model: every greedy draft is the target's token.
    flags = ["--speculative-method", "draft", "--speculative-model", option("model"),
             "--num-speculative-tokens", "3"]
    spec, plain = server(flags, name="draft"), server(name="plain")
    for p in [[5, 6, 7, 8] * 6, list(range(100, 130))]:
        want = completion(plain.http_base, p)
        assert completion(spec.http_base, p) == want
        assert completion(spec.http_base, p, speculative_decoding=False) == want
    m = spec.metrics()
    assert m["llm_spec_decode_num_drafts_total"] > 0
    assert m["llm_spec_decode_num_accepted_tokens_total"] == \
        m["llm_spec_decode_num_draft_tokens_total"]
    assert m["llm_engine_step_draft_seconds_count"] > 0
    spec.wait_idle()


def test_grpc_opt_out(server, pb):
    s = server(SPEC_FLAGS)
    stub = s.stub()

    def tokens(**extra):
        req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[9, 10, 11] * 6),
                                 sampling=pb.SamplingParams(temperature=0),
                                 stopping=pb.StoppingParams(max_tokens=30, ignore_eos=True),
                                 **extra)
        out = []
        for msg in stub.Generate(req, timeout=HANG_S):
            if msg.HasField("chunk"):
                out += list(msg.chunk.token_ids)
            else:
                out += list(msg.complete.token_ids)
        return out

    drafts = s.metrics()["llm_spec_decode_num_drafts_total"]
    opted_out = tokens(speculative_decoding=False)
    assert s.metrics()["llm_spec_decode_num_drafts_total"] == drafts  # nothing drafted
    assert len(opted_out) == 30
    assert tokens() == opted_out
    assert tokens(speculative_decoding=True) == opted_out
    assert s.metrics()["llm_spec_decode_num_drafts_total"] > drafts


def test_opt_out_field_is_type_checked(server):
    s = server(SPEC_FLAGS)
    code, body = post(s.http_base, "/v1/completions",
                      {"prompt": "x", "max_tokens": 1, "speculative_decoding": "no"})
    assert code == 400
    assert body["error"]["param"] == "speculative_decoding"


@pytest.mark.parametrize("flags, message", [
    (["--speculative-method", "draft"], "needs the draft model's directory"),
    (["--speculative-model", "/nonexistent"], "--speculative-method draft"),
    # The tiny model is a Llama: no multi-token-prediction layer to load.
    (["--speculative-method", "mtp"], "--speculative-method mtp needs a DeepSeek-V3 checkpoint"),
    (["--speculative-method", "ngram", "--num-speculative-tokens", "5"],
     "--num-speculative-tokens"),
])
def test_refused_at_start(option, flags, message):
    res = subprocess.run([option("server_bin"), "--model-dir", option("model"), *flags],
                         capture_output=True, text=True, timeout=HANG_S)
    assert res.returncode != 0
    assert message in res.stderr + res.stdout


def test_loadgen_reports_acceptance(server, option, tmp_path):
    s = server(SPEC_FLAGS)
    out_json = str(tmp_path / "report.json")
    res = subprocess.run(
        [sys.executable, LOADGEN, "--target", s.target, "--proto-python", option("proto_python"),
         "--input-len", "32", "--output-len", "24", "--num-requests", "8", "--concurrency", "4",
         "--seed", "3", "--request-timeout", str(HANG_S), "--fail-on-errors", "--no-progress",
         "--output-json", out_json,
         "--metrics-url", f"http://127.0.0.1:{s.metrics_port}/metrics"],
        capture_output=True, text=True, timeout=HANG_S)
    print(res.stdout)
    print(res.stderr, file=sys.stderr)
    assert res.returncode == 0
    with open(out_json) as f:
        sd = json.load(f)["speculative_decoding"]
    assert sd is not None
    assert 0 <= sd["accepted_tokens"] <= sd["draft_tokens"]
    assert sd["draft_ms_per_step"] >= 0
    assert "Speculative: acceptance rate" in res.stdout
