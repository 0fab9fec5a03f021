"""A collection of many small scenes against the same pixels as one scene, and the streaming regime.

    python benchmarks/bench_collection.py                  # 200 HySpecNet-shaped scenes (128x128x224 int16)
    python benchmarks/bench_collection.py --quick          # 24 scenes, fewer repeats

1. Throughput: ``PatchLoader`` over N seeded 128x128x224 int16 scenes (a list of stores, so every batch
   mixes scenes through the per-scene tables) against one scene made of the same N cubes side by side
   (same tile geometry: one 128-px tile per scene), ``pixels="all"`` with a stride, shuffled, in one run,
   alternating the two. Reported: patches/s of the second epoch (tiles resident) and of the first (tiles
   read), construction time, time to first batch, and the ratio collection / single.
2. Streaming: the collection read through a ring ``--ring-mib`` (default 256 MiB, at least 4x smaller than
   the collection) in a child process, page cache dropped for the store files first (posix_fadvise), a
   large stride and small batches so the cut is negligible: tile read rate (bytes read / epoch time) against the raw read
   rate of the same tile files (plain preadv, same order, same cache state, 1 and 2 threads, the faster
   one counts; and the same reads followed by the crc32c check the loader's reader makes), peak RSS (VmHWM) against the
   child's baseline + ring, and bytes read per epoch against the collection's size.
0. Start-up (first): time to first batch of a loader over the first N scenes, given as a collection folder
   (``collection.json``: stores opened as the loader reaches them) and as a list of store paths (every
   store opened first), N = 1/8, 1/4, 1/2 and all of the scenes, and the time to read collection.json;
   then listings of up to 11,636 scenes, and the same over labelled pixels (the train split of 8 small
   labelled stores listed N times).
3. Memory: RSS over two epochs of a loader over ``--memory-scenes`` listed labelled scenes (every 8th pixel,
   and the train samples), each in a fresh process: growth per scene visited, stores open and per-scene
   label maps / sample tables held at the end (``max_open_scenes``, ``sample_cache_bytes``).
JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SIDE, BANDS = 128, 224


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prepare(work: Path, n: int, cols: int) -> tuple[list[Path], Path]:
    """N seeded scenes as stores (tile 128, max patch 9: one 136x136x224 tile each) and their mosaic."""
    from hsgds.preprocess.convert import ConvertOptions, convert
    from hsgds.synthetic import make_scene

    opts = dict(tile=SIDE, max_patch=9, workers=2)
    stores = []
    rows = -(-n // cols)
    mosaic_path = work / f"mosaic_{n}.npy"
    mosaic = None
    if not (work / f"mosaic_{n}.zarr").exists():
        mosaic = np.lib.format.open_memmap(mosaic_path, mode="w+", dtype=np.int16,
                                           shape=(rows * SIDE, cols * SIDE, BANDS))
    t0 = time.perf_counter()
    for i in range(n):
        store = work / f"scene_{i:04d}.zarr"
        if not store.exists() or mosaic is not None:
            cube, _ = make_scene(SIDE, SIDE, BANDS, classes=6, dtype="int16", seed=1000 + i, labelled_fraction=0.0)
            if not store.exists():
                np.save(work / "tmp.npy", cube)
                convert(work / "tmp.npy", store, ConvertOptions(**opts))
            if mosaic is not None:
                r, c = divmod(i, cols)
                mosaic[r * SIDE:(r + 1) * SIDE, c * SIDE:(c + 1) * SIDE] = cube
        stores.append(store)
        if (i + 1) % 50 == 0:
            _log(f"  {i + 1}/{n} scenes ({time.perf_counter() - t0:.0f} s)")
    single = work / f"mosaic_{n}.zarr"
    if mosaic is not None:
        if n % cols:  # cells without a scene: make them the first scene again (never sampled, see mask)
            mosaic[(rows - 1) * SIDE:, (n % cols) * SIDE:] = 0
        mosaic.flush()
        del mosaic
        convert(mosaic_path, single, ConvertOptions(**opts))
        mosaic_path.unlink()
    (work / "tmp.npy").unlink(missing_ok=True)
    return stores, single


def _mosaic_mask(n: int, cols: int) -> np.ndarray | None:
    rows = -(-n // cols)
    if n % cols == 0:
        return None
    mask = np.ones((rows * SIDE, cols * SIDE), bool)
    mask[(rows - 1) * SIDE:, (n % cols) * SIDE:] = False
    return mask


def _epoch(loader) -> tuple[int, float]:
    t, n = time.perf_counter(), 0
    for patches, _ in loader:
        n += len(patches)
    return n, time.perf_counter() - t


def throughput(stores: list[Path], single: Path, args: argparse.Namespace) -> dict:
    import hsgds

    opts = dict(patch_size=args.patch, batch_size=args.batch, pixels="all", stride=args.stride, device="cpu",
                shuffle=True, seed=0)
    runs: dict[str, list[dict]] = {"collection": [], "single": []}
    for rep in range(args.repeats):
        for name in ("collection", "single"):
            t = time.perf_counter()
            if name == "collection":
                loader = hsgds.PatchLoader([str(s) for s in stores], **opts)
            else:
                loader = hsgds.PatchLoader(single, mask=_mosaic_mask(len(stores), args.cols), **opts)
            built = time.perf_counter() - t
            with loader:
                n1, t1 = _epoch(loader)  # reads every tile into the ring
                first = loader.stats.first_batch_s
                n2, t2 = _epoch(loader)  # tiles resident: the cut alone
            runs[name].append({"construct_s": built, "first_batch_s": first, "patches": n2,
                               "epoch1_patches_per_s": n1 / t1, "epoch2_patches_per_s": n2 / t2,
                               "bytes_read": loader.stats.bytes_read, "slots": loader.stats.slots})
            _log(f"  rep {rep} {name:10s} {n2 / t2:10,.0f} patches/s (epoch 1 {n1 / t1:,.0f}), built in {built:.2f} s")
    best = {k: max(v, key=lambda r: r["epoch2_patches_per_s"]) for k, v in runs.items()}
    return {"runs": runs, "best": best,
            "ratio_collection_vs_single": best["collection"]["epoch2_patches_per_s"]
            / best["single"]["epoch2_patches_per_s"],
            # first epochs paired per repetition (a best-epoch pick would pair a warm epoch with a cold one)
            "ratio_epoch1": float(np.median([c["epoch1_patches_per_s"] / s["epoch1_patches_per_s"]
                                             for c, s in zip(runs["collection"], runs["single"])]))}


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mib() -> float:
    """VmHWM: this process image's peak RSS (ru_maxrss would include the parent's before the exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def stream_child(stores: list[str], args: argparse.Namespace) -> dict:
    """Runs in its own process so that its peak RSS is the loader's."""
    import torch  # noqa: F401 (the baseline includes torch and hsgds)
    from bench_loader import drop_cache  # this folder is the script's first import path

    import hsgds

    scenes = [hsgds.open_scene(s) for s in stores]
    tiles = [p for s in scenes for p in s.tile_paths]
    total = sum(p.stat().st_size for p in tiles)
    # the baseline: everything a loader imports and probes, with a few tiles' ring over one scene (a batch
    # of a scene with many small edge tiles may need more than one; the ring is freed with the loader)
    with hsgds.PatchLoader(stores[:1], patch_size=args.patch, batch_size=args.stream_batch, pixels="all",
                           stride=args.stream_stride, device="cpu", ring_bytes=4 * scenes[0].grid.tile_nbytes) as warm:
        for _ in warm:
            pass
    # the raw reads' buffers (this benchmark's, not the loader's) are in the baseline too
    views = [memoryview(bytearray(max(p.stat().st_size for p in tiles))) for _ in range(2)]
    baseline = _rss_mib()
    ring = args.ring_mib << 20
    out: dict = {"collection_bytes": total, "ring_bytes": ring, "collection_over_ring": total / ring,
                 "baseline_rss_mib": baseline}
    loader = hsgds.PatchLoader(stores, patch_size=args.patch, batch_size=args.stream_batch, pixels="all",
                               stride=args.stream_stride, device="cpu", ring_bytes=ring, shuffle=True)
    from concurrent.futures import ThreadPoolExecutor

    import crc32c

    def read(p: Path, view: memoryview, verify: bool) -> int:
        fd = os.open(p, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            got = 0
            while got < size:
                got += os.preadv(fd, [view[got:size]], got)
        finally:
            os.close(fd)
        if verify:  # what the loader's reader also does: crc32c of every tile
            crc32c.crc32c(view[:size])
        return got

    def raw(seq: list[Path], threads: int, verify: bool = False) -> dict:
        t = time.perf_counter()
        if threads == 1:
            nbytes = sum(read(p, views[0], verify) for p in seq)
        else:
            with ThreadPoolExecutor(threads) as pool:
                nbytes = sum(pool.map(lambda ip: read(ip[1], views[ip[0] % threads], verify), enumerate(seq)))
        dt = time.perf_counter() - t
        return {"threads": threads, "verify": verify, "bytes": nbytes, "s": dt, "GBps": nbytes / dt / 1e9}

    rows: dict[str, list[dict]] = {}
    with loader:
        out["slots"] = loader.stats.slots
        out["ring_alloc_mib"] = loader.stats.ring_bytes / 2**20
        # interleaved, best of --stream-repeats: this machine's read rate moves a lot between moments
        for _ in range(args.stream_repeats):
            for cache in ("cold", "warm"):
                if cache == "cold":
                    drop_cache(tiles)
                before = loader.stats.bytes_read
                n, dt = _epoch(loader)
                read_bytes = loader.stats.bytes_read - before
                rows.setdefault(f"loader_{cache}", []).append(
                    {"patches": n, "epoch_s": dt, "bytes_read_per_epoch": read_bytes, "GBps": read_bytes / dt / 1e9})
                seq = [tiles[t] for t in loader.read_order(loader.epoch - 1)]  # the same tile order
                for threads in (1, 2):  # one reader, and as many reads in flight as the ring keeps
                    for verify in (False, True):
                        if cache == "cold":
                            drop_cache(tiles)
                        key = f"raw_{cache}" + ("_crc" if verify else "")
                        rows.setdefault(key, []).append(raw(seq, threads, verify))
    for key, runs in rows.items():
        out[key] = max(runs, key=lambda r: r["GBps"])
        out[key + "_runs"] = runs
    for cache in ("cold", "warm"):
        out[f"ratio_{cache}"] = out[f"loader_{cache}"]["GBps"] / out[f"raw_{cache}"]["GBps"]
        out[f"ratio_{cache}_vs_raw_crc"] = out[f"loader_{cache}"]["GBps"] / out[f"raw_{cache}_crc"]["GBps"]
    peak = _peak_rss_mib()
    out["peak_rss_mib"] = peak
    out["peak_over_baseline_plus_ring"] = peak / (baseline + ring / 2**20)
    out["peak_minus_baseline_minus_ring_mib"] = peak - baseline - ring / 2**20
    return out


def _first_batch_s(store, opts: dict) -> float:
    """Seconds from ``PatchLoader(store, **opts)`` to its first batch."""
    import hsgds

    t = time.perf_counter()
    with hsgds.PatchLoader(store, **opts) as loader:
        next(iter(loader))
    return time.perf_counter() - t


def startup(stores: list[Path], work: Path, args: argparse.Namespace) -> dict:
    """Time to first batch against the number of scenes: ``PatchLoader(collection folder)`` (nothing but
    collection.json is read before the first batch) and ``PatchLoader([store paths])`` (every store opened
    first), for the first N of the stores; unshuffled, with a ring of 4 tiles, so the first batch needs
    one scene's tile whatever N is. Medians of ``--repeats`` + 1 runs, alternating the two."""
    import hsgds
    from hsgds.collection import SceneEntry, open_collection, write_collection

    opts = dict(patch_size=args.patch, batch_size=args.batch, pixels="all", stride=args.stride, device="cpu",
                shuffle=False, ring_bytes=4 * hsgds.open_scene(stores[0]).grid.tile_nbytes)
    counts = sorted({n for n in (len(stores) // 8, len(stores) // 4, len(stores) // 2, len(stores)) if n > 0})
    rows = []
    for n in counts:
        folder = work / f"collection_{n}"
        folder.mkdir(exist_ok=True)
        write_collection(folder, [SceneEntry.of_scene(s.name[:-5], hsgds.open_scene(s)) for s in stores[:n]])
        runs: dict[str, list[float]] = {"collection.json read": [], "collection": [], "list of stores": []}
        for _ in range(args.repeats + 1):
            t = time.perf_counter()
            open_collection(folder)
            runs["collection.json read"].append(time.perf_counter() - t)
            for name, store in (("collection", folder), ("list of stores", [str(s) for s in stores[:n]])):
                runs[name].append(_first_batch_s(store, opts))
        row = {"scenes": n, **{f"{k} s": float(np.median(v)) for k, v in runs.items()}}
        rows.append(row)
        _log(f"  {n:4d} scenes: first batch {row['collection s']:.3f} s from collection.json, "
             f"{row['list of stores s']:.3f} s from a list of stores (collection.json read {row['collection.json read s']:.3f} s)")
    span = rows[-1]["scenes"] - rows[0]["scenes"]
    per_scene = {k: (rows[-1][f"{k} s"] - rows[0][f"{k} s"]) / span * 1e3 if span else None
                 for k in ("collection.json read", "collection", "list of stores")}
    # archive-sized listings (SpectralEarth: 11,636 scenes): entries cycle over the stores on disk (names
    # unique, paths repeated); the first batch reads the first scene only, so no other store is opened
    template = json.loads((work / f"collection_{counts[-1]}" / "collection.json").read_text())
    large = []
    for n in args.listings:
        folder = work / f"listing_{n}"
        folder.mkdir(exist_ok=True)
        entries = [dict(template["scenes"][i % len(template["scenes"])], name=f"s{i:05d}") for i in range(n)]
        for e in entries:
            e["path"] = os.path.relpath(work / f"collection_{counts[-1]}" / e["path"], folder)
        (folder / "collection.json").write_text(json.dumps({**template, "scenes": entries}))
        read, first = [], []
        for _ in range(args.repeats + 1):
            t = time.perf_counter()
            open_collection(folder)
            read.append(time.perf_counter() - t)
            first.append(_first_batch_s(folder, opts))
        large.append({"scenes": n, "collection.json read s": float(np.median(read)),
                      "collection s": float(np.median(first))})
        _log(f"  {n:5d} listed scenes: first batch {large[-1]['collection s']:.3f} s from collection.json "
             f"(collection.json read {large[-1]['collection.json read s']:.3f} s)")
    return {"rows": rows, "ms_per_scene": per_scene, "listed": large, "labelled": startup_labelled(work, args)}


def startup_nodata(work: Path, args: argparse.Namespace) -> dict:
    """Time to first batch over every pixel (stride 1) of listings of N entries cycling over 4 small scenes with
    no data outside a slanted swath (converted with --nodata): the listing as written (each entry counts its
    nodata pixels per tile: no store opened before the first batch) against the same listing without those
    counts (``tile_nodata`` removed, as written before they were listed: every scene is opened at start to
    read its nodata map). Unshuffled, a ring of 4 tiles; medians of ``--repeats`` + 1 runs, alternating."""
    import hsgds
    from hsgds.collection import SceneEntry
    from hsgds.preprocess.convert import ConvertOptions, convert
    from hsgds.synthetic import make_scene

    base = work / "nodata_stores"
    base.mkdir(exist_ok=True)
    stores = []
    for i in range(4):
        store = base / f"n{i}.zarr"
        if not store.exists():
            cube, _ = make_scene(128, 128, 32, dtype="int16", seed=100 + i)
            y, x = np.mgrid[:128, :128]
            cube[(x < y // 3 + 10) | (x > y // 3 + 70)] = -9999
            np.save(base / f"n{i}.npy", cube)
            convert(base / f"n{i}.npy", store, ConvertOptions(max_patch=args.patch, nodata=-9999.0))
        stores.append(store)
    template = [SceneEntry.of_scene(s.name[:-5], hsgds.open_scene(s)) for s in stores]
    opts = dict(patch_size=args.patch, batch_size=args.batch, pixels="all", stride=1, device="cpu", shuffle=False,
                ring_bytes=4 * hsgds.open_scene(stores[0]).grid.tile_nbytes)
    rows = []
    for n in args.nodata_listings:
        folders = {}  # entries cycle over the 4 stores (names unique, paths repeated), as an archive's listing
        for variant in ("per-tile counts listed", "counts not listed"):
            folder = work / f"nodata_listing_{n}_{variant.split()[0]}"
            folder.mkdir(exist_ok=True)
            doc = {"format": "hsgds-collection", "format_version": 1, "created_by": "bench",
                   "scenes": [dict(template[i % 4].to_json(folder), name=f"s{i:05d}") for i in range(n)]}
            if variant == "counts not listed":
                for e in doc["scenes"]:
                    e["tile_nodata"] = None
            (folder / "collection.json").write_text(json.dumps(doc))
            folders[variant] = folder
        runs: dict[str, list[float]] = {k: [] for k in folders}
        for _ in range(args.repeats + 1):
            for variant, folder in folders.items():
                runs[variant].append(_first_batch_s(folder, opts))
        row = {"scenes": n, **{f"{k} s": float(np.median(v)) for k, v in runs.items()}}
        rows.append(row)
        _log(f"  {n:5d} listed scenes with nodata: first batch {row['per-tile counts listed s']:.3f} s with "
             f"tile_nodata, {row['counts not listed s']:.3f} s without")
    return {"rows": rows}


def startup_labelled(work: Path, args: argparse.Namespace) -> dict:
    """Time to first batch over labelled pixels (the train split) against the number of scenes: listings of
    N entries cycling over 8 small labelled stores (names unique, paths repeated), as a collection folder
    (each entry counts its samples per tile: no store opened before the first batch) and, up to 1,000, as a
    list of store paths (every store and its sample table opened first). Unshuffled, a ring of 4 tiles."""
    import hsgds

    stores = labelled_stores(work)
    opts = dict(patch_size=args.patch, batch_size=64, split="train", device="cpu", shuffle=False,
                ring_bytes=4 * hsgds.open_scene(stores[0]).grid.tile_nbytes)
    rows = []
    for n in args.listings:
        folder = labelled_listing(work, stores, n)
        runs: dict[str, list[float]] = {"collection": [], "list of stores": []}
        for _ in range(args.repeats + 1):
            for name, store in (("collection", folder), ("list of stores", [str(stores[i % 8]) for i in range(n)])):
                if name == "list of stores" and n > 1000:
                    continue
                runs[name].append(_first_batch_s(store, opts))
        row = {"scenes": n, **{f"{k} s": float(np.median(v)) if v else None for k, v in runs.items()}}
        rows.append(row)
        listed_s = "" if row["list of stores s"] is None else f", {row['list of stores s']:.3f} s from a list of stores"
        _log(f"  {n:5d} labelled scenes: first batch {row['collection s']:.3f} s from collection.json{listed_s}")
    return {"rows": rows}


def labelled_stores(work: Path) -> list[Path]:
    """8 small seeded labelled stores (96x96x32 int16, 30% labelled, 10% of that train; 48-px tiles)."""
    from hsgds.preprocess.convert import ConvertOptions, convert
    from hsgds.synthetic import make_scene

    stores = []
    for i in range(8):
        store = work / f"labelled_{i}.zarr"
        if not store.exists():
            cube, labels = make_scene(96, 96, 32, classes=6, dtype="int16", seed=2000 + i, labelled_fraction=0.3)
            np.save(work / "tmp.npy", cube)
            np.save(work / "tmp_gt.npy", labels)
            convert(work / "tmp.npy", store, ConvertOptions(labels=work / "tmp_gt.npy", tile=48, max_patch=9, train=0.1))
        stores.append(store)
    (work / "tmp.npy").unlink(missing_ok=True)
    (work / "tmp_gt.npy").unlink(missing_ok=True)
    return stores


def labelled_listing(work: Path, stores: list[Path], n: int) -> Path:
    """A collection folder listing ``n`` scenes that cycle over ``stores`` (names unique, paths repeated)."""
    from dataclasses import replace

    import hsgds
    from hsgds.collection import SceneEntry, write_collection

    folder = work / f"labelled_listing_{n}"
    folder.mkdir(exist_ok=True)
    entries = [SceneEntry.of_scene(s.name[:-5], hsgds.open_scene(s)) for s in stores]
    write_collection(folder, [replace(entries[i % len(entries)], name=f"s{i:05d}") for i in range(n)])
    return folder


def memory(work: Path, args: argparse.Namespace) -> dict:
    """RSS over two epochs of a loader over N listed labelled scenes (each its own entry, so each opened and
    read on its own), every 8th pixel and the train samples, each run in a fresh process: the growth per
    scene visited after the first batch, and what the per-scene caches hold at the end."""
    stores = labelled_stores(work)
    rows = []
    for n in args.memory_scenes:
        folder = labelled_listing(work, stores, n)
        for pixels in ("all", "labelled"):
            cmd = [sys.executable, __file__, "--memory-child", f"{folder}:{pixels}"]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HSGDS_DEVICE": "cpu"})
            if proc.returncode:
                raise SystemExit(proc.stderr[-3000:])
            row = {"scenes": n, "pixels": pixels, **json.loads(proc.stdout)}
            row["growth_kib_per_scene"] = (row["rss_epoch2_mib"] - row["rss_first_batch_mib"]) * 1024 / n
            rows.append(row)
            _log(f"  {n:5d} scenes, pixels={pixels}: RSS {row['rss_first_batch_mib']:.0f} MiB after the first "
                 f"batch, {row['rss_epoch1_mib']:.0f} / {row['rss_epoch2_mib']:.0f} MiB after epochs 1 / 2 "
                 f"({row['growth_kib_per_scene']:.1f} KiB per scene); {row['scenes_open']} stores open, labels "
                 f"of {row['scenes_cached']} scenes cached ({row['cache_mib']:.1f} MiB)")
    return {"rows": rows}


def memory_child(spec: str) -> dict:
    import gc

    import hsgds
    from hsgds import defaults

    folder, pixels = spec.rsplit(":", 1)
    # 32 tiles: a shuffled epoch of the train samples can bring 23 scenes' few-sample tiles into one batch of
    # 512, and the loader refuses a ring that some epoch's batch would outgrow
    opts: dict = dict(patch_size=5, batch_size=512, device="cpu", pixels=pixels,
                      ring_bytes=32 * hsgds.open_collection(folder).entries[0].grid.tile_nbytes)
    if pixels == "all":
        opts.update(stride=8, split=None)
    else:
        opts.update(split="train")
    out = {}
    with hsgds.PatchLoader(folder, **opts) as loader:
        next(iter(loader))
        gc.collect()
        out["rss_first_batch_mib"] = _rss_mib()
        for epoch in (1, 2):
            loader.set_epoch(epoch - 1)
            t = time.perf_counter()
            out[f"batches_epoch{epoch}"] = sum(1 for _ in loader)
            out[f"epoch{epoch}_s"] = time.perf_counter() - t
            gc.collect()
            out[f"rss_epoch{epoch}_mib"] = _rss_mib()
        cache = loader.samples._per_scene
        out.update(scenes_open=sum(s.is_open for s in loader.scenes.scenes), scenes_cached=len(cache),
                   cache_mib=cache.nbytes / 2**20, max_open_scenes=defaults.get("max_open_scenes"),
                   sample_cache_mib=defaults.get("sample_cache_bytes") / 2**20)
    out["peak_rss_mib"] = _peak_rss_mib()
    return out


def streaming(stores: list[Path], args: argparse.Namespace) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([str(s) for s in stores], f)
    cmd = [sys.executable, __file__, "--child", f.name, "--patch", str(args.patch), "--stream-batch",
           str(args.stream_batch), "--stream-repeats", str(args.stream_repeats),
           "--ring-mib", str(args.ring_mib), "--stream-stride", str(args.stream_stride)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HSGDS_DEVICE": "cpu"})
    os.unlink(f.name)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", type=int, default=200)
    ap.add_argument("--cols", type=int, default=20, help="scenes per row of the single-scene mosaic")
    ap.add_argument("--quick", action="store_true", help="24 scenes, 1 repeat, 64 MiB ring")
    ap.add_argument("--work", type=Path, default=None, help="where the stores go (kept for reruns)")
    ap.add_argument("--patch", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--stride", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--ring-mib", type=int, default=256)
    ap.add_argument("--stream-stride", type=int, default=32,
                    help="streaming: a 128-px scene gives (128/stride)^2 patches, so the cut is negligible")
    ap.add_argument("--stream-batch", type=int, default=16)
    ap.add_argument("--stream-repeats", type=int, default=3)
    ap.add_argument("--prepare-only", action="store_true", help="write the stores and stop")
    ap.add_argument("--startup-only", action="store_true", help="only the time-to-first-batch section")
    ap.add_argument("--memory-only", action="store_true", help="only the memory-over-an-epoch section")
    ap.add_argument("--listings", default="25,200,1000,4000,11636",
                    help="start-up over archive-sized listings, every pixel and labelled pixels: listing sizes "
                         "(labelled: also as a list of stores, up to 1,000)")
    ap.add_argument("--memory-scenes", default="1000,3000", help="memory over an epoch: listing sizes")
    ap.add_argument("--nodata-only", action="store_true",
                    help="only the start-up over every pixel of listed scenes with nodata (tile_nodata or not)")
    ap.add_argument("--nodata-listings", default="100,1000", help="--nodata-only: listing sizes")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.listings = [int(v) for v in args.listings.split(",")]
    args.memory_scenes = [int(v) for v in args.memory_scenes.split(",")]
    args.nodata_listings = [int(v) for v in args.nodata_listings.split(",")]
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child)))
        return
    if args.child:
        stores = json.loads(Path(args.child).read_text())
        print(json.dumps(stream_child(stores, args)))
        return
    if args.quick:
        args.scenes, args.cols, args.repeats, args.ring_mib, args.stream_repeats = min(args.scenes, 24), 6, 1, 32, 2
    work = args.work or Path(tempfile.gettempdir()) / "hsgds-bench-collection"
    work.mkdir(parents=True, exist_ok=True)
    import torch

    if args.nodata_only:
        _log("start-up over every pixel of listed scenes with nodata")
        print(json.dumps({"startup_nodata": startup_nodata(work, args)}, indent=1))
        return
    if args.memory_only:
        _log("memory over an epoch against the number of scenes")
        print(json.dumps({"memory": memory(work, args)}, indent=1))
        return
    _log(f"preparing {args.scenes} scenes in {work}")
    stores, single = prepare(work, args.scenes, args.cols)
    if args.prepare_only:
        return
    doc = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "machine": {"cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                       "loadavg": os.getloadavg()}}
    _log("start-up: time to first batch against the number of scenes")
    doc["startup"] = startup(stores, work, args)
    if args.startup_only:
        print(json.dumps(doc, indent=1))
        return
    _log("throughput: collection vs one scene of the same pixels")
    doc["throughput"] = throughput(stores, single, args)
    _log("streaming: collection through a small ring")
    doc["streaming"] = streaming(stores, args)
    _log("memory: RSS over two epochs against the number of scenes")
    doc["memory"] = memory(work, args)
    doc["machine"]["loadavg_end"] = os.getloadavg()
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
