"""NumPy .npy reader: the file is memory-mapped, never loaded, and pickled (object) arrays are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hsgds.errors import InputError
from hsgds.preprocess.readers.base import ArrayCube, check_dtype, parse_failure
from hsgds.preprocess.readers.hdf5 import band_axes

__all__ = ["open_npy", "read_npy_labels"]


def _header_dtype(path: Path) -> np.dtype | None:
    """The dtype recorded in a .npy header (format 1.0 or 2.0), read without touching the data."""
    fmt = np.lib.format
    with path.open("rb") as f:
        version = fmt.read_magic(f)
        reader = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
        return None if reader is None else reader(f)[2]


def _map(path: Path) -> np.ndarray:
    """Memory-map ``path`` read-only; C and Fortran order both map without copying."""
    try:
        dtype = _header_dtype(path)
        if dtype is not None and dtype.hasobject:
            # Object arrays are pickles: loading them could run code, and they cannot be mapped.
            raise InputError(
                f"{path} holds a Python-object array, which is unsupported; save a numeric array with np.save"
            )
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except InputError:
        raise
    except (ValueError, OSError) as exc:
        # numpy's own message may run over several lines (its refusal of an oversized header does): the first says it
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"cannot read {path} as .npy ({detail}); re-save it with np.save") from None
    except Exception as exc:  # numpy's header parser (tokenize, literal_eval) on a damaged header
        raise parse_failure(path, ".npy", exc, "re-save it with np.save") from None


def open_npy(path: Path, band_axis: str | None = None) -> ArrayCube:
    """Open a 3-D .npy array as a memory-mapped cube; ``band_axis`` "last" = (H, W, B), "first" = (B, H, W),
    "middle" = (H, B, W)."""
    axes = band_axes(band_axis)
    array = _map(path)
    if array.ndim != 3:
        raise InputError(f"{path.name} holds an array of shape {array.shape}; a cube needs 3 dimensions (H, W, B)")
    check_dtype(array.dtype, path.name)
    cube = ArrayCube(array, axes=axes, files=[path])
    # A memmap has no public close; dropping our reference unmaps it once no window still uses it.
    cube.closer = lambda: setattr(cube, "array", None)
    return cube


def read_npy_labels(path: Path) -> np.ndarray:
    """Read a 2-D .npy label map into memory."""
    array = _map(path)
    if array.ndim != 2:
        raise InputError(f"{path.name} holds an array of shape {array.shape}; a label map needs 2 dimensions (H, W)")
    return np.array(array)
