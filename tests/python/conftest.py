"""Shared fixtures for the Python tests. Run with Debian's interpreter (it has pytest, grpcio,
protobuf, numpy and torch):

    /usr/bin/python3 -m pytest -q tests/python/test_serving_policies.py \
        --server-bin build/cpu/server/llm-server --model build/cpu/models/tiny-llama \
        --proto-python build/cpu/python [-k admission]

ctest runs one entry per file with these options (tests/CMakeLists.txt). Every path option also
reads an environment variable, so `pytest tests/python` works once they are exported:

    --server-bin    LLM_SERVER_BIN     llm-server
    --model         LLM_MODEL          the tiny model directory (build/cpu/models/tiny-llama)
    --proto-python  LLM_PROTO_PYTHON   generated llm/v1 Python protos (build/cpu/python)
    --dump-bin      LLM_DUMP_BIN       llm-dump
    --fmha-ref-bin  LLM_FMHA_REF_BIN   llm-fmha-ref
    --tokenizer     LLM_TOKENIZER      a tokenizer.json (the tiny model's)
    --workdir       LLM_TEST_WORKDIR   scratch directory kept after the run (default: tmp_path)

A test that needs a path that was not given is skipped with the option's name.

Fixtures
  server        factory: server(extra_flags=[...], model=None, name="server", tls=None) starts
                llm-server on free loopback ports (--listen-address / --metrics-address /
                --http-address 127.0.0.1:0, read back from its LISTENING / METRICS_LISTENING /
                HTTP_LISTENING lines) and returns a ServerHandle; every server it started is
                killed at the test's teardown. model defaults to --model; pass PACED_MODEL (or
                paced_model(...)) for a request that must still be running. tls=TlsFiles serves
                both front ends over TLS with its certificate (--tls-cert-file/--tls-key-file).
  module_server the same factory, but its servers live for the whole module (share one server
                between the cases of a file).
  grpc, pb, pb_grpc   the grpc module and the generated llm.v1 protos.
  option        option("server_bin") -> the path, or skips the test when it was not given.
  workdir       a scratch directory per test (under --workdir when given).
  seed          --seed (or $LLM_TEST_SEED), else a fresh random seed; printed, so a failing
                randomized test can be rerun with it.
  tls_files     a throw-away CA and a certificate for 127.0.0.1 signed by it (TlsFiles: ca,
                cert, key paths), for server(tls=...).

ServerHandle: grpc_port, metrics_port, http_port, http_base (http:// or https://127.0.0.1:port),
target, proc, log_path; channel() (TLS-verified against the CA when started with tls),
insecure_channel(), stub() (a GenerationStub), metrics() (the /metrics gauges and counters as
{name: float}; the metrics endpoint is plain HTTP even with tls), wait_idle()
(polls until nothing runs, waits or holds KV blocks), wait_for_log(substring), log_text(),
terminate() (SIGTERM, returns the exit code), wait_exit(), alive().

When a test fails, the log of every server alive during it is attached to the report.

Speed: no test may depend on how fast the machine is. A request that must still be running when
the test acts on it runs on the synthetic model with a pace (PACED_MODEL: every step sleeps, so a
long request lasts minutes); waits poll for an event with a generous limit that only guards
against a hang (HANG_S).
"""

import collections
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

# Limit for anything that should happen "soon": only a hang reaches it, never a slow machine (a
# 2-core machine eight times oversubscribed stays far below it).
HANG_S = 600.0
# Every forward sleeps 50 ms: a request of PACED_LONG tokens runs for at least 400 s, far longer
# than any test keeps it, so "still running" holds on every machine. No tokenizer: token-id
# prompts.
PACED_LONG = 8000


def paced_model(step_delay_ms=50, vocab=1000, max_len=100000):
    return f"synthetic:vocab={vocab},max_len={max_len},step_delay_ms={step_delay_ms}"


PACED_MODEL = paced_model()

TlsFiles = collections.namedtuple("TlsFiles", "ca cert key")


def make_tls_files(d):
    """A throw-away CA and a server certificate for 127.0.0.1 signed by it, in directory d."""
    def ossl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
         "-days", "1", "-subj", "/CN=llm-server test CA")
    ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
         "-subj", "/CN=127.0.0.1")
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ossl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
         "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "ext.cnf")
    return TlsFiles(*(os.path.join(d, n) for n in ("ca.pem", "server.pem", "server.key")))

_PATH_OPTIONS = {
    # option name: (environment variable, help)
    "server_bin": ("LLM_SERVER_BIN", "llm-server binary"),
    "model": ("LLM_MODEL", "tiny model directory"),
    "proto_python": ("LLM_PROTO_PYTHON", "directory of the generated llm/v1 Python protos"),
    "dump_bin": ("LLM_DUMP_BIN", "llm-dump binary"),
    "fmha_ref_bin": ("LLM_FMHA_REF_BIN", "llm-fmha-ref binary"),
    "tokenizer": ("LLM_TOKENIZER", "a tokenizer.json"),
    "workdir": ("LLM_TEST_WORKDIR", "scratch directory kept after the run"),
}

_ACTIVE = []  # ServerHandles alive now (their logs go into a failing test's report)


def pytest_addoption(parser):
    g = parser.getgroup("llm", "llm-server test paths")
    for name, (env, help_text) in _PATH_OPTIONS.items():
        g.addoption("--" + name.replace("_", "-"), dest=name, default=os.environ.get(env),
                    help=f"{help_text} (env {env})")
    g.addoption("--seed", dest="seed", type=int, default=os.environ.get("LLM_TEST_SEED"),
                help="seed of the randomized tests (env LLM_TEST_SEED; default: a fresh one, "
                "printed so a failure can be rerun)")


def _option(config, name):
    value = config.getoption(name)
    if not value:
        pytest.skip(f"needs --{name.replace('_', '-')} (or ${_PATH_OPTIONS[name][0]})")
    return os.path.abspath(value)


@pytest.fixture(scope="session")
def option(request):
    return lambda name: _option(request.config, name)


@pytest.fixture
def seed(request):
    value = request.config.getoption("seed")
    value = random.SystemRandom().randrange(1 << 31) if value is None else int(value)
    print(f"seed {value} (rerun with --seed {value})")
    return value


@pytest.fixture
def workdir(request, tmp_path):
    base = request.config.getoption("workdir")
    if not base:
        return tmp_path
    path = os.path.join(os.path.abspath(base), re.sub(r"[^\w.-]", "_", request.node.name))
    os.makedirs(path, exist_ok=True)
    return path


@pytest.fixture
def tls_files(tmp_path):
    return make_tls_files(str(tmp_path))


@pytest.fixture(scope="session")
def _protos(request):
    sys.path.insert(0, _option(request.config, "proto_python"))
    import grpc as grpc_mod
    from llm.v1 import generation_pb2, generation_pb2_grpc
    return grpc_mod, generation_pb2, generation_pb2_grpc


@pytest.fixture(scope="session")
def grpc(_protos):
    return _protos[0]


@pytest.fixture(scope="session")
def pb(_protos):
    return _protos[1]


@pytest.fixture(scope="session")
def pb_grpc(_protos):
    return _protos[2]


class ServerHandle:
    """One llm-server process; its merged stdout/stderr goes to log_path and to memory."""

    def __init__(self, cmd, log_path, name, protos, tls=None):
        self.cmd, self.log_path, self.name, self.tls = cmd, log_path, name, tls
        self._grpc, self._pb, self._pb_grpc = protos
        self._lines = []
        self._cond = threading.Condition()
        self._eof = False
        self._channels = []
        self.grpc_port = self.metrics_port = self.http_port = None
        self._log = open(log_path, "w", encoding="utf-8")
        self._log.write("$ " + " ".join(cmd) + "\n")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, errors="replace")
        threading.Thread(target=self._read, daemon=True).start()
        line = self.wait_for_log("LISTENING ", start_of_line=True)
        if line is None or self.grpc_port is None:
            self.kill()
            raise RuntimeError(f"{name} did not print 'LISTENING <port>' (exit code "
                               f"{self.proc.poll()}):\n{self.log_text(40)}")
        self.target = f"127.0.0.1:{self.grpc_port}"
        scheme = "https" if tls else "http"
        self.http_base = f"{scheme}://127.0.0.1:{self.http_port}" if self.http_port else None

    def _read(self):
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            with self._cond:
                if line.startswith("METRICS_LISTENING "):
                    self.metrics_port = int(line.split()[1])
                elif line.startswith("HTTP_LISTENING "):
                    self.http_port = int(line.split()[1])
                elif line.startswith("LISTENING "):
                    self.grpc_port = int(line.split()[1])
                self._lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        self._log.close()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def wait_for_log(self, text, timeout=HANG_S, start_of_line=False):
        """The first log line containing text (or starting with it), or None at exit/timeout."""
        end = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self._lines[seen:]:
                    if (line.startswith(text) if start_of_line else text in line):
                        return line
                seen = len(self._lines)
                left = end - time.monotonic()
                if self._eof or left <= 0:
                    return None
                self._cond.wait(left)

    def log_text(self, tail=None):
        with self._cond:
            lines = self._lines if tail is None else self._lines[-tail:]
            return "\n".join(lines)

    def alive(self):
        return self.proc.poll() is None

    def channel(self):
        """A ready channel: TLS (verified against the test CA) when the server was started with
        tls, else plain."""
        if self.tls:
            with open(self.tls.ca, "rb") as f:
                creds = self._grpc.ssl_channel_credentials(root_certificates=f.read())
            ch = self._grpc.secure_channel(self.target, creds)
        else:
            ch = self._grpc.insecure_channel(self.target)
        self._grpc.channel_ready_future(ch).result(timeout=HANG_S)
        self._channels.append(ch)
        return ch

    def insecure_channel(self):
        """A plain channel, not waited for (against a TLS server it never becomes ready)."""
        ch = self._grpc.insecure_channel(self.target)
        self._channels.append(ch)
        return ch

    def stub(self):
        return self._pb_grpc.GenerationStub(self.channel())

    def metrics(self):
        assert self.metrics_port, f"{self.name} was started without a metrics port"
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=HANG_S) as r:
            out = {}
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    k, v = line.rsplit(" ", 1)
                    out[k] = float(v)
            return out

    def wait_metrics(self, pred, what, timeout=HANG_S):
        """Polls /metrics until pred(metrics) holds; fails the test after timeout (a hang)."""
        end = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if pred(m):
                return m
            assert time.monotonic() < end, f"{what}: not reached in {timeout:.0f} s: {m}"
            time.sleep(0.05)

    def wait_idle(self, timeout=HANG_S):
        """Nothing running, nothing waiting, no KV block in use (the engine's baseline)."""
        return self.wait_metrics(
            lambda m: (m["llm_num_requests_running"] == 0 and m["llm_num_requests_waiting"] == 0
                       and m["llm_kv_cache_usage_perc"] == 0),
            "resources back at baseline", timeout)

    def terminate(self, timeout=HANG_S):
        """SIGTERM and wait; returns the exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def wait_exit(self, timeout=HANG_S):
        """Waits for the process to exit (after a signal the test sent); returns the exit code."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.name} still running {timeout:.0f} s after SIGTERM")

    def kill(self):
        for ch in self._channels:
            ch.close()
        self._channels = []
        if self.alive():
            self.proc.kill()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass


class _Factory:
    def __init__(self, config, base_dir, protos):
        self.config, self.base_dir, self.protos = config, base_dir, protos
        self.handles = []

    def __call__(self, extra_flags=(), model=None, name="server", tls=None):
        model = model or _option(self.config, "model")
        cmd = [_option(self.config, "server_bin"), "--model", model,
               "--listen-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
               "--http-address", "127.0.0.1:0", *map(str, extra_flags)]
        if tls:
            cmd += ["--tls-cert-file", tls.cert, "--tls-key-file", tls.key]
        log_path = os.path.join(self.base_dir, f"{name}-{len(self.handles)}.log")
        h = ServerHandle(cmd, log_path, name, self.protos, tls)
        self.handles.append(h)
        _ACTIVE.append(h)
        return h

    def close(self):
        for h in self.handles:
            h.kill()
            if h in _ACTIVE:
                _ACTIVE.remove(h)


@pytest.fixture
def server(request, tmp_path, _protos):
    f = _Factory(request.config, str(tmp_path), _protos)
    yield f
    f.close()


@pytest.fixture(scope="module")
def module_server(request, tmp_path_factory, _protos):
    f = _Factory(request.config, str(tmp_path_factory.mktemp("servers")), _protos)
    yield f
    f.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for h in list(_ACTIVE):
            report.sections.append((f"{h.name} log ({h.log_path}, exit code {h.proc.poll()})",
                                    h.log_text(tail=80)))
