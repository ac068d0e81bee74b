"""tools/ncu_stalls.py on a synthetic Nsight Compute source page: the top instructions, opcode
sums, synchronization points and line regions it prints follow from the rows, and a file that is
not a source page is refused with exit code 2."""

import csv
import os
import random
import subprocess
import sys

import pytest

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


TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "tools", "ncu_stalls.py")


def make_rows(rng):
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
    return rows, wait_at, hot_samples


@pytest.mark.parametrize("seed", range(3))
def test_report(tmp_path, seed):
    rows, wait_at, hot_samples = make_rows(random.Random(seed))
    page = str(tmp_path / "src.csv")
    write_page(page, rows)
    lo, hi = 1, wait_at + 2  # lines are 1-based: the hot LDS is line wait_at + 2
    listing = str(tmp_path / "listing.txt")
    code, out, err = run(TOOL, page, "--top", "3", "--regions", f"{lo}-{hi},{hi}",
                         "--listing", listing)
    assert code == 0, err
    total = sum(r[1] for r in rows)
    assert f"{len(rows)} SASS instructions, {total} warp-stall samples" in out
    top_lines = [l for l in out.splitlines() if l.startswith("  ") and "LDS R188" in l]
    assert top_lines and top_lines[0].split()[0] == str(hi), "hottest instruction's line"
    mufu = sum(r[1] for r in rows if r[0].startswith("MUFU"))
    assert f"MUFU {mufu}" in out
    sync = [l for l in out.splitlines() if "BAR.SYNC.DEFER_BLOCKING 0x1" in l]
    # 777 executions, 3 samples, and the samples charged to the instruction after it
    assert sync and sync[0].split()[1:4] == ["777", "3", str(hot_samples)], sync
    region = sum(r[1] for r in rows[lo - 1 : hi])
    assert f"  {lo}-{hi}: {region} " in out and f"  {hi}-{hi}: {hot_samples} " in out
    with open(listing) as f:
        listed = f.read().splitlines()
    assert len(listed) == len(rows) and "LDS R188" in listed[hi - 1], \
        "the listing numbers the instructions as the report does"


def test_refuses_bad_input(tmp_path):
    bad = str(tmp_path / "bad.csv")
    with open(bad, "w") as f:
        f.write("ID,Kernel,Duration\n1,Demo,3.5\n")
    code, _, err = run(TOOL, bad)
    assert code == 2 and "not an ncu source page" in err, err
    page = str(tmp_path / "src.csv")
    write_page(page, make_rows(random.Random(0))[0])
    code, _, err = run(TOOL, page, "--regions", "9-3")
    assert code == 2, "a reversed region exits 2"


if __name__ == "__main__":  # the same as /usr/bin/python3 -m pytest THIS_FILE [options]
    sys.exit(pytest.main([__file__] + sys.argv[1:]))
