// Tool calls and reasoning through the official `openai` npm client. Run by
// tests/python/test_openai_tool_calls.py against two servers of the tiny random-weight model:
//   TOOLS_URL=http://127.0.0.1:P/v1 (Qwen2.5's real chat template, Hermes tool calls)
//   THINK_URL=http://127.0.0.1:Q/v1 (Qwen3's, <think> reasoning and Hermes tool calls)
//   MODEL=tiny-llama node tool_calls.mjs
// The weights are random, so calls come from tool_choice "required" / named (constrained into
// the template's call syntax) or from a regex constraint that writes the markup. Prints one line
// per check and exits non-zero on the first failure.
import OpenAI from "openai";

import { check, expect, expectParamError } from "./check.mjs";
import {
  checkWeatherArgs,
  WEATHER_DESCRIPTION,
  WEATHER_NAME,
  WEATHER_PARAMETERS,
} from "./weather_tool.mjs";

const { TOOLS_URL, THINK_URL, MODEL } = process.env;
const tools = new OpenAI({ baseURL: TOOLS_URL, apiKey: "none", maxRetries: 0 });
const think = new OpenAI({ baseURL: THINK_URL, apiKey: "none", maxRetries: 0 });

// Bounded schemas, so that a random model's constrained call ends.
const TOOLS = [
  {
    type: "function",
    function: {
      name: WEATHER_NAME,
      description: WEATHER_DESCRIPTION,
      parameters: WEATHER_PARAMETERS,
    },
  },
  {
    type: "function",
    function: {
      name: "get_time",
      parameters: {
        type: "object",
        properties: { tz: { type: "string", pattern: "^[A-Z]{1,4}$" } },
        required: ["tz"],
        additionalProperties: false,
      },
    },
  },
];
const user = [{ role: "user", content: "What is the weather in Paris?" }];
const base = { model: MODEL, tools: TOOLS, max_tokens: 200, temperature: 1.0 };

function checkCall(call, names) {
  expect(typeof call.id === "string" && call.id.length > 0, "a call id");
  expect(call.type === "function", "type function");
  expect(names.includes(call.function.name), `name ${call.function.name} in ${names}`);
  if (call.function.name === WEATHER_NAME) return checkWeatherArgs(call.function.arguments);
  const args = JSON.parse(call.function.arguments);  // throws when not JSON
  expect(/^[A-Z]{1,4}$/.test(args.tz), `arguments follow the schema: ${call.function.arguments}`);
  return args;
}

// Rebuilds a streamed message; checks OpenAI's delta shapes on the way.
async function collect(stream) {
  const calls = [];
  let content = "", reasoning = "", finish = null;
  for await (const chunk of stream) {
    for (const ch of chunk.choices) {
      const d = ch.delta;
      if (d.content) content += d.content;
      if (d.reasoning_content) reasoning += d.reasoning_content;
      for (const tc of d.tool_calls || []) {
        if (calls[tc.index] === undefined) {
          expect(tc.id && tc.type === "function" && tc.function.name,
                 "a call's first delta carries id, type and name");
          expect(tc.index === calls.length, "calls are numbered in order");
          calls[tc.index] = { id: tc.id, type: "function",
                              function: { name: tc.function.name, arguments: "" } };
        } else {
          expect(!tc.id && !(tc.function && tc.function.name), "later deltas carry no id / name");
        }
        calls[tc.index].function.arguments += (tc.function && tc.function.arguments) || "";
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { content, reasoning, calls, finish };
}

let firstCall;
await check("tool_choice required: a valid call, finish_reason tool_calls", async () => {
  const r = await tools.chat.completions.create({
    ...base, messages: user, tool_choice: "required", parallel_tool_calls: false, seed: 7,
  });
  const m = r.choices[0].message;
  expect(m.tool_calls && m.tool_calls.length === 1, `one call: ${JSON.stringify(m)}`);
  checkCall(m.tool_calls[0], ["get_weather", "get_time"]);
  expect(m.content === null, `content null beside the call, got ${JSON.stringify(m.content)}`);
  expect(r.choices[0].finish_reason === "tool_calls", `finish ${r.choices[0].finish_reason}`);
  firstCall = r;
});

await check("tool_choice required, streamed: same call as whole, no markup in content", async () => {
  const s = await tools.chat.completions.create({
    ...base, messages: user, tool_choice: "required", parallel_tool_calls: false, seed: 7,
    stream: true,
  });
  const got = await collect(s);
  const want = firstCall.choices[0].message.tool_calls[0];
  expect(got.calls.length === 1, `one streamed call, got ${got.calls.length}`);
  expect(got.calls[0].function.name === want.function.name, "same name");
  expect(got.calls[0].function.arguments === want.function.arguments,
         `same arguments: ${got.calls[0].function.arguments} vs ${want.function.arguments}`);
  expect(!got.content.includes("<tool_call>"), "no raw markup streamed");
  expect(got.finish === "tool_calls", `finish ${got.finish}`);
});

await check("tool_choice names a function: that one is called", async () => {
  for (const stream of [false, true]) {
    const req = { ...base, messages: user, seed: 3, parallel_tool_calls: false,
                  tool_choice: { type: "function", function: { name: "get_time" } } };
    const r = stream
      ? await collect(await tools.chat.completions.create({ ...req, stream: true }))
      : (await tools.chat.completions.create(req)).choices[0].message;
    const calls = stream ? r.calls : r.tool_calls;
    expect(calls.length === 1, `one call, got ${calls.length}`);
    for (const c of calls) {
      expect(c.function.name === "get_time", `only get_time, got ${c.function.name}`);
      checkCall(c, ["get_time"]);
    }
  }
});

await check("parallel_tool_calls true: every call valid, ids distinct", async () => {
  const r = await tools.chat.completions.create({
    ...base, max_tokens: 400, messages: user, tool_choice: "required", seed: 11,
  });
  const calls = r.choices[0].message.tool_calls;
  expect(calls.length >= 1, "at least one call");
  // A random model goes on calling until max_tokens: the call cut off is incomplete.
  const complete = r.choices[0].finish_reason === "length" ? calls.slice(0, -1) : calls;
  for (const c of complete) checkCall(c, ["get_weather", "get_time"]);
  expect(new Set(calls.map((c) => c.id)).size === calls.length, "distinct ids");
});

await check("tool_choice auto: a call the model writes is parsed, text around it is content",
            async () => {
  const markup = 'Checking\\.\\n<tool_call>\\n\\{"name": "get_weather", "arguments": ' +
                 '\\{"city": "Oslo", "unit": "c"\\}\\}\\n</tool_call>';
  for (const stream of [false, true]) {
    const req = { ...base, messages: user, tool_choice: "auto",
                  structured_outputs: { regex: markup } };
    const r = stream
      ? await collect(await tools.chat.completions.create({ ...req, stream: true }))
      : (await tools.chat.completions.create(req)).choices[0];
    const m = stream ? r : r.message;
    const calls = stream ? r.calls : m.tool_calls;
    expect(calls.length === 1 && calls[0].function.name === "get_weather", "one call parsed");
    expect(JSON.parse(calls[0].function.arguments).city === "Oslo", "its arguments");
    expect(m.content.trim() === "Checking.", `content ${JSON.stringify(m.content)}`);
    expect((stream ? r.finish : r.finish_reason) === "tool_calls", "finish_reason tool_calls");
  }
});

await check("tool_choice none: the same markup stays in content", async () => {
  const r = await tools.chat.completions.create({
    ...base, messages: user, tool_choice: "none",
    structured_outputs: { regex: '<tool_call>\\n\\{"name": "get_time", "arguments": \\{\\}\\}' +
                                 '\\n</tool_call>' },
  });
  const m = r.choices[0].message;
  expect(!m.tool_calls || m.tool_calls.length === 0, "no tool_calls");
  expect(m.content.includes("<tool_call>"), "the markup is content");
  expect(r.choices[0].finish_reason === "stop", "finish_reason stop");
});

await check("follow-up turn: the returned assistant message and a tool result", async () => {
  const assistant = firstCall.choices[0].message;
  const r = await tools.chat.completions.create({
    model: MODEL, tools: TOOLS, max_tokens: 8, ignore_eos: true,
    messages: [...user, assistant,
               { role: "tool", tool_call_id: assistant.tool_calls[0].id, content: "12 C" }],
  });
  expect(r.choices[0].message.role === "assistant", "an answer");
  expect(r.usage.prompt_tokens > firstCall.usage.prompt_tokens, "the turn grew the prompt");
});

await check("errors: required without tools, unknown function, constraint beside a forced call",
            async () => {
  await expectParamError(tools.chat.completions.create({ model: MODEL, messages: user,
                                                    tool_choice: "required" }), 400, "tool_choice");
  await expectParamError(tools.chat.completions.create({
    ...base, messages: user, tool_choice: { type: "function", function: { name: "nope" } },
  }), 400, "tool_choice");
  await expectParamError(tools.chat.completions.create({
    ...base, messages: user, tool_choice: "required", response_format: { type: "json_object" },
  }), 400, "tool_choice");
});

await check("reasoning: <think> goes to reasoning_content, whole and streamed", async () => {
  const regex = "<think>\\nhmm [a-z]{2,6}\\n</think>\\n\\nAnswer [a-z]{2,6}\\.";
  for (const stream of [false, true]) {
    const req = { model: MODEL, messages: user, max_tokens: 60, seed: 5,
                  structured_outputs: { regex } };
    const r = stream
      ? await collect(await think.chat.completions.create({ ...req, stream: true }))
      : (await think.chat.completions.create(req)).choices[0].message;
    const reasoning = stream ? r.reasoning : r.reasoning_content;
    expect(/^\nhmm [a-z]{2,6}\n$/.test(reasoning), `reasoning ${JSON.stringify(reasoning)}`);
    expect(/^\n\nAnswer [a-z]{2,6}\.$/.test(r.content), `content ${JSON.stringify(r.content)}`);
  }
});

await check("reasoning with a tool call after it (Qwen3)", async () => {
  const regex = '<think>\\nok\\n</think>\\n\\n<tool_call>\\n\\{"name": "get_time", ' +
                '"arguments": \\{"tz": "UTC"\\}\\}\\n</tool_call>';
  const r = await think.chat.completions.create({
    ...base, messages: user, structured_outputs: { regex },
  });
  const m = r.choices[0].message;
  expect(m.reasoning_content === "\nok\n", `reasoning ${JSON.stringify(m.reasoning_content)}`);
  expect(m.tool_calls.length === 1 && m.tool_calls[0].function.name === "get_time", "the call");
  expect(m.content === null, "no content");
});

await check("chat_template_kwargs reach the template (enable_thinking false)", async () => {
  const req = { model: MODEL, messages: user, max_tokens: 1 };
  const on = await think.chat.completions.create(req);
  const off = await think.chat.completions.create({
    ...req, chat_template_kwargs: { enable_thinking: false },
  });
  // Qwen3's template writes an empty <think>\n\n</think>\n\n block into the prompt.
  expect(off.usage.prompt_tokens > on.usage.prompt_tokens,
         `${off.usage.prompt_tokens} > ${on.usage.prompt_tokens}`);
});

console.log("ALL OK");
