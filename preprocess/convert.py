"""Source cube -> hsgds store (format v2 to v4, the oldest that describes it): halo-padded aligned tiles, labels,
samples, stats, splits.

The conversion streams tile by tile (memory stays at a few tiles for memory-mappable sources), writes
into a temporary directory beside the target and renames it into place only when everything, the
metadata last, is written: an interrupted conversion never leaves a store that opens.
"""

from __future__ import annotations

import errno
import glob
import math
import numbers
import os
import secrets
import shutil
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import zarr

from hsgds import checksum
from hsgds import format as fmt
from hsgds._durable import fsync_dir, fsync_tree, rename_error
from hsgds._sha256 import sha256_of
from hsgds._version import __version__
from hsgds._wording import clipped, drop, set_to
from hsgds.errors import (
    ConfigError,
    HsgdsError,
    HsgdsWarning,
    InputError,
    StoreError,
    as_flag,
    as_path,
    control_character,
    not_unicode,
    shown,
    shown_path,
)
from hsgds.preprocess import splits as splitting
from hsgds.preprocess.readers import (
    detect_format,
    label_class_names,
    label_files,
    label_georeference,
    open_cube,
    read_labels,
)
from hsgds.preprocess.readers.base import (
    SourceCube,
    check_fits_in_memory,
    recorded_nodata,
    source_stamps,
    unknown_epsg,
)
from hsgds.preprocess.readers.hdf5 import BAND_AXES, band_axes
from hsgds.preprocess.stats import BandAccumulator, check_finite

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; stale temporary folders are then left for the user
    fcntl = None

__all__ = ["CONVERT_WARNINGS", "ConvertOptions", "GeoreferenceWarning", "NodataWarning", "WavelengthWarning",
           "class_names_of", "convert", "lock_folder", "nodata_option", "remove_stale", "wavelength_list", "write_error"]

SPLIT_METHODS = ("random", "blocks", "masks")
#: the source formats read as arrays, whose band axis --band-axis (convert-many's band_axis column) gives
ARRAY_FORMATS = ("npy", "hdf5", "mat", "mat73")


@dataclass(frozen=True)
class ConvertOptions:
    """Everything ``hsgds convert`` can be told. Validated by :meth:`check` before any file is touched."""

    key: str | None = None
    labels: str | os.PathLike | None = None
    labels_key: str | None = None
    band_axis: str | None = None
    max_patch: int = 2 * fmt.DEFAULT_HALO + 1
    tile: int | None = None
    padding: str = "reflect"
    split: str = "random"
    train: float = 0.1
    val: float = 0.0
    block_size: int | None = None
    train_mask: str | os.PathLike | None = None
    val_mask: str | os.PathLike | None = None
    test_mask: str | os.PathLike | None = None
    seed: int = 0
    nan_fill: float | None = None
    #: the value marking pixels without data: None takes the source's own (GeoTIFF GDAL_NODATA, ENVI data
    #: ignore value, HDF5/netCDF _FillValue), "none" ignores it, a number (NaN allowed) overrides it
    nodata: float | str | None = None
    #: what gave ``nodata``, as messages name it: convert-many's may come from a manifest column, not the option
    nodata_from: str = "--nodata"
    #: names of classes 1..K; None takes the label file's own (an ENVI Classification header's class names)
    class_names: tuple[str, ...] | None = None
    #: band centres (nm) for sources that do not record them; None for a band without one (an unused band)
    wavelengths: tuple[float | None, ...] | None = None
    #: what gave ``wavelengths``, as messages name it: convert-many's come from a manifest column, not the option
    wavelengths_from: str = "--wavelengths"
    #: what gave ``key``, ``labels_key`` and ``band_axis``, as messages name them: convert-many's may come from a
    #: manifest row's columns, not the options
    key_from: str = "--key"
    labels_key_from: str = "--labels-key"
    band_axis_from: str = "--band-axis"
    #: the store's sample type, when not the source's (scenes of several sensors loaded together need one)
    dtype: str | None = None
    overwrite: bool = False
    workers: int = 4

    @property
    def halo(self) -> int:
        return (self.max_patch - 1) // 2

    def check(self) -> None:
        # types first: an array or tensor compared below raises numpy's or torch's own ambiguity error
        for flag, value in (("--max-patch", self.max_patch), ("--tile", self.tile), ("--block-size", self.block_size),
                            ("--workers", self.workers)):
            if (value is not None or flag in ("--max-patch", "--workers")) and (
                    isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral)):
                raise ConfigError(f"{flag} must be a whole number, got {shown(value)}")
        if self.nan_fill is not None and (isinstance(self.nan_fill, (bool, np.bool_))
                                          or not isinstance(self.nan_fill, numbers.Real)):
            raise ConfigError(f"--nan-fill must be a finite number, got {shown(self.nan_fill)}")
        as_flag(self.overwrite, "overwrite")
        if self.class_names is not None and (not isinstance(self.class_names, (tuple, list))
                                             or not all(isinstance(n, str) for n in self.class_names)):
            raise ConfigError(f"--class-names must be a sequence of names (str), got {shown(self.class_names)}")
        for flag, path in (("--labels", self.labels), ("--train-mask", self.train_mask),
                           ("--val-mask", self.val_mask), ("--test-mask", self.test_mask)):
            if path is not None:
                as_path(path, flag)
        for flag, name in (("--padding", self.padding), ("--split", self.split), ("--dtype", self.dtype)):
            if name is not None and not isinstance(name, str):
                raise ConfigError(f"{flag} must be a name (str), got {shown(name)}")
        if self.wavelengths is not None and (not isinstance(self.wavelengths, (tuple, list)) or not all(
                w is None or (isinstance(w, numbers.Real) and not isinstance(w, (bool, np.bool_)))
                for w in self.wavelengths)):
            raise ConfigError(f"{self.wavelengths_from} must be a list of band centres in nm (None for a band without "
                              f"one; an array's .tolist()), got {shown(self.wavelengths)}")
        if self.max_patch < 1 or self.max_patch % 2 == 0:
            raise ConfigError(f"--max-patch must be a positive odd number (patches are pixel-centred), "
                              f"got {shown(self.max_patch)}")
        if self.halo > fmt.MAX_HALO:
            raise ConfigError(f"--max-patch {self.max_patch} is larger than a store can serve "
                              f"({2 * fmt.MAX_HALO + 1}); use a smaller patch")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"--seed must be a non-negative integer, got {shown(self.seed)}")
        if self.block_size is not None and self.block_size < 1:
            raise ConfigError(f"--block-size must be a positive number of pixels, got {self.block_size}")
        if self.split == "blocks" and self.labels is not None:  # (without labels there is no split)
            splitting.check_block_size_option(self.block_size, self.halo, ", or a smaller --max-patch")
        if self.padding not in fmt.PADDING_MODES:
            raise ConfigError(f"--padding must be one of {', '.join(fmt.PADDING_MODES)}, got {shown(self.padding)}")
        if self.split not in SPLIT_METHODS:
            raise ConfigError(f"--split must be one of {', '.join(SPLIT_METHODS)}, got {shown(self.split)}")
        if self.tile is not None and self.tile < 1:
            raise ConfigError(f"--tile must be a positive number of pixels, got {shown(self.tile)}")
        # past any size the source's own suggestion names (_tile_size), an integer too long to print whole
        if self.tile is not None and self.tile > fmt.MAX_TILE_BYTES:
            raise ConfigError(f"--tile must be at most {math.isqrt(fmt.MAX_TILE_BYTES)} pixels (a tile holds at most "
                              f"{fmt.MAX_TILE_BYTES >> 30} GiB), got {shown(self.tile)}")
        if self.split == "masks" and (self.train_mask is None or self.test_mask is None):
            raise ConfigError("--split masks needs --train-mask and --test-mask (and optionally --val-mask)")
        if self.split != "masks" and any(m is not None for m in (self.train_mask, self.val_mask, self.test_mask)):
            raise ConfigError("--train-mask/--val-mask/--test-mask need --split masks")
        if self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        # any real number (numpy's too, which are no float), so an infinity is refused here, not in the store
        n = self.nodata
        if n is not None and not (isinstance(n, str) and n == "none") and (
                isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Real) or math.isinf(_float(n))):
            raise ConfigError(f"nodata must be a number (float('nan') for NaN, not infinite) or 'none', got "
                              f"{shown(self.nodata)}")
        if self.nan_fill is not None and not math.isfinite(_float(self.nan_fill)):
            raise ConfigError(f"--nan-fill must be a finite number, got {shown(self.nan_fill)}")
        # refused whether or not a split is made: a value that means nothing is a mistake either way
        splitting.check_amounts(self.train, self.val)
        if self.labels is not None:  # (without labels there is no split: the commands say so)
            # (the commands also refuse --train and --seed with masks: only they know whether those were given)
            splitting.check_split_options(self.split, [flag for flag, given in (
                ("--block-size", self.block_size is not None), ("--val", self.split == "masks" and self.val != 0))
                if given])
        given = None if self.wavelengths is None else fmt.centred(self.wavelengths)
        if self.wavelengths and not given:
            raise ConfigError(f"{self.wavelengths_from} gives no band a centre ({nm_text(self.wavelengths, 8)}); "
                              "leave it out to record no wavelengths")
        if given is not None and (not given or not all(math.isfinite(w) and w > 0 for w in given)):
            raise ConfigError(f"{self.wavelengths_from} must be positive finite numbers (band centres in nm; none for "
                              f"a band without one), got {nm_text(self.wavelengths or (), 8) or 'none'}")
        if given is not None and not all(fmt.MIN_NM <= w <= fmt.MAX_NM for w in given):
            # 0.4-2.5 would be micrometres: stored as nm they would match no other scene's wavelengths
            raise ConfigError(f"{self.wavelengths_from} must be band centres in nm ({fmt.MIN_NM:g}-{fmt.MAX_NM:g}), "
                              f"got {min(given):g}-{max(given):g}; give micrometres times 1000")
        if self.dtype is not None and self.dtype not in fmt.DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(fmt.DTYPES)}, got {shown(self.dtype)}")
        if self.class_names is not None and (not self.class_names or any(not n.strip() for n in self.class_names)):
            raise ConfigError(f"--class-names has an empty name ({','.join(self.class_names)!r}); give one name per "
                              "class, comma-separated, in label order")
        for k, name in enumerate(self.class_names or (), start=1):
            if (why := not_unicode(name)) is not None:  # no class map or legend could hold it
                raise ConfigError(f"--class-names: the name of class {k} ({shown(name)}) {why}; pass the names in "
                                  "the locale's encoding, or set LC_ALL to a locale of the encoding they are in")
            if (ch := control_character(name)) is not None:
                raise ConfigError(f"--class-names: the name of class {k} ({shown(name)}) holds the control character "
                                  f"{ch}; give names without newlines, tabs or other control characters")


def _float(value: numbers.Real) -> float:
    """``value`` as a float, an int too large for one as an infinity (float() raised OverflowError)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def nodata_option(text: str, where: str = "--nodata") -> float | str:
    """A nodata value as a user writes it (``-9999``, ``nan``, ``none``: ignore the source's own) for
    :attr:`ConvertOptions.nodata`; a one-line ConfigError naming ``where`` otherwise."""
    word = text.strip()
    if word.lower() == "none":
        return "none"
    try:
        value = float(word)
    except ValueError:
        raise ConfigError(f"{where}: {word!r} is not a number, nan or none") from None
    if math.isinf(value):
        raise ConfigError(f"{where}: {word!r} is infinite; give the value that marks pixels without data")
    return value


#: a few thousand band centres take ~40 KB; a larger file is not a list of them
MAX_WAVELENGTH_FILE = 1 << 20


#: how a band without a centre (an unused detector band) is written in a list of band centres: ``none``, or ``nan``
#: as numpy's savetxt writes a missing value
NO_CENTRE = ("none", "nan")


def nm_text(wavelengths: Sequence[float | None], limit: int | None = None) -> str:
    """Band centres as a user writes them ("400,410.5,none"), the first ``limit`` of them when given."""
    return ",".join("none" if w is None else f"{w:g}" for w in list(wavelengths)[:limit])


def wavelength_list(value: str | os.PathLike, where: str) -> tuple[float | None, ...]:
    """Band centres (nm) given inline ("400.5,410,...") or as the path of a text file of them (commas, spaces
    or one per line; '#' starts a comment), ``none`` (or ``nan``) for a band without one; a one-line
    ConfigError naming ``where`` otherwise."""
    text, path = str(value), Path(value)
    try:
        is_file = path.is_file()
    except OSError:  # a long inline list is no file name (ENAMETOOLONG)
        is_file = False
    if is_file:
        try:
            if path.stat().st_size > MAX_WAVELENGTH_FILE:
                raise ConfigError(f"{where}: {path} is over {MAX_WAVELENGTH_FILE >> 20} MiB, not a list of band "
                                  "centres")
            text = "\n".join(line.split("#", 1)[0] for line in path.read_text(encoding="utf-8").splitlines())
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read {path} ({exc})") from None
        where = f"{where} {path}"
    words = text.replace(",", " ").split()
    values: list[float | None] = []
    for word in words:
        if word.lower().lstrip("+-") in NO_CENTRE:
            values.append(None)
            continue
        try:
            values.append(float(word))
        except ValueError:
            if not is_file and len(words) == 1:  # a file name with a typo, or a file not there yet
                raise ConfigError(f"{where}: there is no file {path}, and it is not a number; check the path, or "
                                  "give band centres in nm, comma-separated") from None
            raise ConfigError(f"{where}: {word!r} is not a number; give band centres in nm (none for a band "
                              "without one), comma-separated, or a text file of them") from None
    return tuple(values)


def _tile_size(opts: ConvertOptions, shape: tuple[int, int, int], itemsize: int) -> int:
    h, w, b = shape
    bpp = b * itemsize
    if opts.tile is None:
        return fmt.choose_tile(h, w, bpp, opts.halo)
    k = fmt.alignment_step(bpp)
    side = opts.tile + 2 * opts.halo
    # the largest aligned side within the size limit: suggestions must pass both checks
    largest = (math.isqrt(fmt.MAX_TILE_BYTES // bpp) // k) * k - 2 * opts.halo
    if side * side * bpp > fmt.MAX_TILE_BYTES:
        options = f"{largest} or smaller" if largest >= 1 else "a smaller --max-patch"
        raise ConfigError(f"--tile {opts.tile} gives {side}x{side}-pixel tiles of {side * side * bpp} bytes, over the "
                          f"{fmt.MAX_TILE_BYTES >> 30} GiB tile limit; use --tile {options} (a multiple of {k} "
                          f"minus {2 * opts.halo}, for {fmt.ALIGNMENT}-byte alignment)")
    if side % k:
        lo, hi = (side // k) * k - 2 * opts.halo, (side // k + 1) * k - 2 * opts.halo
        options = " or ".join(str(t) for t in (lo, hi) if 1 <= t <= largest)
        raise ConfigError(f"--tile {opts.tile} gives {side}x{side}-pixel tiles of {side * side * bpp} bytes, not a "
                          f"multiple of {fmt.ALIGNMENT}; use --tile {options}")
    return opts.tile


def _band_axes_fitting(shape: tuple[int, int, int], band_axis: str | None, hw: tuple[int, ...]) -> list[str]:
    """The ``--band-axis`` values under which the array read as (H, W, B) ``shape`` with ``band_axis`` has
    the spatial shape ``hw`` (in BAND_AXES order: last, first, middle)."""
    dims = dict(zip("HWB", shape))
    array_shape = [dims[a] for a in band_axes(band_axis)]  # the array as stored
    return [name for name, axes in BAND_AXES.items()
            if (array_shape[axes.index("H")], array_shape[axes.index("W")]) == tuple(hw)]


#: how far (a share of the cube's pixel) a label map's grid may lie from the cube's at its corners: rounding in
#: the files' numbers, never a pixel's shift
_GRID_SLACK = 0.01
#: GDAL's default geotransform, which it reads (and writes) for a raster without one: a pixel grid, no map grid
_NO_GRID = [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]


def _grid_mismatch(cube_geo: dict[str, Any], file_geo: dict[str, Any], height: int, width: int) -> str | None:
    """How the map grid ``file_geo`` of a label file differs from the cube's ``cube_geo`` (both ``georeference``
    values; the files have ``height`` x ``width`` pixels), or None when it is the same grid: the same EPSG code
    where both have one (WKT alone is not compared: two writers spell one CRS differently), and each corner of
    the raster at the same map position within ``_GRID_SLACK`` of a pixel."""
    if cube_geo.get("epsg") and file_geo.get("epsg") and cube_geo["epsg"] != file_geo["epsg"]:
        return f"its CRS is EPSG:{file_geo['epsg']}, the cube's EPSG:{cube_geo['epsg']}"
    a, b = cube_geo["transform"], file_geo["transform"]
    pixel = math.sqrt(abs(a[1] * a[5] - a[2] * a[4]))
    for col, row in ((0, 0), (width, 0), (0, height), (width, height)):
        ax, ay = a[0] + col * a[1] + row * a[2], a[3] + col * a[4] + row * a[5]
        bx, by = b[0] + col * b[1] + row * b[2], b[3] + col * b[4] + row * b[5]
        if math.hypot(ax - bx, ay - by) > _GRID_SLACK * pixel:
            return (f"pixel ({col}, {row}) lies at ({bx:.10g}, {by:.10g}) in it, at ({ax:.10g}, {ay:.10g}) in the "
                    "cube")
    return None


def _grids(path: str | os.PathLike, what: str, cube: SourceCube) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The cube's map grid and the one a label map or mask file records, or None unless both have one (GDAL's
    default geotransform is none)."""
    def grid(geo: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if geo is None or (geo["transform"] == _NO_GRID and not geo["epsg"] and not geo["crs_wkt"]) else geo

    cube_geo = grid(getattr(cube, "georeference", None))
    file_geo = None if cube_geo is None else grid(label_georeference(path, what))
    return None if cube_geo is None or file_geo is None else (cube_geo, file_geo)


def _warp(cube_geo: dict[str, Any], hw: tuple[int, int], path: str | os.PathLike) -> str:
    """The gdalwarp command that resamples a class map ``path`` onto the cube's grid (nearest neighbour: classes
    stay classes); the grid's extent and pixel size are spelled out when it is north-up."""
    x0, dx, rx, y0, ry, dy = cube_geo["transform"]
    name = Path(path)
    srs = f" -t_srs EPSG:{cube_geo['epsg']}" if cube_geo.get("epsg") else ""
    grid = "" if rx or ry else (f" -tr {abs(dx):.10g} {abs(dy):.10g} -te {min(x0, x0 + hw[1] * dx):.10g} "
                                f"{min(y0, y0 + hw[0] * dy):.10g} {max(x0, x0 + hw[1] * dx):.10g} "
                                f"{max(y0, y0 + hw[0] * dy):.10g}")
    return f"gdalwarp -r near{srs}{grid} {name.name} {name.stem}_on_cube{name.suffix or '.tif'}"


def _check_grid(path: str | os.PathLike, what: str, cube: SourceCube, hw: tuple[int, int]) -> None:
    """Refuse a label map or mask whose file records another map grid than the cube's: of the same shape, its
    pixels would silently label other ground (a map of a neighbouring scene, or at another resolution)."""
    grids = _grids(path, what, cube)
    why = None if grids is None else _grid_mismatch(*grids, *hw)
    if grids is not None and why is not None:
        raise InputError(f"{what} {Path(path).name}: its map grid is not the cube's ({why}), so its pixels label "
                         f"other ground; resample it onto the cube's grid ({_warp(grids[0], hw, path)}), or pass the "
                         "one of this scene")


def _load_labels(opts: ConvertOptions, src: Path, cube: SourceCube) -> np.ndarray:
    shape = cube.shape
    hw = shape[:2]
    if opts.labels is None:
        return np.zeros(hw, dtype=np.uint16)
    name = Path(opts.labels).name
    labels = read_labels(opts.labels, key=opts.labels_key, key_option=opts.labels_key_from)
    if labels.shape != hw:
        fix = "pass the ground truth of this scene"
        grids = _grids(opts.labels, "labels", cube)
        if grids is not None:  # the scene's ground truth at another resolution or extent (Houston 2018's, 0.5 m)
            (cx0, cdx, _, cy0, _, cdy), (lx0, ldx, _, ly0, _, ldy) = grids[0]["transform"], grids[1]["transform"]
            fix = (f"its map grid has pixels of {abs(ldx):.10g} x {abs(ldy):.10g} from ({lx0:.10g}, {ly0:.10g}), "
                   f"the cube's {abs(cdx):.10g} x {abs(cdy):.10g} from ({cx0:.10g}, {cy0:.10g}): resample it onto "
                   f"the cube's grid ({_warp(grids[0], hw, opts.labels)})")
        elif detect_format(src) in ARRAY_FORMATS:
            # an array whose band axis was taken for a spatial one matches the labels with another band axis
            given = opts.band_axis or "last"
            others = [a for a in _band_axes_fitting(shape, opts.band_axis, labels.shape) if a != given]
            if others:
                fix = f"if the cube's bands are its {others[0]} axis, {set_to(opts.band_axis_from, others[0])}"
        raise InputError(f"labels {name} have shape {labels.shape}, but the cube is {hw[0]}x{hw[1]}; {fix}")
    _check_grid(opts.labels, "labels", cube, hw)
    top = int(labels.max(initial=0))
    if top > fmt.MAX_LABEL:
        raise InputError(f"labels {name} hold class id {top}, above the largest a store holds ({fmt.MAX_LABEL}); "
                         "number the classes 1..K (0 = unlabelled)")
    return labels.astype(np.uint16)


def _relative_to(path: Path, folder: Path) -> str:
    """``path`` resolved, relative to ``folder`` where it can be (not across Windows drives), else absolute."""
    try:
        return os.path.relpath(path.resolve(), folder)
    except ValueError:
        return str(path.resolve())


def _split_map(opts: ConvertOptions, labels: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    if not labels.any():
        return np.zeros(labels.shape, np.uint8), {"method": "none"}
    if opts.split in ("random", "blocks"):
        return splitting.make_split(labels, opts.split, train=opts.train, val=opts.val, block_size=opts.block_size,
                                    guard=opts.halo, seed=opts.seed)
    params: dict[str, Any] = {"method": opts.split}  # no seed: the masks decide, nothing is drawn
    masks = {name: None if p is None else read_labels(p, key_option=None, what=name.replace("_", " ")) != 0
             for name, p in (("train_mask", opts.train_mask), ("val_mask", opts.val_mask),
                             ("test_mask", opts.test_mask))}
    given = {k: v for k, v in (("train_mask", opts.train_mask), ("val_mask", opts.val_mask),
                               ("test_mask", opts.test_mask)) if v is not None}
    params.update({k: Path(v).name for k, v in given.items()})
    # what each mask held (sha256 over its files, as labels_source's): a convert-many rerun notices an edited mask
    params.update({f"{k}_sha256": sha256_of(label_files(v))[0] for k, v in given.items()})
    # errors name the options as typed (`--train-mask tm.npy has shape ...`), not mask_split's parameters
    names = {k: f"--{k.replace('_', '-')} {Path(v).name}" for k, v in given.items()}
    names["labels"] = f"--labels {Path(opts.labels).name}" if opts.labels is not None else "the labels"
    return splitting.mask_split(labels, **masks, names=names), params


def _split_quietly(opts: ConvertOptions, labels: np.ndarray
                   ) -> tuple[np.ndarray, dict[str, Any], list[warnings.WarningMessage]]:
    """:func:`_split_map` and its train check, its warnings recorded instead of shown: the converter shows those
    of the split it keeps (labels found to be nodata while tiling are split again without them)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        split_map, params = _split_map(opts, labels)
    if params["method"] != "none":
        splitting.check_has_train(split_map, opts.split, opts.block_size)
    return split_map, params, list(caught)


def _train_stats_of_tiles(paths: list[Path], grid: fmt.TileGrid, table: dict[str, np.ndarray],
                          little: np.dtype) -> BandAccumulator:
    """The train pixels' statistics read back from the tiles written (train pixels have data, so the tiles hold
    the source's values there), tile after tile as the tiling pass merges them: the same numbers."""
    acc = BandAccumulator(grid.bands)
    offsets, h = table["offsets"], grid.halo
    train = table["split"] == fmt.SPLIT_TRAIN
    for t in np.unique(table["tile"][train]):
        lo, hi = int(offsets[t]), int(offsets[t + 1])
        keep = train[lo:hi]
        tile = np.fromfile(paths[t], dtype=little).reshape(grid.tile_shape)
        acc.merge(BandAccumulator.of(tile[h + table["y"][lo:hi][keep], h + table["x"][lo:hi][keep]]))
    return acc


def _sample_table(labels: np.ndarray, split_map: np.ndarray, grid: fmt.TileGrid) -> dict[str, np.ndarray]:
    """Labelled pixels sorted by tile then (y, x), with tile-local core coordinates and an offset table."""
    y, x = np.nonzero(labels)
    tile = (y // grid.tile) * grid.ntx + (x // grid.tile)
    order = np.argsort(tile, kind="stable")  # nonzero() is already row-major within a tile
    y, x, tile = y[order], x[order], tile[order]
    return {
        "tile": tile.astype(np.int32),
        "y": (y % grid.tile).astype(np.int32),
        "x": (x % grid.tile).astype(np.int32),
        "label": labels[y, x],
        "split": split_map[y, x].astype(np.uint8),
        "offsets": fmt.tile_offsets(tile, grid.num_tiles),
    }


def _tile_index(grid: fmt.TileGrid, padding: str, tile_id: int) -> tuple[np.ndarray, ...]:
    """Per row and per column of a padded tile: the scene row (column) it shows, and whether it shows one
    (False: zero padding, or the filler past the halo) -- :func:`hsgds.format.padded_index` on both axes."""
    ty, tx = grid.tile_yx(tile_id)
    h, s = grid.halo, grid.side
    ri, rv = fmt.padded_index(np.arange(ty * grid.tile - h, ty * grid.tile - h + s), grid.height, h, padding)
    ci, cv = fmt.padded_index(np.arange(tx * grid.tile - h, tx * grid.tile - h + s), grid.width, h, padding)
    return ri, rv, ci, cv


def build_tile(cube: SourceCube, grid: fmt.TileGrid, padding: str, tile_id: int) -> np.ndarray:
    """One halo-padded (S, S, B) tile: the scene window around the tile's core, padded at the borders."""
    ri, rv, ci, cv = _tile_index(grid, padding, tile_id)
    r0, r1 = int(ri[rv].min()), int(ri[rv].max()) + 1
    c0, c1 = int(ci[cv].min()), int(ci[cv].max()) + 1
    window = cube.read(r0, r1, c0, c1)
    if window.shape != (r1 - r0, c1 - c0, grid.bands):
        raise InputError(f"source returned a {window.shape} window for rows {r0}:{r1}, columns {c0}:{c1}; "
                         "the file is truncated or inconsistent")
    tile = window[np.clip(ri - r0, 0, r1 - r0 - 1)][:, np.clip(ci - c0, 0, c1 - c0 - 1)]
    tile[~rv] = 0
    tile[:, ~cv] = 0
    return tile


def _wavelengths(given: tuple[float | None, ...] | None, recorded: Any, bands: int, src: Path,
                 named: str = "--wavelengths") -> list[float | None] | None:
    """The store's band centres (None for a band without one): the source's, or those given (``named``: the
    option or manifest column that gave them) for a source that records none. Given for a source that records
    others, or a count other than the bands', they are refused; given where the source's own bands have no
    centre (PRISMA's unused ones), they are taken when they agree with every centre it records."""
    if given is None:
        return None if recorded is None else [None if w is None else float(w) for w in recorded]
    if len(given) != bands:
        raise InputError(f"{named} lists {len(given)} values but {src.name} has {bands} bands; give one "
                         "centre (nm) per band, in band order (none for a band without one)")
    if recorded is not None:
        have, want = fmt.wavelength_array(recorded), fmt.wavelength_array(given)
        known = ~np.isnan(have)
        if not np.allclose(have[known], want[known], rtol=0, atol=1e-6):  # (a NaN given there: no centre, differs)
            raise InputError(f"{src.name} records its own wavelengths ({min(have[known]):g}-{max(have[known]):g} "
                             f"nm), which {named} contradicts; {drop(named)}")
    return [None if w is None else float(w) for w in given]


def _check_nan_fill(value: float | None, dtype: np.dtype) -> None:
    """A --nan-fill that overflows the cube's float type would be stored as inf; integer cubes hold no NaN,
    so the value does not apply to them (convert-many shares it between scenes of several dtypes)."""
    if value is None or dtype.kind != "f":
        return
    with np.errstate(over="ignore"):
        fits = bool(np.isfinite(np.asarray(value).astype(dtype)))
    if not fits:
        limit = float(np.finfo(dtype).max)
        raise ConfigError(f"--nan-fill {value:g} does not fit the cube's {dtype.name} values (finite range "
                          f"-{limit:.8g} to {limit:.8g}); pass a value inside it")


def _check_finite(tile: np.ndarray, tile_id: int, grid: fmt.TileGrid, nan_fill: float | None,
                  gaps: np.ndarray | None = None, nan_is_nodata: bool = False) -> None:
    """Refuse (or with ``nan_fill`` replace) NaN/Inf values, except at ``gaps``: nodata pixels, filled later
    (``nan_is_nodata``: those are the pixels NaN in every band)."""
    if tile.dtype.kind != "f":
        return
    bad = ~np.isfinite(tile)
    if gaps is not None:
        bad[gaps] = False
    if not bad.any():
        return
    if nan_fill is None:
        y0, y1, x0, x1 = grid.core_window(tile_id)
        if nan_is_nodata:
            raise InputError(f"the cube holds NaN/Inf values in pixels with data (near rows {y0}:{y1}, columns "
                             f"{x0}:{x1}; only a pixel NaN in every band is nodata); pass --nan-fill VALUE to "
                             "replace them")
        # --nodata nan only where no other value applies: it would make that value's pixels (-9999) data
        also = "" if gaps is not None else ", or --nodata nan if pixels NaN in every band have no data"
        raise InputError(f"the cube holds NaN/Inf values (near rows {y0}:{y1}, columns {x0}:{x1}); pass --nan-fill "
                         f"VALUE to replace them{also}")
    tile[bad] = nan_fill


def _cast(tile: np.ndarray, target: np.dtype, tile_id: int, grid: fmt.TileGrid, src: Path) -> np.ndarray:
    """``tile`` as ``target`` (--dtype), refusing a value it cannot hold: a fraction, NaN or a value out of range
    for an integer type, an integer a float type does not represent exactly. Floats narrowed to float32 are
    rounded to the nearest float32 (a reflectance keeps 7 significant digits), but never overflow to inf."""
    if tile.dtype == target:
        return tile
    with np.errstate(invalid="ignore", over="ignore"):
        out = tile.astype(target)
        if target.kind in "iu":
            info = np.iinfo(target)
            ok = (tile >= info.min) & (tile <= info.max)
            if tile.dtype.kind == "f":
                ok &= tile == np.round(tile)  # (False for NaN and inf)
        elif tile.dtype.kind in "iu":
            exact = 2 ** (np.finfo(target).nmant + 1)  # every integer up to this is a float of ``target``
            ok = (tile >= -exact) & (tile <= exact)
        else:
            ok = np.isfinite(out) | ~np.isfinite(tile)
    if ok.all():
        return out
    value = tile[~ok][0]
    y0, y1, x0, x1 = grid.core_window(tile_id)
    raise InputError(f"--dtype {target.name}: {src.name} holds {value.item()!r} (near rows {y0}:{y1}, columns "
                     f"{x0}:{x1}), which {target.name} cannot hold exactly; choose a wider --dtype (float32 holds "
                     f"every integer up to 2**24), or leave the source's {tile.dtype.name}")


_WRITE_ALL = {"write_empty_chunks": True}
#: the dimension names of every store's tiles array (since format v1): how :func:`_is_damaged_store` tells a
#: store whose root metadata is lost from a folder that never was one
TILE_DIMENSIONS = ("tile_y", "tile_x", "y", "x", "band")


def _create_tiles(root: zarr.Group, grid: fmt.TileGrid) -> dict:
    """The ``tiles`` array's metadata (its chunk files are written by the converter itself)."""
    tiles = root.create_array(fmt.TILES, shape=(grid.nty, grid.ntx, *grid.tile_shape),
                              chunks=(1, 1, *grid.tile_shape), dtype=np.dtype(grid.dtype).newbyteorder("<"),
                              compressors=None, fill_value=0, config=_WRITE_ALL,
                              dimension_names=list(TILE_DIMENSIONS))
    return tiles.metadata.to_dict()


def _write_pixel_arrays(root: zarr.Group, labels: np.ndarray, table: dict[str, np.ndarray],
                        nodata: np.ndarray | None) -> None:
    """labels, samples/* and (when the source had nodata pixels) nodata, each one raw chunk."""
    def small(name: str, data: np.ndarray, dims: list[str]) -> None:
        root.create_array(name, data=data, chunks=tuple(max(1, n) for n in data.shape),
                          compressors=None, config=_WRITE_ALL, dimension_names=dims)

    small(fmt.LABELS, labels, ["y", "x"])
    for name, data in table.items():
        small(f"{fmt.SAMPLES}/{name}", data, ["tile"] if name == "offsets" else ["sample"])
    if nodata is not None:
        small(fmt.NODATA, nodata.astype(np.uint8), ["y", "x"])


class NodataWarning(HsgdsWarning):
    """Labelled pixels that the source marks as nodata: they were left out of the labels and samples."""


class WavelengthWarning(HsgdsWarning):
    """The source lists band wavelengths that cannot be recorded as nm (units that are no length, values
    outside MIN_NM-MAX_NM nm): the store records none, and the conversion goes on."""


class GeoreferenceWarning(HsgdsWarning):
    """The source carries a map grid that cannot be recorded (a PRISMA L2D file's corners missing or not spanning
    its pixels): the store records no georeference, and the conversion goes on."""


#: the converter's warnings (GeoreferenceWarning, NodataWarning, the split's SplitWarning, WavelengthWarning) and
#: its readers' (a GeoTIFF's CRS that needs rasterio), all HsgdsWarnings: the CLI shows each as one line,
#: convert-many returns them per scene (a worker's stderr is not where the user looks)
CONVERT_WARNINGS: tuple[type[Warning], ...] = (HsgdsWarning,)


def _nodata_of(opts: ConvertOptions, cube: SourceCube) -> float | None:
    """The nodata value this conversion applies: ``--nodata``'s, or the source's own unless it is "none"."""
    if opts.nodata == "none":
        return None
    if opts.nodata is not None:
        return float(opts.nodata)
    return recorded_nodata(cube)


def _holds(dtype: np.dtype, value: float) -> bool:
    """Whether ``dtype`` holds ``value`` exactly (NaN: float types only)."""
    if dtype.kind == "f":
        return math.isnan(value) or abs(value) <= float(np.finfo(dtype).max)
    info = np.iinfo(dtype)
    return value.is_integer() and info.min <= value <= info.max


def _nodata_pixels(tile: np.ndarray, value: float, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(S, S) bool: the tile positions that show a scene pixel (``rows`` x ``cols``, not zero padding) whose
    every band is ``value`` (NaN: every band NaN). GDAL's rule: the value is taken in the cube's dtype, so
    one that the dtype cannot hold marks no pixel."""
    dtype = tile.dtype
    if math.isnan(value):
        hit = np.isnan(tile).all(axis=-1) if dtype.kind == "f" else np.zeros(tile.shape[:2], bool)
    elif dtype.kind != "f" and not (value.is_integer() and np.iinfo(dtype).min <= value <= np.iinfo(dtype).max):
        hit = np.zeros(tile.shape[:2], bool)
    elif dtype.kind == "f" and math.isfinite(value) and abs(value) > float(np.finfo(dtype).max):
        hit = np.zeros(tile.shape[:2], bool)  # (cast to the dtype it would be inf, which no pixel holds)
    else:
        hit = (tile == dtype.type(value)).all(axis=-1)
    return hit & rows[:, None] & cols[None, :]


def _fill_values(mean: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The per-band mean as the store's dtype: rounded and clipped for integers."""
    if dtype.kind == "f":
        return mean.astype(dtype)
    info = np.iinfo(dtype)
    return np.clip(np.rint(mean), info.min, info.max).astype(dtype)


_FULL = (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC))
_READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


def write_error(exc: OSError, what: str, retry: str = "convert again",
                not_writable: str = "the output folder is not writable: choose another -o") -> StoreError:
    """The one-line StoreError for an OSError while writing ``what``, saying what to do (disk full, file size
    limit, read-only folder): ``retry`` is the command to run again, ``not_writable`` the advice for a
    folder that cannot be written."""
    reason = exc.strerror or str(exc)
    if exc.errno in _FULL:
        hint = f"the disk is full, over quota or past the file size limit: free space and {retry}"
    elif exc.errno in _READ_ONLY:
        hint = not_writable
    else:
        hint = f"check the output disk and {retry}"
    return StoreError(f"cannot write {what} ({reason}); {hint}")


@contextmanager
def _writing(out: Path, what: str) -> Iterator[None]:
    """Turn an OSError while writing the store into a one-line StoreError that names the store and says
    what to do (:func:`write_error`)."""
    try:
        yield
    except HsgdsError:
        raise
    except OSError as exc:
        raise write_error(exc, f"{what} of {out}") from None


def _check_unchanged(stamps: dict[Path, tuple[int, int]]) -> None:
    for path, (size, mtime) in stamps.items():
        try:
            st = os.stat(path)
            now = (st.st_size, st.st_mtime_ns)
        except OSError as exc:
            now = None
            detail = f"it became unreadable ({exc.strerror})"
        if now != (size, mtime):
            if now is not None:
                detail = (f"size {size} -> {now[0]} bytes" if now[0] != size else
                          "it was modified (same size, new modification time)")
            raise InputError(f"source changed during conversion: {path} ({detail}); "
                             "convert again once it is complete")


def class_names_of(opts: ConvertOptions, largest: int) -> tuple[tuple[str, ...] | None, int]:
    """The class names and class count a store converted with ``opts`` records, its labels' largest class being
    ``largest``: the names given, else the label file's own (an ENVI Classification's header), else none;
    classes 1..K are every named one (a scene may lack some), else up to the largest label, and 0 without labels.
    Also what ``hsgds convert-many`` writes when it rewrites a store's class names alone."""
    # names may outnumber the scene's labels: a scene of a collection holds some of its classes (convert-many
    # shares the names), an unlabelled one none
    if opts.labels is not None and opts.class_names is not None and len(opts.class_names) < largest:
        raise InputError(f"--class-names lists {len(opts.class_names)} names but the labels hold class {largest}; "
                         "give one name per class, in label order")
    class_names = opts.class_names
    if class_names is None and opts.labels is not None:  # names given win over the file's
        class_names = label_class_names(opts.labels, largest)
    num_classes = max(largest, len(class_names or ())) if opts.labels is not None else 0
    return class_names, num_classes


def _is_store(path: Path) -> bool:
    """Whether ``path`` is a (complete) hsgds store of any format version: the only thing --overwrite replaces."""
    import json

    try:
        attrs = json.loads((path / "zarr.json").read_text()).get("attributes", {})
        return isinstance(attrs, dict) and isinstance(attrs.get(fmt.FORMAT_NAME), dict)
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def _is_damaged_store(path: Path) -> bool:
    """Whether ``path`` is an hsgds store whose root ``zarr.json`` is missing or not a JSON object (truncated,
    overwritten), told by the ``tiles`` array every store holds (its dimension names): what ``hsgds
    convert-many`` converts again in its place. A root that is a JSON object (another program's Zarr group) or
    that cannot be read for another reason (permissions) is not ours to judge."""
    import json

    try:
        if isinstance(json.loads((path / "zarr.json").read_bytes()), dict):
            return False
    except FileNotFoundError:
        pass  # lost
    except OSError:
        return False  # e.g. not readable by this user
    except (ValueError, RecursionError):
        pass  # not JSON (UnicodeDecodeError is a ValueError)
    try:
        tiles = json.loads((path / fmt.TILES / "zarr.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return (isinstance(tiles, dict) and tiles.get("node_type") == "array"
            and tiles.get("dimension_names") == list(TILE_DIMENSIONS))


def lock_folder(folder: Path) -> int | None:
    """Hold an exclusive advisory lock on ``folder`` for as long as the returned descriptor is open; the
    kernel drops it when the process dies, which is how a later run tells a stale temporary folder."""
    if fcntl is None:
        return None
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def remove_stale(out: Path) -> None:
    """Delete temporary folders that killed conversions into ``out`` left behind (their lock is free);
    folders of conversions still running hold their lock and are left alone. Also, with a store in place at
    ``out``, the replaced stores a conversion killed while deleting them left (``.NAME.old-*``): without one
    such a folder is the previous store to rename back, and stays."""
    if _is_store(out):
        for old in out.parent.glob(f".{glob.escape(out.name)}.old-*"):
            shutil.rmtree(old, ignore_errors=True)
    if fcntl is None:
        return
    for stale in out.parent.glob(f".{glob.escape(out.name)}.tmp-*"):
        try:
            fd = lock_folder(stale)
        except OSError:
            continue  # in use, or not ours to judge
        try:
            shutil.rmtree(stale, ignore_errors=True)
        finally:
            os.close(fd)


def _make_tmp(out: Path) -> tuple[Path, int | None]:
    """Create and lock the hidden folder the store is written into (renamed into place at the end)."""
    token = secrets.token_hex(4)
    staging = out.parent / f".{out.name}.new-{token}"
    tmp = out.parent / f".{out.name}.tmp-{token}"
    try:
        staging.mkdir()
    except OSError as exc:
        if exc.errno in _FULL:
            with _writing(out, "a temporary folder"):
                raise
        # any other reason (permissions, a read-only or virtual file system such as /proc) is the folder's
        raise StoreError(f"cannot write {out}: its folder {out.parent} is not writable ({exc.strerror or exc}); "
                         "choose another -o") from None
    try:
        fd = lock_folder(staging)
        os.rename(staging, tmp)  # only ever visible as tmp-* while locked
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return tmp, fd


def convert(src: str | os.PathLike, out: str | os.PathLike, opts: ConvertOptions = ConvertOptions(),
            progress: Callable[[int, int], None] | None = None, *, replace_damaged: bool = False) -> Path:
    """Convert ``src`` into the store ``out``; returns the store path. See ``hsgds convert --help``.

    Nothing appears at ``out`` until the store is complete: it is written into a hidden locked folder
    beside it and renamed into place. A conversion that fails removes that folder; one that is killed
    leaves it, and the next conversion into ``out`` removes it. ``--overwrite`` replaces only an
    existing hsgds store; with ``replace_damaged`` (``hsgds convert-many``'s reruns) also one whose root
    metadata is lost (:func:`_is_damaged_store`). Sources that change while being converted are refused.
    """
    opts.check()
    src, out = Path(src), Path(out)
    if out.exists() and not opts.overwrite:
        raise InputError(f"{shown_path(out)} already exists; pass --overwrite to replace it")
    if out.exists() and not _replaceable(out, replace_damaged):
        raise InputError(f"{shown_path(out)} exists and is not an hsgds store; --overwrite only replaces stores: "
                         "remove it yourself or choose another -o")
    if not out.parent.is_dir():
        raise InputError(f"output folder {shown_path(out.parent)} does not exist; create it first")
    side = [Path(p) for p in (opts.labels, opts.train_mask, opts.val_mask, opts.test_mask) if p is not None]
    try:
        stamps = source_stamps(side)
    except OSError as exc:
        raise InputError(f"cannot read {shown_path(exc.filename)} ({exc.strerror}); check the path") from None
    remove_stale(out)
    tmp, lock = _make_tmp(out)
    cube = hashing = None
    try:
        cube = open_cube(src, key=opts.key, band_axis=opts.band_axis, key_option=opts.key_from,
                         axis_option=opts.band_axis_from)
        stamps.update(source_stamps(cube.files))
        hashing = _SourceHash(cube.files)
        return _convert(cube, src, out, tmp, opts, progress, stamps, hashing, replace_damaged)
    finally:
        if hashing is not None:
            hashing.stop()  # a failed conversion leaves no thread reading the source
        if cube is not None:
            cube.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if lock is not None:
            os.close(lock)


class _SourceHash:
    """The sha256 and size of the source files, computed on a background thread while the tiles are written.
    :meth:`stop` ends the thread within a 1 MiB chunk and waits for it."""

    def __init__(self, files: list[Path]) -> None:
        self._files = files
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hsgds-sha256", daemon=True)
        self._value: tuple[str, int] | None = None
        self._error: OSError | None = None

    def _run(self) -> None:
        try:
            self._value = sha256_of(self._files, self._stop)
        except OSError as exc:
            self._error = exc

    def start(self) -> None:
        self._thread.start()

    def result(self, src: Path) -> tuple[str, int]:
        """(sha256, size), once the thread is done; a one-line InputError if the source could not be read."""
        self._thread.join()
        if self._value is None:
            raise InputError(f"cannot read {src} to hash it ({self._error})")
        return self._value

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def _convert(cube: SourceCube, src: Path, out: Path, tmp: Path, opts: ConvertOptions,
             progress: Callable[[int, int], None] | None, stamps: dict[Path, tuple[int, int]],
             hashing: _SourceHash, replace_damaged: bool = False) -> Path:
    H, W, B = cube.shape
    # labels, split map, nodata map and sample table are per-pixel arrays in memory (about 17 bytes a pixel at peak)
    check_fits_in_memory(H * W * 17, f"the per-pixel label, split and nodata maps of a {H}x{W} scene",
                         "the scene is too large for this machine (or its header is damaged)")
    if opts.halo > 0 and opts.padding == "reflect" and min(H, W) < 2:
        raise InputError(f"a {H}x{W} scene cannot be reflect-padded; use --padding edge or zero")
    _check_nan_fill(opts.nan_fill, cube.dtype)
    wavelengths = _wavelengths(opts.wavelengths, cube.wavelengths, B, src, opts.wavelengths_from)
    note = getattr(cube, "wavelengths_note", None)
    if wavelengths is None and note is not None:
        warnings.warn(f"{note}; the store records no wavelengths (to match bands by wavelength, give the band "
                      f"centres in nm with {opts.wavelengths_from} or fix the header)", WavelengthWarning, stacklevel=2)
    geo_note = getattr(cube, "georeference_note", None)
    if getattr(cube, "georeference", None) is None and geo_note is not None:
        warnings.warn(f"{geo_note}; the store records no georeference (maps predicted from it carry no coordinates)",
                      GeoreferenceWarning, stacklevel=2)
    geo = getattr(cube, "georeference", None)
    why = unknown_epsg(geo)
    if why is not None and geo is not None:  # refused now, not by a GeoTIFF map once a whole scene is predicted
        raise InputError(f"{shown_path(src)} names its coordinate reference system EPSG:{geo['epsg']}, which PROJ does not "
                         f"know ({clipped(why, 160)}); set the right code in the source (a GeoTIFF's: gdal_edit.py "
                         f"-a_srs EPSG:<code> {shown_path(src.name)})")
    # every file the labels are read from (an ENVI header and its binary, whichever --labels names) is
    # stamped before the read and recorded: a change to the one not named is a change to the labels
    label_paths = [] if opts.labels is None else label_files(opts.labels)
    try:
        stamps.update({p: st for p, st in source_stamps(label_paths).items() if p not in stamps})
    except OSError as exc:
        raise InputError(f"cannot read {shown_path(exc.filename)} ({exc.strerror}); check the path") from None
    labels = _load_labels(opts, src, cube)
    for what, mask in (("train mask", opts.train_mask), ("val mask", opts.val_mask), ("test mask", opts.test_mask)):
        if mask is not None:
            _check_grid(mask, what, cube, (H, W))
    class_names, num_classes = class_names_of(opts, int(labels.max(initial=0)))
    dtype = np.dtype(opts.dtype or cube.dtype.name)  # the store's: the source's unless --dtype says otherwise
    grid = fmt.TileGrid(H, W, B, dtype.name, _tile_size(opts, cube.shape, dtype.itemsize), opts.halo)
    grid.check()
    # held back until the labels are final: labelled nodata pixels (found while tiling) mean a new split
    split_map, split_params, split_warnings = _split_quietly(opts, labels)
    table = _sample_table(labels, split_map, grid)
    nodata = _nodata_of(opts, cube)
    if nodata is not None and dtype != cube.dtype and not _holds(dtype, nodata):
        raise ConfigError(f"--dtype {dtype.name} cannot hold the nodata value {nodata:g}, which the store's scene "
                          f"reads give at pixels without data; choose a --dtype that holds it (float32 holds any), "
                          f"or {set_to(opts.nodata_from, 'none')}")
    # True where the source has no data, filled in tile by tile (each tile writes its own core)
    gaps_map = None if nodata is None else np.zeros((H, W), bool)

    hashing.start()  # the source is hashed while its tiles are written

    with _writing(out, "the store layout"):
        # "w-" writes into the locked folder; "w" would delete and recreate it, leaving the lock on a
        # deleted folder (and the new one free for another conversion's stale-folder cleanup to remove)
        root = zarr.open_group(tmp, mode="w-", zarr_format=3)
        paths = fmt.tile_paths(tmp, grid, _create_tiles(root, grid))
        for p in paths:
            p.parent.mkdir(parents=True, exist_ok=True)
    little = np.dtype(grid.dtype).newbyteorder("<")

    def write_tile(tile_id: int, tile: np.ndarray, final: bool = True) -> tuple[int, str]:
        """Write a tile; ``final``: synced and checksummed (a tile to be filled later is neither, yet)."""
        raw = memoryview(np.ascontiguousarray(tile, dtype=little)).cast("B")
        with _writing(out, f"tile {tile_id}"), open(paths[tile_id], "wb") as f:
            f.write(raw)
            if final:
                f.flush()
                os.fsync(f.fileno())  # on the disk before the store is renamed into place (power loss)
        if not final:
            return 0, ""
        return crc32c.crc32c(raw), checksum.encode(checksum.checksum_of(raw))

    def one_tile(tile_id: int) -> tuple[int, str, BandAccumulator, BandAccumulator, bool]:
        tile = build_tile(cube, grid, opts.padding, tile_id)
        gaps = None
        if nodata is not None:
            _, rows, _, cols = _tile_index(grid, opts.padding, tile_id)
            gaps = _nodata_pixels(tile, nodata, rows, cols)
        _check_finite(tile, tile_id, grid, opts.nan_fill, gaps, nodata is not None and math.isnan(nodata))
        has_gaps = gaps is not None and bool(gaps.any())
        if tile.dtype != dtype:
            if has_gaps:
                tile[gaps] = 0  # (a NaN or -9999 the store's type may not hold; filled once the statistics are known)
            tile = _cast(tile, dtype, tile_id, grid, src)
        # nodata pixels are filled once the statistics are known: such a tile is synced and checksummed then
        crc, wsum = write_tile(tile_id, tile, final=not has_gaps)
        y0, y1, x0, x1 = grid.core_window(tile_id)
        h = grid.halo
        core = tile[h:h + y1 - y0, h:h + x1 - x0].reshape(-1, B)
        lo, hi = table["offsets"][tile_id], table["offsets"][tile_id + 1]
        train = table["split"][lo:hi] == fmt.SPLIT_TRAIN
        ty, tx = h + table["y"][lo:hi], h + table["x"][lo:hi]
        if gaps is not None:
            core_gaps = gaps[h:h + y1 - y0, h:h + x1 - x0]
            assert gaps_map is not None
            gaps_map[y0:y1, x0:x1] = core_gaps  # tiles own disjoint cores: no lock needed
            core = core[~core_gaps.reshape(-1)]
            train &= ~gaps[ty, tx]
        return crc, wsum, BandAccumulator.of(core), BandAccumulator.of(tile[ty[train], tx[train]]), has_gaps

    checksums: list[int] = []
    device_checksums: list[str] = []
    with_gaps: list[int] = []  # tiles showing a nodata pixel (in their core or halo)
    all_stats, train_stats = BandAccumulator(B), BandAccumulator(B)
    window = 2 * opts.workers  # tiles in flight: bounds memory to a few tiles

    def collect(future) -> None:  # in tile order, so checksums and merged stats are deterministic
        crc, wsum, part_all, part_train, has_gaps = future.result()
        if has_gaps:
            with_gaps.append(len(checksums))
        checksums.append(crc)
        device_checksums.append(wsum)
        all_stats.merge(part_all)
        train_stats.merge(part_train)
        if progress is not None:
            progress(len(checksums), grid.num_tiles)

    with ThreadPoolExecutor(opts.workers, thread_name_prefix="hsgds-convert") as pool:
        pending: deque = deque()
        for tile_id in range(grid.num_tiles):
            pending.append(pool.submit(one_tile, tile_id))
            if len(pending) >= window:
                collect(pending.popleft())
        while pending:
            collect(pending.popleft())

    nodata_record = None
    if nodata is not None:
        assert gaps_map is not None
        missing = int(np.count_nonzero(gaps_map))
        if missing == H * W:
            raise InputError(f"every pixel of {src.name} is nodata (all bands {nodata:g}); check the nodata value "
                             f"({set_to(opts.nodata_from, 'VALUE')}, or none to convert every pixel)")
        dropped = int(np.count_nonzero(labels[gaps_map]))
        if dropped:  # a labelled pixel without data: its spectrum is the fill, not the class's
            labels = np.where(gaps_map, 0, labels).astype(labels.dtype)
            if not labels.any():
                raise InputError(f"every labelled pixel of {Path(str(opts.labels)).name} is nodata in {src.name} "
                                 f"(all bands {nodata:g}); check the labels' alignment and the nodata value "
                                 f"({opts.nodata_from})")
            # split the labels that remain, as if they had been given so: shares and per-class minimums hold
            try:
                split_map, split_params, split_warnings = _split_quietly(opts, labels)
            except InputError as exc:
                raise InputError(f"without the {dropped} labelled pixels that are nodata in {src.name} (all bands "
                                 f"{nodata:g}): {exc}") from None
            table = _sample_table(labels, split_map, grid)
            train_stats = _train_stats_of_tiles(paths, grid, table, little)  # those of the new train pixels
            warnings.warn(NodataWarning(
                f"{dropped} labelled pixels of {Path(str(opts.labels)).name} are nodata in {src.name} (all bands "
                f"{nodata:g}): they are left out of the store's labels and samples"), stacklevel=2)
        nodata_record = {"value": fmt.nodata_value(nodata), "pixels": missing, "labelled_dropped": dropped,
                         "fill": None if not missing else "train mean" if train_stats.count else "scene mean"}
        if not missing:
            gaps_map = None

    for w in split_warnings:  # of the split the store keeps
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    with _writing(out, "the labels and samples"):
        _write_pixel_arrays(root, labels, table, gaps_map)

    results = {"all": all_stats.result(), "train": train_stats.result()}
    for group, result in results.items():
        if result is not None:
            check_finite(result, "scene's" if group == "all" else "train",
                         "rescale the cube (e.g. to reflectance, or divide it by a power of 10) and convert again")
            for name, values in result.items():
                with _writing(out, "the band statistics"):
                    root.create_array(f"{fmt.STATS}/{group}/{name}", data=values, chunks=(B,), compressors=None,
                                      config=_WRITE_ALL, dimension_names=["band"])

    if with_gaps:
        assert gaps_map is not None
        # nodata pixels read as the mean the loader normalizes with (0 after z-scoring), not as -9999
        fill = _fill_values((results["train"] or results["all"])["mean"], np.dtype(grid.dtype))

        def fill_tile(tile_id: int) -> tuple[int, str]:
            with _writing(out, f"tile {tile_id}"):
                tile = np.fromfile(paths[tile_id], dtype=little).reshape(grid.tile_shape)
            rows, row_shown, cols, col_shown = _tile_index(grid, opts.padding, tile_id)
            tile[gaps_map[rows][:, cols] & row_shown[:, None] & col_shown[None, :]] = fill
            return write_tile(tile_id, tile)

        with ThreadPoolExecutor(opts.workers, thread_name_prefix="hsgds-convert") as pool:
            for tile_id, (crc, wsum) in zip(with_gaps, pool.map(fill_tile, with_gaps)):
                checksums[tile_id], device_checksums[tile_id] = crc, wsum

    sha256, size = hashing.result(src)
    hashed_size = sum(stamps[Path(p)][0] for p in cube.files)
    if size != hashed_size:
        raise InputError(f"source changed during conversion: {src} (hashed {size} bytes, "
                         f"{hashed_size} when opened); convert again once it is complete")
    labels_source = None
    if opts.labels is not None:
        labels_sha256, labels_size = sha256_of(label_paths)
        # paths: where the ground truth lies, which `hsgds predict` never writes over, whatever the files hold
        # by then (an ENVI header edited since no longer matches the sha256). Relative to the store's folder: they
        # stay right when a project folder moves whole, and a shared store does not show the converter's home
        labels_source = {"name": Path(opts.labels).name, "files": [p.name for p in label_paths],
                         "paths": [_relative_to(p, out.resolve().parent) for p in label_paths],
                         "size": labels_size, "sha256": labels_sha256}
    meta = fmt.StoreMeta(
        shape=(H, W, B), dtype=grid.dtype, tile=grid.tile, halo=grid.halo, padding=opts.padding,
        num_classes=num_classes, checksums=checksums, num_samples=int(len(table["tile"])),
        device_checksums=device_checksums, device_checksum_algorithm=fmt.DEVICE_CHECKSUM_ALGORITHM,
        class_names=list(class_names) if class_names else None,
        wavelengths=wavelengths,
        band_names=None if cube.band_names is None else [str(b) for b in cube.band_names],
        bad_bands=getattr(cube, "bad_bands", None),
        reflectance_scale_factor=getattr(cube, "reflectance_scale_factor", None),
        # paths, as the ground truth's: `hsgds predict` never writes over a source file found there, also one whose
        # companions are gone (an EnMAP image whose METADATA.XML was deleted: the total size no longer matches)
        source={"name": src.name, "files": [p.name for p in cube.files],
                "paths": [_relative_to(p, out.resolve().parent) for p in cube.files], "size": size, "sha256": sha256,
                "dtype": cube.dtype.name,
                # an array's band axis: a rerun of convert-many with another over a cube of the same shape either
                # way (width = bands) is told from it, not from the shape
                **({"band_axis": opts.band_axis or "last"} if detect_format(src) in ARRAY_FORMATS else {})},
        georeference=getattr(cube, "georeference", None), nodata=nodata_record,
        pixel_is_point=bool(getattr(cube, "georeference", None) and getattr(cube, "pixel_is_point", False)),
        labels_source=labels_source, split=split_params, converted_split=split_params,
        stats_split="train" if train_stats.count else "all", created_by=f"hsgds {__version__}")
    meta.format_version = meta.oldest_version()  # an older hsgds then reads every store it can
    _check_unchanged(stamps)  # what was tiled and hashed is what the metadata will describe
    with _writing(out, "the store metadata"):
        root.attrs.update({fmt.FORMAT_NAME: meta.to_json()})  # written last: marks the store complete
    _check_unchanged(stamps)
    with _writing(out, "the store (syncing it to disk)"):
        # every file and folder on the disk before the rename: after a power loss the renamed store holds
        # what its metadata describes (the tiles were synced as written)
        fsync_tree(tmp, skip=set(map(str, paths)))
    _replace(tmp, out, opts.overwrite, replace_damaged)
    return out


def _replaceable(out: Path, damaged: bool) -> bool:
    """Whether the existing ``out`` may be replaced: a store, or (``damaged``) one whose root metadata is lost."""
    return _is_store(out) or (damaged and _is_damaged_store(out))


def _replace(tmp: Path, out: Path, overwrite: bool = True, damaged: bool = False) -> None:
    """Move the finished store into place; an existing one is swapped out first, then removed."""
    old = None
    if out.exists() and not (overwrite and _replaceable(out, damaged)):
        raise InputError(f"{out} appeared during the conversion and is not ours to replace; "
                         "remove it or choose another -o, then convert again")
    retry = "convert again"
    if out.exists():
        old = out.parent / f".{out.name}.old-{secrets.token_hex(4)}"
        try:
            os.rename(out, old)
        except OSError as exc:  # e.g. Windows: a program is reading the store
            raise rename_error(exc, f"move the existing store {out} aside", retry) from None
    try:
        os.rename(tmp, out)
    except OSError as exc:
        if old is not None:
            try:
                os.rename(old, out)
            except OSError:
                retry = f"rename {old} back to {out} (the previous store) and {retry}"
        raise rename_error(exc, f"move the new store into {out}", retry) from None
    fsync_dir(out.parent)  # the rename itself reaches the disk
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
