#!/usr/bin/python3
"""Renders chat templates with Python jinja2 exactly as Hugging Face transformers does.

Mirrors transformers.utils.chat_template_utils._compile_jinja_template (the sandboxed
environment, its options and extensions, the tojson override, raise_exception, strftime_now) and
render_jinja_template / apply_chat_template (the variables passed to render). strftime_now reads
a pinned clock when one is given so the C++ engine can be compared byte for byte.

As a script: writes NAME__CONVERSATION.txt (or .raises) for every template x conversation:
  chat_template_reference.py --templates DIR --conversations FILE --out DIR [--now EPOCH]
"""
import argparse
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(Extension):
    """transformers' {% generation %} block; without mask tracking it renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_assistant", []), [], [], body).set_lineno(
            lineno)

    def _render_assistant(self, caller):
        return caller()


def compile_template(chat_template, now=None):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers overrides jinja's tojson: no HTML escaping, json.dumps options exposed.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        moment = datetime.fromtimestamp(now) if now is not None else datetime.now()
        return moment.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(chat_template)


def render(compiled, conversation, special_tokens):
    """apply_chat_template's render call: tools/documents default to None."""
    kwargs = dict(special_tokens)
    kwargs.update(conversation.get("extra", {}))
    return compiled.render(messages=conversation["messages"], tools=conversation.get("tools"),
                           documents=None,
                           add_generation_prompt=conversation.get("add_generation_prompt", False),
                           **kwargs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", required=True)
    ap.add_argument("--conversations", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--now", type=int, default=None)
    args = ap.parse_args()
    with open(os.path.join(args.templates, "special_tokens.json")) as f:
        special = json.load(f)
    with open(args.conversations) as f:
        conversations = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    for name in sorted(special):
        with open(os.path.join(args.templates, name + ".jinja")) as f:
            compiled = compile_template(f.read(), args.now)
        for conv in conversations:
            base = os.path.join(args.out, f"{name}__{conv['name']}")
            try:
                text = render(compiled, conv, special[name])
                with open(base + ".txt", "w") as f:
                    f.write(text)
            except Exception as e:  # the error is the expected outcome
                with open(base + ".raises", "w") as f:
                    f.write(f"{type(e).__name__}: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
