#!/usr/bin/env python3
"""Runs every fixture model (tests/fixtures/models/*, tests/fixtures/gguf/*) through `sluice logits` and
compares the logits with the reference ones (for bf16 checkpoints, those recomputed from the stored
weights, as the test suite does): a table of prefill/decode rel-L2 and argmax agreement.
Needs only a sluice binary and the Python standard library (for a machine without the test suite).

  tools/check-fixtures.py SLUICE [--backend cuda] [--tol 3e-2]

Exits nonzero when a fixture fails (rel-L2 above the tolerance or argmax equal at < 95% of rows)."""
import argparse
import array
import glob
import json
import math
import os
import subprocess
import sys
import tempfile


def read_f32(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a


def rel_l2(got, ref):
    num = sum((g - r) * (g - r) for g, r in zip(got, ref))
    den = sum(r * r for r in ref)
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def argmax_agree(got, ref, vocab):
    rows = len(ref) // vocab
    same = 0
    for i in range(rows):
        g = got[i * vocab:(i + 1) * vocab]
        r = ref[i * vocab:(i + 1) * vocab]
        same += max(range(vocab), key=g.__getitem__) == max(range(vocab), key=r.__getitem__)
    return same, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sluice")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--tol", type=float, default=3e-2)
    ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
    a = ap.parse_args()
    dirs = sorted(glob.glob(os.path.join(a.fixtures, "models", "*", "expected.json")))
    dirs += sorted(glob.glob(os.path.join(a.fixtures, "gguf", "*", "expected.json")))
    print(f"{'fixture':28s} {'prefill rel-L2':>14s} {'decode rel-L2':>14s} {'argmax':>10s}  result")
    failed = 0
    for ej in dirs:
        d = os.path.dirname(ej)
        e = json.load(open(ej))
        model = os.path.join(d, "model.gguf") if os.path.exists(os.path.join(d, "model.gguf")) else d
        name = os.path.basename(d)
        with tempfile.NamedTemporaryFile(suffix=".f32") as out:
            cmd = [a.sluice, "logits", model, "--ids", ",".join(map(str, e["prompt_ids"])), "--decode-ids",
                   ",".join(map(str, e["decode_ids"])), "--out", out.name, "--backend", a.backend]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{name:28s} sluice failed: {r.stderr.strip()[:200]}")
                failed += 1
                continue
            got = read_f32(out.name)
        vocab = e["vocab_size"]
        pre = read_f32(os.path.join(d, e["logits_prefill"]["file"]))
        dec = read_f32(os.path.join(d, e["logits_decode"]["file"]))
        stored = os.path.join(d, "logits_stored_weights.f32")
        if os.path.exists(stored):  # bf16 checkpoints: the reference recomputed from the stored weights
            both = read_f32(stored)
            pre, dec = both[:len(pre)], both[len(pre):]
        if len(got) != len(pre) + len(dec):
            print(f"{name:28s} wrong logits size {len(got)} (expected {len(pre) + len(dec)})")
            failed += 1
            continue
        rp = rel_l2(got[:len(pre)], pre)
        rd = rel_l2(got[len(pre):], dec)
        s1, n1 = argmax_agree(got[:len(pre)], pre, vocab)
        s2, n2 = argmax_agree(got[len(pre):], dec, vocab)
        ok = rp <= a.tol and rd <= a.tol and (s1 + s2) >= 0.95 * (n1 + n2)
        failed += not ok
        print(f"{name:28s} {rp:14.2e} {rd:14.2e} {s1 + s2:5d}/{n1 + n2:<4d}  {'pass' if ok else 'FAIL'}")
    print(f"{len(dirs) - failed} of {len(dirs)} fixtures pass on {a.backend}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
