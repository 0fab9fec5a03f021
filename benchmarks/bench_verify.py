"""What checking every tile read costs: loader-only throughput with and without checking, side by side.

    python benchmarks/bench_verify.py [--device auto|cpu|cuda] [--batches 256,4096] [--epochs 5] [--tiny]

``--tiny`` (a smoke test) reads a 96 x 96 x 8 store of 16 tiles through a ring of 8, at batches 64 and 256 unless
``--batches`` says otherwise (a batch of 4096 needs more tiles resident than that ring holds).

The reader is the one the machine picks (kvikio on a GPU machine: the device ``wsum64`` checksum; POSIX on the
CPU: crc32c on the host). A synthetic store (1024 x 1024 x 64 int16, 81 tiles of 2 MiB, every pixel labelled)
is read through a ring of 16 tiles (samples shuffled within windows of 4 tiles), so every epoch reads every tile again and the checks run every
epoch (tiles are checked once per read, not per batch). For each batch size, one loader with checking
(``verify_reads=True``, the default) and one without (``verify_reads=False``) are built; after a warm-up epoch
each, their epochs alternate in rounds (checked then unchecked, then the other way round) so that both see
the same machine state. Reported: the median patches/s of each and their ratio (the target is >= 0.98), and
the ratio within each round (median, min, max): on a loader bound by host Python the epochs vary by about
±10% (the GPU run of 2026-12-04), and the spread of the rounds shows whether a ratio stands out of that.

Prints one JSON document on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import hsgds
from hsgds import defaults

TARGET = 0.98


def log(msg: str) -> None:
    print(f"[bench_verify {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_store(root: Path, tiny: bool) -> Path:
    from hsgds.preprocess.convert import ConvertOptions, convert

    h, w, b, tile = (96, 96, 8, 28) if tiny else (1024, 1024, 64, 124)  # tiles of (tile + 4)^2 * b * 2 bytes
    rng = np.random.default_rng(0)
    np.save(root / "cube.npy", rng.integers(0, 4096, (h, w, b), dtype=np.int16))
    np.save(root / "gt.npy", rng.integers(1, 4, (h, w), dtype=np.int32))
    return convert(root / "cube.npy", root / "store.zarr",
                   ConvertOptions(labels=root / "gt.npy", max_patch=5, tile=tile))


def epoch(loader) -> tuple[float, int, int]:
    """One loader-only epoch: (patches/s, patches, tiles read)."""
    tiles0 = loader.stats.tiles_loaded
    t0, n = time.perf_counter(), 0
    patches = None
    for patches, _ in loader:
        n += len(patches)
    if patches is not None and patches.is_cuda:
        torch.cuda.synchronize(patches.device)
    return n / (time.perf_counter() - t0), n, loader.stats.tiles_loaded - tiles0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batches", default=None, help="batch sizes, comma-separated (default: 256,4096; "
                    "with --tiny 64,256, which its ring of 8 tiles holds)")
    ap.add_argument("--epochs", type=int, default=9, help="rounds: one checked and one unchecked epoch each")
    ap.add_argument("--tiny", action="store_true", help="a small store for a smoke test")
    args = ap.parse_args()
    device = None if args.device == "auto" else args.device
    batches = [int(b) for b in (args.batches or ("64,256" if args.tiny else "256,4096")).split(",")]
    with tempfile.TemporaryDirectory(prefix="hsgds-bench-verify-") as tmp:
        t = time.perf_counter()
        store = make_store(Path(tmp), args.tiny)
        scene = hsgds.open_scene(store)
        grid = scene.grid
        ring_tiles = 8 if args.tiny else 16  # samples mixed over a quarter of it: a batch of 4096 fits
        log(f"store {grid.height}x{grid.width}x{grid.bands} {grid.dtype}: {grid.num_tiles} tiles of "
            f"{grid.tile_nbytes} bytes, converted in {time.perf_counter() - t:.1f} s; ring of {ring_tiles} tiles")
        rows, ratios, round_ratios, meta = [], {}, {}, {}
        for batch in batches:
            loaders = {}
            for verify in (True, False):
                with defaults.set(verify_reads=verify):
                    loaders[verify] = hsgds.PatchLoader(store, patch_size=5, batch_size=batch, split=None,
                                                        device=device, ring_bytes=ring_tiles * grid.tile_nbytes,
                                                        shuffle_window=ring_tiles // 4, seed=1)
            try:
                speeds: dict[bool, list[float]] = {True: [], False: []}
                counts: dict[bool, tuple[int, int]] = {}
                for loader in loaders.values():
                    epoch(loader)  # warm-up: kernels, pinned buffers, kvikio's pool, page cache
                for r in range(args.epochs):
                    # which loader goes first alternates, so that a drift within a round favours neither
                    for verify in ((True, False) if r % 2 == 0 else (False, True)):
                        speed, n, tiles = epoch(loaders[verify])
                        speeds[verify].append(speed)
                        counts[verify] = (n, tiles)
                st = loaders[True].stats
                meta = {"device": st.device, "reader": st.reader, "engine": st.engine}
                for verify in (True, False):
                    med = statistics.median(speeds[verify])
                    rows.append({"batch": batch, "verify": verify, "patches_per_epoch": counts[verify][0],
                                 "tiles_read_last_epoch": counts[verify][1],
                                 "patches_per_s": [round(s) for s in speeds[verify]],
                                 "median_patches_per_s": round(med)})
                    log(f"batch {batch} verify={int(verify)}: median {med:,.0f} patches/s "
                        f"({counts[verify][1]} tiles read per epoch; reader {st.reader})")
                ratios[str(batch)] = round(statistics.median(speeds[True]) / statistics.median(speeds[False]), 4)
                pairs = [c / u for c, u in zip(speeds[True], speeds[False])]  # one per round: the noise's scale
                round_ratios[str(batch)] = {"median": round(statistics.median(pairs), 4),
                                            "min": round(min(pairs), 4), "max": round(max(pairs), 4)}
            finally:
                for loader in loaders.values():
                    loader.close()
    doc = {"benchmark": "bench_verify", **meta,
           "store": {"shape": [grid.height, grid.width, grid.bands], "dtype": grid.dtype,
                     "tiles": grid.num_tiles, "tile_bytes": grid.tile_nbytes, "ring_tiles": ring_tiles},
           "epochs": args.epochs, "rows": rows, "ratio_checked_vs_unchecked": ratios,
           "ratio_per_round": round_ratios, "target": TARGET,
           "meets_target": {b: r >= TARGET for b, r in ratios.items()}}
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
