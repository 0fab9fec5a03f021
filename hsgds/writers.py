"""Class-map writers, one function per output format, chosen by the output file's suffix.

Every writer is atomic: it writes a hidden temporary file in the target's folder, flushes it to disk
(fsync), then renames it over the target (and fsyncs the folder). A run killed or failing mid-way
leaves at most a hidden ``.<name>.*.partial`` file, never a file at the target that looks complete.
A raster written over an old one takes GDAL's sidecars of the old one with it (:func:`drop_gdal_sidecars`).

Class maps follow the store's label convention: 0 = not predicted / unlabelled (nodata), k = class k.

- ``.tif`` / ``.tiff``: GeoTIFF, uint8 (uint16 beyond 255 classes), one band with a colour table,
  nodata 0, and the source's CRS and geotransform when the store has them (rasterio, ``hsgds[geo]``; a CRS
  GDAL cannot read is refused, by predict before any work; PixelIsPoint when the source was);
  the class names in its GDAL sidecar ``<name>.tif.aux.xml``.
- ``.png``: the colour map with a legend; with ground truth also the ground truth and an error map
  (matplotlib, ``hsgds[preview]``).
- ``.hdr``: an ENVI Classification file (header + ``.img`` binary) with class names and lookup colours
  (lists wrapped for GDAL; a sheared grid, which map info cannot hold, refused by predict before any work).
- ``.npy``: the array itself.

Class names a format cannot hold are refused before any work (:func:`check_class_names`); an empty one is
written as "class k".

Per-class probabilities (:class:`ProbabilityFile`) are streamed to a float16 ``.npy``, or written from it as
a float32 GeoTIFF of one band per class on the map's grid.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape as xml_escape

import numpy as np

from hsgds._durable import (
    atomic_path,
    check_writable,
    fsync_dir,
    fsync_file,
    not_regular,
    partial_path,
    remove_stale_partials,
)
from hsgds._optional import require
from hsgds._wording import clipped, counted
from hsgds.errors import ConfigError, InputError, control_character, not_unicode, shown, shown_path
from hsgds.preview import UNLABELLED, class_colours, glyphs_warned_once, texts_as_written

__all__ = [
    "FORMATS",
    "PROBABILITY_SUFFIXES",
    "ProbabilityFile",
    "atomic_path",
    "check_class_names",
    "check_output",
    "check_probability_output",
    "drop_gdal_sidecars",
    "envi_map_info",
    "error_panel",
    "geotiff_crs",
    "write_class_map",
    "write_envi",
    "write_geotiff",
    "write_npy",
    "write_png",
]

#: Output suffix -> (format name, module it needs or None, the extra that installs it)
FORMATS: dict[str, tuple[str, str | None, str | None]] = {
    ".tif": ("GeoTIFF", "rasterio", "geo"),
    ".tiff": ("GeoTIFF", "rasterio", "geo"),
    ".png": ("PNG", "matplotlib", "preview"),
    ".hdr": ("ENVI classification", None, None),
    ".npy": ("NumPy", None, None),
}
#: Colour of wrong pixels in the error map (right ones are grey, unlabelled ones black).
ERROR_COLOUR = (220, 20, 60)
CORRECT_COLOUR = (200, 200, 200)


def check_output(path: str | os.PathLike, what: str = "class map") -> str:
    """Check, before any work, that ``path`` can be written as a class map (or the ``what`` messages name);
    return its suffix.

    Raises InputError for an unknown suffix or a missing folder, DependencyError when the format's
    library is not installed.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in FORMATS:
        raise InputError(f"cannot write a {what} as '{shown_path(p.name)}': unknown suffix "
                         f"'{shown_path(p.suffix or '(none)', 40)}'; "
                         f"use one of {', '.join(FORMATS)}")
    name, module, extra = FORMATS[suffix]
    if module is not None and extra is not None:  # both set, or neither
        require(module, extra, f"writing a {name} {what} ({shown_path(p.name)})")
    check_writable(p)
    for companion in files_written(p)[1:]:  # an ENVI map's binary, a GeoTIFF's sidecar: renamed into place too
        kind = "a directory" if companion.is_dir() else not_regular(companion)
        if kind is not None:
            raise InputError(f"cannot write {shown_path(p)}: the {shown_path(companion.name)} written beside it is "
                             f"{kind} there; name another file")
    return suffix


def check_class_names(path: str | os.PathLike, class_names: list[str] | None) -> None:
    """Refuse, before any work, class names the map (or probabilities GeoTIFF) ``path`` cannot hold (see
    :func:`_name_problem`), in one line."""
    suffix = Path(path).suffix.lower()
    for k, name in enumerate(class_names or (), start=1):
        problem = _name_problem(name, suffix)
        if problem is not None:
            why, elsewhere = problem
            raise ConfigError(f"cannot write {shown_path(Path(path).name)}: the name of class {k} ({shown(name)}) "
                              f"{why}; rename the class" + (", or write a .tif" if elsewhere else ""))


def _name_problem(name: str, suffix: str) -> tuple[str, bool] | None:
    """Why a class map of ``suffix`` cannot hold class name ``name``, and whether a .tif could; None: it can.

    No format holds text that is not Unicode (an unpaired surrogate: a byte a command line in another encoding
    passed on; the writer failed once the whole scene was predicted). GDAL drops a control character from a
    GeoTIFF band's metadata item and ends a category name at NUL (tab and line breaks it keeps). An ENVI
    header's ``class names = {a, b}`` list is split on commas, so a name holding one would come back as two
    (SPy, GDAL and hsgds's reader alike); GDAL's ENVI driver ends the list at a "}" (the names after it shifted
    by one class); a line break (or another control character) breaks the header's lines."""
    if suffix not in (".hdr", ".tif", ".tiff", ".png"):  # (a .npy holds no names)
        return None
    if (why := not_unicode(name)) is not None:
        return why, False
    dropped = next((c for c in name if c < " " and c not in "\t\n\r"), None)  # (GDAL keeps these and DEL)
    if suffix in (".tif", ".tiff") and dropped is not None:
        return f"holds the control character {dropped!r}, which GDAL drops from a GeoTIFF's metadata", False
    if suffix != ".hdr":
        return None
    if "," in name:
        return "holds a comma, which an ENVI header's comma-separated 'class names' list cannot hold", True
    if "}" in name:
        return "holds a '}', where GDAL ends an ENVI header's 'class names' list", True
    if (ch := control_character(name)) is not None:
        return f"holds the control character {ch}, which an ENVI header's lines cannot hold", True
    return None


def files_written(path: str | os.PathLike) -> list[Path]:
    """The files :func:`write_class_map` writes for ``path`` (an ENVI header has its binary beside it)."""
    p = Path(path)
    if p.suffix.lower() == ".hdr":
        return [p, p.with_suffix(".img")]
    return [p, category_sidecar(p)] if p.suffix.lower() in (".tif", ".tiff") else [p]


def _check_map(classmap: Any) -> np.ndarray:
    a = np.asarray(classmap)
    if a.ndim != 2 or a.dtype.kind not in "iu":
        raise InputError(f"a class map is a 2-D integer array, got {a.dtype} of shape {a.shape}")
    if a.size and a.min() < 0:
        raise InputError("a class map holds classes 1..K and 0 for nodata; it has negative values")
    return a


def _num_classes(a: np.ndarray, num_classes: int | None, class_names: list[str] | None) -> int:
    k = int(a.max(initial=0))
    if class_names:
        k = max(k, len(class_names))
    return max(k, num_classes or 0, 1)


def _names(k: int, class_names: list[str] | None) -> list[str]:
    """The names of classes 1..k: ``class_names``'s, "class i" for a class without one or with an empty name
    (GDAL stores no empty metadata item: a GeoTIFF's CLASS_i was missing, a probability band "probability of ")."""
    names = list(class_names or [])[:k]
    names += [""] * (k - len(names))
    return [n if n.strip() else f"class {i}" for i, n in enumerate(names, start=1)]


def _map_dtype(k: int, path: str | os.PathLike) -> np.dtype:
    """uint8 for up to 255 classes, uint16 up to 65,535 (0 is nodata); more is a one-line InputError."""
    if k > 65535:
        raise InputError(f"cannot write {shown_path(Path(path).name)}: {k:,} classes do not fit its uint16 class map "
                         "(at most 65,535 classes, 0 being nodata); write a .npy, which holds any integer map")
    return np.dtype(np.uint8 if k <= 255 else np.uint16)


def write_npy(path: str | os.PathLike, array: Any) -> Path:
    """Write ``array`` as a ``.npy`` file, atomically."""
    a = np.asarray(array)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, a, allow_pickle=False)
    return Path(path)


def write_geotiff(path: str | os.PathLike, classmap: Any, *, num_classes: int | None = None,
                  class_names: list[str] | None = None, georeference: dict[str, Any] | None = None,
                  pixel_is_point: bool = False) -> Path:
    """Write a single-band GeoTIFF class map with a colour table, nodata 0 and the store's georeference.

    ``georeference`` is the store's ``{"transform", "crs_wkt", "epsg"}`` (None: a plain TIFF whose pixel
    grid is the scene's); ``pixel_is_point`` the store's: the map's coordinates then name pixel centres, as
    its source's did (:func:`_open_geotiff`). Class names are GDAL category names, in the sidecar ``<path>.aux.xml`` (GeoTIFF has
    no tag for them; GDAL, and QGIS through it, read them there for the legend), and the band's ``CLASS_1``
    ... ``CLASS_K`` metadata items. An old sidecar (and GDAL's overviews and mask of the old map) is removed
    before the map is replaced and the new one written after it, so a map never shows another run's names (at
    worst, after a kill, none).
    """
    rasterio = require("rasterio", "geo", "writing a GeoTIFF class map")
    a = _check_map(classmap)
    check_class_names(path, class_names)
    k = _num_classes(a, num_classes, class_names)
    dtype = _map_dtype(k, path)
    profile = _geotiff_profile(georeference, a.shape[0], a.shape[1], 1, dtype.name, path)
    profile.update(nodata=0, compress="deflate", photometric="palette")
    lut = class_colours(k)
    names = _names(k, class_names)
    sidecar = category_sidecar(path)
    with atomic_path(path) as tmp:
        with _open_geotiff(rasterio, tmp, profile, pixel_is_point) as dst:
            dst.write(a.astype(dtype, copy=False), 1)
            dst.write_colormap(1, {i: (*map(int, lut[i]), 255) for i in range(k + 1)})
            dst.update_tags(1, **{f"CLASS_{i}": n for i, n in enumerate(names, start=1)})
            dst.set_band_description(1, "class (0 = nodata)")
        drop_gdal_sidecars(path)  # (the category sidecar among them) once the new map is whole, before its rename
    with atomic_path(sidecar) as tmp:
        tmp.write_text(_pam_categories(["Unclassified", *names]), encoding="utf-8")
    return Path(path)


#: files GDAL keeps beside a raster ``X`` and reads with it: ``X.ovr`` its overviews (QGIS's "build pyramids"),
#: ``X.aux.xml`` its PAM metadata (statistics, categories), ``X.msk`` its mask
GDAL_SIDECARS = (".ovr", ".aux.xml", ".msk")


def drop_gdal_sidecars(path: str | os.PathLike) -> None:
    """Remove the files GDAL keeps beside the raster ``path`` (:data:`GDAL_SIDECARS`) before it is replaced, as
    GDAL itself does when it creates a dataset over an old one: a GIS showed the old map's overviews (a
    zoomed-out view of the previous run), statistics or mask with the new map. Called once the new file is
    whole, so that a write failing before leaves the old raster with its sidecars. (A folder of such a name is
    no GDAL sidecar: it stays.)"""
    p = Path(path)
    for suffix in GDAL_SIDECARS:
        sidecar = p.with_name(p.name + suffix)
        if sidecar.is_symlink() or sidecar.is_file():
            sidecar.unlink(missing_ok=True)


def category_sidecar(path: str | os.PathLike) -> Path:
    """The GDAL PAM sidecar of a GeoTIFF class map, ``<path>.aux.xml``, which holds its category names."""
    p = Path(path)
    return p.with_name(p.name + ".aux.xml")


def _pam_categories(names: list[str]) -> str:
    """A GDAL PAM document naming band 1's values: ``names[v]`` is the category of pixel value ``v``."""
    rows = "".join(f"      <Category>{xml_escape(n)}</Category>\n" for n in names)
    return (f'<PAMDataset>\n  <PAMRasterBand band="1">\n    <CategoryNames>\n{rows}    </CategoryNames>\n'
            "  </PAMRasterBand>\n</PAMDataset>\n")


def geotiff_crs(georeference: dict[str, Any] | None, path: str | os.PathLike) -> Any:
    """The rasterio CRS a GeoTIFF at ``path`` gets from the store's ``georeference`` (its WKT, else its EPSG
    code; None without either). A CRS GDAL cannot read (an ENVI header's coordinate system string is recorded
    as the header gives it) is a one-line InputError, which predict raises before any work."""
    if georeference is None or not (georeference.get("crs_wkt") or georeference.get("epsg")):
        return None
    rasterio = require("rasterio", "geo", f"writing the GeoTIFF {Path(path).name}")
    from rasterio.crs import CRS

    wkt, epsg = georeference.get("crs_wkt"), georeference.get("epsg")
    try:
        with rasterio.Env():  # GDAL's error goes to logging, not printed to stderr beside ours
            return CRS.from_wkt(wkt) if wkt else CRS.from_epsg(epsg)
    except rasterio.errors.CRSError as exc:
        raise InputError(f"cannot write {Path(path).name} as a GeoTIFF: GDAL cannot read the coordinate reference "
                         f"system the store recorded from its source ({clipped(wkt or f'EPSG:{epsg}', 60)!r}: "
                         f"{' '.join(str(exc).split())}); write .hdr or .npy instead, or convert a source whose "
                         "CRS GDAL reads") from None


def _geotiff_profile(georeference: dict[str, Any] | None, height: int, width: int, count: int,
                     dtype: str, path: str | os.PathLike) -> dict[str, Any]:
    """rasterio's creation profile of a GeoTIFF at ``path`` on the store's pixel grid, with its CRS and
    transform when it has them."""
    profile: dict[str, Any] = dict(driver="GTiff", height=height, width=width, count=count, dtype=dtype)
    if georeference is not None:
        from rasterio.transform import Affine

        profile["transform"] = Affine.from_gdal(*georeference["transform"])
        crs = geotiff_crs(georeference, path)
        if crs is not None:
            profile["crs"] = crs
    return profile


@contextlib.contextmanager
def _open_geotiff(rasterio: Any, tmp: Path, profile: dict[str, Any], pixel_is_point: bool) -> Iterator[Any]:
    """rasterio's dataset writing the GeoTIFF ``tmp``. With ``pixel_is_point`` its coordinates name pixel centres
    (``AREA_OR_POINT=Point``: GeoTIFF's PixelIsPoint), as its source's did, so that GDAL reads map and source
    alike under either GTIFF_POINT_GEO_IGNORE setting (with it on, half a pixel from where it reads them by
    default). GDAL writes the centre of the given corner transform's pixel (0, 0) as the tiepoint only while
    that setting is off: off here whatever the user's, or the map would land half a pixel off."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        with rasterio.Env(GTIFF_POINT_GEO_IGNORE=False) if pixel_is_point else contextlib.nullcontext():
            with rasterio.open(tmp, "w", **profile) as dst:
                if pixel_is_point:
                    dst.update_tags(AREA_OR_POINT="Point")
                yield dst


def _map_info(transform: list[float]) -> str | None:
    """ENVI's ``map info`` for a GDAL-order transform: pixel (1, 1)'s corner, the pixel size and, for a
    rotated grid, ``rotation=`` in degrees, as GDAL's ENVI driver reads it; None for a sheared grid, which
    map info cannot express."""
    x0, a, b, y0, c, d = transform
    if b == 0 and c == 0:  # north-up (or south-up: a negative size)
        return f"map info = {{Arbitrary, 1, 1, {x0!r}, {y0!r}, {a!r}, {-d!r}}}"
    dx, dy = math.hypot(a, b), math.hypot(c, d)
    r = math.atan2(-b, a)  # the pixel axes turned by -r: (a, b, c, d) = (cos r dx, -sin r dx, -sin r dy, -cos r dy)
    if not (math.isclose(c, -math.sin(r) * dy, rel_tol=1e-9, abs_tol=1e-12 * dy)
            and math.isclose(d, -math.cos(r) * dy, rel_tol=1e-9, abs_tol=1e-12 * dy)):
        return None
    return f"map info = {{Arbitrary, 1, 1, {x0!r}, {y0!r}, {dx!r}, {dy!r}, rotation={-math.degrees(r)!r}}}"


#: characters an ENVI header line is wrapped at: GDAL's ENVI driver reads lines of at most 10,000 and stops at a
#: longer one, losing every field after it (a 729-class map's class lookup cost it the names, nodata and map info)
ENVI_LINE = 80


def _envi_list(key: str, items: list[str]) -> list[str]:
    """The header lines of ``key = {items}``, wrapped after a comma at :data:`ENVI_LINE` characters, as ENVI and
    GDAL write long lists. Continuation lines are indented: SPy skips one that starts with ";" (a comment)."""
    lines, line = [], f"{key} = {{"
    for i, item in enumerate(items):
        piece = item + ("}" if i == len(items) - 1 else ",")
        if i and len(line) + 1 + len(piece) > ENVI_LINE:
            lines.append(line)
            line = "  " + piece
        else:
            line += (" " if i else "") + piece
    return [*lines, line]


def envi_map_info(georeference: dict[str, Any], path: str | os.PathLike) -> str:
    """The ``map info`` line of an ENVI map at ``path`` on the store's grid. A sheared grid (which map info, a
    rotation at most, cannot hold: the map would not be georeferenced at all) is a one-line InputError, which
    predict raises before any work."""
    info = _map_info(georeference["transform"])
    if info is None:
        raise InputError(f"cannot write {shown_path(Path(path).name)} as an ENVI map: the store's grid is sheared "
                         f"(transform {', '.join(f'{v:.10g}' for v in georeference['transform'])}), which an ENVI "
                         "header's map info cannot hold (a rotation at most); write a .tif, which holds any grid")
    return info


def write_envi(path: str | os.PathLike, classmap: Any, *, num_classes: int | None = None,
               class_names: list[str] | None = None, georeference: dict[str, Any] | None = None) -> Path:
    """Write an ENVI Classification file: ``path`` (the ``.hdr``) and its binary beside it (``.img``).

    Class 0 is "Unclassified"; ``class names`` and ``class lookup`` (RGB triplets) list classes 0..K.
    The binary is renamed into place first and the header last, so a partial run never leaves a
    header (what ENVI tools open) without its complete binary. With a georeference the header gets a
    ``map info`` (reference pixel 1, 1; ``rotation=`` for a rotated grid; a sheared one, which it cannot
    express, is refused: write a GeoTIFF for those) and the CRS as ``coordinate system string``.
    """
    a = _check_map(classmap)
    check_class_names(path, class_names)
    k = _num_classes(a, num_classes, class_names)
    dtype = _map_dtype(k, path)
    header = Path(path)
    binary = header.with_suffix(".img")
    lut = class_colours(k)
    names = ["Unclassified", *_names(k, class_names)]
    lines = ["ENVI", "description = {hsgds class map}", f"samples = {a.shape[1]}", f"lines = {a.shape[0]}",
             "bands = 1", "header offset = 0", "file type = ENVI Classification",
             f"data type = {1 if dtype == np.uint8 else 12}", "interleave = bsq", "byte order = 0",
             f"classes = {k + 1}",
             *_envi_list("class names", names),
             *_envi_list("class lookup", [str(int(v)) for v in lut.reshape(-1)]),
             "band names = {class}",
             "data ignore value = 0"]  # unclassified: nodata to GDAL, as the GeoTIFF's nodata 0
    if georeference is not None:
        lines.append(envi_map_info(georeference, header))
        wkt = georeference.get("crs_wkt")
        if not wkt and georeference.get("epsg"):
            try:  # an EPSG code becomes WKT through rasterio when it is installed; otherwise no CRS line
                from rasterio.crs import CRS

                wkt = CRS.from_epsg(georeference["epsg"]).to_wkt()
            except Exception:
                wkt = None
        if wkt:
            lines.append("coordinate system string = {" + wkt + "}")
    # the header's temporary is written and flushed before the binary replaces the old one, so that a failure
    # up to the binary's rename leaves an existing pair as it was; then the binary is renamed, the header last
    with atomic_path(header) as header_tmp:
        header_tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")  # as the converter reads headers, whatever the locale
        fsync_file(header_tmp)
        with atomic_path(binary) as tmp:
            a.astype(dtype.newbyteorder("<"), copy=False).tofile(tmp)
            drop_gdal_sidecars(binary)  # (GDAL opens the binary: its overviews and statistics lie beside it)
    return header


#: classes a PNG legend lists at most (a legend of hundreds of entries would be taller than the map)
LEGEND_CLASSES = 40


def legend_classes(predicted: np.ndarray, truth: np.ndarray | None = None,
                   limit: int = LEGEND_CLASSES) -> tuple[list[int], int]:
    """The classes a PNG legend lists (in class order) and how many more it leaves out: those in the map or
    the ground truth (``predicted`` / ``truth``: pixel counts per class, index 0 unlabelled); past ``limit``
    the ones with the most pixels, predicted and true together."""
    total = predicted[1:].astype(np.int64) + (0 if truth is None else truth[1:].astype(np.int64))
    seen = np.flatnonzero(total) + 1
    if len(seen) <= limit:
        return [int(c) for c in seen], 0
    top = seen[np.argsort(-total[seen - 1], kind="stable")[:limit]]
    return sorted(int(c) for c in top), len(seen) - limit


def error_panel(classmap: np.ndarray, ground_truth: np.ndarray) -> tuple[np.ndarray, str]:
    """The PNG's error map of ``classmap`` against ``ground_truth`` (RGB: right pixels grey, wrong ones red, the
    rest black) and its caption (the share right). Only pixels both labelled and predicted are judged: a
    labelled pixel left 0 (outside predict's mask) was not predicted wrong."""
    judged = (ground_truth > 0) & (classmap > 0)
    wrong = judged & (classmap != ground_truth)
    err = np.zeros((*classmap.shape, 3), np.uint8)
    err[judged] = CORRECT_COLOUR
    err[wrong] = ERROR_COLOUR
    n, skipped = int(judged.sum()), int(((ground_truth > 0) & (classmap == 0)).sum())
    if not n:
        return err, "no labelled pixels" if not skipped else "no labelled pixel predicted"
    right = f"{100 * (1 - wrong.sum() / n):.2f}%"
    if not skipped:
        return err, f"{right} of all {n} labelled pixels right"
    return err, f"{right} of the {n} labelled pixels predicted right; {skipped} not predicted"


def write_png(path: str | os.PathLike, classmap: Any, *, num_classes: int | None = None,
              class_names: list[str] | None = None, ground_truth: Any = None, title: str | None = None,
              dpi: int = 120) -> Path:
    """Write the class map as a colour image with a legend; with ``ground_truth`` (an (H, W) label map,
    0 = unlabelled) three panels: prediction | ground truth | errors (wrong labelled pixels in red)."""
    require("matplotlib", "preview", "writing a PNG class map")
    figure_mod = require("matplotlib.figure", "preview", "writing a PNG class map")
    patches = require("matplotlib.patches", "preview", "writing a PNG class map")
    agg = require("matplotlib.backends.backend_agg", "preview", "writing a PNG class map")
    a = _check_map(classmap)
    check_class_names(path, class_names)
    gt = None if ground_truth is None else _check_map(ground_truth)
    if gt is not None and gt.shape != a.shape:
        raise InputError(f"ground truth of shape {gt.shape} does not match the {a.shape} class map")
    k = _num_classes(a if gt is None else np.maximum(a, gt), num_classes, class_names)
    lut = class_colours(k)
    names = _names(k, class_names)
    panels = [("prediction", lut[a])]
    if gt is not None:
        err, caption = error_panel(a, gt)
        panels += [("ground truth", lut[gt]), (f"errors ({caption})", err)]
    h, w = a.shape
    panel_w = 4.0
    panel_h = max(1.0, min(8.0, panel_w * h / w))
    fig = figure_mod.Figure(figsize=(len(panels) * panel_w + 0.6, panel_h + 2.4), dpi=dpi, layout="constrained")
    agg.FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    if title:
        fig.suptitle(title, fontsize=11)
    for ax, (name, image) in zip(axes, panels):
        ax.imshow(image, interpolation="nearest")
        ax.set_title(name, fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])

    def patch(colour: Any, text: str):
        return patches.Patch(facecolor=tuple(int(c) / 255 for c in colour), edgecolor="black", linewidth=0.4,
                             label=text)

    present = np.bincount(a.reshape(-1).astype(np.int64), minlength=k + 1)
    shown, hidden = legend_classes(present, None if gt is None else np.bincount(gt.reshape(-1).astype(np.int64),
                                                                               minlength=k + 1))
    handles = [patch(lut[c], f"{c} {names[c - 1]} ({int(present[c])})") for c in shown]
    if hidden:
        handles.append(patches.Patch(facecolor="none", edgecolor="none",
                                     label=f"+ {counted(hidden, 'more class', 'more classes')} (fewer pixels)"))
    handles.append(patch(UNLABELLED, "not predicted / unlabelled"))
    axes[0].legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), fontsize=6.5, frameon=False,
                   handlelength=1.2, columnspacing=0.8, ncol=1 if len(handles) <= 6 else 2 if len(handles) <= 24 else 3)
    if gt is not None:
        axes[-1].legend(handles=[patch(CORRECT_COLOUR, "right"), patch(ERROR_COLOUR, "wrong"),
                                 patch(UNLABELLED, "unlabelled or not predicted")], loc="upper center",
                        bbox_to_anchor=(0.5, -0.02), fontsize=6.5, frameon=False, handlelength=1.2)
    texts_as_written(fig)  # class and store names: "$5-$10" is no TeX math
    with glyphs_warned_once(path), atomic_path(path) as tmp, open(tmp, "wb") as f:  # (the warning once it is written)
        fig.savefig(f, format="png", bbox_inches="tight")
    return Path(path)


def write_class_map(path: str | os.PathLike, classmap: Any, *, num_classes: int | None = None,
                    class_names: list[str] | None = None, georeference: dict[str, Any] | None = None,
                    ground_truth: Any = None, title: str | None = None, pixel_is_point: bool = False) -> Path:
    """Write ``classmap`` in the format named by ``path``'s suffix (see the module docstring)."""
    suffix = check_output(path)
    if suffix in (".tif", ".tiff"):
        return write_geotiff(path, classmap, num_classes=num_classes, class_names=class_names,
                             georeference=georeference, pixel_is_point=pixel_is_point)
    if suffix == ".png":
        return write_png(path, classmap, num_classes=num_classes, class_names=class_names,
                         ground_truth=ground_truth, title=title)
    if suffix == ".hdr":
        return write_envi(path, classmap, num_classes=num_classes, class_names=class_names,
                          georeference=georeference)
    return write_npy(path, _check_map(classmap))


#: suffixes per-class probabilities are written as
PROBABILITY_SUFFIXES = (".npy", ".tif", ".tiff")
#: float32 bytes a probability GeoTIFF is written from at a time (rows of its 256-pixel tiles)
GEOTIFF_BLOCK_BYTES = 64 << 20


def check_probability_output(path: str | os.PathLike) -> str:
    """:func:`check_output` for a per-class probabilities file (.npy, or a GeoTIFF); return its suffix."""
    p = Path(path)
    if p.suffix.lower() not in PROBABILITY_SUFFIXES:
        raise InputError(f"per-class probabilities are written as .npy or a GeoTIFF (.tif); name the file "
                         f"{p.stem}.npy or {p.stem}.tif")
    return check_output(p, "per-class probabilities file")


class ProbabilityFile:
    """A float16 (H, W, K) ``.npy`` file filled batch by batch, never held whole in memory; or, for a ``.tif``
    path, a float32 GeoTIFF of K bands (band k: class k + 1's probability, named after it; NaN, the declared
    nodata, where no pixel was predicted) with the store's georeference, made from that file when committed.

    The file is created at its full size in a hidden temporary beside ``path`` (sparse: pixels never
    written read as 0), memory-mapped, and written at scattered pixels; every ``flush_bytes`` written the
    mapping is synced and its pages dropped from this process's memory. :meth:`commit` renames it
    into place (a GeoTIFF is written from it row block by row block, atomically, and it is deleted);
    :meth:`abort` (or leaving a ``with`` block by an exception) deletes it.
    """

    def __init__(self, path: str | os.PathLike, shape: tuple[int, int, int], flush_bytes: int = 64 << 20,
                 georeference: dict[str, Any] | None = None, class_names: list[str] | None = None,
                 pixel_is_point: bool = False) -> None:
        import mmap

        self.path = Path(path)
        self._geotiff = check_probability_output(self.path) != ".npy"
        check_class_names(self.path, class_names)  # (its bands are named after the classes)
        self._georeference, self._class_names, self._pixel_is_point = georeference, class_names, pixel_is_point
        self.shape = tuple(int(v) for v in shape)
        remove_stale_partials(self.path)
        self._tmp = partial_path(self.path)
        self._flush_bytes, self._pending = flush_bytes, 0
        header = {"descr": "<f2", "fortran_order": False, "shape": self.shape}
        nbytes = int(np.prod(self.shape)) * 2
        self._file: Any = None
        self._mmap: Any = None
        self.array: Any = None
        try:
            with open(self._tmp, "wb") as f:
                np.lib.format.write_array_header_2_0(f, header)
                self._offset = f.tell()
                f.truncate(self._offset + nbytes)
            self._file = open(self._tmp, "r+b")  # noqa: SIM115 - open with the mmap until close()
            self._mmap = mmap.mmap(self._file.fileno(), self._offset + nbytes)
            self.array = np.frombuffer(self._mmap, dtype="<f2", count=int(np.prod(self.shape)),
                                       offset=self._offset).reshape(self.shape)
        except BaseException:
            self.abort()  # e.g. the mapping failed: no handle and no .partial file left behind
            raise

    def write(self, y: np.ndarray, x: np.ndarray, values: np.ndarray) -> None:
        """Store ``values`` (N, K) at pixels (y[i], x[i])."""
        self.array[y, x] = values
        self._pending += values.nbytes
        if self._pending >= self._flush_bytes:
            self._drop_pages()

    def _drop_pages(self) -> None:
        import mmap

        self._mmap.flush()
        if hasattr(mmap, "MADV_DONTNEED"):  # the written pages are on disk now: let them go
            self._mmap.madvise(mmap.MADV_DONTNEED)
        self._pending = 0

    def _close(self) -> None:
        file, self._file = self._file, None
        if file is None:
            return
        self.array = None  # release the buffer export before closing the mapping
        try:
            if self._mmap is not None:
                self._mmap.flush()
                self._mmap.close()
        finally:
            file.close()

    def commit(self) -> Path:
        self._close()
        if self._geotiff:
            try:
                self._write_geotiff()
            finally:
                with contextlib.suppress(OSError):
                    self._tmp.unlink()
            return self.path
        fsync_file(self._tmp)
        os.replace(self._tmp, self.path)
        fsync_dir(self.path.parent)
        return self.path

    def _write_geotiff(self) -> None:
        """The GeoTIFF from the finished temporary, a block of rows at a time (memory: one block)."""
        rasterio = require("rasterio", "geo", "writing per-class probabilities as a GeoTIFF")
        from rasterio.windows import Window

        h, w, k = self.shape
        probs = np.load(self._tmp, mmap_mode="r", allow_pickle=False)
        profile = _geotiff_profile(self._georeference, h, w, k, "float32", self.path)
        # pixels not predicted are NaN, declared nodata: a GIS tells them from probabilities of 0 (a predicted
        # pixel's probabilities sum to 1, so it never reads 0 in every band of the temporary)
        profile.update(nodata=float("nan"), compress="deflate", predictor=3, tiled=True, blockxsize=256, blockysize=256,
                       BIGTIFF="IF_SAFER")  # (predictor 3: the floating-point one)
        rows = max(256, GEOTIFF_BLOCK_BYTES // max(1, w * k * 4) // 256 * 256)  # whole rows of 256-px tiles
        names = _names(k, self._class_names)
        with atomic_path(self.path) as tmp:
            with _open_geotiff(rasterio, tmp, profile, self._pixel_is_point) as dst:
                for y0 in range(0, h, rows):
                    block = np.asarray(probs[y0:y0 + rows], dtype=np.float32)
                    block[~block.any(axis=-1)] = np.nan
                    dst.write(block.transpose(2, 0, 1), window=Window(0, y0, w, block.shape[0]))
                for band, name in enumerate(names, start=1):
                    dst.set_band_description(band, f"probability of {name}")
            drop_gdal_sidecars(self.path)  # once the new file is whole, before its rename
        del probs

    def abort(self) -> None:
        try:
            self._close()
        finally:
            with contextlib.suppress(OSError):
                self._tmp.unlink()

    def __enter__(self) -> ProbabilityFile:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        if exc_type is not None:
            self.abort()
