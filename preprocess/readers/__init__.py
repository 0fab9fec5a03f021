"""Source readers: open any supported hyperspectral file as a ``SourceCube``, or read a 2-D label map.

Formats are told apart by their first bytes, with the file name as a tie-breaker: MATLAB .mat
(v4/v5/v7 and v7.3), HDF5, GeoTIFF/TIFF (classic and BigTIFF), NumPy .npy, and ENVI (a text
header beginning "ENVI" next to a raw binary, which has no signature of its own).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any, NoReturn

import h5py
import numpy as np

from hsgds._wording import drop
from hsgds.errors import InputError, control_character, shown_path
from hsgds.preprocess.readers.base import SourceCube, check_fits_in_memory
from hsgds.preprocess.readers.envi import envi_class_names, envi_georeference, find_pair, open_envi, read_envi_labels
from hsgds.preprocess.readers.hdf5 import band_axes, open_hdf5, read_hdf5_labels
from hsgds.preprocess.readers.mat import column_major_hdf5, open_mat, open_mat73, read_mat73_labels, read_mat_labels
from hsgds.preprocess.readers.npy import open_npy, read_npy_labels
from hsgds.preprocess.readers.tiff import open_tiff, read_tiff_labels, tiff_georeference

__all__ = ["FORMATS", "detect_format", "label_class_names", "label_files", "label_georeference", "open_cube",
           "read_labels"]

#: Format names ``detect_format`` returns, with how messages describe them.
FORMATS = {
    "envi": "ENVI (.hdr + binary)",
    "hdf5": "HDF5 (.h5)",
    "mat": "MATLAB .mat v5/v7",
    "mat73": "MATLAB .mat v7.3",
    "npy": "NumPy .npy",
    "tiff": "GeoTIFF/TIFF",
}

_SUPPORTED = "ENVI (.hdr + binary), MATLAB .mat (v5, v7.3), HDF5, GeoTIFF/TIFF or NumPy .npy"

_NPY_MAGIC = b"\x93NUMPY"
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF, both byte orders
#: formats named in the error when a file is one of them: netCDF-3 (classic, 64-bit offset, CDF-5) and HDF4
_NETCDF3_MAGICS = (b"CDF\x01", b"CDF\x02", b"CDF\x05")
_HDF4_MAGIC = b"\x0e\x03\x13\x01"
_ZIP_MAGIC = b"PK\x03\x04"  # (np.savez's .npz)

#: Extensions that promise a format, used only to explain why a file was not recognised.
_EXTENSIONS = {
    ".npy": "npy", ".tif": "tiff", ".tiff": "tiff", ".h5": "hdf5", ".hdf5": "hdf5", ".he5": "hdf5",
    ".hdf": "hdf5", ".mat": "mat",
}


def _head(path: Path, size: int = 4096, what: str = "cube") -> bytes:
    """The first bytes of ``path``, after checking that it is an existing regular file."""
    if not path.exists():
        raise InputError(f"no such file: {shown_path(path)}; check the path")
    if not path.is_file():
        raise InputError(f"{shown_path(path)} is not a regular file; pass the {what} file itself")
    try:
        with path.open("rb") as f:
            return f.read(size)
    except OSError as exc:
        raise InputError(f"cannot read {shown_path(path)} ({exc.strerror}); check its permissions") from None


def _is_hdf5(path: Path, head: bytes) -> bool:
    """HDF5 superblocks sit at offset 0 or after a userblock of 512 * 2**n bytes (MATLAB uses 512)."""
    if any(head[off:off + 8] == _HDF5_MAGIC for off in (0, 512, 1024, 2048)):
        return True
    # Larger userblocks are rare; let the library search for the signature.
    return len(head) >= 4096 and h5py.is_hdf5(os.fspath(path))


def _npz_members(path: Path) -> str:
    """`` (arrays a, b)``: the arrays an .npz archive holds, for the message that refuses it ("" when unreadable)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n.removesuffix(".npy") for n in archive.namelist()]
    except (OSError, zipfile.BadZipFile):
        return ""
    return f" (arrays {', '.join(names[:12])}{', ...' if len(names) > 12 else ''})" if names else ""


def _detect(path: Path, what: str = "cube") -> tuple[str, tuple[Path, Path] | None]:
    """Return the format name and, for ENVI, the (binary, header) pair; ``what`` the file is, for messages."""
    head = _head(path, what=what)
    suffix = path.suffix.lower()
    if head.startswith(_NPY_MAGIC):
        return "npy", None
    if head[:4] in _TIFF_MAGICS:
        return "tiff", None
    if _is_hdf5(path, head):
        # MATLAB writes its text header into a 512-byte userblock before the HDF5 superblock; a .mat without
        # it is MATLAB's or Octave's only if their marks are on its objects (else h5py wrote it, row-major)
        if head.startswith(b"MATLAB 7.3") or (suffix == ".mat" and column_major_hdf5(path)):
            return "mat73", None
        return "hdf5", None
    if head.startswith(b"MATLAB"):
        return "mat", None
    pair = find_pair(path)
    if pair is not None:
        return "envi", pair
    if suffix == ".mat":
        # Version 4 files have no signature; scipy recognises them (and reports anything else).
        return "mat", None
    if suffix == ".hdr":
        raise InputError(f"{path} has a .hdr extension but does not start with 'ENVI'; pass a valid ENVI header")
    if not head:
        raise InputError(f"{path} is empty; re-export the {what}")
    if head[:4] in _NETCDF3_MAGICS:
        raise InputError(f"{path} is a netCDF-3 (classic) file, which hsgds does not read; convert it to netCDF-4 "
                         f"first (nccopy -k nc4 {path.name} {path.stem}_nc4.nc)")
    if head.startswith(_ZIP_MAGIC) and suffix == ".npz":
        raise InputError(f"{path} is a NumPy .npz archive{_npz_members(path)}, which hsgds does not read; save the "
                         f"array in a .npy file of its own (np.save('{what.replace(' ', '_')}.npy', "
                         f"np.load('{path.name}')['NAME']))")
    if head.startswith(_HDF4_MAGIC):
        raise InputError(f"{path} is an HDF4 file (as Hyperion's and MODIS's), which hsgds does not read; convert it "
                         "to HDF5 first (h4toh5), or its dataset to GeoTIFF (gdal_translate)")
    if suffix in _EXTENSIONS:
        raise InputError(
            f"{path} is named like {FORMATS[_EXTENSIONS[suffix]]} but does not start with that format's signature "
            f"(first bytes {head[:8]!r}); the file may be truncated or mislabelled"
        )
    raise InputError(f"cannot tell the format of {path}; supported formats are {_SUPPORTED}")


def detect_format(path: str | os.PathLike[str]) -> str:
    """Name the format of ``path``: one of the keys of ``FORMATS``.

    Raises
    ------
    InputError
        The file is missing, unreadable or in none of the supported formats.
    """
    return _detect(Path(path))[0]


def _only_for_arrays(fmt: str, path: Path, key: str | None, band_axis: str | None,
                     key_option: str | None = "--key", axis_option: str = "--band-axis") -> None:
    """Refuse options that a self-describing format cannot honour, rather than silently ignoring them (named as
    what gave them: the option, or convert-many's manifest column)."""
    if key is not None and fmt in ("envi", "tiff", "npy"):
        raise InputError(f"{key_option} selects a variable in .mat or HDF5 files; {path.name} is {FORMATS[fmt]}, "
                         f"{drop(str(key_option))}")
    if band_axis is not None and fmt in ("envi", "tiff"):
        raise InputError(f"{axis_option} applies to .npy, HDF5 and .mat arrays; {path.name} is {FORMATS[fmt]}, "
                         f"whose band layout is recorded in the file, {drop(axis_option)}")


def open_cube(path: str | os.PathLike[str], key: str | None = None, band_axis: str | None = None,
              key_option: str = "--key", axis_option: str = "--band-axis") -> SourceCube:
    """Open a hyperspectral cube without reading it whole.

    Parameters
    ----------
    path
        The cube file. For ENVI, either the ``.hdr`` header or the binary beside it.
    key
        Variable (.mat) or dataset path (HDF5) to read; needed only when the file holds several
        3-D arrays.
    band_axis
        For .npy, HDF5 and .mat arrays: "last" (default) for (H, W, B), "first" for (B, H, W), "middle" for
        (H, B, W) (PRISMA's line-interleaved cubes).
        ENVI and TIFF record their layout, so it must be None for them.
    key_option, axis_option
        How messages name what gave ``key`` and ``band_axis``: the options, or convert-many's manifest columns.

    Returns
    -------
    SourceCube
        Reads (h, w, B) windows in the file's native dtype; ``files`` lists the data file first,
        then any header. Call ``close()`` when done.

    Raises
    ------
    InputError
        Missing or unrecognised file, ambiguous or missing variable, inconsistent header, or an
        unsupported dtype.
    """
    path = Path(path)
    if band_axis is not None:
        band_axes(band_axis)  # validate the value before touching the file
    fmt, pair = _detect(path)
    _only_for_arrays(fmt, path, key, band_axis, key_option, axis_option)
    if fmt == "envi":
        return open_envi(*pair)
    if fmt == "tiff":
        return open_tiff(path)
    if fmt == "npy":
        return open_npy(path, band_axis)
    if fmt == "hdf5":
        return open_hdf5(path, key, band_axis, key_option, axis_option)
    if fmt == "mat73":
        return open_mat73(path, key, band_axis, key_option)
    return open_mat(path, key, band_axis, key_option)


def read_labels(path: str | os.PathLike[str], key: str | None = None, key_option: str | None = "--key",
                what: str = "label map") -> np.ndarray:
    """Read a 2-D label map (ground truth or a train/test mask) from any supported format.

    Parameters
    ----------
    path
        The label file (for ENVI, the header or the single-band binary).
    key
        Variable (.mat) or dataset (HDF5); needed only when the file holds several 2-D arrays.
    key_option, what
        How messages name the option that gives ``key`` (None: none does, as for a train mask, which must then
        be the file's only 2-D array), and the file (e.g. "train mask").

    Returns
    -------
    numpy.ndarray
        C-contiguous int64 array of shape (H, W). Booleans become 0/1; floats are accepted when
        every value is a whole number.

    Raises
    ------
    InputError
        The file is unreadable, not 2-D, or holds negative, fractional, NaN or non-numeric values.
    """
    path = Path(path)
    fmt, pair = _detect(path, what)
    _only_for_arrays(fmt, path, key, None, key_option)
    if fmt == "envi":
        raw = read_envi_labels(*pair)
    elif fmt == "tiff":
        raw = read_tiff_labels(path)
    elif fmt == "npy":
        raw = read_npy_labels(path)
    elif fmt == "hdf5":
        raw = read_hdf5_labels(path, key, key_option)
    elif fmt == "mat73":
        raw = read_mat73_labels(path, key, key_option)
    else:
        raw = read_mat_labels(path, key, key_option)
    return _as_labels(np.asarray(raw), path, what)


def label_files(path: str | os.PathLike[str], what: str = "label map") -> list[Path]:
    """The files :func:`read_labels` reads the label map ``path`` from: for ENVI its binary, then its header
    (whichever ``path`` names, as a cube's ``files``); for any other format ``path`` alone.

    Raises
    ------
    InputError
        As :func:`read_labels`: the file is missing, or in none of the supported formats.
    """
    path = Path(path)
    fmt, pair = _detect(path, what)
    return list(pair) if fmt == "envi" and pair is not None else [path]


def label_georeference(path: str | os.PathLike[str], what: str = "label map") -> dict[str, Any] | None:
    """The map grid a label file records (a GeoTIFF's geokeys, an ENVI header's ``map info``) as a
    ``georeference`` value, or None: a format that records none, or a grid that cannot be read.

    Raises
    ------
    InputError
        As :func:`read_labels`: the file is missing, or in none of the supported formats.
    """
    path = Path(path)
    fmt, pair = _detect(path, what)
    if fmt == "tiff":
        return tiff_georeference(path)
    if fmt == "envi" and pair is not None:
        return envi_georeference(pair[1])
    return None


def label_class_names(path: str | os.PathLike[str], largest: int) -> tuple[str, ...] | None:
    """The names a label file records for its classes 1..K, or None when it records none.

    An ENVI Classification header lists ``class names`` from class 0, ENVI's "Unclassified", which is
    hsgds's unlabelled 0: the names kept are those of classes 1..K, every class the header declares (a
    scene may hold only some of them: the classes of a collection's scenes then stay the same). No other
    format records names.

    Parameters
    ----------
    path
        The label file (for ENVI, the header or the single-band binary).
    largest
        The largest class id of its labels (0: no labelled pixel, and no names).

    Raises
    ------
    InputError
        The header names fewer classes than the labels hold, or gives one of them an empty name.
    """
    path = Path(path)
    fmt, pair = _detect(path, "label map")
    if fmt != "envi" or largest < 1:
        return None
    names = envi_class_names(pair[1])
    if names is None:
        return None
    header = pair[1].name
    if len(names) <= largest:
        raise InputError(f"ENVI header {header} names classes 0..{len(names) - 1} in 'class names', but "
                         f"{pair[0].name} holds class {largest}; add the missing names to the header, or pass "
                         "--class-names")
    empty = [i for i in range(1, len(names)) if not names[i]]
    if empty:
        raise InputError(f"ENVI header {header} gives class {empty[0]} an empty name in 'class names'; name it in "
                         "the header, or pass --class-names")
    for k in range(1, len(names)):
        if (ch := control_character(names[k])) is not None:
            raise InputError(f"ENVI header {header} gives class {k} a name holding the control character {ch} in "
                             "'class names'; rename it in the header, or pass --class-names")
    return tuple(names[1:])


def _as_labels(raw: np.ndarray, path: Path, what: str = "label map") -> np.ndarray:
    """Validate class ids (a mask's values, when ``what`` names a mask) and return them as a C-contiguous
    int64 (H, W) array."""
    mask = "mask" in what  # a train/val/test mask: its messages say what a mask holds, not what class ids are
    where = f"{what} {path.name}" if mask else f"labels in {path.name}"

    def refuse(as_labels: str, as_mask: str) -> NoReturn:
        raise InputError(f"{where} {as_mask}; a mask holds 0 outside the split and 1 (any positive whole number) "
                         "in it" if mask else f"{where} {as_labels}")

    if raw.ndim != 2:
        refuse(f"have shape {raw.shape}; a label map needs 2 dimensions (H, W)", f"has shape {raw.shape}, not (H, W)")
    if raw.size == 0:
        refuse(f"are empty (shape {raw.shape}); pass a non-empty label map", f"is empty (shape {raw.shape})")
    check_fits_in_memory(raw.size * 8, f"{where} as int64", f"pass a smaller {what}")
    kind = raw.dtype.kind
    if kind == "b":
        return np.ascontiguousarray(raw, dtype=np.int64)
    if kind not in "iuf":
        refuse(f"have dtype {raw.dtype}; class ids must be integers (or whole-number floats)", f"has dtype {raw.dtype}")
    if kind == "f":
        if not np.isfinite(raw).all():
            refuse("contain NaN or infinity; replace them with 0 (unlabeled) or a class id",
                   "holds NaN or infinity (replace them with 0)")
        fractional = raw != np.floor(raw)
        if fractional.any():
            example = raw[fractional].flat[0]
            refuse(f"hold non-integer values (e.g. {example:g}); class ids must be whole numbers",
                   f"holds non-integer values (e.g. {example:g})")
    low, high = raw.min(), raw.max()
    if low < 0:
        refuse(f"contain negative values (min {low:g}); class ids must be >= 0 (0 = unlabeled)",
               f"holds negative values (min {low:g})")
    # uint64 and float values above int64's range would wrap silently on conversion. (Compared as a Python int:
    # 2**63 cast to a float16 map's type overflows, with a RuntimeWarning.)
    if int(high) >= 2**63:
        refuse(f"hold a value too large for int64 (max {high:g}); class ids must be small integers",
               f"holds a value too large for int64 (max {high:g})")
    return np.ascontiguousarray(raw, dtype=np.int64)
