"""A collection of stores: ``collection.json`` (written by ``hsgds convert-many``) and the scenes it lists.

Opening a collection reads only ``collection.json``: every scene's shape, dtype, bands, wavelengths and
classes come from there, so opening thousands of scenes costs one small JSON parse. A store is opened
(and checked against its entry) the first time its :class:`~hsgds.scene.Scene` is asked for.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hsgds import defaults
from hsgds import format as fmt
from hsgds._durable import atomic_path
from hsgds._gc import gc_paused
from hsgds._lru import LruCache
from hsgds._unset import Unset
from hsgds._version import __version__
from hsgds.errors import StoreError, as_path, one_line
from hsgds.format import TileGrid
from hsgds.scene import MAX_JSON_BYTES, Scene, open_scene, samples_at

__all__ = ["COLLECTION_FILE", "Collection", "DeferredScene", "SceneEntry", "is_collection_path", "open_collection",
           "split_record", "write_collection"]

COLLECTION_FILE = "collection.json"
COLLECTION_FORMAT = "hsgds-collection"
#: The newest collection.json version; a file records the oldest that describes it (:func:`collection_version`).
#: Version 2 lets an entry's wavelengths hold a null (a band without a centre, store format v4); a version 1
#: reader refuses such a file by its version instead of calling the null damaged.
COLLECTION_VERSION = 2
#: An entry's ``bad_bands`` in a collection.json written before they were listed: read from the store.
UNLISTED = Unset("not listed: read from the store")
#: Versions this hsgds reads. Version 1 files written before version 2 existed may hold nulls too: read as such.
READABLE_COLLECTION_VERSIONS = (1, 2)


@dataclass(frozen=True)
class SceneEntry:
    """One scene of ``collection.json``: what is known about it without opening its store.

    ``path`` is absolute (``collection.json`` holds it relative to its own folder). ``stamps`` maps
    absolute source/label file paths to ``(size, mtime_ns)`` as they were when the store was made
    (``convert-many`` uses them to tell unchanged sources without hashing them again).
    """

    name: str
    path: Path
    shape: tuple[int, int, int]
    dtype: str
    #: band centres in nm, None for a band without one (as the store's); None when the store records none
    wavelengths: tuple[float | None, ...] | None
    band_names: tuple[str, ...] | None
    num_classes: int
    class_names: tuple[str, ...] | None
    num_samples: int
    source_sha256: str
    labels_sha256: str | None = None
    stamps: dict[str, tuple[int, int]] | None = None
    #: the store's tile core, halo and format version: with them a loader needs no store opened to start
    #: (None in a collection.json written before they were listed)
    tile: int | None = None
    halo: int | None = None
    format_version: int | None = None
    #: per split name ("none", "train", "val", "test"), each tile's number of labelled samples: with them a
    #: loader over labelled pixels starts without opening a store (None: unlabelled, or not listed)
    tile_samples: dict[str, tuple[int, ...]] | None = None
    #: pixels the source had no data at (format v3; 0 for v1 and v2 stores): with it a loader over every
    #: pixel knows without opening the store whether it must read its nodata map (None: not listed)
    nodata_pixels: int | None = None
    #: each tile's number of those pixels (None when there are none, or not listed): with them a loader over
    #: every pixel of such a scene starts without opening its store, as with ``tile_samples``
    tile_nodata: tuple[int, ...] | None = None
    #: the bands the store's source flags bad (its ``bad_bands``: None when the source has no such list), or
    #: :data:`UNLISTED` in a collection.json written before they were listed (then read from the store)
    bad_bands: tuple[int, ...] | None | Unset = UNLISTED
    #: :func:`split_fingerprint` of the store's split when listed (None: unlabelled, or not listed): ``hsgds
    #: info COLLECTION`` compares it with each store's zarr.json to tell a store re-split since
    split_fingerprint: str | None = None

    @property
    def bands(self) -> int:
        return self.shape[2]

    @property
    def grid(self) -> TileGrid | None:
        """The store's tile geometry, when the entry lists it."""
        if self.tile is None or self.halo is None:
            return None
        h, w, b = self.shape
        return TileGrid(height=h, width=w, bands=b, dtype=self.dtype, tile=self.tile, halo=self.halo)

    @classmethod
    def of_scene(cls, name: str, scene: Scene, stamps: dict[str, tuple[int, int]] | None = None) -> SceneEntry:
        """The entry describing an opened store."""
        m = scene.meta
        tile_samples = None
        if m.num_samples:
            t = scene.sample_table()
            tile_samples = {split: tuple(np.bincount(t["tile"][t["split"] == code].astype(np.int64),
                                                     minlength=m.grid.num_tiles).tolist())
                            for split, code in fmt.SPLIT_CODES.items()}
        return cls(name=name, path=scene.path.resolve(), shape=m.shape, dtype=m.dtype,
                   wavelengths=_centres(m.wavelengths),
                   band_names=None if m.band_names is None else tuple(m.band_names),
                   bad_bands=None if m.bad_bands is None else tuple(m.bad_bands),
                   num_classes=int(m.num_classes),
                   class_names=None if m.class_names is None else tuple(m.class_names),
                   num_samples=int(m.num_samples), source_sha256=str(m.source.get("sha256", "")),
                   labels_sha256=None if not m.labels_source else m.labels_source.get("sha256"),
                   stamps=stamps, tile=m.grid.tile, halo=m.grid.halo, format_version=m.format_version,
                   tile_samples=tile_samples, nodata_pixels=int(m.nodata["pixels"]) if m.nodata else 0,
                   tile_nodata=_tile_counts(scene.nodata_every(1), m.grid),
                   split_fingerprint=split_fingerprint(m.split, m.split_generation, m.labels_source)
                   if m.num_samples else None)

    def to_json(self, root: Path) -> dict[str, Any]:
        try:
            rel = os.path.relpath(self.path, root)
        except ValueError:  # another drive on Windows: keep it absolute
            rel = str(self.path)
        return {"name": self.name, "path": Path(rel).as_posix(), "shape": list(self.shape), "dtype": self.dtype,
                "bands": self.bands, "wavelengths": None if self.wavelengths is None else list(self.wavelengths),
                "band_names": None if self.band_names is None else list(self.band_names),
                **({} if isinstance(self.bad_bands, Unset)
                   else {"bad_bands": None if self.bad_bands is None else list(self.bad_bands)}),
                "num_classes": self.num_classes,
                "class_names": None if self.class_names is None else list(self.class_names),
                "num_samples": self.num_samples, "source_sha256": self.source_sha256,
                "labels_sha256": self.labels_sha256,
                "stamps": None if self.stamps is None else {k: list(v) for k, v in sorted(self.stamps.items())},
                "tile": self.tile, "halo": self.halo, "format_version": self.format_version,
                "tile_samples": (None if self.tile_samples is None
                                 else {k: list(v) for k, v in self.tile_samples.items()}),
                "nodata_pixels": self.nodata_pixels,
                "tile_nodata": None if self.tile_nodata is None else list(self.tile_nodata),
                "split_fingerprint": self.split_fingerprint}


def _entry_from_json(d: Any, i: int, root: Path, where: str) -> SceneEntry:
    """Parse and check one entry of ``scenes``; a problem is a one-line StoreError naming the entry."""
    label = f"scene {i}" + (f" ({str(d.get('name'))[:60]!r})" if isinstance(d, dict) and "name" in d else "")

    def bad(why: str) -> StoreError:
        return StoreError(f"{where}: {label}: {why}; write it again with `hsgds convert-many`")

    if not isinstance(d, dict):
        raise bad("is not a JSON object")
    for key in ("name", "path", "shape", "dtype", "num_classes", "source_sha256"):
        if key not in d:
            raise bad(f"has no {key!r}")
    name, path, shape, dtype = d["name"], d["path"], d["shape"], d["dtype"]
    if not isinstance(name, str) or not name:
        raise bad("name must be a non-empty string")
    if not isinstance(path, str) or not path:
        raise bad("path must be a non-empty string")
    if (not isinstance(shape, list) or len(shape) != 3
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)):
        raise bad(f"shape must be [H, W, B] of positive integers, got {str(shape)[:60]}")
    try:
        if not isinstance(dtype, str):
            raise TypeError
        dtype_name = _dtype_name(dtype)
    except TypeError:
        raise bad(f"dtype {str(dtype)[:30]!r} is not a numpy type name") from None
    bands = shape[2]
    if "bands" in d and d["bands"] != bands:
        raise bad(f"bands = {str(d['bands'])[:20]} disagrees with shape {shape}")

    def names_or_none(key: str, n: int | None) -> tuple | None:
        v = d.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v) or (n is not None and len(v) != n):
            raise bad(f"{key} must be null or a list of {n if n is not None else ''} strings".replace("  ", " "))
        return tuple(v)

    wl = d.get("wavelengths")
    if wl is not None and (not isinstance(wl, list) or len(wl) != bands or all(w is None for w in wl)
                           or not all(w is None or isinstance(w, (int, float)) and not isinstance(w, bool)
                                      for w in wl)):
        raise bad(f"wavelengths must be null or a list of {bands} numbers (nm; null for a band without a centre, "
                  "not for all)")
    bad_bands: tuple[int, ...] | None | Unset = UNLISTED  # (absent in a collection.json written before it)
    if "bad_bands" in d:
        v = d["bad_bands"]
        if v is not None and (not isinstance(v, list) or not set(map(type, v)) <= {int}
                              or not all(0 <= j < bands for j in v) or any(a >= b for a, b in zip(v, v[1:]))):
            raise bad(f"bad_bands must be null or ascending band indices in 0..{bands - 1}")
        bad_bands = None if v is None else tuple(v)
    k = d["num_classes"]
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise bad(f"num_classes must be a non-negative integer, got {str(k)[:20]}")
    samples = d.get("num_samples", 0)
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
        raise bad(f"num_samples must be a non-negative integer, got {str(samples)[:20]}")
    if not isinstance(d["source_sha256"], str):
        raise bad("source_sha256 must be a string")
    labels_sha = d.get("labels_sha256")
    if labels_sha is not None and not isinstance(labels_sha, str):
        raise bad("labels_sha256 must be null or a string")
    stamps = d.get("stamps")
    if stamps is not None:
        ok = isinstance(stamps, dict) and all(
            isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
            for v in stamps.values())
        if not ok:
            raise bad("stamps must be null or an object of [size, mtime_ns] pairs")
        stamps = {str(key): (v[0], v[1]) for key, v in stamps.items()}
    layout = {}
    for key, least in (("tile", 1), ("halo", 0), ("format_version", 1)):
        v = d.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < least):
            raise bad(f"{key} must be null or an integer >= {least}, got {str(v)[:20]}")
        layout[key] = v
    tile_samples = _tile_samples(d.get("tile_samples"), shape, layout["tile"], samples, bad)
    nodata = d.get("nodata_pixels")
    if nodata is not None and (type(nodata) is not int or not 0 <= nodata <= shape[0] * shape[1]):
        raise bad(f"nodata_pixels must be null or an integer in 0..{shape[0] * shape[1]}, got {str(nodata)[:20]}")
    if nodata and layout["format_version"] is not None and layout["format_version"] < 3:
        raise bad(f"nodata_pixels = {nodata}, but a format v{layout['format_version']} store has no nodata pixels")
    if wl and None in wl and layout["format_version"] is not None and layout["format_version"] < 4:
        raise bad(f"wavelengths has a band without a centre, but a format v{layout['format_version']} store has a "
                  "centre for every band")
    fingerprint = d.get("split_fingerprint")
    if fingerprint is not None and not isinstance(fingerprint, str):
        raise bad("split_fingerprint must be null or a string")
    full = Path(path) if os.path.isabs(path) else root / path
    return SceneEntry(**layout, name=name, path=full, shape=tuple(shape), dtype=dtype_name,
                      wavelengths=_centres(wl),
                      band_names=names_or_none("band_names", bands), bad_bands=bad_bands, num_classes=k,
                      class_names=names_or_none("class_names", None), num_samples=samples,
                      source_sha256=d["source_sha256"], labels_sha256=labels_sha, stamps=stamps,
                      tile_samples=tile_samples, nodata_pixels=nodata,
                      tile_nodata=_tile_nodata(d.get("tile_nodata"), shape, layout["tile"], nodata, bad),
                      split_fingerprint=fingerprint)


def split_record(scene: Any) -> dict[str, str] | None:
    """Which labels and split a labelled scene (a Scene, or a DeferredScene answered from its entry without
    opening the store) has: ``{"labels": labels' sha256, "split": split_fingerprint}``, or None when it has no
    labelled pixels or no recorded labels file. A model file keeps those it was trained on, so that a map is not
    scored against test pixels it was trained on (a store re-split since)."""
    if isinstance(scene, DeferredScene) and not scene.is_open:
        e = scene._collection.entries[scene._index]
        labels, fingerprint = e.labels_sha256, e.split_fingerprint
    else:
        m = scene.meta
        labels = m.labels_source.get("sha256") if isinstance(m.labels_source, dict) else None
        fingerprint = split_fingerprint(m.split, m.split_generation, m.labels_source) if m.num_samples else None
    if not isinstance(labels, str) or fingerprint is None:
        return None
    return {"labels": labels, "split": fingerprint}


def split_fingerprint(split: Any, generation: Any, labels_source: Any) -> str:
    """A short digest of a store's split record, split generation and labels' sha256 (as its zarr.json holds
    them): what collection.json lists, so that a store re-split (`hsgds resplit STORE`) or converted again
    after the listing was written is told from its zarr.json alone, without reading its sample arrays."""
    labels = labels_source.get("sha256") if isinstance(labels_source, dict) else None
    text = json.dumps({"split": split, "generation": generation, "labels": labels}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _centres(wavelengths: list | None) -> tuple[float | None, ...] | None:
    """A store's or entry's band centres as an entry holds them: floats, None for a band without one."""
    return None if wavelengths is None else tuple(None if w is None else float(w) for w in wavelengths)


@functools.lru_cache(maxsize=64)
def _dtype_name(text: str) -> str:
    """numpy's name of the type ``text`` names (TypeError if none): once per distinct string, not per entry."""
    return np.dtype(text).name


def _tile_counts(mask: np.ndarray | None, g: TileGrid) -> tuple[int, ...] | None:
    """Each tile's number of True pixels of an (H, W) mask (None: no mask), tiles in row-major order."""
    if mask is None:
        return None
    padded = np.zeros((g.nty * g.tile, g.ntx * g.tile), bool)
    padded[:g.height, :g.width] = mask
    return tuple(padded.reshape(g.nty, g.tile, g.ntx, g.tile).sum(axis=(1, 3), dtype=np.int64).reshape(-1).tolist())


def _tile_nodata(v: Any, shape: list[int], tile: int | None, nodata: int | None,
                 bad: Callable[[str], StoreError]) -> tuple[int, ...] | None:
    """An entry's ``tile_nodata``, checked: one count per tile, summing to ``nodata_pixels``."""
    if v is None:
        return None
    if tile is None or nodata is None:
        raise bad("lists tile_nodata without its tile size and nodata_pixels")
    num_tiles = -(-shape[0] // tile) * -(-shape[1] // tile)
    if not isinstance(v, list) or len(v) != num_tiles or not set(map(type, v)) <= {int} or (v and min(v) < 0):
        raise bad(f"tile_nodata must be null or {num_tiles} counts (one per tile)")
    if sum(v) != nodata:
        raise bad(f"tile_nodata count {sum(v)} pixels, nodata_pixels says {nodata}")
    return tuple(v)


def _tile_samples(v: Any, shape: list[int], tile: int | None, num_samples: int,
                  bad: Callable[[str], StoreError]) -> dict[str, tuple[int, ...]] | None:
    """An entry's ``tile_samples``, checked: per split name, one count per tile, summing to num_samples."""
    if v is None:
        return None
    if tile is None:
        raise bad("lists tile_samples without its tile size")
    num_tiles = -(-shape[0] // tile) * -(-shape[1] // tile)
    ok = isinstance(v, dict) and set(v) <= set(fmt.SPLIT_CODES) and all(
        isinstance(c, list) and len(c) == num_tiles for c in v.values())
    # every count at once: type(n) is int also refuses JSON's true/false, and map/set/min/sum keep the
    # loops in C (an archive's listing holds thousands of entries)
    counts = list(itertools.chain.from_iterable(v.values())) if ok else []
    if not ok or not set(map(type, counts)) <= {int} or (counts and min(counts) < 0):
        raise bad(f"tile_samples must be null or an object of split name -> {num_tiles} counts (one per tile)")
    if sum(counts) != num_samples:
        raise bad(f"tile_samples count {sum(counts)} samples, num_samples says {num_samples}")
    return {k: tuple(c) for k, c in v.items()}


class Collection:
    """Scenes listed by a ``collection.json``; use :func:`open_collection`.

    ``len(c)``, ``c[i]`` / ``c["name"]`` / ``c.scene(i)`` (a :class:`~hsgds.scene.Scene`, opened on first
    use and kept while it is among the ``max_open_scenes`` most recently used), iteration over the scenes
    (each opened as it is reached), ``c.scenes`` (the same lazy sequence), ``c.entries`` (per-scene
    metadata from ``collection.json``, nothing opened), the per-scene lists ``names``, ``paths``,
    ``shapes``, ``bands``, ``wavelengths``, ``bad_bands``, ``class_names``, ``num_classes``, and ``c.stale()`` (the scenes
    re-split since the listing was written, from each store's zarr.json).
    """

    def __init__(self, path: Path, entries: Sequence[SceneEntry]) -> None:
        self.path = path  #: the collection.json file
        self.root = path.parent
        self.entries: tuple[SceneEntry, ...] = tuple(entries)
        self._index = {e.name: i for i, e in enumerate(self.entries)}
        # opened stores, most recently used kept: an epoch over an archive visits thousands; the cache's lock
        # also serializes opening (a loader's reader and batch threads open scenes as they reach them)
        self._open: LruCache[Scene] = LruCache(int(defaults.get("max_open_scenes")))
        self._grids: dict[tuple, TileGrid] = {}  # one TileGrid per distinct geometry (an archive's scenes share one)

    def __repr__(self) -> str:
        return f"Collection({str(self.path)!r}, {len(self)} scenes)"

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, key):
        if isinstance(key, slice):
            return [self.scene(i) for i in range(len(self))[key]]
        return self.scene(key)

    def __iter__(self) -> Iterator[Scene]:
        for i in range(len(self)):
            yield self.scene(i)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    @property
    def scenes(self) -> Collection:
        """The scenes as a lazy sequence (each store is opened when its scene is first used)."""
        return self

    def index(self, name: str) -> int:
        """Position of the scene called ``name``."""
        if not isinstance(name, str) or name not in self._index:
            raise KeyError(f"{self.path}: no scene named {str(name)[:80]!r}")
        return self._index[name]

    def scene(self, key: int | str) -> Scene:
        """Open (once) and return scene ``key`` (position or name), checked against its entry."""
        i = self.index(key) if isinstance(key, str) else int(key)
        if not -len(self) <= i < len(self):
            raise IndexError(f"scene index {key} out of range for {len(self)} scenes")
        i %= len(self)
        return self._open.get(i, lambda: self._open_scene(self.entries[i]))

    def listing_problem(self, i: int, scene: Scene) -> str | None:
        """How scene ``i``'s opened store differs from its entry beyond what opening checks (its labelled
        samples, classes or wavelengths: the store was re-split or replaced after collection.json was
        written), or None."""
        e = self.entries[i]
        now = SceneEntry.of_scene(e.name, scene)
        fields = ("num_samples", "tile_samples", "num_classes", "class_names", "wavelengths", "bad_bands")
        unlisted = {"tile_samples": e.tile_samples is None, "bad_bands": isinstance(e.bad_bands, Unset)}
        for f in fields:
            if not unlisted.get(f, False) and getattr(now, f) != getattr(e, f):
                what = "labelled samples" if f in ("num_samples", "tile_samples") else f.replace("_", " ")
                return (f"{self.path}: scene {e.name!r}: its {what} differ from collection.json (the store was "
                        "re-split or replaced after the collection was written); re-split through the collection "
                        "(`hsgds resplit COLLECTION ...`) or run `hsgds convert-many` again")
        return None

    def stale(self) -> tuple[list[str], list[str], int]:
        """The labelled scenes whose store no longer holds the split collection.json lists (re-split, or
        converted again, after the listing was written), told by each store's zarr.json alone (its split
        record against the entry's ``split_fingerprint``; no array is read: cheap for thousands of scenes);
        the scenes whose zarr.json cannot be read; and how many labelled entries list no fingerprint (a
        collection.json written before they were listed), so were not checked."""
        stale, unreadable, unchecked = [], [], 0
        for e in self.entries:
            if not e.num_samples:
                continue
            if e.split_fingerprint is None:
                unchecked += 1
                continue
            try:
                raw, _ = fmt.read_metadata_file(e.path / "zarr.json", MAX_JSON_BYTES)
                attrs = json.loads(raw or b"null")["attributes"][fmt.FORMAT_NAME]
                now = split_fingerprint(attrs.get("split", {}), attrs.get("split_generation", 0),
                                        attrs.get("labels_source"))
            except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError):
                unreadable.append(e.name)
                continue
            if now != e.split_fingerprint:
                stale.append(e.name)
        return stale, unreadable, unchecked

    def is_open(self, i: int) -> bool:
        """Whether scene ``i``'s store is open now (nothing is read to answer): opened, and not yet dropped
        for more recently used ones (the ``max_open_scenes`` setting)."""
        return i in self._open

    def deferred(self, i: int) -> DeferredScene | None:
        """Scene ``i`` as a :class:`DeferredScene` (its store not opened yet), or None when its entry lacks
        the tile geometry a loader needs (a collection.json written before it was listed)."""
        e = self.entries[i]
        key = (e.shape, e.dtype, e.tile, e.halo)
        grid = self._grids.get(key) or e.grid
        if grid is None:
            return None
        self._grids[key] = grid
        return DeferredScene(self, i, grid)

    def _open_scene(self, e: SceneEntry) -> Scene:
        where = f"{self.path}: scene {e.name!r}"
        if not e.path.exists():
            raise StoreError(f"{where}: store {e.path} is missing; run `hsgds convert-many` again "
                             "or remove the scene from the collection")
        try:
            scene = open_scene(e.path)
        except StoreError as exc:
            raise StoreError(f"{where}: {exc}") from None
        g = scene.grid
        nodata = int(scene.meta.nodata["pixels"]) if scene.meta.nodata else 0
        found = (tuple(scene.shape), scene.meta.dtype, str(scene.meta.source.get("sha256", "")),
                 g.tile if e.tile is not None else None, g.halo if e.halo is not None else None,
                 scene.meta.format_version if e.format_version is not None else None,
                 nodata if e.nodata_pixels is not None else None)
        listed = (e.shape, e.dtype, e.source_sha256, e.tile, e.halo, e.format_version, e.nodata_pixels)
        if found != listed:
            names = ("shape", "dtype", "source sha256", "tile size", "halo", "format version", "nodata pixel count")
            what = next(n for n, a, b in zip(names, found, listed) if a != b)
            raise StoreError(f"{where}: the store's {what} differs from collection.json (the store was replaced "
                             "after the collection was written); run `hsgds convert-many` again")
        return scene

    # -- per-scene metadata, from collection.json alone ----------------------------------------
    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    @property
    def paths(self) -> list[Path]:
        """Absolute store paths."""
        return [e.path for e in self.entries]

    @property
    def shapes(self) -> list[tuple[int, int, int]]:
        return [e.shape for e in self.entries]

    @property
    def bands(self) -> list[int]:
        return [e.bands for e in self.entries]

    @property
    def wavelengths(self) -> list[tuple[float | None, ...] | None]:
        return [e.wavelengths for e in self.entries]

    @property
    def bad_bands(self) -> list[tuple[int, ...] | None]:
        """Each scene's bands its source flags bad (None: the source has no such list); from each store for
        an entry of a collection.json written before they were listed."""
        listed = [self.scene(i).bad_bands if isinstance(e.bad_bands, Unset) else e.bad_bands
                  for i, e in enumerate(self.entries)]
        return [None if b is None else tuple(b) for b in listed]

    @property
    def class_names(self) -> list[tuple[str, ...] | None]:
        return [e.class_names for e in self.entries]

    @property
    def num_classes(self) -> list[int]:
        return [e.num_classes for e in self.entries]


class DeferredScene:
    """A scene of a collection known from its ``collection.json`` entry alone: ``path``, ``shape``,
    ``dtype``, ``wavelengths``, ``band_names``, ``bad_bands`` (when the entry lists them), ``class_names``,
    ``num_classes``, ``num_samples``,
    ``tile_samples`` (None when not listed), ``nodata_pixels`` (None when not known from the entry),
    ``tile_nodata`` (None when not listed) and ``grid`` are answered without reading the store (``has_nodata`` too when the entry tells). Anything
    else (``meta``, ``tile_paths``, ``stats``, ``labels``, ...) opens the store first, checked against its
    entry (:meth:`Collection.scene`; again if it was dropped since), and is then the opened
    :class:`~hsgds.scene.Scene`'s. A loader over a collection thus starts without opening any store, and
    opens each as it first reaches one of its tiles (or, over labelled pixels, one of its samples).
    """

    def __init__(self, collection: Collection, index: int, grid: TileGrid) -> None:
        e = collection.entries[index]
        self._collection, self._index = collection, index
        self.path, self.shape, self.dtype, self.grid = e.path, e.shape, np.dtype(e.dtype), grid
        self.wavelengths, self.band_names = e.wavelengths, e.band_names
        if not isinstance(e.bad_bands, Unset):  # else read from the store when asked (__getattr__)
            self.bad_bands = None if e.bad_bands is None else list(e.bad_bands)
        self.class_names, self.num_classes, self.num_samples = e.class_names, e.num_classes, e.num_samples
        self.format_version, self.tile_samples = e.format_version, e.tile_samples
        # v1 and v2 stores have no nodata pixels: an entry that names its format version tells that much
        old = e.format_version is not None and e.format_version < 3
        self.nodata_pixels: int | None = 0 if e.nodata_pixels is None and old else e.nodata_pixels
        self.tile_nodata = e.tile_nodata

    def __repr__(self) -> str:
        return f"DeferredScene({str(self.path)!r}, {'open' if self.is_open else 'not opened yet'})"

    @property
    def is_open(self) -> bool:
        return self._collection.is_open(self._index)

    @property
    def has_nodata(self) -> bool:
        """:attr:`hsgds.scene.Scene.has_nodata`, from the entry when it lists the count (else the store is
        opened to read its metadata)."""
        if self.nodata_pixels is not None:
            return self.nodata_pixels > 0
        return self.open().has_nodata

    def open(self) -> Scene:
        """The opened scene (the store is opened and checked the first time)."""
        return self._collection.scene(self._index)

    def samples_at(self, tile: np.ndarray, sy: np.ndarray, sx: np.ndarray, label: np.ndarray) -> Any:
        """:meth:`hsgds.scene.Scene.samples_at`, from the entry's grid (nothing opened)."""
        return samples_at(self.grid, tile, sy, sx, label)

    def __getattr__(self, name: str) -> Any:  # only for what the entry does not answer
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.open(), name)


def is_collection_path(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a collection: a folder holding ``collection.json``, or a ``.json`` file (also one
    that does not exist, so that it is named as a missing listing, not as a missing store)."""
    p = Path(path)
    return (p.is_dir() and (p / COLLECTION_FILE).is_file()) or (not p.is_dir() and p.suffix == ".json")


def _collection_file(path: str | os.PathLike) -> Path:
    p = as_path(path, "a collection")
    if p.is_dir():
        p = p / COLLECTION_FILE
        if not p.is_file():
            raise StoreError(f"{p.parent} has no {COLLECTION_FILE}; write one with `hsgds convert-many`")
    elif not p.exists():
        raise StoreError(f"{p} does not exist; give a folder holding {COLLECTION_FILE}, or that file")
    return p.resolve()


@gc_paused()  # an archive's listing is ~100,000 small objects
def open_collection(path: str | os.PathLike) -> Collection:
    """Open a collection: a folder holding ``collection.json``, or that file.

    Only ``collection.json`` is read; stores are opened lazily (``collection.scene(i)``), so a listed
    store that is missing or damaged is reported, naming the scene, when that scene is first used.
    Problems with ``collection.json`` itself raise a one-line :class:`~hsgds.errors.StoreError`.
    """
    file = _collection_file(path)
    where = str(file)
    try:
        raw, size = fmt.read_metadata_file(file, MAX_JSON_BYTES)  # (a FIFO would block for ever: refused)
        if raw is None:
            raise StoreError(f"{where} is {size} bytes, too large for a collection listing")
        doc = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        if isinstance(exc, StoreError):
            raise
        raise StoreError(f"{where}: cannot read it ({one_line(exc, 200, with_type=True)}); "
                         "write it again with `hsgds convert-many`") from None
    if isinstance(doc, dict) and "zarr_format" in doc:  # any .json is taken for a collection: a store's too
        store = file.parent
        while (store.parent / "zarr.json").is_file():  # tiles/zarr.json: the store is the folder above
            store = store.parent
        raise StoreError(f"{where} is a store's Zarr metadata, not a collection: give the store folder {store} "
                         "instead")
    if not isinstance(doc, dict) or doc.get("format") != COLLECTION_FORMAT:
        raise StoreError(f"{where} is not an hsgds collection (no \"format\": \"{COLLECTION_FORMAT}\"); "
                         "write it with `hsgds convert-many`")
    version = doc.get("format_version")
    readable = f"this hsgds reads versions {READABLE_COLLECTION_VERSIONS[0]} to {READABLE_COLLECTION_VERSIONS[-1]}"
    if type(version) is int and version > COLLECTION_VERSION:
        raise StoreError(f"{where} was written by a newer hsgds (collection format version {str(version)[:20]}; {readable}): "
                         "upgrade hsgds, or write it again with this version's `hsgds convert-many`")
    if version not in READABLE_COLLECTION_VERSIONS or isinstance(version, bool):
        raise StoreError(f"{where} has collection format version {str(version)[:20]}; {readable}: write it again "
                         "with `hsgds convert-many`")
    scenes = doc.get("scenes")
    if not isinstance(scenes, list):
        raise StoreError(f"{where}: \"scenes\" must be a list; write it again with `hsgds convert-many`")
    entries = [_entry_from_json(d, i, file.parent, where) for i, d in enumerate(scenes)]
    seen: dict[str, int] = {}
    for i, e in enumerate(entries):
        if e.name in seen:
            raise StoreError(f"{where}: scenes {seen[e.name]} and {i} are both named {e.name!r}; names must be unique")
        seen[e.name] = i
    return Collection(file, entries)


def collection_version(entries: Sequence[SceneEntry]) -> int:
    """The oldest collection.json version that describes ``entries``: 2 when a scene has a band without a
    centre (a null among its wavelengths), else 1, which an hsgds older than version 2 reads too."""
    return 2 if any(e.wavelengths is not None and None in e.wavelengths for e in entries) else 1


def write_collection(folder: str | os.PathLike, entries: Sequence[SceneEntry], name: str = COLLECTION_FILE) -> Path:
    """Write ``folder/collection.json`` (or ``name``) atomically (a temporary file renamed over it); returns
    its path.

    Store paths are written relative to ``folder``. Readers either see the previous file or the new one.
    """
    folder = Path(folder)
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise StoreError(f"{folder}: scene names must be unique in a collection")
    root = folder.resolve()
    doc = {"format": COLLECTION_FORMAT, "format_version": collection_version(entries),
           "created_by": f"hsgds {__version__}", "scenes": [e.to_json(root) for e in entries]}
    out = folder / name
    try:
        # (its default temporary names the writing process, so that those of writers killed midway are removed)
        with atomic_path(out) as tmp, open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    except OSError as exc:
        # on Windows a collection.json another program holds open cannot be replaced
        hint = ("check that the folder is writable and close programs that have the file open"
                if isinstance(exc, PermissionError) else "check the output folder")
        raise StoreError(f"cannot write {out} ({exc.strerror or exc}); {hint}, then run the command again") from None
    return out
