"""OpenAI HTTP streaming backends of tools/loadgen.py (--backend openai-completions|openai-chat).

The same RequestSpec (a GenerateRequest) is sent as the JSON body vLLM's `vllm bench serve`
sends: token-id prompts as `prompt` lists (completions) or detokenized text (chat),
`stream: true` with `stream_options.include_usage`, the sampling fields by their OpenAI names.
Each SSE chunk with a choice counts as one token-bearing message; the final usage chunk fixes the
count, so streamed tokens match usage as on gRPC.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

# HTTP status -> the gRPC status name loadgen's report uses.
_STATUS = {200: "OK", 400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 404: "NOT_FOUND",
           413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE",
           504: "DEADLINE_EXCEEDED"}


def status_name(http_status: int) -> str:
    return _STATUS.get(http_status, f"HTTP_{http_status}")


def request_body(req, backend: str, model: str, chat_text: str | None) -> dict:
    """The OpenAI body for one llm.v1.GenerateRequest."""
    body = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if backend == "openai-chat":
        text = chat_text if chat_text is not None else req.text
        body["messages"] = [{"role": "user", "content": text}]
        body["max_completion_tokens"] = req.stopping.max_tokens
    else:
        body["prompt"] = (list(req.token_ids.ids) if req.WhichOneof("prompt") == "token_ids"
                          else req.text)
        body["max_tokens"] = req.stopping.max_tokens
    s, t = req.sampling, req.stopping
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty",
                 "presence_penalty", "frequency_penalty"):
        if s.HasField(name):
            body[name] = getattr(s, name)
    if t.HasField("ignore_eos"):
        body["ignore_eos"] = t.ignore_eos
    if t.HasField("min_tokens"):
        body["min_tokens"] = t.min_tokens
    if len(t.stop):
        body["stop"] = list(t.stop)
    if req.WhichOneof("constraint") == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "loadgen", "schema": json.loads(req.json_schema), "strict": True}}
    return body


async def run_one(session: aiohttp.ClientSession, url: str, body: dict, spec, rec,
                  timeout: float | None) -> None:
    """Streams one request; fills rec like the gRPC run_one (status names included)."""
    rec.start = time.perf_counter()
    chunks_seen = 0
    try:
        tmo = aiohttp.ClientTimeout(total=timeout)
        async with session.post(url, json=body, timeout=tmo) as resp:
            if resp.status != 200:
                rec.status = status_name(resp.status)
                try:
                    rec.detail = (await resp.json())["error"]["message"]
                except (aiohttp.ContentTypeError, KeyError, ValueError):
                    rec.detail = (await resp.text())[:200]
                return
            rec.status = "CANCELLED"  # until [DONE]
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[len(b"data: "):]
                if data == b"[DONE]":
                    rec.status = "OK"
                    break
                msg = json.loads(data)
                if "error" in msg:
                    rec.status, rec.detail = "STREAM_ERROR", msg["error"].get("message", "")
                    break
                now = time.perf_counter()
                if msg.get("usage"):
                    u = msg["usage"]
                    rec.prompt_tokens = u["prompt_tokens"]
                    rec.output_tokens = u["completion_tokens"]
                    rec.cached_tokens = (u.get("prompt_tokens_details") or {}).get(
                        "cached_tokens", 0)
                    # The last message may have carried the final tokens with its finish reason.
                    if rec.chunk_tokens:
                        rec.chunk_tokens[-1] += rec.output_tokens - sum(rec.chunk_tokens)
                for ch in msg.get("choices", []):
                    if ch.get("finish_reason"):
                        rec.finish_reason = "FINISH_REASON_" + ch["finish_reason"].upper()
                    delta = ch.get("delta", {})
                    if "role" in delta and not delta.get("content"):
                        continue  # the chat role announcement carries no token
                    if rec.first_token is None:
                        rec.first_token = now
                    rec.chunk_times.append(now)
                    rec.chunk_tokens.append(1)
                    chunks_seen += 1
                if spec.kind == "abort" and not rec.aborted and chunks_seen >= spec.abort_after:
                    rec.aborted = True
                    resp.close()  # the server sees the connection go and aborts the request
                    rec.status = "CANCELLED"
                    return
    except asyncio.TimeoutError:
        rec.status = "DEADLINE_EXCEEDED"
    except aiohttp.ClientError as e:
        rec.status, rec.detail = "UNAVAILABLE", str(e)
    finally:
        rec.end = time.perf_counter()


def make_session(concurrency: int, api_key: str | None) -> aiohttp.ClientSession:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return aiohttp.ClientSession(headers=headers,
                                 connector=aiohttp.TCPConnector(limit=max(1, concurrency)))
