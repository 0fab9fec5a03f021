"""Store format v1: the contract between the converter (preprocess/) and the runtime (hsgds/).

See docs/format.md for the specification. This module holds every name, constant and layout rule of
the format so that the writer and the readers cannot disagree.
"""

from __future__ import annotations

FORMAT_NAME = "hsgds"
FORMAT_VERSION = 1

#: Split codes stored per labelled pixel in ``samples/split``. 0 = labelled but in no split (e.g. a
#: pixel in the guard band of a block split).
SPLIT_NONE = 0
SPLIT_TRAIN = 1
SPLIT_VAL = 2
SPLIT_TEST = 3
SPLIT_CODES = {"none": SPLIT_NONE, "train": SPLIT_TRAIN, "val": SPLIT_VAL, "test": SPLIT_TEST}

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hsgds.errors import StoreError

#: Every tile chunk's byte size is a multiple of this, so GDS / O_DIRECT reads need no bounce buffer.
ALIGNMENT = 4096
PADDING_MODES = ("reflect", "edge", "zero")
DEFAULT_HALO = 7  # patches up to 15x15
CHECKSUM_ALGORITHM = "crc32c"

TILES = "tiles"
LABELS = "labels"
SAMPLES = "samples"
STATS = "stats"
#: per-sample arrays in ``samples/``, all of one length, sorted by tile then (y, x)
SAMPLE_FIELDS = ("tile", "y", "x", "label", "split")
STAT_FIELDS = ("mean", "std", "min", "max")
#: ``stats/train`` (train pixels only, used for normalization) and ``stats/all`` (every scene pixel)
STAT_GROUPS = ("train", "all")


def alignment_step(bytes_per_pixel: int) -> int:
    """Smallest k such that a (k*m) x (k*m) tile of ``bytes_per_pixel`` is a multiple of ALIGNMENT bytes."""
    k = 1
    while (k * k * bytes_per_pixel) % ALIGNMENT:
        k *= 2
    return k


def choose_tile(height: int, width: int, bytes_per_pixel: int, halo: int,
                min_bytes: int = 1 << 20, max_bytes: int = 8 << 20) -> int:
    """Pick the core tile size T: aligned tiles of about 1-8 MiB that waste the fewest stored bytes.

    The padded side S = T + 2*halo must be a multiple of :func:`alignment_step`; among the sides whose
    tile is within [min_bytes, max_bytes] (or the one closest to that range) take the one that stores
    the least in total (halo overhead plus the unused part of the last tile row and column).
    """
    k = alignment_step(bytes_per_pixel)
    sides = []
    s = k
    while s <= 2 * halo:
        s += k
    limit = max(height, width) + 2 * halo + k
    while True:
        sides.append(s)
        if s * s * bytes_per_pixel > max_bytes or s > limit:
            break
        s += k
    in_range = [s for s in sides if min_bytes <= s * s * bytes_per_pixel <= max_bytes]
    if not in_range:  # tiny pixels or huge spectra: take the side nearest the range
        in_range = [min(sides, key=lambda s: abs(math.log(s * s * bytes_per_pixel / 4e6)))]

    def stored(side: int) -> tuple[int, int]:
        t = side - 2 * halo
        return (math.ceil(height / t) * math.ceil(width / t) * side * side, -side)

    return min(in_range, key=stored) - 2 * halo


@dataclass(frozen=True)
class TileGrid:
    """Geometry of a store's tiles: core size T, halo h, padded side S = T + 2h, band-last layout."""

    height: int
    width: int
    bands: int
    dtype: str
    tile: int
    halo: int

    @property
    def side(self) -> int:
        return self.tile + 2 * self.halo

    @property
    def nty(self) -> int:
        return math.ceil(self.height / self.tile)

    @property
    def ntx(self) -> int:
        return math.ceil(self.width / self.tile)

    @property
    def num_tiles(self) -> int:
        return self.nty * self.ntx

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def tile_shape(self) -> tuple[int, int, int]:
        return (self.side, self.side, self.bands)

    @property
    def tile_nbytes(self) -> int:
        return self.side * self.side * self.bands * self.itemsize

    def tile_yx(self, tile_id: int) -> tuple[int, int]:
        return divmod(int(tile_id), self.ntx)

    def core_window(self, tile_id: int) -> tuple[int, int, int, int]:
        """Scene window (y0, y1, x0, x1) whose pixels this tile owns (its core, clipped to the scene)."""
        ty, tx = self.tile_yx(tile_id)
        y0, x0 = ty * self.tile, tx * self.tile
        return y0, min(y0 + self.tile, self.height), x0, min(x0 + self.tile, self.width)

    def check(self) -> None:
        if self.tile < 1 or self.halo < 0:
            raise StoreError(f"invalid tile geometry: tile={self.tile}, halo={self.halo}")
        if self.tile_nbytes % ALIGNMENT:
            raise StoreError(f"tile of {self.tile_nbytes} bytes is not a multiple of {ALIGNMENT}")


def padded_index(positions: np.ndarray, n: int, halo: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Map padded coordinates to source coordinates along one axis of length ``n``.

    Returns (index, valid). Positions in [-halo, n + halo) follow numpy.pad's ``mode``
    ('reflect' = numpy 'reflect', 'edge', or 'zero' = constant 0); positions inside [0, n) map to
    themselves. ``valid`` is False where the value is zero: outside [0, n) in 'zero' mode, and always
    beyond the halo (the unused filler at the end of the last tile row/column).
    """
    p = np.asarray(positions, dtype=np.int64)
    if mode == "reflect":
        if n == 1:
            idx = np.zeros_like(p)
        else:
            period = 2 * (n - 1)
            idx = np.abs(p) % period
            idx = np.where(idx >= n, period - idx, idx)
    elif mode == "edge":
        idx = np.clip(p, 0, n - 1)
    elif mode == "zero":
        idx = np.clip(p, 0, n - 1)
    else:
        raise ValueError(f"unknown padding mode {mode!r}")
    inside = (p >= 0) & (p < n)
    in_halo = (p >= -halo) & (p < n + halo)
    valid = inside if mode == "zero" else in_halo
    return idx, valid


@dataclass
class StoreMeta:
    """The ``hsgds`` attributes of a store's root group (format v1). Written last: a store whose
    attributes do not parse as this is incomplete."""

    shape: tuple[int, int, int]
    dtype: str
    tile: int
    halo: int
    padding: str
    num_classes: int
    checksums: list[int]
    num_samples: int = 0
    class_names: list[str] | None = None
    wavelengths: list[float] | None = None
    band_names: list[str] | None = None
    source: dict[str, Any] = field(default_factory=dict)
    labels_source: dict[str, Any] | None = None
    split: dict[str, Any] = field(default_factory=dict)
    stats_split: str = "train"
    checksum_algorithm: str = CHECKSUM_ALGORITHM
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION
    created_by: str = ""

    @property
    def grid(self) -> TileGrid:
        h, w, b = self.shape
        return TileGrid(h, w, b, self.dtype, self.tile, self.halo)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_json(cls, attrs: dict[str, Any], where: str) -> "StoreMeta":
        meta = attrs.get(FORMAT_NAME)
        if not isinstance(meta, dict):
            raise StoreError(f"{where} is not a complete hsgds store (no 'hsgds' metadata); "
                             "convert the source again with `hsgds convert`")
        version = meta.get("format_version")
        if version != FORMAT_VERSION:
            raise StoreError(f"{where} has store format version {version}; this hsgds reads version "
                             f"{FORMAT_VERSION}: convert the source again with this version")
        known = {f for f in cls.__dataclass_fields__}
        try:
            out = cls(**{k: v for k, v in meta.items() if k in known})
            out.shape = tuple(int(v) for v in out.shape)  # type: ignore[assignment]
            out.grid.check()
        except (TypeError, ValueError) as exc:
            raise StoreError(f"{where} has invalid hsgds metadata ({exc}); convert the source again") from None
        if out.padding not in PADDING_MODES:
            raise StoreError(f"{where} has unknown padding mode {out.padding!r}")
        if len(out.checksums) != out.grid.num_tiles:
            raise StoreError(f"{where} lists {len(out.checksums)} tile checksums for {out.grid.num_tiles} tiles")
        return out


def chunk_key(array_meta: dict[str, Any], coords: tuple[int, ...]) -> str:
    """The store key of one chunk, from the array's own ``chunk_key_encoding`` (Zarr v3 spec)."""
    enc = array_meta.get("chunk_key_encoding", {"name": "default"})
    sep = enc.get("configuration", {}).get("separator", "/" if enc.get("name") == "default" else ".")
    if enc.get("name") == "default":
        return "c" + sep + sep.join(str(c) for c in coords)
    if enc.get("name") == "v2":
        return sep.join(str(c) for c in coords)
    raise StoreError(f"unsupported chunk key encoding {enc!r}")


def tile_paths(store: Path, grid: TileGrid, array_meta: dict[str, Any]) -> list[Path]:
    """File path of every tile chunk, indexed by tile id (ty * ntx + tx)."""
    base = Path(store) / TILES
    return [base / chunk_key(array_meta, (ty, tx, 0, 0, 0))
            for ty in range(grid.nty) for tx in range(grid.ntx)]
