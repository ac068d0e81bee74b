"""Deterministic weights for the Hugging Face reference fixtures (tests/fixtures/models/).

A fixture commits what transformers wrote (config.json, generation_config.json), the tensor
names and shapes of the checkpoint transformers saved, and the references transformers computed;
the weights themselves are regenerated from a manifest (weights.json), so that a model with a
150k-token vocabulary costs a few kilobytes in git. The generator is SplitMix64 over
(seed ^ fnv1a64(tensor name)), mapped to uniform floats: value = (2u - 1) * scale + offset,
rounded once to float32. tools/hf_fixtures/make_fixtures.py loads the same files with
transformers' from_pretrained and checks that every tensor was consumed.

    /usr/bin/python3 tools/hf_fixtures/weights.py FIXTURE_DIR OUT_DIR [--layout v5|v4]
        [--tokenizer-cache DIR]
"""

import argparse
import hashlib
import json
import os
import shutil
import struct
import sys

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def generate(name, shape, seed, scale, offset):
    """float32 array of `shape`, a pure function of (name, seed, scale, offset)."""
    n = int(np.prod(shape)) if len(shape) else 1
    state = np.uint64((seed ^ fnv1a64(name)) & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        z = state + (np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * _C1
        z = (z ^ (z >> np.uint64(27))) * _C2
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float64) * (1.0 / (1 << 24))
    v = (2.0 * u - 1.0) * float(scale) + float(offset)
    return v.astype(np.float32).reshape(shape)


def tensors_of(manifest):
    seed = manifest["seed"]
    for t in manifest["tensors"]:
        yield t["name"], generate(t["name"], t["shape"], seed, t["scale"], t["offset"])


def data_sha256(manifest):
    h = hashlib.sha256()
    for _, a in tensors_of(manifest):
        h.update(a.tobytes())
    return h.hexdigest()


def write_safetensors(path, named_arrays):
    """Writes float32 tensors (uint8 ones as U8: MXFP4 blocks and scales) in the safetensors
    layout (header, then data in the given order)."""
    header, offset, blobs = {}, 0, []
    for name, a in named_arrays:
        u8 = np.asarray(a).dtype == np.uint8
        b = np.ascontiguousarray(a, dtype=np.uint8 if u8 else np.float32).tobytes()
        header[name] = {"dtype": "U8" if u8 else "F32", "shape": list(np.shape(a)),
                        "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


def materialize(fixture_dir, out_dir, layout="v5", tokenizer_cache=None):
    """Writes a loadable model directory for one fixture; returns out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    cfg_name = {"v5": "config.json", "v4": "config_v4.json"}[layout]
    shutil.copyfile(os.path.join(fixture_dir, cfg_name), os.path.join(out_dir, "config.json"))
    for extra in ("generation_config.json",):
        src = os.path.join(fixture_dir, extra)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(out_dir, extra))
    committed = os.path.join(fixture_dir, "model.safetensors")
    if os.path.exists(committed):  # small fixtures (fp8 checkpoints) commit their weights
        shutil.copyfile(committed, os.path.join(out_dir, "model.safetensors"))
    else:
        with open(os.path.join(fixture_dir, "weights.json")) as f:
            manifest = json.load(f)
        write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors_of(manifest))
    with open(os.path.join(fixture_dir, "reference.json")) as f:
        tok = json.load(f).get("tokenizer")
    if tok and tokenizer_cache:
        src = os.path.join(tokenizer_cache, tok)
        if os.path.isdir(src):
            for fn in ("tokenizer.json", "tokenizer_config.json"):
                if os.path.exists(os.path.join(src, fn)):
                    shutil.copyfile(os.path.join(src, fn), os.path.join(out_dir, fn))
    return out_dir


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fixture_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--layout", default="v5", choices=["v5", "v4"])
    ap.add_argument("--tokenizer-cache")
    a = ap.parse_args()
    materialize(a.fixture_dir, a.out_dir, a.layout, a.tokenizer_cache)


if __name__ == "__main__":
    sys.exit(main())
