"""What planning a shuffled epoch costs when every pixel is a sample: PatchLoader(pixels="all", shuffle=True)
over one seeded scene of S x S pixels (default 2048 x 2048 x 32 uint16: 4.2M samples, 268 MB), a 64 MiB ring.

    python benchmarks/bench_plan.py [--side 2048] [--bands 32] [--epochs 2] [--json out.json]
    python benchmarks/bench_plan.py --shares [STORE] [--json out.json]
    python benchmarks/bench_plan.py --held 4096x1024 [--bands 4] [--labelled 0.1] [--train 0.3] [--split train] [--swath]

For each epoch: the time from asking for the epoch's first batch to getting it (the plan is made there),
then the time of the next 200 batches, and the peak RSS (VmHWM, reset at the start of each epoch) above
the RSS just before: what the epoch's plan and its first batches hold beyond the ring and the baseline.
An int64 order of every sample would be 8 bytes per sample (34 MB here); the plan keeps one generator
state per shuffle window and makes one window's order (8 bytes per pixel of at most half the ring's
tiles) at a time. Linux only (/proc/self/status, /proc/self/clear_refs).

``--shares [STORE]`` measures how evenly ranks share an epoch (its train split; without STORE a seeded labelled
scene of 610 x 340 x 16 in 60-pixel tiles): for 2, 4 and 8 ranks over 20 epochs, the samples repeated to give every rank the
same number of batches, and each rank's batch count, for the plan (equal shares of samples, a tile on a
cut read by two ranks) and, side by side, for dealing whole tiles to the least-loaded rank (hsgds before).

``--held HxW`` measures instead what the samples of ``PatchLoader(pixels="all", split=...)`` hold over a
seeded H x W scene with ``--labelled`` of its pixels labelled (``--train`` of those in the train split, the
rest test): the bytes of the loader's sample arrays (per tile, plus one int64 per labelled pixel of the
other splits it leaves out) against those of the same pixels listed (:func:`hsgds.pixels.all_pixels`, a
per-pixel sample table), and the store's own sample table, read for the exclusions (README's figure:
``--held 4096x1024 --bands 4 --labelled 0.1 --train 0.3 --split train``; the bands do not change it).
"""

from __future__ import annotations

import argparse
import heapq
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
    ap.add_argument("--swath", action="store_true",
                    help="--held: no data (-9999, converted with --nodata) outside a swath rotated ~7 degrees")
    ap.add_argument("--shares", nargs="?", const="", default=None, metavar="STORE",
                    help="measure how evenly ranks share an epoch (of STORE's train split, or a seeded scene's)")
    args = ap.parse_args()
    if args.shares is not None:
        shares(args)
        return
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


def _whole_tiles(counts: np.ndarray, order: np.ndarray, world: int) -> list[int]:
    """Each rank's samples when tiles are dealt whole, in ``order``, each to the rank with the fewest samples
    so far (the lowest on a tie): the sharding hsgds used before equal shares."""
    heap = [(0, r) for r in range(world)]
    loads = [0] * world
    for t in order.tolist():
        load, r = heap[0]
        loads[r] += int(counts[t])
        heapq.heapreplace(heap, (load + int(counts[t]), r))
    return loads


def shares(args: argparse.Namespace) -> None:
    """Samples repeated per epoch to even out the ranks: the plan's equal shares against whole tiles."""
    from hsgds.sampling import plan_epoch
    from hsgds.synthetic import make_scene

    with tempfile.TemporaryDirectory(prefix="hsgds-bench-shares-") as tmp:
        store = args.shares
        if not store:
            cube, labels = make_scene(610, 340, 16, classes=9, dtype="int16", seed=0, labelled_fraction=0.3)
            np.save(Path(tmp) / "cube.npy", cube)
            np.save(Path(tmp) / "gt.npy", labels)
            store = convert(Path(tmp) / "cube.npy", Path(tmp) / "scene.zarr",
                            ConvertOptions(labels=Path(tmp) / "gt.npy", max_patch=5, tile=60))
        with hsgds.PatchLoader(store, patch_size=3, batch_size=256, split="train", device="cpu") as loader:
            samples, n = loader.samples, len(loader.samples)
    counts = samples.counts()
    tiles = np.flatnonzero(counts)
    rows = []
    for world in (2, 4, 8):
        equal, whole, batches = [], [], []
        for epoch in range(20):
            plans = [plan_epoch(samples, batch_size=256, seed=0, epoch=epoch, shuffle=True, slots=len(counts),
                                rank=r, world_size=world) for r in range(world)]
            equal.append(sum(len(p.order) for p in plans) - n)
            batches.append(plans[0].num_batches)
            if len(tiles) >= world:  # (fewer tiles than ranks were refused)
                loads = _whole_tiles(counts, np.random.default_rng([0, epoch]).permutation(tiles), world)
                whole.append(world * max(loads) - n)
        row = {"world_size": world, "samples": n, "tiles": len(tiles),
               "equal_shares_repeated_mean": float(np.mean(equal)), "equal_shares_repeated_max": max(equal),
               "whole_tiles_repeated_mean": float(np.mean(whole)) if whole else None,
               "whole_tiles_repeated_max": max(whole) if whole else None,
               "batches_per_rank": [min(batches), max(batches)]}
        rows.append(row)
        print(f"{world} ranks, {n} train samples in {len(tiles)} tiles: repeated per epoch (mean / max of 20): "
              f"equal shares {row['equal_shares_repeated_mean']:.0f} / {row['equal_shares_repeated_max']} "
              f"({100 * row['equal_shares_repeated_max'] / n:.2f}%), whole tiles "
              + (f"{np.mean(whole):.0f} / {max(whole)} ({100 * max(whole) / n:.1f}%)" if whole else
                 "refused (fewer tiles than ranks)")
              + f"; batches per rank {min(batches)}-{max(batches)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"store": str(args.shares or "seeded 610x340x16"), "rows": rows}, indent=2))


def held(args: argparse.Namespace) -> None:
    """What the samples of a pixels='all' loader with a split hold, against the same pixels listed."""
    from hsgds.pixels import all_pixels
    from hsgds.synthetic import make_scene

    h, w = (int(v) for v in args.held.split("x"))
    with tempfile.TemporaryDirectory(prefix="hsgds-bench-held-") as tmp:
        cube, labels = make_scene(h, w, args.bands, classes=8, dtype="int16", seed=0, labelled_fraction=args.labelled)
        gaps = None
        if args.swath:  # a flight line's raster: data in a slanted band, the fill value around it
            y, x = np.mgrid[:h, :w]
            gaps = (x < y // 8 + w // 8) | (x > y // 8 + w // 2)
            cube[gaps], labels[gaps] = -9999, 0
        np.save(Path(tmp) / "cube.npy", cube)
        np.save(Path(tmp) / "gt.npy", labels)
        del cube
        store = convert(Path(tmp) / "cube.npy", Path(tmp) / "scene.zarr",
                        ConvertOptions(labels=Path(tmp) / "gt.npy", max_patch=5, train=args.train, val=0.0,
                                       nodata=-9999.0 if args.swath else None))
        with hsgds.PatchLoader(store, patch_size=5, batch_size=256, pixels="all", split=args.split, shuffle=False,
                               device="cpu", ring_bytes=64 << 20) as loader:
            grid = loader.samples
            grid_bytes = sum(a.nbytes for a in vars(grid).values() if isinstance(a, np.ndarray))
            listed = all_pixels(loader.scene, 1, args.split)
            table = sum(a.nbytes for a in loader.scene.sample_table().values())
            result = {"height": h, "width": w, "labelled": int(np.count_nonzero(labels)), "split": args.split,
                      "nodata_pixels": 0 if gaps is None else int(gaps.sum()),
                      "train_fraction": args.train, "samples": len(grid), "samples_held_MB": grid_bytes / 1e6,
                      "listed_MB": listed.nbytes / 1e6,
                      "listed_bytes_per_sample": (listed.nbytes - listed.offsets.nbytes) / len(listed),
                      "store_sample_table_MB": table / 1e6}
    print(f"{h}x{w}, {result['labelled']} labelled pixels, {result['nodata_pixels']} nodata pixels, "
          f"split={args.split!r}: {len(grid)} samples hold "
          f"{result['samples_held_MB']:.2f} MB, listed {result['listed_MB']:.1f} MB "
          f"({result['listed_bytes_per_sample']:.0f} B/sample); the store's sample table read for the "
          f"exclusions: {result['store_sample_table_MB']:.1f} MB", flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
