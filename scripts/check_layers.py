#!/usr/bin/env python3
"""Fails when a source file includes a project header from a layer above its own.

The layers, bottom first (docs/ARCHITECTURE.md draws them). A folder may include its own headers
and those of any layer below it; folders on the same layer do not include each other. Inside
engine/, the same rule holds for its sub-folders (ENGINE_LAYERS). tools/, bench/ and tests/ sit on
top and may include anything.
"""
import pathlib
import re
import sys

LAYERS = [
    ["base"],
    ["kernels", "kvcache", "text", "grammar"],
    ["scheduler"],
    ["engine"],
    ["server"],
    ["tools", "bench", "tests"],
]
# Sub-layers of engine/ (folders not listed are engine's top: the engine thread and its step).
ENGINE_LAYERS = [
    ["engine/sampling"],
    ["engine/loader"],
    ["engine/layers"],
    ["engine/runtime"],
    ["engine/architectures"],
]
# Generated or system include roots that are not project folders.
EXTERNAL = {"llm", "grpc", "google"}
SOURCES = ("*.h", "*.cc", "*.cu", "*.cuh", "*.hpp")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def rank_table(layers):
    return {name: i for i, names in enumerate(layers) for name in names}


TOP = rank_table(LAYERS)
ENGINE = rank_table(ENGINE_LAYERS)


def engine_rank(path):
    """Sub-layer of a path under engine/; len(ENGINE_LAYERS) for engine's top files."""
    parts = path.split("/")
    if len(parts) >= 3 and "/".join(parts[:2]) in ENGINE:
        return ENGINE["/".join(parts[:2])]
    return len(ENGINE_LAYERS)


def violation(src, inc):
    src_top, inc_top = src.split("/")[0], inc.split("/")[0]
    if inc_top in EXTERNAL or inc_top not in TOP:
        return None
    if src_top == inc_top:
        if src_top == "engine" and engine_rank(inc) > engine_rank(src):
            return "engine sub-layer"
        return None
    if TOP[inc_top] > TOP[src_top]:
        return "upward"
    if TOP[inc_top] == TOP[src_top] and src_top not in ("tools", "bench", "tests"):
        return "sideways (same layer)"
    return None


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    bad = 0
    checked = 0
    for pattern in SOURCES:
        for f in sorted(root.glob("**/" + pattern)):
            rel = f.relative_to(root).as_posix()
            if rel.split("/")[0] not in TOP:
                continue  # build trees, third-party copies
            checked += 1
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                why = violation(rel, m.group(1))
                if why:
                    print(f"layers: {rel}:{n} includes {m.group(1)} ({why})")
                    bad += 1
    if bad:
        print(f"layers: {bad} include(s) run against the layering (scripts/check_layers.py)")
        return 1
    print(f"layers: OK ({checked} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
