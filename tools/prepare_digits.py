#!/usr/bin/env python3
"""Produce data/digits/digits.csv.gz, the UCI handwritten digits shipped with oar.

The file is copied byte for byte from scikit-learn's PyPI wheel (where it lives as
sklearn/datasets/data/digits.csv.gz); nothing is converted. Steps, exactly as run:

    pip download scikit-learn==1.9.1 --no-deps -d /tmp/skl
    python3 tools/prepare_digits.py /tmp/skl/scikit_learn-1.9.1-*.whl

The script takes the wheel path (any platform's wheel holds the same file), extracts that one
member, checks its SHA-256 and its shape (1797 rows of 64 pixels in 0..=16 plus a label in
0..=9), and writes it to data/digits/digits.csv.gz next to this repository's Cargo.toml.

Data: Optical Recognition of Handwritten Digits (test set of the UCI version), E. Alpaydin and
C. Kaynak, 1998, CC BY 4.0. See data/digits/README.md.
"""

import glob
import gzip
import hashlib
import pathlib
import sys
import zipfile

MEMBER = "sklearn/datasets/data/digits.csv.gz"
SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
OUT = pathlib.Path(__file__).resolve().parent.parent / "data" / "digits" / "digits.csv.gz"


def main() -> None:
    pattern = sys.argv[1] if len(sys.argv) > 1 else "/tmp/skl/scikit_learn-*.whl"
    wheels = sorted(glob.glob(pattern))
    if not wheels:
        sys.exit(f"no wheel matches {pattern}; run: pip download scikit-learn==1.9.1 --no-deps -d /tmp/skl")
    with zipfile.ZipFile(wheels[0]) as z:
        raw = z.read(MEMBER)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SHA256:
        sys.exit(f"{wheels[0]}:{MEMBER} has SHA-256 {digest}, expected {SHA256}")
    rows = [list(map(int, line.split(","))) for line in gzip.decompress(raw).decode().splitlines()]
    assert len(rows) == 1797, len(rows)
    assert all(len(r) == 65 and all(0 <= v <= 16 for v in r[:64]) and 0 <= r[64] <= 9 for r in rows)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(raw)
    print(f"wrote {OUT} ({len(raw)} bytes, sha256 {digest})")


if __name__ == "__main__":
    main()
