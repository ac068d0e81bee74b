#!/usr/bin/env python3
"""tools/ncu_stalls.py on a synthetic Nsight Compute source page: the top instructions, opcode
sums, synchronization points and line regions it prints follow from the rows, and a file that is
not a source page is refused with exit code 2."""

import argparse
import csv
import os
import random
import subprocess
import sys
import tempfile

HEADER = [
    "Address",
    "Source",
    "Warp Stall Sampling (All Samples)",
    "Warp Stall Sampling (Not-issued Samples)",
    "# Samples",
    "Instructions Executed",
    "Thread Instructions Executed",
]


def write_page(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["Kernel Name", "void Demo<128>(Args)"])
        w.writerow(HEADER)
        for i, (sass, samples, not_issued, executed) in enumerate(rows):
            # ncu writes thousands separators in its counters
            w.writerow([f"0x{0x1000 + 16 * i:x}", sass, samples, not_issued, "", f"{executed:,}", ""])


def run(tool, *args):
    p = subprocess.run([sys.executable, tool, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", default=os.path.join(os.path.dirname(__file__), "../../tools/ncu_stalls.py"))
    args = ap.parse_args()
    rng = random.Random()
    ops = ["FFMA R1, R2, R3, R4", "MUFU.EX2 R5, R6", "IMAD R7, R8, R9, RZ", "LDS R10, [R11]"]
    rows = []
    for _ in range(rng.randint(40, 80)):
        rows.append((rng.choice(ops), rng.randint(0, 50), rng.randint(0, 10), rng.randint(1, 5000)))
    # A wait whose stall is charged to the instruction after it, and the hottest line.
    hot_samples = 10_000 + rng.randint(0, 1000)
    wait_at = rng.randint(5, len(rows) - 5)
    rows.insert(wait_at, ("BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", 3, 1, 777))
    rows.insert(wait_at + 1, ("LDS R188, [R185+0x38020]", hot_samples, hot_samples - 5, 777))
    rows.append(("@!P0  BRA 0x1990", 2, 0, 12))
    failures = []
    with tempfile.TemporaryDirectory() as d:
        page = os.path.join(d, "src.csv")
        write_page(page, rows)
        lo, hi = 1, wait_at + 2  # lines are 1-based: the hot LDS is line wait_at + 2
        listing = os.path.join(d, "listing.txt")
        code, out, err = run(args.tool, page, "--top", "3", "--regions", f"{lo}-{hi},{hi}", "--listing", listing)
        if code != 0:
            failures.append(f"exit {code}: {err}")
        total = sum(r[1] for r in rows)
        if f"{len(rows)} SASS instructions, {total} warp-stall samples" not in out:
            failures.append("totals line missing or wrong")
        top_lines = [l for l in out.splitlines() if l.startswith("  ") and "LDS R188" in l]
        if not top_lines or not top_lines[0].split()[0] == str(hi):
            failures.append(f"hottest instruction not reported at line {hi}")
        mufu = sum(r[1] for r in rows if r[0].startswith("MUFU"))
        if f"MUFU {mufu}" not in out:
            failures.append(f"MUFU samples should sum to {mufu}")
        sync = [l for l in out.splitlines() if "BAR.SYNC.DEFER_BLOCKING 0x1" in l]
        if not sync or sync[0].split()[1:4] != ["777", "3", str(hot_samples)]:
            failures.append(f"sync line should show 777 executions, 3 samples, {hot_samples} after: {sync}")
        region = sum(r[1] for r in rows[lo - 1 : hi])
        if f"  {lo}-{hi}: {region} " not in out or f"  {hi}-{hi}: {hot_samples} " not in out:
            failures.append(f"region sums wrong (expected {region} and {hot_samples})")
        with open(listing) as f:
            listed = f.read().splitlines()
        if len(listed) != len(rows) or "LDS R188" not in listed[hi - 1]:
            failures.append("listing does not number the instructions as the report does")

        bad = os.path.join(d, "bad.csv")
        with open(bad, "w") as f:
            f.write("ID,Kernel,Duration\n1,Demo,3.5\n")
        code, _, err = run(args.tool, bad)
        if code != 2 or "not an ncu source page" not in err:
            failures.append(f"a non-source page should exit 2 with a reason, got {code}: {err}")
        code, _, err = run(args.tool, page, "--regions", "9-3")
        if code != 2:
            failures.append("a reversed region should exit 2")
    for f in failures:
        print("FAIL:", f)
    print("ncu_stalls:", "OK" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
