"""Class-map writers: each format read back by an independent reader (rasterio/GDAL, SPy, numpy, matplotlib's
PNG decoder), and atomicity: a writer that fails mid-way leaves nothing at the target."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from hsgds import writers
from hsgds.errors import ConfigError, DependencyError, InputError
from hsgds.preview import class_colours

NAMES = ["corn", "soy, late", "woods", "water"]
ENVI_NAMES = ["corn", "soy; late", "woods", "water"]  # (an ENVI list cannot hold a comma)
GEO = {"transform": [620000.5, 30.0, 0.0, 4000000.25, 0.0, -20.0], "crs_wkt": None, "epsg": 32616}


@pytest.fixture
def classmap():
    return np.random.default_rng(0).integers(0, 5, (23, 31)).astype(np.uint8)


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial"))


def test_geotiff_round_trip_with_rasterio(tmp_path, classmap):
    rasterio = pytest.importorskip("rasterio")
    out = writers.write_class_map(tmp_path / "m.tif", classmap, class_names=NAMES, georeference=GEO)
    with rasterio.open(out) as ds:
        assert ds.count == 1 and ds.dtypes == ("uint8",) and ds.nodata == 0
        assert np.array_equal(ds.read(1), classmap)
        assert ds.crs == rasterio.crs.CRS.from_epsg(32616)
        assert ds.transform.to_gdal() == tuple(GEO["transform"])
        lut = class_colours(4)
        cmap = ds.colormap(1)
        assert all(cmap[i][:3] == tuple(int(v) for v in lut[i]) for i in range(5))
        assert ds.tags(1)["CLASS_2"] == "soy, late"
    assert leftovers(tmp_path) == []


def gdal_category_names(path):
    """Band 1's category names as GDAL itself reports them (GDALGetRasterCategoryNames, through ctypes, from
    the libgdal that rasterio's wheel bundles): what QGIS and other GDAL tools show in a legend."""
    import ctypes
    import glob

    rasterio = pytest.importorskip("rasterio")
    libs = glob.glob(os.path.join(os.path.dirname(rasterio.__file__), os.pardir, "rasterio.libs", "libgdal*.so*"))
    if not libs:
        pytest.skip("rasterio's bundled libgdal is not a .so here")
    gdal = ctypes.CDLL(libs[0])
    gdal.GDALAllRegister()
    gdal.GDALOpen.restype, gdal.GDALOpen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
    gdal.GDALGetRasterBand.restype, gdal.GDALGetRasterBand.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int]
    gdal.GDALGetRasterCategoryNames.restype = ctypes.POINTER(ctypes.c_char_p)
    gdal.GDALGetRasterCategoryNames.argtypes = [ctypes.c_void_p]
    gdal.GDALGetMetadata.restype, gdal.GDALGetMetadata.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
    gdal.GDALClose.argtypes = [ctypes.c_void_p]
    ds = gdal.GDALOpen(str(path).encode(), 0)
    assert ds, path
    try:
        band = gdal.GDALGetRasterBand(ds, 1)
        gdal.GDALGetMetadata(band, None)  # (GTiff reads its sidecar on a first metadata query, as GIS tools make)
        names = gdal.GDALGetRasterCategoryNames(band)
        out = []
        while names and names[len(out)] is not None:
            out.append(names[len(out)].decode())
        return out
    finally:
        gdal.GDALClose(ds)


def test_geotiff_class_names_are_gdal_category_names(tmp_path, classmap):
    """GDAL reads the class names as the band's categories (value v: names[v], 0 Unclassified), XML-special
    characters included; a map written again with other names shows those, never the earlier run's; nothing
    is left beside the two files."""
    names = ["corn <early>", "soy & late", "woods", "water"]
    out = writers.write_class_map(tmp_path / "m.tif", classmap, class_names=names, georeference=GEO)
    assert gdal_category_names(out) == ["Unclassified", *names]
    writers.write_class_map(tmp_path / "m.tif", classmap, num_classes=4)
    assert gdal_category_names(out) == ["Unclassified", "class 1", "class 2", "class 3", "class 4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tif", "m.tif.aux.xml"] and leftovers(tmp_path) == []


def test_empty_class_names_are_written_as_class_k(tmp_path, classmap):
    """An empty (or blank) class name: GDAL stores no empty metadata item, so the GeoTIFF had no CLASS_1 tag
    and its probability band was described as "probability of "; such a class is named "class k", as one without
    a name, in every format (read back by GDAL and SPy)."""
    rasterio = pytest.importorskip("rasterio")
    envi = pytest.importorskip("spectral.io.envi")
    names, want = ["", "soy", " ", "water"], ["class 1", "soy", "class 3", "water"]
    out = writers.write_class_map(tmp_path / "m.tif", classmap, class_names=names, georeference=GEO)
    with rasterio.open(out) as ds:
        assert [ds.tags(1).get(f"CLASS_{k}") for k in range(1, 5)] == want
    assert gdal_category_names(out) == ["Unclassified", *want]
    header = writers.write_class_map(tmp_path / "m.hdr", classmap, class_names=names, georeference=GEO)
    assert envi.open(str(header)).metadata["class names"] == ["Unclassified", *want]
    probs = writers.ProbabilityFile(tmp_path / "p.tif", (*classmap.shape, 4), georeference=GEO, class_names=names)
    probs.commit()
    with rasterio.open(tmp_path / "p.tif") as ds:
        assert ds.descriptions == tuple(f"probability of {n}" for n in want)


def test_a_map_written_again_shows_no_overviews_statistics_or_mask_of_the_old_one(tmp_path):
    """GDAL keeps a raster's overviews (QGIS's "build pyramids"), statistics and mask in files beside it; the
    atomic rename left them there, and GDAL showed the previous run's map at every overview level (a zoomed-out
    view). They are removed when a map (GeoTIFF or ENVI) or probabilities GeoTIFF is written again, as GDAL
    does when it creates a dataset over an old one: what GDAL reads at any scale is the new file's."""
    rasterio = pytest.importorskip("rasterio")
    from rasterio.enums import Resampling

    old, new = np.full((64, 64), 1, np.uint8), np.full((64, 64), 2, np.uint8)

    def write(path, a):
        if path.name.startswith("p"):
            probs = writers.ProbabilityFile(path, (64, 64, 2), georeference=GEO)
            y, x = np.nonzero(np.ones(a.shape, bool))
            probs.write(y, x, np.eye(2, dtype=np.float16)[a[y, x] - 1])
            probs.commit()
        else:
            writers.write_class_map(path, a, num_classes=3, georeference=GEO)

    for target, raster in (("m.tif", "m.tif"), ("m.hdr", "m.img"), ("p.tif", "p.tif")):
        write(tmp_path / target, old)
        with rasterio.Env(TIFF_USE_OVR=True), rasterio.open(tmp_path / raster, "r+") as ds:
            ds.build_overviews([2, 4], Resampling.nearest)  # external: raster.ovr, as a GIS opening it read-only
            ds.update_tags(STATISTICS_MAXIMUM="1")  # (PAM: raster.aux.xml for an ENVI binary)
        (tmp_path / f"{raster}.msk").write_bytes(b"an old mask")
        write(tmp_path / target, new)
        with rasterio.open(tmp_path / raster) as ds:
            assert ds.overviews(1) == [] and "STATISTICS_MAXIMUM" not in ds.tags(), raster
            assert (ds.read(1, out_shape=(16, 16)) == ds.read(1)[0, 0]).all()
        assert not (tmp_path / f"{raster}.ovr").exists() and not (tmp_path / f"{raster}.msk").exists()
    assert writers.category_sidecar(tmp_path / "m.tif").exists() and leftovers(tmp_path) == []


def test_geotiff_uint16_beyond_255_classes_and_without_georeference(tmp_path):
    rasterio = pytest.importorskip("rasterio")
    a = np.arange(300 * 2, dtype=np.uint16).reshape(20, 30) % 301
    out = writers.write_class_map(tmp_path / "big.tiff", a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rasterio.open(out) as ds:
            assert ds.dtypes == ("uint16",) and np.array_equal(ds.read(1), a) and ds.crs is None


def test_65535_classes_fit_a_uint16_map_and_more_are_refused_in_one_line(tmp_path):
    """65,535 classes (0 nodata) are a uint16 ENVI map GDAL reads whole (colour table and names of 65,536
    entries, nodata 0); more were refused with "65536 classes do not fit a uint16 class map", naming neither
    the file nor what to do. Nothing is written."""
    rasterio = pytest.importorskip("rasterio")
    a = np.array([[0, 1, 65535, 300]], np.uint16)
    writers.write_class_map(tmp_path / "m.hdr", a, num_classes=65535, georeference=GEO)
    with rasterio.open(tmp_path / "m.img") as ds:
        assert ds.dtypes == ("uint16",) and ds.nodata == 0 and np.array_equal(ds.read(1), a)
        assert len(ds.colormap(1)) == 65536
    names = gdal_category_names(tmp_path / "m.img")
    assert len(names) == 65536 and names[65535] == "class 65535"
    for suffix in (".tif", ".hdr"):
        with pytest.raises(InputError, match=rf"^cannot write big{suffix}: 65,536 classes do not fit its uint16 class "
                                             r"map \(at most 65,535 classes, 0 being nodata\); write a \.npy"):
            writers.write_class_map(tmp_path / f"big{suffix}", a, num_classes=65536)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.hdr", "m.img"]


@pytest.mark.parametrize("crs", [{"crs_wkt": "garbage", "epsg": None}, {"crs_wkt": 'PROJCS["x",GEOGCS["y"]]', "epsg": None},
                                 {"crs_wkt": None, "epsg": 1234}])
def test_a_crs_gdal_cannot_read_is_one_line_and_leaves_nothing(tmp_path, classmap, crs, capfd):
    """A georeference whose CRS GDAL cannot read (an ENVI header's coordinate system string is recorded as
    given): rasterio's CRSError, with GDAL's own "ERROR 1" lines on stderr, was what the GeoTIFF writers
    raised. One InputError naming the file; nothing written."""
    pytest.importorskip("rasterio")
    geo = {"transform": GEO["transform"], **crs}
    for write in (lambda: writers.write_class_map(tmp_path / "m.tif", classmap, georeference=geo),
                  lambda: writers.geotiff_crs(geo, tmp_path / "m.tif")):
        with pytest.raises(InputError, match=r"^cannot write m.tif as a GeoTIFF: GDAL cannot read the coordinate "
                                             r"reference system the store recorded from its source") as info:
            write()
        assert "\n" not in str(info.value)
    probs = writers.ProbabilityFile(tmp_path / "p.tif", (23, 31, 2), georeference=geo)
    probs.write(np.array([0]), np.array([0]), np.array([[0.25, 0.75]], np.float16))
    with pytest.raises(InputError, match="cannot write p.tif as a GeoTIFF"):
        probs.commit()
    assert list(tmp_path.iterdir()) == []
    assert "ERROR" not in capfd.readouterr().err


def test_envi_classification_round_trip_with_spy(tmp_path, classmap):
    envi = pytest.importorskip("spectral.io.envi")
    names = ["corn", "soy {late", "woods", "water"]  # an opening brace inside a name reads back as it is
    out = writers.write_class_map(tmp_path / "m.hdr", classmap, class_names=names, georeference=GEO)
    img = envi.open(str(out))
    assert img.metadata["file type"] == "ENVI Classification"
    assert img.metadata["class names"] == ["Unclassified", *names]
    assert [int(v) for v in img.metadata["class lookup"]] == class_colours(4).reshape(-1).tolist()
    assert np.array_equal(np.asarray(img.read_band(0)), classmap)
    assert img.metadata["map info"][3:7] == ["620000.5", "4000000.25", "30.0", "20.0"]
    assert (tmp_path / "m.img").is_file() and leftovers(tmp_path) == []
    rasterio = pytest.importorskip("rasterio")
    with rasterio.open(tmp_path / "m.img") as ds:  # GDAL's ENVI driver sees the same georeference
        assert ds.crs.to_epsg() == 32616 and ds.transform.to_gdal() == pytest.approx(tuple(GEO["transform"]))
        assert ds.nodata == 0  # unclassified pixels are nodata to GDAL, as in the GeoTIFF


@pytest.mark.parametrize("name", ["soy, late", "soy,"])
def test_envi_class_names_with_a_comma_are_refused_not_renamed(tmp_path, classmap, name):
    # SPy splits the header's list on commas: "soy, late" would read back as two classes, and hsgds used to
    # write "soy; late" without a word; the map is refused before anything is written, other formats hold it
    envi = pytest.importorskip("spectral.io.envi")
    hand = tmp_path / "hand.hdr"  # what such a header would be read back as
    hand.write_text("ENVI\nsamples = 1\nlines = 1\nbands = 1\nheader offset = 0\nfile type = ENVI Classification\n"
                    "data type = 1\ninterleave = bsq\nbyte order = 0\nclasses = 2\n"
                    f"class names = {{Unclassified, {name}}}\n")
    (tmp_path / "hand.img").write_bytes(b"\0")
    assert envi.open(str(hand)).metadata["class names"] != ["Unclassified", name]
    with pytest.raises(ConfigError, match=r"^cannot write m\.hdr: the name of class 2 .* holds a comma, .*"
                                          r"rename the class, or write a \.tif$") as caught:
        writers.write_class_map(tmp_path / "m.hdr", classmap, class_names=["corn", name, "woods", "water"])
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "m.hdr").exists() and not (tmp_path / "m.img").exists() and leftovers(tmp_path) == []
    out = writers.write_class_map(tmp_path / "m.tif", classmap, class_names=["corn", name, "woods", "water"])
    assert gdal_category_names(out)[2] == name


@pytest.mark.parametrize("name", ["soy {late}", "soy}", "soy\nlate", "soy\r"])
def test_envi_class_names_gdal_misreads_are_refused(tmp_path, classmap, name):
    """GDAL's ENVI driver ends a header's list at a "}" (the names after it shifted by one class: "soy {late}"
    became "soy {late" and an empty class) and joins a list's lines without their line break ("soy\\nlate" read
    as "soylate"); hsgds wrote such names as they were. They are refused before anything is written, as a
    comma is; a .tif holds them (GDAL reads them back)."""
    hand = tmp_path / "hand.hdr"  # such a name written in a header by hand, read by GDAL
    hand.write_text("ENVI\nsamples = 2\nlines = 2\nbands = 1\nheader offset = 0\nfile type = ENVI Classification\n"
                    f"data type = 1\ninterleave = bsq\nbyte order = 0\nclasses = 3\nclass names = {{Unclassified, {name}, "
                    "woods}\n", encoding="utf-8")
    (tmp_path / "hand.img").write_bytes(bytes(4))  # (GDAL takes no binary of under 2 bytes for an ENVI image)
    assert gdal_category_names(tmp_path / "hand.img") != ["Unclassified", name, "woods"]
    names = ["corn", name, "woods", "water"]
    with pytest.raises(ConfigError, match=r"^cannot write m\.hdr: the name of class 2 .* holds .*; rename the class, "
                                          r"or write a \.tif$") as caught:
        writers.write_class_map(tmp_path / "m.hdr", classmap, class_names=names)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "m.hdr").exists() and not (tmp_path / "m.img").exists() and leftovers(tmp_path) == []
    assert gdal_category_names(writers.write_class_map(tmp_path / "m.tif", classmap, class_names=names))[2] == name


@pytest.mark.parametrize("char", ["\x01", "\x1f", "\x00"])
def test_geotiff_class_names_with_control_characters_gdal_drops_are_refused(tmp_path, classmap, char):
    """GDAL drops a control character from a band's metadata item (and a NUL ends a category name: the map
    showed no category at all); tab, line breaks and DEL it keeps. Such a name is refused before anything is
    written; an unpaired surrogate (no Unicode text) is refused in every format that holds names."""
    rasterio = pytest.importorskip("rasterio")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        with rasterio.open(tmp_path / "gdal.tif", "w", driver="GTiff", width=2, height=2, count=1, dtype="uint8") as ds:
            ds.update_tags(1, CLASS_1=f"b{char}c")  # written by rasterio itself, read back by GDAL
        with rasterio.open(tmp_path / "gdal.tif") as ds:
            assert ds.tags(1).get("CLASS_1") != f"b{char}c"
    (tmp_path / "gdal.tif").unlink()
    names = ["corn", f"b{char}c", "woods", "water"]
    with pytest.raises(ConfigError, match=r"^cannot write m\.tif: the name of class 2 .* holds the control character "
                                          r".*, which GDAL drops from a GeoTIFF's metadata; rename the class$"):
        writers.write_class_map(tmp_path / "m.tif", classmap, class_names=names)
    for suffix in (".tif", ".hdr", ".png"):
        with pytest.raises(ConfigError, match=rf"^cannot write m\{suffix}: the name of class 1 \('a\\udcff'\) holds "
                                              r"'\\udcff', which is no Unicode text .*; rename the class$"):
            writers.write_class_map(tmp_path / f"m{suffix}", classmap, class_names=["a\udcff", "b", "c", "d"])
    assert list(tmp_path.iterdir()) == []
    tab = ["corn", "soy\tlate\x7f", "woods", "water"]  # (kept by GDAL)
    assert gdal_category_names(writers.write_class_map(tmp_path / "m.tif", classmap, class_names=tab))[2] == tab[1]


@pytest.mark.parametrize("k, length", [(800, 12), (5, 3000)])
def test_envi_lists_of_many_classes_or_long_names_read_back_whole(tmp_path, k, length):
    """GDAL's ENVI driver reads header lines of at most 10,000 characters and stops at a longer one: the class
    lookup of 729 classes or more (or class names that long together) was written on one line, and GDAL then
    read no class names, colours, nodata, map info or CRS. The lists are wrapped now: GDAL, SPy and hsgds's
    own header reader read every name and colour back, and GDAL the nodata and georeference after them."""
    rasterio = pytest.importorskip("rasterio")
    envi = pytest.importorskip("spectral.io.envi")
    from hsgds.preprocess.readers.envi import envi_class_names

    names = [f"{i:04d} " + "x" * (length - 5) for i in range(1, k + 1)]
    a = (np.arange(20 * 30).reshape(20, 30) % (k + 1)).astype(np.uint16 if k > 255 else np.uint8)
    header = writers.write_class_map(tmp_path / "m.hdr", a, class_names=names, georeference=GEO)
    lut = class_colours(k)
    with rasterio.open(tmp_path / "m.img") as ds:
        assert ds.nodata == 0 and ds.crs.to_epsg() == 32616
        assert ds.transform.to_gdal() == pytest.approx(tuple(GEO["transform"]))
        assert np.array_equal(ds.read(1), a)
        cmap = ds.colormap(1)
        assert len(cmap) == k + 1 and all(cmap[i][:3] == tuple(int(v) for v in lut[i]) for i in range(k + 1))
    assert gdal_category_names(tmp_path / "m.img") == ["Unclassified", *names]
    meta = envi.open(str(header)).metadata
    assert meta["class names"] == ["Unclassified", *names] and meta["classes"] == str(k + 1)
    assert [int(v) for v in meta["class lookup"]] == lut.reshape(-1).tolist()
    assert envi_class_names(header) == ["Unclassified", *names]


def test_envi_header_is_utf8_whatever_the_locale(tmp_path):
    """Class names outside ASCII (a French or Chinese legend) are written as UTF-8, which the converter's
    header reader decodes, also where the locale's encoding is ASCII (a C locale without UTF-8 coercion) or
    a Windows code page: they raised UnicodeEncodeError there."""
    import subprocess
    import sys

    names = ["Ma\u00efs", "\u7389\u7c73"]
    code = ("import sys, numpy as np\nfrom hsgds import writers\n"
            f"writers.write_class_map(sys.argv[1], np.ones((3, 4), np.uint8), class_names={ascii(names)})\n")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.hdr")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    from hsgds.preprocess.readers.envi import parse_header

    assert parse_header(tmp_path / "m.hdr")["class names"] == "{Unclassified, " + ", ".join(names) + "}"


def test_npy_round_trip(tmp_path, classmap):
    out = writers.write_class_map(tmp_path / "m.npy", classmap)
    back = np.load(out)
    assert back.dtype == classmap.dtype and np.array_equal(back, classmap)


def test_png_panels_decoded_by_matplotlib(tmp_path, classmap):
    image = pytest.importorskip("matplotlib.image")
    one = writers.write_class_map(tmp_path / "one.png", classmap, class_names=NAMES)
    gt = classmap.copy()
    gt[:5] = 0
    gt[10] = (gt[10] % 4) + 1  # some wrong pixels
    three = writers.write_class_map(tmp_path / "three.png", classmap, class_names=NAMES, ground_truth=gt,
                                    title="test")
    a, b = image.imread(one), image.imread(three)
    assert a.ndim == 3 and b.ndim == 3
    assert b.shape[1] > 2 * a.shape[1]  # three panels side by side
    # every class colour appears in the image (the map itself, drawn pixel for pixel at this size)
    rgb = (b[..., :3] * 255).round().astype(int).reshape(-1, 3)
    colours = {tuple(c) for c in rgb}
    assert all(tuple(int(v) for v in c) in colours for c in class_colours(4)[1:])
    assert tuple(writers.ERROR_COLOUR) in colours


def test_png_with_dollar_signs_in_class_names_is_written(tmp_path, classmap):
    """matplotlib reads the text between two $ as TeX math: class names "a$x^$" or "$\\frac$" (no valid TeX)
    failed the whole PNG with a multi-line ValueError (in predict, after the whole scene). Texts are drawn as
    written now (tests/test_preview.py reads them back from an SVG)."""
    image = pytest.importorskip("matplotlib.image")
    names = ["a$x^$", "$\\frac$", "$5-$10", "plain"]
    out = writers.write_class_map(tmp_path / "m.png", classmap, class_names=names, title="scene $x^$.zarr",
                                  ground_truth=classmap)
    assert image.imread(out).ndim == 3
    assert leftovers(tmp_path) == []


def test_png_error_map_judges_only_the_pixels_predicted(tmp_path, classmap):
    """A labelled pixel left 0 (outside predict's mask) is not an error: a map right wherever it predicts
    shows no red pixel in its error panel (as many red pixels as a map right everywhere: the legend's), and
    its caption counts only the pixels predicted."""
    image = pytest.importorskip("matplotlib.image")
    gt = classmap.copy()
    masked = np.where(np.arange(gt.shape[0])[:, None] < 8, gt, 0).astype(np.uint8)  # predicted in 8 rows only

    def red_pixels(m):
        png = image.imread(writers.write_class_map(tmp_path / "e.png", m, class_names=NAMES, ground_truth=gt))
        return int(((png[..., :3] * 255).round().astype(int) == writers.ERROR_COLOUR).all(-1).sum())

    assert red_pixels(masked) == red_pixels(gt)
    err, caption = writers.error_panel(masked, gt)
    n = int((masked > 0).sum())
    assert not (err == writers.ERROR_COLOUR).all(-1).any()
    assert caption == f"100.00% of the {n} labelled pixels predicted right; {int((gt > 0).sum()) - n} not predicted"
    wrong = masked.copy()
    wrong[0, :4] = wrong[0, :4] % 4 + 1  # labelled pixels predicted wrong are still red
    err, caption = writers.error_panel(wrong, gt)
    assert (err == writers.ERROR_COLOUR).all(-1).sum() == int((gt[0, :4] > 0).sum())
    assert writers.error_panel(gt, gt)[1] == f"100.00% of all {int((gt > 0).sum())} labelled pixels right"


def test_png_legend_lists_the_classes_seen_and_at_most_its_limit(tmp_path):
    """The legend lists the classes in the map or the ground truth; past LEGEND_CLASSES the ones with the most
    pixels (predicted and true together, checked against a sort written here), the rest counted: a
    300-class map makes an image about the size of a 40-class one (the legend's longest line aside), not a
    legend taller than the map."""
    image = pytest.importorskip("matplotlib.image")
    predicted = np.bincount([1, 1, 3, 3, 3, 7], minlength=9)
    assert writers.legend_classes(predicted) == ([1, 3, 7], 0)
    assert writers.legend_classes(predicted, np.bincount([0, 8], minlength=9)) == ([1, 3, 7, 8], 0)
    rng = np.random.default_rng(2)
    counts = rng.permutation(np.arange(1, 301)) * 3  # distinct: the largest 40 are one set
    shown, hidden = writers.legend_classes(np.concatenate([[5], counts]), limit=40)
    assert shown == sorted(int(c) + 1 for c in np.argsort(-counts)[:40]) and hidden == 260
    big = rng.integers(1, 301, (120, 120)).astype(np.uint16)
    few = np.where(big > 40, big % 40 + 1, big).astype(np.uint16)
    sizes = [image.imread(writers.write_class_map(tmp_path / f"{n}.png", m, num_classes=300)).shape
             for n, m in (("many", big), ("few", few))]
    assert sizes[0][0] <= 1.05 * sizes[1][0] and sizes[0][1] <= 1.05 * sizes[1][1], sizes


def test_unknown_suffix_and_missing_folder_are_one_line_errors(tmp_path, classmap):
    with pytest.raises(InputError, match=r"unknown suffix '\.jpg'; use one of \.tif"):
        writers.check_output(tmp_path / "m.jpg")
    with pytest.raises(InputError, match="does not exist"):
        writers.check_output(tmp_path / "nope" / "m.npy")
    with pytest.raises(InputError, match="2-D integer array"):
        writers.write_class_map(tmp_path / "m.npy", classmap.astype(np.float32))
    assert list(tmp_path.iterdir()) == []


def test_an_output_whose_folder_is_a_file_says_so(tmp_path, classmap):
    """-o map.tif/x.npy where map.tif is a file: "the folder map.tif does not exist; create it first" told to
    create what cannot be created there; it says what is there instead. Nothing is written."""
    (tmp_path / "map.tif").write_bytes(b"old")
    with pytest.raises(InputError, match=r"^cannot write .*map\.tif/x\.npy: .*map\.tif is a file, not a folder; "
                                         r"choose another output path$"):
        writers.check_output(tmp_path / "map.tif" / "x.npy")
    assert [(p.name, p.read_bytes()) for p in tmp_path.iterdir()] == [("map.tif", b"old")]


def test_missing_rasterio_is_named(tmp_path, monkeypatch, classmap):
    import builtins

    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name.split(".")[0] == "rasterio":
            raise ModuleNotFoundError("No module named 'rasterio'", name="rasterio")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    monkeypatch.delitem(__import__("sys").modules, "rasterio", raising=False)
    with pytest.raises(DependencyError, match=r'needs rasterio.*pip install "hsgds\[geo\]"'):
        writers.check_output(tmp_path / "m.tif")
    # a probabilities GeoTIFF is named as what it is (it said "writing a GeoTIFF class map (p.tif)")
    with pytest.raises(DependencyError, match=r"^writing a GeoTIFF per-class probabilities file \(p\.tif\) needs "
                                              r'rasterio, which is not installed; install it with pip install "hsgds\[geo\]"$'):
        writers.check_probability_output(tmp_path / "p.tif")


@pytest.mark.parametrize("suffix", [".tif", ".png", ".hdr", ".npy"])
def test_a_writer_failing_mid_way_leaves_nothing(tmp_path, monkeypatch, classmap, suffix):
    """The failure is injected at the fsync before the rename: everything was written to the temporary file,
    so this is the latest point a crash can happen; the target must not exist and no temporary remains."""
    pytest.importorskip({".tif": "rasterio", ".png": "matplotlib"}.get(suffix, "numpy"))
    target = tmp_path / f"m{suffix}"
    real_fsync = os.fsync

    def dying_fsync(fd):
        raise OSError(5, "injected I/O error")

    monkeypatch.setattr(os, "fsync", dying_fsync)
    with pytest.raises(OSError, match="injected"):
        writers.write_class_map(target, classmap, class_names=ENVI_NAMES if suffix == ".hdr" else NAMES,
                                georeference=GEO)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert list(tmp_path.iterdir()) == []
    # an existing output is left as it was
    target.write_bytes(b"old")
    monkeypatch.setattr(os, "fsync", dying_fsync)
    with pytest.raises(OSError, match="injected"):
        writers.write_class_map(target, classmap, class_names=ENVI_NAMES if suffix == ".hdr" else NAMES,
                                georeference=GEO)
    assert target.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_an_envi_pair_failing_at_its_header_leaves_the_existing_pair_as_it_was(tmp_path, monkeypatch, classmap):
    """The header's temporary is written and flushed before the binary replaces the old one: a failure there
    leaves the earlier pair byte for byte (not a new uint16 binary under the old uint8 header), and GDAL's
    overviews of it."""
    target = tmp_path / "m.hdr"
    writers.write_class_map(target, classmap, class_names=ENVI_NAMES)
    (tmp_path / "m.img.ovr").write_bytes(b"GDAL's overviews of the pair")  # (kept while the new pair is not whole)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real_fsync, calls = os.fsync, []

    def fsync_failing_on_the_header(fd):
        calls.append(fd)
        if os.readlink(f"/proc/self/fd/{fd}").split("/")[-1].startswith(".m.hdr."):
            raise OSError(5, "injected I/O error")
        real_fsync(fd)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to tell the files apart")
    monkeypatch.setattr(os, "fsync", fsync_failing_on_the_header)
    with pytest.raises(OSError, match="injected"):
        writers.write_class_map(target, classmap.astype(np.uint16) * 75, num_classes=300)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_atomic_path_leaves_nothing_on_interrupt(tmp_path):
    target = tmp_path / "x.npy"
    with pytest.raises(KeyboardInterrupt):
        with writers.atomic_path(target) as tmp:
            tmp.write_bytes(b"partial")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_probability_file_whose_mapping_fails_leaves_nothing(tmp_path, monkeypatch):
    """mmap failing (no address space, a file system without mmap) cannot be provoked portably: it is
    injected; the temporary file and its handle must not outlive the error."""
    import gc
    import mmap

    def no_mapping(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", no_mapping)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)  # a leaked handle is reported when collected
        with pytest.raises(OSError, match="Cannot allocate memory"):
            writers.ProbabilityFile(tmp_path / "p.npy", (4, 5, 3))
        gc.collect()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("degrees", [0.0, 15.0, -30.0, 90.0])
def test_envi_map_info_of_a_rotated_grid_reads_back_in_gdal(tmp_path, classmap, degrees):
    """A rotated grid's transform is written as map info with rotation= and GDAL (rasterio) reads the same
    transform back; a sheared one, which map info cannot express, is refused."""
    import math

    rasterio = pytest.importorskip("rasterio")
    r = -math.radians(degrees)
    dx, dy = 30.0, 20.0
    # the transform GDAL's ENVI driver makes of map info with rotation=degrees (GDAL order: x0, a, b, y0, c, d)
    transform = [620000.5, math.cos(r) * dx, -math.sin(r) * dx, 4000000.25, -math.sin(r) * dy, -math.cos(r) * dy]
    path = writers.write_envi(tmp_path / f"m{degrees}.hdr", classmap, georeference={**GEO, "transform": transform})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rasterio.open(path.with_suffix(".img")) as src:
            got = src.transform.to_gdal()
    np.testing.assert_allclose(got, transform, rtol=0, atol=1e-6)

    sheared = [620000.5, 30.0, 5.0, 4000000.25, 0.0, -20.0]  # (refused: it had made a map without georeference)
    with pytest.raises(InputError, match=r"^cannot write s\.hdr as an ENVI map: the store's grid is sheared"):
        writers.write_envi(tmp_path / "s.hdr", classmap, georeference={**GEO, "transform": sheared})
    assert not (tmp_path / "s.hdr").exists() and not (tmp_path / "s.img").exists()


@pytest.mark.skipif(os.name == "nt", reason="stale temporaries are judged by process id on POSIX only")
def test_temporaries_of_killed_writers_are_removed_by_the_next_write(tmp_path, classmap):
    """SIGKILL (the out-of-memory killer) runs no cleanup: the next write of the same target deletes what such a
    process left, and leaves the temporaries of processes still running and of other hosts."""
    import signal
    import subprocess
    import sys

    from hsgds._durable import _host

    code = ("import os, signal, sys\nfrom hsgds import writers\n"
            "f = writers.ProbabilityFile(sys.argv[1], (40, 50, 3))\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    for target in ("p.npy", "m.tif.npy"):
        run = subprocess.run([sys.executable, "-c", code, str(tmp_path / target)])
        assert run.returncode == -signal.SIGKILL
    killed = leftovers(tmp_path)
    assert len(killed) == 2 and all(f".{_host()}-" in name for name in killed)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        running = [tmp_path / f".{t}.{_host()}-{sleeper.pid}-ab.partial" for t in ("p.npy", "m.tif")]
        elsewhere = [tmp_path / f".{t}.otherhost-1-cd.partial" for t in ("p.npy", "m.tif")]
        for p in running + elsewhere:
            p.write_bytes(b"someone else's")
        f = writers.ProbabilityFile(tmp_path / "p.npy", (4, 5, 3))
        f.commit()
        os.rename(tmp_path / killed[0], tmp_path / killed[0].replace(".m.tif.npy.", ".m.tif."))
        assert len(leftovers(tmp_path)) == 5  # the killed writer's of m.tif and the four others
        writers.write_class_map(tmp_path / "m.tif", classmap)  # through atomic_path
        assert leftovers(tmp_path) == sorted(p.name for p in running + elsewhere)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_probability_geotiff_is_written_block_by_block(tmp_path, monkeypatch):
    """A probabilities GeoTIFF taller than one block of rows (here 256) equals what was written, read back by
    rasterio (GDAL); the temporary it was made from is gone."""
    rasterio = pytest.importorskip("rasterio")
    monkeypatch.setattr(writers, "GEOTIFF_BLOCK_BYTES", 1)  # one 256-row block at a time
    rng = np.random.default_rng(7)
    values = rng.random((600, 9, 3)).astype(np.float16)
    f = writers.ProbabilityFile(tmp_path / "p.tif", (600, 9, 3), georeference=GEO, class_names=["a", "b"])
    y, x = np.nonzero(np.ones((600, 9), bool))
    f.write(y, x, values[y, x])
    f.commit()
    with rasterio.open(tmp_path / "p.tif") as ds:
        assert ds.count == 3 and ds.block_shapes[0] == (256, 256) and ds.crs.to_epsg() == 32616
        assert ds.descriptions == ("probability of a", "probability of b", "probability of class 3")
        np.testing.assert_array_equal(ds.read().transpose(1, 2, 0), values.astype(np.float32))
    assert leftovers(tmp_path) == []


def test_names_the_font_lacks_are_one_warning_naming_the_characters(tmp_path):
    """matplotlib warns once per missing character and drawing (a PNG with a tight bounding box draws twice); the
    PNG writer issues one GlyphWarning naming each character once, in the order drawn, and no other warning."""
    pytest.importorskip("matplotlib")
    from matplotlib.font_manager import FontProperties, findfont
    from matplotlib.ft2font import FT2Font

    from hsgds.preview import GlyphWarning

    font = FT2Font(findfont(FontProperties()))
    lacking = [c for c in "土壤水草地" if ord(c) not in font.get_charmap()]
    if len(lacking) < 5:
        pytest.skip(f"matplotlib's default font {font.family_name} draws CJK")
    classmap = np.array([[1, 2], [3, 1]], dtype=np.uint8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writers.write_png(tmp_path / "m.png", classmap, class_names=["土壤", "水", "草地 grass"])
    assert [(w.category, str(w.message)) for w in caught] == [(GlyphWarning, (
        f"the names drawn in m.png hold characters the font ({font.family_name}) lacks: '土', '壤', '水', '草', '地'; "
        "they show as boxes (name a font that has them first in matplotlib's font.sans-serif, e.g. in a matplotlibrc)"))]
    assert (tmp_path / "m.png").stat().st_size > 0
