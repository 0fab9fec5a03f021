"""(Geo)TIFF reader through tifffile: pixel-interleaved (H, W, B) or band-interleaved (B, H, W) images.

Band-interleaved covers both a single page with planar configuration "separate" and a stack of B
single-band pages. Uncompressed, contiguously stored images are memory-mapped; anything else
(compressed, tiled, scattered strips) is decoded whole by tifffile.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tifffile

from hsgds.errors import InputError
from preprocess.readers.base import ArrayCube, check_dtype

__all__ = ["open_tiff", "read_tiff_labels"]


def _load(path: Path) -> tuple[np.ndarray, str]:
    """Return the first image series (memory-mapped when possible) and tifffile's axis letters.

    tifffile names the axes: Y rows, X columns, S samples per pixel, and Q/I/Z/C/... for pages.
    """
    try:
        with tifffile.TiffFile(path) as tif:
            if not tif.series:
                raise InputError(f"{path} holds no image; check the file")
            series = tif.series[0]
            axes, shape = series.axes, tuple(series.shape)
            # dataoffset is set only when the series is uncompressed and stored in one contiguous run.
            if series.dataoffset is not None:
                dtype = np.dtype(series.dtype).newbyteorder(tif.byteorder)
                array = np.memmap(path, dtype=dtype, mode="r", offset=series.dataoffset, shape=shape)
            else:
                array = series.asarray()
    except InputError:
        raise
    except (tifffile.TiffFileError, ValueError, OSError) as exc:
        raise InputError(f"cannot read {path} as TIFF ({exc}); check that the file is complete") from None
    return array, axes


def open_tiff(path: Path) -> ArrayCube:
    """Open a 3-D TIFF as a cube, taking the band axis from the file's layout."""
    array, axes = _load(path)
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
    cube = ArrayCube(array, axes=order, files=[path])
    # A memmap has no public close; dropping our reference unmaps it once no window still uses it.
    cube.closer = lambda: setattr(cube, "array", None)
    return cube


def read_tiff_labels(path: Path) -> np.ndarray:
    """Read a single-band TIFF (one 2-D page, or a 3-D image with a single band) as a 2-D array."""
    array, axes = _load(path)
    if array.ndim == 3 and 1 in (array.shape[0], array.shape[2]):
        array = array[0] if array.shape[0] == 1 else array[:, :, 0]
    if array.ndim != 2:
        raise InputError(
            f"{path.name} has shape {array.shape} (axes {axes}); a label map needs a single-band (H, W) image"
        )
    return np.array(array, dtype=array.dtype.newbyteorder("="))
