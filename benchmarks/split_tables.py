"""The split tables of docs/splits.md: what ``--split blocks`` gives on Indian Pines and two synthetic scenes.

For each scene and train target T: the block size chosen, the train share of the labelled pixels, the
classes left without a test pixel (of 100+ pixels, and all), the labelled pixels the guard drops, and
an independent check that no test pixel lies within 2h of a train pixel (scipy's chessboard distance
transform). Also the leakage of a random split for the same T (test pixels whose patch overlaps a train
patch), the optimism the block split removes.

    python benchmarks/split_tables.py [--halo 7] [--seed 0] [--val 0]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from scipy.ndimage import distance_transform_cdt

from hsgds.datasets import indian_pines_files
from hsgds.format import SPLIT_NONE, SPLIT_TEST, SPLIT_TRAIN, SPLIT_VAL
from hsgds.preprocess.splits import block_split_details, random_split
from hsgds.synthetic import make_scene, pavia_like_labels

TRAINS = (0.05, 0.1, 0.3, 0.5)


def scenes() -> dict[str, np.ndarray]:
    return {
        "Indian Pines (145x145, 16 classes)": np.load(indian_pines_files()[1], allow_pickle=False),
        "Pavia-like synthetic (305x170, 9 classes, elongated)": pavia_like_labels(seed=0),
        "blob synthetic (160x160, 8 classes)": make_scene(160, 160, 2, classes=8, seed=3)[1],
    }


def row(labels: np.ndarray, train: float, val: float, halo: int, seed: int) -> dict:
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unsplit classes are reported in the table
        r = block_split_details(labels, train=train, val=val, guard=halo, seed=seed)
    elapsed = time.perf_counter() - t0
    split = r.split
    labelled = labels != 0
    n = int(labelled.sum())
    classes = np.unique(labels[labelled])
    no_test = [int(c) for c in classes if not ((labels == c) & (split == SPLIT_TEST)).any()]
    big = [c for c in no_test if (labels == c).sum() >= 100]
    n_big = sum(1 for c in classes if (labels == c).sum() >= 100)
    dist = distance_transform_cdt(split != SPLIT_TRAIN, metric="chessboard")
    leaks = int((((split == SPLIT_TEST) | (split == SPLIT_VAL)) & (dist <= 2 * halo)).sum())
    rnd = random_split(labels, train=train, val=val, seed=seed)
    rdist = distance_transform_cdt(rnd != SPLIT_TRAIN, metric="chessboard")
    r_test = rnd == SPLIT_TEST
    return {
        "block": r.block_size, "share": (split == SPLIT_TRAIN).sum() / n, "val": (split == SPLIT_VAL).sum() / n,
        "test": (split == SPLIT_TEST).sum() / n, "no_test_big": f"{len(big)} of {n_big}",
        "no_test_all": f"{len(no_test)} of {len(classes)}" + (f" ({', '.join(map(str, no_test))})" if no_test else ""),
        "lost": int((labelled & (split == SPLIT_NONE)).sum()), "n": n, "leaks": leaks,
        "random_leaky": (r_test & (rdist <= 2 * halo)).sum() / max(1, r_test.sum()), "s": elapsed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--halo", type=int, default=7, help="patch radius h (15x15 patches: 7)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--val", type=float, default=0.0)
    args = ap.parse_args()
    p = 2 * args.halo + 1
    for name, labels in scenes().items():
        print(f"\n### {name}, {p}x{p} patches (guard {2 * args.halo} px), seed {args.seed}"
              + (f", val {args.val}" if args.val else "") + "\n")
        print("| T | block | train share | " + ("val share | " if args.val else "") + "test share | "
              "classes (100+ px) without test | all classes without test | labelled pixels lost to the guard | "
              "test within 2h of train | random split: test patches overlapping train |")
        print("|---|---:|---:|" + ("---:|" if args.val else "") + "---:|---:|---|---:|---:|---:|")
        for t in TRAINS:
            r = row(labels, t, args.val, args.halo, args.seed)
            val = f"{r['val']:.3f} | " if args.val else ""
            print(f"| {t} | {r['block']} | {r['share']:.3f} | {val}{r['test']:.3f} | {r['no_test_big']} | "
                  f"{r['no_test_all']} | {r['lost']:,} of {r['n']:,} ({100 * r['lost'] / r['n']:.0f}%) | "
                  f"{r['leaks']} | {100 * r['random_leaky']:.0f}% |")


if __name__ == "__main__":
    main()
