#!/usr/bin/env python3
"""Where the warps of each profiled kernel wait: reads the per-instruction export of an Nsight Compute
report (`ncu -i REPORT --page source --print-source sass --csv > FILE`) and prints, per kernel launch,
the sampled stall reasons that dominate and the instructions that collect the most samples.

  tools/ncu-stalls.py FILE [--top N]

Reasons, as Nsight Compute names them: barrier (waiting at __syncthreads for other warps), long_sb (a
global-memory load not back yet), short_sb (shared memory), no_inst (instruction fetch: code not in the
instruction cache), wait (fixed-latency dependency), mio (shared-memory or special-function queue)."""
import argparse
import csv
import sys


def launches(path):
    """Yields (kernel name, header, instruction rows) for each launch in the export."""
    name, head, rows = None, None, []
    with open(path, newline="") as f:
        for r in csv.reader(f):
            if not r:
                continue
            if r[0] == "Kernel Name":
                if head:
                    yield name, head, rows
                name, head, rows = r[1], None, []
            elif r[0] == "Address":
                head = r
            elif head:
                rows.append(r)
    if head:
        yield name, head, rows


def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--top", type=int, default=8, help="instructions shown per launch (default 8)")
    a = ap.parse_args()
    try:
        found = list(launches(a.file))
    except OSError as e:
        sys.exit(f"ncu-stalls: {e}")
    if not found:
        sys.exit(f"ncu-stalls: {a.file}: no 'Kernel Name' / 'Address' rows (not an ncu --page source --csv export?)")
    last = None
    for name, head, rows in found:
        key = (name, len(rows), tuple(r[0] for r in rows[:4]))
        if key == last:  # the export lists some launches twice
            continue
        last = key
        if "Warp Stall Sampling (All Samples)" not in head or "Source" not in head:
            sys.exit(f"ncu-stalls: {a.file}: no warp stall samples (profile with --set full)")
        samp, src = head.index("Warp Stall Sampling (All Samples)"), head.index("Source")
        reasons = [(i, c[len("stall_"):]) for i, c in enumerate(head) if c.startswith("stall_") and "Not Issued" not in c]
        total = sum(num(r[samp]) for r in rows)
        if total < 20:  # too few samples to say anything
            continue
        by = sorted(((sum(num(r[i]) for r in rows), c) for i, c in reasons), reverse=True)
        short = name.replace("(int)", "").replace("(bool)", "").split("(")[0].replace("void ", "")
        print(f"== {short} ({len(rows)} instructions, {int(total)} samples)")
        print("   " + ", ".join(f"{c} {100 * v / total:.0f}%" for v, c in by[:5] if v > 0))
        for k in sorted(sorted(range(len(rows)), key=lambda k: -num(rows[k][samp]))[: a.top]):
            r = rows[k]
            top = max(((num(r[i]), c) for i, c in reasons), default=(0, ""))
            print(f"   {k:6d}  {num(r[samp]) / total * 100:5.1f}%  {top[1]:12s} {r[src].strip()[:70]}")


if __name__ == "__main__":
    main()
