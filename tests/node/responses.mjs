// The Responses API (POST /v1/responses) through the official `openai` npm client. Run by
// tests/python/test_openai_tool_calls.py against two servers of the tiny random-weight model:
//   TOOLS_URL=http://127.0.0.1:P/v1 (Qwen2.5's real chat template, Hermes tool calls)
//   THINK_URL=http://127.0.0.1:Q/v1 (Qwen3's, <think> reasoning and Hermes tool calls)
//   MODEL=tiny-llama node responses.mjs
// The weights are random, so calls come from tool_choice "required" and JSON from text.format
// json_schema, both constrained, and reasoning from a regex that writes the markup. Prints one line per check and exits non-zero on the first
// failure.
import OpenAI from "openai";

import { check, expect, expectParamError } from "./check.mjs";
import {
  checkWeatherArgs,
  WEATHER_DESCRIPTION,
  WEATHER_NAME,
  WEATHER_PARAMETERS,
} from "./weather_tool.mjs";

const { TOOLS_URL, THINK_URL, MODEL } = process.env;
const client = new OpenAI({ baseURL: TOOLS_URL, apiKey: "none", maxRetries: 0 });
const think = new OpenAI({ baseURL: THINK_URL, apiKey: "none", maxRetries: 0 });

const WEATHER = {
  type: "function",
  name: WEATHER_NAME,
  description: WEATHER_DESCRIPTION,
  parameters: WEATHER_PARAMETERS,
};

function checkResponse(r) {
  expect(r.object === "response", "object response");
  expect(typeof r.id === "string" && r.id.startsWith("resp_"), `id resp_..., got ${r.id}`);
  expect(["completed", "incomplete"].includes(r.status), `status ${r.status}`);
  expect(r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens, "usage adds up");
  expect(r.usage.output_tokens > 0, "output tokens counted");
}

// Reads a stream's events; checks their order and numbering, and that the deltas add up to the
// final response's items.
async function collect(stream) {
  const events = [];
  for await (const e of stream) events.push(e);
  events.forEach((e, i) => expect(e.sequence_number === i, `sequence_number ${i}`));
  expect(events[0].type === "response.created", "response.created first");
  expect(events[0].response.status === "in_progress", "created in_progress");
  const last = events[events.length - 1];
  expect(["response.completed", "response.incomplete"].includes(last.type), `last ${last.type}`);
  const response = last.response;
  const text = {}, args = {};
  for (const e of events) {
    if (e.type === "response.output_text.delta") text[e.item_id] = (text[e.item_id] ?? "") + e.delta;
    if (e.type === "response.function_call_arguments.delta") {
      args[e.item_id] = (args[e.item_id] ?? "") + e.delta;
    }
    if (e.type === "response.output_item.done") {
      const item = response.output[e.output_index];
      expect(JSON.stringify(item) === JSON.stringify(e.item), "output_item.done is the final item");
    }
  }
  for (const item of response.output) {
    if (item.type === "message") {
      expect(item.content[0].text === (text[item.id] ?? ""), "text deltas add up to the message");
    } else if (item.type === "function_call") {
      expect(item.arguments === (args[item.id] ?? ""), "argument deltas add up to the call");
    }
  }
  return { events, response };
}

await check("text: a string input, instructions, max_output_tokens", async () => {
  const r = await client.responses.create({
    model: MODEL, input: "Say hi", instructions: "Be brief", max_output_tokens: 5,
    temperature: 0,
  });
  checkResponse(r);
  expect(r.status === "incomplete" && r.incomplete_details.reason === "max_output_tokens",
         "cut at max_output_tokens");
  expect(r.usage.output_tokens === 5, "5 output tokens");
  expect(r.instructions === "Be brief" && r.max_output_tokens === 5, "request fields repeated");
  expect(r.output.length === 1 && r.output[0].type === "message", "one message item");
  expect(r.output[0].content[0].type === "output_text", "output_text part");
  expect(r.output_text === r.output[0].content[0].text, "the client's output_text");
});

await check("text streamed: events iterate, deltas add up to the non-streamed text", async () => {
  const req = { model: MODEL, input: "Say hi", max_output_tokens: 6, temperature: 0 };
  const whole = await client.responses.create(req);
  const { events, response } = await collect(await client.responses.create({ ...req, stream: true }));
  const types = events.map((e) => e.type);
  for (const t of ["response.in_progress", "response.output_item.added",
                   "response.content_part.added", "response.output_text.delta",
                   "response.output_text.done", "response.content_part.done",
                   "response.output_item.done"]) {
    expect(types.includes(t), `an event ${t}`);
  }
  expect(response.output[0].content[0].text === whole.output[0].content[0].text,
         "streamed text is the non-streamed text (temperature 0)");
});

await check("function tool with tool_choice required: a function_call item", async () => {
  const r = await client.responses.create({
    model: MODEL, input: "Weather in Paris?", tools: [WEATHER], tool_choice: "required",
    parallel_tool_calls: false, max_output_tokens: 200, temperature: 1.0,
  });
  checkResponse(r);
  const calls = r.output.filter((i) => i.type === "function_call");
  expect(calls.length === 1, `one call, got ${JSON.stringify(r.output)}`);
  const call = calls[0];
  expect(call.name === "get_weather", "the tool's name");
  expect(typeof call.call_id === "string" && call.call_id.length > 0, "a call_id");
  checkWeatherArgs(call.arguments);
  expect(r.tools[0].name === "get_weather" && r.tool_choice === "required", "tools repeated");

  // The call and its result given back as input items: a second turn through the template.
  const next = await client.responses.create({
    model: MODEL, tools: [WEATHER], max_output_tokens: 4, store: false,
    input: [{ role: "user", content: "Weather in Paris?" }, ...r.output,
            { type: "function_call_output", call_id: call.call_id, output: "rain" }],
  });
  checkResponse(next);
  expect(next.usage.input_tokens > r.usage.input_tokens, "the call and its output in the prompt");
});

await check("function call streamed: argument deltas, then done events", async () => {
  const { events, response } = await collect(await client.responses.create({
    model: MODEL, input: "Weather in Oslo?", tools: [WEATHER], tool_choice: "required",
    parallel_tool_calls: false, max_output_tokens: 200, temperature: 1.0, stream: true,
  }));
  const calls = response.output.filter((i) => i.type === "function_call");
  expect(calls.length === 1, "one call");
  checkWeatherArgs(calls[0].arguments);
  const types = events.map((e) => e.type);
  expect(types.includes("response.function_call_arguments.delta"), "argument deltas");
  const done = events.find((e) => e.type === "response.function_call_arguments.done");
  expect(done.arguments === calls[0].arguments && done.item_id === calls[0].id, "args done");
});

await check("text.format json_schema: the output is JSON following the schema", async () => {
  const r = await client.responses.create({
    model: MODEL, input: "A city as JSON", max_output_tokens: 200, temperature: 1.0,
    text: {
      format: {
        type: "json_schema", name: "city", strict: true,
        schema: {
          type: "object",
          properties: { city: { enum: ["Paris", "Oslo"] }, size: { enum: [1, 2, 3] } },
          required: ["city", "size"],
          additionalProperties: false,
        },
      },
    },
  });
  checkResponse(r);
  expect(r.status === "completed", "the schema's JSON ends");
  const v = JSON.parse(r.output_text);
  expect(Object.keys(v).sort().join() === "city,size", `keys of ${r.output_text}`);
  expect(["Paris", "Oslo"].includes(v.city) && [1, 2, 3].includes(v.size), r.output_text);
  expect(r.text.format.type === "json_schema", "text.format repeated");
});

await check("reasoning (Qwen3 <think>): a reasoning item before the message, whole and streamed",
            async () => {
  // The regex writes the markup a reasoning model would (vLLM's structured_outputs).
  const regex = "<think>\\nhmm [a-z]{2,6}\\n</think>\\n\\nAnswer [a-z]{2,6}\\.";
  const req = { model: MODEL, input: "Hi", max_output_tokens: 60, seed: 5,
                structured_outputs: { regex } };
  const whole = await think.responses.create(req);
  const { events, response } = await collect(await think.responses.create({ ...req, stream: true }));
  for (const r of [whole, response]) {
    checkResponse(r);
    expect(r.output.map((i) => i.type).join() === "reasoning,message",
           `items ${JSON.stringify(r.output)}`);
    const reasoning = r.output[0].content[0];
    expect(reasoning.type === "reasoning_text" && /^\nhmm [a-z]{2,6}\n$/.test(reasoning.text),
           `reasoning ${JSON.stringify(reasoning)}`);
    expect(/^\n\nAnswer [a-z]{2,6}\.$/.test(r.output_text ?? r.output[1].content[0].text),
           `text ${JSON.stringify(r.output[1])}`);
  }
  const deltas = events.filter((e) => e.type === "response.reasoning_text.delta")
                       .map((e) => e.delta).join("");
  expect(deltas === response.output[0].content[0].text, "reasoning deltas add up");
});

await check("reasoning then a call (Qwen3): no message item", async () => {
  const regex = '<think>\\nok\\n</think>\\n\\n<tool_call>\\n\\{"name": "get_weather", ' +
                '"arguments": \\{"city": "Oslo", "unit": "c"\\}\\}\\n</tool_call>';
  const r = await think.responses.create({
    model: MODEL, input: "Weather?", tools: [WEATHER], max_output_tokens: 200,
    structured_outputs: { regex },
  });
  checkResponse(r);
  expect(r.output.map((i) => i.type).join() === "reasoning,function_call",
         `items ${JSON.stringify(r.output)}`);
  expect(r.output[0].content[0].text === "\nok\n", "the reasoning");
  checkWeatherArgs(r.output[1].arguments);
});

await check("stored state and built-in tools are refused by name", async () => {
  await expectParamError(client.responses.create({ model: MODEL, input: "x",
                                              previous_response_id: "resp_1" }),
                    400, "previous_response_id");
  await expectParamError(client.responses.create({ model: MODEL, input: "x", store: true }),
                    400, "store");
  await expectParamError(client.responses.create({ model: MODEL, input: "x",
                                              tools: [{ type: "web_search" }] }),
                    400, "tools");
});

console.log("ALL OK");
