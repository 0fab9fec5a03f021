"""Opening a store: metadata, labels, samples, statistics, and window reads reassembled from tiles."""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hsgds import format as fmt
from hsgds._wording import counted, listed
from hsgds.errors import ConfigError, InputError, StoreError, TileReadError, as_count, as_path, shown
from hsgds.sampling import SampleSet

__all__ = ["BandStats", "Scene", "check_mask", "open_scene", "samples_at"]


@dataclass(frozen=True)
class BandStats:
    """Per-band statistics in float64 (population std)."""

    mean: np.ndarray
    std: np.ndarray
    min: np.ndarray
    max: np.ndarray

    def __repr__(self) -> str:  # a summary: four arrays of 200 bands would fill a screen
        def span(a: np.ndarray) -> str:
            return f"{np.min(a):.4g}..{np.max(a):.4g}" if np.size(a) else "-"

        return (f"BandStats({np.size(self.mean)} bands; mean {span(self.mean)}, std {span(self.std)}, "
                f"min {span(self.min)}, max {span(self.max)})")


#: Largest zarr.json read: a root with a million tile checksums is ~12 MB; anything far larger is not ours.
MAX_JSON_BYTES = 256 << 20
#: dtypes of the small arrays (labels, samples, stats) a store may hold.
_SMALL_DTYPES = ("uint8", "uint16", "int32", "int64", "float64")


def _read_json(path: Path, where: str) -> dict:
    name = os.path.relpath(path, where) if path.is_relative_to(where) else path.name  # labels/zarr.json
    try:
        raw, size = fmt.read_metadata_file(path, MAX_JSON_BYTES)
        out = None if raw is None else json.loads(raw)
    except FileNotFoundError:
        raise StoreError(f"{where}: {name} is missing; this is not a complete hsgds store") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise StoreError(f"{where}: cannot read {name} ({type(exc).__name__}: {str(exc)[:200]}); convert the source "
                         "again") from None
    if raw is None:
        raise StoreError(f"{where}: {name} is {size} bytes, not Zarr metadata; convert the source again")
    if not isinstance(out, dict):
        raise StoreError(f"{where}: {name} is not a JSON object; convert the source again")
    return out


def _folder_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a store folder, or None when nothing is there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _is_raw(meta: dict) -> bool:
    """Whether an array's codecs are exactly one ``bytes`` codec, little-endian (the runtime reads raw bytes)."""
    codecs = meta.get("codecs")
    if not isinstance(codecs, list) or len(codecs) != 1 or not isinstance(codecs[0], dict):
        return False
    config = codecs[0].get("configuration") or {}
    return codecs[0].get("name") == "bytes" and isinstance(config, dict) and config.get("endian", "little") == "little"


def _tile_layout_problem(meta: dict, chunks: list[int]) -> str | None:
    """Why a tiles array's zarr.json does not describe the files the runtime reads (a Zarr v3 array, regular
    chunks of one whole tile, no storage transformer), or None. The runtime reads each tile's file by itself,
    so other chunks in the metadata would leave it reading what zarr-python cannot (or reads differently)."""
    if meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
        return (f"is not a Zarr v3 array (zarr_format {str(meta.get('zarr_format'))[:20]}, node_type "
                f"{str(meta.get('node_type'))[:20]})")
    grid = meta.get("chunk_grid")
    config = grid.get("configuration") if isinstance(grid, dict) else None
    if not isinstance(grid, dict) or grid.get("name") != "regular" or not isinstance(config, dict) or \
            config.get("chunk_shape") != chunks:
        return f"declares the chunk grid {str(grid)[:100]}, not regular chunks of one tile {chunks}"
    if meta.get("storage_transformers") not in (None, []):
        return "declares storage transformers (chunks stored elsewhere)"
    return None


def _raw_array_file(root: Path, name: str, shape: tuple[int, ...], checked: dict[str, str] | None = None
                    ) -> tuple[Path | None, np.dtype]:
    """The chunk file and little-endian dtype of a small uncompressed Zarr v3 array written by the
    converter (one chunk, codec bytes); None for an empty array.

    ``shape`` is what the store's own metadata implies; the array's zarr.json must agree, and the chunk
    file must have exactly that many bytes, before anything is allocated. ``checked``: the folders of
    this store already checked by :func:`hsgds.format.inside` (shared by a scene's reads)."""
    where = f"{root}: array {name}"
    meta = _read_json(root / name / "zarr.json", str(root))
    try:
        declared = tuple(meta["shape"])
        dtype_name = meta["data_type"]
        chunk_shape = tuple(meta["chunk_grid"]["configuration"]["chunk_shape"])
    except (KeyError, TypeError) as exc:
        raise StoreError(f"{where} has invalid Zarr metadata ({type(exc).__name__}: {exc}); convert again") from None
    if declared != shape:
        raise StoreError(f"{where} has shape {list(declared)[:8]}, expected {list(shape)}; convert again")
    if dtype_name not in _SMALL_DTYPES:
        raise StoreError(f"{where} has data type {str(dtype_name)[:20]!r}, not one of {', '.join(_SMALL_DTYPES)}; "
                         "convert again")
    dtype = np.dtype(dtype_name).newbyteorder("<")
    if 0 in shape:
        return None, dtype
    if chunk_shape != shape or not _is_raw(meta):
        raise StoreError(f"{where} is not stored as a single raw little-endian chunk; convert again")
    path = fmt.inside(root, root / name / fmt.chunk_key(meta, (0,) * len(shape)), str(root), checked)
    expected = int(np.prod(shape)) * dtype.itemsize
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise StoreError(f"{where}: cannot read {path.name} ({exc.strerror or exc})") from None
    if size != expected:
        raise StoreError(f"{where} has {size} bytes, expected {expected}; convert again")
    return path, dtype


def _read_raw_array(root: Path, name: str, shape: tuple[int, ...], checked: dict[str, str] | None = None,
                    every: int = 1) -> np.ndarray:
    """A small uncompressed array written by the converter (checked as :func:`_raw_array_file` says);
    ``every`` > 1 (2-D arrays): only ``array[::every, ::every]``, read row by row, so a scene's label
    map is never held whole when only a sampled grid of it is needed."""
    path, dtype = _raw_array_file(root, name, shape, checked)
    native = dtype.newbyteorder("=")
    if path is None:
        empty = np.zeros(shape, dtype=native)
        return empty[::every, ::every] if every > 1 else empty
    rows = range(0, shape[0], every) if every > 1 else None
    try:
        if rows is None:
            data = np.fromfile(path, dtype=dtype)
        else:
            row = shape[1] * dtype.itemsize
            parts = []
            with open(path, "rb") as f:
                for y in rows:
                    f.seek(y * row)
                    line = f.read(row)
                    parts.append(np.frombuffer(line[:len(line) // dtype.itemsize * dtype.itemsize], dtype)[::every])
            data = np.concatenate(parts)
            shape = (len(rows), len(range(0, shape[1], every)))
    except OSError as exc:
        raise StoreError(f"{root}: array {name}: cannot read {path.name} ({exc.strerror or exc})") from None
    if data.size != int(np.prod(shape)):
        raise StoreError(f"{root}: array {name} has {data.size} values, expected {int(np.prod(shape))}; convert again")
    return data.reshape(shape).astype(native, copy=False)


def _held(array: np.ndarray) -> np.ndarray:
    """``array``, read-only: a Scene holds it once read and hands out the same array each time, so a caller's
    in-place edit (``labels[labels == 3] = 0``) would change what every later use of the scene reads."""
    array.flags.writeable = False
    return array


class Scene:
    """A converted hyperspectral scene (an hsgds store, format v1 to v4).

    Use :func:`open_scene`. Attributes: ``shape`` (H, W, B), ``dtype``, ``wavelengths`` (nm, None for a band
    without a centre; or None),
    ``band_names``, ``bad_bands`` (the bands the source flags bad, e.g. an ENVI ``bbl``'s water-vapour bands, or
    None) and ``good_bands`` (the others, to pass as ``bands=``), ``labels`` (H, W), ``stats`` ({"train": BandStats | None, "all": BandStats}),
    ``meta`` (the full :class:`hsgds.format.StoreMeta`), ``grid`` (tile geometry) and ``tile_paths``.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        # absolute: its arrays and tiles are read on first use and on each read, from the folder opened even after
        # os.chdir (a relative path then named another folder, or none)
        self.path = as_path(path, "a store").absolute()
        if not self.path.is_dir():
            raise StoreError(f"{self.path} is not a store directory; create one with `hsgds convert`")
        self._folder = _folder_identity(self.path)  # `hsgds convert` renames a new folder over the store
        where = str(self.path)
        try:
            root = _read_json(self.path / "zarr.json", where)
        except StoreError:
            if (self.path / "collection.json").is_file():  # checked only when the store fails to open
                raise StoreError(f"{where} is a collection (collection.json), not a store: give one of its "
                                 f"scenes' stores, e.g. {where}/<name>.zarr (`hsgds info {where}` lists them)") from None
            stores = sorted(p.name for p in self.path.glob("*.zarr") if p.is_dir())
            if stores and not (self.path / "zarr.json").exists():  # a convert-many stopped before its listing
                raise StoreError(f"{where} holds {counted(len(stores), 'store')} ({listed(stores, 3)}) but no "
                                 "collection.json (a `hsgds convert-many` into it did not finish): run that command "
                                 f"again to finish it, or give the stores themselves, e.g. {where}/{stores[0]}") from None
            raise
        self.meta = fmt.StoreMeta.from_json(root.get("attributes", {}), where)
        self.grid = self.meta.grid
        self.shape: tuple[int, int, int] = self.meta.shape
        self.dtype = np.dtype(self.meta.dtype)
        self.wavelengths = self.meta.wavelengths
        self.band_names = self.meta.band_names
        self.bad_bands = self.meta.bad_bands
        self.num_classes = self.meta.num_classes
        self.class_names = self.meta.class_names
        tiles_meta = _read_json(self.path / fmt.TILES / "zarr.json", where)
        expected = [self.grid.nty, self.grid.ntx, *self.grid.tile_shape]
        if not isinstance(tiles_meta.get("shape"), list) or tiles_meta["shape"] != expected:
            raise StoreError(f"{where}: tiles array has shape {str(tiles_meta.get('shape'))[:60]}, expected {expected}; "
                             "convert the source again")
        if tiles_meta.get("data_type") != self.meta.dtype or not _is_raw(tiles_meta):
            raise StoreError(f"{where}: tiles are not raw little-endian {self.meta.dtype} chunks "
                             f"(data type {str(tiles_meta.get('data_type'))[:20]}); convert the source again")
        why = _tile_layout_problem(tiles_meta, [1, 1, *self.grid.tile_shape])
        if why:
            raise StoreError(f"{where}: the tiles array's zarr.json {why}; convert the source again")
        self.tile_paths = fmt.tile_paths(self.path, self.grid, tiles_meta)
        self._labels: np.ndarray | None = None
        self._nodata: np.ndarray | None = None  # the nodata map, once read() needs it
        self._samples: dict[str, np.ndarray] | None = None
        self._stats: dict[str, BandStats | None] = {}  # per group, read on first use
        self._checked: dict[str, str] = {}  # store folders already checked to stay inside the store

    def _replaced(self) -> str | None:
        """Why this Scene no longer describes the store at its path (converted again since it was opened: another
        folder there, with other tiles, labels, samples and statistics), or None. The arrays read on first use
        would otherwise be another conversion's, with no error (its statistics, a label map of the same shape),
        and its tiles fail their checksums as if damaged."""
        if _folder_identity(self.path) == self._folder:
            return None
        return (f"{self.path} was converted again (or replaced) since this Scene opened it; open it again: "
                "hsgds.open_scene(path)")

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # unpickled on another machine (a DataArray sent to a dask worker): its mount of the store has another
        # device number
        self._folder = _folder_identity(self.path)

    def _check_unchanged(self) -> None:
        why = self._replaced()
        if why:
            raise StoreError(why)

    def _check_not_resplit(self) -> None:
        """Raise a StoreError when the store was re-split twice or more since this Scene read its metadata: `hsgds
        resplit` keeps one previous generation of split codes and train statistics, so this Scene's are gone, and
        their absence read as a damaged store (or no train statistics). Called when they are found missing."""
        try:
            attrs: Any = _read_json(self.path / "zarr.json", str(self.path)).get("attributes")
            now = attrs[fmt.FORMAT_NAME]["split_generation"]
        except (StoreError, KeyError, TypeError):
            return  # (the store's own problem is reported as it is)
        if now != self.meta.split_generation:
            raise StoreError(f"{self.path} was re-split (`hsgds resplit`) since this Scene opened it (split generation "
                             f"{self.meta.split_generation}, now {str(now)[:20]}); open it again: hsgds.open_scene(path)")

    def __repr__(self) -> str:
        h, w, b = self.shape
        g = self.grid
        return (f"Scene({str(self.path)!r}, {h}x{w}x{b} {self.dtype}, {counted(g.num_tiles, 'tile')} (core "
                f"{g.tile}x{g.tile}, halo {g.halo}), {self.meta.num_samples} labelled pixels)")

    # -- labels, samples, statistics ------------------------------------------------------------
    @property
    def labels(self) -> np.ndarray:
        """(H, W) class map; 0 = unlabelled."""
        if self._labels is None:
            self._check_unchanged()
            self._labels = _held(_read_raw_array(self.path, fmt.LABELS, self.shape[:2], self._checked))
        return self._labels

    def labels_every(self, stride: int) -> np.ndarray:
        """``labels[::stride, ::stride]``: the class map at every ``stride``-th pixel, read without
        holding the whole map (unless it is already held, or ``stride`` is 1)."""
        stride = as_count(stride, "stride")  # (0 or -1 read the whole map, unreversed: not numpy's [::stride])
        if stride == 1 or self._labels is not None:
            return self.labels[::stride, ::stride]
        self._check_unchanged()
        return _read_raw_array(self.path, fmt.LABELS, self.shape[:2], self._checked, every=stride)

    @property
    def good_bands(self) -> list[int]:
        """The indices of the bands the source does not flag bad (every band when it flags none): pass them as
        ``PatchLoader(..., bands=scene.good_bands)`` to leave the bad ones (an ENVI ``bbl``'s 0s) out."""
        bad = set(self.bad_bands or ())
        return [b for b in range(self.shape[2]) if b not in bad]

    @property
    def has_nodata(self) -> bool:
        """Whether the source had pixels without data (format v3 records them; they are never samples)."""
        return bool(self.meta.nodata and self.meta.nodata["pixels"])

    def nodata_every(self, stride: int = 1) -> np.ndarray | None:
        """``nodata[::stride, ::stride]`` as a bool map, True where the source had no data (its tiles hold the
        fill value there); None when the scene has no such pixel."""
        stride = as_count(stride, "stride")
        if not self.has_nodata:
            return None
        self._check_unchanged()
        return _read_raw_array(self.path, fmt.NODATA, self.shape[:2], self._checked, every=stride) != 0

    def sample_table(self) -> dict[str, np.ndarray]:
        """The raw per-sample arrays (tile, y, x local to the tile core, label, split) and ``offsets``."""
        if self._samples is None:
            self._check_unchanged()
            n = self.meta.num_samples
            # the split codes of the generation the metadata names (`hsgds resplit` writes new ones aside)
            names = {f: fmt.split_array(self.meta.split_generation) if f == "split" else f"{fmt.SAMPLES}/{f}"
                     for f in fmt.SAMPLE_FIELDS}
            try:
                table = {f: _read_raw_array(self.path, names[f], (n,), self._checked) for f in fmt.SAMPLE_FIELDS}
            except StoreError:
                self._check_not_resplit()
                raise
            table["offsets"] = _read_raw_array(self.path, f"{fmt.SAMPLES}/offsets", (self.grid.num_tiles + 1,),
                                               self._checked)
            self._check_samples(table)
            self._samples = {f: _held(a) for f, a in table.items()}
        return self._samples

    def _check_samples(self, t: dict[str, np.ndarray]) -> None:
        """Sample coordinates index tiles and ring slots at training time: refuse out-of-range values here."""
        g, n = self.grid, self.meta.num_samples
        problems = []
        if n and (t["tile"].min() < 0 or t["tile"].max() >= g.num_tiles or np.any(np.diff(t["tile"]) < 0)):
            problems.append("tile ids out of range or unsorted")
        if n and (min(t["y"].min(), t["x"].min()) < 0 or max(t["y"].max(), t["x"].max()) >= g.tile):
            problems.append(f"positions outside the {g.tile}x{g.tile} tile core")
        if n and not problems:  # an edge tile's core runs past the scene: a position there is no scene pixel
            ty, tx = np.divmod(t["tile"].astype(np.int64), g.ntx)
            if np.any(ty * g.tile + t["y"] >= g.height) or np.any(tx * g.tile + t["x"] >= g.width):
                problems.append(f"positions outside the {g.height}x{g.width} scene")
        if n and (t["split"].max() > fmt.SPLIT_TEST):
            problems.append("unknown split codes")
        if n and (t["label"].min() < 1 or t["label"].max() > self.meta.num_classes):
            problems.append(f"labels outside 1..{self.meta.num_classes}")
        counts = np.bincount(t["tile"].astype(np.int64), minlength=g.num_tiles) if n and not problems else None
        offsets = t["offsets"]
        if offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0) or (
                counts is not None and not np.array_equal(np.diff(offsets), counts)):
            problems.append("offsets disagree with the tile ids")
        if problems:
            raise StoreError(f"{self.path}: sample arrays are inconsistent ({'; '.join(problems)}); convert again")

    def sample_set(self, split: str | None = "train", mask: np.ndarray | None = None) -> SampleSet:
        """The labelled pixels of ``split`` ("train", "val", "test", "none" or None for all), sorted by
        tile, optionally only where the boolean (H, W) ``mask`` is True: what the loader iterates."""
        mask = check_mask(mask, self, str(self.path))
        t = self.sample_table()
        keep = self.split_mask(t["split"], split)
        tile = t["tile"][keep].astype(np.int64)
        ty, tx = np.divmod(tile, self.grid.ntx)
        sy = ty * self.grid.tile + t["y"][keep]
        sx = tx * self.grid.tile + t["x"][keep]
        label = t["label"][keep].astype(np.int64) - 1
        if mask is not None:
            inside = mask[sy, sx]
            tile, sy, sx, label = tile[inside], sy[inside], sx[inside], label[inside]
        return self.samples_at(tile, sy, sx, label)

    def samples_at(self, tile: np.ndarray, sy: np.ndarray, sx: np.ndarray, label: np.ndarray) -> SampleSet:
        """A :class:`~hsgds.sampling.SampleSet` of scene pixels (``sy``, ``sx``) already sorted by ``tile``,
        with class indices ``label`` (see :func:`samples_at`)."""
        return samples_at(self.grid, tile, sy, sx, label)

    @property
    def num_samples(self) -> int:
        """Labelled pixels in the store."""
        return int(self.meta.num_samples)

    def samples(self, split: str | None = "train") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(y, x, label) of the labelled pixels of ``split`` ("train", "val", "test", "none" or None for
        all), in scene coordinates, sorted by tile."""
        s = self.sample_set(split)
        return s.scene_y.astype(np.int64), s.scene_x.astype(np.int64), s.label.astype(np.int64) + 1

    @staticmethod
    def split_mask(codes: np.ndarray, split: str | None) -> np.ndarray:
        """Which entries of a ``samples/split`` array belong to ``split`` (None: all of them)."""
        if split is None:
            return np.ones(len(codes), dtype=bool)
        if not isinstance(split, str) or split not in fmt.SPLIT_CODES:  # a list is unhashable: checked first
            raise InputError(f"unknown split {shown(split)}; choose one of {', '.join(fmt.SPLIT_CODES)} (one name), "
                             "or None for every labelled pixel")
        return codes == fmt.SPLIT_CODES[split]

    @property
    def stats(self) -> dict[str, BandStats | None]:
        """{"train": statistics of the TRAIN pixels or None, "all": of every pixel or None}."""
        return {group: self._stat_group(group) for group in fmt.STAT_GROUPS}

    def _stat_group(self, group: str) -> BandStats | None:
        """One group's statistics, read on first use (a loader needs one group of each of its scenes)."""
        if group not in self._stats:
            self._check_unchanged()
            name = fmt.train_stats_group(self.meta.split_generation) if group == "train" else f"{fmt.STATS}/{group}"
            if (self.path / name).is_dir():
                self._stats[group] = BandStats(*(_held(_read_raw_array(self.path, f"{name}/{f}", (self.shape[2],),
                                                                       self._checked)) for f in fmt.STAT_FIELDS))
            else:
                if group == "train" and self.meta.stats_split == "train":
                    self._check_not_resplit()
                self._stats[group] = None
        return self._stats[group]

    @property
    def norm_stats(self) -> BandStats:
        """The statistics used for normalization: TRAIN pixels, or every pixel if the scene has no train split."""
        train = self._stat_group("train")
        if train is None and self.meta.stats_split == "train" and self._stat_group("all") is not None:
            # the store has a train split: falling back to every pixel's statistics would leak the test
            # pixels into the normalization, silently
            group = fmt.train_stats_group(self.meta.split_generation)
            raise StoreError(f"{self.path}: the train statistics ({group}) are missing, though the store records a "
                             "train split; convert the source again")
        picked = train if train is not None else self._stat_group("all")
        if picked is None:
            raise StoreError(f"{self.path} has no band statistics (stats/ is missing); convert the source again")
        return picked

    # -- tiles and windows -----------------------------------------------------------------------
    def read_tile(self, tile_id: int, verify: bool = True) -> np.ndarray:
        """One halo-padded tile, (S, S, B) in the store's dtype; checks size and (by default) checksum."""
        if not 0 <= as_count(tile_id, "tile_id", minimum=0) < self.grid.num_tiles:
            raise InputError(f"tile id {tile_id} out of range 0..{self.grid.num_tiles - 1}")
        try:
            raw = fmt.read_tile_file(tile_id, self.tile_paths[tile_id], self.grid.tile_nbytes,
                                     self.meta.checksums[tile_id] if verify else None)
        except TileReadError:
            why = self._replaced()  # (not damaged: another conversion's tile)
            if why:
                raise TileReadError(f"tile {tile_id}: {why}") from None
            raise
        return np.frombuffer(raw, dtype=self.dtype.newbyteorder("<")).reshape(self.grid.tile_shape)

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Scene window rows y0:y1, columns x0:x1, all bands, reassembled from the tiles (bit-identical
        to the source: a nodata pixel, filled in the tiles, reads the source's nodata value)."""
        h, w, b = self.shape
        y0, y1, x0, x1 = (as_count(v, "a window bound", minimum=0) for v in (y0, y1, x0, x1))
        if not (0 <= y0 < y1 <= h and 0 <= x0 < x1 <= w):
            raise InputError(f"window [{y0}:{y1}, {x0}:{x1}] is empty or outside the scene {h}x{w}")
        out = np.empty((y1 - y0, x1 - x0, b), dtype=self.dtype)
        t, halo = self.grid.tile, self.grid.halo
        for ty in range(y0 // t, (y1 - 1) // t + 1):
            for tx in range(x0 // t, (x1 - 1) // t + 1):
                tile = self.read_tile(ty * self.grid.ntx + tx)
                ya, yb = max(y0, ty * t), min(y1, (ty + 1) * t)
                xa, xb = max(x0, tx * t), min(x1, (tx + 1) * t)
                out[ya - y0:yb - y0, xa - x0:xb - x0] = tile[ya - ty * t + halo:yb - ty * t + halo,
                                                             xa - tx * t + halo:xb - tx * t + halo]
        if self.has_nodata:
            if self._nodata is None:  # one byte a pixel, held once read: windows are read many times
                self._nodata = self.nodata_every(1)
            assert self._nodata is not None and self.meta.nodata is not None
            out[self._nodata[y0:y1, x0:x1]] = float(self.meta.nodata["value"])  # ("nan" -> NaN)
        return out

    def to_xarray(self):
        """The cube as a lazily loaded ``xarray.DataArray`` with dims ``(y, x, band)``.

        Coordinates: ``band`` (0..B-1), ``wavelength`` (nm, when the store knows them; NaN for a band
        without a centre) and ``band_name``
        (when known); for a georeferenced store, ``x`` / ``y`` map coordinates of the pixel centres (north-up
        transforms) and ``spatial_ref`` holding the CRS and transform (the rioxarray convention). Nothing is
        read until values are needed, and then only the tiles under the selected window
        (``da.isel(y=slice(0, 64)).values`` reads one tile row; spectra picked at points, or lists of rows and
        columns, read the tiles where those rows and columns meet, not the span between them). No dask needed.
        Needs ``pip install "hsgds[xarray]"``; raises :class:`~hsgds.errors.DependencyError` otherwise.
        """
        from hsgds._xarray import scene_to_xarray

        return scene_to_xarray(self)

    def verify(self) -> list[str]:
        """Re-read every tile and check its size, crc32c and (format v2) wsum64 device checksum, and read the
        arrays loaders use beside the tiles (labels, samples, statistics, the nodata map); return one line per problem (empty
        when the store is intact)."""
        arrays, tiles = self.verify_parts()
        return arrays + tiles

    def verify_parts(self) -> tuple[list[str], list[str]]:
        """:meth:`verify`'s problems in two lists: those of the arrays beside the tiles (with the statistics
        recomputed from the tiles as they are read), and those of the tiles."""
        why = self._replaced()
        if why:  # one line, not one per tile and array of the other conversion
            return [why], []
        recomputed = _StatsCheck(self)
        tiles = self.verify_tiles(recomputed.add)
        return self.verify_arrays() + recomputed.problems(), tiles

    def verify_tiles(self, seen: Callable[[int, np.ndarray], None] | None = None) -> list[str]:
        """Re-read every tile and check its size and checksums; one line per bad tile. ``seen(tile_id, tile)``,
        when given, is called with each tile that passes."""
        from hsgds import checksum

        problems = []
        device = self.meta.device_checksums
        for i in range(self.grid.num_tiles):
            try:
                tile = self.read_tile(i)
                if device is not None and checksum.checksum_of(tile) != checksum.decode(device[i]):
                    raise fmt.checksum_error(i, self.tile_paths[i], fmt.DEVICE_CHECKSUM_ALGORITHM)
            except TileReadError as exc:
                problems.append(str(exc))
            else:
                if seen is not None:
                    seen(i, tile)
        return problems

    def _nodata_problems(self) -> list[str]:
        """What is wrong with the nodata map a v3 store's record promises (pixels > 0): unreadable, of the
        wrong shape or type, marking another count of pixels, or labelled (or sampled) somewhere."""
        record = self.meta.nodata
        if not self.has_nodata or record is None:
            return []
        try:
            raw = _read_raw_array(self.path, fmt.NODATA, self.shape[:2], self._checked)
        except StoreError as exc:
            return [str(exc)]
        where = f"{self.path}: array {fmt.NODATA}"
        if raw.dtype != np.uint8 or raw.max(initial=0) > 1:
            return [f"{where} must hold uint8 0 or 1, got {raw.dtype} up to {raw.max(initial=0)}; convert the source "
                    "again"]
        nodata = raw != 0
        problems = []
        marked, recorded = int(nodata.sum()), int(record["pixels"])
        if marked != recorded:
            problems.append(f"{where} marks {marked} pixels, the metadata records {recorded}; convert the source again")
        try:
            labelled = int(np.count_nonzero(self.labels[nodata]))
            y, x, _ = self.samples(None)
            sampled = int(np.count_nonzero(nodata[y, x]))
        except StoreError:
            return problems  # (the labels' or samples' own problem is reported with them)
        if labelled or sampled:
            problems.append(f"{where}: {labelled} nodata pixels are labelled and {sampled} are samples (the converter "
                            "drops both); convert the source again")
        return problems

    def _label_problems(self) -> list[str]:
        """Where the label map and the sample table disagree. Neither has a checksum, and loaders read both
        (labelled samples from the table; ``pixels="all"`` and predict's ground truth from the map): every
        sample must be a distinct pixel holding its class in the map, and the map must label no other pixel."""
        try:
            labels = self.labels
        except StoreError:
            return []  # (reported with the labels)
        y, x, label = self.samples(None)
        n = len(label)
        wrong = int(np.count_nonzero(labels[y, x] != label))
        distinct = len(np.unique(y * self.shape[1] + x))
        labelled = int(np.count_nonzero(labels))
        if not wrong and distinct == n and labelled == n:
            return []
        return [f"{self.path}: the labels and the samples disagree ({wrong} of {n} samples hold another class in "
                f"the labels, {n - distinct} repeat a pixel, the labels mark {labelled} labelled pixels); convert "
                "the source again"]

    def _resplit_command(self) -> str:
        """The ``hsgds resplit`` that makes the store's recorded random or block split again (the same labels,
        method, amounts and seed give the same codes), or "" when the record cannot say it."""
        r = self.meta.split
        seed = r.get("seed")
        if r.get("method") not in ("random", "blocks") or _recorded_amounts(r) is None or \
                not (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
            return ""
        size = "" if r.get("adaptive_block_size", True) or r.get("method") == "random" else \
            f" --block-size {r.get('block_size')}"
        return (f"hsgds resplit {shlex.quote(str(self.path))} --split {r['method']} --train {r['train']} --val {r['val']}{size} "
                f"--seed {r['seed']}")

    def _split_problems(self, t: dict[str, np.ndarray]) -> list[str]:
        """Where the split codes disagree with the split the metadata records. The codes have no checksum, and a
        code flipped between val and test changes no statistic. What the record allows: a random split's
        per-class train/val/test counts follow from the labels and its amounts (no pixel in no split); a block
        split gives each block of its recorded grid one split (val/test pixels the guard dropped are in
        none), and records how many the guard dropped. A swap within a class, a whole block moved, or a mask
        split (its masks are not in the store) cannot be seen."""
        r, codes, label = self.meta.split, t["split"].astype(np.int64), t["label"].astype(np.int64)
        if not len(codes):
            return []
        name = fmt.split_array(self.meta.split_generation)
        found = np.bincount(label * 4 + codes, minlength=(int(label.max()) + 1) * 4).reshape(-1, 4)
        wrong = ""
        amounts = _recorded_amounts(r)
        if r.get("method") == "random" and amounts is not None:
            classes = np.flatnonzero(found.sum(1))
            n = found[classes].sum(1)
            want, older = (np.stack([np.zeros_like(n), t, v, n - t - v], axis=1)
                           for t, v in (fmt.random_split_sizes(n, *amounts, float_rounding=old) for old in (False, True)))
            # a store split before the exact rounding (2026-12-03) holds the counts of the older rule
            bad = np.flatnonzero(np.any(found[classes] != want, axis=1) & np.any(found[classes] != older, axis=1))
            if len(bad):
                c = int(classes[bad[0]])
                have, should = found[c], want[bad[0]]
                wrong = (f"not the recorded random split's (train {r['train']}, val {r['val']} of each class): "
                         f"{counted(len(bad), 'class', 'classes')} differ, e.g. class {c} has {have[1]} train, "
                         f"{have[2]} val, {have[3]} test and {have[0]} unsplit pixels, the split gives {should[1]}, "
                         f"{should[2]}, {should[3]} and 0")
        elif r.get("method") == "blocks" and isinstance(r.get("block_size"), int) and 1 <= r["block_size"] < 1 << 31 \
                and isinstance(r.get("block_origin"), list) and len(r["block_origin"]) == 2 and \
                all(isinstance(o, int) and -r["block_size"] < o <= 0 for o in r["block_origin"]):
            bs, (oy, ox) = r["block_size"], r["block_origin"]
            y, x, _ = self.samples(None)
            nbx = (self.shape[1] - ox) // bs + 1
            _, block = np.unique(((y - oy) // bs) * nbx + (x - ox) // bs, return_inverse=True)
            held = np.bincount(block.ravel() * 4 + codes, minlength=(int(block.max()) + 1) * 4).reshape(-1, 4) > 0
            # one split per block: train alone, or val or test with the pixels the guard dropped
            mixed = np.flatnonzero(held[:, 1:].sum(1) + (held[:, 0] & held[:, 1]) > 1)
            lost, none = r.get("guard_lost"), int(np.count_nonzero(codes == fmt.SPLIT_NONE))
            parts = [f"{counted(len(mixed), 'block')} of its {bs}x{bs} grid (origin {[oy, ox]}) "
                     f"{'holds' if len(mixed) == 1 else 'hold'} pixels of two splits"] if len(mixed) else []
            if _is_number(lost) and lost != none:
                parts.append(f"{counted(none, 'pixel')} in no split, the record says the guard dropped {lost}")
            if parts:
                wrong = f"not the recorded block split's ({'; '.join(parts)})"
        if not wrong:
            return []
        command = self._resplit_command()
        fix = f"run `{command}` (the recorded split again) or convert the source again" if command else \
            "convert the source again"
        return [f"{self.path}: the split codes ({name}) are {wrong}; they are damaged: {fix}"]

    def _class_count_problems(self) -> list[str]:
        """A class count above every class the store holds or names. The converter records the largest of its
        labels' classes and of the class names given; a labelled pixel dropped as nodata may have taken the
        largest class with it, so such a store is not checked. (A count below the labels' largest class is
        named with the labels.)"""
        if (self.meta.nodata or {}).get("labelled_dropped"):
            return []
        try:
            largest = int(self.labels.max(initial=0))
        except StoreError:
            return []  # (reported with the labels)
        if self.num_classes <= max(largest, len(self.class_names or ())):  # (fewer names than classes: refused on open)
            return []
        return [f"{self.path}: the metadata records {self.num_classes} classes, but the labels hold classes up to "
                f"{largest} and no class is named (num_classes was changed since the conversion); convert the source "
                "again"]

    def verify_arrays(self) -> list[str]:
        """What is wrong with the labels, samples, statistics and nodata map (missing, truncated, inconsistent,
        not finite), on which a loader or predict would stop or go wrong; one line per problem."""
        problems = self._nodata_problems()
        try:
            labels = self.labels
            if labels.size and int(labels.max()) > self.meta.num_classes:
                problems.append(f"{self.path}: labels hold class {int(labels.max())} but the store has "
                                f"{self.meta.num_classes} classes; convert again")
        except StoreError as exc:
            problems.append(str(exc))
        problems += self._class_count_problems()
        try:
            table = self.sample_table()
            problems += self._label_problems()
            problems += self._split_problems(table)
        except StoreError as exc:
            problems.append(str(exc))
        try:
            self.norm_stats  # noqa: B018 - raises when the store has none
            data = self.shape[0] * self.shape[1] - int((self.meta.nodata or {}).get("pixels", 0))
            if self._stat_group("all") is None and data > 0:
                # the converter writes them for every scene with a pixel of data; without them a loader sizes
                # its output range from the train statistics alone, silently
                problems.append(f"{self.path}: the whole-scene statistics ({fmt.STATS}/all) are missing; convert the "
                                "source again")
            for group, st in self.stats.items():
                if st is None:
                    continue
                bad = [f for f in fmt.STAT_FIELDS if not np.all(np.isfinite(getattr(st, f)))]
                if bad:
                    problems.append(f"{self.path}: the {group} statistics ({', '.join(bad)}) are not finite; convert "
                                    "a rescaled cube")
                elif np.any(st.std < 0) or np.any(st.max < st.min):  # (a mean may round past min or max)
                    problems.append(f"{self.path}: the {group} statistics are inconsistent (a negative std, or a max "
                                    "below the min); convert the source again")
        except StoreError as exc:
            problems.append(str(exc))
        return problems


def _is_number(v: Any) -> bool:
    """Whether a metadata value is a JSON number (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _recorded_amounts(record: dict) -> tuple[float | int, float | int] | None:
    """A split record's ``train`` and ``val`` when they are amounts a split is made with (a fraction in (0, 1)
    or a per-class count, val also 0; fractions summing below 1); None otherwise (then nothing is checked)."""
    def amount(v: Any, zero: bool) -> float | int | None:
        if isinstance(v, float):
            return v if math.isfinite(v) and (0 < v < 1 or (zero and v == 0)) else None
        return v if _is_number(v) and (0 if zero else 1) <= v < 1 << 62 else None

    train, val = amount(record.get("train"), False), amount(record.get("val"), True)
    if train is None or val is None or (isinstance(train, float) and isinstance(val, float) and train + val >= 1):
        return None
    return train, val


class _StatsCheck:
    """The band statistics recomputed from the tiles as ``hsgds verify`` reads them. The statistics and the split
    codes have no checksum: one flipped bit in a mean is a finite number that shifts a band of every patch, and
    a flipped split code moves a pixel into or out of train. Min and max must be equal; the converter's float64
    mean and std agree with these to about 1e-15 of a band's largest value, and a difference within
    ``TOLERANCE`` of it is below what float32 loses of the pixel values themselves, so harmless."""

    TOLERANCE = 1e-9

    def __init__(self, scene: Scene) -> None:
        self.scene = scene
        self.groups: dict[str, tuple[BandStats, list[Any]]] = {}  # group -> (recorded, [n, sum, sum of squares, min, max])
        try:
            recorded = scene.stats
            table = scene.sample_table() if recorded.get("train") is not None else None
            nodata = scene.nodata_every(1)
        except StoreError:
            return  # (reported by verify_arrays)
        bands = scene.shape[2]
        for group, st in recorded.items():
            if st is not None and np.all(np.isfinite(st.mean)):  # (not finite: reported by verify_arrays)
                self.groups[group] = (st, [0, np.zeros(bands), np.zeros(bands), np.full(bands, np.inf),
                                           np.full(bands, -np.inf)])
        self.table, self.nodata, self.seen = table, nodata, 0

    def add(self, tile_id: int, tile: np.ndarray) -> None:
        """Take the pixels of one tile that passed its checksums."""
        if not self.groups:
            return
        g, h = self.scene.grid, self.scene.grid.halo
        self.seen += 1
        if "train" in self.groups and self.table is not None:
            t = self.table
            lo, hi = int(t["offsets"][tile_id]), int(t["offsets"][tile_id + 1])
            train = t["split"][lo:hi] == fmt.SPLIT_TRAIN
            self._take("train", tile[h + t["y"][lo:hi][train], h + t["x"][lo:hi][train]])
        if "all" in self.groups:
            y0, y1, x0, x1 = g.core_window(tile_id)
            ty, tx = g.tile_yx(tile_id)
            core = tile[h + y0 - ty * g.tile:h + y1 - ty * g.tile, h + x0 - tx * g.tile:h + x1 - tx * g.tile]
            keep = np.ones(core.shape[:2], dtype=bool) if self.nodata is None else ~self.nodata[y0:y1, x0:x1]
            self._take("all", core[keep])

    def _take(self, group: str, pixels: np.ndarray) -> None:
        recorded, acc = self.groups[group]
        if not len(pixels):
            return
        with np.errstate(over="ignore", invalid="ignore"):  # (a mean flipped to 1e300: inf, a difference)
            x = pixels.astype(np.float64) - recorded.mean  # about the recorded mean: no cancellation in the sums
            acc[0] += len(x)
            acc[1] += x.sum(0)
            acc[2] += (x * x).sum(0)
        acc[3] = np.minimum(acc[3], pixels.min(0).astype(np.float64))
        acc[4] = np.maximum(acc[4], pixels.max(0).astype(np.float64))

    def problems(self) -> list[str]:
        """One line per group whose recorded statistics are not those of its pixels (none when a tile failed its
        checksums: those tiles are named instead)."""
        if not self.groups or self.seen != self.scene.grid.num_tiles:
            return []
        out = []
        for group, (recorded, (n, s1, s2, lo, hi)) in self.groups.items():
            if not n:
                continue
            with np.errstate(over="ignore", invalid="ignore"):
                mean = recorded.mean + s1 / n
                std = np.sqrt(np.maximum(s2 / n - (s1 / n) ** 2, 0.0))
                scale = np.maximum(np.abs(lo), np.abs(hi))
                found = {"mean": mean, "std": std, "min": lo, "max": hi}
                wrong = [(f, int(b)) for f in fmt.STAT_FIELDS  # min and max are pixel values: exactly equal
                         for b in np.flatnonzero(~(np.abs(getattr(recorded, f) - found[f])
                                                   <= (self.TOLERANCE * scale if f in ("mean", "std") else 0)))]
            if wrong:
                f, b = wrong[0]
                whose = "its train pixels" if group == "train" else "every pixel with data"
                damaged = "the statistics or the split codes are" if group == "train" else "the statistics are"
                out.append(f"{self.scene.path}: the {group} statistics differ from those of the tiles (the {f} of band "
                           f"{b} of {whose} is {found[f][b]:.10g}, recorded {getattr(recorded, f)[b]:.10g}): {damaged} "
                           "damaged; convert the source again")
        return out


def check_mask(mask: object, scene: Any, where: str) -> np.ndarray | None:
    """``mask`` as a boolean (H, W) array of ``scene`` (a Scene or a collection's DeferredScene), or None; a
    wrong shape or type is a ConfigError (an integer mask would index pixels, not select them)."""
    if mask is None:
        return None
    to_host = getattr(mask, "cpu", None)  # a torch tensor (labels > 0 computed on the GPU has no host buffer)
    try:
        arr = np.asarray(to_host() if callable(to_host) else mask)
    except (TypeError, ValueError):  # e.g. a ragged list of rows: numpy's own message names no mask
        raise ConfigError(f"mask for {where} must be a boolean (H, W) array, got a {type(mask).__name__} numpy cannot "
                          "read as one (rows of different lengths?); pass e.g. labels > 0") from None
    h, w = scene.shape[:2]
    if arr.dtype != bool:
        raise ConfigError(f"mask for {where} must be a boolean array, got dtype {arr.dtype}; pass e.g. labels > 0")
    if arr.shape != (h, w):
        raise ConfigError(f"mask for {where} has shape {arr.shape}, but the scene is {h}x{w}; pass an (H, W) array")
    return arr


def samples_at(grid: fmt.TileGrid, tile: np.ndarray, sy: np.ndarray, sx: np.ndarray, label: np.ndarray) -> SampleSet:
    """A :class:`~hsgds.sampling.SampleSet` of the scene pixels (``sy``, ``sx``) of a store with tiles
    ``grid``, already sorted by ``tile``, with class indices ``label``. Small dtypes: a 4096x1024 scene at
    stride 1 is 4M samples, so int32 instead of int64 keeps the set near 100 MB."""
    t, h = grid.tile, grid.halo
    ty, tx = np.divmod(tile, grid.ntx)
    return SampleSet(tile=tile.astype(np.int32), y=(sy - ty * t + h).astype(np.int32),
                     x=(sx - tx * t + h).astype(np.int32), label=label.astype(np.int32),
                     scene_y=sy.astype(np.int32), scene_x=sx.astype(np.int32),
                     offsets=fmt.tile_offsets(tile.astype(np.int64), grid.num_tiles))


def open_scene(path: str | os.PathLike) -> Scene:
    """Open a store written by ``hsgds convert``."""
    return Scene(path)
