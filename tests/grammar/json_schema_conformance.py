#!/usr/bin/env python3
"""JSON Schema conformance of the grammar compiler against Debian's json-schema-test-suite.

Draft 7 (the newest draft the Debian 12 package ships), required tests only (not optional/).
python3-jsonschema's Draft7Validator is the oracle: a test whose expected validity it disagrees
with is skipped. Each instance is serialized as the grammar generates JSON: json.dumps with
", " / ": " separators, ensure_ascii=False, integral floats written as integers, and object keys
in schema order (declared properties first, in the order the schema first names them).
For every group whose schema the compiler accepts, every instance must get the oracle's answer.
"""
import argparse
import json
import os
import subprocess
import sys

import jsonschema

SUITE_DIRS = ["/usr/share/json-schema-test-suite/tests/draft7"]


def key_order(schema):
    """Property names in the order the schema document first mentions them."""
    order = {}

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "properties" and isinstance(v, dict):
                    for name in v:
                        order.setdefault(name, len(order))
                if k in ("const", "enum"):
                    for val in (v if k == "enum" and isinstance(v, list) else [v]):
                        walk_value(val)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    def walk_value(v):
        if isinstance(v, dict):
            for name, inner in v.items():
                order.setdefault(name, len(order))
                walk_value(inner)
        elif isinstance(v, list):
            for inner in v:
                walk_value(inner)

    walk(schema)
    return order


def canonical(value, order):
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        return int(value)
    if isinstance(value, list):
        return [canonical(v, order) for v in value]
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (0, order[k]) if k in order else (1, 0))
        return {k: canonical(value[k], order) for k in keys}
    return value


def serialize(value, order):
    return json.dumps(canonical(value, order), separators=(", ", ": "), ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-bin", required=True)
    ap.add_argument("--suite", default=None, help="draft directory (default: Debian's draft7)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    suite = args.suite or next((d for d in SUITE_DIRS if os.path.isdir(d)), None)
    if not suite:
        print("json-schema-test-suite is not installed (scripts/install_deps.sh)", file=sys.stderr)
        return 1

    groups = []
    for name in sorted(os.listdir(suite)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(suite, name), encoding="utf-8") as f:
            for group in json.load(f):
                groups.append((name, group))

    proc = subprocess.Popen([args.check_bin], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, encoding="utf-8")
    accepted_groups = refused = disagreements = instances = oracle_skips = 0
    refusals = {}
    for fname, group in groups:
        schema = group["schema"]
        validator = jsonschema.Draft7Validator(schema)
        order = key_order(schema)
        tests = []
        for t in group["tests"]:
            try:
                oracle = validator.is_valid(t["data"])
            except Exception:  # remote refs and the like: the oracle cannot judge
                oracle = None
            if oracle is None or oracle != t["valid"]:
                oracle_skips += 1
                continue
            tests.append((t, serialize(t["data"], order)))
        proc.stdin.write(json.dumps({"schema": schema, "instances": [s for _, s in tests]}) + "\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        label = f"{fname}: {group['description']}"
        if not answer["ok"]:
            refused += 1
            reason = answer["error"]
            refusals[reason.split(" at ")[0]] = refusals.get(reason.split(" at ")[0], 0) + 1
            if args.verbose:
                print(f"refused  {label}: {reason}")
            continue
        accepted_groups += 1
        for (t, text), got in zip(tests, answer["accepted"]):
            instances += 1
            if got != t["valid"]:
                disagreements += 1
                print(f"DISAGREE {label} / {t['description']}: instance {text!r} "
                      f"valid={t['valid']} grammar={'accepts' if got else 'rejects'}")
    proc.stdin.close()
    proc.wait()
    total = accepted_groups + refused
    print(f"json-schema-test-suite {os.path.basename(suite)}: {accepted_groups}/{total} groups "
          f"accepted by the compiler ({instances} instances checked, {disagreements} "
          f"disagreements, {oracle_skips} tests skipped where the oracle disagrees with the suite)")
    if args.verbose or disagreements:
        for reason, n in sorted(refusals.items(), key=lambda x: -x[1]):
            print(f"  refused {n:3d}: {reason}")
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
