#!/usr/bin/env python3
"""Checks a built image from inside it (the Dockerfile's test stage runs this as the image's user).

Starts the server exactly as the ENTRYPOINT does, waits for its LISTENING line, then requires:
the HEALTHCHECK command exits 0 and prints SERVING, one Generate call streams max_tokens tokens
and ends with FINISH_REASON_LENGTH, the metrics endpoint counts that request, and SIGTERM
shuts the server down with exit code 0. Any failure exits non-zero, which fails the build.
"""
import argparse
import os
import pwd
import signal
import subprocess
import sys
import threading
import urllib.request

# Hang protection only (a wedged server must not stall CI forever); no check depends on speed.
HANG_LIMIT_S = 600


def fail(msg, log=None):
    print("docker_image_check: FAIL: " + msg, flush=True)
    if log:
        print("--- server output ---\n" + "".join(log), flush=True)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--entrypoint", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--healthcheck", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--proto-python", required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.proto_python)
    import grpc
    from llm.v1 import generation_pb2 as pb
    from llm.v1 import generation_pb2_grpc as pb_grpc

    user = pwd.getpwuid(os.getuid()).pw_name
    if os.getuid() == 0:
        fail("the image runs as root; its USER must be the unprivileged 'llm' user")
    print("docker_image_check: running as %s (uid %d)" % (user, os.getuid()), flush=True)

    cmd = [args.entrypoint, "--config", args.config]
    print("docker_image_check: starting " + " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    log = []
    listening = threading.Event()
    metrics_port = []

    def drain():
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace")
            log.append(line)
            if line.startswith("METRICS_LISTENING "):
                metrics_port.append(int(line.split()[1]))
            if line.startswith("LISTENING "):
                listening.set()
        listening.set()  # EOF: the server exited; the check below reports it

    threading.Thread(target=drain, daemon=True).start()
    try:
        if not listening.wait(HANG_LIMIT_S) or proc.poll() is not None:
            fail("server exited (code %s) before LISTENING" % proc.poll(), log)

        hc = subprocess.run([args.healthcheck, args.target], capture_output=True, text=True,
                            timeout=HANG_LIMIT_S)
        if hc.returncode != 0 or hc.stdout.strip() != "SERVING":
            fail("HEALTHCHECK command exited %d, stdout %r, stderr %r"
                 % (hc.returncode, hc.stdout, hc.stderr), log)
        print("docker_image_check: HEALTHCHECK %s -> SERVING" % args.healthcheck, flush=True)

        max_tokens = 8
        stub = pb_grpc.GenerationStub(grpc.insecure_channel(args.target))
        req = pb.GenerateRequest(
            request_id="docker-image-check", text="The container says",
            sampling=pb.SamplingParams(temperature=0.0),
            stopping=pb.StoppingParams(max_tokens=max_tokens, ignore_eos=True))
        ids, complete = [], None
        for resp in stub.Generate(req, timeout=HANG_LIMIT_S):
            if resp.HasField("chunk"):
                ids.extend(resp.chunk.token_ids)
            elif resp.HasField("complete"):
                complete = resp.complete
                ids.extend(resp.complete.token_ids)
        if complete is None:
            fail("Generate stream ended without a complete message", log)
        if complete.finish_reason != pb.FINISH_REASON_LENGTH:
            fail("finish reason %s, expected FINISH_REASON_LENGTH"
                 % pb.FinishReason.Name(complete.finish_reason), log)
        if len(ids) != max_tokens or complete.usage.completion_tokens != max_tokens:
            fail("streamed %d tokens, usage says %d, expected %d"
                 % (len(ids), complete.usage.completion_tokens, max_tokens), log)
        if complete.usage.prompt_tokens <= 0:
            fail("usage.prompt_tokens is %d" % complete.usage.prompt_tokens, log)
        print("docker_image_check: Generate streamed %d tokens %s (prompt %d tokens)"
              % (len(ids), ids, complete.usage.prompt_tokens), flush=True)

        if not metrics_port:
            fail("the server started no metrics endpoint", log)
        url = "http://127.0.0.1:%d/metrics" % metrics_port[0]
        body = urllib.request.urlopen(url, timeout=HANG_LIMIT_S).read().decode()
        ended = sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
                    if line.startswith("llm_requests_total{"))
        if ended != 1:
            fail("%s counts %g ended requests in llm_requests_total, expected 1" % (url, ended),
                 log)
        print("docker_image_check: %s counts the request" % url, flush=True)

        proc.send_signal(signal.SIGTERM)
        code = proc.wait(HANG_LIMIT_S)
        if code != 0:
            fail("server exited %d on SIGTERM, expected 0" % code, log)
        print("docker_image_check: SIGTERM -> exit 0; image OK", flush=True)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
