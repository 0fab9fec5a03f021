"""ENVI raster reader: a text ``.hdr`` header beside a raw binary, memory-mapped in bsq, bil or bip order."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np

from hsgds import format as fmt
from hsgds.errors import InputError, one_line
from hsgds.preprocess.readers.base import (
    OVERRIDE_NODATA,
    ArrayCube,
    bad_band_list,
    parse_nodata,
    unlabelled_at_nodata,
    wavelengths_in_nm,
)
from hsgds.preprocess.readers.base import split_list as _split_list
from hsgds.preprocess.readers.gdal_metadata import (
    bad_bands,
    band_centres,
    band_descriptions,
    band_packing,
    metadata_item,
    read_pam,
)
from hsgds.preprocess.readers.packed import scaled_bands

__all__ = ["DATA_SUFFIXES", "bad_band_list", "envi_class_names", "envi_georeference", "find_pair", "open_envi",
           "parse_header", "read_envi_labels", "tiff_header", "tiff_header_metadata"]

#: ENVI "data type" codes this reader maps to numpy; complex codes (6, 9) are deliberately absent.
_DATA_TYPES = {
    1: "uint8",
    2: "int16",
    3: "int32",
    4: "float32",
    5: "float64",
    12: "uint16",
    13: "uint32",
    14: "int64",
    15: "uint64",
}
_COMPLEX_TYPES = {6: "complex64", 9: "complex128"}

#: Array axis order of the binary for each interleave (numpy shape order, slowest axis first).
_INTERLEAVE_AXES = {"bsq": "BHW", "bil": "HBW", "bip": "HWB"}

#: Suffixes tried, in order, for the binary next to a header (ENVI tools and GDAL use all of these).
DATA_SUFFIXES = ("", ".img", ".dat", ".raw", ".bsq", ".bil", ".bip")

#: Headers are a few KB of text (tens of KB with thousands of band names); anything larger is not one.
MAX_HEADER_BYTES = 16 << 20

#: the byte-order mark some Windows editors put before a text file saved as UTF-8
_BOM = b"\xef\xbb\xbf"


def _is_header(path: Path) -> bool:
    """Whether ``path`` is a readable file whose text starts with the ENVI signature (after a UTF-8 byte-order
    mark, which a header edited in Notepad may carry)."""
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(7).removeprefix(_BOM)[:4] == b"ENVI"


def find_pair(path: Path) -> tuple[Path, Path] | None:
    """Return ``(binary, header)`` when ``path`` is an ENVI header or the binary beside one, else None.

    Raises
    ------
    InputError
        The header exists but no binary (or more than one candidate binary) sits next to it.
    """
    if path.suffix.lower() == ".hdr":
        if not _is_header(path):
            return None
        stem = path.with_suffix("").name
        # Match the stem exactly but the suffix case-insensitively (x.img, x.IMG); listing the
        # directory instead of probing names avoids counting one file twice on case-insensitive disks.
        found = sorted(
            (p for p in path.parent.iterdir()
             if p != path and p.name.startswith(stem) and p.name[len(stem):].lower() in DATA_SUFFIXES and p.is_file()),
            key=lambda p: DATA_SUFFIXES.index(p.name[len(stem):].lower()),
        )
        if not found:
            tiffs = [p for p in (path.with_suffix(".tif"), path.with_suffix(".tiff")) if p.is_file()]
            if tiffs and _describes_tiff(path):
                raise InputError(f"ENVI header {path} describes a TIFF (file type = TIFF): pass the TIFF itself "
                                 f"({tiffs[0].name}), whose band centres are then read from this header")
            tried = ", ".join(stem + s for s in DATA_SUFFIXES if s) + f" or {stem}"
            raise InputError(
                f"ENVI header {path} has no binary beside it (looked for {tried}); "
                "put the data file next to the header with the same name"
            )
        if len(found) > 1:
            names = ", ".join(p.name for p in found)
            raise InputError(
                f"ENVI header {path} matches several data files ({names}); "
                "pass the data file itself instead of the header"
            )
        return found[0], path
    # The binary was given: the header is either "name.hdr" or "name.ext.hdr".
    for header in (path.with_suffix(".hdr"), path.with_suffix(".HDR"),
                   path.with_name(path.name + ".hdr"), path.with_name(path.name + ".HDR")):
        if header != path and _is_header(header):
            return path, header
    return None


_LINE_END = re.compile(r"\r\n|\r|\n")


def parse_header(path: Path) -> dict[str, str]:
    """Parse an ENVI header into a dict of lower-case keys to raw string values.

    Braced values may span lines; ``;`` starts a comment line. List values keep their braces so
    callers can tell lists from scalars (see ``_split_list``).

    Raises
    ------
    InputError
        The file does not start with "ENVI" or a braced value is never closed.
    """
    try:
        size = path.stat().st_size
        if size > MAX_HEADER_BYTES:
            raise InputError(f"{path} is {size} bytes, too large for an ENVI header (text of at most "
                             f"{MAX_HEADER_BYTES >> 20} MiB); pass the .hdr file, not the binary")
        text = path.read_bytes().removeprefix(_BOM).decode("utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"cannot read ENVI header {path} ({exc.strerror}); check its permissions") from None
    # lines end at CR, LF or CRLF only, as ENVI, GDAL and SPy read them: str.splitlines() also ends one at U+0085,
    # U+2028 and others, which a class name may hold (it came back as two names joined by a space)
    lines = _LINE_END.split(text)
    if not lines or not lines[0].strip().startswith("ENVI"):
        raise InputError(f"{path} is not an ENVI header (first line must be 'ENVI')")
    header: dict[str, str] = {}
    i = 1
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith(";") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if value.startswith("{"):
            parts = [value]
            while "}" not in parts[-1]:
                if i >= len(lines):
                    raise InputError(
                        f"ENVI header {path}: value of '{key.strip()}' opens '{{' but never closes it; fix the header"
                    )
                parts.append(lines[i].strip())
                i += 1
            value = " ".join(parts)
        # Keys are case-insensitive and may contain runs of spaces ("wavelength  units").
        header[" ".join(key.lower().split())] = value
    return header


def _positive_int(header: dict[str, str], key: str, path: Path, *, minimum: int = 1, default: int | None = None) -> int:
    """Read an integer header field, rejecting missing, non-integer or too-small values."""
    if key not in header:
        if default is not None:
            return default
        raise InputError(f"ENVI header {path} lacks the required '{key}' field; add it to the header")
    raw = header[key].strip()
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"ENVI header {path}: '{key} = {raw}' is not an integer; fix the header") from None
    if value < minimum:
        raise InputError(f"ENVI header {path}: '{key} = {value}' must be >= {minimum}; fix the header")
    return value


def _wavelengths_nm(header: dict[str, str], bands: int, path: Path) -> tuple[list[float] | None, str | None]:
    """Band centre wavelengths in nm and None, or None and why the header's wavelengths cannot be recorded
    (see :func:`wavelengths_in_nm`); (None, None) when it lists none."""
    if "wavelength" not in header:
        return None, None
    items = _split_list(header["wavelength"])
    try:
        values = [float(v) for v in items]
    except ValueError:
        raise InputError(f"ENVI header {path}: 'wavelength' holds a non-number; fix or remove that field") from None
    if len(values) != bands:
        raise InputError(
            f"ENVI header {path} lists {len(values)} wavelengths for {bands} bands; "
            "fix or remove the 'wavelength' field"
        )
    if not all(math.isfinite(v) for v in values):
        raise InputError(f"ENVI header {path}: 'wavelength' holds NaN or infinity; fix or remove that field")
    return wavelengths_in_nm(values, header.get("wavelength units", ""), path.name)


def _band_names(header: dict[str, str], bands: int, path: Path) -> list[str] | None:
    """Band names from the header, checked against the band count."""
    if "band names" not in header:
        return None
    names = _split_list(header["band names"])
    if len(names) != bands:
        raise InputError(
            f"ENVI header {path} lists {len(names)} band names for {bands} bands; fix or remove the 'band names' field"
        )
    return names


#: ENVI's per-band calibration (radiance = DN * gain + offset), which GDAL reads as the bands' scale and offset,
#: and the value each has when the header leaves it out
_GAINS = {"data gain values": 1.0, "data offset values": 0.0}


def _gains(header: dict[str, str], bands: int, path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """Each band's ``data gain values`` and ``data offset values`` as float64 arrays (GDAL's scale and offset of an
    ENVI file: its values are ``raw * gain + offset``), or None when the header has neither, or only 1s and 0s."""
    found = {}
    for key, default in _GAINS.items():
        if key not in header:
            found[key] = np.full(bands, default)
            continue
        items = _split_list(header[key])
        if len(items) != bands:
            raise InputError(f"ENVI header {path} lists {len(items)} {key} for {bands} bands; fix or remove the "
                             f"'{key}' field")
        try:
            found[key] = np.array([float(v) for v in items])
        except ValueError:
            found[key] = np.array([math.nan])
        if not np.isfinite(found[key]).all():
            raise InputError(f"ENVI header {path}: '{key}' holds a value that is no finite number; fix or remove "
                             "that field")
    gain, offset = found["data gain values"], found["data offset values"]
    return None if (gain == 1).all() and (offset == 0).all() else (gain, offset)


def _bad_bands(header: dict[str, str], bands: int, path: Path) -> list[int] | None:
    """The bands the header's ``bbl`` flags bad, or None when it has no ``bbl``."""
    if "bbl" not in header:
        return None
    return bad_band_list(header["bbl"], bands, f"ENVI header {path}", "fix or remove the 'bbl' field")


def _reflectance_scale_factor(header: dict[str, str], path: Path) -> float | None:
    """The header's ``reflectance scale factor`` (ENVI: the value which, divided into the data, scales it to 0-1
    reflectance, e.g. 10000), or None when it has none. Recorded, never applied: ENVI itself keeps the data
    scaled, and z-scoring makes the scale moot for training."""
    if "reflectance scale factor" not in header:
        return None
    items = _split_list(header["reflectance scale factor"])
    text = items[0] if len(items) == 1 else header["reflectance scale factor"].strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"ENVI header {path}: 'reflectance scale factor' holds {text[:40]!r}, not a finite number "
                         "above 0 (the data divided by it are 0-1 reflectance, e.g. 10000); fix or remove that field")
    return value


#: EPSG codes of UTM zones by ENVI datum name: zone z north is base + z, south base + 100 + z (WGS 84), for the
#: zones up to the last, the codes past it being other systems (26929: NAD83 / Alabama East, a State Plane zone)
_UTM_EPSG = {"wgs-84": (32600, 32700, 60), "wgs84": (32600, 32700, 60), "north america 1983": (26900, None, 23),
             "north america 1927": (26700, None, 22)}


def _map_info_transform(items: list[str], path: Path) -> list[float]:
    """GDAL-order transform from ENVI ``map info`` fields, computed exactly as GDAL's ENVI driver does
    (so the store agrees with what a GIS shows for the source).

    Fields 1-6 are the reference pixel (x, y; 1-based, (1, 1) = the upper-left corner of the first pixel),
    its map coordinates (easting, northing) and the pixel size (x, y); an optional ``rotation=`` item
    (degrees) rotates the pixel axes.
    """
    try:
        ref_x, ref_y, east, north, dx, dy = (float(v) for v in items[1:7])
    except ValueError:
        raise InputError(f"ENVI header {path}: 'map info' fields 2-7 (reference pixel, map coordinates, pixel "
                         f"size) must be numbers, got {', '.join(items[1:7])[:120]}; fix or remove the field") from None
    rotation = 0.0
    for item in items[7:]:
        key, _, value = item.partition("=")
        if key.strip().lower() == "rotation":
            try:
                rotation = float(value)
            except ValueError:
                raise InputError(f"ENVI header {path}: 'map info' rotation {value.strip()[:40]!r} is not a number; "
                                 "fix the field") from None
    r = -math.radians(rotation)
    t = [east - (ref_x - 1) * dx, math.cos(r) * dx, -math.sin(r) * dx,
         north + (ref_y - 1) * dy, -math.sin(r) * dy, -math.cos(r) * dy]
    if abs(rotation) == 180.0:  # as GDAL: exact values instead of cos/sin round-off
        t[1], t[2], t[4], t[5] = dx, 0.0, 0.0, dy
    if not all(math.isfinite(v) for v in t) or t[1] * t[5] - t[2] * t[4] == 0:
        raise InputError(f"ENVI header {path}: 'map info' gives no usable transform (pixel size {dx} x {dy}); "
                         "fix or remove the field")
    return t


def _georeference(header: dict[str, str], path: Path) -> dict | None:
    """CRS and transform from ``map info`` and ``coordinate system string``, or None without map info.

    The CRS is the WKT of ``coordinate system string`` when present; otherwise UTM zones on WGS-84 /
    NAD83 / NAD27 (the zones EPSG numbers: NAD83 1-23, NAD27 1-22) and ``Geographic Lat/Lon`` on WGS-84 are
    named by their EPSG code; any other projection keeps its transform only.
    """
    if "map info" not in header:
        return None
    items = _split_list(header["map info"])
    if len(items) < 7:
        raise InputError(f"ENVI header {path}: 'map info' has {len(items)} fields, needs at least 7 "
                         "(projection, reference pixel x y, easting, northing, pixel size x y); fix or remove it")
    transform = _map_info_transform(items, path)
    wkt = header.get("coordinate system string", "").strip()
    if wkt.startswith("{") and wkt.endswith("}"):
        wkt = wkt[1:-1].strip()
    epsg = None
    name = items[0].strip().lower()
    extra = [v.strip().lower() for v in items[7:] if "=" not in v]
    if not wkt and name == "utm" and len(extra) >= 3:
        try:
            zone = int(extra[0])
        except ValueError:
            zone = 0
        north, south, last = _UTM_EPSG.get(extra[2], (None, None, 0))
        base = north if extra[1] == "north" else south if extra[1] == "south" else None
        if base is not None and 1 <= zone <= last:
            epsg = base + zone
    elif not wkt and name == "geographic lat/lon" and extra and extra[0] in ("wgs-84", "wgs84"):
        epsg = 4326
    geo = fmt.make_georeference(transform, wkt or None, epsg)
    why = fmt.georeference_problem(geo)
    if why:
        raise InputError(f"ENVI header {path}: unusable georeference ({why}); fix or remove 'map info'")
    return geo


def _memmap(binary: Path, header_path: Path) -> tuple[np.memmap, str, dict[str, str]]:
    """Validate the header against the binary and memory-map it; returns (array, axes, header)."""
    header = parse_header(header_path)
    width = _positive_int(header, "samples", header_path)
    height = _positive_int(header, "lines", header_path)
    bands = _positive_int(header, "bands", header_path)
    offset = _positive_int(header, "header offset", header_path, minimum=0, default=0)
    code = _positive_int(header, "data type", header_path)
    if code in _COMPLEX_TYPES:
        raise InputError(
            f"ENVI header {header_path}: data type {code} ({_COMPLEX_TYPES[code]}) is unsupported; "
            "convert the image to a real type (e.g. magnitude) first"
        )
    if code not in _DATA_TYPES:
        known = ", ".join(f"{k} ({v})" for k, v in _DATA_TYPES.items())
        raise InputError(f"ENVI header {header_path}: data type {code} is unsupported (supported: {known})")
    order = _positive_int(header, "byte order", header_path, minimum=0, default=0)
    if order not in (0, 1):
        raise InputError(
            f"ENVI header {header_path}: 'byte order = {order}' must be 0 (little-endian) or 1 (big-endian)"
        )
    interleave = header.get("interleave", "bsq").strip().lower()
    if interleave not in _INTERLEAVE_AXES:
        raise InputError(
            f"ENVI header {header_path}: interleave '{interleave}' is not one of bsq, bil, bip; fix the header"
        )
    if header.get("file compression", "0").strip() not in ("0", ""):
        raise InputError(
            f"ENVI header {header_path}: compressed ENVI files are unsupported; decompress the data file first"
        )

    dtype = np.dtype(_DATA_TYPES[code]).newbyteorder("<" if order == 0 else ">")
    # Python ints do not overflow, so an absurd header simply fails this check before any mapping.
    expected = offset + height * width * bands * dtype.itemsize
    try:
        actual = binary.stat().st_size
    except OSError as exc:
        raise InputError(f"cannot read ENVI data file {binary} ({exc.strerror})") from None
    if actual < expected:
        raise InputError(
            f"ENVI data file {binary} is truncated: expected {expected} bytes from the header "
            f"({height}x{width}x{bands} {dtype.name} + {offset} offset), file has {actual}"
        )
    if actual > expected:
        raise InputError(
            f"ENVI header/size mismatch for {binary}: header implies {expected} bytes "
            f"({height}x{width}x{bands} {dtype.name} + {offset} offset), file has {actual}; "
            "check samples, lines, bands and data type"
        )
    axes = _INTERLEAVE_AXES[interleave]
    dims = {"H": height, "W": width, "B": bands}
    try:
        array = np.memmap(binary, dtype=dtype, mode="r", offset=offset, shape=tuple(dims[a] for a in axes))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot map ENVI data file {binary} ({one_line(exc)}); check that it is a complete "
                         "regular file") from None
    return array, axes, header


def _header_items(header: dict[str, str], bands: int) -> list[ET.Element]:
    """The header's band centres, band names, gains and offsets and bad band list as the GDAL metadata items GDAL's
    ENVI driver reads them as (each band's ``wavelength`` in its ``wavelength_units``, description, scale and
    offset; a dataset ``bbl``), for a PAM sidecar's to replace. The header's lists are checked already."""
    items = []
    for key, name, role in (("wavelength", "wavelength", None), ("band names", "DESCRIPTION", "description"),
                            ("data gain values", "SCALE", "scale"), ("data offset values", "OFFSET", "offset")):
        values = _split_list(header[key]) if key in header else []
        items.extend(metadata_item(name, value, band, role) for band, value in enumerate(values[:bands]))
    if "wavelength" in header and "wavelength units" in header:
        units = header["wavelength units"].strip()
        items.extend(metadata_item("wavelength_units", units, band) for band in range(bands))
    if "bbl" in header:
        items.append(metadata_item("bbl", header["bbl"]))
    return items


def open_envi(binary: Path, header_path: Path) -> ArrayCube:
    """Open an ENVI image as a memory-mapped cube; ``files`` is ``[binary, header]``, then GDAL's PAM sidecar
    ``<binary>.aux.xml`` when it sets what the cube is read with (band centres, names, scales and offsets, bad
    bands, nodata: read as GDAL reads it, after the header, its items replacing the header's)."""
    array, axes, header = _memmap(binary, header_path)
    bands = array.shape[axes.index("B")]
    nodata, nodata_error = None, None
    if "data ignore value" in header:
        try:
            nodata = parse_nodata(header["data ignore value"], f"ENVI header {header_path}",
                                  f"fix or remove 'data ignore value', {OVERRIDE_NODATA}")
        except InputError as exc:  # refused when used: --nodata may override it
            nodata_error = str(exc)
    wavelengths, wavelengths_note = _wavelengths_nm(header, bands, header_path)
    names, bad = _band_names(header, bands, header_path), _bad_bands(header, bands, header_path)
    gains = _gains(header, bands, header_path)
    files, wavelengths_file, nodata_field = [binary, header_path], None, None
    packing = ("ENVI data gain value", "data offset value")
    pam = read_pam(binary, bands)
    if pam is not None and pam.used:  # read as GDAL reads it: after the header, its items replacing the header's
        text, where = pam.over(_header_items(header, bands)), f"{binary.name} with {pam.path.name}"
        if pam.gives("wavelengths"):
            wavelengths, wavelengths_note = band_centres(text, bands, where)
            wavelengths_file = None if wavelengths is None else pam.path
        names = band_descriptions(text, bands) if pam.gives("band names") else names
        bad = bad_bands(text, bands, where) if pam.gives("bad bands") else bad
        if pam.gives("scales"):
            gains, packing = band_packing(text, bands, where), ("GDAL scale", "offset")
        if pam.gives("nodata"):
            nodata, nodata_error = pam.nodata_over(nodata, nodata_error, bands, where)
            nodata_field = f"NoDataValue in {pam.path.name}"
        files.append(pam.path)  # part of the source: hashed with it, a change to it a changed source
    data: Any = array
    if gains is not None:  # read as GDAL unscales them, and as a CF-packed HDF5 / netCDF variable is
        data, nodata = scaled_bands(array, *gains, axes.index("B"), packing, nodata)
    cube = ArrayCube(
        data,
        axes=axes,
        wavelengths=wavelengths,
        wavelengths_note=wavelengths_note,
        wavelengths_file=wavelengths_file,
        band_names=names,
        files=files,
        georeference=_georeference(header, header_path),
        nodata=nodata,
        nodata_error=nodata_error,
        nodata_field=nodata_field,
        bad_bands=bad,
        reflectance_scale_factor=_reflectance_scale_factor(header, header_path),
    )
    # A memmap has no public close; dropping our reference unmaps it once no window still uses it.
    cube.closer = lambda: setattr(cube, "array", None)
    return cube


def read_envi_labels(binary: Path, header_path: Path) -> np.ndarray:
    """Read a single-band ENVI image (e.g. an ENVI Classification file) as a 2-D array; pixels at its ``data
    ignore value`` read as 0 (unlabelled).

    Raises
    ------
    InputError
        The image has several bands, or a pixel holds a class above those its header's ``classes`` declares
        (``classes = N``: values 0..N-1), whose ``class names`` would then name the wrong classes.
    """
    array, axes, header = _memmap(binary, header_path)
    bands = array.shape[axes.index("B")]
    if bands != 1:
        raise InputError(f"ENVI image {binary} has {bands} bands; a label map needs exactly one band")
    classes = None if "classes" not in header else _positive_int(header, "classes", header_path)
    plane = array.transpose(tuple(axes.index(a) for a in "HWB"))[:, :, 0]
    nodata = None if "data ignore value" not in header else parse_nodata(
        header["data ignore value"], f"ENVI header {header_path}", "fix or remove 'data ignore value'")
    labels = unlabelled_at_nodata(np.array(plane, dtype=plane.dtype.newbyteorder("=")), nodata)
    if classes is not None and labels.size:
        top = labels.max()
        if top > classes - 1:  # (a float NaN compares false: the label check names it)
            raise InputError(f"{binary.name} holds class {top:g}, but its header {header_path.name} declares "
                             f"classes = {classes} (values 0..{classes - 1}); fix 'classes' and 'class names' in "
                             "the header, or the file's values")
    return labels


def envi_class_names(header_path: Path) -> list[str] | None:
    """The ``class names`` of an ENVI header (an ENVI Classification file's), class 0 first, or None when it
    has none.

    Items keep their positions (an empty one stays, as ""), so that name ``i`` is class ``i``'s.
    """
    header = parse_header(header_path)
    if "class names" not in header:
        return None
    return _split_list(header["class names"], keep_empty=True)


def envi_georeference(header_path: Path) -> dict | None:
    """The georeference of an ENVI label map or mask (its header's ``map info``), or None when it has none or
    it cannot be read (nothing then to compare with the cube's grid)."""
    try:
        return _georeference(parse_header(header_path), header_path)
    except InputError:
        return None


def _describes_tiff(header_path: Path) -> bool:
    """Whether an ENVI header says it describes a TIFF (``file type = TIFF``): ENVI writes one beside a TIFF it
    saves, to keep what the TIFF has no tag for (band centres, band names)."""
    try:
        return "tif" in parse_header(header_path).get("file type", "").strip().lower()
    except InputError:
        return False


def tiff_header(tiff: Path) -> Path | None:
    """The ENVI header ENVI wrote beside the TIFF ``tiff`` (``name.hdr`` or ``name.tif.hdr``, ``file type =
    TIFF``), or None."""
    for header in (tiff.with_suffix(".hdr"), tiff.with_suffix(".HDR"), tiff.with_name(tiff.name + ".hdr"),
                   tiff.with_name(tiff.name + ".HDR")):
        if header != tiff and _is_header(header) and _describes_tiff(header):
            return header
    return None


def tiff_header_metadata(header_path: Path, shape: tuple[int, int, int]) -> tuple[
        list[float] | None, str | None, list[str] | None]:
    """Band centres in nm (or None and why they are not recorded) and band names that an ENVI header beside a
    TIFF of ``shape`` (H, W, B) gives; a header of another image size gives none, and says so."""
    header = parse_header(header_path)
    size = tuple(_positive_int(header, key, header_path) for key in ("lines", "samples", "bands"))
    if size != shape:
        return None, (f"{header_path.name}: it describes a {size[0]}x{size[1]}x{size[2]} image, not the TIFF's "
                      f"{shape[0]}x{shape[1]}x{shape[2]}, so its band centres are not used"), None
    wavelengths, note = _wavelengths_nm(header, shape[2], header_path)
    return wavelengths, note, _band_names(header, shape[2], header_path)
