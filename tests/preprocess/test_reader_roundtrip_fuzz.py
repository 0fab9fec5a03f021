"""Valid source files written by each format's own library (tifffile, rasterio/GDAL, h5py, scipy.io, SPy) with
random layouts, converted by ``convert`` and read back with zarr-python: every pixel, the dtype, band order, nodata,
band centres and names must be what was written. And the same files cut or with bytes overwritten: ``convert`` ends
in a one-line HsgdsError and leaves no store behind, or succeeds.

test_reader_fuzz.py drives the readers alone with damaged and absurd input; this file drives the converter end to
end. A longer seeded exploration of the same kind found the two bugs the regression tests there name.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.io
import tifffile
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hsgds.errors import HsgdsError, InputError
from hsgds.preprocess.convert import ConvertOptions, convert

FUZZ = settings(max_examples=40, deadline=10000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
_DIR = Path(tempfile.mkdtemp(prefix="hsgds-roundtrip-"))
atexit.register(shutil.rmtree, _DIR, True)

DTYPES = ("uint8", "int16", "uint16", "int32", "float32", "float64")
#: ENVI data type codes and the numpy types they name (complex 6 and 9 are refused by design)
ENVI_TYPES = {1: "uint8", 2: "int16", 3: "int32", 4: "float32", 5: "float64", 12: "uint16", 13: "uint32",
              14: "int64", 15: "uint64"}


@pytest.fixture(autouse=True, scope="module")
def quiet_libraries():
    """tifffile logs the repairs it makes to a damaged file; rasterio warns of a raster without a CRS."""
    logger = logging.getLogger("tifffile")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def _fresh(name: str) -> Path:
    """An empty directory for one example (hypothesis reruns a test body many times in one tmp_path)."""
    path = _DIR / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    return path


def random_cube(seed: int, dtype: str, shape: tuple[int, int, int]) -> np.ndarray:
    """Values over the dtype's whole range (extremes included): a byte-order or sign mix-up cannot hide."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return (rng.standard_normal(shape) * 1e4).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, shape, endpoint=True, dtype=dt.newbyteorder("=")).astype(dt)


def shapes(max_side: int = 70, max_bands: int = 40):
    """(H, W, B) with the odd sizes included: one row, one column, one pixel."""
    side = st.integers(1, max_side)
    return st.tuples(st.one_of(st.just(1), side), st.one_of(st.just(1), side), st.integers(2, max_bands))


def convert_and_read(source: Path, **options) -> tuple[np.ndarray, dict]:
    """Convert ``source`` and read the store back with zarr-python alone: the (H, W, B) cube stitched from the
    tiles' interiors (halo dropped), and the store's metadata."""
    out = convert(source, source.parent / "s.zarr", ConvertOptions(max_patch=3, padding="edge", workers=1, **options))
    group = zarr.open_group(out, mode="r")
    meta = dict(group.attrs)["hsgds"]
    h, w, b = meta["shape"]
    tile, halo = meta["tile"], meta["halo"]
    tiles = group["tiles"][...]
    cube = np.concatenate([np.concatenate(list(row[:, halo:halo + tile, halo:halo + tile]), axis=1)
                           for row in tiles], axis=0)[:h, :w]
    assert cube.shape == (h, w, b) and cube.dtype == np.dtype(meta["dtype"])
    return cube, meta


def assert_same_cube(store: np.ndarray, written: np.ndarray, meta: dict, nodata: float | None = None) -> None:
    """The store holds what was written, in the source's type; with a ``nodata`` value, the store records it and
    counts the pixels holding it in every band (whose bands the store fills, so they are not compared)."""
    assert store.dtype == written.dtype.newbyteorder("=")
    if nodata is None:
        assert meta["nodata"] is None
        np.testing.assert_array_equal(store, written)
        return
    empty = np.all(np.isnan(written) if np.isnan(nodata) else written == nodata, axis=2)
    if np.isnan(nodata):
        assert meta["nodata"]["value"] == "nan"
    else:  # (an HDF5 float32 _FillValue is recorded as its shortest text, equal in the data's type)
        assert np.array(meta["nodata"]["value"]).astype(written.dtype) == np.array(nodata).astype(written.dtype)
    assert meta["nodata"]["pixels"] == np.count_nonzero(empty)
    np.testing.assert_array_equal(store[~empty], written[~empty])


def nodata_value(cube: np.ndarray) -> float:
    """A value of ``cube`` to declare nodata: its first. (9999 for 64-bit integers: a nodata value is held as a float64,
    which cannot hold every one of them.)"""
    return 9999 if cube.dtype.kind in "iu" and cube.dtype.itemsize == 8 else cube.flat[0].item()


def with_nodata_pixel(cube: np.ndarray, value: float | None) -> np.ndarray:
    """``cube`` with its last pixel at ``value`` in every band (a nodata pixel), unless it has one pixel only."""
    if value is not None and cube.shape[0] * cube.shape[1] > 1:
        cube[-1, -1] = value
    return cube


# -- GeoTIFF -------------------------------------------------------------------------------------------------------

def gdal_metadata(wavelengths_um: list[float] | None, names: list[str] | None) -> str:
    """GDAL's metadata tag as gdal_translate writes it for an ENVI file: per-band wavelength, wavelength_units and
    DESCRIPTION items."""
    items = []
    for band in range(len(wavelengths_um or names or [])):
        if wavelengths_um is not None:
            items.append(f'<Item name="wavelength" sample="{band}">{wavelengths_um[band]!r}</Item>')
            items.append(f'<Item name="wavelength_units" sample="{band}">Micrometers</Item>')
        if names is not None:
            items.append(f'<Item name="DESCRIPTION" sample="{band}" role="description">{names[band]}</Item>')
    return "<GDALMetadata>\n" + "\n".join(items) + "\n</GDALMetadata>\n"


_TIFF_CODECS = [None, "zlib", "lzw", "zstd", "packbits", "lzma"]


@FUZZ
@given(shape=shapes(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16), contig=st.booleans(),
       compression=st.sampled_from(_TIFF_CODECS), predictor=st.booleans(), tiles=st.none() | st.tuples(
           st.sampled_from([16, 32, 48, 64, 128, 256]), st.sampled_from([16, 32, 48, 64, 128, 256])),
       rows_per_strip=st.none() | st.integers(1, 50), bigtiff=st.booleans(), byteorder=st.sampled_from("<>"),
       nodata=st.booleans(), wavelengths=st.booleans(), names=st.booleans(), tile=st.sampled_from([None, 62]))
def test_tifffile_geotiff_round_trip(shape, dtype, seed, contig, compression, predictor, tiles, rows_per_strip,
                                     bigtiff, byteorder, nodata, wavelengths, names, tile):
    h, w, b = shape
    cube = random_cube(seed, dtype, shape)
    value = cube.flat[0].item() if nodata else None
    cube = with_nodata_pixel(cube, value)
    work = _fresh("tifffile")
    rng = np.random.default_rng(seed)
    centres = sorted(rng.uniform(0.4, 2.5, b).round(6).tolist()) if wavelengths else None
    labels = [f"Band {i + 1}" for i in range(b)] if names else None
    extratags = []
    if centres or labels:
        extratags.append((42112, "s", 0, gdal_metadata(centres, labels), True))
    if value is not None:
        extratags.append((42113, "s", 0, repr(value), True))
    path = work / "cube.tif"
    tifffile.imwrite(path, cube if contig else cube.transpose(2, 0, 1), photometric="minisblack",
                     planarconfig="contig" if contig else "separate", compression=compression,
                     predictor=bool(predictor and compression and cube.dtype.kind != "f"), tile=tiles,
                     rowsperstrip=None if tiles else rows_per_strip, bigtiff=bigtiff, byteorder=byteorder,
                     extratags=extratags, metadata=None)
    store, meta = convert_and_read(path, tile=tile)
    assert_same_cube(store, cube, meta, value)
    if centres:
        np.testing.assert_allclose(meta["wavelengths"], [c * 1000 for c in centres], rtol=1e-12)
    else:
        assert meta["wavelengths"] is None
    assert meta["band_names"] == labels


def _rasterio_blocks():
    return st.sampled_from([16, 32, 64, 128, 256])


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # affine's, through rasterio
@FUZZ
@given(shape=shapes(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16),
       interleave=st.sampled_from(["pixel", "band"]), compress=st.sampled_from([None, "deflate", "lzw", "zstd",
                                                                               "packbits"]),
       predictor=st.sampled_from([1, 2, 3]), tiled=st.booleans(), block=_rasterio_blocks(),
       bigtiff=st.sampled_from(["NO", "YES"]), nodata=st.sampled_from([None, "first", "nan"]),
       wavelengths=st.booleans(), names=st.booleans(), tile=st.sampled_from([None, 62]))
def test_rasterio_geotiff_round_trip(shape, dtype, seed, interleave, compress, predictor, tiled, block, bigtiff,
                                     nodata, wavelengths, names, tile):
    rasterio = pytest.importorskip("rasterio")
    from rasterio.transform import from_origin

    h, w, b = shape
    cube = random_cube(seed, dtype, shape)
    floating = cube.dtype.kind == "f"
    predictor = 1 if compress in (None, "packbits") else min(predictor, 3 if floating else 2)
    value = {"first": cube.flat[0].item(), "nan": float("nan") if floating else None, None: None}[nodata]
    cube = with_nodata_pixel(cube, value)
    rng = np.random.default_rng(seed)
    centres = sorted(rng.uniform(400, 2500, b).round(4).tolist()) if wavelengths else None
    labels = [f"band {i + 1}: {c} nm" for i, c in enumerate(centres or range(b))] if names else None
    profile = dict(driver="GTiff", height=h, width=w, count=b, dtype=dtype, crs="EPSG:32633",
                   transform=from_origin(500000, 4000000, 30, 30), interleave=interleave, BIGTIFF=bigtiff)
    profile.update({k: v for k, v in (("compress", compress), ("nodata", value)) if v is not None})
    if predictor != 1:
        profile["predictor"] = predictor
    if tiled:
        profile.update(tiled=True, blockxsize=block, blockysize=block)
    path = _fresh("rasterio") / "cube.tif"
    with rasterio.open(path, "w", **profile) as ds:
        ds.write(cube.transpose(2, 0, 1))
        for band in range(b):  # what gdal_translate keeps of an ENVI header's wavelength and band names
            if centres:
                ds.update_tags(band + 1, wavelength=str(centres[band]), wavelength_units="Nanometers")
            if labels:
                ds.set_band_description(band + 1, labels[band])
    store, meta = convert_and_read(path, tile=tile)
    assert_same_cube(store, cube, meta, value)
    if centres:
        np.testing.assert_allclose(meta["wavelengths"], centres, rtol=1e-12)
    else:
        assert meta["wavelengths"] is None
    assert meta["band_names"] == labels
    with rasterio.open(path) as ds:  # the georeference GDAL reads
        assert meta["georeference"]["transform"] == list(ds.transform.to_gdal())
        assert meta["georeference"]["epsg"] == 32633


def test_single_band_geotiff_is_refused_as_a_cube(tmp_path):
    path = tmp_path / "one.tif"
    tifffile.imwrite(path, np.ones((4, 5), np.uint16))
    with pytest.raises(InputError, match=r"one.tif holds a single-band \(4, 5\) image; a cube needs bands"):
        convert(path, tmp_path / "s.zarr", ConvertOptions(max_patch=3, workers=1))
    assert not (tmp_path / "s.zarr").exists()


# -- HDF5, .mat v7.3, .mat v5 --------------------------------------------------------------------------------------

#: where each --band-axis puts the bands of an (H, W, B) cube
_LAYOUTS = {None: (0, 1, 2), "last": (0, 1, 2), "first": (2, 0, 1), "middle": (0, 2, 1)}
_H5_TYPES = DTYPES + ("int8", "uint32", "int64", "uint64", ">i2", ">u2", ">f4", ">f8")


@st.composite
def h5_storage(draw, shape: tuple[int, ...], integer: bool) -> dict:
    """h5py dataset creation options: contiguous, or chunked with any mix of filters."""
    if not draw(st.booleans()):
        return {}
    options = {"chunks": tuple(draw(st.integers(1, n)) for n in shape),
               "compression": draw(st.sampled_from([None, "gzip", "lzf"])), "shuffle": draw(st.booleans())}
    if integer and draw(st.booleans()):
        options["scaleoffset"] = 0  # lossless for integers
    else:
        options["fletcher32"] = draw(st.booleans())
    return options


@FUZZ
@given(shape=shapes(max_side=25, max_bands=30), dtype=st.sampled_from(_H5_TYPES), seed=st.integers(0, 2**16),
       band_axis=st.sampled_from(list(_LAYOUTS)), others=st.integers(0, 2), in_group=st.booleans(),
       fill=st.booleans(), declared=st.booleans(), data=st.data())
def test_hdf5_round_trip(shape, dtype, seed, band_axis, others, in_group, fill, declared, data):
    cube = random_cube(seed, dtype, shape)
    value = nodata_value(cube) if declared else None
    stored = with_nodata_pixel(cube, value).transpose(_LAYOUTS[band_axis])
    storage = data.draw(h5_storage(stored.shape, cube.dtype.kind in "iu"))
    if fill:
        storage["fillvalue"] = stored.flat[-1]
    path = _fresh("hdf5") / "cube.h5"
    with h5py.File(path, "w") as f:
        where = f.create_group("data") if in_group else f
        dataset = where.create_dataset("cube", data=stored, **storage)
        if declared:  # CF's nodata attribute, as netCDF-4 writes it
            dataset.attrs["_FillValue"] = stored.dtype.type(value)
        for i in range(others):  # other 3-D variables: --key picks the cube
            f.create_dataset(f"other{i}", data=np.zeros((2, 3, 4), np.float32))
    key = "data/cube" if in_group else "/cube"
    store, meta = convert_and_read(path, key=key if others or data.draw(st.booleans()) else None,
                                   band_axis=band_axis)
    assert_same_cube(store, cube, meta, value)


def _mat73(path: Path, variables: dict[str, np.ndarray]) -> None:
    """A MATLAB v7.3 file as MATLAB writes it: HDF5 after a 512-byte MAT header, column-major arrays (transposed
    for h5py), each with its MATLAB_class."""
    classes = {"float64": "double", "float32": "single"}
    with h5py.File(path, "w", userblock_size=512) as f:
        for name, array in variables.items():
            dataset = f.create_dataset(name, data=array.T, chunks=True if array.size > 1 else None,
                                       compression="gzip" if array.size > 1 else None)
            dataset.attrs["MATLAB_class"] = np.bytes_(classes.get(array.dtype.name, array.dtype.name))
    raw = bytearray(path.read_bytes())
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Thu Dec  3 12:00:00 2026 HDF5 schema 1.00 ."
    raw[:len(header)] = header
    raw[124:128] = b"\x00\x02IM"  # version 0x0200, little-endian marker
    path.write_bytes(bytes(raw))


@FUZZ
@given(shape=shapes(max_side=25, max_bands=30), dtype=st.sampled_from(_H5_TYPES), seed=st.integers(0, 2**16),
       band_axis=st.sampled_from(list(_LAYOUTS)), others=st.integers(0, 2),
       version=st.sampled_from(["5", "5-compressed", "7.3"]), key=st.booleans())
def test_mat_round_trip(shape, dtype, seed, band_axis, others, version, key):
    cube = random_cube(seed, dtype, shape)
    variables = {"cube": cube.transpose(_LAYOUTS[band_axis])}
    variables.update({f"other{i}": np.zeros((2, 3, 4), np.float32) for i in range(others)})
    variables["gt"] = np.ones(shape[:2], np.uint8)  # a label map beside the cube, as the classic scenes have
    path = _fresh("mat") / "cube.mat"
    if version == "7.3":
        _mat73(path, variables)
    else:
        scipy.io.savemat(path, variables, do_compression=version.endswith("compressed"))
    store, meta = convert_and_read(path, key="cube" if others or key else None, band_axis=band_axis)
    assert_same_cube(store, cube, meta)


# -- ENVI ------------------------------------------------------------------------------------------------------

_INTERLEAVES = {"bsq": (2, 0, 1), "bil": (0, 2, 1), "bip": (0, 1, 2)}


@FUZZ
@given(shape=shapes(max_side=30, max_bands=30), code=st.sampled_from(sorted(ENVI_TYPES)), seed=st.integers(0, 2**16),
       interleave=st.sampled_from(sorted(_INTERLEAVES)), byte_order=st.sampled_from([0, 1]),
       writer=st.sampled_from(["spy", "hand"]), offset=st.sampled_from([0, 1, 128, 512, 999]),
       suffix=st.sampled_from([".img", ".dat", ".raw", ""]), wavelengths=st.booleans(), nodata=st.booleans(),
       crlf=st.booleans())
def test_envi_round_trip(shape, code, seed, interleave, byte_order, writer, offset, suffix, wavelengths, nodata,
                         crlf):
    h, w, b = shape
    cube = random_cube(seed, ENVI_TYPES[code], shape)
    rng = np.random.default_rng(seed)
    centres = sorted(rng.uniform(0.4, 2.5, b).round(6).tolist()) if wavelengths else None
    value = nodata_value(cube) if nodata else None
    cube = with_nodata_pixel(cube, value)
    work = _fresh("envi")
    header = work / "cube.hdr"
    if writer == "spy":
        envi = pytest.importorskip("spectral.io.envi")
        metadata: dict = {}
        if centres:
            metadata.update({"wavelength": [str(c) for c in centres], "wavelength units": "Micrometers"})
        if value is not None:
            metadata["data ignore value"] = value
        envi.save_image(str(header), cube, dtype=cube.dtype, interleave=interleave, byteorder=byte_order,
                        metadata=metadata, ext=suffix, force=True)
    else:  # by hand: a header offset (SPy writes none) and Windows line ends
        binary = cube.transpose(_INTERLEAVES[interleave]).astype(cube.dtype.newbyteorder("<>"[byte_order]))
        (work / f"cube{suffix}").write_bytes(b"\xff" * offset + binary.tobytes())
        lines = ["ENVI", f"samples = {w}", f"lines = {h}", f"bands = {b}", f"header offset = {offset}",
                 "file type = ENVI Standard", f"data type = {code}", f"interleave = {interleave}",
                 f"byte order = {byte_order}"]
        if centres:
            lines += ["wavelength units = Micrometers", "wavelength = {" + ",\n ".join(map(str, centres)) + "}"]
        if value is not None:
            lines.append(f"data ignore value = {value}")
        end = "\r\n" if crlf else "\n"
        header.write_bytes((end.join(lines) + end).encode())
    store, meta = convert_and_read(header)
    assert_same_cube(store, cube, meta, value)
    if centres:
        np.testing.assert_allclose(meta["wavelengths"], [c * 1000 for c in centres], rtol=1e-12)
    else:
        assert meta["wavelengths"] is None


# -- damaged files through convert -------------------------------------------------------------------------------

def _seeds() -> dict[str, list[Path]]:
    """One small valid file (with its header, for ENVI) of each kind the converter reads."""
    cube = random_cube(0, "uint16", (19, 13, 6))
    root = _DIR / "seeds"
    root.mkdir()
    found: dict[str, list[Path]] = {}
    for name, options in {"plain": {"planarconfig": "contig"},
                          "tiled-zlib": {"planarconfig": "contig", "compression": "zlib", "tile": (16, 16),
                                         "predictor": True},
                          "separate-lzw": {"planarconfig": "separate", "compression": "lzw", "rowsperstrip": 5},
                          "big-zstd": {"planarconfig": "contig", "compression": "zstd", "bigtiff": True,
                                       "byteorder": ">"}}.items():
        path = root / f"{name}.tif"
        data = cube.transpose(2, 0, 1) if options["planarconfig"] == "separate" else cube
        tifffile.imwrite(path, data, photometric="minisblack", **options)
        found[f"tiff-{name}"] = [path]
    for name, options in {"plain": {}, "gzip": {"chunks": (8, 8, 6), "compression": "gzip", "shuffle": True,
                                                 "fletcher32": True}}.items():
        path = root / f"{name}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("cube", data=cube, **options)
        found[f"hdf5-{name}"] = [path]
    for compressed in (False, True):
        path = root / f"v5-{compressed}.mat"
        scipy.io.savemat(path, {"cube": cube}, do_compression=compressed)
        found[path.stem] = [path]
    _mat73(root / "v73.mat", {"cube": cube})
    found["v73"] = [root / "v73.mat"]
    np.save(root / "cube.npy", cube)
    found["npy"] = [root / "cube.npy"]
    for interleave, axes in _INTERLEAVES.items():
        (root / f"{interleave}.img").write_bytes(cube.transpose(axes).tobytes())
        (root / f"{interleave}.hdr").write_text(
            f"ENVI\nsamples = 13\nlines = 19\nbands = 6\nheader offset = 0\ndata type = 12\n"
            f"interleave = {interleave}\nbyte order = 0\nwavelength units = nm\n"
            "wavelength = {400, 410, 420, 430, 440, 450}\n")
        found[f"envi-{interleave}"] = [root / f"{interleave}.hdr", root / f"{interleave}.img"]
    return found


_SEEDS = _seeds()


@settings(FUZZ, max_examples=100)
@given(kind=st.sampled_from(sorted(_SEEDS)), which=st.integers(0, 1), data=st.data())
def test_damaged_sources_end_in_one_line_and_no_store(kind, which, data):
    work = _fresh("damaged")
    files = [Path(shutil.copy(f, work / f.name)) for f in _SEEDS[kind]]
    target = files[which % len(files)]
    raw = bytearray(target.read_bytes())
    if data.draw(st.booleans(), label="cut"):
        raw = raw[:data.draw(st.integers(0, len(raw) - 1), label="at")]
    else:  # overwrite a few bytes, mostly in the headers and directories near the start
        for _ in range(data.draw(st.integers(1, 8))):
            pos = data.draw(st.integers(0, min(len(raw) - 1, data.draw(st.sampled_from([64, 512, len(raw)])))))
            raw[pos] = data.draw(st.integers(0, 255))
    target.write_bytes(bytes(raw))
    out = work / "s.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a damaged wavelength list is a warning, not a failure
        try:
            convert(files[0], out, ConvertOptions(max_patch=3, workers=1))
        except HsgdsError as exc:
            assert "\n" not in str(exc), str(exc)
            assert not out.exists()
