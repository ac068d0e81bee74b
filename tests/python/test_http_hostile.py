#!/usr/bin/python3
"""Hostile and broken clients against the OpenAI HTTP front end (issue 48), on raw sockets.

One case per class of attack: crashes (invalid UTF-8 paths, deep JSON nesting, wrongly typed
fields), body limits for every body form, HTTP/1.1 framing, API key forms, slow clients and
shutdown. After each case the server must still answer a normal request, its RSS must stay within
RSS_BOUND of where it started, and the engine's metrics must be back at baseline.

Every loop is bounded in count and time; everything talks to 127.0.0.1 only.
"""

import json
import os
import socket
import time

import pytest

API_KEY = "sk-hostile-0123456789"
MAX_BODY = 65536
# RSS growth allowed over a server's first reading: far below the hundreds of MB the unbounded
# body and header reproducers took, above what ASan's quarantine adds.
RSS_BOUND = 192 << 20


def flags(*extra):
    return ["--block-size", "16", "--num-kv-blocks", "96", "--max-tokens-limit", "512",
            "--shutdown-grace-s", "1", "--max-request-body-bytes", str(MAX_BODY), *extra]


def rss(server):
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def connect(server, timeout=30):
    return socket.create_connection(("127.0.0.1", server.http_port), timeout=timeout)


def read_all(sock, limit=1 << 20, timeout=30):
    """Reads until the peer closes (or resets), `limit` bytes, or `timeout` seconds."""
    out = b""
    end = time.monotonic() + timeout
    while len(out) < limit and time.monotonic() < end:
        sock.settimeout(max(0.01, end - time.monotonic()))
        try:
            b = sock.recv(65536)
        except (socket.timeout, ConnectionResetError):
            break
        if not b:
            break
        out += b
    return out


def responses(data):
    """The (status, headers dict, body) of each HTTP/1.1 response in `data`, in order."""
    out = []
    while data.startswith(b"HTTP/1.1 "):
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            break
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for h in lines[1:]:
            k, _, v = h.partition(":")
            headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size, sep, rest = rest.partition(b"\r\n")
                if not sep:
                    return out
                n = int(size, 16)
                body, rest = body + rest[:n], rest[n + 2:]
                if n == 0:
                    break
        else:
            n = int(headers.get("content-length", "0"))
            body, rest = rest[:n], rest[n:]
        out.append((int(lines[0].split()[1]), headers, body))
        data = rest
    return out


def exchange(server, raw, timeout=30):
    """Sends raw bytes on a fresh connection, half-closes nothing, reads to close/timeout."""
    with connect(server, timeout) as s:
        try:
            s.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return responses(read_all(s, timeout=timeout))


def post(path, body, *headers, key=API_KEY):
    body = body if isinstance(body, bytes) else json.dumps(body).encode()
    hs = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json",
          f"Content-Length: {len(body)}", "Connection: close", *headers]
    if key:
        hs.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(hs) + "\r\n\r\n").encode() + body


def get(path, *headers, key=API_KEY, close=True):
    hs = [f"GET {path} HTTP/1.1", "Host: x", *headers]
    if close:
        hs.append("Connection: close")
    if key:
        hs.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(hs) + "\r\n\r\n").encode()


def error_of(resp):
    status, headers, body = resp
    assert 400 <= status < 600, resp
    assert not any(k.startswith("exception") for k in headers), headers
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    return err


def still_serves(server, rss0, key=API_KEY):
    """The server is alive, answers a normal completion, RSS bounded, metrics at baseline."""
    assert server.alive(), server.log_text(30)
    (resp,) = exchange(server, post("/v1/completions", {"prompt": "Hi", "max_tokens": 2},
                                    key=key))
    assert resp[0] == 200, resp
    assert json.loads(resp[2])["usage"]["completion_tokens"] == 2
    server.wait_idle(timeout=60)
    grown = rss(server) - rss0
    assert grown < RSS_BOUND, f"RSS grew by {grown >> 20} MiB"


@pytest.fixture(scope="module")
def open_server(module_server):
    """No API key: how most people start it, and where one request used to kill it."""
    s = module_server(flags(), name="open")
    s.rss0 = rss(s)
    return s


@pytest.fixture(scope="module")
def keyed(module_server):
    s = module_server(flags("--api-key", API_KEY), name="keyed")
    s.rss0 = rss(s)
    return s


# 1. Crashes.

@pytest.mark.parametrize("raw", [
    b"GET /%ff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /%c0%af HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"POST /v1/completions%ff HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Connection: close\r\n\r\n{}",
    b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
], ids=["ff", "c0af", "post-ff", "raw-bytes"])
def test_invalid_utf8_path_is_404_not_a_crash(open_server, raw):
    (resp,) = exchange(open_server, raw)
    assert resp[0] == 404
    err = error_of(resp)
    assert "no route" in err["message"]
    still_serves(open_server, open_server.rss0, key=None)


def nested(depth, leaf="1"):
    return "[" * depth + leaf + "]" * depth


@pytest.fixture(scope="module")
def roomy(module_server):
    s = module_server(flags("--max-request-body-bytes", str(1 << 20)), name="roomy")
    s.rss0 = rss(s)
    return s


DEEP = [
    ("/v1/completions", '{"prompt": %s}' % nested(100000)),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": %s}]}' % nested(200000)),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "x"}], "tools": %s}' % nested(200000)),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "x", "extra": %s}]}' % nested(200000)),
    ("/tokenize", '{"messages": [{"role": "user", "content": %s}]}' % nested(200000)),
    ("/detokenize", '{"tokens": %s}' % nested(200000)),
    ("/v1/completions", '{"prompt": "x", "stop": %s}' % ('{"a":' * 100000 + "1" + "}" * 100000)),
]


@pytest.mark.parametrize("case", range(len(DEEP)))
def test_deep_json_nesting_is_400(roomy, case):
    path, body = DEEP[case]
    (resp,) = exchange(roomy, post(path, body.encode(), key=None))
    assert resp[0] == 400, resp
    assert "max_json_depth" in error_of(resp)["message"]
    still_serves(roomy, roomy.rss0, key=None)


def test_brackets_inside_strings_do_not_count(roomy):
    prompt = "[" * 5000 + "{" * 5000
    (resp,) = exchange(roomy, post("/tokenize", {"prompt": prompt}, key=None))
    assert resp[0] == 200, resp


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "yes"},
    {"messages": [{"role": "user", "content": "x"}], "tools": "x"},
    {"messages": "x"},
    {"prompt": 5},
    {"prompt": "x", "add_special_tokens": "no"},
])
def test_wrongly_typed_tokenize_fields_are_400_without_internals(open_server, body):
    (resp,) = exchange(open_server, post("/tokenize", body, key=None))
    assert 400 <= resp[0] < 500, resp
    err = error_of(resp)
    assert "json.exception" not in err["message"]
    still_serves(open_server, open_server.rss0, key=None)


def test_kept_lying_lengths_and_bad_strings(open_server):
    # A Content-Length longer than the body, then the client leaves.
    with connect(open_server) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
    # Invalid UTF-8 and NUL inside JSON strings.
    for body in (b'{"prompt": "\xff\xfe"}', b'{"prompt": "a\\u0000b", "max_tokens": 1}'):
        (resp,) = exchange(open_server, post("/v1/completions", body, key=None))
        assert resp[0] in (200, 400), resp
        if resp[0] == 400:
            error_of(resp)
    still_serves(open_server, open_server.rss0, key=None)


# 3. Body limits for every body form.

def sent_then_answer(server, head, body_chunks, seconds=10):
    """Sends `head`, then body chunks while the server lets us; returns (bytes sent, responses)."""
    sent = 0
    with connect(server, timeout=seconds) as s:
        s.sendall(head)
        end = time.monotonic() + seconds
        try:
            for chunk in body_chunks:
                if time.monotonic() > end:
                    break
                s.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass
        return sent, responses(read_all(s, timeout=seconds))


CHUNKED = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
           b"Content-Type: application/json\r\n\r\n")


def test_chunked_body_is_cut_at_the_limit(open_server):
    chunk = b"100000\r\n" + b" " * 0x100000 + b"\r\n"  # 64 MiB in 1 MiB chunks
    sent, resps = sent_then_answer(open_server, CHUNKED, (chunk for _ in range(64)))
    assert len(resps) == 1 and resps[0][0] == 413, resps
    assert "max_request_body_bytes" in error_of(resps[0])["message"]
    assert sent < (32 << 20), f"the server read {sent >> 20} MiB past a 64 KiB limit"
    still_serves(open_server, open_server.rss0, key=None)


def test_chunked_body_within_the_limit_is_served(open_server):
    body = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
    raw = (CHUNKED.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
           + b"%x\r\n" % 5 + body[:5] + b"\r\n" + b"%x\r\n" % (len(body) - 5) + body[5:]
           + b"\r\n0\r\n\r\n")
    (resp,) = exchange(open_server, raw)
    assert resp[0] == 200, resp


def test_unknown_transfer_coding_is_501(open_server):
    raw = CHUNKED.replace(b"chunked", b"gzip, chunked") + b"0\r\n\r\n"
    resps = exchange(open_server, raw)
    assert [r[0] for r in resps] == [501], resps


def test_body_without_length_is_refused(open_server):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n"
    _, resps = sent_then_answer(open_server, head, (b" " * 65536 for _ in range(256)))
    assert len(resps) == 1 and resps[0][0] == 411, resps
    assert "Content-Length" in error_of(resps[0])["message"]
    still_serves(open_server, open_server.rss0, key=None)


def test_compressed_body_is_refused(open_server):
    import gzip
    bomb = gzip.compress(b'{"prompt": "' + b" " * (64 << 20) + b'"}', compresslevel=9)
    raw = post("/v1/completions", bomb, "Content-Encoding: gzip", key=None)
    (resp,) = exchange(open_server, raw)
    assert resp[0] == 415 and "Content-Encoding" in error_of(resp)["message"], resp
    still_serves(open_server, open_server.rss0, key=None)


def test_oversized_content_length_is_413_without_reading_it(open_server):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 68719476736\r\n\r\n")
    _, resps = sent_then_answer(open_server, head, (b" " * 65536 for _ in range(64)))
    assert len(resps) == 1 and resps[0][0] == 413, resps
    assert "max_request_body_bytes" in error_of(resps[0])["message"]
    still_serves(open_server, open_server.rss0, key=None)


def test_huge_header_line_is_cut_while_reading(server):
    s = server(flags(), name="header")
    with connect(s, timeout=20) as c:
        c.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        try:
            for _ in range(256):  # up to 16 MiB; a server with a header limit stops us early
                c.sendall(b"a" * 65536)
                sent += 65536
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass
    assert sent < (4 << 20), f"the server read {sent >> 20} MiB of one header line"


# 4. Framing (RFC 9112 §6.1, §6.3).

SMUGGLED = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize("framing", [
    b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
    b"Content-Length: 5\r\nContent-Length: 5\r\n",
    b"Content-Length: 5, 5\r\n",
    b"Content-Length: +5\r\n",
], ids=["te-and-cl", "two-cl", "cl-list", "cl-sign"])
def test_ambiguous_framing_is_400_and_closes(open_server, framing):
    raw = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n" + b"0\r\n\r\n"
           + SMUGGLED)
    resps = exchange(open_server, raw)
    assert [r[0] for r in resps] == [400], resps
    error_of(resps[0])
    assert resps[0][1].get("connection") == "close"
    still_serves(open_server, open_server.rss0, key=None)


def test_pipelined_requests_are_answered_in_order(server):
    s = server(flags(), name="pipeline")
    raw = (get("/health", key=None, close=False) + get("/v1/models", key=None, close=False)
           + get("/health", key=None, close=True))
    resps = exchange(s, raw, timeout=10)
    assert [r[0] for r in resps] == [200, 200, 200], resps
    assert json.loads(resps[1][2])["object"] == "list"


# 5. API keys.

@pytest.mark.parametrize("value,ok", [
    (f"Bearer {API_KEY}", True),
    (f"bearer {API_KEY}", True),
    (f"BEARER   {API_KEY}", True),
    (f"Bearer {API_KEY}x", False),
    (f"Bearer {API_KEY} x", False),
    (f"Bearer\t{API_KEY}", False),
    (f"Basic {API_KEY}", False),
    (f"{API_KEY}", False),
    ("Bearer", False),
    ("Bearer ", False),
])
def test_api_key_scheme_per_rfc_9110(keyed, value, ok):
    (resp,) = exchange(keyed, get("/v1/models", f"Authorization: {value}", key=None))
    assert resp[0] == (200 if ok else 401), (value, resp)
    if not ok:
        assert error_of(resp)["code"] == "invalid_api_key"
    still_serves(keyed, keyed.rss0)


def test_api_key_compared_on_the_raw_header_value(keyed):
    percent = API_KEY.replace("-", "%2D")
    (resp,) = exchange(keyed, get("/v1/models", f"Authorization: Bearer {percent}", key=None))
    assert resp[0] == 401, resp


def test_refused_body_is_not_read_as_a_request(keyed):
    # Wrong key: 401; the body's bytes (a request) must not be taken for a second request.
    raw = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
           + b"Content-Length: %d\r\n\r\n" % len(SMUGGLED) + SMUGGLED)
    resps = exchange(keyed, raw, timeout=3)
    assert [r[0] for r in resps] == [401], resps
    still_serves(keyed, keyed.rss0)


# 2. Slow and idle clients.

def slow_clients(server, n, head=b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: "):
    socks = []
    for _ in range(n):
        c = connect(server, timeout=5)
        c.sendall(head)
        socks.append(c)
    return socks


def trickle(socks, seconds):
    """One byte per connection every 0.5 s for `seconds`; connections the server closed drop."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and socks:
        for c in list(socks):
            try:
                c.send(b"a")
            except OSError:
                socks.remove(c)
                c.close()
        time.sleep(0.5)


def test_connection_caps_total_and_per_address(server):
    s = server(flags("--http-max-connections-per-address", "8", "--http-max-connections", "12"),
               name="caps")
    idle = [connect(s, timeout=5) for _ in range(8)]
    others = []
    try:
        with connect(s, timeout=5) as extra:  # the 9th from 127.0.0.1: closed at accept
            extra.sendall(get("/health", key=None))
            assert read_all(extra, timeout=5) == b""
        # Another loopback address is another client, up to the total cap.
        for _ in range(6):
            c = socket.socket()
            c.settimeout(5)
            c.bind(("127.0.0.2", 0))
            c.connect(("127.0.0.1", s.http_port))
            others.append(c)
        served = []
        for c in others:  # kept open to the end, so the count cannot drop meanwhile
            c.sendall(get("/health", key=None, close=False))
            served.append(bool(responses(read_all(c, timeout=1))))
        assert served == [True] * 4 + [False] * 2, served
    finally:
        for c in idle + others:
            c.close()
    # The server sees the closes asynchronously; its counts drop within moments.
    end = time.monotonic() + 10
    while not exchange(s, get("/health", key=None), timeout=5):
        assert time.monotonic() < end, "connections closed by the client still count"
        time.sleep(0.05)
    still_serves(s, rss(s), key=None)


def test_sigterm_closes_slow_connections_within_grace(server):
    s = server(flags("--shutdown-grace-s", "2"), name="sigterm")
    socks = slow_clients(s, 50)
    try:
        trickle(socks, 1.5)
        t0 = time.monotonic()
        s.proc.send_signal(15)
        # Grace (2 s) plus the front end's drain bound; not a hang.
        assert s.wait_exit(20) == 0, s.log_text(30)
        assert time.monotonic() - t0 < 10
    finally:
        for c in socks:
            c.close()


def test_slow_header_clients_do_not_starve_others(server):
    s = server(flags("--max-num-seqs", "8"), name="slow")
    rss0 = rss(s)
    socks = slow_clients(s, 1000)
    try:
        trickle(socks, 1.0)
        t0 = time.monotonic()
        with connect(s, timeout=10) as c:
            c.sendall(get("/v1/models", key=None))
            resps = responses(read_all(c, timeout=10))
        assert [r[0] for r in resps] == [200] and time.monotonic() - t0 < 5, resps
    finally:
        for c in socks:
            c.close()
    still_serves(s, rss0, key=None)


def test_request_head_has_a_deadline(server):
    s = server(flags(), name="deadline")
    socks = slow_clients(s, 4)
    try:
        trickle(socks, 12)  # a default head deadline above this would hold a worker too long
        assert not socks, f"{len(socks)} connections still trickling their head after 12 s"
    finally:
        for c in socks:
            c.close()


def test_4096_streams_beside_1000_slow_clients(server):
    """Streams cost a socket, not a thread: 4,096 open SSE streams (64 running, the rest queued
    with their response head sent) and 1,000 slow-header clients, while other requests are
    served. Then every stream leaves and the engine is back at baseline."""
    import selectors
    from conftest import PACED_LONG, PACED_MODEL
    s = server(flags("--max-num-seqs", "64", "--max-queued-requests", "8192", "--num-kv-blocks",
                     "1200", "--max-tokens-limit", str(PACED_LONG),
                     "--http-max-connections-per-address", "8192"), model=PACED_MODEL,
               name="streams")
    body = json.dumps({"prompt": [5, 6], "max_tokens": PACED_LONG, "ignore_eos": True,
                       "stream": True}).encode()
    raw = post("/v1/completions", body, key=None).replace(b"Connection: close\r\n", b"")
    streams, slow = [], []
    sel = selectors.DefaultSelector()
    try:
        for _ in range(4096):
            c = connect(s, timeout=30)
            c.sendall(raw)
            c.setblocking(False)
            streams.append(c)
            sel.register(c, selectors.EVENT_READ, [b""])
        heads, end = 0, time.monotonic() + 120
        while heads < len(streams) and time.monotonic() < end:
            for key, _ in sel.select(timeout=1):
                try:
                    data = key.fileobj.recv(65536)
                except BlockingIOError:
                    continue
                assert data, "a stream was closed before its response head"
                key.data[0] += data
                if b"\r\n\r\n" in key.data[0]:
                    assert key.data[0].startswith(b"HTTP/1.1 200"), key.data[0][:200]
                    sel.unregister(key.fileobj)
                    heads += 1
        assert heads == len(streams), f"{heads} of {len(streams)} streams started"
        slow = slow_clients(s, 1000)
        trickle(slow, 1.0)
        assert len(slow) == 1000
        t0 = time.monotonic()
        for raw_req in (get("/v1/models", key=None), get("/health", key=None),
                        post("/tokenize", {"prompt": [1]}, key=None)):
            resps = exchange(s, raw_req, timeout=10)
            assert resps and resps[0][0] in (200, 400), resps
        assert time.monotonic() - t0 < 10
        m = s.metrics()
        assert m["llm_num_requests_running"] + m["llm_num_requests_waiting"] == 4096, m
    finally:
        for c in streams + slow:
            c.close()
    s.wait_idle(timeout=120)
    assert s.alive()


def test_sigterm_with_open_streams_ends_each_with_error_and_done(server):
    """Kept from before the switch: every open stream gets an error event and [DONE], then the
    process exits 0; abandoned streams before that are cancelled."""
    from conftest import PACED_LONG, PACED_MODEL
    s = server(flags("--max-num-seqs", "64", "--num-kv-blocks", "1200", "--max-tokens-limit",
                     str(PACED_LONG), "--shutdown-grace-s", "1"), model=PACED_MODEL, name="term")
    body = json.dumps({"prompt": [5, 6], "max_tokens": PACED_LONG, "ignore_eos": True,
                       "stream": True}).encode()
    raw = post("/v1/completions", body, key=None).replace(b"Connection: close\r\n", b"")
    abandoned = []
    for _ in range(100):
        c = connect(s)
        c.sendall(raw)
        abandoned.append(c)
    for c in abandoned:
        assert c.recv(12) == b"HTTP/1.1 200"
        c.close()
    s.wait_idle(timeout=120)
    streams = []
    for _ in range(50):
        c = connect(s, timeout=60)
        c.sendall(raw)
        streams.append(c)
    s.wait_metrics(lambda m: m["llm_num_requests_running"] == 50, "50 streams run")
    s.proc.send_signal(15)
    for c in streams:
        data = read_all(c, timeout=60)
        assert data.startswith(b"HTTP/1.1 200"), data[:100]
        (resp,) = responses(data)
        events = resp[2].decode().split("\n\n")[:-1]
        assert events[-1] == "data: [DONE]", events[-3:]
        assert '"error"' in events[-2], events[-3:]
        c.close()
    assert s.wait_exit(30) == 0


def test_keep_alive_streams_under_load_all_finish(open_server):
    """48 keep-alive connections, 12 streamed completions each, all at once: every response ends
    with [DONE] (a lost wake-up once left about one in a hundred unfinished)."""
    import threading
    body = json.dumps({"prompt": "Hi", "max_tokens": 16, "ignore_eos": True,
                       "stream": True}).encode()
    raw = post("/v1/completions", body, key=None).replace(b"Connection: close\r\n", b"")
    failures = []

    def worker():
        try:
            with connect(open_server, timeout=30) as c:
                for _ in range(12):
                    c.sendall(raw)
                    data = b""
                    while not data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
                        chunk = c.recv(65536)
                        assert chunk, "closed mid-response"
                        data += chunk
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(repr(e))

    threads = [threading.Thread(target=worker) for _ in range(48)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures[:3]
    still_serves(open_server, open_server.rss0, key=None)
