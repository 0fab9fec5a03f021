"""Full train epochs of real Indian Pines through PatchLoader, per engine and output dtype (p=13, batch 256).

    python benchmarks/bench_epoch.py [--device cpu|cuda] [--epochs 5]

Prints the best of N epochs (after one warm-up epoch that reads the tiles and builds pipelines).
"""

from __future__ import annotations

import argparse
import time

import torch

import hsgds
from hsgds.cli import demo_store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--epochs", type=int, default=5)
    args = ap.parse_args()
    store = demo_store()
    for engine in ("torch", "dali"):
        for dtype in (torch.float32, torch.bfloat16):
            try:
                loader = hsgds.PatchLoader(store, patch_size=13, batch_size=256, engine=engine,
                                           device=args.device, dtype=dtype)
            except hsgds.HsgdsError as exc:
                print(f"{engine:5s} {str(dtype):15s} skipped: {exc}")
                continue
            with loader:
                for _ in loader:  # warm-up
                    pass
                best, n = 0.0, 0
                for _ in range(args.epochs):
                    t, n = time.perf_counter(), 0
                    for patches, _ in loader:
                        n += len(patches)
                    if patches.is_cuda:
                        torch.cuda.synchronize()
                    best = max(best, n / (time.perf_counter() - t))
                print(f"{engine:5s} {str(dtype):15s} {best:10,.0f} patches/s  ({n} patches per epoch; "
                      f"reader {loader.stats.reader}, device {loader.stats.device})")


if __name__ == "__main__":
    main()
