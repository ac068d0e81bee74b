#!/usr/bin/python3
"""The tool-call parsers' oracle: each family's real chat template (tests/fixtures/chat_templates)
renders an assistant message with tool_calls through Python jinja2 as transformers does; the text
the template writes after the generation prompt, without the end-of-turn token, is what the model
would have generated. tests/unit/test_tool_call_parsers.cc parses every case and compares the
calls (names equal, arguments JSON-equal) and the content / reasoning with the message's.

As a script: writes the cases to tests/fixtures/tool_calls/rendered_calls.json;
tests/python/test_tool_call_oracle.py checks that file is what the templates render now.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_template_reference as ref  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TEMPLATES = os.path.join(ROOT, "tests", "fixtures", "chat_templates")
OUT = os.path.join(ROOT, "tests", "fixtures", "tool_calls", "rendered_calls.json")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}

# family: (templates, end-of-turn markers the model stops on, the template's capabilities)
FAMILIES = {
    "hermes": (["qwen3", "qwen2_5"], ["<|im_end|>\n", "<|im_end|>"],
               {"parallel": True, "content": "content", "string_args": True}),
    "llama3_json": (["llama3_2"], ["<|eom_id|>", "<|eot_id|>"],
                    {"parallel": False, "content": None, "string_args": False}),
    "mistral": (["mistral_nemo"], ["</s>"],
                {"parallel": True, "content": None, "string_args": False}),
    "deepseek_v3": (["deepseek_v3"], ["<｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
                                      "<｜end▁of▁sentence｜>"],
                    {"parallel": True, "content": None, "string_args": True, "args_str": True}),
    "harmony": (["gptoss"], ["<|call|>", "<|return|>", "<|end|>"],
                {"parallel": False, "content": "reasoning", "string_args": True}),
}

CALL_ARGS = [
    ("one_call", [("get_weather", {"city": "Paris", "unit": "celsius"})], None),
    ("unicode_args", [("get_weather", {"city": "東京 🌸", "unit": "c\"x\\y\n"})], None),
    ("nested_args", [("get_weather", {"city": "Rome", "unit": {"a": [1, 2.5, None, True]}})],
     None),
    ("empty_args", [("get_time", {})], None),
    ("two_calls", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})],
     None),
    ("text_before", [("get_weather", {"city": "Oslo"})], "Let me check the weather."),
]

# An end marker of the family inside an argument string must not end the call.
END_INSIDE = {
    "hermes": "a </tool_call> b <tool_call> c",
    "llama3_json": "a <|python_tag|> b } ; {\"name\": \"x\"}",
    "mistral": "a ]}, [TOOL_CALLS] b",
    "deepseek_v3": "a\n```<｜tool▁call▁end｜> b",
    "harmony": None,  # its markers are special tokens: the model cannot write them as text
}


def special_tokens(name):
    with open(os.path.join(TEMPLATES, "special_tokens.json"), encoding="utf-8") as f:
        return json.load(f)[name]


def continuation(compiled, specials, messages, tools):
    prompt = ref.render(compiled, {"messages": messages[:-1], "tools": tools,
                                   "add_generation_prompt": True}, specials)
    full = ref.render(compiled, {"messages": messages, "tools": tools,
                                 "add_generation_prompt": False}, specials)
    assert full.startswith(prompt), "the generation prompt is not a prefix of the rendered turn"
    return full[len(prompt):]


def strip_end(text, ends):
    for e in ends:
        if text.endswith(e):
            return text[:-len(e)]
    return text


def cases():
    out = []
    for family, (templates, ends, caps) in FAMILIES.items():
        calls_list = list(CALL_ARGS)
        if END_INSIDE[family]:
            calls_list.append(("end_marker_in_argument",
                               [("get_weather", {"city": END_INSIDE[family]})], None))
        for tname in templates:
            with open(os.path.join(TEMPLATES, tname + ".jinja"), encoding="utf-8") as f:
                compiled = ref.compile_template(f.read())
            specials = special_tokens(tname)
            for case, calls, text in calls_list + [("no_call", [], "It is sunny in Paris.")]:
                if len(calls) > 1 and not caps["parallel"]:
                    continue
                if text and calls and caps["content"] is None:
                    continue
                tool_calls = []
                for i, (name, args) in enumerate(calls):
                    arguments = json.dumps(args, ensure_ascii=False) if caps.get("args_str") \
                        else args
                    tool_calls.append({"id": "abcdefgh" + str(i), "type": "function",
                                       "function": {"name": name, "arguments": arguments}})
                # DeepSeek-V3's template renders calls only for content None; Qwen3's needs a string.
                none = family == "deepseek_v3" and calls
                assistant = {"role": "assistant", "content": None if none else (text or "")}
                if tool_calls:
                    assistant["tool_calls"] = tool_calls
                messages = [{"role": "system", "content": "You are helpful."},
                            {"role": "user", "content": "What is the weather in Paris?"},
                            assistant]
                if family == "mistral":  # its template allows no system message with tools
                    messages = messages[1:]
                output = strip_end(continuation(compiled, specials, messages, [WEATHER, TIME]),
                                   ends)
                expect = {"content": "", "reasoning": "",
                          "tool_calls": [{"name": n, "arguments": a} for n, a in calls]}
                if text:
                    expect["reasoning" if calls and caps["content"] == "reasoning"
                           else "content"] = text
                out.append({"family": family, "template": tname, "case": case,
                            "output": output, "expect": expect})
    return out


def main():
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(cases(), f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
