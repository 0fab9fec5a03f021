"""``hsgds info SOURCE``: what the converter sees in a source file before converting it.

The cube's shape, dtype and how it is read, its band centres, georeference and nodata value (or that it
records none, and which option supplies it), from the same readers ``hsgds convert`` uses; a single-band
file is described as the label map it can be. Nothing is written.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import numpy as np

from hsgds import format as fmt
from hsgds._wording import counted
from hsgds.errors import InputError
from hsgds.preprocess.readers import FORMATS, detect_format, label_class_names, open_cube, read_labels
from hsgds.preprocess.readers.base import recorded_nodata, unknown_epsg
from hsgds.preprocess.readers.envi import parse_header
from hsgds.preprocess.readers.hdf5 import SeveralArrays
from hsgds.preprocess.readers.packed import Unpacked

__all__ = ["describe_source"]

#: where each format keeps the nodata value the converter applies
_NODATA_FIELD = {"tiff": "GDAL_NODATA tag", "envi": "'data ignore value'", "hdf5": "_FillValue attribute"}


def _size(paths: list[Path]) -> str:
    n = sum(Path(p).stat().st_size for p in paths)
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n} bytes"


def describe_source(path: str | os.PathLike, key: str | None = None, band_axis: str | None = None) -> str:
    """Lines describing a source cube (or, for a single-band file, a label map), as ``hsgds info`` prints."""
    path = Path(path)
    kind = detect_format(path)
    try:
        cube = open_cube(path, key=key, band_axis=band_axis)
    except SeveralArrays:  # cubes to choose from with --key: not the file's label map (a gt beside them)
        raise
    except InputError:  # not a cube: a label map (2-D), or the cube's own error
        try:
            return "\n".join([f"source:     {path} ({FORMATS[kind]}, {_size([path])})", *_label_lines(path, key)])
        except SeveralArrays:  # no cube, several label maps (train and test masks): which one is the question
            raise
        except InputError:
            pass
        raise
    lines = [f"source:     {path} ({FORMATS[kind]}, {_size(cube.files)})"]  # (ENVI: header and binary; EnMAP: image and metadata file)
    if cube.shape[2] == 1:  # an ENVI Classification file or an (H, W, 1) raster: the label map it reads as
        try:
            described = "\n".join([*lines, *_label_lines(path, key)])
        except InputError:  # (e.g. one band of reflectance: the cube it is)
            if kind == "envi" and _declares_classification(cube.files[1]):  # its header (a PAM sidecar may follow)
                cube.close()
                raise  # a label map by its own header: what is wrong with it, not a one-band cube
            described = None
        if described is not None:
            cube.close()
            return described
    try:
        h, w, b = cube.shape
        packed = getattr(cube, "array", None)
        unpacked = ""
        if isinstance(packed, Unpacked):
            unpacked = f", unpacked from {packed.dataset.dtype.name} by its {packed.how()}"
        lines.append(f"cube:       {h}x{w}x{b} {cube.dtype} (rows x columns x bands{unpacked})")
        wl = cube.wavelengths
        note = getattr(cube, "wavelengths_note", None)
        why = f"not recorded: {note.split(': ', 1)[-1]}" if note else "no wavelengths recorded"
        sidecar = getattr(cube, "wavelengths_file", None)
        lines.append(f"bands:      {counted(b, 'band')}, " + (
            fmt.describe_wavelengths(wl) + (f" (from {sidecar.name})" if sidecar else "") if wl else
            f"{why} (give them with --wavelengths to select bands by nm)"))
        bad = getattr(cube, "bad_bands", None)
        if bad:
            lines.append(f"bad bands:  {fmt.describe_bad_bands(bad, b)}; the store records them (Scene.bad_bands)")
        scale = getattr(cube, "reflectance_scale_factor", None)
        if scale is not None:
            lines.append(f"scale:      {fmt.describe_reflectance_scale(scale)}; the store records it")
        geo, geo_note = cube.georeference, getattr(cube, "georeference_note", None)
        lines.append("georef:     " + (fmt.describe_georeference(geo) if geo else (
            f"not recorded: {geo_note.split(': ', 1)[-1]}" if geo_note else "none") + " (maps predicted from it carry "
                                                                                      "no coordinates)"))
        if geo and unknown_epsg(geo) is not None:
            lines[-1] += " (a code PROJ does not know: hsgds convert refuses it)"
        try:
            value = recorded_nodata(cube)
            field = getattr(cube, "nodata_field", None) or _NODATA_FIELD.get(kind, "recorded")
            if isinstance(packed, Unpacked) and packed.gap is not None:  # (its bands unpack it to different values)
                field += (f" {packed.gap:g} in every band, read as NaN: the bands' {packed.names[0]}s and "
                          f"{packed.names[1]}s differ")
            nodata = (f"{value:g} ({field}): a pixel with every band at it is left "
                      "out of statistics, samples and predictions" if value is not None else
                      "none recorded (pass --nodata VALUE if a value marks pixels without data)")
        except InputError as exc:
            nodata = f"unreadable: {exc}"
        lines.append(f"nodata:     {nodata}")
    finally:
        cube.close()
    options = (f" --key {shlex.quote(key)}" if key is not None else "") + (
        f" --band-axis {band_axis}" if band_axis is not None else "")  # what it took to read the cube
    lines.append(f"convert:    hsgds convert {shlex.quote(str(path))}{options} -o {shlex.quote(path.stem + '.zarr')} "
                 "[--labels GT]")
    return "\n".join(lines)


def _declares_classification(header: Path) -> bool:
    """Whether an ENVI header says its file is a class map (``file type = ENVI Classification``)."""
    try:
        return parse_header(header).get("file type", "").strip().lower() == "envi classification"
    except InputError:
        return False


def _label_lines(path: Path, key: str | None) -> list[str]:
    """A single-band file as the label map (or mask) it can be: its classes, their names when it records them
    (an ENVI Classification header: those a conversion stores unless --class-names is given), and their
    pixel counts."""
    labels = read_labels(path, key=key)
    counts = np.bincount(labels.reshape(-1))
    present = np.flatnonzero(counts[1:]) + 1
    try:
        names, problem = label_class_names(path, len(counts) - 1), None
    except InputError as exc:
        names, problem = None, str(exc)

    def shown(c: int) -> str:
        return f"{c} {names[c - 1]} ({counts[c]})" if names else f"{c} ({counts[c]})"

    classes = (f"classes {', '.join(shown(c) for c in present[:12])}"
               + (f" and {len(present) - 12} more" if len(present) > 12 else "")) if len(present) else "no class"
    lines = [f"labels:     {labels.shape[0]}x{labels.shape[1]} label map (single band): {classes}; "
             f"{counted(int(counts[0]), 'pixel')} unlabelled (0, or the file's nodata value)"]
    if problem is not None:
        lines.append(f"names:      unusable: {problem}")
    option = f" --labels-key {shlex.quote(key)}" if key is not None else ""  # the label map's variable
    return [*lines, f"use:        hsgds convert CUBE --labels {shlex.quote(str(path))}{option} -o scene.zarr"]
