"""(Geo)TIFF reader through tifffile: pixel-interleaved (H, W, B) or band-interleaved (B, H, W) images.

Band-interleaved covers both a single page with planar configuration "separate" and a stack of B
single-band pages. Uncompressed, contiguously stored images are memory-mapped; anything else
(compressed, tiled, scattered strips) is decoded whole by tifffile.
"""

from __future__ import annotations

import logging
import math
import re
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import tifffile

from hsgds import format as fmt
from hsgds._optional import pip_install
from hsgds.errors import DependencyError, HsgdsWarning, InputError, one_line
from hsgds.preprocess.readers.base import (
    OVERRIDE_NODATA,
    ArrayCube,
    check_decoded_size,
    check_dtype,
    check_fits_in_memory,
    parse_failure,
    parse_nodata,
    unlabelled_at_nodata,
    wavelengths_in_nm,
)
from hsgds.preprocess.readers.envi import tiff_header, tiff_header_metadata
from hsgds.preprocess.readers.gdal_metadata import (
    bad_bands,
    band_centres,
    band_descriptions,
    band_packing,
    read_pam,
)
from hsgds.preprocess.readers.packed import scaled_bands

__all__ = ["open_tiff", "read_tiff_labels", "tiff_georeference"]

# tifffile logs every repair it attempts on a damaged file; with no logging configured Python would print
# them all to stderr ahead of hsgds's own one-line error. A NullHandler keeps them silent unless the
# application configures logging (records still propagate to its handlers).
logging.getLogger("tifffile").addHandler(logging.NullHandler())


_FIX = "check that the file is complete"

#: the two ways out of a codec tifffile cannot decode without imagecodecs; [geo] installs it, as GDAL's COG
#: default (LZW) is the compression GeoTIFFs most often arrive with
_CODEC_FIX = (f"install it with {pip_install('geo')}, or re-save the file uncompressed or with deflate "
              "(gdal_translate -co COMPRESS=DEFLATE)")


def _check_ifd_chain(path: Path) -> None:
    """Walk the chain of image file directories before tifffile does: a damaged file whose chain loops
    (past the first hundred pages, which is all tifffile checks) would make it read pages forever.

    Each directory must sit at a new offset; the walk ends at offset 0 or at an offset past the file
    (which tifffile also treats as the end), so it takes at most one step per directory in the file.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(16)
        order = {b"II": "little", b"MM": "big"}.get(head[:2])
        magic = int.from_bytes(head[2:4], order or "little")
        if order is None or magic not in (42, 43) or len(head) < 8:
            return  # not a TIFF tifffile reads this way; it reports the problem itself
        big = magic == 43
        count_size, tag_size, offset_size = (8, 20, 8) if big else (2, 12, 4)
        offset = int.from_bytes(head[8:16] if big else head[4:8], order)
        seen: set[int] = set()
        while 0 < offset < size:
            if offset in seen:
                raise InputError(f"{path} is damaged: its chain of image directories loops back to offset "
                                 f"{offset}; {_FIX}")
            seen.add(offset)
            f.seek(offset)
            raw = f.read(count_size)
            if len(raw) < count_size:
                return
            tags = int.from_bytes(raw, order)
            f.seek(offset + count_size + tags * tag_size)
            raw = f.read(offset_size)
            if len(raw) < offset_size:
                return
            offset = int.from_bytes(raw, order)


def _check_segments(series, path: Path) -> None:
    """A damaged IFD can declare millions of strips for a few bytes of file (tifffile would then loop
    over them), strips beyond the end of the file or tiles too large to decode in memory: refuse them all before
    decoding anything."""
    size = path.stat().st_size
    # tifffile decodes each tile whole (rows per strip it clamps to the image, tile sizes it does not): a damaged
    # TileWidth of 2**31 would have it allocate terabytes for one tile of a small image. (Not checked against the
    # file's size: a valid tile, mostly padding past a small image's edge, may compress far beyond 1032:1.)
    keyframe = series.keyframe
    check_fits_in_memory(math.prod(keyframe.chunks) * keyframe.dtype.itemsize,
                         f"one {keyframe.chunks} strip/tile of {path.name} (decoded whole)",
                         "its TileWidth / TileLength tags are damaged, or re-save it with smaller tiles")
    for page in series.pages:
        if page is None:
            continue
        expected = math.prod(page.keyframe.chunked)
        offsets, counts = page.dataoffsets, page.databytecounts
        if len(offsets) != expected or len(counts) != expected:
            raise InputError(f"{path} is damaged: an image needs {expected} strips/tiles but the file lists "
                             f"{len(offsets)} offsets and {len(counts)} byte counts; {_FIX}")
        for offset, count in zip(offsets, counts):
            if offset < 0 or count < 0 or (count and offset + count > size):
                raise InputError(f"{path} is damaged: a strip/tile of {count} bytes at offset {offset} lies past "
                                 f"the end of the {size}-byte file; {_FIX}")


#: GeoTIFF geokey value meaning "user-defined" (the CRS is spelled out in other keys, not by a code)
_USER_DEFINED = 32767
_PIXEL_IS_POINT = 2


def _geo_transform(tags: dict[str, Any]) -> list[float] | None:
    """GDAL-order transform from ModelTransformation, or ModelPixelScale + one ModelTiepoint (GeoTIFF 1.1).

    Several tiepoints are ground control points, not an affine transform: those give None. A
    PixelIsPoint raster's coordinates name pixel centres; like GDAL, the origin is moved to the corner.
    """
    matrix, scale, ties = (tags.get(k) for k in ("ModelTransformation", "ModelPixelScale", "ModelTiepoint"))
    matrix = None if matrix is None else np.asarray(matrix, dtype=np.float64).reshape(-1)  # tifffile gives 4x4
    if matrix is not None and len(matrix) == 16:
        m = [float(v) for v in matrix]
        t = [m[3], m[0], m[1], m[7], m[4], m[5]]
    elif scale is not None and ties is not None and len(scale) >= 2 and len(ties) == 6:
        i, j, _, x, y, _ = (float(v) for v in ties)
        sx, sy = float(scale[0]), float(scale[1])
        t = [x - i * sx, sx, 0.0, y + j * sy, 0.0, -sy]
    else:
        return None
    if int(tags.get("GTRasterTypeGeoKey", 1)) == _PIXEL_IS_POINT:
        t[0] -= 0.5 * (t[1] + t[2])
        t[3] -= 0.5 * (t[4] + t[5])
    return t


def _pixel_is_point(tif: tifffile.TiffFile) -> bool:
    """Whether a GeoTIFF's coordinates name pixel centres (GTRasterTypeGeoKey PixelIsPoint): its class maps are
    written so again, where GDAL reads them as it reads the source under either GTIFF_POINT_GEO_IGNORE setting."""
    page = tif.pages[0]
    tags = (page.geotiff_tags or {}) if getattr(page, "is_geotiff", False) else {}
    return int(tags.get("GTRasterTypeGeoKey", 1)) == _PIXEL_IS_POINT


def _transform_tags(page: Any) -> dict[str, Any]:
    """The transform tags of a TIFF page without geokeys, named and shaped as tifffile's ``geotiff_tags``."""
    tags = {}
    for code, name in ((33550, "ModelPixelScale"), (33922, "ModelTiepoint"), (34264, "ModelTransformation")):
        value = page.tags.valueof(code)
        if value is not None:
            tags[name] = list(value)
    return tags


def _georeference(tif: tifffile.TiffFile, path: Path) -> dict[str, Any] | None:
    """CRS and transform of a GeoTIFF from its geokeys (the transform alone from a TIFF that has its transform
    tags but no geokeys, as GDAL writes a grid without a CRS), or None when it carries none.

    A CRS given by EPSG code is kept as that code. A user-defined CRS (parameters spelled out in the
    geokeys) is turned into WKT by rasterio/GDAL, the field's reference implementation, when it is
    installed (``hsgds[geo]``); without it only the transform is kept, with a warning.
    """
    page = tif.pages[0]
    # GDAL writes a grid without a CRS as its transform tags alone, without geokeys: the transform is kept
    tags = (page.geotiff_tags or {}) if getattr(page, "is_geotiff", False) else _transform_tags(page)
    transform = _geo_transform(tags)
    if transform is None or fmt.georeference_problem(fmt.make_georeference(transform)):
        return None
    model = int(tags.get("GTModelTypeGeoKey", 0))
    code = tags.get("ProjectedCSTypeGeoKey") if model == 1 else tags.get("GeographicTypeGeoKey")
    epsg = int(code) if code is not None and 0 < int(code) < _USER_DEFINED else None
    wkt = None
    if epsg is None and model in (1, 2):
        try:
            import rasterio
        except ImportError:
            warnings.warn(f"{path.name} has a user-defined coordinate reference system; recording it needs "
                          f"rasterio ({pip_install('geo')}), so the store keeps its transform only",
                          HsgdsWarning, stacklevel=3)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # rasterio's NotGeoreferencedWarning and the like
                with rasterio.open(path) as ds:
                    crs = ds.crs
            if crs is not None:
                wkt, epsg = crs.to_wkt(), crs.to_epsg()
    return fmt.make_georeference(transform, wkt, epsg)


#: the part of an EnMAP image file's name (``ENMAP01-____L2A-DT...Z-SPECTRAL_IMAGE.TIF``; L1B's ``..._VNIR`` and
#: ``..._SWIR``; EOLab's ``..._COG.tiff``) that its metadata file's name (``...Z-METADATA.XML``) has in its place
_ENMAP_IMAGE = re.compile(r"(SPECTRAL_IMAGE)(_VNIR|_SWIR)?(_COG)?$", re.IGNORECASE)
#: a metadata file larger than this is no EnMAP product's (theirs are a few hundred KB): it is not parsed
_MAX_SIDECAR = 16 << 20
#: a band number or count in the metadata file: ASCII digits, few enough for int() (str.isdigit also takes "²",
#: which int() refuses, and int() refuses more than 4300 digits)
_COUNT = re.compile(r"[0-9]{1,9}")


def _enmap_metadata(path: Path) -> Path | None:
    """The EnMAP metadata file beside the image ``path`` (same prefix, ``SPECTRAL_IMAGE[_VNIR|_SWIR][_COG]``
    replaced by ``METADATA``, extension ``.XML`` or ``.xml``), or None when there is none."""
    found = _ENMAP_IMAGE.search(path.stem)
    if found is None:
        return None
    metadata = "METADATA" if found[1].isupper() else "metadata"
    for ext in (".XML", ".xml"):
        candidate = path.with_name(path.stem[:found.start()] + metadata + ext)
        if candidate.is_file():
            return candidate
    return None


def _enmap_centres(path: Path, xml: Path, bands: int) -> tuple[list[float] | None, str | None]:
    """Band centres in nm from an EnMAP metadata file's ``specific/bandCharacterisation``: one ``bandID`` per
    band, numbered from 1 (``number``), with its ``wavelengthCenterOfBand``. An L2A or L1C image holds every
    band; an L1B image one detector's (``..._VNIR``: bands 1 to ``specific/numberOfVNIRBands``, ``..._SWIR``:
    the rest). None, or None and why they are not recorded; (None, None) when the file has no such list."""
    where = xml.name
    try:
        if xml.stat().st_size > _MAX_SIDECAR:
            return None, f"{where}: it is larger than {_MAX_SIDECAR >> 20} MiB, so its band centres are not read"
        root = ET.parse(xml).getroot()
    except ET.ParseError as exc:
        return None, f"{where}: it is not well-formed XML ({exc}), so its band centres are unreadable"
    except OSError as exc:
        return None, f"{where}: it cannot be read ({exc.strerror or exc})"
    except (ValueError, LookupError) as exc:  # expat on an unknown or false encoding declaration
        return None, f"{where}: it cannot be parsed as XML ({type(exc).__name__}: {exc}), so its band centres are unreadable"
    listing = root.find("specific/bandCharacterisation")
    if listing is None:
        return None, None
    centres: dict[int, str] = {}
    for band in listing.findall("bandID"):
        number, text = (band.get("number") or "").strip(), band.findtext("wavelengthCenterOfBand")
        if not _COUNT.fullmatch(number) or text is None or int(number) in centres:
            return None, f"{where}: a bandID has no number, a repeated one or no wavelengthCenterOfBand"
        centres[int(number)] = text.strip()
    if not centres:
        return None, None
    if sorted(centres) != list(range(1, len(centres) + 1)):
        return None, f"{where}: its bandID numbers are not 1 to {len(centres)}"
    numbers = list(range(1, len(centres) + 1))
    found = _ENMAP_IMAGE.search(path.stem)
    detector = ((found[2] if found else None) or "").upper()
    if detector:  # L1B: one detector's bands, VNIR's first
        vnir = (root.findtext("specific/numberOfVNIRBands") or "").strip()
        if not _COUNT.fullmatch(vnir) or int(vnir) > len(numbers):
            return None, f"{where}: its numberOfVNIRBands ({vnir or 'missing'}) does not split its {len(numbers)} bands"
        numbers = numbers[:int(vnir)] if detector == "_VNIR" else numbers[int(vnir):]
    if len(numbers) != bands:
        what = f"{detector[1:]} " if detector else ""
        return None, f"{where}: it lists {len(numbers)} {what}band centres for the image's {bands} bands"
    try:
        values = [float(centres[n]) for n in numbers]
    except ValueError:
        return None, f"{where}: a band's wavelengthCenterOfBand is not a number"
    if not all(math.isfinite(v) for v in values):
        return None, f"{where}: its wavelengthCenterOfBand values include NaN or infinity"
    return wavelengths_in_nm(values, "nm", where)


def _needs_imagecodecs(exc: BaseException, compression: Any) -> str | None:
    """What of a TIFF tifffile could not decode for want of imagecodecs ("its LZW compression"), or None when
    ``exc`` is another failure.

    tifffile decodes only deflate, packbits and LZMA itself; LZW (GDAL's COG default), JPEG, LERC, WebP and
    the floating-point predictor need imagecodecs, and it says so ("<COMPRESSION.LZW: 5> requires the
    'imagecodecs' package"). For ZSTD it falls back on Python 3.14's ``compression.zstd``, whose import fails
    on older Pythons with a bare ModuleNotFoundError.
    """
    text = str(exc)
    if "requires" in text and "imagecodecs" in text:
        found = re.search(r"<(COMPRESSION|PREDICTOR)\.(\w+): \d+>", text)
        if found is None:
            return f"the file ({text})"
        name = {"FLOATINGPOINT": "floating-point", "HORIZONTAL": "horizontal"}.get(found[2], found[2])
        return f"its {name} {found[1].lower()}"
    if isinstance(exc, ImportError) and compression is not None and int(compression) != 1:
        return f"its {getattr(compression, 'name', compression)} compression"
    return None


def _load(path: Path, geo: dict[str, Any] | None = None, georeference: bool = True) -> tuple[np.ndarray, str]:
    """Return the first image series (memory-mapped when possible) and tifffile's axis letters.

    tifffile names the axes: Y rows, X columns, S samples per pixel, and Q/I/Z/C/... for pages.
    Pass a dict as ``geo`` to receive the file's GDAL nodata value under ``"nodata"`` (or why it is no
    number, under ``"nodata_error"``) and, with ``georeference``, its georeference under ``"georeference"``
    (and whether its coordinates name pixel centres under ``"pixel_is_point"``).
    """
    compression = None  # the image's, once known: named when its codec is missing
    try:
        _check_ifd_chain(path)
        with tifffile.TiffFile(path) as tif:
            if not tif.series:
                raise InputError(f"{path} holds no image; check the file")
            if geo is not None:
                if georeference:
                    geo["georeference"] = _georeference(tif, path)
                    geo["pixel_is_point"] = geo["georeference"] is not None and _pixel_is_point(tif)
                tag = tif.pages[0].tags.get("GDAL_NODATA")  # GDAL's nodata, as text: "-9999", "nan"
                try:
                    geo["nodata"] = None if tag is None else parse_nodata(
                        tag.value, path.name,
                        f"fix the GDAL_NODATA tag (gdal_edit.py -a_nodata VALUE, or -unsetnodata), {OVERRIDE_NODATA}")
                except InputError as exc:  # refused when used: --nodata may override it
                    geo["nodata_error"] = str(exc)
                tag = tif.pages[0].tags.get("GDAL_METADATA")
                geo["gdal_metadata"] = tag.value if tag is not None and isinstance(tag.value, str) else None
            series = tif.series[0]
            compression = getattr(series.keyframe, "compression", None)
            axes, shape = series.axes, tuple(series.shape)
            dtype = np.dtype(series.dtype)
            # dataoffset is set only when the series is uncompressed and stored in one contiguous run.
            if series.dataoffset is not None:
                array = np.memmap(path, dtype=dtype.newbyteorder(tif.byteorder), mode="r",
                                  offset=series.dataoffset, shape=shape)
            else:
                nbytes = math.prod(shape) * dtype.itemsize
                check_decoded_size(nbytes, path, f"the {shape} {dtype} image in {path.name}")
                check_fits_in_memory(nbytes, f"{path.name} (decoded whole)",
                                     "save it uncompressed (it is then read in windows)")
                _check_segments(series, path)
                array = series.asarray()
    except (InputError, MemoryError):
        raise
    except Exception as exc:
        needs = _needs_imagecodecs(exc, compression)
        if needs is not None:
            # The file is fine: say what to install, not "damaged".
            raise DependencyError(f"cannot decode {path}: {needs} needs the imagecodecs package; {_CODEC_FIX}") from None
        if isinstance(exc, (tifffile.TiffFileError, ValueError, OSError)):
            raise InputError(f"cannot read {path} as TIFF ({one_line(exc)}); {_FIX}") from None
        # tifffile / its codecs on a damaged file: TypeError, ZeroDivisionError, zlib.error...
        raise parse_failure(path, "TIFF", exc, _FIX) from None
    return array, axes


def open_tiff(path: Path) -> ArrayCube:
    """Open a 3-D TIFF as a cube, taking the band axis from the file's layout, its georeference from the
    GeoTIFF keys and its band centres from GDAL's metadata (the tag's, with GDAL's PAM sidecar ``<name>.aux.xml``
    over them, as GDAL reads them; the sidecar is then part of the source) or, for an EnMAP image without them,
    from the product's metadata file beside it (then also part of the source)."""
    geo: dict[str, Any] = {}
    array, axes = _load(path, geo)
    if array.ndim == 3 and axes[:2] == "YX":
        order = "HWB"  # pixel-interleaved: samples per pixel are the bands
    elif array.ndim == 3 and axes[1:] == "YX":
        order = "BHW"  # planar samples or a page stack: one plane per band
    elif array.ndim == 2:
        raise InputError(
            f"{path.name} holds a single-band {array.shape} image; a cube needs bands (use it as a label map instead)"
        )
    else:
        raise InputError(
            f"{path.name} has an unsupported layout (axes {axes}, shape {array.shape}); "
            "save the cube as (H, W, B) with planarconfig contig or as (B, H, W) pages"
        )
    check_dtype(array.dtype, path.name)
    bands = array.shape[order.index("B")]
    text, where = geo.get("gdal_metadata"), path.name
    nodata, nodata_error = geo.get("nodata"), geo.get("nodata_error")
    files, sidecar, nodata_field = [path], None, None
    pam = read_pam(path, bands)
    if pam is not None and pam.used:  # read as GDAL reads it: after the tag, its items replacing the tag's
        try:
            own = list(ET.fromstring(text).iter("Item")) if text else []
        except ET.ParseError:
            raise InputError(f"{path.name}: its GDAL_METADATA tag is not XML, so what {pam.path.name} beside it "
                             f"changes of it cannot be known; fix the tag, or remove {pam.path.name}") from None
        text, where = pam.over(own), f"{path.name} with {pam.path.name}"
        if pam.gives("nodata"):
            nodata, nodata_error = pam.nodata_over(nodata, nodata_error, bands, where)
            nodata_field = f"NoDataValue in {pam.path.name}"
        files.append(pam.path)  # part of the source, as an EnMAP metadata file below
    wavelengths, note = band_centres(text, bands, where)
    if wavelengths is not None and pam is not None and pam.gives("wavelengths"):
        sidecar = pam.path
    if wavelengths is None and note is None:  # none in the file: an EnMAP product's are in its metadata file
        sidecar = _enmap_metadata(path)
        if sidecar is not None:
            wavelengths, note = _enmap_centres(path, sidecar, bands)
            if wavelengths is not None or note is not None:
                # read for the store's band centres, it is part of the source: hashed with the image, and a change
                # to it is a changed source (a store's record of what it was made from names both)
                files.append(sidecar)
    band_names = band_descriptions(text, bands)
    header = tiff_header(path) if wavelengths is None and note is None else None
    if header is not None:  # none in the file: ENVI keeps a TIFF's band centres in a header beside it
        h, w = (array.shape[order.index(a)] for a in "HW")
        try:
            wavelengths, note, names = tiff_header_metadata(header, (h, w, bands))
        except InputError as exc:  # a header that cannot give them: said, not fatal (--wavelengths gives them)
            wavelengths, note, names = None, str(exc), None
        band_names = band_names or names
        if wavelengths is not None or names is not None:
            files.append(header)  # (part of the source, as an EnMAP metadata file)
            sidecar = header
    packing = band_packing(text, bands, where)
    if packing is not None:  # read as GDAL unscales it, and as a CF-packed HDF5 / netCDF variable is
        array, nodata = scaled_bands(array, *packing, order.index("B"), ("GDAL scale", "offset"), nodata)
    cube = ArrayCube(array, axes=order, files=files, georeference=geo.get("georeference"), nodata=nodata,
                     pixel_is_point=geo.get("pixel_is_point", False), band_names=band_names,
                     nodata_error=nodata_error, nodata_field=nodata_field, wavelengths=wavelengths, wavelengths_note=note,
                     bad_bands=bad_bands(text, bands, where),
                     wavelengths_file=None if wavelengths is None else sidecar)
    # A memmap has no public close; dropping our reference unmaps it once no window still uses it.
    cube.closer = lambda: setattr(cube, "array", None)
    return cube


def read_tiff_labels(path: Path) -> np.ndarray:
    """Read a single-band TIFF (one 2-D page, or a 3-D image with a single band) as a 2-D array; pixels at its
    GDAL nodata value (a classification raster's 255) read as 0 (unlabelled)."""
    geo: dict[str, Any] = {}
    array, axes = _load(path, geo, georeference=False)
    if geo.get("nodata_error"):
        raise InputError(geo["nodata_error"].replace(f", {OVERRIDE_NODATA}", ""))
    if array.ndim == 3 and 1 in (array.shape[0], array.shape[2]):
        array = array[0] if array.shape[0] == 1 else array[:, :, 0]
    if array.ndim != 2:
        raise InputError(
            f"{path.name} has shape {array.shape} (axes {axes}); a label map needs a single-band (H, W) image"
        )
    return unlabelled_at_nodata(np.array(array, dtype=array.dtype.newbyteorder("=")), geo.get("nodata"))


def tiff_georeference(path: Path) -> dict[str, Any] | None:
    """The georeference of a TIFF label map or mask (see :func:`_georeference`), or None when it has none or it
    cannot be read (nothing then to compare with the cube's grid)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a user-defined CRS without rasterio: the transform alone is compared
            with tifffile.TiffFile(path) as tif:
                return _georeference(tif, path)
    except Exception:  # the label reader names a damaged file; this is only the grid it may record
        return None
