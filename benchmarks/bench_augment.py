"""What on-device augmentation costs: PatchLoader with and without Augment, and a DeepHyperX-style
DataLoader that augments per sample in Python on the CPU, in one run (Indian Pines, p=13, batch 256).

    python benchmarks/bench_augment.py [--device cpu|cuda] [--epochs 20] [--json out.json]

Augment(flip=True, rot90=True, radiation_noise=0.1, band_dropout=0.05), float32 NCHW, z-score, and each
part alone. All loaders are open at once and timed in rounds (one epoch of each per round, after a
warm-up epoch); prints the best epoch of each, the median per-round ratio to the plain loader, and
the ratio to the DeepHyperX-style loader.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))

from contenders import PatchDataset  # noqa: E402

import hsgds  # noqa: E402
from hsgds.cli import demo_store  # noqa: E402
from hsgds.pixels import labelled_pixels  # noqa: E402

AUGMENT = hsgds.Augment(flip=True, rot90=True, radiation_noise=0.1, band_dropout=0.05)
CONFIGS = {"hsgds": None, "hsgds+augment": AUGMENT, "flips+turns only": hsgds.Augment(flip=True, rot90=True),
           "radiation only": hsgds.Augment(radiation_noise=0.1), "dropout only": hsgds.Augment(band_dropout=0.05)}


class DeepHyperXAugmented(PatchDataset):
    """DeepHyperX's recipe per sample in numpy: random flips (and here quarter turns), radiation noise
    with probability 0.1 (alpha ~ U(0.9, 1.1), + N(0, 1)/25) and band dropout, in ``__getitem__``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rng = np.random.default_rng(0)

    def __getitem__(self, i: int):
        patch, label = super().__getitem__(i)
        x = patch.numpy()  # (B, p, p) float32
        rng = self.rng
        if rng.random() < 0.5:
            x = x[:, ::-1]
        if rng.random() < 0.5:
            x = x[:, :, ::-1]
        x = np.rot90(x, int(rng.integers(4)), axes=(1, 2))
        if rng.random() < 0.1:
            x = rng.uniform(0.9, 1.1) * x + rng.normal(size=x.shape).astype(np.float32) / 25
        keep = rng.random(x.shape[0]) >= 0.05
        x = x * keep[:, None, None]
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), label


def epoch_rate(batches) -> float:
    t, n = time.perf_counter(), 0
    for patches, _ in batches():
        n += len(patches)
    if patches.is_cuda:
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t)


def best_rate(batches, epochs: int) -> float:
    epoch_rate(batches)  # warm-up
    return max(epoch_rate(batches) for _ in range(epochs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--epochs", type=int, default=20, help="rounds: each round times one epoch of every loader")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    store = demo_store()
    scene = hsgds.open_scene(store)
    # every loader open at once; each round times one epoch of each in turn, so a noisy neighbour
    # slows the loaders of a round alike: the ratio per round, then its median
    loaders = {name: hsgds.PatchLoader(store, patch_size=13, batch_size=256, device=args.device, augment=aug)
               for name, aug in CONFIGS.items()}
    try:
        for loader in loaders.values():
            epoch_rate(lambda loader=loader: loader)  # warm-up: tiles read, kernels compiled
        rounds = [{name: epoch_rate(lambda loader=loader: loader) for name, loader in loaders.items()}
                  for _ in range(args.epochs)]
        reader, engine = loaders["hsgds"].stats.reader, loaders["hsgds"].stats.engine
        cut = next((r for r in loaders["hsgds+augment"].stats.reasons if r.startswith("CPU cut")), None)
    finally:
        for loader in loaders.values():
            loader.close()
    results = {name: max(r[name] for r in rounds) for name in CONFIGS}
    per_round = {name: float(np.median([r[name] / r["hsgds"] for r in rounds])) for name in CONFIGS if name != "hsgds"}
    # the same split and normalization, cut from the reflect-padded cube in RAM, one sample at a time
    offset, scale = hsgds.normalization_constants(scene, "zscore")
    sample = labelled_pixels(scene, "train")
    h, w = scene.shape[:2]
    cube = np.pad(scene.read(0, h, 0, w), ((6, 6), (6, 6), (0, 0)), mode="reflect")
    ds = DeepHyperXAugmented(cube, sample.scene_y, sample.scene_x, sample.label, 13, offset, scale, torch.float32)
    loader = DataLoader(ds, batch_size=256, shuffle=True, num_workers=0)
    results["deephyperx-style"] = best_rate(lambda: loader, args.epochs)
    ratios = {"augment / plain (median of rounds)": per_round["hsgds+augment"],
              "augment / plain (best epochs)": results["hsgds+augment"] / results["hsgds"],
              "augment / deephyperx-style": results["hsgds+augment"] / results["deephyperx-style"],
              **{f"{name} / plain (median of rounds)": v for name, v in per_round.items() if name != "hsgds+augment"}}
    for k, v in results.items():
        print(f"{k:24s} {v:12,.0f} patches/s (best epoch)")
    for k, v in ratios.items():
        print(f"{k:44s} {v:6.2f}x")
    print(f"reader {reader}, engine {engine}, device {args.device}; {cut}; {args.epochs} rounds")
    if args.json:
        args.json.write_text(json.dumps({"patches_per_s": results, "ratios": ratios, "rounds": rounds,
                                         "reader": reader, "engine": engine, "cpu_cut": cut,
                                         "device": args.device}, indent=2))


if __name__ == "__main__":
    main()
