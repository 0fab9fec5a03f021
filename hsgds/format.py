"""Store format v4: the contract between the converter (preprocess/) and the runtime (hsgds/).

See docs/format.md for the specification. This module holds every name, constant and layout rule of
the format so that the writer and the readers cannot disagree.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import crc32c
import numpy as np

from hsgds import checksum
from hsgds._wording import listed, runs
from hsgds.errors import ChecksumError, StoreError, TileReadError, control_character

FORMAT_NAME = "hsgds"
#: The newest store format version; the converter records the oldest one that describes a store
#: (:meth:`StoreMeta.oldest_version`), so an older hsgds reads every store it can.
FORMAT_VERSION = 4
#: Versions this runtime reads. v1 stores have no device checksums: the kvikio reader checks their tiles on
#: the host (with a warning); v1 and v2 stores record no source nodata (every pixel is data); v1 to v3 stores
#: have a centre for every band, or none.
READABLE_VERSIONS = (1, 2, 3, 4)

#: Split codes stored per labelled pixel in ``samples/split``. 0 = labelled but in no split (e.g. a
#: pixel in the guard band of a block split).
SPLIT_NONE = 0
SPLIT_TRAIN = 1
SPLIT_VAL = 2
SPLIT_TEST = 3
SPLIT_CODES = {"none": SPLIT_NONE, "train": SPLIT_TRAIN, "val": SPLIT_VAL, "test": SPLIT_TEST}

#: Every tile chunk's byte size is a multiple of this, so GDS / O_DIRECT reads need no bounce buffer.
ALIGNMENT = 4096
PADDING_MODES = ("reflect", "edge", "zero")
DEFAULT_HALO = 7  # patches up to 15x15
CHECKSUM_ALGORITHM = "crc32c"
#: The per-tile checksum a GPU computes cheaply (hsgds.checksum), written beside crc32c since format v2.
DEVICE_CHECKSUM_ALGORITHM = checksum.ALGORITHM

#: Largest tile the runtime accepts: a ring slot is allocated per tile, so metadata must not be able to
#: ask for more (the converter's automatic choice is 1-8 MiB).
MAX_TILE_BYTES = 1 << 31
#: Largest halo (patch radius) a store may declare; patches beyond 1025x1025 are not patches.
MAX_HALO = 512
#: Largest class id a store holds: labels are uint16 (class maps and ``hsgds predict`` take up to 65535 classes).
MAX_LABEL = 65535
#: Band centres a store records (nm): ultraviolet to thermal infrared. Outside it they are another unit
#: (micrometres labelled as nanometres), band numbers, or wrong.
MIN_NM, MAX_NM = 100.0, 20000.0
#: numpy names of the sample types a store may hold (docs/format.md).
DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float32", "float64")

TILES = "tiles"
LABELS = "labels"
#: (H, W) uint8, 1 where the source had no data (format v3; written only when it had some)
NODATA = "nodata"
SAMPLES = "samples"
STATS = "stats"
#: per-sample arrays in ``samples/``, all of one length, sorted by tile then (y, x)
SAMPLE_FIELDS = ("tile", "y", "x", "label", "split")
STAT_FIELDS = ("mean", "std", "min", "max")
#: ``stats/train`` (train pixels only, used for normalization) and ``stats/all`` (every scene pixel)
STAT_GROUPS = ("train", "all")
#: Largest ``split_generation`` a store may declare (``hsgds resplit`` adds one each time).
MAX_SPLIT_GENERATION = 2**31 - 1


def split_array(generation: int = 0) -> str:
    """Store path of the per-sample split codes of a split generation (0: as converted, ``samples/split``).

    ``hsgds resplit`` writes a new split under a new name and then switches the root metadata to it, so
    a reader always finds the split its metadata names (see docs/format.md)."""
    return f"{SAMPLES}/split" if generation == 0 else f"{SAMPLES}/split-{int(generation)}"


def train_stats_group(generation: int = 0) -> str:
    """Store path of the train statistics of a split generation (0: ``stats/train``)."""
    return f"{STATS}/train" if generation == 0 else f"{STATS}/train-{int(generation)}"


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
        if self.tile_nbytes > MAX_TILE_BYTES:
            raise StoreError(f"tiles of {self.side}x{self.side}x{self.bands} {self.dtype} are {self.tile_nbytes} "
                             f"bytes, over the {MAX_TILE_BYTES >> 30} GiB limit; use a smaller --tile")


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
    elif mode == "edge" or mode == "zero":
        idx = np.clip(p, 0, n - 1)
    else:
        raise ValueError(f"unknown padding mode {mode!r}")
    inside = (p >= 0) & (p < n)
    in_halo = (p >= -halo) & (p < n + halo)
    valid = inside if mode == "zero" else in_halo
    return idx, valid


@dataclass
class StoreMeta:
    """The ``hsgds`` attributes of a store's root group (format v4; v1 lacks the device checksums, v1 and v2
    the nodata record, v1 to v3 a band without a centre). Written last: a store whose attributes do not parse
    as this is incomplete."""

    shape: tuple[int, int, int]
    dtype: str
    tile: int
    halo: int
    padding: str
    num_classes: int
    checksums: list[int]
    num_samples: int = 0
    class_names: list[str] | None = None
    #: band centres in nm, None (null) for a band without one (v4: an unused detector band); None: none known
    wavelengths: list[float | None] | None = None
    band_names: list[str] | None = None
    #: the bands the source flags bad (an ENVI header's ``bbl``), ascending indices; None: the source has no such
    #: list (or the store was written before hsgds recorded them)
    bad_bands: list[int] | None = None
    #: the value which, divided into the stored values, scales them to 0-1 reflectance (an ENVI header's
    #: ``reflectance scale factor``, e.g. 10000; the values are stored as the source holds them); None: the
    #: source gives none (or the store was written before hsgds recorded it)
    reflectance_scale_factor: float | None = None
    source: dict[str, Any] = field(default_factory=dict)
    georeference: dict[str, Any] | None = None
    #: True when the source's coordinates name pixel centres (a GeoTIFF's PixelIsPoint); ``georeference``'s
    #: transform is the corner's all the same. Class maps are written as PixelIsPoint again (absent in older
    #: stores: False, and an older hsgds ignores it)
    pixel_is_point: bool = False
    labels_source: dict[str, Any] | None = None
    split: dict[str, Any] = field(default_factory=dict)
    #: the ``split`` record as converted, kept through re-splits (None: a store written before it existed)
    converted_split: dict[str, Any] | None = None
    stats_split: str = "train"
    split_generation: int = 0
    checksum_algorithm: str = CHECKSUM_ALGORITHM
    #: per tile, the wsum64 pair as 32 hex digits (hsgds.checksum.encode); None in a v1 store
    device_checksums: list[str] | None = None
    device_checksum_algorithm: str | None = None
    #: the source's nodata value and what became of its pixels (v3; None: the source recorded none and
    #: none was given): ``{"value", "pixels", "labelled_dropped", "fill"}``, see docs/format.md
    nodata: dict[str, Any] | None = None
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION
    created_by: str = ""

    @property
    def grid(self) -> TileGrid:
        h, w, b = self.shape
        return TileGrid(h, w, b, self.dtype, self.tile, self.halo)

    def oldest_version(self) -> int:
        """The oldest format version that describes this metadata, which the converter records: 4 when a band
        has no centre (a null in ``wavelengths``), else 3 when there is a ``nodata`` record, else 2 (device
        checksums; 1 without them). An hsgds that reads only older versions then refuses exactly the stores it
        would misread: a v3 reader calls a null centre damaged, a v2 reader ignores the nodata record."""
        if self.wavelengths is not None and None in self.wavelengths:
            return 4
        if self.nodata is not None:
            return 3
        return 1 if self.device_checksums is None else 2

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_json(cls, attrs: dict[str, Any], where: str) -> StoreMeta:
        """Parse and validate the ``hsgds`` attribute; every problem is a StoreError naming the field.

        Store metadata is untrusted input: types and ranges are checked before any value is used to size
        an allocation or build a path.
        """
        meta = attrs.get(FORMAT_NAME) if isinstance(attrs, dict) else None
        if not isinstance(meta, dict):
            raise StoreError(f"{where} is not a complete hsgds store (no 'hsgds' metadata); "
                             "convert the source again with `hsgds convert`")
        version = meta.get("format_version")
        readable = f"this hsgds reads versions {READABLE_VERSIONS[0]} to {READABLE_VERSIONS[-1]}"
        if type(version) is int and version > FORMAT_VERSION:
            raise StoreError(f"{where} was written by a newer hsgds (store format version {str(version)[:20]}; "
                             f"{readable}): upgrade hsgds, or convert the source again with this version")
        if version not in READABLE_VERSIONS or isinstance(version, bool):
            raise StoreError(f"{where} has store format version {repr(version)[:20]}; {readable}: convert the source "
                             "again with this version")
        known = {f for f in cls.__dataclass_fields__}
        try:
            out = cls(**{k: v for k, v in meta.items() if k in known})
        except TypeError as exc:
            raise StoreError(f"{where} has invalid hsgds metadata ({exc}); convert the source again") from None
        out._validate(where)
        return out

    def _validate(self, where: str) -> None:
        def bad(name: str, why: str) -> StoreError:
            value = repr(getattr(self, name, None))
            return StoreError(f"{where}: invalid hsgds metadata: {name} = {value[:80]} ({why}); "
                              "convert the source again")

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def str_list(name: str, length: int | None) -> None:
            v = getattr(self, name)
            if v is None:
                return
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise bad(name, "must be a list of strings or null")
            if length is not None and len(v) != length:
                raise bad(name, f"must have {length} entries")

        if self.format != FORMAT_NAME:
            raise bad("format", f"must be {FORMAT_NAME!r}")
        if not isinstance(self.shape, (list, tuple)) or len(self.shape) != 3 or \
                not all(is_int(v) and v >= 1 for v in self.shape):
            raise bad("shape", "must be [H, W, B], three positive integers")
        self.shape = tuple(self.shape)  # type: ignore[assignment]
        if self.dtype not in DTYPES:
            raise bad("dtype", f"must be one of {', '.join(DTYPES)}")
        if not is_int(self.tile) or self.tile < 1:
            raise bad("tile", "must be a positive integer")
        if not is_int(self.halo) or not 0 <= self.halo <= MAX_HALO:
            raise bad("halo", f"must be an integer in 0..{MAX_HALO}")
        if self.padding not in PADDING_MODES:
            raise StoreError(f"{where} has unknown padding mode {str(self.padding)[:40]!r} (this hsgds knows "
                             f"{', '.join(PADDING_MODES)}); convert the source again")
        for name in ("num_classes", "num_samples"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise bad(name, "must be a non-negative integer")
        h, w, b = self.shape
        if self.num_classes > MAX_LABEL:  # reports size per-class tables by it: 10**12 asked for terabytes
            raise bad("num_classes", f"a store holds classes 1..{MAX_LABEL} at most")
        if self.num_samples > h * w:
            raise bad("num_samples", f"a {h}x{w} scene has at most {h * w} labelled pixels")
        if self.checksum_algorithm != CHECKSUM_ALGORITHM:
            raise bad("checksum_algorithm", f"must be {CHECKSUM_ALGORITHM!r}")
        if self.stats_split not in ("train", "all"):
            raise bad("stats_split", "must be 'train' or 'all'")
        if not is_int(self.split_generation) or not 0 <= self.split_generation <= MAX_SPLIT_GENERATION:
            raise bad("split_generation", f"must be an integer in 0..{MAX_SPLIT_GENERATION}")
        for name in ("source", "split"):
            if not isinstance(getattr(self, name), dict):
                raise bad(name, "must be an object")
        for name in ("labels_source", "converted_split"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), dict):
                raise bad(name, "must be an object or null")
        if not isinstance(self.created_by, str):
            raise bad("created_by", "must be a string")
        if self.georeference is not None:
            why = georeference_problem(self.georeference)
            if why:
                raise bad("georeference", why)
        scale = self.reflectance_scale_factor
        if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
                                      and math.isfinite(scale) and scale > 0):
            raise bad("reflectance_scale_factor", "must be a finite number above 0 or null")
        if not isinstance(self.pixel_is_point, bool) or (self.pixel_is_point and self.georeference is None):
            raise bad("pixel_is_point", "must be true or false, and false without a georeference")
        str_list("class_names", None)
        # reports name class k with class_names[k - 1]; an unlabelled scene of a collection keeps the
        # collection's names (convert-many --class-names) with no class of its own, so more names are fine
        if self.class_names is not None and len(self.class_names) < self.num_classes:
            raise bad("class_names", f"must name each of the {self.num_classes} classes")
        for k, text in enumerate(self.class_names or (), start=1):  # they go into XML sidecars and ENVI headers
            if (ch := control_character(text)) is not None:
                raise bad("class_names", f"the name of class {k} holds the control character {ch}")
        str_list("band_names", b)
        if self.bad_bands is not None and (
                not isinstance(self.bad_bands, list) or not all(is_int(i) and 0 <= i < b for i in self.bad_bands)
                or any(i >= j for i, j in zip(self.bad_bands, self.bad_bands[1:]))):
            raise bad("bad_bands", f"must be ascending band indices in 0..{b - 1}, or null")
        if self.wavelengths is not None:
            why = wavelengths_problem(self.wavelengths, b)
            if why:
                raise bad("wavelengths", why)
            if self.format_version < 4 and None in self.wavelengths:
                raise bad("wavelengths", f"a format v{self.format_version} store has a centre for every band")
        try:
            self.grid.check()
        except StoreError as exc:
            raise StoreError(f"{where}: {exc}; convert the source again") from None
        # a tile count computed from hostile numbers must be compared before anything is sized by it
        if not isinstance(self.checksums, list):
            raise bad("checksums", "must be a list")
        if len(self.checksums) != self.grid.num_tiles:
            raise StoreError(f"{where} lists {len(self.checksums)} tile checksums for {self.grid.num_tiles} tiles; "
                             "convert the source again")
        if not all(is_int(c) and 0 <= c <= 0xFFFFFFFF for c in self.checksums):
            raise bad("checksums", "must be unsigned 32-bit integers")
        if self.format_version < 3 and self.nodata is not None:
            raise bad("nodata", f"a format v{self.format_version} store has none")
        if self.nodata is not None:
            why = nodata_problem(self.nodata, h * w)
            if why:
                raise bad("nodata", why)
        if self.format_version == 1:
            if self.device_checksums is not None or self.device_checksum_algorithm is not None:
                raise bad("device_checksums", "a format v1 store has none")
            return
        if self.device_checksum_algorithm != DEVICE_CHECKSUM_ALGORITHM:
            raise bad("device_checksum_algorithm", f"must be {DEVICE_CHECKSUM_ALGORITHM!r}")
        if not isinstance(self.device_checksums, list):
            raise bad("device_checksums", "must be a list")
        if len(self.device_checksums) != self.grid.num_tiles:
            raise StoreError(f"{where} lists {len(self.device_checksums)} device checksums for "
                             f"{self.grid.num_tiles} tiles; convert the source again")
        if not all(isinstance(c, str) and len(c) == 32 and all(ch in "0123456789abcdef" for ch in c)
                   for c in self.device_checksums):
            raise bad("device_checksums", "must be 32 lowercase hex digits each")


#: how the converter fills a nodata pixel's bands in the tiles: with the mean of the statistics the loader
#: normalizes with (so a patch z-scored with the scene's own statistics reads 0 there), rounded to the store's dtype
NODATA_FILLS = ("train mean", "scene mean")


def nodata_value(value: float) -> float | str:
    """A nodata value as JSON holds it: a number, or "nan" (JSON has no NaN)."""
    return "nan" if math.isnan(value) else float(value)


def nodata_text(value: float | str | None) -> str:
    """A recorded nodata value as messages show it: -9999 (not -9999.0), nan; none when there is none."""
    return "none" if value is None else value if isinstance(value, str) else f"{value:g}"


def nodata_problem(record: Any, pixels: int) -> str | None:
    """Why ``record`` is not a valid ``nodata`` record for a scene of ``pixels`` pixels (None: it is)."""
    if not isinstance(record, dict):
        return "must be an object or null"
    value = record.get("value")
    if not (value == "nan" or isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
        return "value must be a finite number or \"nan\""
    for key in ("pixels", "labelled_dropped"):
        n = record.get(key)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= pixels:
            return f"{key} must be an integer in 0..{pixels}"
    if record["labelled_dropped"] > record["pixels"]:
        return "labelled_dropped counts nodata pixels, so it cannot exceed pixels"
    if record["pixels"] and record.get("fill") not in NODATA_FILLS:
        return f"fill must be one of {', '.join(map(repr, NODATA_FILLS))} when pixels > 0"
    if not record["pixels"] and record.get("fill") is not None:
        return "fill must be null when no pixel is nodata (nothing was filled)"
    return None


def describe_georeference(geo: dict) -> str:
    """One line: the CRS (EPSG code, or the WKT's name) and the transform's origin and pixel size."""
    x0, dx, rx, y0, ry, dy = geo["transform"]
    if geo.get("epsg"):
        crs = f"EPSG:{geo['epsg']}"
    elif geo.get("crs_wkt"):
        wkt = geo["crs_wkt"]
        name = wkt.split('"')[1] if wkt.count('"') >= 2 else wkt[:40]
        crs = f"WKT {name!r}"
    else:
        crs = "no CRS (transform only)"
    rotated = f", rotation terms {rx:g}, {ry:g}" if rx or ry else ""
    return f"{crs}; origin ({x0:.10g}, {y0:.10g}), pixel {dx:.10g} x {dy:.10g}{rotated}"


def wavelengths_problem(wavelengths: Any, bands: int) -> str | None:
    """Why ``wavelengths`` is not a valid non-null ``wavelengths`` value for ``bands`` bands (None: it is):
    one entry per band, each a finite number (nm) or None for a band without a centre, at least one a number
    (a list without any centre is stored as null)."""
    if not isinstance(wavelengths, list) or len(wavelengths) != bands or not all(
            v is None or isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in wavelengths):
        return f"must be {bands} finite numbers (null for a band without a centre) or null"
    if all(v is None for v in wavelengths):
        return "gives no band a centre, which is written as null"
    return None


def wavelength_array(wavelengths: Any) -> np.ndarray:
    """Band centres as float64 nm, NaN for a band without one (a null entry)."""
    return np.array([math.nan if w is None else float(w) for w in wavelengths], dtype=np.float64)


def centred(wavelengths: Any) -> list[float]:
    """The band centres there are (null entries left out), in band order: what a span is taken over."""
    return [float(w) for w in wavelengths if w is not None]


def describe_wavelengths(wavelengths: Any) -> str:
    """The span of band centres in nm, lowest to highest whatever their order ("402.5-972.7 nm"), and
    "(descending)" for a sensor that lists its bands from the longest wavelength down (PRISMA); bands without
    a centre (PRISMA's unused ones) take no part in either and are named after it."""
    nm = centred(wavelengths)
    falling = len(nm) > 1 and all(a > b for a, b in zip(nm, nm[1:]))
    text = f"{min(nm):.1f}-{max(nm):.1f} nm" + (" (descending)" if falling else "")
    missing = [i for i, w in enumerate(wavelengths) if w is None]
    if missing:
        several = len(missing) > 1
        text += (f"; band{'s' * several} {listed(missing, 8)} {'have' if several else 'has'} no centre "
                 "(unused)")
    return text


def describe_reflectance_scale(scale: float) -> str:
    """What a reflectance scale factor means for the values ("divided by 10000 they are 0-1 reflectance ...")."""
    return (f"divided by {scale:g} the values are 0-1 reflectance (the source's reflectance scale factor; they "
            "are stored as the source holds them)")


def describe_bad_bands(bad: list[int], bands: int) -> str:
    """The bands a source flags bad, as runs of indices ("5 of 224 flagged bad by the source (bbl): 104-108")."""
    spans = [f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in runs(bad)]
    shown = ", ".join(spans[:8]) + (f" and {len(spans) - 8} more runs" if len(spans) > 8 else "")
    return f"{len(bad)} of {bands} flagged bad by the source (bbl): {shown or 'none'}"


#: Largest coordinate reference system text accepted (a WKT is a few KB).
MAX_CRS_WKT = 1 << 16


def georeference_problem(geo: Any) -> str | None:
    """Why ``geo`` is not a valid ``georeference`` value, or None when it is.

    The value is ``{"transform": [6 numbers], "crs_wkt": str | None, "epsg": int | None}``: the affine
    transform from pixel (column, row) to map coordinates in GDAL order (x0, dx, rx, y0, ry, dy), whose
    pixel (0, 0) corner is at (x0, y0), and the coordinate reference system as WKT and/or EPSG code
    (both may be absent when the source had a transform only).
    """
    if not isinstance(geo, dict):
        return "must be an object or null"
    unknown = set(geo) - {"transform", "crs_wkt", "epsg"}
    if unknown:
        return f"unknown keys {sorted(unknown)[:4]}"
    t = geo.get("transform")
    if not isinstance(t, list) or len(t) != 6 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in t):
        return "transform must be 6 finite numbers (GDAL order x0, dx, rx, y0, ry, dy)"
    if t[1] * t[5] - t[2] * t[4] == 0:
        return "transform is singular (zero pixel size)"
    wkt = geo.get("crs_wkt")
    if wkt is not None and (not isinstance(wkt, str) or not 0 < len(wkt) <= MAX_CRS_WKT):
        return f"crs_wkt must be a non-empty string of at most {MAX_CRS_WKT} characters or null"
    epsg = geo.get("epsg")
    if epsg is not None and (not isinstance(epsg, int) or isinstance(epsg, bool) or not 0 < epsg < 1 << 20):
        return "epsg must be a positive integer code or null"
    return None


def make_georeference(transform: Any, crs_wkt: str | None = None, epsg: int | None = None) -> dict[str, Any]:
    """The ``georeference`` metadata value, normalized (floats, None for absent parts)."""
    return {"transform": [float(v) for v in transform], "crs_wkt": crs_wkt or None,
            "epsg": None if epsg is None else int(epsg)}


#: Chunk key separators the Zarr v3 spec allows; anything else could make a key a path (``../x``).
CHUNK_KEY_SEPARATORS = ("/", ".")


def split_class_counts(codes: np.ndarray, labels: np.ndarray, num_classes: int) -> dict[str, np.ndarray]:
    """Per split name, how many samples of each class: ``codes`` (``SPLIT_*``) and ``labels`` (0..num_classes)
    are parallel arrays, one entry per sample; each value is an int64 array of num_classes + 1 counts."""
    k = int(num_classes) + 1
    n_codes = max(SPLIT_CODES.values()) + 1
    table = np.bincount(np.asarray(codes, np.int64) * k + np.asarray(labels, np.int64),
                        minlength=n_codes * k).reshape(n_codes, k)
    return {name: table[code] for name, code in SPLIT_CODES.items()}


def random_split_sizes(counts: np.ndarray, train: float | int, val: float | int,
                       float_rounding: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per class of ``counts[c]`` labelled pixels (each >= 1), how many a random split with ``train`` and ``val``
    (valid amounts: a fraction, or a per-class count) puts in train and in val; the rest is test. The rule of
    :func:`hsgds.preprocess.splits.random_split`, here so that ``hsgds verify`` can check a store's split codes
    against its ``split`` record without the converter. ``float_rounding``: the rule of stores split before
    2026-12-03, ``floor(f * n + 0.5)`` in floating point (it differs for about 1 in 50 two-decimal halves)."""
    def amounts(spec: float | int) -> np.ndarray:  # round half up of the fraction as written, in integers
        if isinstance(spec, Real) and not isinstance(spec, Integral):
            if float_rounding:
                return np.floor(float(spec) * counts + 0.5).astype(np.int64)
            q = Fraction(repr(float(spec)))  # floor(f * n + 0.5) in floating point took 0.29 of 50 pixels to 14
            num, den = q.numerator, q.denominator
            return np.array([(2 * num * int(n) + den) // (2 * den) for n in counts], dtype=np.int64)
        return np.full(counts.shape, int(spec), dtype=np.int64)

    counts = np.asarray(counts, dtype=np.int64)
    # minimums, in this order: a train pixel, a test pixel, a val pixel (when asked)
    min_test = (counts >= 2).astype(np.int64)
    min_val = ((counts >= 3) & (val != 0)).astype(np.int64)
    n_train = np.clip(amounts(train), 1, counts - min_test - min_val)
    n_val = np.zeros_like(n_train) if val == 0 else amounts(val)
    n_val = np.clip(n_val, min_val, counts - n_train - min_test)
    return n_train, n_val


def tile_offsets(tile: np.ndarray, num_tiles: int) -> np.ndarray:
    """The per-tile offset table of samples sorted by tile: tile t's samples are offsets[t]:offsets[t+1]."""
    return np.concatenate([[0], np.cumsum(np.bincount(tile, minlength=num_tiles))]).astype(np.int64)


def chunk_key(array_meta: dict[str, Any], coords: tuple[int, ...]) -> str:
    """The store key of one chunk, from the array's own ``chunk_key_encoding`` (Zarr v3 spec)."""
    enc = array_meta.get("chunk_key_encoding", {"name": "default"}) if isinstance(array_meta, dict) else None
    if not isinstance(enc, dict) or enc.get("name") not in ("default", "v2"):
        raise StoreError(f"unsupported chunk key encoding {str(enc)[:80]}")
    config = enc.get("configuration", {})
    if not isinstance(config, dict):
        raise StoreError(f"unsupported chunk key encoding {str(enc)[:80]}")
    sep = config.get("separator", "/" if enc["name"] == "default" else ".")
    if sep not in CHUNK_KEY_SEPARATORS:
        raise StoreError(f"invalid chunk key separator {str(sep)[:20]!r} (Zarr allows '/' or '.')")
    if not all(isinstance(c, (int, np.integer)) and c >= 0 for c in coords):
        raise StoreError(f"invalid chunk coordinates {coords}")
    if enc["name"] == "default":
        return "c" + sep + sep.join(str(int(c)) for c in coords)
    return sep.join(str(int(c)) for c in coords)


def inside(store: Path, path: Path, where: str, _checked: dict[str, str] | None = None) -> Path:
    """Return ``path`` after checking that it stays inside ``store``: lexically (no ``..``) and through
    every symbolic link on the way, so store metadata or planted links cannot make a reader open files
    elsewhere. The store folder itself may be a link.

    ``_checked`` caches folders already checked across calls (chunks share most of their folders).
    """
    checked = {} if _checked is None else _checked
    base = os.fspath(store)
    root = checked.get("")
    if root is None:
        root = checked[""] = os.path.realpath(base)
    full = os.fspath(path)
    if full.startswith(base + os.sep):
        rel = full[len(base) + 1:]
    else:
        try:
            rel = os.path.relpath(full, base)
        except ValueError:  # on another drive (Windows): outside the store
            rel = os.pardir
    parts = rel.split(os.sep)
    if rel in ("", os.curdir) or os.path.isabs(rel) or os.pardir in parts:
        raise StoreError(f"{where}: {path} is outside the store; the store was tampered with: convert the source again")
    cur = base
    for part in parts:
        cur = cur + os.sep + part
        if cur in checked:
            continue
        if os.path.islink(cur):
            real = os.path.realpath(cur)
            if not _within(root, real):
                raise StoreError(f"{where}: {path} leads through a link to {real}, outside the store {root}; "
                                 "the store was tampered with: convert the source again")
        checked[cur] = cur
    return path


def _within(root: str, real: str) -> bool:
    """Whether the resolved path ``real`` lies inside the folder ``root``."""
    try:
        return os.path.commonpath([root, real]) == root
    except ValueError:  # on another drive (Windows)
        return False


def tile_paths(store: Path, grid: TileGrid, array_meta: dict[str, Any]) -> list[Path]:
    """File path of every tile chunk, indexed by tile id (ty * ntx + tx); each checked to lie inside the store."""
    store = Path(store)
    base = store / TILES
    cache: dict[str, str] = {}
    return [inside(store, base / chunk_key(array_meta, (ty, tx, 0, 0, 0)), str(store), cache)
            for ty in range(grid.nty) for tx in range(grid.ntx)]


#: what a damaged tile asks of the user
DAMAGED = "the store is damaged; run `hsgds verify` and convert the source again"
#: ... when a loader's reader meets it: the store may instead have been converted again while the loader had it
#: open (its tiles then hold another conversion's bytes), which `hsgds verify`, opening it afresh, tells apart
DAMAGED_OR_REPLACED = ("the store is damaged, or was converted again since it was opened; run `hsgds verify`: if it "
                       "says ok, open the store again (a new loader), else convert the source again")


def tile_size_error(tile_id: int, path: Any, size: int, expected: int, why: str = DAMAGED) -> TileReadError:
    """The error for a tile file of the wrong size (truncated, padded or replaced)."""
    return TileReadError(f"tile {tile_id} ({path}) has {size} bytes, expected {expected}: {why}")


def checksum_error(tile_id: int, path: Any, algorithm: str = CHECKSUM_ALGORITHM, why: str = DAMAGED) -> ChecksumError:
    """The error for a tile whose bytes differ from those checksummed at conversion."""
    return ChecksumError(f"tile {tile_id} ({path}) fails its {algorithm} checksum: {why}")


def open_tile(tile_id: int, path: Any, flags: int = 0) -> int:
    """Open a tile file for reading (``flags`` added to O_RDONLY) and return its descriptor; the OSError of
    ``os.open`` when it cannot be opened, a TileReadError naming the tile when it is not a regular file.

    Opened non-blocking, then checked: opening a FIFO planted in a store as a chunk would otherwise block for
    ever, waiting for a writer, and hang ``hsgds verify`` or a loader's reader thread (O_NONBLOCK changes
    nothing for reads of a regular file)."""
    fd = os.open(path, os.O_RDONLY | flags | getattr(os, "O_NONBLOCK", 0))
    try:
        check_regular(tile_id, path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_metadata_file(path: Any, limit: int) -> tuple[bytes | None, int]:
    """The bytes of a metadata file (a zarr.json, collection.json), read only when it is a regular file of at
    most ``limit`` bytes: returns (bytes, size), or (None, size) when it is larger. OSError when it cannot be
    opened or read; ValueError naming what it is when it is a FIFO, a folder or a device.

    Opened non-blocking, like a tile (:func:`open_tile`): a FIFO planted as a zarr.json would otherwise hang
    every command that opens the store."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"it is {_kind(info.st_mode)}, not a file")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        if info.st_size > limit:
            return None, info.st_size
        return f.read(), info.st_size


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, for messages."""
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket"
            if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")


def check_regular(tile_id: int, path: Any, mode: int) -> None:
    """Raise a TileReadError when a tile chunk (its ``st_mode``) is a folder, a FIFO, a socket or a device."""
    if stat.S_ISREG(mode):
        return
    raise TileReadError(f"tile {tile_id} ({path}) is {_kind(mode)}, not a chunk file: the store is damaged; run "
                        "`hsgds verify` and convert the source again")


def read_tile_file(tile_id: int, path: Path, nbytes: int, crc: int | None) -> bytes:
    """A tile file's bytes, its size and (``crc`` not None) its crc32c checked; a TileReadError naming the
    tile, and what to do, when it cannot be read or is damaged."""
    try:
        with os.fdopen(open_tile(tile_id, path, getattr(os, "O_BINARY", 0)), "rb") as f:
            raw = f.read()
    except TileReadError:
        raise
    except OSError as exc:
        raise TileReadError(f"tile {tile_id} ({path}) cannot be read ({exc.strerror or exc}): the store is damaged "
                            "or was moved; run `hsgds verify` and convert the source again") from None
    if len(raw) != nbytes:
        raise tile_size_error(tile_id, path, len(raw), nbytes)
    if crc is not None:
        check_tile_crc(tile_id, path, crc32c.crc32c(raw), crc)
    return raw


def check_tile_crc(tile_id: int, path: Any, crc: int, expected: int, why: str = DAMAGED) -> None:
    """Raise ChecksumError when a tile's crc32c differs from the one recorded at conversion."""
    if crc != expected:
        raise checksum_error(tile_id, path, why=why)
