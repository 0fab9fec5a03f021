"""What source nodata costs the converter: the same seeded flight-line-like cube (data inside a slanted swath,
-9999 in every band outside it) converted with its nodata applied (``--nodata -9999``: found per tile, left out
of the statistics, its tiles filled with the train mean and written again) and ignored (``--nodata none``),
alternating in one run, best of ``--repeats``.

    python benchmarks/bench_convert_nodata.py --height 1536 --width 1024 --bands 128 --out benchmarks/results/convert_nodata
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from hsgds.preprocess.convert import ConvertOptions, convert
from hsgds.scene import open_scene


def swath_cube(path: Path, h: int, w: int, b: int, seed: int = 0) -> float:
    """Write the cube as .npy row block by row block (memory stays small); returns its nodata share."""
    rng = np.random.default_rng(seed)
    cube = np.lib.format.open_memmap(path, mode="w+", dtype=np.int16, shape=(h, w, b))
    y, x = np.mgrid[:h, :w]
    gaps = (x < y // 3 + w // 8) | (x > y // 3 + w // 2)  # a swath rotated ~18 degrees
    for y0 in range(0, h, 128):
        block = rng.integers(100, 4000, (min(128, h - y0), w, b), dtype=np.int16)
        block[gaps[y0:y0 + 128]] = -9999
        cube[y0:y0 + 128] = block
    cube.flush()
    del cube
    return float(gaps.mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--height", type=int, default=1536)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--bands", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hsgds-bench-nodata-"))
    try:
        src = work / "swath.npy"
        share = swath_cube(src, args.height, args.width, args.bands)
        mb = src.stat().st_size / 1e6
        best = {"applied": float("inf"), "ignored": float("inf")}
        refilled = tiles = 0
        for _ in range(args.repeats):
            for name, nodata in (("applied", -9999.0), ("ignored", "none")):
                out = work / f"{name}.zarr"
                shutil.rmtree(out, ignore_errors=True)
                t0 = time.perf_counter()
                convert(src, out, ConvertOptions(nodata=nodata, workers=args.workers))
                best[name] = min(best[name], time.perf_counter() - t0)
                if name == "applied":
                    scene = open_scene(out)
                    tiles = scene.grid.num_tiles
                    gaps = scene.nodata_every(1)
                    assert gaps is not None
                    # tiles whose padded window shows a nodata pixel: those the converter wrote twice
                    g = scene.grid
                    padded = np.pad(gaps, g.halo, mode="reflect")
                    refilled = sum(bool(padded[ty * g.tile:ty * g.tile + g.side, tx * g.tile:tx * g.tile + g.side].any())
                                   for ty in range(g.nty) for tx in range(g.ntx))
        result = {
            "scene": f"{args.height}x{args.width}x{args.bands} int16, {mb:.0f} MB, {share:.0%} nodata",
            "workers": args.workers, "repeats": args.repeats, "tiles": tiles, "tiles_refilled": refilled,
            "seconds_nodata_applied": round(best["applied"], 3), "seconds_nodata_ignored": round(best["ignored"], 3),
            "ratio_applied_over_ignored": round(best["applied"] / best["ignored"], 3),
            "mb_per_s_applied": round(mb / best["applied"], 1), "mb_per_s_ignored": round(mb / best["ignored"], 1),
            "machine": f"{platform.machine()}, {platform.python_version()}",
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
