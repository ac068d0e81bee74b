"""End-to-end test of tools/loadgen.py against the real server: the load generator with
deliberate aborts and invalid requests, then its JSON report and the server's metrics baseline.
Fixtures and options: conftest.py.

    /usr/bin/python3 -m pytest -q tests/python/test_loadgen.py --server-bin \
        build/cpu/server/llm-server --model build/cpu/models/tiny-llama \
        --proto-python build/cpu/python [-k 500_streams]
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import HANG_S

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOADGEN = os.path.join(REPO, "tools", "loadgen.py")
INPUT_LEN, OUTPUT_LEN = 32, 16


def ordered(stats):
    return stats["p50"] <= stats["p90"] <= stats["p99"] <= stats["max"] + 1e-9


def check_report(rep, n, abort_fraction, invalid_fraction):
    """Assertions on loadgen's JSON report."""
    reqs = rep["requests"]
    n_abort = round(abort_fraction * n)
    n_invalid = round(invalid_fraction * n)
    assert len(reqs) == n, f"{len(reqs)} request records, expected {n}"
    kinds = [r["kind"] for r in reqs]
    assert kinds.count("abort") == n_abort, (f"{kinds.count('abort')} abort requests, "
          f"expected {n_abort}")
    assert kinds.count("invalid") == n_invalid, (f"{kinds.count('invalid')} invalid requests, "
          f"expected {n_invalid}")
    for r in reqs:
        tag = f"request {r['index']} ({r['kind']})"
        if r["kind"] == "normal":
            assert r["status"] == "OK", f"{tag}: status {r['status']} {r['detail']}"
            if r["status"] == "OK":
                assert r["output_tokens"] == r["max_tokens"] == OUTPUT_LEN, (f"{tag}: {r['output_tokens']} output tokens; max_tokens {r['max_tokens']}, "
                      f"--output-len {OUTPUT_LEN}")
                assert r["streamed_tokens"] == r["output_tokens"], (f"{tag}: streamed {r['streamed_tokens']} tokens, usage "
                      f"{r['output_tokens']}")
                assert r["prompt_tokens"] == INPUT_LEN, (
                    f"{tag}: usage.prompt_tokens {r['prompt_tokens']}, sent {INPUT_LEN}")
                assert r["finish_reason"] == "FINISH_REASON_LENGTH", (
                    f"{tag}: finish reason {r['finish_reason']}")
                assert r["ttft_ms"] is not None and 0 < r["ttft_ms"] <= r["e2e_ms"], (
                    f"{tag}: ttft {r['ttft_ms']} e2e {r['e2e_ms']}")
        elif r["kind"] == "invalid":
            assert r["status"] == "INVALID_ARGUMENT", (f"{tag} [{r['invalid_variant']}]: status {r['status']}, "
                  "expected INVALID_ARGUMENT")
            assert r["streamed_tokens"] == 0, f"{tag}: streamed tokens for an invalid request"
        elif r["kind"] == "abort":
            # Cancelled mid-stream; OK only if the stream completed before the abort point.
            assert r["status"] in ("CANCELLED", "OK"), f"{tag}: status {r['status']}"
            if r["status"] == "CANCELLED":
                assert r["streamed_tokens"] < OUTPUT_LEN, (
                    f"{tag}: cancelled after all {r['streamed_tokens']} tokens")

    c = rep["counts"]
    assert c["unexpected_errors"] == 0, (f"unexpected errors: {rep['unexpected_errors']} "
          f"{rep['unexpected_error_details']}")
    assert c["measured"] == n - n_abort - n_invalid, f"{c['measured']} measured requests"
    assert rep["expected_errors"].get("INVALID_ARGUMENT", 0) == n_invalid, (
        f"expected errors {rep['expected_errors']}")
    assert not rep["anomalies"], f"anomalies: {rep['anomalies'][:5]}"
    for name in ("ttft", "tpot", "itl", "e2e"):
        s = rep["latency_ms"][name]
        assert s["count"] > 0, f"no {name} samples"
        if s["count"]:
            assert ordered(s), f"{name} percentiles not ordered: {s}"
            assert s["mean"] > 0, f"{name} mean {s['mean']}"
    e2e, ttft = rep["latency_ms"]["e2e"], rep["latency_ms"]["ttft"]
    if e2e["count"] and ttft["count"]:
        assert ttft["p50"] <= e2e["p50"], "TTFT p50 above E2E p50"
    th = rep["throughput"]
    assert th["request_throughput"] > 0, f"request throughput {th['request_throughput']}"
    assert th["output_token_throughput"] > 0, f"output throughput {th['output_token_throughput']}"
    assert th["total_token_throughput"] > th["output_token_throughput"], (
        "total token throughput not above output throughput")
    assert rep["duration_s"] > 0, "duration"



@pytest.mark.parametrize("n, concurrency, abort_fraction, invalid_fraction, limit_s, backend", [
    pytest.param(40, 8, 0.1, 0.1, 1200, "grpc", id="40_requests"),
    # The same workload over the OpenAI HTTP API (aborts are client disconnects).
    pytest.param(40, 8, 0.1, 0.1, 1200, "openai-completions", id="40_requests_openai"),
    # Reliability: 500 concurrent streams, 10% of clients disconnect mid-stream, 5% invalid.
    pytest.param(500, 500, 0.1, 0.05, 1200, "grpc", id="500_streams"),
])
def test_loadgen(server, option, tmp_path, n, concurrency, abort_fraction, invalid_fraction,
                 limit_s, backend):
    s = server()
    out_json = str(tmp_path / "report.json")
    cmd = [sys.executable, LOADGEN, "--target", s.target,
           "--proto-python", option("proto_python"),
           "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN),
           "--num-requests", str(n), "--concurrency", str(concurrency),
           "--abort-fraction", str(abort_fraction), "--invalid-fraction", str(invalid_fraction),
           "--seed", "7", "--request-timeout", str(HANG_S), "--fail-on-errors",
           "--no-progress", "--output-json", out_json, "--backend", backend]
    if backend != "grpc":
        cmd += ["--base-url", f"http://127.0.0.1:{s.http_port}"]
    # limit_s only guards against a hang.
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s)
    print(res.stdout)
    print(res.stderr, file=sys.stderr)
    assert res.returncode == 0, f"loadgen exited {res.returncode}"
    assert "Latency (ms)" in res.stdout, "summary table missing from stdout"
    with open(out_json) as f:
        check_report(json.load(f), n, abort_fraction, invalid_fraction)
    assert s.alive(), "server exited during the run"
    # Every resource is back at baseline: no running or waiting request and no KV block in use
    # (cached prefix blocks sit on the free list and do not count).
    m = s.wait_idle()
    ended = sum(v for k, v in m.items() if k.startswith("llm_requests_total"))
    n_invalid = round(invalid_fraction * n)
    assert ended == n - n_invalid, "every accepted request ends exactly once"
    assert s.terminate() == 0


@pytest.mark.parametrize("backend", ["grpc", "openai-completions"])
def test_loadgen_json_schema(server, option, tmp_path, backend):
    """--json-schema constrains every request (gRPC constraint / OpenAI response_format): a
    string that cannot end within --output-len tokens, so each request runs to its length, and
    the streamed text is a prefix of such JSON."""
    s = server()
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {
        "text": {"type": "string", "minLength": 1000}}, "required": ["text"],
        "additionalProperties": False}))
    out_json = str(tmp_path / "report.json")
    cmd = [sys.executable, LOADGEN, "--target", s.target, "--proto-python", option("proto_python"),
           "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN), "--num-requests", "12",
           "--concurrency", "6", "--seed", "3", "--request-timeout", str(HANG_S),
           "--fail-on-errors", "--no-progress", "--output-json", out_json, "--backend", backend,
           "--json-schema", str(schema)]
    if backend != "grpc":
        cmd += ["--base-url", f"http://127.0.0.1:{s.http_port}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    print(res.stdout)
    print(res.stderr, file=sys.stderr)
    assert res.returncode == 0, f"loadgen exited {res.returncode}"
    with open(out_json) as f:
        check_report(json.load(f), 12, 0.0, 0.0)
    # The server saw the constraint: a prefix of {"text": "...".
    req = {"prompt": "x", "max_tokens": 8, "response_format": {"type": "json_schema",
           "json_schema": {"name": "t", "schema": json.loads(schema.read_text())}}}
    import urllib.request
    r = urllib.request.Request(f"http://127.0.0.1:{s.http_port}/v1/completions",
                               data=json.dumps(req).encode(),
                               headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=HANG_S) as resp:
        text = json.loads(resp.read())["choices"][0]["text"]
    assert text.lstrip().startswith("{"), text
    assert s.terminate() == 0


if __name__ == "__main__":  # the same as /usr/bin/python3 -m pytest THIS_FILE [options]
    sys.exit(pytest.main([__file__] + sys.argv[1:]))
