#!/usr/bin/python3
"""End-to-end test of tools/loadgen.py against the real server (ctest style: exit 1 on failure).

Starts llm-server on a free loopback port, runs the load generator with deliberate aborts and
invalid requests, and checks the JSON report. --backend openai-completions runs the same workload
over the OpenAI HTTP API (aborts are then client disconnects).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

NUM_REQUESTS, CONCURRENCY, INPUT_LEN, OUTPUT_LEN = 40, 8, 32, 16
ABORT_FRACTION = INVALID_FRACTION = 0.1

failures = []


def check(cond, msg):
    """Records a failed assertion (the test goes on to report every failure)."""
    if not cond:
        failures.append(msg)
        print(f"FAIL: {msg}", file=sys.stderr)


def start_server(server_bin, model, timeout=30.0):
    """Starts the server on port 0; returns (process, port, log lines)."""
    proc = subprocess.Popen(
        [server_bin, "--model", model, "--listen-address", "127.0.0.1:0",
         "--metrics-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    log, port_box, ready = [], [], threading.Event()

    def reader():
        for line in proc.stdout:
            log.append(line.rstrip("\n"))
            if line.startswith("LISTENING ") and not port_box:
                port_box.append(int(line.split()[1]))
                ready.set()
        ready.set()

    threading.Thread(target=reader, daemon=True).start()
    if not ready.wait(timeout) or not port_box:
        proc.kill()
        proc.wait()
        sys.exit("server did not print LISTENING <port>:\n" + "\n".join(log[-40:]))
    return proc, port_box[0], log


def stop_server(proc):
    """SIGTERM, then SIGKILL if the server does not exit in time."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        failures.append("server did not exit within 15 s of SIGTERM")
        proc.kill()
        proc.wait()


def ordered(stats):
    return stats["p50"] <= stats["p90"] <= stats["p99"] <= stats["max"] + 1e-9


def check_report(rep):
    """Assertions on loadgen's JSON report."""
    reqs = rep["requests"]
    n_abort = round(ABORT_FRACTION * NUM_REQUESTS)
    n_invalid = round(INVALID_FRACTION * NUM_REQUESTS)
    check(len(reqs) == NUM_REQUESTS, f"{len(reqs)} request records, expected {NUM_REQUESTS}")
    kinds = [r["kind"] for r in reqs]
    check(kinds.count("abort") == n_abort, f"{kinds.count('abort')} abort requests, "
          f"expected {n_abort}")
    check(kinds.count("invalid") == n_invalid, f"{kinds.count('invalid')} invalid requests, "
          f"expected {n_invalid}")
    for r in reqs:
        tag = f"request {r['index']} ({r['kind']})"
        if r["kind"] == "normal":
            check(r["status"] == "OK", f"{tag}: status {r['status']} {r['detail']}")
            if r["status"] == "OK":
                check(r["output_tokens"] == r["max_tokens"] == OUTPUT_LEN,
                      f"{tag}: {r['output_tokens']} output tokens; max_tokens {r['max_tokens']}, "
                      f"--output-len {OUTPUT_LEN}")
                check(r["streamed_tokens"] == r["output_tokens"],
                      f"{tag}: streamed {r['streamed_tokens']} tokens, usage "
                      f"{r['output_tokens']}")
                check(r["prompt_tokens"] == INPUT_LEN,
                      f"{tag}: usage.prompt_tokens {r['prompt_tokens']}, sent {INPUT_LEN}")
                check(r["finish_reason"] == "FINISH_REASON_LENGTH",
                      f"{tag}: finish reason {r['finish_reason']}")
                check(r["ttft_ms"] is not None and 0 < r["ttft_ms"] <= r["e2e_ms"],
                      f"{tag}: ttft {r['ttft_ms']} e2e {r['e2e_ms']}")
        elif r["kind"] == "invalid":
            check(r["status"] == "INVALID_ARGUMENT",
                  f"{tag} [{r['invalid_variant']}]: status {r['status']}, "
                  "expected INVALID_ARGUMENT")
            check(r["streamed_tokens"] == 0, f"{tag}: streamed tokens for an invalid request")
        elif r["kind"] == "abort":
            # Cancelled mid-stream; OK only if the stream completed before the abort point.
            check(r["status"] in ("CANCELLED", "OK"), f"{tag}: status {r['status']}")
            if r["status"] == "CANCELLED":
                check(r["streamed_tokens"] < OUTPUT_LEN,
                      f"{tag}: cancelled after all {r['streamed_tokens']} tokens")

    c = rep["counts"]
    check(c["unexpected_errors"] == 0, f"unexpected errors: {rep['unexpected_errors']} "
          f"{rep['unexpected_error_details']}")
    check(c["measured"] == NUM_REQUESTS - n_abort - n_invalid,
          f"{c['measured']} measured requests")
    check(rep["expected_errors"].get("INVALID_ARGUMENT") == n_invalid,
          f"expected errors {rep['expected_errors']}")
    check(not rep["anomalies"], f"anomalies: {rep['anomalies'][:5]}")
    for name in ("ttft", "tpot", "itl", "e2e"):
        s = rep["latency_ms"][name]
        check(s["count"] > 0, f"no {name} samples")
        if s["count"]:
            check(ordered(s), f"{name} percentiles not ordered: {s}")
            check(s["mean"] > 0, f"{name} mean {s['mean']}")
    e2e, ttft = rep["latency_ms"]["e2e"], rep["latency_ms"]["ttft"]
    if e2e["count"] and ttft["count"]:
        check(ttft["p50"] <= e2e["p50"], "TTFT p50 above E2E p50")
    th = rep["throughput"]
    check(th["request_throughput"] > 0, f"request throughput {th['request_throughput']}")
    check(th["output_token_throughput"] > 0, f"output throughput {th['output_token_throughput']}")
    check(th["total_token_throughput"] > th["output_token_throughput"],
          "total token throughput not above output throughput")
    check(rep["duration_s"] > 0, "duration")


def scrape(port):
    """Returns {metric line name: value} from the server's Prometheus endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def check_metrics_baseline(log):
    """After the run, every resource must be back at baseline: no running or waiting request and
    no KV block in use (cached prefix blocks sit on the free list and do not count)."""
    ports = [int(l.split()[1]) for l in log if l.startswith("METRICS_LISTENING ")]
    if not ports:
        check(False, "server printed no METRICS_LISTENING line")
        return
    deadline = time.monotonic() + 10
    while True:
        m = scrape(ports[0])
        idle = (m.get("llm_num_requests_running") == 0 and m.get("llm_num_requests_waiting") == 0
                and m.get("llm_kv_cache_usage_perc") == 0)
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    check(idle, "resources not back at baseline after the run: running "
          f"{m.get('llm_num_requests_running')}, waiting {m.get('llm_num_requests_waiting')}, "
          f"kv usage {m.get('llm_kv_cache_usage_perc')}")
    ended = sum(v for k, v in m.items() if k.startswith("llm_requests_total"))
    n_invalid = round(INVALID_FRACTION * NUM_REQUESTS)
    check(ended == NUM_REQUESTS - n_invalid,
          f"llm_requests_total sums to {ended}, expected {NUM_REQUESTS - n_invalid} "
          "(every accepted request ends exactly once)")
    print(f"metrics baseline: running 0, waiting 0, kv usage 0, {ended:.0f} requests ended")


def main():
    global NUM_REQUESTS, CONCURRENCY, ABORT_FRACTION, INVALID_FRACTION
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server-bin", default=os.path.join(REPO, "build/cpu/server/llm-server"))
    ap.add_argument("--model", default=os.path.join(REPO, "build/cpu/models/tiny-llama"))
    ap.add_argument("--proto-python", default=os.path.join(REPO, "build/cpu/python"))
    ap.add_argument("--loadgen", default=os.path.join(REPO, "tools/loadgen.py"))
    ap.add_argument("--timeout", type=float, default=90.0, help="limit for the loadgen run (s)")
    ap.add_argument("--num-requests", type=int, default=NUM_REQUESTS)
    ap.add_argument("--concurrency", type=int, default=CONCURRENCY)
    ap.add_argument("--abort-fraction", type=float, default=ABORT_FRACTION)
    ap.add_argument("--invalid-fraction", type=float, default=INVALID_FRACTION)
    ap.add_argument("--backend", default="grpc",
                    choices=("grpc", "openai-completions", "openai-chat"))
    args = ap.parse_args()
    NUM_REQUESTS, CONCURRENCY = args.num_requests, args.concurrency
    ABORT_FRACTION, INVALID_FRACTION = args.abort_fraction, args.invalid_fraction

    t_start = time.monotonic()
    proc, port, log = start_server(args.server_bin, args.model)
    try:
        with tempfile.TemporaryDirectory(prefix="test_loadgen_") as tmp:
            out_json = os.path.join(tmp, "report.json")
            cmd = [sys.executable, args.loadgen, "--target", f"127.0.0.1:{port}",
                   "--proto-python", args.proto_python,
                   "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN),
                   "--num-requests", str(NUM_REQUESTS), "--concurrency", str(CONCURRENCY),
                   "--abort-fraction", str(ABORT_FRACTION),
                   "--invalid-fraction", str(INVALID_FRACTION),
                   "--seed", "7", "--request-timeout", "60", "--fail-on-errors",
                   "--no-progress", "--output-json", out_json, "--backend", args.backend]
            if args.backend != "grpc":
                http = [int(l.split()[1]) for l in log if l.startswith("HTTP_LISTENING ")]
                cmd += ["--base-url", f"http://127.0.0.1:{http[0]}"]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                sys.exit(f"FAIL: loadgen did not finish within {args.timeout:.0f} s "
                         "(server hang?)\n" + "\n".join(log[-40:]))
            print(res.stdout)
            if res.stderr.strip():
                print(res.stderr, file=sys.stderr)
            check(res.returncode == 0, f"loadgen exited {res.returncode}")
            check("Latency (ms)" in res.stdout, "summary table missing from stdout")
            if os.path.exists(out_json):
                with open(out_json) as f:
                    check_report(json.load(f))
            else:
                check(False, "loadgen wrote no JSON report")
        check(proc.poll() is None, f"server exited during the run (rc {proc.returncode})")
        check_metrics_baseline(log)
    finally:
        stop_server(proc)
    elapsed = time.monotonic() - t_start
    if failures:
        print(f"\n{len(failures)} failure(s); server log tail:", file=sys.stderr)
        print("\n".join(log[-30:]), file=sys.stderr)
        return 1
    print(f"test_loadgen: OK ({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
