"""What planning a shuffled epoch costs when every pixel is a sample: PatchLoader(pixels="all", shuffle=True)
over one seeded scene of S x S pixels (default 2048 x 2048 x 32 uint16: 4.2M samples, 268 MB), a 64 MiB ring.

    python benchmarks/bench_plan.py [--side 2048] [--bands 32] [--epochs 2] [--json out.json]

For each epoch: the time from asking for the epoch's first batch to getting it (the plan is made there),
then the time of the next 200 batches, and the peak RSS (VmHWM, reset at the start of each epoch) above
the RSS just before: what the epoch's plan and its first batches hold beyond the ring and the baseline.
An int64 order of every sample would be 8 bytes per sample (34 MB here); the plan keeps one generator
state per shuffle window and makes one window's order (8 bytes per pixel of at most half the ring's
tiles) at a time. Linux only (/proc/self/status, /proc/self/clear_refs).
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
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
