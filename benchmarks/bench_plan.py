"""What planning a shuffled epoch costs when every pixel is a sample: PatchLoader(pixels="all", shuffle=True)
over one seeded scene of S x S pixels (default 2048 x 2048 x 32 uint16: 4.2M samples, 268 MB), a 64 MiB ring.

    python benchmarks/bench_plan.py [--side 2048] [--bands 32] [--epochs 2] [--json out.json]
    python benchmarks/bench_plan.py --held 4096x1024 [--bands 4] [--labelled 0.1] [--train 0.3] [--split train]

For each epoch: the time from asking for the epoch's first batch to getting it (the plan is made there),
then the time of the next 200 batches, and the peak RSS (VmHWM, reset at the start of each epoch) above
the RSS just before: what the epoch's plan and its first batches hold beyond the ring and the baseline.
An int64 order of every sample would be 8 bytes per sample (34 MB here); the plan keeps one generator
state per shuffle window and makes one window's order (8 bytes per pixel of at most half the ring's
tiles) at a time. Linux only (/proc/self/status, /proc/self/clear_refs).

``--held HxW`` measures instead what the samples of ``PatchLoader(pixels="all", split=...)`` hold over a
seeded H x W scene with ``--labelled`` of its pixels labelled (``--train`` of those in the train split, the
rest test): the bytes of the loader's sample arrays (per tile, plus one int64 per labelled pixel of the
other splits it leaves out) against those of the same pixels listed (:func:`hsgds.pixels.all_pixels`, a
per-pixel sample table), and the store's own sample table, read for the exclusions (README's figure:
``--held 4096x1024 --bands 4 --labelled 0.1 --train 0.3 --split train``; the bands do not change it).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import hsgds
from hsgds.preprocess.convert import ConvertOptions, convert


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # 5: VmHWM starts again from the current RSS
        f.write("5")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=int, default=2048)
    ap.add_argument("--bands", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--held", default=None, help="HxW: measure the memory of pixels='all' samples with a split")
    ap.add_argument("--labelled", type=float, default=0.1, help="--held: fraction of the pixels labelled")
    ap.add_argument("--train", type=float, default=0.3, help="--held: fraction of the labelled pixels in train")
    ap.add_argument("--split", default="train", help="--held: the loader's split")
    args = ap.parse_args()
    if args.held:
        held(args)
        return
    with tempfile.TemporaryDirectory(prefix="hsgds-bench-plan-") as tmp:
        cube = np.random.default_rng(0).integers(0, 4096, (args.side, args.side, args.bands), dtype=np.uint16)
        np.save(Path(tmp) / "cube.npy", cube)
        del cube
        store = convert(Path(tmp) / "cube.npy", Path(tmp) / "scene.zarr", ConvertOptions(max_patch=5))
        rows = []
        with hsgds.PatchLoader(store, patch_size=5, batch_size=256, pixels="all", shuffle=True, device="cpu",
                               ring_bytes=64 << 20, seed=0) as loader:
            samples = len(loader) * 256
            for epoch in range(args.epochs):
                loader.set_epoch(epoch)
                before = _status_mb("VmRSS:")
                _reset_peak()
                it = iter(loader)
                t = time.perf_counter()
                next(it)
                first = time.perf_counter() - t
                t = time.perf_counter()
                for _ in range(args.batches):
                    next(it)
                rest = time.perf_counter() - t
                peak = max(0.0, _status_mb("VmHWM:") - before)  # RSS may end below where it started
                del it
                rows.append({"epoch": epoch, "first_batch_s": first, "batches_per_s": args.batches / rest,
                             "peak_rss_above_start_MB": peak})
                print(f"epoch {epoch}: first batch {first:.2f} s (the plan is made here), then "
                      f"{args.batches / rest:,.0f} batches/s; peak RSS {peak:.0f} MB above the epoch's start "
                      f"(an int64 order would be {8 * samples / 1e6:.0f} MB)", flush=True)
    result = {"side": args.side, "bands": args.bands, "samples": samples, "ring_MiB": 64, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


def held(args: argparse.Namespace) -> None:
    """What the samples of a pixels='all' loader with a split hold, against the same pixels listed."""
    from hsgds.pixels import all_pixels
    from hsgds.synthetic import make_scene

    h, w = (int(v) for v in args.held.split("x"))
    with tempfile.TemporaryDirectory(prefix="hsgds-bench-held-") as tmp:
        cube, labels = make_scene(h, w, args.bands, classes=8, dtype="int16", seed=0, labelled_fraction=args.labelled)
        np.save(Path(tmp) / "cube.npy", cube)
        np.save(Path(tmp) / "gt.npy", labels)
        del cube
        store = convert(Path(tmp) / "cube.npy", Path(tmp) / "scene.zarr",
                        ConvertOptions(labels=Path(tmp) / "gt.npy", max_patch=5, train=args.train, val=0.0))
        with hsgds.PatchLoader(store, patch_size=5, batch_size=256, pixels="all", split=args.split, shuffle=False,
                               device="cpu", ring_bytes=64 << 20) as loader:
            grid = loader.samples
            grid_bytes = sum(a.nbytes for a in vars(grid).values() if isinstance(a, np.ndarray))
            listed = all_pixels(loader.scene, 1, args.split)
            table = sum(a.nbytes for a in loader.scene.sample_table().values())
            result = {"height": h, "width": w, "labelled": int(np.count_nonzero(labels)), "split": args.split,
                      "train_fraction": args.train, "samples": len(grid), "samples_held_MB": grid_bytes / 1e6,
                      "listed_MB": listed.nbytes / 1e6,
                      "listed_bytes_per_sample": (listed.nbytes - listed.offsets.nbytes) / len(listed),
                      "store_sample_table_MB": table / 1e6}
    print(f"{h}x{w}, {result['labelled']} labelled pixels, split={args.split!r}: {len(grid)} samples hold "
          f"{result['samples_held_MB']:.2f} MB, listed {result['listed_MB']:.1f} MB "
          f"({result['listed_bytes_per_sample']:.0f} B/sample); the store's sample table read for the "
          f"exclusions: {result['store_sample_table_MB']:.1f} MB", flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
