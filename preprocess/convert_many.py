"""Convert the scenes of a manifest into a collection, one Dask task per scene (``hsgds convert-many``).

Each task runs the single-scene :func:`hsgds.preprocess.convert.convert` (atomic: a store is complete or
absent), so the orchestration here only decides *which* scenes need converting, hands them to a
``dask.distributed`` cluster (a given scheduler, or a ``LocalCluster`` of worker processes), collects
one result per scene, and finally writes ``collection.json`` listing exactly the scenes that are
converted and valid. A worker that dies mid-scene is replaced and its task rescheduled by Dask; a rerun
of the same command converts only what is missing, changed or damaged, and of a store whose class names alone
differ, or that lacks the PixelIsPoint flag an older hsgds did not record, rewrites only the metadata.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import logging
import os
import secrets
import signal
import threading
import time
import unicodedata
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hsgds import format as fmt
from hsgds._optional import require
from hsgds._sha256 import sha256_of
from hsgds._wording import clipped, counted, listed
from hsgds.collection import COLLECTION_FILE, SceneEntry, open_collection, write_collection
from hsgds.errors import ConfigError, HsgdsError, InputError, StoreError, one_line
from hsgds.preprocess.convert import (
    CONVERT_WARNINGS,
    ConvertOptions,
    class_names_of,
    convert,
    nm_text,
    nodata_option,
    remove_stale,
    wavelength_list,
)
from hsgds.preprocess.readers import detect_format, label_class_names, label_files, open_cube
from hsgds.preprocess.readers.base import recorded_nodata, source_stamps
from hsgds.preprocess.rewrite import commit_metadata, lock_store, remove_stale_commits
from hsgds.scene import open_scene

__all__ = ["ManifestRow", "ManyResult", "SceneResult", "convert_many", "convert_scene", "read_manifest"]

COLUMNS = ("source", "labels", "name", "key", "labels_key", "band_axis", "wavelengths", "nodata")
#: values of the band_axis column (as --band-axis): a PRISMA cube's (middle) beside GeoTIFF and ENVI scenes,
#: which refuse the option, so it cannot be global in a manifest of several sensors
BAND_AXES = ("first", "middle", "last")
#: Largest manifest read (a million rows of long paths is ~500 MB; anything larger is not a manifest).
MAX_MANIFEST_BYTES = 1 << 30
#: Longest scene name in bytes: 255 (a file name's limit on common file systems) less what the converter adds
#: for its temporary folder, ".<name>.zarr.tmp-XXXXXXXX".
MAX_NAME_BYTES = 255 - len("..zarr.tmp-12345678")


@dataclass(frozen=True)
class ManifestRow:
    """One scene of a manifest: absolute paths, its store name and per-scene keys (None: the global option)."""

    name: str
    source: Path
    labels: Path | None = None
    key: str | None = None
    labels_key: str | None = None
    band_axis: str | None = None
    wavelengths: tuple[float | None, ...] | None = None  # band centres (nm) from the row's wavelengths file
    line: int = 0
    wavelengths_file: Path | None = None  # that file, named by messages about them
    nodata: float | str | None = None  # the row's nodata value ("none": ignore the source's), over --nodata
    manifest: Path | None = None  # the manifest file, as given: messages name the row as "manifest PATH line N"

    def column(self, name: str) -> str:
        """This row's cell of column ``name``, as messages name it: "the key column of manifest m.csv line 3"."""
        where = "the manifest" if self.manifest is None else f"manifest {self.manifest}"
        return f"the {name} column of {where} line {self.line}"

    def options(self, opts: ConvertOptions) -> ConvertOptions:
        """``opts`` for this scene: its labels, its keys and band axis where given, its wavelengths and nodata value
        where given, each named in messages as its column and row, not as the option (which the user may not have
        passed); a key or band axis given by neither is suggested as the column too (a global option would apply
        to every scene, and GeoTIFF and ENVI scenes refuse them)."""
        def named(column: str, own: Any, shared: Any, option: str) -> str:
            return self.column(column) if own is not None or shared is None else option

        opts = dataclasses.replace(
            opts, key=self.key or opts.key, labels=self.labels, labels_key=self.labels_key or opts.labels_key,
            band_axis=self.band_axis or opts.band_axis, key_from=named("key", self.key, opts.key, opts.key_from),
            labels_key_from=named("labels_key", self.labels_key, opts.labels_key, opts.labels_key_from),
            band_axis_from=named("band_axis", self.band_axis, opts.band_axis, opts.band_axis_from))
        if self.nodata is not None:
            opts = dataclasses.replace(opts, nodata=self.nodata, nodata_from=self.column("nodata"))
        if self.wavelengths is None:
            # what a scene's messages suggest when it records no wavelengths: its column, or --wavelengths if given
            return opts if opts.wavelengths is not None else dataclasses.replace(
                opts, wavelengths_from="a wavelengths column in the manifest")
        named = "the manifest's wavelengths column" + (f" ({self.wavelengths_file.name})" if self.wavelengths_file else "")
        return dataclasses.replace(opts, wavelengths=self.wavelengths, wavelengths_from=named)


def _check_name(name: str, where: str) -> None:
    """Names become file names (``OUT_DIR/<name>.zarr``): refuse anything that is not one plain name."""
    # tabs, line breaks and other C0/C1 controls or DEL (category Cc): legal in a POSIX file name, but they break
    # every listing, log line and script that shows or splits the store's name
    control = next((c for c in name if unicodedata.category(c) == "Cc"), None)
    if control is not None:  # (clipped() would join the lines and tabs it is about)
        shown = repr(name if len(name) <= 100 else name[:100]) + (" ..." if len(name) > 100 else "")
        raise InputError(f"{where}: name {shown} holds the control character {control!r}; give the scene a name "
                         "without control characters (tab, line break, ...) in the name column")
    bad = (not name or name in (".", "..") or name.startswith(".") or any(c in name for c in '/\\:\0')
           or name != name.strip())
    if bad:
        raise InputError(f"{where}: name {name!r} cannot be a store name (no slashes, colons, leading dots "
                         "or surrounding spaces); fix the name column")
    # the longest file name made of it, the store's hidden temporary ".<name>.zarr.tmp-XXXXXXXX", must fit the
    # 255 bytes file systems allow: else every conversion of the scene failed, blaming the output folder
    size = len(name.encode("utf-8", "surrogateescape"))
    if size > MAX_NAME_BYTES:
        raise InputError(f"{where}: name {clipped(name, 40)!r} is {size} bytes long; a store name may have at most "
                         f"{MAX_NAME_BYTES} (in UTF-8); shorten it in the name column")


def read_manifest(path: str | os.PathLike) -> list[ManifestRow]:
    """Read a CSV manifest with a header: ``source`` (required), ``labels``, ``name``, ``key``, ``labels_key``,
    ``band_axis`` (first, middle or last, over ``--band-axis``), ``wavelengths`` (a text file of the scene's band centres in nm, for sources that do not record them),
    ``nodata`` (the scene's nodata value, ``nan`` or ``none``, over ``--nodata``).

    Relative paths are relative to the manifest's folder; ``name`` defaults to the source's stem and must
    be unique (ignoring case, as some filesystems do). Every source and labels file must exist. Any
    problem is a one-line :class:`~hsgds.errors.InputError` naming the manifest line.
    """
    path = Path(path)
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise InputError(f"manifest {path} is larger than {MAX_MANIFEST_BYTES >> 20} MiB; "
                             "is it a CSV list of scenes?")
        # decoded as read (read_text would turn a carriage return inside a quoted value into a newline); utf-8-sig
        # tolerates the BOM spreadsheet programs write
        text = path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"manifest {path} does not exist; give the CSV file listing the scenes") from None
    except (OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"cannot read manifest {path} ({getattr(exc, 'strerror', None) or exc}); "
                         "it must be a UTF-8 CSV file") from None
    # skipinitialspace: a quoted value after "a, " is still quoted (values are stripped anyway), not a path
    # holding quote characters. Rows end at newlines only, as csv reads a file: str.splitlines also broke a
    # quoted value at a newline (dropping it) and at characters such as U+2028 or U+0085 a file name may hold
    reader = csv.reader(io.StringIO(text, newline=""), skipinitialspace=True)
    try:
        header = next(reader, None)
        if header is None or not any(h.strip() for h in header):
            raise InputError(f"manifest {path} is empty; its first line must be a header naming the columns "
                             f"({', '.join(COLUMNS)}; source is required)")
        header = [h.strip() for h in header]
        if "" in header:  # ('' is no column a user wrote: "unknown column ''" said nothing of where or why)
            raise InputError(f"manifest {path}: the header's field {header.index('') + 1} is empty (a trailing "
                             f"comma?); name every column ({', '.join(COLUMNS)}) and nothing else")
        unknown = [h for h in header if h not in COLUMNS]
        if unknown:
            raise InputError(f"manifest {path}: unknown column {unknown[0]!r}; columns are {', '.join(COLUMNS)} "
                             "(source is required)")
        dup = {h for h in header if header.count(h) > 1}
        if dup:
            raise InputError(f"manifest {path}: column {sorted(dup)[0]!r} appears twice in the header")
        if "source" not in header:
            raise InputError(f"manifest {path} has no 'source' column; its header must name it "
                             f"(found: {', '.join(header)})")
        base = path.resolve().parent
        rows: list[ManifestRow] = []
        seen: dict[str, int] = {}
        for fields in reader:
            line = reader.line_num
            if not any(f.strip() for f in fields):
                continue  # blank line
            where = f"manifest {path} line {line}"
            if len(fields) != len(header):
                # empty fields past the header's: commas at the end of the row, not a value holding one
                trailing = len(fields) > len(header) and not any(f.strip() for f in fields[len(header):])
                raise InputError(f"{where} has {len(fields)} fields, the header has {len(header)}; " + (
                    "remove the commas at its end" if trailing else "quote values that contain commas"))
            v = {h: (f.strip() or None) for h, f in zip(header, fields)}
            if v["source"] is None:
                raise InputError(f"{where}: source is empty; every row needs a source file")
            source = base / v["source"]
            labels = None if v.get("labels") is None else base / v["labels"]
            nm_file = None if v.get("wavelengths") is None else base / v["wavelengths"]
            for what, p in (("source", source), ("labels", labels), ("wavelengths", nm_file)):
                if p is not None and not p.is_file():
                    reason = "is a folder" if p.is_dir() else "does not exist"
                    raise InputError(f"{where}: {what} {p} {reason}; fix the path (relative paths are "
                                     f"relative to the manifest's folder)")
            name = v.get("name") or source.stem
            _check_name(name, where)
            # one name however it is cased or composed (è as one character or e + U+0300): case-insensitive
            # file systems, and those that normalize names (macOS), make such names one store
            folded = unicodedata.normalize("NFD", unicodedata.normalize("NFD", name).casefold())
            if folded in seen:
                raise InputError(f"{where}: scene name {name!r} is already used on line {seen[folded]}; names must "
                                 "be unique (set the name column)")
            seen[folded] = line
            axis = None if v.get("band_axis") is None else v["band_axis"].lower()
            if axis is not None and axis not in BAND_AXES:
                raise InputError(f"{where}: band_axis {v['band_axis']!r} is not one of {', '.join(BAND_AXES)}; "
                                 "leave it empty for the default (last: H, W, B)")
            try:
                nm = None if nm_file is None else wavelength_list(nm_file, "wavelengths")
                nodata = None if v.get("nodata") is None else nodata_option(v["nodata"], "nodata")
            except ConfigError as exc:
                raise InputError(f"{where}: {exc}") from None
            rows.append(ManifestRow(name=name, source=source, labels=labels, key=v.get("key"),
                                    labels_key=v.get("labels_key"), band_axis=axis, wavelengths=nm, line=line,
                                    wavelengths_file=nm_file, nodata=nodata, manifest=path))
    except csv.Error as exc:
        raise InputError(f"manifest {path} line {reader.line_num}: not valid CSV ({exc})") from None
    if not rows:
        raise InputError(f"manifest {path} lists no scenes; add one row per scene under the header")
    return rows


# -- one scene (runs on a Dask worker) -------------------------------------------------------------

@dataclass(frozen=True)
class SceneResult:
    """What happened to one scene: ``status`` is ``converted``, ``up to date``, ``failed`` or ``metadata updated``
    and what was (:data:`RENAMED`: ``metadata updated (class names)``, only they differed; ``(PixelIsPoint)``, the
    flag an older hsgds did not record; or both): the tiles were kept."""

    name: str
    status: str
    reason: str | None = None  # why it was (re)converted or its metadata updated, or why it failed
    entry: SceneEntry | None = None
    tiles: int = 0
    source_bytes: int = 0
    store_bytes: int = 0
    seconds: float = 0.0
    #: what the conversion warned of (labelled pixels without data, classes a split could not split), one line
    #: each: the worker's own stderr is not the user's terminal (or is another machine's)
    warnings: tuple[str, ...] = ()


def _stamps(paths: list[Path]) -> dict[str, tuple[int, int]]:
    """:func:`source_stamps` keyed by the path's text, as collection.json records them."""
    return {str(p): stamp for p, stamp in source_stamps(paths).items()}


def _differs(option: str, want: Any, had: Any) -> str:
    def show(v: Any) -> Any:
        return "not given" if v is None else v

    return f"{option} {show(want)} differs from the store's ({show(had)})"


def _class_names_differ(meta, opts: ConvertOptions, largest: int | None = None) -> str | None:
    """How the store's class names differ from those a conversion with ``opts`` records, said as the option and
    both values (None: they agree); ``largest``: the labels' largest class, where known (else the class count,
    which names may exceed)."""
    want_names = list(opts.class_names) if opts.class_names else None
    if want_names is None and opts.labels is not None:
        # without --class-names a conversion takes the label file's own (an ENVI Classification's): the store
        # made so is up to date; its header is read again, cheap next to verifying the tiles
        try:
            own = label_class_names(opts.labels, meta.num_classes if largest is None else largest)
        except (HsgdsError, OSError) as exc:
            return f"the class names of {Path(opts.labels).name} cannot be used ({one_line(exc)})"
        if own is not None:
            want_names = list(own)
            if meta.class_names != want_names:
                shown = [",".join(n)[:60] if n else "none" for n in (want_names, meta.class_names)]
                return f"the class names of {Path(opts.labels).name} ({shown[0]}) differ from the store's ({shown[1]})"
    if meta.class_names != want_names:
        shown = [",".join(n)[:60] if n else None for n in (want_names, meta.class_names)]
        return _differs("--class-names", *shown)
    return None


def _options_differ(meta, opts: ConvertOptions, names: bool = True) -> str | None:
    """Which requested option the existing store was not converted with, said as the option and both values
    (None: it matches); ``names``: the class names too (whose difference alone needs no conversion, see
    :func:`_renamed`). A split is compared with the one the store was converted with, so a store re-split
    since (``hsgds resplit``) stays as it is; a store without that record (written before it existed) is
    compared with its current split, as before."""
    if meta.halo != opts.halo:
        return _differs("--max-patch", opts.max_patch, 2 * meta.halo + 1)
    if meta.padding != opts.padding:
        return _differs("--padding", opts.padding, meta.padding)
    source_dtype = meta.source.get("dtype", meta.dtype)  # (a store written before --dtype holds the source's)
    if meta.dtype != (opts.dtype or source_dtype):
        return _differs("--dtype", opts.dtype or f"the source's {source_dtype}", meta.dtype)
    if opts.tile is not None and meta.tile != opts.tile:
        return _differs("--tile", opts.tile, meta.tile)
    if (meta.labels_source is None) != (opts.labels is None):
        return "labels added" if opts.labels is not None else "labels removed"
    if names and (why := _class_names_differ(meta, opts)):
        return why
    if opts.wavelengths is not None and meta.wavelengths != list(opts.wavelengths):
        shown = [nm_text(ws, 4) + (",..." if len(ws) > 4 else "") if ws else None
                 for ws in (opts.wavelengths, meta.wavelengths)]
        return _differs(opts.wavelengths_from, *shown)
    if opts.nodata is not None:  # given: the store must have applied this very value (or none)
        had = None if meta.nodata is None else meta.nodata["value"]
        want = None if opts.nodata == "none" else fmt.nodata_value(float(opts.nodata))
        if had != want:
            return _differs(opts.nodata_from, fmt.nodata_text(want), fmt.nodata_text(had))
    split = meta.converted_split if meta.converted_split is not None else meta.split or {}
    if split.get("method", "none") != "none":
        if split.get("method") != opts.split:
            return _differs("--split", opts.split, split.get("method"))
        want: dict[str, Any] = {}
        if opts.split in ("random", "blocks"):  # (a mask split draws nothing: its seed, if recorded, is moot)
            want.update(seed=opts.seed, train=opts.train, val=opts.val)
        if opts.split == "blocks":
            if "adaptive_block_size" in split:
                want["adaptive_block_size"] = opts.block_size is None
            if opts.block_size is not None:
                want["block_size"] = opts.block_size
        for key, value in want.items():
            if split.get(key) != value:
                if key == "adaptive_block_size":
                    return _differs("--block-size", opts.block_size, None if split.get(key) else
                                    split.get("block_size"))
                return _differs("--" + key.replace("_", "-"), value, split.get(key))
        if opts.split == "masks":
            return _masks_differ(split, opts)
    return None


def _masks_differ(split: dict[str, Any], opts: ConvertOptions) -> str | None:
    """Why a mask split must be made again: other mask files given (by name), or a mask whose content changed
    since (its sha256, recorded by hsgds since it was; a store written before records names alone)."""
    for key in ("train_mask", "val_mask", "test_mask"):
        path = getattr(opts, key)
        option = "--" + key.replace("_", "-")
        if (None if path is None else Path(path).name) != split.get(key):
            return _differs(option, None if path is None else Path(path).name, split.get(key))
        if path is not None and f"{key}_sha256" in split:
            try:
                now = sha256_of(label_files(path))[0]
            except (HsgdsError, OSError) as exc:
                return f"{option} {Path(path).name} cannot be read ({_one_line(exc)})"
            if now != split[f"{key}_sha256"]:
                return f"{option} {Path(path).name} changed (sha256)"
    return None


def _source_nodata_differs(meta, opts: ConvertOptions, source: Path) -> str | None:
    """Why a store must be converted again when no nodata value is given (``--nodata`` nor the manifest's
    column), so that the source's own applies: the store applied another, or none where the source records
    one (a store written before format v3 ignored it; a later one was converted with ``--nodata`` since left
    out, and is v2 when ``--nodata none`` left it without a nodata record). None: they agree, or a value is
    given, which :func:`_options_differ` compares. Only GeoTIFF, ENVI and HDF5/netCDF (``_FillValue``) record a
    value; their headers are cheap next to the verification of every tile that follows."""
    if opts.nodata is not None:
        return None
    had = None if meta.nodata is None else meta.nodata["value"]
    value = None
    try:
        if detect_format(source) in ("tiff", "envi", "hdf5"):
            cube = open_cube(source, key=opts.key, band_axis=opts.band_axis, key_option=opts.key_from,
                             axis_option=opts.band_axis_from)
            try:
                value = recorded_nodata(cube)
            finally:
                cube.close()
    except HsgdsError as exc:  # e.g. a _FillValue of several values: a new conversion refuses it, naming it
        return f"the source's own nodata value cannot be used ({one_line(exc)}); no --nodata is given"
    except OSError:
        return None  # the conversion itself names what is wrong with the source
    want = None if value is None else fmt.nodata_value(value)
    if want == had:
        return None
    # whatever the store's version: a v2 store without a record was converted before v3 or with --nodata none
    return (f"the source's nodata value ({fmt.nodata_text(want)}) differs from the store's ({fmt.nodata_text(had)}); "
            "no --nodata is given")


def _source_array_differs(meta, opts: ConvertOptions, source: Path) -> str | None:
    """Why a store must be converted again because the source, opened as the options say (its key, the band
    axis), is not the array the store holds: another shape or dtype (another variable of the file, a band
    axis changed since), or read with another band axis than the store records (a cube of the same shape
    either way). The key is not recorded, so the array itself is compared; opening a cube reads its header
    only. A source that no longer opens so is converted again, and that conversion
    names the problem."""
    try:
        cube = open_cube(source, key=opts.key, band_axis=opts.band_axis, key_option=opts.key_from,
                         axis_option=opts.band_axis_from)
    except (HsgdsError, OSError) as exc:
        return f"the source cannot be opened as given ({clipped(_one_line(exc), 160)})"
    try:
        found = (tuple(int(n) for n in cube.shape), np.dtype(cube.dtype).name)
        recorded = cube.wavelengths
        bad = getattr(cube, "bad_bands", None)
        point = bool(getattr(cube, "georeference", None) and getattr(cube, "pixel_is_point", False))
        geo = getattr(cube, "georeference", None)
    finally:
        cube.close()
    held = (tuple(meta.shape), meta.source.get("dtype", meta.dtype))  # the source's type, which --dtype may cast
    if found != held:
        given = [f"{what} {value}" for what, value in (("key", opts.key), ("band axis", opts.band_axis)) if value]
        how = f" ({', '.join(given)})" if given else ""
        return (f"the source{how} is {'x'.join(map(str, found[0]))} {found[1]}, the store's "
                f"{'x'.join(map(str, held[0]))} {held[1]}")
    axis = meta.source.get("band_axis")  # (recorded since; an older store is told by its shape alone)
    if axis is not None and axis != (opts.band_axis or "last"):  # a cube of the same shape either way
        return _differs(opts.band_axis_from, opts.band_axis or "last", axis)
    # without wavelengths given, the store holds the source's own: those an older hsgds could not read (an
    # HDF5 or GeoTIFF source's), or stored though they were no nm (micrometres labelled as nanometres)
    if opts.wavelengths is None and not _same_wavelengths(recorded, meta.wavelengths):
        return f"band centres: the source records {_nm_range(recorded)}, the store {_nm_range(meta.wavelengths)}"
    if bad != meta.bad_bands:  # (a store written before hsgds recorded them has none)
        return f"bad bands: the source flags {_bad_bands_text(bad)}, the store {_bad_bands_text(meta.bad_bands)}"
    if point and not meta.pixel_is_point and not _same_georeference(geo, meta.georeference):
        # (a store of the same georeference only lacks the flag: _metadata_update records it, the tiles kept)
        return "the source's coordinates name pixel centres (PixelIsPoint), which the store does not record"
    return None


def _same_georeference(source: Any, stored: Any) -> bool:
    """Whether a source's georeference is the one a store records (as its JSON holds it: lists, not tuples)."""
    return source is not None and json.loads(json.dumps(source)) == stored


def _pixel_is_point_unrecorded(meta, opts: ConvertOptions, source: Path) -> str | None:
    """Why a store's metadata must record ``pixel_is_point``: its source's coordinates name pixel centres (a
    PixelIsPoint GeoTIFF) but the store, written before hsgds recorded it, says nothing (its GeoTIFF maps were
    PixelIsArea). Only the flag is missing: the tiles, and the georeference (the corner's, as GDAL reads it; a
    store of another is converted again, :func:`_source_array_differs`), are those a conversion writes. None:
    nothing to record (a source that no longer opens was named by :func:`_why_convert`)."""
    if meta.pixel_is_point or meta.georeference is None:
        return None
    try:
        cube = open_cube(source, key=opts.key, band_axis=opts.band_axis, key_option=opts.key_from,
                         axis_option=opts.band_axis_from)
    except (HsgdsError, OSError):
        return None
    try:
        point = bool(getattr(cube, "pixel_is_point", False))
        geo = getattr(cube, "georeference", None)
    finally:
        cube.close()
    if not point or not _same_georeference(geo, meta.georeference):
        return None
    return "the source's coordinates name pixel centres (PixelIsPoint), which the store did not record"


def _bad_bands_text(bad: list[int] | None) -> str:
    """The bad bands a source or store records, for a message: "bands 104, 105 and 3 more", "none (no bbl)"."""
    return ("none (no bbl)" if bad is None else "no band" if not bad else
            f"band{'s' * (len(bad) > 1)} {listed(bad, 8)}")


def _same_wavelengths(a: Any, b: Any) -> bool:
    """Whether two lists of band centres agree: the same bands without a centre (null), the others within
    1e-6 nm."""
    if a is None or b is None:
        return a is None and b is None
    return len(a) == len(b) and bool(np.allclose(fmt.wavelength_array(a), fmt.wavelength_array(b), rtol=0,
                                                 atol=1e-6, equal_nan=True))


def _nm_range(wavelengths: Any) -> str:
    if wavelengths is None:
        return "none"
    nm = fmt.centred(wavelengths)
    missing = len(wavelengths) - len(nm)
    return f"{min(nm):g}-{max(nm):g} nm" + (f" ({counted(missing, 'band')} without a centre)" if missing else "")


def _label_files_differ(labels: Path, record: dict[str, Any]) -> str | None:
    """Why a store must be converted again because ``labels`` is read from other files than its
    ``labels_source`` record lists (an ENVI header and its binary); None: the same. A record without
    ``files`` (an older hsgds's) hashed the given file alone, which holds a one-file label map whole, but
    not ENVI's, whose other file was never compared: such a store is converted once more."""
    try:
        names = [p.name for p in label_files(labels)]
    except (HsgdsError, OSError) as exc:
        return f"the labels cannot be opened as given ({clipped(_one_line(exc), 160)})"
    if "files" not in record:
        if names == [labels.name]:
            return None
        return f"labels {', '.join(names)}: the store, written by an older hsgds, records {labels.name} alone"
    if names != record["files"]:
        return f"labels {', '.join(names)} differ from the store's ({', '.join(map(str, record['files']))})"
    return None


#: the reason of a scene converted for the first time (no store, and not listed by the last run)
NEW = "missing"
#: the reason of a scene the last run's collection.json listed whose store has since gone
GONE = "its store was missing"


def _why_convert(row: ManifestRow, store: Path, opts: ConvertOptions, stamps: dict[str, tuple[int, int]] | None,
                 listed: bool = False, listed_sha256: tuple[str, str | None] | None = None
                 ) -> tuple[str | None, dict[str, tuple[int, int]]]:
    """Why ``store`` must be (re)converted, or None when it is complete, verified and made from this very
    source with these options, its class names aside (:func:`_renamed` compares those); also the current
    (size, mtime) stamps of its source and label files.
    ``listed``: the previous ``collection.json`` lists the scene (a missing store was deleted, not new);
    ``listed_sha256``: the source's and labels' sha256 it lists, those of the store its stamps were taken for.

    Sources are compared by their recorded size and, unless their stamps equal those recorded in the
    previous ``collection.json`` for this very store, by their sha256."""
    if not store.exists():
        return GONE if listed else NEW, {}
    try:
        scene = open_scene(store)
    except StoreError as exc:
        return f"incomplete or damaged ({clipped(str(exc), 200)})", {}
    meta = scene.meta
    if meta.source.get("name") != row.source.name:
        return f"source {meta.source.get('name')} -> {row.source.name}", {}
    differ = (_options_differ(meta, opts, names=False) or _source_array_differs(meta, opts, row.source)
              or _source_nodata_differs(meta, opts, row.source))
    if differ:
        return differ, {}
    data = [row.source.parent / f for f in meta.source.get("files", [])]
    labels: list[Path] = []
    if row.labels is not None:
        record = meta.labels_source or {}
        if record.get("name") != row.labels.name:
            return f"labels {record.get('name')} -> {row.labels.name}", {}
        why = _label_files_differ(row.labels, record)
        if why:
            return why, {}
        labels = [row.labels.parent / f for f in record["files"]] if "files" in record else [row.labels]
    try:
        now = _stamps(data + labels)
    except OSError:
        return "source files changed", {}
    if sum(now[str(p)][0] for p in data) != meta.source.get("size"):
        return "source changed (size)", now
    # the stamps vouch for the store they were recorded with: not one replaced since (converted from another
    # file of the same name and size), whose sha256 differs from the listing's
    held = (meta.source.get("sha256"), None if not meta.labels_source else meta.labels_source.get("sha256"))
    if stamps != now or listed_sha256 != held:  # not provably unchanged: compare contents
        if sha256_of(data)[0] != meta.source.get("sha256"):
            return "source changed (sha256)", now
        if labels and sha256_of(labels)[0] != (meta.labels_source or {}).get("sha256"):
            return "labels changed (sha256)", now
    problems = scene.verify()
    if problems:
        # tiles, labels, samples or statistics: verify() lists them all
        return f"damaged: {counted(len(problems), 'problem')} ({clipped(problems[0], 120)})", now
    return None, now


#: the status of a scene whose metadata alone was rewritten, its tiles kept, then what was in parentheses
METADATA_UPDATED = "metadata updated"
#: the status of a scene whose class names alone differed
RENAMED = f"{METADATA_UPDATED} (class names)"


def _largest_label(scene) -> int | None:
    """The largest class of the labels ``scene`` was converted from (0: none), which its class count records
    unless names outnumbered it, and its label map holds unless labelled pixels were dropped as nodata (a class
    may have gone with them): then None, unknown."""
    meta = scene.meta
    if meta.labels_source is None:
        return 0
    if meta.num_classes > len(meta.class_names or ()):
        return meta.num_classes
    if (meta.nodata or {}).get("labelled_dropped"):
        return None
    return int(scene.labels.max(initial=0))


def _renamed(scene, opts: ConvertOptions) -> tuple[str | None, fmt.StoreMeta | None]:
    """For a store that matches the source and every other option (:func:`_why_convert` said None): how its
    class names differ from those ``opts`` asks for, and its metadata naming them as a conversion with ``opts``
    would (names and class count; the tiles, labels, samples and statistics do not depend on them). (None, None):
    they agree; (why, None): it must be converted again, as the labels' largest class is unknown or the label
    file's own names cannot name it (the conversion names that problem). Names that do not name each labelled
    class raise the conversion's one-line error."""
    meta = scene.meta
    largest = _largest_label(scene)
    why = _class_names_differ(meta, opts, largest)
    if why is None:
        return None, None
    if largest is None:
        return why, None
    try:
        names, num_classes = class_names_of(opts, largest)
    except (HsgdsError, OSError):
        if opts.class_names is not None:
            raise  # names given that do not name every class: the conversion would refuse them alike
        return why, None
    new = dataclasses.replace(meta, class_names=list(names) if names else None, num_classes=num_classes)
    # checked as a reader checks it, before it is written
    return why, fmt.StoreMeta.from_json({fmt.FORMAT_NAME: new.to_json()}, str(scene.path))


def _metadata_update(scene, opts: ConvertOptions, source: Path) -> tuple[str | None, fmt.StoreMeta | None, str]:
    """For a store that matches the source and every other option (:func:`_why_convert` said None): why its
    metadata alone must change, the metadata to write instead (checked as a reader checks it) and the scene's
    status saying what changed: its class names (:func:`_renamed`), the PixelIsPoint flag an older hsgds did not
    record (:func:`_pixel_is_point_unrecorded`), or both. (None, None, "up to date"): nothing; (why, None,
    "converted"): it must be converted again (:func:`_renamed` says when)."""
    why, meta = _renamed(scene, opts)
    if why is not None and meta is None:
        return why, None, "converted"
    changed = [] if meta is None else ["class names"]
    point = _pixel_is_point_unrecorded(scene.meta, opts, source)
    if point is not None:
        changed.append("PixelIsPoint")
        new = dataclasses.replace(meta or scene.meta, pixel_is_point=True)
        meta = fmt.StoreMeta.from_json({fmt.FORMAT_NAME: new.to_json()}, str(scene.path))
        why = point if why is None else f"{why}; {point}"
    if meta is None:
        return None, None, "up to date"
    return why, meta, f"{METADATA_UPDATED} ({', '.join(changed)})"


def _rewrite_metadata(store: Path, checked: fmt.StoreMeta, new: fmt.StoreMeta) -> None:
    """Replace ``store``'s metadata ``checked`` (from which ``new`` was made) by ``new``, atomically and under the
    lock ``hsgds resplit`` takes; a store whose metadata changed since it was checked (a re-split meanwhile) is
    left as it is, and the scene fails (the next run checks it again)."""
    lock = lock_store(store)
    try:
        remove_stale_commits(store)
        try:
            now = json.loads((store / "zarr.json").read_text())
            same = fmt.StoreMeta.from_json(now.get("attributes", {}), str(store)) == checked
        except (HsgdsError, OSError, ValueError, AttributeError, RecursionError):
            same = False
        if not same:
            raise StoreError(f"{store} changed while its metadata was compared (another command rewrote it); "
                             "run the same command again")
        commit_metadata(store, new, "run the same `hsgds convert-many` again")
    finally:
        if lock is not None:
            os.close(lock)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, HsgdsError):
        return str(exc)
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)
    return one_line(exc, with_type=True)


def convert_scene(row: ManifestRow, out_dir: str | os.PathLike, opts: ConvertOptions,
                  stamps: dict[str, tuple[int, int]] | None = None, force: bool = False,
                  listed: bool = False, listed_sha256: tuple[str, str | None] | None = None) -> SceneResult:
    """Bring ``OUT_DIR/<name>.zarr`` up to date with ``row`` (the task each Dask worker runs); ``listed``: the
    previous ``collection.json`` lists it, with ``stamps`` and ``listed_sha256`` (its source's and labels'
    sha256).

    Never raises for a scene's own problems: they come back as a ``failed`` result with a one-line
    reason, so one bad scene does not stop the others and is not retried in vain.
    """
    t0 = time.perf_counter()
    store = Path(out_dir) / f"{row.name}.zarr"
    opts = dataclasses.replace(row.options(opts), overwrite=True)
    try:
        remove_stale(store)  # temporary folders a killed worker left behind
        reason, now = (("--overwrite", {}) if force
                       else _why_convert(row, store, opts, stamps, listed, listed_sha256))
        renamed, status = None, "converted"
        if reason is None:  # everything else matches: class names that differ, a flag unrecorded: new metadata only
            current = open_scene(store)
            reason, renamed, status = _metadata_update(current, opts, row.source)
            if renamed is not None:
                _rewrite_metadata(store, current.meta, renamed)
        started_ns = time.time_ns()
        said: tuple[str, ...] = ()
        if reason is not None and renamed is None:
            # recorded, not printed on the worker (a worker runs one task at a time, so the warnings are this
            # scene's; on a cluster whose workers run several threads another scene's could be caught here)
            with warnings.catch_warnings(record=True) as caught:
                for category in CONVERT_WARNINGS:
                    warnings.simplefilter("always", category)
                # a store whose root metadata is lost does not verify: converted again like a damaged one
                convert(row.source, store, opts, replace_damaged=True)
            said = tuple(str(w.message) for w in caught if issubclass(w.category, CONVERT_WARNINGS))
            for w in caught:  # anything else as it would have been shown
                if not issubclass(w.category, CONVERT_WARNINGS):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        scene = open_scene(store)
        if reason is not None and renamed is None:
            # convert() refused sources that changed while it ran; files touched since it started may
            # differ from what was hashed, so their stamps are not recorded (the next run hashes them)
            files = [row.source.parent / f for f in scene.meta.source.get("files", [])]
            if row.labels is not None:  # every file the labels were read from, as the store records them
                files += [row.labels.parent / f for f in (scene.meta.labels_source or {}).get("files", [])]
            now = _stamps(files)
            if any(mtime >= started_ns for _, mtime in now.values()):
                now = {}
        source_bytes = int(scene.meta.source.get("size", 0))
        return SceneResult(row.name, status, reason, SceneEntry.of_scene(row.name, scene, now or None),
                           tiles=scene.grid.num_tiles if status == "converted" else 0,
                           source_bytes=source_bytes if status == "converted" else 0,
                           store_bytes=scene.grid.num_tiles * scene.grid.tile_nbytes if status == "converted" else 0,
                           seconds=time.perf_counter() - t0, warnings=said)
    except Exception as exc:  # noqa: BLE001 - every failure becomes this scene's one-line reason
        return SceneResult(row.name, "failed", _one_line(exc), seconds=time.perf_counter() - t0)


# -- the whole manifest --------------------------------------------------------------------------

@dataclass
class ManyResult:
    """Outcome of :func:`convert_many`: one :class:`SceneResult` per manifest row, in manifest order."""

    collection: Path
    scenes: list[SceneResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[SceneResult]:
        return [r for r in self.scenes if r.status == "failed"]

    @property
    def converted(self) -> list[SceneResult]:
        return [r for r in self.scenes if r.status == "converted"]

    @property
    def renamed(self) -> list[SceneResult]:
        """The scenes whose metadata alone was rewritten (new class names, the PixelIsPoint flag), their tiles
        kept."""
        return [r for r in self.scenes if r.status.startswith(METADATA_UPDATED)]

    @property
    def up_to_date(self) -> list[SceneResult]:
        return [r for r in self.scenes if r.status == "up to date"]


def _previous_stamps(out_dir: Path) -> dict[str, tuple[dict[str, tuple[int, int]] | None, tuple[str, str | None]]]:
    """name -> stamps recorded by the last run and the source's and labels' sha256 of the store they were
    recorded with (nothing when there is no readable collection.json)."""
    try:
        return {e.name: (e.stamps, (e.source_sha256, e.labels_sha256))
                for e in open_collection(out_dir / COLLECTION_FILE).entries}
    except StoreError:
        return {}


#: how long to try reaching a --scheduler (a busy head node may answer slowly)
CONNECT_TIMEOUT = "20s"


def _client(scheduler: str | None, workers: int):
    """A ``distributed.Client`` on ``scheduler``, or on a new LocalCluster of ``workers`` processes."""
    distributed = require("distributed", "dask", "hsgds convert-many")
    if scheduler is not None:
        try:
            return distributed.Client(scheduler, timeout=CONNECT_TIMEOUT), None
        except (OSError, TimeoutError, ValueError) as exc:
            raise InputError(f"cannot reach the Dask scheduler at {scheduler} ({_one_line(exc)}); start one with "
                             "`dask scheduler` or leave out --scheduler to convert on this machine") from None
    # one task per process at a time: each scene already writes its tiles with opts.workers threads.
    # Workers log only CRITICAL: what goes wrong in a scene comes back through its future (one line per scene),
    # while their ERROR records are shutdown races (a busy worker's heartbeat finding the scheduler gone after
    # Ctrl-C) printed as tracebacks into the user's terminal.
    with _ctrl_c_ignored():
        cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                           dashboard_address=":0", scheduler_port=0,
                                           silence_logs=logging.CRITICAL)
    return distributed.Client(cluster), cluster


@contextlib.contextmanager
def _ctrl_c_ignored() -> Iterator[None]:
    """Ignore SIGINT while the local worker processes start: they inherit the setting (Python keeps an
    ignored SIGINT), so Ctrl-C, which a terminal sends to the whole process group, stops this process
    alone, which then shuts the workers down, instead of every worker printing a traceback. (Only the
    main thread may set signal handlers; elsewhere nothing changes.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def convert_many(manifest: str | os.PathLike, out_dir: str | os.PathLike, opts: ConvertOptions = ConvertOptions(),
                 *, scheduler: str | None = None, workers: int = 2, force: bool = False,
                 progress: Callable[[SceneResult, int, int], None] | None = None,
                 notice: Callable[[str], None] | None = None) -> ManyResult:
    """Convert every scene of ``manifest`` into ``out_dir/<name>.zarr`` on Dask; write ``collection.json``.

    Parameters
    ----------
    manifest
        CSV file (see :func:`read_manifest`).
    out_dir
        Output folder (created if missing). Scenes already there, complete, verified, made from the same
        source bytes with the same options, are kept (``force`` converts them again).
    opts
        Converter options applied to every scene (``labels``, ``key``, ``labels_key`` come from the
        manifest; ``opts.workers`` is the number of tile-writing threads inside each scene).
    scheduler
        Address of a running ``dask.distributed`` scheduler (``tcp://host:port``) whose workers see the
        same paths; None starts a ``LocalCluster`` with ``workers`` processes on this machine.
    progress
        Called on this machine as each scene finishes: ``progress(result, done, total)``.
    notice
        Called with a line to show the user while the run waits: a ``scheduler`` without workers (the tasks
        wait for workers to join; without the line the command sat silent).

    Returns
    -------
    ManyResult
        Per-scene results; ``collection.json`` lists exactly the scenes that did not fail in this run.
    """
    t0 = time.perf_counter()
    if opts.workers < 1:  # the tile-writing threads of each scene: --threads here, not convert's --workers
        raise ConfigError(f"--threads must be >= 1, got {opts.workers}")
    opts.check()  # once, before any scene: a bad shared option is not a per-scene failure
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    rows = read_manifest(manifest)
    if opts.wavelengths is not None and any(r.wavelengths is not None for r in rows):
        raise InputError(f"wavelengths given both by --wavelengths and by the wavelengths column of {manifest}; "
                         "give them per scene (the column) or for every scene (--wavelengths)")
    for r in rows:  # a row's own list is checked like --wavelengths, before any work
        try:
            r.options(opts).check()
        except ConfigError as exc:
            raise InputError(f"manifest {manifest} line {r.line}: {exc}") from None
    out = Path(out_dir).resolve()
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a folder; choose another -o")
    distributed = require("distributed", "dask", "hsgds convert-many")
    client, cluster = _client(scheduler, workers)  # before the folder: an unreachable cluster leaves nothing
    if scheduler is not None and notice is not None and not client.scheduler_info().get("workers"):
        # an autoscaled cluster may add workers later, so wait for them, but say so
        notice(f"the Dask scheduler at {scheduler} has no workers yet; waiting for them (start them with "
               f"`dask worker {scheduler} --nthreads 1` where the manifest's paths and {out} are reachable, "
               "or press Ctrl-C)")
    results: dict[str, SceneResult] = {}
    try:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create the output folder {out} ({exc.strerror}); choose another -o") from None
        previous = _previous_stamps(out)
        token = secrets.token_hex(4)
        futures = {}
        for i, row in enumerate(rows):
            stamps, sha256s = previous.get(row.name, (None, None))
            futures[client.submit(convert_scene, row, str(out), opts, stamps, force, row.name in previous, sha256s,
                                  key=f"hsgds-convert-{token}-{i}", pure=False)] = row
        for future in distributed.as_completed(futures):
            row = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # noqa: BLE001 - e.g. KilledWorker: the scene's worker died repeatedly
                result = SceneResult(row.name, "failed", f"the task failed on the cluster ({_one_line(exc)})")
            results[row.name] = result
            if progress is not None:
                progress(result, len(results), len(rows))
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    ordered = [results[row.name] for row in rows]
    path = write_collection(out, [r.entry for r in ordered if r.status != "failed" and r.entry is not None])
    return ManyResult(path, ordered, time.perf_counter() - t0)
