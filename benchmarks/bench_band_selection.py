"""Band selections in the fused CPU cut: register blocks over runs of consecutive bands vs the scratch path.

    python benchmarks/bench_band_selection.py [--reps 30] [--store ip.zarr] [--json out.json]

Kernel part (white-box, one thread, side by side in one run): Indian Pines-shaped batches (256 patches of
13 x 13 from a uint16 ring of 4 tiles of 157 px x 200 bands, float32 NCHW) cut by ``cpu_cut.cut_range``
for each band selection twice, alternated: with the tables as ``make_tables`` builds them (8 x 8 register
blocks straight from the tile wherever every run of consecutive stored bands has 8 or more) and with
their block plan removed (``block_count`` 0: every patch through the pixel-major scratch and its
transpose, the only path for band selections before). Prints the median µs per batch and the ratio.
With ``--store``: the loader's patches/s over that store for each selection (float32, best of 4 epochs,
``split=None``), in the same run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from hsgds.engines import cpu_cut

P, BANDS, SIDE, SLOTS, N = 13, 200, 157, 4, 256
SELECTIONS = {
    "all 200 bands": list(range(BANDS)),
    "190: bands 100-109 dropped": [b for b in range(BANDS) if not 100 <= b < 110],
    "50: bands 10-59": list(range(10, 60)),
    "50: every 4th band": list(range(0, BANDS, 4)),
}


def kernel_rows(reps: int) -> list[dict]:
    rng = np.random.default_rng(0)
    ring = rng.integers(0, 9000, (SLOTS, SIDE, SIDE, BANDS)).astype(np.uint16).reshape(-1)
    r = P // 2
    slot, y, x = rng.integers(0, SLOTS, N), rng.integers(r, SIDE - r, N), rng.integers(r, SIDE - r, N)
    base = ((slot * SIDE + (y - r)) * SIDE + (x - r)).astype(np.int64) * BANDS
    rows = []
    for name, band in SELECTIONS.items():
        b = len(band)
        tables = cpu_cut.make_tables(SIDE, BANDS, [band], rng.uniform(100, 5000, (1, b)),
                                     1 / rng.uniform(50, 2000, (1, b)), np.float32)
        scratch = tables._replace(block_count=np.zeros_like(tables.block_count))
        out = np.empty(N * b * P * P, np.float32)
        stream = cpu_cut.should_stream(out.nbytes, True)
        times: dict[str, list[float]] = {"blocks": [], "scratch": []}
        for rep in range(reps + 3):
            for path, tb in (("blocks", tables), ("scratch", scratch)):
                t0 = time.perf_counter()
                cpu_cut.cut_range(ring, base, None, None, tb, out, P, True, 0, 0, N, stream)
                if rep >= 3:  # the first ones load the kernel and warm the caches
                    times[path].append(time.perf_counter() - t0)
        med = {k: 1e6 * float(np.median(v)) for k, v in times.items()}
        rows.append({"selection": name, "bands": b, "register_blocks": int(tables.block_count[0]) > 0,
                     "blocks_us": med["blocks"], "scratch_us": med["scratch"],
                     "speedup": med["scratch"] / med["blocks"],
                     "blocks_GBps": out.nbytes / med["blocks"] / 1e3})
    return rows


def loader_rows(store: Path) -> list[dict]:
    import torch

    import hsgds

    rows = []
    for name, band in SELECTIONS.items():
        with hsgds.PatchLoader(store, patch_size=P, batch_size=N, split=None, dtype=torch.float32,
                               bands=None if len(band) == BANDS else band) as loader:
            best = 0.0
            for epoch in range(4):
                loader.set_epoch(epoch)
                t0, n = time.perf_counter(), 0
                for patches, _ in loader:
                    n += len(patches)
                best = max(best, n / (time.perf_counter() - t0))
            rows.append({"selection": name, "patches_per_s": best, "engine": loader.stats.engine,
                         "reader": loader.stats.reader})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--store", type=Path, help="an Indian Pines store (200 bands) for the loader part")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not cpu_cut.available():
        raise SystemExit(cpu_cut.unavailable_reason())
    result: dict = {"batch": [N, "B", P, P], "reps": args.reps, "kernel": kernel_rows(args.reps)}
    for row in result["kernel"]:
        print(f"{row['selection']:28s} blocks {row['blocks_us']:7.0f} us  scratch {row['scratch_us']:7.0f} us  "
              f"x{row['speedup']:.2f}" + ("" if row["register_blocks"] else "  (no run of 8: scratch both times)"))
    if args.store:
        result["loader"] = loader_rows(args.store)
        for row in result["loader"]:
            print(f"loader {row['selection']:28s} {row['patches_per_s']:9,.0f} patches/s "
                  f"({row['reader']} reader, {row['engine']} engine)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
