"""Packed values read as the numbers they stand for: CF packing (a netCDF / HDF5 variable's ``_Unsigned``,
``scale_factor`` and ``add_offset``) and GDAL's per-band scale and offset (a GeoTIFF's), one set of rules."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["Unpacked", "holds", "scaled_bands", "unpacked_nodata"]


class Unpacked:
    """A packed array read as netCDF readers give it: its integers taken as unsigned when ``unsigned`` (CF's
    ``_Unsigned``, netCDF-3's way to store uint8 / uint16 in its signed types), then, with a scale and offset,
    ``packed * scale + offset`` in the floating type of the packed values and of the scale and offset (float32 for
    8- and 16-bit integers packed by float32 attributes, as xarray gives them; for GDAL's, see
    :func:`scaled_bands`). Slicing reads only the window.

    ``scale`` and ``offset`` hold one value, or one per band (GDAL's, along axis ``band_axis`` of the packed
    array); ``names`` are what the file calls them, for ``hsgds info``. With one per band, ``gap`` (the file's
    nodata value, as packed) marks a pixel without data when every band holds it: it reads NaN in every band, as
    unpacked it would read a different value in each. ``dtype``, when given, is the type the values are read as,
    computed in the arithmetic's type and rounded to it once (GDAL's: float64, read as float32).
    """

    def __init__(self, dataset: Any, unsigned: bool, scale: np.ndarray | None, offset: np.ndarray | None, *,
                 band_axis: int = -1, names: tuple[str, str] = ("scale_factor", "add_offset"),
                 gap: float | None = None, dtype: np.dtype | None = None) -> None:
        stored = np.dtype(dataset.dtype)
        self.view = np.dtype(f"u{stored.itemsize}").newbyteorder(stored.byteorder) if unsigned else None
        stored = stored if self.view is None else self.view
        self.dataset, self.shape, self.names, self.band_axis = dataset, dataset.shape, names, band_axis
        self.scale: Any = None
        self.offset: Any = None
        self.gap: float | None = None
        if scale is None or offset is None:
            self.dtype = stored.newbyteorder("=")
            return
        work = np.result_type(stored, scale.dtype, offset.dtype)
        self.work = work if work.kind == "f" else np.dtype(np.float64)  # the arithmetic's type
        self.dtype = self.work if dtype is None else np.dtype(dtype)
        if scale.size == 1 and offset.size == 1:
            self.scale, self.offset = self.work.type(scale[0]), self.work.type(offset[0])
            return
        along = [1] * len(self.shape)
        along[band_axis] = -1  # one value per band, broadcast over the window's rows and columns
        self.scale = scale.astype(self.work).reshape(along)
        self.offset = offset.astype(self.work).reshape(along)
        self.gap = gap

    def unpack(self, packed: np.ndarray) -> np.ndarray:
        values = np.asarray(packed)
        if self.view is not None:
            values = values.view(self.view.newbyteorder(values.dtype.byteorder))
        if self.scale is None:
            return values.astype(self.dtype)
        out = (values.astype(self.work) * self.scale + self.offset).astype(self.dtype, copy=False)
        if self.gap is not None:
            empty = np.isnan(values) if math.isnan(self.gap) else values == self.gap
            out[np.broadcast_to(empty.all(axis=self.band_axis, keepdims=True), out.shape)] = np.nan
        return out

    def __getitem__(self, index: Any) -> np.ndarray:
        return self.unpack(self.dataset[index])

    def how(self) -> str:
        """How the values are unpacked, as ``hsgds info`` says it ("_Unsigned then scale_factor 0.0001 and
        add_offset 0"; "per-band GDAL scales 0.0001 to 0.0002 and offsets 0")."""
        how = [] if self.view is None else ["_Unsigned"]
        scale, offset = self.names
        if self.scale is not None and np.ndim(self.scale) == 0:
            how.append(f"{scale} {self.scale:g} and {offset} {self.offset:g}")
        elif self.scale is not None:
            how.append(f"per-band {scale}s {_span(self.scale)} and {offset}s {_span(self.offset)}")
        return " then ".join(how)


def _span(values: np.ndarray) -> str:
    lo, hi = float(np.min(values)), float(np.max(values))
    return f"{lo:g}" if lo == hi else f"{lo:g} to {hi:g}"


def holds(dtype: np.dtype, value: float) -> bool:
    """Whether ``dtype`` holds ``value`` exactly (NaN: float types only)."""
    if dtype.kind == "f":
        return True
    info = np.iinfo(dtype)
    return value.is_integer() and info.min <= value <= info.max


def unpacked_nodata(unpacked: Unpacked | None, nodata: float | None) -> float | None:
    """The nodata value as the pixels holding it read: the file's (CF's _FillValue, GDAL's nodata) is a packed
    value, unpacked as they are; NaN where each band unpacks it to its own value (``gap``)."""
    if unpacked is None or nodata is None or not holds(np.dtype(unpacked.dataset.dtype), nodata):
        return nodata
    if unpacked.gap is not None:
        return math.nan
    return float(unpacked.unpack(np.array([nodata], unpacked.dataset.dtype))[0])


def scaled_bands(array: Any, scale: np.ndarray, offset: np.ndarray, band_axis: int, names: tuple[str, str],
                 nodata: float | None) -> tuple[Unpacked, float | None]:
    """``array`` read as ``raw * scale + offset`` with each band's ``scale`` and ``offset`` (GDAL's: a GeoTIFF's
    scale and offset, an ENVI header's gains and offsets; computed in float64, as GDAL's doubles are, and held
    in float32 for 8- and 16-bit integers and float32 data, float64 for wider ones), and the file's ``nodata``
    value (packed) as its pixels then read: unpacked when every band has the same scale and offset, else NaN
    (see ``gap``)."""
    raw = np.dtype(array.dtype)
    # GDAL's scale and offset are doubles because its API is, not because the values need them: values of 8- and
    # 16-bit integers times a scale are held in float32, as GDAL's float64 result rounded once to it (the store
    # keeps half the bytes of float64; float32 arithmetic would round the scale, the product and the sum, and an
    # offset cancelling the product, as reflectance's -0.2 does, left values near 0 thousands of float32 steps
    # off); 32-bit integers and float64 data need float64
    narrow = (raw.kind in "iu" and raw.itemsize <= 2) or (raw.kind == "f" and raw.itemsize <= 4)
    scale, offset = (np.asarray(v, np.float64) for v in (scale, offset))
    one = bool((scale == scale[0]).all() and (offset == offset[0]).all())
    gap = None if one or nodata is None or not holds(np.dtype(array.dtype), nodata) else nodata
    unpacked = Unpacked(array, False, scale[:1] if one else scale, offset[:1] if one else offset,
                        band_axis=band_axis, names=names, gap=gap, dtype=np.dtype(np.float32) if narrow else None)
    return unpacked, unpacked_nodata(unpacked, nodata)
