"""Re-split an existing store (``hsgds resplit``): new split codes and train statistics, tiles untouched.

The source is not needed: the labels are in the store, and the train statistics are computed from the
store's own tiles (each checked against its checksum) with the converter's accumulator, in the
converter's tile order, so a re-split store holds exactly what converting with that split would give.

Readers are never shown a half-rewritten store. The new split codes and train statistics are written
under new names (``samples/split-<g>``, ``stats/train-<g>``, for split generation ``g``) that nothing
refers to yet; they are flushed to disk, and only then is the root metadata replaced, in one atomic
rename, by metadata naming generation ``g``. A reader that read the old metadata keeps reading the
previous generation, which is kept until the next re-split; one killed at any point leaves the store as
it was before (or, past the rename, as it is after). Leftovers of a killed re-split are removed by the
next one. Two re-splits of one store exclude each other with an advisory lock.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from hsgds import format as fmt
from hsgds.errors import InputError, StoreError
from hsgds.preprocess import splits as splitting
from hsgds.preprocess.stats import BandAccumulator
from hsgds.scene import Scene, open_scene

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; do not run two re-splits of one store at once there
    fcntl = None

__all__ = ["resplit"]

RESPLIT_METHODS = ("random", "blocks")


def _lock_store(path: Path) -> int | None:
    """Exclusive advisory lock on the store folder, held until the returned descriptor is closed."""
    if fcntl is None:
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise InputError(f"another `hsgds resplit` is rewriting {path}; wait for it to finish") from None
    return fd


def train_stats(scene: Scene, codes: np.ndarray) -> dict[str, np.ndarray] | None:
    """Band statistics of the pixels whose code is train, read from the store's tiles in tile order
    (the converter's order and accumulator, so the result is bit-identical to a conversion's)."""
    table = scene.sample_table()
    offsets = table["offsets"]
    acc = BandAccumulator(scene.shape[2])
    h = scene.grid.halo
    for tile_id in range(scene.grid.num_tiles):
        lo, hi = int(offsets[tile_id]), int(offsets[tile_id + 1])
        train = codes[lo:hi] == fmt.SPLIT_TRAIN
        if not train.any():
            continue
        tile = scene.read_tile(tile_id)  # checksum verified: statistics never come from a damaged tile
        acc.merge(BandAccumulator.of(tile[h + table["y"][lo:hi][train], h + table["x"][lo:hi][train]]))
    return acc.result()


def _fsync_tree(path: Path) -> None:
    """Flush every file and folder under ``path`` (and ``path`` itself) to disk."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(root))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot sync a folder
    finally:
        os.close(fd)


def _write_generation(store: Path, generation: int, codes: np.ndarray, stats: dict[str, np.ndarray] | None) -> None:
    cfg = {"write_empty_chunks": True}
    samples = zarr.open_group(store / fmt.SAMPLES, mode="r+", zarr_format=3)
    name = fmt.split_array(generation).split("/", 1)[1]
    samples.create_array(name, data=codes, chunks=(max(1, codes.size),), compressors=None, config=cfg,
                         dimension_names=["sample"])
    _fsync_tree(store / fmt.split_array(generation))
    if stats is not None:
        group = zarr.open_group(store / fmt.STATS, mode="r+", zarr_format=3)
        sub = fmt.train_stats_group(generation).split("/", 1)[1]
        for field, values in stats.items():
            group.create_array(f"{sub}/{field}", data=values, chunks=(values.size,), compressors=None, config=cfg,
                               dimension_names=["band"])
        _fsync_tree(store / fmt.train_stats_group(generation))
    _fsync_dir(store / fmt.SAMPLES)
    _fsync_dir(store / fmt.STATS)


def _commit(store: Path, meta: fmt.StoreMeta) -> None:
    """Replace the root metadata in one atomic rename (the commit point of a re-split)."""
    root_json = store / "zarr.json"
    doc = json.loads(root_json.read_text())
    doc.setdefault("attributes", {})[fmt.FORMAT_NAME] = meta.to_json()
    tmp = store / f".zarr.json.resplit-{secrets.token_hex(4)}"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, root_json)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(store)


_GENERATED = {fmt.SAMPLES: re.compile(r"split-(\d+)"), fmt.STATS: re.compile(r"train-(\d+)")}


def _remove_generations(store: Path, drop: Callable[[int], bool]) -> None:
    """Delete the split generations for which ``drop(generation)`` holds, and stray metadata files."""
    for folder, pattern in _GENERATED.items():
        base = store / folder
        if not base.is_dir():
            continue
        for entry in base.iterdir():
            m = pattern.fullmatch(entry.name)
            if m and drop(int(m.group(1))) and entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
    if drop(0):
        for name in (fmt.split_array(0), fmt.train_stats_group(0)):
            if (store / name).is_dir():
                shutil.rmtree(store / name, ignore_errors=True)
    for tmp in store.glob(".zarr.json.resplit-*"):
        tmp.unlink(missing_ok=True)


def resplit(store: str | os.PathLike, split: str = "random", *, train: float | int = 0.1, val: float | int = 0.0,
            block_size: int | None = None, seed: int = 0,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Re-split ``store`` in place; returns the new ``split`` metadata. See ``hsgds resplit --help``.

    The split is made exactly as ``hsgds convert`` makes it (same functions, the store's halo as the
    guard of a block split), from the labels in the store. Samples' split codes and the train
    statistics are replaced atomically (see the module notes); tiles, labels and everything else stay.
    """
    if split not in RESPLIT_METHODS:
        raise InputError(f"--split must be one of {', '.join(RESPLIT_METHODS)} for resplit, got {split!r} "
                         "(mask splits: convert again with --split masks)")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise InputError(f"--seed must be a non-negative integer, got {seed!r}")
    if block_size is not None and (not isinstance(block_size, int) or block_size < 1):
        raise InputError(f"--block-size must be a positive number of pixels, got {block_size}")
    path = Path(store)
    open_scene(path)  # a clear error for a path that is not a store, before locking anything
    lock = _lock_store(path)
    try:
        scene = open_scene(path)  # again, under the lock: the metadata the new generation follows
        meta = scene.meta
        if meta.num_samples == 0:
            raise InputError(f"{path} has no labelled pixels: there is nothing to split")
        if meta.split_generation >= fmt.MAX_SPLIT_GENERATION:
            raise StoreError(f"{path} has been re-split {meta.split_generation} times; convert it again")
        labels = scene.labels
        split_map, params = splitting.make_split(labels, split, train=train, val=val, block_size=block_size,
                                                 guard=meta.halo, seed=seed)
        ys, xs, _ = scene.samples(None)
        codes = split_map[ys, xs].astype(np.uint8)
        if progress is not None:
            progress("computing train statistics from the tiles")
        stats = train_stats(scene, codes)
        generation = meta.split_generation + 1
        current = meta.split_generation
        _remove_generations(path, lambda g: g > current)  # leftovers of killed re-splits
        _write_generation(path, generation, codes, stats)
        meta.split = params
        meta.stats_split = "train" if stats is not None else "all"
        meta.split_generation = generation
        _commit(path, meta)
        # keep the previous generation for readers that read the old metadata a moment ago
        _remove_generations(path, lambda g: g < generation - 1)
        return params
    finally:
        if lock is not None:
            os.close(lock)
