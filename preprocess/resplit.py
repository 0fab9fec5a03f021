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
next one. Two re-splits of one store (or a re-split and convert-many's rewrite of its class names) exclude
each other with an advisory lock (``flock``, :mod:`hsgds.preprocess.rewrite`, which also commits the metadata),
except on Windows, which has none: there nothing stops two re-splits of one store at once (docs/windows.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from hsgds import format as fmt
from hsgds._durable import fsync_dir, fsync_tree
from hsgds.errors import HsgdsError, InputError, StoreError, one_line
from hsgds.preprocess import splits as splitting
from hsgds.preprocess.convert import write_error
from hsgds.preprocess.rewrite import commit_metadata, lock_store, remove_stale_commits
from hsgds.preprocess.stats import BandAccumulator, check_finite

__all__ = ["check_options", "resplit"]

RESPLIT_METHODS = ("random", "blocks")


class _Store:
    """What a re-split reads from a store: its metadata, labels, sample table and tiles. Read with zarr and
    the format module only (the converter does not use the runtime), and checked before anything is used
    to index: a re-split rewrites the store, so it must not trust a damaged one."""

    def __init__(self, path: Path) -> None:
        where = str(path)
        try:
            doc = json.loads((path / "zarr.json").read_text())
        except FileNotFoundError:
            raise StoreError(f"{path} is not a store directory; create one with `hsgds convert`") from None
        except (OSError, ValueError) as exc:
            raise StoreError(f"{where}: cannot read zarr.json ({exc}); convert the source again") from None
        self.path = path
        self.meta = fmt.StoreMeta.from_json(doc.get("attributes", {}) if isinstance(doc, dict) else {}, where)
        self.grid = self.meta.grid
        h, w, _ = self.meta.shape
        n = self.meta.num_samples
        try:
            root = zarr.open_group(path, mode="r", zarr_format=3)
            self.labels = np.asarray(root[fmt.LABELS][...])
            table = {f: np.asarray(root[f"{fmt.SAMPLES}/{f}"][...]) for f in ("tile", "y", "x", "offsets")}
        except (KeyError, OSError, ValueError) as exc:
            raise StoreError(f"{where}: cannot read its labels or samples ({exc}); convert the source again") from None
        g = self.grid
        ok = self.labels.shape == (h, w) and all(table[f].shape == (n,) for f in ("tile", "y", "x"))
        if ok and n:
            t = table["tile"].astype(np.int64)
            ok = (t.min() >= 0 and t.max() < g.num_tiles and not np.any(np.diff(t) < 0)
                  and min(table["y"].min(), table["x"].min()) >= 0 and max(table["y"].max(), table["x"].max()) < g.tile
                  and np.array_equal(table["offsets"], fmt.tile_offsets(t, g.num_tiles)))
        if not ok:
            raise StoreError(f"{where}: labels or sample arrays are inconsistent; convert the source again")
        self.table = table
        try:
            tiles_meta = json.loads((path / fmt.TILES / "zarr.json").read_text())
        except (OSError, ValueError, RecursionError) as exc:
            raise StoreError(f"{where}: cannot read {fmt.TILES}/zarr.json ({one_line(exc)}); convert the source "
                             "again") from None
        self.tile_paths = fmt.tile_paths(path, g, tiles_meta)

    def scene_yx(self) -> tuple[np.ndarray, np.ndarray]:
        """Scene coordinates of the samples, in sample order."""
        ty, tx = np.divmod(self.table["tile"].astype(np.int64), self.grid.ntx)
        return ty * self.grid.tile + self.table["y"], tx * self.grid.tile + self.table["x"]

    def read_tile(self, tile_id: int) -> np.ndarray:
        """One halo-padded tile, its size and checksum checked against the metadata."""
        raw = fmt.read_tile_file(tile_id, self.tile_paths[tile_id], self.grid.tile_nbytes, self.meta.checksums[tile_id])
        return np.frombuffer(raw, dtype=np.dtype(self.meta.dtype).newbyteorder("<")).reshape(self.grid.tile_shape)


def train_stats(store: _Store, codes: np.ndarray) -> dict[str, np.ndarray] | None:
    """Band statistics of the pixels whose code is train, read from the store's tiles in tile order
    (the converter's order and accumulator, so the result is bit-identical to a conversion's)."""
    table = store.table
    offsets = table["offsets"]
    acc = BandAccumulator(store.meta.shape[2])
    h = store.grid.halo
    for tile_id in range(store.grid.num_tiles):
        lo, hi = int(offsets[tile_id]), int(offsets[tile_id + 1])
        train = codes[lo:hi] == fmt.SPLIT_TRAIN
        if not train.any():
            continue
        tile = store.read_tile(tile_id)  # checksum verified: statistics never come from a damaged tile
        acc.merge(BandAccumulator.of(tile[h + table["y"][lo:hi][train], h + table["x"][lo:hi][train]]))
    return acc.result()


RETRY = "run the same `hsgds resplit` again"


@contextlib.contextmanager
def _rewriting(store: Path, what: str) -> Iterator[None]:
    """A failure while a re-split writes ``what`` into ``store`` as a one-line StoreError: zarr's errors
    (ValueError: the store's group metadata is damaged) and OSError (disk full, read-only folder). The
    store keeps its current split: nothing refers to what was being written."""
    try:
        yield
    except HsgdsError:
        raise
    except ValueError as exc:  # before OSError: zarr's "group not found" is both
        raise StoreError(f"{store}: cannot write {what}: its metadata is damaged ({one_line(exc)}); convert the "
                         "source again") from None
    except OSError as exc:
        raise write_error(exc, f"{what} of {store}", RETRY,
                          f"the store is not writable: check its permissions, then {RETRY}") from None


def _write_generation(store: Path, generation: int, codes: np.ndarray, stats: dict[str, np.ndarray] | None) -> None:
    cfg = {"write_empty_chunks": True}
    with _rewriting(store, "the new split codes"):
        samples = zarr.open_group(store / fmt.SAMPLES, mode="r+", zarr_format=3)
        name = fmt.split_array(generation).split("/", 1)[1]
        samples.create_array(name, data=codes, chunks=(max(1, codes.size),), compressors=None, config=cfg,
                             dimension_names=["sample"])
        fsync_tree(store / fmt.split_array(generation))
    if stats is not None:
        with _rewriting(store, "the new train statistics"):
            group = zarr.open_group(store / fmt.STATS, mode="r+", zarr_format=3)
            sub = fmt.train_stats_group(generation).split("/", 1)[1]
            for field, values in stats.items():
                group.create_array(f"{sub}/{field}", data=values, chunks=(values.size,), compressors=None,
                                   config=cfg, dimension_names=["band"])
            fsync_tree(store / fmt.train_stats_group(generation))
    fsync_dir(store / fmt.SAMPLES)
    fsync_dir(store / fmt.STATS)


def _commit(store: Path, meta: fmt.StoreMeta) -> None:
    """Replace the root metadata in one atomic rename (the commit point of a re-split)."""
    commit_metadata(store, meta, RETRY)


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
    remove_stale_commits(store)


def check_options(split: str, *, train: float | int, val: float | int, block_size: int | None, seed: int) -> None:
    """The options' own checks, in the command's words, before any store is read: ``hsgds resplit`` of a collection
    makes them once, not once per scene (a bad option is the user's, not a scene's)."""
    if split not in RESPLIT_METHODS:
        raise InputError(f"--split must be one of {', '.join(RESPLIT_METHODS)} for resplit, got {split!r} "
                         "(mask splits: convert again with --split masks)")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise InputError(f"--seed must be a non-negative integer, got {seed!r}")
    if block_size is not None and (not isinstance(block_size, int) or block_size < 1):
        raise InputError(f"--block-size must be a positive number of pixels, got {block_size}")
    splitting.check_split_options(split, ["--block-size"] if block_size is not None else [])
    splitting.check_amounts(train, val)


def resplit(store: str | os.PathLike, split: str = "random", *, train: float | int = 0.1, val: float | int = 0.0,
            block_size: int | None = None, seed: int = 0,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Re-split ``store`` in place; returns the new ``split`` metadata. See ``hsgds resplit --help``.

    The split is made exactly as ``hsgds convert`` makes it (same functions, the store's halo as the
    guard of a block split), from the labels in the store. Samples' split codes and the train
    statistics are replaced atomically (see the module notes); tiles, labels and everything else stay.
    """
    check_options(split, train=train, val=val, block_size=block_size, seed=seed)
    path = Path(store)
    if not path.is_dir():
        raise StoreError(f"{path} is not a store directory; create one with `hsgds convert`")
    lock = lock_store(path)
    try:
        src = _Store(path)  # read under the lock: the metadata the new generation follows
        meta = src.meta
        if meta.num_samples == 0:
            raise InputError(f"{path} has no labelled pixels: there is nothing to split")
        if meta.split_generation >= fmt.MAX_SPLIT_GENERATION:
            raise StoreError(f"{path} has been re-split {meta.split_generation} times; convert it again")
        if split == "blocks":
            splitting.check_block_size_option(block_size, meta.halo, " (--max-patch was set when the store was "
                                              "converted: smaller blocks need it converted again with a smaller one)")
        # the split's warnings are shown once it is written, as convert shows them: a split refused below (no
        # train pixel) is said in one line, not after a warning about classes of a split never made
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            split_map, params = splitting.make_split(src.labels, split, train=train, val=val,
                                                     block_size=block_size, guard=meta.halo, seed=seed)
        ys, xs = src.scene_yx()
        codes = split_map[ys, xs].astype(np.uint8)
        splitting.check_has_train(codes, split, block_size)
        if progress is not None:
            progress("computing train statistics from the tiles")
        stats = train_stats(src, codes)
        if stats is not None:
            check_finite(stats, "new train", "rescale the cube and convert it again")
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
        for w in caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return params
    finally:
        if lock is not None:
            os.close(lock)
