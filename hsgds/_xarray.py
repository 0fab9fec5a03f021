"""A scene as a lazily loaded ``xarray.DataArray`` (``Scene.to_xarray``); needs the ``xarray`` extra.

No dask: the DataArray wraps xarray's own lazy indexing (``LazilyIndexedArray``) around a
``BackendArray`` whose reads are :meth:`hsgds.scene.Scene.read` windows, so only the tiles that an
indexing operation touches are read, when its values are asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from hsgds import format as fmt
from hsgds._optional import require

if TYPE_CHECKING:
    from hsgds.scene import Scene

__all__ = ["scene_to_xarray"]


def _axis(key: Any, n: int) -> tuple[int, int, Any]:
    """For one basic index on an axis of length n: the bounding window [start, stop) to read and the
    index that picks the wanted positions out of that window (an int drops the axis, as numpy does)."""
    if isinstance(key, slice):
        idx = range(*key.indices(n))
        if len(idx) == 0:
            return 0, 0, slice(0, 0)
        lo, hi = min(idx[0], idx[-1]), max(idx[0], idx[-1]) + 1
        first, last = idx[0] - lo, idx[-1] - lo
        end = last + 1 if idx.step > 0 else (last - 1 if last > 0 else None)
        return lo, hi, slice(first, end, idx.step)
    i = int(key)
    if not 0 <= i < n:
        raise IndexError(f"index {i} is out of bounds for an axis of size {n}")
    return i, i + 1, 0


def _refuse_negative(key: tuple, shape: tuple[int, ...]) -> None:
    """Raise numpy's IndexError for an index still negative when xarray hands it to the scene's array. xarray's
    lazy indexing adds the axis length to a negative index, without a bounds check, and adds it again on the way
    to the read: an index below -length (still negative here) was taken from the end a second time, silently
    (``isel(y=-54)`` of 53 rows read row 52)."""
    for k, n in zip(key, shape):
        if not isinstance(k, slice) and np.any(np.asarray(k) < 0):
            below = int(np.asarray(k)[np.asarray(k) < 0].flat[0])
            raise IndexError(f"index {below - n} is out of bounds for an axis of size {n}")


def _backend_array_class() -> type:
    xr_backends = require("xarray.backends", "xarray", "Scene.to_xarray()")
    indexing = require("xarray.core.indexing", "xarray", "Scene.to_xarray()")

    backend_array: Any = xr_backends.BackendArray  # a class of the optional xarray, known only at run time

    class SceneBackendArray(backend_array):
        """(y, x, band) view of a scene; every basic index is one :meth:`Scene.read` window."""

        __slots__ = ("dtype", "scene", "shape")

        def __init__(self, scene: Scene) -> None:
            self.scene = scene
            self.shape = tuple(scene.shape)
            self.dtype = np.dtype(scene.dtype)

        def __reduce__(self) -> tuple:
            # a class made in a function pickles by that function (a DataArray sent to another process: a
            # multiprocessing pool, dask distributed), which makes the class again there
            return _scene_backend_array, (self.scene,)

        def __getitem__(self, key: Any) -> np.ndarray:
            _refuse_negative(key.tuple, self.shape)
            # OUTER: index lists reach _read as lists, not as the window spanning them, so spectra picked at
            # a few points of a large scene read the tiles under those points only
            return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.OUTER,
                                                      self._read)

        def _read(self, key: tuple) -> np.ndarray:
            if isinstance(key[0], np.ndarray) or isinstance(key[1], np.ndarray):
                return self._read_outer(key)
            (y0, y1, yi), (x0, x1, xi) = _axis(key[0], self.shape[0]), _axis(key[1], self.shape[1])
            if y1 <= y0 or x1 <= x0:
                window = np.empty((max(0, y1 - y0), max(0, x1 - x0), self.shape[2]), dtype=self.dtype)
            else:
                window = self.scene.read(y0, y1, x0, x1)
            return window[yi, xi][..., key[2]]

        def _read_outer(self, key: tuple) -> np.ndarray:
            """Rows x columns picked by index lists (or slices, or ints): one tile window read per tile
            holding a picked row and column, never the span between them."""
            h, w, b = self.shape
            rows = np.atleast_1d(np.arange(h)[key[0]])
            cols = np.atleast_1d(np.arange(w)[key[1]])
            out = np.empty((len(rows), len(cols), b), dtype=self.dtype)
            t = self.scene.grid.tile
            for ty in np.unique(rows // t):
                iy = np.nonzero(rows // t == ty)[0]
                y0 = int(ty) * t
                for tx in np.unique(cols // t):
                    ix = np.nonzero(cols // t == tx)[0]
                    x0 = int(tx) * t
                    window = self.scene.read(y0, min(y0 + t, h), x0, min(x0 + t, w))  # one tile
                    out[np.ix_(iy, ix)] = window[np.ix_(rows[iy] - y0, cols[ix] - x0)]
            # an int drops its axis (a slice keeps it, though np.ndim of a slice is 0 too)
            picked = out[tuple(slice(None) if isinstance(k, slice) or np.ndim(k) else 0 for k in key[:2])]
            return picked[..., key[2]]

    return SceneBackendArray


def _scene_backend_array(scene: Scene) -> Any:
    return _backend_array_class()(scene)


def scene_to_xarray(scene: Scene) -> Any:
    """See :meth:`hsgds.scene.Scene.to_xarray`."""
    xr = require("xarray", "xarray", "Scene.to_xarray()")
    indexing = require("xarray.core.indexing", "xarray", "Scene.to_xarray()")
    h, w, b = scene.shape
    coords: dict[str, Any] = {"band": ("band", np.arange(b))}
    if scene.wavelengths is not None:
        # NaN for a band without a centre (null in the store)
        coords["wavelength"] = ("band", fmt.wavelength_array(scene.wavelengths), {"units": "nm"})
    if scene.band_names is not None:
        coords["band_name"] = ("band", np.asarray(scene.band_names, dtype=object))
    if scene.bad_bands is not None:  # True for a band the source flags bad (an ENVI bbl's 0s): .sel(band=~da.bad)
        coords["bad"] = ("band", np.isin(np.arange(b), scene.bad_bands))
    meta = scene.meta
    attrs = {
        "store": str(scene.path),
        "source": str(meta.source.get("name", "")),
        "tile": scene.grid.tile,
        "halo": scene.grid.halo,
        "num_classes": scene.num_classes,
    }
    if scene.class_names:
        attrs["class_names"] = list(scene.class_names)
    if meta.reflectance_scale_factor is not None:  # divided into the values: 0-1 reflectance (ENVI's field)
        attrs["reflectance_scale_factor"] = meta.reflectance_scale_factor
    if scene.has_nodata and meta.nodata is not None:  # read() gives the source's value at nodata pixels;
        # rioxarray reads this attribute as the nodata value
        attrs["_FillValue"] = np.asarray(float(meta.nodata["value"])).astype(scene.dtype)[()]
    if meta.georeference is not None:
        coords.update(_map_coordinates(meta.georeference, h, w))
        if meta.pixel_is_point:  # as rioxarray reads a PixelIsPoint GeoTIFF (and writes one again from)
            attrs["AREA_OR_POINT"] = "Point"
    data = indexing.LazilyIndexedArray(_scene_backend_array(scene))
    var = xr.Variable(("y", "x", "band"), data)
    return xr.DataArray(var, coords=coords, name="cube", attrs=attrs)


def _map_coordinates(geo: dict[str, Any], h: int, w: int) -> dict[str, Any]:
    """Map coordinates of the pixel centres (``x``, ``y``; for a north-up transform, as rasterio and
    rioxarray give them) and the CRS as a ``spatial_ref`` coordinate in the CF / rioxarray convention
    (``spatial_ref``: the WKT, else "EPSG:n"; ``crs_wkt`` when known; ``GeoTransform`` in GDAL order), so
    ``da.rio.crs`` works when rioxarray is installed."""
    x0, dx, rx, y0, ry, dy = geo["transform"]
    ref: dict[str, Any] = {"GeoTransform": " ".join(repr(float(v)) for v in geo["transform"])}
    if geo.get("epsg") is not None:
        ref["epsg"] = geo["epsg"]
        ref["spatial_ref"] = f"EPSG:{geo['epsg']}"  # what CRS.from_user_input (rioxarray) reads
    if geo.get("crs_wkt"):
        ref["crs_wkt"] = ref["spatial_ref"] = geo["crs_wkt"]
    coords: dict[str, Any] = {"spatial_ref": ((), np.int64(0), ref)}
    if rx == 0 and ry == 0:  # a rotated grid has no 1-D axes: its transform is in spatial_ref only
        coords["x"] = ("x", x0 + (np.arange(w) + 0.5) * dx)
        coords["y"] = ("y", y0 + (np.arange(h) + 0.5) * dy)
    return coords
