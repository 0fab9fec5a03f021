"""hsgds preview: panels checked pixel by pixel against numpy, band choice, the image file, the CLI."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

import hsgds
from hsgds import format as fmt
from hsgds.errors import DependencyError, InputError
from hsgds.preprocess.convert import ConvertOptions, convert
from hsgds.preview import (
    SPLIT_COLOURS,
    UNLABELLED,
    class_colours,
    pick_bands,
    preview_panels,
    render_preview,
)
from tests.conftest import convert_quietly
from tests.envi import write_envi

WAVELENGTHS = [400.0 + 50.0 * i for i in range(16)]  # 400..1150 nm: 650/550/450 are the nearest bands


@pytest.fixture(scope="module")
def envi_store(tmp_path_factory):
    """A 61x47x16 int16 scene with wavelengths and a block split (so there is a guard band)."""
    from hsgds.synthetic import make_scene

    tmp = tmp_path_factory.mktemp("preview")
    cube, labels = make_scene(61, 47, len(WAVELENGTHS), classes=5, dtype="int16", seed=11)
    hdr = write_envi(tmp / "scene", cube, WAVELENGTHS)
    np.save(tmp / "gt.npy", labels)
    opts = ConvertOptions(labels=tmp / "gt.npy", split="blocks", block_size=16, train=0.5, val=0.2, max_patch=5,
                          tile=12, class_names=("a", "b", "c", "d", "e"))
    out = convert_quietly(hdr, tmp / "scene.zarr", opts)
    return out, cube, labels


def stretch_reference(values: np.ndarray, lo: float = 2, hi: float = 98) -> np.ndarray:
    out = np.zeros(values.shape, np.uint8)
    for c in range(3):
        v = values[..., c].astype(np.float64)
        a, b = np.percentile(v, [lo, hi])
        out[..., c] = np.round(np.clip((v - a) / (b - a), 0, 1) * 255)
    return out


def test_bands_nearest_640_550_460_nm():
    assert pick_bands(16, WAVELENGTHS)[0] == (5, 3, 1)
    bands, note = pick_bands(16, WAVELENGTHS)
    assert "650/550/450 nm" in note
    assert pick_bands(200, None)[0] == (149, 100, 50)  # no wavelengths: 3/4, 1/2, 1/4 of the range
    assert pick_bands(1, None)[0] == (0, 0, 0)
    assert pick_bands(16, WAVELENGTHS, bands=(0, 1, 2)) == ((0, 1, 2), "bands 0/1/2 (chosen)")
    with pytest.raises(InputError, match="band 16 is out of range"):
        pick_bands(16, None, bands=(0, 1, 16))
    with pytest.raises(InputError, match="three bands"):
        pick_bands(16, None, bands=(0, 1))


def test_a_band_without_a_centre_is_never_picked():
    """PRISMA's unused bands have no centre (None): the nearest band with one is picked, as numpy's nanargmin
    over the centres there are picks it (NaN would otherwise be everyone's nearest)."""
    nm = [None, None, 980.0, 640.5, 560.0, 455.0, None]
    known = np.array([np.nan if w is None else w for w in nm])
    want = tuple(int(np.nanargmin(np.abs(known - t))) for t in (640, 550, 460))
    assert pick_bands(len(nm), nm) == (want, "bands 3/4/5 nearest 640/550/460 nm (640/560/455 nm)")


def test_panels_are_exact(envi_store):
    path, cube, labels = envi_store
    scene = hsgds.open_scene(path)
    assert scene.wavelengths == WAVELENGTHS
    p = preview_panels(scene)
    h, w, _ = cube.shape
    assert p.step == 1 and p.bands == (5, 3, 1)
    for panel in (p.rgb, p.classes, p.splits):
        assert panel.shape == (h, w, 3) and panel.dtype == np.uint8

    # false colour: the percentile stretch of bands 5/3/1
    np.testing.assert_array_equal(p.rgb, stretch_reference(cube[..., [5, 3, 1]]))

    # class map: every pixel has its class colour; unlabelled is black; class 1 is the palette's first
    lut = class_colours(5)
    assert tuple(lut[0]) == UNLABELLED and tuple(lut[1]) == (230, 25, 75)
    assert len({tuple(c) for c in lut}) == 6
    for c in range(6):
        assert (p.classes[labels == c] == lut[c]).all()
    assert [(c, name, n) for c, name, _, n in p.class_legend] == [
        (c, "abcde"[c - 1], int((labels == c).sum())) for c in range(1, 6) if (labels == c).any()]

    # split map: every labelled pixel has its split's colour (the guard band too), the rest black
    expected = np.zeros((h, w, 3), np.uint8)
    for name in fmt.SPLIT_CODES:
        y, x, _ = scene.samples(name)
        expected[y, x] = SPLIT_COLOURS[name]
    np.testing.assert_array_equal(p.splits, expected)
    names = [name for name, *_ in p.split_legend]
    assert names[0] == "train" and "none" in names  # blocks split: guard band present
    assert sum(n for *_, n in p.split_legend) == np.count_nonzero(labels)
    assert (p.splits[labels == 0] == UNLABELLED).all()


def test_panels_sampled_down(envi_store):
    path, cube, labels = envi_store
    full = preview_panels(path)
    small = preview_panels(path, max_size=20, percentiles=(0, 100))
    assert small.step == 4  # ceil(61 / 20)
    np.testing.assert_array_equal(small.classes, full.classes[::4, ::4])
    np.testing.assert_array_equal(small.splits, full.splits[::4, ::4])
    np.testing.assert_array_equal(small.rgb, stretch_reference(cube[::4, ::4][..., [5, 3, 1]], 0, 100))


def test_panels_bad_arguments(envi_store):
    path = envi_store[0]
    with pytest.raises(InputError, match="percentiles"):
        preview_panels(path, percentiles=(98, 2))
    with pytest.raises(InputError, match="max_size"):
        preview_panels(path, max_size=0)


@pytest.mark.parametrize("option,value,message", [
    ("bands", (0, 1.7, 2), r"bands must be three integer band indices \(red, green, blue\), got \(0, 1.7, 2\)"),
    ("bands", (True, False, True), "bands must be three integer band indices"),
    ("bands", "abc", "bands must be three integer band indices .*, got 'abc'"),
    ("bands", 3, "bands must be three integer band indices .*, got 3"),
    ("percentiles", (1, 2, 3), r"percentiles must be two numbers \(low, high\), got \(1, 2, 3\)"),
    ("percentiles", "ab", "percentiles must be two numbers"),
    ("max_size", 2.5, "max_size must be an integer >= 1, not 2.5"),
    ("max_size", None, "max_size must be an integer >= 1, not None"),
    ("max_size", float("inf"), "max_size must be an integer >= 1, not inf"),
])
def test_panels_refuse_arguments_of_the_wrong_type_in_one_line(envi_store, option, value, message):
    """Library callers get the CLI's checks: band 1.7 (or True) was band 1 silently, max_size 2.5 was 2, and
    "abc", None, inf or three percentiles failed in a ValueError, TypeError or OverflowError traceback."""
    with pytest.raises(InputError, match=message):
        preview_panels(envi_store[0], **{option: value})
    assert preview_panels(envi_store[0], bands=np.array([5, 3, 1]), max_size=np.int64(20)).bands == (5, 3, 1)


def test_preview_png_via_cli(envi_store, tmp_path, run_cli):
    import matplotlib.image

    path, _, labels = envi_store
    out = tmp_path / "preview.png"
    code, stdout, err = run_cli("preview", path, "-o", out)
    assert code == 0, err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {out}" in stdout
    image = matplotlib.image.imread(out)
    assert image.ndim == 3 and image.shape[1] > image.shape[0] > 200  # three panels side by side
    colours = {tuple(px) for px in np.round(image[..., :3] * 255).astype(np.uint8).reshape(-1, 3)}
    lut = class_colours(5)
    for c in np.unique(labels[labels > 0]):
        assert tuple(int(v) for v in lut[c]) in colours  # class map and legend drawn with exact colours
    for name in ("train", "val", "test", "none"):
        assert SPLIT_COLOURS[name] in colours


def test_preview_cli_options_and_errors(envi_store, tmp_path, run_cli):
    path = envi_store[0]
    code, _, err = run_cli("preview", path, "-o", tmp_path / "p.pdf", "--bands", "0,1,2", "--stretch", "1,99")
    assert code == 0, err
    assert (tmp_path / "p.pdf").read_bytes()[:5] == b"%PDF-"
    code, _, err = run_cli("preview", path, "-o", tmp_path / "x.png", "--bands", "0,1")
    assert code == 2 and "3 comma-separated numbers" in err
    code, _, err = run_cli("preview", path, "-o", tmp_path / "x.png", "--bands", "0,1,99")
    assert code == 2 and "band 99 is out of range" in err
    code, _, err = run_cli("preview", tmp_path / "missing.zarr", "-o", tmp_path / "x.png")
    assert code == 2 and "hsgds convert" in err
    bad = [
        (("-o", tmp_path / "x.png", "--dpi", "0"), "dpi must be a number in 10..600, got 0"),
        (("-o", tmp_path / "x.png", "--dpi", "100000"), "dpi must be a number in 10..600"),
        (("-o", tmp_path / "x"), "name it with one of the suffixes .png, .pdf, .svg"),  # matplotlib would add .png
        (("-o", tmp_path / "x.jpeg2"), "name it with one of the suffixes"),
        (("-o", tmp_path / "sub" / "x.png"), "the folder .*sub does not exist; create it first"),
    ]
    for args, message in bad:
        code, _, err = run_cli("preview", path, *args)
        assert code == 2 and re.search(message, err) and len(err.strip().splitlines()) == 1, (args, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.pdf"]


def test_indian_pines_preview(indian_pines_store, tmp_path):
    out = render_preview(indian_pines_store, tmp_path / "ip.png", bands=(50, 27, 17))
    assert out.stat().st_size > 10_000
    p = preview_panels(indian_pines_store)
    assert len(p.class_legend) == 16 and p.class_legend[0][1] == "Alfalfa"


def test_missing_matplotlib_names_the_extra(envi_store, tmp_path, monkeypatch, run_cli):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(DependencyError, match=r'matplotlib, which is not installed; .*pip install "hsgds\[preview\]"'):
        render_preview(envi_store[0], tmp_path / "x.png")
    code, _, err = run_cli("preview", envi_store[0], "-o", tmp_path / "x.png")
    assert code == 2 and "hsgds[preview]" in err
    assert preview_panels(envi_store[0]).rgb.size  # the panels need numpy only


def test_class_names_with_dollar_signs_are_drawn_as_written(tmp_path):
    """matplotlib reads the text between two $ as TeX math: a store's class name "a$x^$" (no valid TeX) failed
    the preview with a multi-line ValueError, and "$5-$10" came out typeset. The SVG's texts (written as text,
    svg.fonttype "none") hold the names as written."""
    import matplotlib

    cube, labels = np.random.default_rng(1).integers(0, 1000, (20, 16, 3)).astype("int16"), np.zeros((20, 16), "uint8")
    labels[:10], labels[10:] = 1, 2
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "gt.npy", labels)
    store = convert_quietly(tmp_path / "c.npy", tmp_path / "s.zarr",
                            ConvertOptions(labels=tmp_path / "gt.npy", class_names=("a$x^$", "$5-$10")))
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        out = render_preview(store, tmp_path / "p.svg")
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", out.read_text())
    assert "1 a$x^$ (160)" in texts and "2 $5-$10 (160)" in texts, texts


def test_unlabelled_single_band_scene(tmp_path):
    cube = np.random.default_rng(0).integers(0, 1000, (40, 30, 1)).astype("float32")
    np.save(tmp_path / "u.npy", cube)
    store = convert(tmp_path / "u.npy", tmp_path / "u.zarr", ConvertOptions())
    p = preview_panels(store)
    assert p.bands == (0, 0, 0)  # one band: grey
    assert (p.rgb[..., 0] == p.rgb[..., 1]).all() and (p.rgb[..., 1] == p.rgb[..., 2]).all()
    assert p.class_legend == [] and p.split_legend == []
    assert not p.classes.any() and not p.splits.any()  # all unlabelled: black
    assert render_preview(store, tmp_path / "u.png").stat().st_size > 0


def test_nodata_pixels_are_black_and_left_out_of_the_stretch(nodata_store):
    """The tiles hold a fill where the source had no data: the false colour shows those pixels black, and the
    percentiles are those of the data pixels alone."""
    store, cube, _, nodata = nodata_store(60, 44, 6, seed=4, tile=28)
    for step, size in ((1, 1024), (3, 20)):
        p = preview_panels(store, bands=(5, 3, 1), max_size=size)
        assert p.step == step
        gaps = nodata[::step, ::step]
        values = cube[::step, ::step][..., [5, 3, 1]].astype(np.float64)
        expected = np.zeros(values.shape, np.uint8)
        for c in range(3):
            lo, hi = np.percentile(values[..., c][~gaps], (2, 98))
            expected[..., c] = np.round(np.clip((values[..., c] - lo) / (hi - lo), 0, 1) * 255)
        expected[gaps] = 0
        np.testing.assert_array_equal(p.rgb, expected)


def test_a_sampled_grid_of_nodata_pixels_alone_is_black(nodata_store):
    """A scene sampled every ``step`` pixels may see no data pixel at all (here every sampled pixel is nodata):
    the false colour is black, not an error from the percentiles of nothing."""
    nodata = np.zeros((60, 44), bool)
    nodata[::3, ::3] = True
    store, _, _, _ = nodata_store(60, 44, 6, seed=5, tile=28, nodata=nodata)
    p = preview_panels(store, bands=(5, 3, 1), max_size=20)
    assert p.step == 3 and p.rgb.shape == (20, 15, 3)
    assert not p.rgb.any()


def _preview_subprocess(store, out, *, before: str = "", prefix: tuple[str, ...] = ()):
    """`hsgds preview STORE -o OUT` in a fresh interpreter (resource limits and dropped capabilities apply to
    it alone); returns the completed process."""
    import os
    import subprocess
    import textwrap
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    script = "\n".join(["import sys", textwrap.dedent(before).strip(), "from hsgds.cli import main",
                        f"main(['preview', {str(store)!r}, '-o', {str(out)!r}])"])
    return subprocess.run([*prefix, sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(repo)}, cwd=repo)


def _default_font() -> tuple[str, set[int]]:
    """The family of the font matplotlib draws texts with by default, and the code points it holds (FreeType's
    own character map)."""
    from matplotlib.font_manager import FontProperties, findfont
    from matplotlib.ft2font import FT2Font

    font = FT2Font(findfont(FontProperties()))
    return font.family_name, set(font.get_charmap())


def test_class_names_the_font_cannot_draw_are_one_warning_line(tmp_path):
    """A store's class names in CJK, which matplotlib's default font lacks: `hsgds preview` printed two lines of
    matplotlib's UserWarning per character on stderr; it prints one hsgds warning line naming the characters,
    and writes the preview."""
    family, has = _default_font()
    if any(ord(c) in has for c in "土壤水"):
        pytest.skip(f"matplotlib's default font {family} draws these characters")
    cube, labels = np.random.default_rng(1).integers(0, 1000, (20, 16, 3)).astype("int16"), np.zeros((20, 16), "uint8")
    labels[:10], labels[10:] = 1, 2
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "gt.npy", labels)
    store = convert_quietly(tmp_path / "c.npy", tmp_path / "s.zarr",
                            ConvertOptions(labels=tmp_path / "gt.npy", class_names=("土壤", "水 water")))
    proc = _preview_subprocess(store, tmp_path / "p.png")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"hsgds: warning: the names drawn in p.png hold characters the font ({family}) lacks: '土', '壤', '水'; they "
        "show as boxes (name a font that has them first in matplotlib's font.sans-serif, e.g. in a matplotlibrc)"]
    assert (tmp_path / "p.png").stat().st_size > 0


def test_a_preview_that_cannot_be_written_whole_leaves_the_old_one(envi_store, tmp_path, run_cli):
    """The image was written in place: a write that failed half-way (here past RLIMIT_FSIZE, as on a full
    disk) left a truncated preview.png over the previous, good one, and said only "[Errno 27] File too large".
    It is written beside the target and renamed over it now: the old preview stays, nothing else is left,
    and the error names the file."""
    import matplotlib.image

    path = envi_store[0]
    out = tmp_path / "preview.png"
    code, _, err = run_cli("preview", path, "-o", out, "--dpi", "20")  # a small image: under the limit
    assert code == 0, err
    good = out.read_bytes()
    assert len(good) < 16384 and matplotlib.image.imread(out).ndim == 3
    proc = _preview_subprocess(path, out, before="""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed by the signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    """)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hsgds: error: cannot write {out} (File too large)"), lines
    assert out.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preview.png"]


def test_a_read_only_folder_is_named_before_the_preview_is_made(envi_store, tmp_path):
    """A folder the image cannot be written to was found only after every tile had been read, and said
    "Permission denied: ro/x.png"; it is named first now, in one line saying what to do."""
    import shutil

    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is needed to make root obey file permissions")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        proc = _preview_subprocess(envi_store[0], ro / "x.png",
                                   prefix=("setpriv", "--bounding-set=-dac_override,-dac_read_search"))
    finally:
        ro.chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"hsgds: error: cannot write {ro / 'x.png'}: the folder {ro} is not writable "
                                   "(Permission denied); choose another output path")
    assert list(ro.iterdir()) == []


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_symlink_or_fifo_at_the_preview_path_is_refused(envi_store, tmp_path, run_cli, kind):
    """The image's atomic rename replaced a symbolic link (its target left stale) or a FIFO at -o with a
    file; refused now in one line before a tile is read, the link, its target and the FIFO as they were."""
    import os
    import stat

    if not hasattr(os, "mkfifo"):
        pytest.skip("needs FIFOs (POSIX)")
    out, target = tmp_path / "p.png", tmp_path / "target.png"
    target.write_bytes(b"kept")
    if kind == "symlink":
        out.symlink_to(target)
    else:
        os.mkfifo(out)
    code, stdout, err = run_cli("preview", envi_store[0], "-o", out)
    described = {"symlink": "a symbolic link", "fifo": "a FIFO (named pipe)"}[kind]
    assert code == 2 and err == (f"hsgds: error: cannot write {out}: it is {described}, which writing would replace "
                                 "with a file; choose another output path\n"), err
    mode = os.lstat(out).st_mode
    assert stat.S_ISLNK(mode) if kind == "symlink" else stat.S_ISFIFO(mode)
    assert target.read_bytes() == b"kept" and sorted(p.name for p in tmp_path.iterdir()) == ["p.png", "target.png"]
