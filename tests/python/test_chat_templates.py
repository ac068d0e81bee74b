#!/usr/bin/python3
"""Differential test: every real chat template x every conversation rendered by Python jinja2
(as transformers does) and by the C++ engine (llm-chat-render) must be byte-identical; where
jinja2 raises, the C++ engine must fail too (raise_exception -> exit 3, other errors -> exit 2).

  test_chat_templates.py --render-bin build/cpu/tools/llm-chat-render
                         [--templates DIR] [--conversations FILE] [--workdir DIR]
Templates: tests/fixtures/chat_templates/*.jinja, plus every model folder under
$LLM_TOKENIZER_CACHE (default build/tokenizers) that holds a chat template.
Runs under pytest too (set LLM_CHAT_RENDER to the binary).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import jinja2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_template_reference as ref  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "chat_templates")
NOW = 1796212800  # 2026-12-02 12:00:00 UTC, pinned in both renderers
REQUIRED = ["deepseek_v3", "gemma3", "gptoss", "llama3", "llama3_1", "llama3_2", "mistral_nemo",
            "qwen2_5", "qwen3"]


def cached_templates(workdir):
    """Templates fetched into LLM_TOKENIZER_CACHE (or build/tokenizers) by
    scripts/fetch_tokenizers.sh: NAME/chat_template.jinja or NAME/tokenizer_config.json, found
    the way transformers finds them. Returns {name: (template_path, special_tokens)}."""
    root = os.environ.get("LLM_TOKENIZER_CACHE") or os.path.join(HERE, "..", "..", "build",
                                                                   "tokenizers")
    found = {}
    if not os.path.isdir(root):
        return found
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        cfg_path = os.path.join(d, "tokenizer_config.json")
        cfg = {}
        if os.path.exists(cfg_path):
            with open(cfg_path) as f:
                cfg = json.load(f)
        source = None
        if os.path.exists(os.path.join(d, "chat_template.jinja")):
            with open(os.path.join(d, "chat_template.jinja")) as f:
                source = f.read()
        elif isinstance(cfg.get("chat_template"), str):
            source = cfg["chat_template"]
        elif isinstance(cfg.get("chat_template"), list):
            source = next((t["template"] for t in cfg["chat_template"] if t.get("name") == "default"),
                          None)
        if source is None:
            continue
        special = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            v = cfg.get(key)
            v = v.get("content") if isinstance(v, dict) else v
            if v is not None:
                special[key] = v
        path = os.path.join(workdir, f"cache__{name}.jinja")
        with open(path, "w", newline="") as f:
            f.write(source)
        found["cache:" + name] = (path, special)
    return found


def run_all(render_bin, templates, conversations_path, workdir):
    os.environ["TZ"] = "UTC"
    with open(os.path.join(templates, "special_tokens.json")) as f:
        special = json.load(f)
    with open(conversations_path) as f:
        conversations = json.load(f)
    missing = [n for n in REQUIRED if n not in special]
    assert not missing, f"templates missing from the corpus: {missing}"
    sources = {n: (os.path.join(templates, n + ".jinja"), special[n]) for n in special}
    sources.update(cached_templates(workdir))
    failures, compared, raised = [], 0, 0
    for name in sorted(sources):
        path, tokens = sources[name]
        with open(path) as f:
            compiled = ref.compile_template(f.read(), NOW)
        ok_for_template = 0
        for conv in conversations:
            expect_error = None
            try:
                expected = ref.render(compiled, conv, tokens)
            except jinja2.exceptions.TemplateError as e:
                expect_error = (3 if type(e) is jinja2.exceptions.TemplateError else 2, str(e))
            except Exception as e:  # TypeError etc. from the template's own operations
                expect_error = (2, f"{type(e).__name__}: {e}")
            request = {"messages": conv["messages"],
                       "add_generation_prompt": conv.get("add_generation_prompt", False),
                       "extra": {**tokens, **conv.get("extra", {})}}
            if "tools" in conv:
                request["tools"] = conv["tools"]
            req_path = os.path.join(workdir, f"{name.replace(':', '_')}__{conv['name']}.json")
            with open(req_path, "w") as f:
                json.dump(request, f, ensure_ascii=False)
            p = subprocess.run([render_bin, "--template", path, "--input", req_path, "--now",
                                str(NOW)], capture_output=True, env={**os.environ, "TZ": "UTC"})
            case = f"{name} x {conv['name']}"
            if expect_error:
                raised += 1
                if p.returncode != expect_error[0]:
                    failures.append(f"{case}: jinja2 raised ({expect_error[1]}) but C++ exited "
                                    f"{p.returncode}: {p.stderr.decode()[:300]}")
                elif expect_error[0] == 3 and expect_error[1] not in p.stderr.decode():
                    failures.append(f"{case}: raise_exception message differs: "
                                    f"{expect_error[1]!r} vs {p.stderr.decode()[:300]!r}")
                continue
            compared += 1
            got = p.stdout.decode("utf-8", errors="replace")
            if p.returncode != 0:
                failures.append(f"{case}: C++ failed: {p.stderr.decode()[:300]}")
            elif got != expected:
                i = next((k for k in range(min(len(got), len(expected))) if got[k] != expected[k]),
                         min(len(got), len(expected)))
                failures.append(f"{case}: differs at char {i}: jinja2 {expected[max(0, i - 40):i + 40]!r}"
                                f" vs C++ {got[max(0, i - 40):i + 40]!r}")
            else:
                ok_for_template += 1
        if ok_for_template < 10:
            failures.append(f"{name}: only {ok_for_template} conversations rendered; the corpus"
                            " must exercise each template")
    return failures, compared, raised


def run_constructs(render_bin, constructs_path, workdir):
    """Small templates, one per construct (filters, tests, loops, whitespace, errors)."""
    with open(constructs_path) as f:
        cases = json.load(f)
    failures = []
    for case in cases:
        name = case["name"]
        tpath = os.path.join(workdir, f"construct__{name}.jinja")
        with open(tpath, "w", newline="") as f:
            f.write(case["template"])
        expect_error = None
        try:
            compiled = ref.compile_template(case["template"], NOW)
            expected = compiled.render(**case["vars"])
        except jinja2.exceptions.TemplateSyntaxError as e:
            expect_error = (2, str(e))
        except jinja2.exceptions.TemplateError as e:
            expect_error = (3 if type(e) is jinja2.exceptions.TemplateError else 2, str(e))
        except Exception as e:
            expect_error = (2, f"{type(e).__name__}: {e}")
        req_path = os.path.join(workdir, f"construct__{name}.json")
        with open(req_path, "w") as f:
            json.dump({"extra": case["vars"]}, f, ensure_ascii=False)
        p = subprocess.run([render_bin, "--template", tpath, "--input", req_path, "--now",
                            str(NOW)], capture_output=True, env={**os.environ, "TZ": "UTC"})
        if expect_error:
            if p.returncode != expect_error[0]:
                failures.append(f"construct {name}: jinja2 raised ({expect_error[1]}) but C++ "
                                f"exited {p.returncode}: {p.stdout.decode()[:200]!r} "
                                f"{p.stderr.decode()[:300]}")
            continue
        got = p.stdout.decode("utf-8", errors="replace")
        if p.returncode != 0:
            failures.append(f"construct {name}: C++ failed: {p.stderr.decode()[:300]}")
        elif got != expected:
            failures.append(f"construct {name}:\n  jinja2 {expected!r}\n  C++    {got!r}")
    return failures, len(cases)


def test_constructs_match_jinja2():
    render_bin = os.environ.get("LLM_CHAT_RENDER", "build/cpu/tools/llm-chat-render")
    with tempfile.TemporaryDirectory() as work:
        failures, _ = run_constructs(render_bin, os.path.join(FIXTURES, "constructs.json"), work)
    assert not failures, "\n".join(failures)


def test_chat_templates_match_jinja2():
    render_bin = os.environ.get("LLM_CHAT_RENDER", "build/cpu/tools/llm-chat-render")
    with tempfile.TemporaryDirectory() as work:
        failures, _, _ = run_all(render_bin, FIXTURES,
                                 os.path.join(FIXTURES, "conversations.json"), work)
    assert not failures, "\n".join(failures)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--render-bin", required=True)
    ap.add_argument("--templates", default=None)
    ap.add_argument("--conversations", default=os.path.join(FIXTURES, "conversations.json"))
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="chat_templates_")
    os.makedirs(work, exist_ok=True)
    failures, compared, raised = run_all(args.render_bin, args.templates or FIXTURES,
                                         args.conversations, work)
    construct_failures, n_constructs = run_constructs(
        args.render_bin, os.path.join(FIXTURES, "constructs.json"), work)
    failures += construct_failures
    for f in failures:
        print("FAIL", f)
    print(f"{compared} renders compared, {raised} expected errors checked, "
          f"{n_constructs} construct templates, "
          f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
