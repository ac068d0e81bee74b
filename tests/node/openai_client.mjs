// Drives llm-server's OpenAI HTTP API with the official `openai` npm client. Prints one line per
// check and exits non-zero on the first failure. Run by tests/python/test_openai_http.py:
//   BASE_URL=http://127.0.0.1:PORT/v1 API_KEY=... METRICS_URL=http://127.0.0.1:M/metrics \
//   MODEL=tiny-llama node openai_client.mjs
import OpenAI from "openai";

import { check, expect, expectError } from "./check.mjs";

const { BASE_URL, API_KEY, METRICS_URL, MODEL } = process.env;
const MAX_TOKENS_LIMIT = Number(process.env.MAX_TOKENS_LIMIT || "512");
const client = new OpenAI({ baseURL: BASE_URL, apiKey: API_KEY, maxRetries: 0 });

async function metric(name, missing) {
  const text = await (await fetch(METRICS_URL)).text();
  const line = text.split("\n").find((l) => l.startsWith(name + " "));
  if (line === undefined && missing !== undefined) return missing;
  expect(line !== undefined, `metric ${name} present`);
  return Number(line.split(" ")[1]);
}
const CANCELLED = 'llm_requests_total{outcome="cancelled"}';

const greedy = { model: MODEL, temperature: 0, ignore_eos: true };

await check("models.list names the served model", async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  expect(ids.includes(MODEL), `models ${ids} include ${MODEL}`);
});

let reference;
await check("completion, non-streaming: length finish and usage", async () => {
  const r = await client.completions.create({ ...greedy, prompt: "The quick brown fox", max_tokens: 12 });
  expect(r.object === "text_completion", "object text_completion");
  expect(r.choices.length === 1 && r.choices[0].finish_reason === "length", "finish_reason length");
  expect(r.usage.completion_tokens === 12, `12 completion tokens, got ${r.usage.completion_tokens}`);
  expect(r.usage.total_tokens === r.usage.prompt_tokens + 12, "total = prompt + completion");
  expect(r.usage.prompt_tokens_details.cached_tokens >= 0, "cached_tokens reported");
  reference = r.choices[0].text;
  expect(reference.length > 0, "some text");
});

await check("completion, streaming with include_usage: same text as non-streaming", async () => {
  const stream = await client.completions.create({
    ...greedy, prompt: "The quick brown fox", max_tokens: 12, stream: true,
    stream_options: { include_usage: true },
  });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      text += ch.text;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  expect(chunks >= 2, `several chunks, got ${chunks}`);
  expect(text === reference, `streamed ${JSON.stringify(text)} == ${JSON.stringify(reference)}`);
  expect(finish === "length", "finish_reason length");
  expect(usage && usage.completion_tokens === 12, "usage chunk with 12 completion tokens");
});

await check("completion logprobs: one entry per token, at most N alternatives", async () => {
  const r = await client.completions.create({ ...greedy, prompt: "Hello", max_tokens: 6, logprobs: 3 });
  const lp = r.choices[0].logprobs;
  expect(lp.tokens.length === 6 && lp.token_logprobs.length === 6, "6 tokens with logprobs");
  for (let i = 0; i < 6; i++) {
    expect(lp.token_logprobs[i] <= 0, "logprob <= 0");
    const alts = Object.values(lp.top_logprobs[i]);
    expect(alts.length >= 1 && alts.length <= 3, `1..3 alternatives, got ${alts.length}`);
    // Greedy: the sampled token is the most likely one.
    expect(Math.max(...alts) <= lp.token_logprobs[i] + 1e-4, "greedy token is the top one");
  }
});

await check("stop string: output ends before it, finish_reason stop", async () => {
  const full = (await client.completions.create({ ...greedy, prompt: "Once upon", max_tokens: 24 }))
    .choices[0].text;
  const chars = [...full];
  const start = Math.min(4, chars.length - 3);
  const stop = chars.slice(start, start + 2).join("");
  const r = await client.completions.create({ ...greedy, prompt: "Once upon", max_tokens: 24, stop: [stop] });
  expect(r.choices[0].finish_reason === "stop", `finish_reason stop, got ${r.choices[0].finish_reason}`);
  expect(r.choices[0].text === full.slice(0, full.indexOf(stop)),
         `${JSON.stringify(r.choices[0].text)} is the text before ${JSON.stringify(stop)}`);
});

await check("chat, non-streaming and streaming: same reply, logprobs, usage", async () => {
  const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi there" }];
  const r = await client.chat.completions.create({
    ...greedy, messages, max_completion_tokens: 8, logprobs: true, top_logprobs: 2,
  });
  expect(r.object === "chat.completion", "object chat.completion");
  const c = r.choices[0];
  expect(c.message.role === "assistant" && c.finish_reason === "length", "assistant, length");
  expect(c.logprobs.content.length === 8, `8 logprob entries, got ${c.logprobs.content.length}`);
  expect(c.logprobs.content.every((t) => t.top_logprobs.length === 2), "2 alternatives each");
  expect(r.usage.completion_tokens === 8, "usage");
  const stream = await client.chat.completions.create({
    ...greedy, messages, max_completion_tokens: 8, stream: true,
    stream_options: { include_usage: true },
  });
  let text = "", role = null, usage = null;
  for await (const ch of stream) {
    if (ch.usage) usage = ch.usage;
    for (const choice of ch.choices) {
      if (choice.delta.role) role = choice.delta.role;
      text += choice.delta.content || "";
    }
  }
  expect(role === "assistant", "the first chunk names the role");
  expect(text === c.message.content, `streamed ${JSON.stringify(text)} == ${JSON.stringify(c.message.content)}`);
  expect(usage && usage.prompt_tokens === r.usage.prompt_tokens, "same prompt tokens");
});

await check("bad request: 400 naming the field", async () => {
  let e = await expectError(client.completions.create({ model: MODEL, prompt: "x", temperature: -1 }),
                            400, "temperature -1");
  expect(/temperature/.test(e.message), `message names temperature: ${e.message}`);
  e = await expectError(client.completions.create({ model: MODEL, prompt: "x", n: 2, best_of: 3 }),
                        400, "best_of 3 with n 2");
  expect(e.param === "best_of", `param best_of, got ${e.param}`);
  e = await expectError(client.completions.create({ model: MODEL, prompt: "x", frobnicate: 1 }),
                        400, "unknown field");
  expect(e.param === "frobnicate", `param frobnicate, got ${e.param}`);
  await expectError(client.completions.create({ model: "no-such-model", prompt: "x" }), 404, "model");
});

await check("response_format json_schema (strict): output parses, matches, ends with stop", async () => {
  // From random weights only the grammar's mask can give this.
  const schema = {
    type: "object",
    properties: { city: { type: "string", maxLength: 12 }, rank: { type: "integer", minimum: 1, maximum: 9 } },
    required: ["city", "rank"],
    additionalProperties: false,
  };
  const response_format = { type: "json_schema", json_schema: { name: "place", schema, strict: true } };
  const messages = [{ role: "user", content: "Name a city as JSON." }];
  const check1 = (text, finish) => {
    expect(finish === "stop", `finish_reason stop, got ${finish} for ${JSON.stringify(text)}`);
    const v = JSON.parse(text);
    expect(Object.keys(v).sort().join(",") === "city,rank", `keys of ${text}`);
    expect(typeof v.city === "string" && [...v.city].length <= 12, `city of ${text}`);
    expect(Number.isInteger(v.rank) && v.rank >= 1 && v.rank <= 9, `rank of ${text}`);
  };
  for (const seed of [1, 2]) {
    const r = await client.chat.completions.create({
      model: MODEL, messages, response_format, seed, max_completion_tokens: 300,
    });
    check1(r.choices[0].message.content, r.choices[0].finish_reason);
  }
  const stream = await client.chat.completions.create({
    model: MODEL, messages, response_format, seed: 3, max_completion_tokens: 300, stream: true,
  });
  let text = "", finish = null;
  for await (const ch of stream) {
    for (const choice of ch.choices) {
      text += choice.delta.content || "";
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  check1(text, finish);
  const e = await expectError(client.chat.completions.create({
    model: MODEL, messages,
    response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object", patternProperties: {} } } },
  }), 400, "unsupported schema keyword");
  expect(/patternProperties/.test(e.message), `message names the keyword: ${e.message}`);
});

await check("models.retrieve: the served model; another id is 404", async () => {
  const m = await client.models.retrieve(MODEL);
  expect(m.id === MODEL && m.object === "model", `retrieved ${JSON.stringify(m)}`);
  const e = await expectError(client.models.retrieve("no-such-model"), 404, "unknown model");
  expect(e.code === "model_not_found", `code model_not_found, got ${e.code}`);
});

await check("tool-call follow-up: the assistant message as returned (content null) and a tool result", async () => {
  const tools = [{ type: "function", function: { name: "get_weather", description: "Weather of a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
  const messages = [
    { role: "user", content: [{ type: "text", text: "Weather in Paris?" }] },
    { role: "assistant", content: null, tool_calls: [{ id: "call_0", type: "function",
      function: { name: "get_weather", arguments: '{"city": "Paris"}' } }] },
    { role: "tool", tool_call_id: "call_0", content: "sunny, 21 C" },
  ];
  const r = await client.chat.completions.create({ ...greedy, messages, tools, max_tokens: 4 });
  expect(r.choices[0].message.role === "assistant", "an assistant reply");
  expect(r.usage.completion_tokens === 4, `4 completion tokens, got ${r.usage.completion_tokens}`);
  const e = await expectError(client.chat.completions.create({ ...greedy, max_tokens: 1, messages: [
    { role: "user", content: [{ type: "image_url", image_url: { url: "http://example.com/a.png" } }] }] }),
    400, "image part");
  expect(/'image_url'/.test(e.message) && e.param === "messages", `names image_url: ${e.message}`);
});

await check("n = 2: indexed choices, streamed chunks carry index, usage counts both", async () => {
  const r = await client.completions.create({ model: MODEL, prompt: "Once", max_tokens: 6, n: 2,
                                               seed: 5, temperature: 1, ignore_eos: true });
  expect(r.choices.length === 2 && r.choices[0].index === 0 && r.choices[1].index === 1, "two choices");
  expect(r.usage.completion_tokens === 12, `12 completion tokens, got ${r.usage.completion_tokens}`);
  const stream = await client.chat.completions.create({
    ...greedy, messages: [{ role: "user", content: "hi" }], max_tokens: 5, n: 2, stream: true,
    stream_options: { include_usage: true } });
  const text = ["", ""], finish = [null, null];
  let usage = null;
  for await (const ch of stream) {
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      expect(c.index === 0 || c.index === 1, `index ${c.index}`);
      text[c.index] += c.delta.content || "";
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  expect(finish[0] === "length" && finish[1] === "length", `both finish: ${finish}`);
  expect(text[0] === text[1] && text[0].length > 0, "greedy choices are identical");
  expect(usage && usage.completion_tokens === 10, `usage counts both choices: ${JSON.stringify(usage)}`);
});

await check("logit_bias +100 forces one token", async () => {
  const root = BASE_URL.replace(/\/v1\/?$/, "");
  const tok = await (await fetch(root + "/tokenize", { method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${API_KEY}` },
    body: JSON.stringify({ prompt: "a", add_special_tokens: false }) })).json();
  const id = tok.tokens[tok.tokens.length - 1];
  const r = await client.completions.create({ model: MODEL, prompt: "Hello", max_tokens: 4, seed: 1,
                                               temperature: 1, ignore_eos: true, logit_bias: { [id]: 100 } });
  expect(r.choices[0].text === "aaaa", `four 'a' tokens, got ${JSON.stringify(r.choices[0].text)}`);
});

await check("bad key: 401", async () => {
  const bad = new OpenAI({ baseURL: BASE_URL, apiKey: "wrong-" + API_KEY, maxRetries: 0 });
  await expectError(bad.completions.create({ model: MODEL, prompt: "x", max_tokens: 1 }), 401, "bad key");
  await expectError(bad.models.list(), 401, "bad key on /v1/models");
});

for (const n of [1, 2]) await check(`disconnect mid-stream frees the request's KV blocks (n = ${n})`, async () => {
  const baseline = await metric("llm_kv_cache_usage_perc");
  const cancelledBefore = await metric(CANCELLED, 0);
  const controller = new AbortController();
  const stream = await client.completions.create(
    { ...greedy, prompt: "A long story:", max_tokens: MAX_TOKENS_LIMIT, stream: true, n },
    { signal: controller.signal });
  let chunks = 0;
  try {
    for await (const c of stream) {
      // Choice 1 starts after choice 0's prefill step; the gauge is refreshed at the end of a
      // step, after its chunks went out, so wait for it to show every choice running.
      if (++chunks === 3) {
        let running = 0;
        for (let i = 0; i < 500 && running !== n; ++i) {
          running = await metric("llm_num_requests_running");
          if (running !== n) await new Promise((r) => setTimeout(r, 20));
        }
        expect(running === n, `its ${n} choices are running (gauge: ${running})`);
        controller.abort();
      }
    }
  } catch (e) {
    expect(e.name === "AbortError" || e instanceof OpenAI.APIUserAbortError, `aborted: ${e}`);
  }
  // The server notices at its next output; poll until the engine has let the request go.
  for (;;) {
    const running = await metric("llm_num_requests_running");
    const usage = await metric("llm_kv_cache_usage_perc");
    if (running === 0 && usage <= baseline) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  expect((await metric(CANCELLED, 0)) === cancelledBefore + 1,
         "the request ended as cancelled (the client went away), not by length");
});

console.log("ALL OK");
