"""One scene larger than the ring (>= 7 GB): time to the first batch and the streaming read rate, cold cache.

    python benchmarks/bench_large_scene.py [--work DIR] [--side 4096] [--bands 224] [--repeats 3]
        [--stream-repeats 1] [--json out.json]

Writes once (kept in ``--work`` for reruns) a seeded AVIRIS-like int16 scene of side x side x bands
(4096 x 4096 x 224: 7.5 GB), tiled from a 1024 x 1024 block of ``hsgds.synthetic.make_scene`` (every other
block mirrored), and converts it with the default options (timed: MB/s). Then, each run in a fresh
process with the page cache of the store's tiles dropped first (fsync + posix_fadvise DONTNEED):

- time to the first batch: from ``PatchLoader(store, patch_size=13, batch_size=256, device="cpu")`` to
  its first batch, with the default ``split="train"``, with ``pixels="all"`` and with ``pixels="all",
  split="train"`` (self-supervised training that never sees a test pixel); the loader's construction
  and the wait for the batch apart, the tiles read by then, and the bytes its sample set holds; medians
  of ``--repeats``;
- the streaming regime: ``bench_collection.py``'s streaming section on this one store (a 256 MiB ring;
  the loader's tile read rate against raw ``preadv`` of the same tiles in the same order, with and
  without the crc32c check the reader makes; peak RSS against baseline + ring).

JSON on stdout (and ``--json``); logs on stderr. Needs ~10 GB of free disk in ``--work`` and ~12 GB of
memory while the scene is made.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BLOCK = 1024


def _log(msg: str) -> None:
    print(f"[bench_large_scene {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prepare(work: Path, side: int, bands: int) -> tuple[Path, dict]:
    """The converted store (made once) and what making it cost."""
    from hsgds.preprocess.convert import ConvertOptions, convert
    from hsgds.synthetic import make_scene

    store = work / f"scene_{side}x{side}x{bands}.zarr"
    info_path = work / f"scene_{side}x{side}x{bands}.json"
    if store.exists() and info_path.exists():
        return store, json.loads(info_path.read_text())
    if side % BLOCK:
        raise SystemExit(f"--side must be a multiple of {BLOCK}")
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    block, labels = make_scene(BLOCK, BLOCK, bands, classes=16, dtype="int16", seed=2, labelled_fraction=0.3)
    cube = np.lib.format.open_memmap(work / "cube.npy", mode="w+", dtype=block.dtype, shape=(side, side, bands))
    gt = np.zeros((side, side), np.uint8)
    n = side // BLOCK
    for i in range(n):
        for j in range(n):
            flip = slice(None, None, -1 if (i + j) % 2 else 1)
            cube[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = block[flip]
            gt[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = labels[flip]
    cube.flush()
    del cube
    np.save(work / "gt.npy", gt)
    made = time.perf_counter() - t
    _log(f"wrote a {side}x{side}x{bands} int16 cube ({side * side * bands * 2 / 1e9:.1f} GB) in {made:.0f} s")
    t = time.perf_counter()
    convert(work / "cube.npy", store, ConvertOptions(labels=work / "gt.npy", overwrite=True))
    took = time.perf_counter() - t
    source_bytes = (work / "cube.npy").stat().st_size
    (work / "cube.npy").unlink()
    info = {"shape": [side, side, bands], "dtype": "int16", "source_bytes": source_bytes,
            "store_bytes": sum(p.stat().st_size for p in store.rglob("*") if p.is_file()),
            "make_s": made, "convert_s": took, "convert_MBps": source_bytes / took / 1e6}
    _log(f"converted in {took:.0f} s ({info['convert_MBps']:.0f} MB/s of source)")
    info_path.write_text(json.dumps(info))
    return store, info


def first_batch_child(store: str, mode: str) -> dict:
    """In a fresh process: drop the tiles' page cache, build the loader, take its first batch."""
    t0 = time.perf_counter()
    import torch  # noqa: F401 (imports are timed apart from the loader)
    from bench_loader import drop_cache  # this folder is the script's first import path

    import hsgds

    imports = time.perf_counter() - t0
    drop_cache(list(hsgds.open_scene(store).tile_paths))
    kwargs = {"all": {"pixels": "all"}, "all+train": {"pixels": "all", "split": "train"}}.get(mode, {"split": mode})
    t1 = time.perf_counter()
    loader = hsgds.PatchLoader(store, patch_size=13, batch_size=256, device="cpu", **kwargs)
    t2 = time.perf_counter()
    with loader:
        next(iter(loader))
        t3 = time.perf_counter()
        st = loader.stats
        return {"mode": mode, "imports_s": imports, "construction_s": t2 - t1, "first_batch_wait_s": t3 - t2,
                "to_first_batch_s": t3 - t1, "tiles_read_by_then": st.tiles_loaded, "bytes_read_by_then": st.bytes_read,
                "ring_bytes": st.ring_bytes, "slots": st.slots, "samples": len(loader.samples),
                "samples_held_bytes": sum(a.nbytes for a in vars(loader.samples).values() if isinstance(a, np.ndarray))}


def first_batch(store: Path, repeats: int) -> dict:
    out = {}
    for mode in ("train", "all", "all+train"):
        runs = []
        for _ in range(repeats):
            proc = subprocess.run([sys.executable, __file__, "--child-first", str(store), mode], capture_output=True,
                                  text=True, env={**os.environ, "HSGDS_DEVICE": "cpu"})
            if proc.returncode:
                raise SystemExit(proc.stderr[-3000:])
            runs.append(json.loads(proc.stdout))
        med = {k: float(np.median([r[k] for r in runs])) for k in ("construction_s", "first_batch_wait_s",
                                                                   "to_first_batch_s", "tiles_read_by_then",
                                                                   "samples_held_bytes")}
        out[mode] = {"median": med, "runs": runs}
        _log(f"{mode}: construction {med['construction_s']:.2f} s + first batch {med['first_batch_wait_s']:.2f} s = "
             f"{med['to_first_batch_s']:.2f} s (median of {repeats}; {med['tiles_read_by_then']:.0f} tiles read by then; "
             f"samples held in {med['samples_held_bytes'] / 1e6:.1f} MB)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=None, help="where the scene goes (kept for reruns)")
    ap.add_argument("--side", type=int, default=4096)
    ap.add_argument("--bands", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stream-repeats", type=int, default=1)
    ap.add_argument("--ring-mib", type=int, default=256)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child-first", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_first:
        print(json.dumps(first_batch_child(*args.child_first)))
        return
    import bench_collection

    work = args.work or Path(tempfile.mkdtemp(prefix="hsgds-large-"))
    store, info = prepare(work, args.side, args.bands)
    doc = {"scene": info, "first_batch": first_batch(store, args.repeats)}
    stream_args = argparse.Namespace(patch=13, stream_batch=16, stream_stride=32, stream_repeats=args.stream_repeats,
                                     ring_mib=args.ring_mib)
    stream = bench_collection.streaming([store], stream_args)
    doc["streaming"] = stream
    _log(f"streaming, {stream['collection_over_ring']:.1f}x the ring: loader cold {stream['loader_cold']['GBps']:.2f} GB/s "
         f"= {stream['ratio_cold']:.2f}x raw preadv ({stream['ratio_cold_vs_raw_crc']:.2f}x raw + crc32c); "
         f"peak RSS {stream['peak_over_baseline_plus_ring']:.2f}x baseline + ring")
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
