#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's source page (stdlib only).

Collect one kernel's SASS-level counters on the GPU machine, then read them anywhere:

    ncu --clock-control none -k regex:MlaWgmma --launch-skip 5 --launch-count 1 \\
        --section SourceCounters --section WarpStateStats -o rep BINARY ARGS...
    ncu -i rep.ncu-rep --page source --csv --print-source sass > src.csv
    tools/ncu_stalls.py src.csv [--top 30] [--regions 700-745,746-746] [--listing out.txt]

Prints the totals, the instructions with the most warp-stall samples, samples and executions per
opcode, every synchronization point (barriers, wgmma waits, mbarrier and cp.async waits) with
its executions and samples, and the samples of each --regions line range. Lines are the SASS
instruction's 1-based position in the file (the --listing file numbers them the same way).
docs/log/PERFORMANCE_NOTEBOOK.md reads its ncu profiles this way.
"""

import argparse
import csv
import sys
from collections import Counter

SYNC_MARKERS = ("BAR.", "DEPBAR", "SYNCS.", "WARPSYNC", "LDGDEPBAR", "MEMBAR", "FENCE")


def load(path):
    """Returns (kernel name, rows); each row: dict with line, samples, not_issued, executed, sass."""
    with open(path, newline="") as f:
        table = list(csv.reader(f))
    kernel = ""
    header_at = None
    for i, row in enumerate(table):
        if row and row[0] == "Kernel Name" and len(row) > 1:
            kernel = row[1]
        if "Address" in row and "Source" in row:
            header_at = i
            break
    if header_at is None:
        raise ValueError(f"{path}: no header row with 'Address' and 'Source' (not an ncu source page)")
    header = table[header_at]

    def column(name):
        for j, h in enumerate(header):
            if h.startswith(name):
                return j
        raise ValueError(f"{path}: no column '{name}'")

    i_src = column("Source")
    i_all = column("Warp Stall Sampling (All")
    i_not = column("Warp Stall Sampling (Not")
    i_exe = column("Instructions Executed")

    def number(text):
        text = text.replace(",", "").strip()
        return float(text) if text else 0.0

    rows = []
    for n, row in enumerate(table[header_at + 1 :], 1):
        if len(row) <= max(i_src, i_all, i_not, i_exe):
            continue
        rows.append(
            {
                "line": n,
                "samples": number(row[i_all]),
                "not_issued": number(row[i_not]),
                "executed": number(row[i_exe]),
                "sass": row[i_src].strip(),
            }
        )
    return kernel, rows


def opcode(sass):
    words = sass.split()
    if not words:
        return ""
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def parse_regions(text):
    regions = []
    for part in filter(None, (text or "").split(",")):
        a, _, b = part.partition("-")
        lo, hi = int(a), int(b or a)
        if lo > hi:
            raise ValueError(f"region {part}: start after end")
        regions.append((lo, hi))
    return regions


def report(kernel, rows, top, regions, out):
    total = sum(r["samples"] for r in rows)
    executed = sum(r["executed"] for r in rows)
    pct = lambda v: 100.0 * v / total if total else 0.0
    print(f"kernel: {kernel or '(unnamed)'}", file=out)
    print(
        f"{len(rows)} SASS instructions, {total:.0f} warp-stall samples, "
        f"{executed:.0f} warp instructions executed",
        file=out,
    )
    print(f"\ntop {top} instructions by samples (line, samples, % of all, not issued, executed):", file=out)
    for r in sorted(rows, key=lambda r: -r["samples"])[:top]:
        print(
            f"  {r['line']:5d} {r['samples']:8.0f} {pct(r['samples']):5.1f}% {r['not_issued']:8.0f} "
            f"{r['executed']:10.0f}  {r['sass'][:90]}",
            file=out,
        )
    by_samples, by_exec = Counter(), Counter()
    for r in rows:
        op = opcode(r["sass"])
        by_samples[op] += r["samples"]
        by_exec[op] += r["executed"]
    print("\nopcodes by samples:", file=out)
    print("  " + ", ".join(f"{op} {v:.0f}" for op, v in by_samples.most_common(15)), file=out)
    print("opcodes by warp instructions executed:", file=out)
    print("  " + ", ".join(f"{op} {v:.0f}" for op, v in by_exec.most_common(15)), file=out)
    print("\nsynchronization points (line, executed, samples here and on the next line):", file=out)
    for k, r in enumerate(rows):
        if any(m in r["sass"] for m in SYNC_MARKERS) and r["executed"] > 0:
            # A wait's stall is often charged to the instruction after it.
            after = rows[k + 1]["samples"] if k + 1 < len(rows) else 0.0
            print(
                f"  {r['line']:5d} {r['executed']:10.0f} {r['samples']:8.0f} {after:8.0f}  {r['sass'][:80]}",
                file=out,
            )
    if regions:
        print("\nregions (lines, samples, % of all):", file=out)
        for lo, hi in regions:
            s = sum(r["samples"] for r in rows if lo <= r["line"] <= hi)
            print(f"  {lo}-{hi}: {s:.0f} {pct(s):.1f}%", file=out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--regions", default="", help="line ranges, e.g. 700-745,746")
    ap.add_argument("--listing", help="also write every instruction, numbered, to this file")
    args = ap.parse_args(argv)
    try:
        kernel, rows = load(args.csv)
        regions = parse_regions(args.regions)
    except (OSError, ValueError) as e:
        print(f"ncu_stalls: {e}", file=sys.stderr)
        return 2
    report(kernel, rows, args.top, regions, sys.stdout)
    if args.listing:
        with open(args.listing, "w") as f:
            for r in rows:
                f.write(f"{r['line']:5d} {r['samples']:7.0f} {r['executed']:9.0f}  {r['sass']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
