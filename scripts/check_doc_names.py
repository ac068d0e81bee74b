#!/usr/bin/env python3
"""Checks that the names the main docs cite still exist in the tree.

For docs/ARCHITECTURE.md, docs/design/*.md, docs/KERNEL_SELECTION.md and README.md, every
backticked span is checked:
  - a repo path (contains '/' and a file extension, or names a folder of the tree) must be a
    tracked file or folder (`git ls-files`);
  - a bare source file name (`test_fmha.cc`) must be the name of some tracked file;
  - a C++ name of the form `Foo::Bar`, `FooBar` (CamelCase, two humps or more) or `foo_bar()`
    must occur as a word in the sources (*.h *.cc *.cu *.cuh *.py *.sh *.json *.txt *.proto *.cmake).
Names that are not ours (CUDA, cuBLAS, HF, vLLM, gRPC...) go in ALLOW. Prints each miss as
file:line and exits 1 when there is one.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Names that are not ours and not in our sources (library and HF file names). External names
# our code calls (cuBLAS, CUDA, HF architecture strings) are found in the sources; names under
# std::, grpc::, absl::, nlohmann::, boost:: are skipped.
ALLOW = {
    "chat_template.jinja",  # the HF tokenizer folder's template file
    "httplib.h",  # cpp-httplib's header (Debian's libcpp-httplib-dev)
}

PATH_EXT = re.compile(r"\.(h|cc|cu|cuh|py|sh|md|json|txt|proto|cmake|jinja|toml|yml|yaml|hip|"
                      r"cpp|c|jsonl|bin|safetensors|gbnf|js|mjs|ts|in|cfg)$")
SCOPED = re.compile(r"^~?[A-Za-z_][A-Za-z0-9_]*(::~?[A-Za-z_][A-Za-z0-9_]*)+(\(\))?$")
CAMEL = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*){1,}$")
CALL = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+\(\)$")
SOURCE_EXT = (".h", ".cc", ".cu", ".cuh", ".py", ".sh", ".json", ".txt", ".proto", ".cmake",
              ".hip", ".cpp")


def git_files():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout
    return [f for f in out.splitlines() if f]


def main():
    files = git_files()
    file_set = set(files)
    basenames.update(os.path.basename(f) for f in files)
    folders = set()
    for f in files:
        parts = f.split("/")
        for i in range(1, len(parts)):
            folders.add("/".join(parts[:i]))
    words = set()
    for f in files:
        if not f.endswith(SOURCE_EXT) or f.startswith("third_party/"):
            continue
        try:
            with open(os.path.join(ROOT, f), encoding="utf-8", errors="replace") as fh:
                words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", fh.read()))
        except OSError:
            continue

    docs = ["docs/ARCHITECTURE.md", "docs/KERNEL_SELECTION.md", "README.md"]
    docs += sorted(f for f in files if f.startswith("docs/design/") and f.endswith(".md"))
    misses = 0
    for doc in docs:
        doc_dir = os.path.dirname(doc)
        with open(os.path.join(ROOT, doc), encoding="utf-8") as fh:
            text = fh.read()
        # Backticked spans may wrap across one line break; code blocks (```) are skipped.
        text_nofence = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text,
                              flags=re.S)
        for m in re.finditer(r"`([^`\n]+(?:\n[^`\n]+)?)`", text_nofence):
            span = m.group(1)
            line = text_nofence.count("\n", 0, m.start()) + 1
            for miss in check_span(span, doc_dir, file_set, folders, words):
                print(f"{doc}:{line}: {miss}")
                misses += 1
    if misses:
        print(f"check_doc_names: {misses} stale name(s)")
        return 1
    print("check_doc_names: OK")
    return 0


SOURCE_FILE_EXT = ("h", "cc", "cu", "cuh", "py", "sh", "proto", "hip", "cpp", "jinja")
basenames = set()


def check_span(span, doc_dir, file_set, folders, words):
    span = span.strip()
    # A wrapped path such as `tests/fixtures/\nchat_templates/` joins without the break.
    joined = re.sub(r"\s*\n\s*", "", span)
    token = joined.split()[0] if joined.split() else ""
    if "/" in token and not token.startswith(("http", "/", "-", "<", "$", ".", "~")) and \
            re.match(r"^[\w.{},*/-]+$", token):
        return check_path(token, doc_dir, file_set, folders)
    if " " in span or "\n" in span:
        return []
    name = span
    if name in ALLOW:
        return []
    if PATH_EXT.search(name) and re.match(r"^[\w.-]+$", name) and \
            not name.startswith(".") and name.split(".")[-1] in SOURCE_FILE_EXT:
        # A bare file name such as `test_fmha.cc`: some tracked file must have it.
        return [] if name in basenames else [f"file `{name}`"]
    if name in ALLOW:
        return []
    if SCOPED.match(name):
        parts = [p.lstrip("~") for p in name.rstrip("()").split("::")]
        if parts[0] in ("std", "grpc", "absl", "nlohmann", "boost", "cub", "cute", "cutlass"):
            return []
        return [f"`{name}`"] if any(p not in words for p in parts) else []
    if CAMEL.match(name.removesuffix("()")) or CALL.match(name):
        base = name.rstrip("()")
        return [] if base in words else [f"`{name}`"]
    return []


def expand_braces(path):
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(path[:m.start()] + alt + path[m.end():])
    return out


def check_path(token, doc_dir, file_set, folders):
    token = token.rstrip(".,:;)")
    if "*" in token:
        return []
    misses = []
    for path in expand_braces(token):
        is_folder = path.endswith("/")
        p = path.rstrip("/")
        if not is_folder and not PATH_EXT.search(p) and p not in folders:
            # Neither a file name nor a folder of ours: something else (a ratio, a unit).
            if p.split("/")[0] not in folders:
                continue
        candidates = [p, os.path.normpath(os.path.join(doc_dir, p)) if doc_dir else p]
        if any(c in file_set or c in folders for c in candidates):
            continue
        if p + ".cc" in file_set:  # a tool named by its binary, e.g. tools/make_tiny_model
            continue
        misses.append(f"path `{path}`")
    return misses


if __name__ == "__main__":
    sys.exit(main())
