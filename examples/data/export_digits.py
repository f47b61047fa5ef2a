"""Exports a real dataset for the C main job: the UCI handwritten digits that scikit-learn ships
(1797 8x8 images, 10 classes; no download needed), as a small binary file the C program reads.

Format (little-endian): magic "FP8AMPDS", uint32 version (1), uint32 rows, uint32 cols,
uint32 classes, float32 features[rows][cols], int32 labels[rows]. Rows are shuffled with a fixed
seed so that any prefix is a fair sample; the C side makes its own train/test split.

Usage: python3 export_digits.py OUT_FILE
"""
import struct
import sys

import numpy as np
from sklearn.datasets import load_digits


def main() -> None:
    out = sys.argv[1]
    digits = load_digits()
    x = digits.data.astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(12345).permutation(len(y))
    x, y = x[order], y[order]
    with open(out, "wb") as f:
        f.write(b"FP8AMPDS")
        f.write(struct.pack("<IIII", 1, x.shape[0], x.shape[1], int(y.max()) + 1))
        f.write(x.astype("<f4").tobytes())
        f.write(y.astype("<i4").tobytes())
    print(f"wrote {out}: {x.shape[0]} digits x {x.shape[1]} pixels, {int(y.max()) + 1} classes")


if __name__ == "__main__":
    main()
