"""Scene.to_xarray (lazy, windows read through Scene.read) and plain zarr-python access to a store."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import hsgds
from hsgds.errors import DependencyError
from hsgds.preprocess.convert import ConvertOptions, convert
from hsgds.scene import Scene

xr = pytest.importorskip("xarray")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from hsgds.synthetic import make_scene
    from tests.envi import write_envi
    from tests.test_preview import WAVELENGTHS

    tmp = tmp_path_factory.mktemp("xr")
    cube, labels = make_scene(53, 70, len(WAVELENGTHS), classes=4, dtype="int16", seed=5)
    hdr = write_envi(tmp / "scene", cube, WAVELENGTHS)
    np.save(tmp / "gt.npy", labels)
    out = convert(hdr, tmp / "scene.zarr", ConvertOptions(labels=tmp / "gt.npy", tile=12, max_patch=5,
                                                         class_names=("w", "x", "y", "z")))
    return out, cube, labels


@pytest.fixture
def reads(monkeypatch):
    """Record every Scene.read window."""
    calls: list[tuple[int, int, int, int]] = []
    real = Scene.read

    def spy(self, y0, y1, x0, x1):
        calls.append((y0, y1, x0, x1))
        return real(self, y0, y1, x0, x1)

    monkeypatch.setattr(Scene, "read", spy)
    return calls


def test_to_xarray_layout(store):
    path, cube, _ = store
    da = hsgds.open_scene(path).to_xarray()
    assert isinstance(da, xr.DataArray)
    assert da.dims == ("y", "x", "band") and da.shape == cube.shape and da.dtype == cube.dtype
    assert da.name == "cube"
    np.testing.assert_array_equal(da["wavelength"].values, [400.0 + 50.0 * i for i in range(16)])
    assert da["wavelength"].dims == ("band",) and da["wavelength"].attrs["units"] == "nm"
    np.testing.assert_array_equal(da["band"].values, np.arange(16))
    assert da.attrs["class_names"] == ["w", "x", "y", "z"] and da.attrs["tile"] == 12
    np.testing.assert_array_equal(da.values, cube)
    # selecting by wavelength works the xarray way
    red = da.swap_dims(band="wavelength").sel(wavelength=640, method="nearest")
    np.testing.assert_array_equal(red.values, cube[..., 5])


def test_a_band_without_a_centre_has_a_nan_wavelength(tmp_path):
    """A store whose band has no centre (null: PRISMA's unused bands) gives that band's wavelength coordinate as
    NaN, the others as recorded (read with zarr-python), in nm."""
    import zarr

    from hsgds.synthetic import make_scene

    cube, _ = make_scene(20, 16, 4, classes=2, dtype="int16", seed=6)
    np.save(tmp_path / "c.npy", cube)
    out = convert(tmp_path / "c.npy", tmp_path / "c.zarr", ConvertOptions(max_patch=3,
                                                                          wavelengths=(None, 640.5, 550.0, None)))
    recorded = zarr.open_group(out, mode="r").attrs["hsgds"]["wavelengths"]
    assert recorded == [None, 640.5, 550.0, None]
    da = hsgds.open_scene(out).to_xarray()
    np.testing.assert_array_equal(da["wavelength"].values, [np.nan, 640.5, 550.0, np.nan])
    assert da["wavelength"].dtype == np.float64 and da["wavelength"].attrs["units"] == "nm"
    np.testing.assert_array_equal(da.values, cube)


def test_to_xarray_is_lazy(store, reads):
    path, cube, _ = store
    da = hsgds.open_scene(path).to_xarray()
    sub = da.isel(y=slice(13, 20), x=slice(25, 30)).sel(band=[2, 4])
    assert reads == []  # nothing read yet, not even for the repr
    repr(sub)
    assert reads == []
    np.testing.assert_array_equal(sub.values, cube[13:20, 25:30][..., [2, 4]])
    assert reads == [(13, 20, 25, 30)]  # exactly the window, one call (one tile: tile 12 -> 24..35 is tx=2)


@pytest.mark.parametrize("sel", [
    dict(y=slice(3, 40, 3)),
    dict(y=slice(None, None, -2), x=5),
    dict(y=7, x=slice(50, 2, -7), band=[0, 3]),
    dict(y=[1, 50, 5], x=[2, 3, 69]),
    dict(band=2),
    dict(y=slice(10, 10)),
    dict(y=-1, x=-3),
    dict(y=slice(-5, None), x=slice(None, 4), band=slice(None, None, -1)),
    # a list on one axis, the other whole: the column axis was dropped (IndexError "too many indices")
    dict(y=[1, 50, 5]),
    dict(x=[-1, 0], band=1),
    dict(y=np.arange(53) % 3 == 0, x=slice(None, None, -5)),
])
def test_to_xarray_indexing_matches_numpy(store, sel):
    path, cube, _ = store
    da = hsgds.open_scene(path).to_xarray()
    want = xr.DataArray(cube, dims=("y", "x", "band")).isel(**sel).values
    np.testing.assert_array_equal(da.isel(**sel).values, want)


@pytest.mark.parametrize("sel", [dict(y=-54), dict(x=-71, y=3), dict(band=-17), dict(y=[-54, 0]), dict(x=[2, -71]),
                                 dict(y=[53]), dict(y=53), dict(y=xr.DataArray([0, -54], dims="p"),
                                                                x=xr.DataArray([1, 2], dims="p"))])
def test_to_xarray_index_out_of_bounds_is_an_index_error_as_numpy(store, sel):
    """An index below -size is out of bounds, as in numpy. xarray adds the size to a negative index before the
    scene's array sees it, which added it again: isel(y=-54) of 53 rows read row 52, silently."""
    path, cube, _ = store
    da = hsgds.open_scene(path).to_xarray()
    with pytest.raises(IndexError):
        xr.DataArray(cube, dims=("y", "x", "band")).isel(**sel).values  # noqa: B018 - the reference
    with pytest.raises(IndexError, match="out of bounds"):
        da.isel(**sel).values  # noqa: B018


def test_to_xarray_pickles_lazily(store, reads):
    """A DataArray sent to another process (a multiprocessing pool, dask distributed) is pickled: the scene's
    array, a class made inside a function, could not be ("Can't pickle local object"). It pickles as its scene
    and reads nothing until its values are asked for, then numpy's."""
    import pickle

    path, cube, labels = store
    sub = pickle.loads(pickle.dumps(hsgds.open_scene(path).to_xarray().isel(y=slice(13, 20), x=[3, 69])))
    assert reads == []
    np.testing.assert_array_equal(sub.values, cube[13:20][:, [3, 69]])
    scene = hsgds.open_scene(path)
    scene._folder = (-1, -1)  # the store folder's (device, inode) as this machine saw it, not as another's mount
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(scene)).labels, labels)  # not "converted again"


def test_to_xarray_without_xarray_names_the_extra(store, monkeypatch):
    for name in [m for m in sys.modules if m == "xarray" or m.startswith("xarray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "xarray", None)
    with pytest.raises(DependencyError, match=r"xarray, which is not installed; install it with "
                                              r'pip install "hsgds\[xarray\]"'):
        hsgds.open_scene(store[0]).to_xarray()


def test_store_opens_with_plain_zarr(store):
    """Any Zarr v3 reader can open a store: zarr-python sees the arrays, dimension names and metadata."""
    import zarr

    path, cube, labels = store
    scene = hsgds.open_scene(path)
    g = zarr.open_group(path, mode="r")
    assert g.metadata.zarr_format == 3
    # format v2, the oldest that describes it (no nodata record, no band without a centre): an older hsgds reads it
    assert g.attrs["hsgds"]["format_version"] == 2 and g.attrs["hsgds"]["wavelengths"] == scene.wavelengths
    tiles = g["tiles"]
    assert tiles.metadata.dimension_names == ("tile_y", "tile_x", "y", "x", "band")
    assert tiles.shape == (scene.grid.nty, scene.grid.ntx, *scene.grid.tile_shape)
    assert tiles.chunks == (1, 1, *scene.grid.tile_shape)
    for tile_id in (0, scene.grid.num_tiles - 1):
        ty, tx = scene.grid.tile_yx(tile_id)
        np.testing.assert_array_equal(tiles[ty, tx], scene.read_tile(tile_id))
    assert g["labels"].metadata.dimension_names == ("y", "x")
    np.testing.assert_array_equal(g["labels"][...], labels)
    n = scene.meta.num_samples
    for name in ("tile", "y", "x", "label", "split"):
        assert g[f"samples/{name}"].shape == (n,)
    np.testing.assert_array_equal(g["stats/train/mean"][...], scene.stats["train"].mean)


def test_spectra_at_points_read_only_the_tiles_under_them(store, reads):
    """Picking spectra at a few points (xarray's vectorized isel, or a list of rows and columns) read the
    whole window spanning the points: two pixels in opposite corners of the scene read every tile, and a
    large scene's points could not be picked without holding the cube in memory. Only the tiles where the
    picked rows meet the picked columns are read now, one tile window each; the values are numpy's."""
    path, cube, _ = store
    da = hsgds.open_scene(path).to_xarray()
    ys, xs = xr.DataArray([1, 50, 49], dims="point"), xr.DataArray([2, 69, 60], dims="point")
    np.testing.assert_array_equal(da.isel(y=ys, x=xs).values, cube[[1, 50, 49], [2, 69, 60]])
    # tile 12: (1, 2) is in tile row 0 / column 0, (50, 69) and (49, 60) in row 4 / column 5 (53 x 70 scene)
    assert sorted(set(reads)) == [(0, 12, 0, 12), (0, 12, 60, 70), (48, 53, 0, 12), (48, 53, 60, 70)]
    reads.clear()
    np.testing.assert_array_equal(da.isel(y=[3, 40], x=5, band=[1, 2]).values, cube[[3, 40], 5][:, [1, 2]])
    assert sorted(reads) == [(0, 12, 0, 12), (36, 48, 0, 12)]
