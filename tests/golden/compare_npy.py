#!/usr/bin/env python3
"""Compares two logits arrays: relative L2 error and argmax agreement.

    python3 tests/golden/compare_npy.py OURS.npy REF.npy [--tol 1e-5]

Prints ||a - b|| / ||b|| (b is the reference), the largest absolute difference,
and in how many rows (last axis = vocabulary) the argmax agrees. Exits 1 when
the relative error is above --tol, when any value is NaN or infinite, or when
the shapes differ; 0 otherwise. Argmax disagreement is reported, not failed on
by default (near ties may flip legitimately); --require-argmax makes it fatal.
"""

import argparse
import sys

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="array under test (.npy)")
    parser.add_argument("b", help="reference array (.npy)")
    parser.add_argument("--tol", type=float, default=1e-5, help="largest relative L2 error accepted")
    parser.add_argument("--require-argmax", action="store_true", help="also fail if any row's argmax differs")
    args = parser.parse_args()

    a = np.load(args.a).astype(np.float64)
    b = np.load(args.b).astype(np.float64)
    if a.shape != b.shape:
        print(f"shape mismatch: {args.a} {a.shape} vs {args.b} {b.shape}")
        return 1
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        print(f"non-finite values: {args.a} has {np.sum(~np.isfinite(a))}, {args.b} has {np.sum(~np.isfinite(b))}")
        return 1
    ref_norm = np.linalg.norm(b)
    rel = np.linalg.norm(a - b) / ref_norm if ref_norm > 0 else np.linalg.norm(a)
    max_abs = float(np.max(np.abs(a - b))) if a.size else 0.0
    rows_a = a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)
    rows_b = b.reshape(-1, b.shape[-1]) if b.ndim else b.reshape(1, 1)
    same = rows_a.argmax(-1) == rows_b.argmax(-1)
    print(f"rel_l2 {rel:.3e}  max_abs {max_abs:.3e}  argmax {int(same.sum())}/{same.size}"
          + ("" if same.all() else f" (first mismatch at row {int(np.argmin(same))})"))
    failed = rel > args.tol or (args.require_argmax and not same.all())
    if failed:
        print(f"FAIL (tol {args.tol:g})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
