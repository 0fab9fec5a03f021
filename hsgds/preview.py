"""``hsgds preview``: a false-colour image, the class map and the split map of a store, side by side.

:func:`preview_panels` computes the three panels as uint8 RGB arrays (numpy only, so tests can check
every pixel); :func:`render_preview` lays them out with legends and writes an image with matplotlib
(the ``preview`` extra), using its Agg canvas directly: no pyplot, no GUI backend, no global state.
"""

from __future__ import annotations

import colorsys
import math
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hsgds import format as fmt
from hsgds._durable import atomic_path, check_writable
from hsgds._optional import require
from hsgds._wording import listed
from hsgds.errors import HsgdsWarning, InputError, as_path, shown

__all__ = [
    "RGB_TARGETS_NM",
    "SPLIT_COLOURS",
    "UNLABELLED",
    "GlyphWarning",
    "PreviewPanels",
    "class_colours",
    "glyphs_warned_once",
    "pick_bands",
    "preview_panels",
    "render_preview",
    "texts_as_written",
]

#: Band centres used for the false-colour red, green and blue when the store knows its wavelengths.
RGB_TARGETS_NM = (640.0, 550.0, 460.0)
#: Band positions (fractions of the band range) used when it does not.
_FALLBACK_FRACTIONS = (0.75, 0.5, 0.25)
#: Said of a false colour that takes other bands than the nearest, which the source flags bad.
_SKIPPED = "; bands flagged bad by the source skipped"
#: Colour of unlabelled pixels in the class and split maps.
UNLABELLED = (0, 0, 0)
#: Split map colours, by split name ("none" = labelled but in no split, e.g. a block split's guard band).
SPLIT_COLOURS: dict[str, tuple[int, int, int]] = {
    "train": (31, 119, 180),
    "val": (255, 160, 0),
    "test": (214, 39, 40),
    "none": (150, 150, 150),
}
_SPLIT_LABELS = {"train": "train", "val": "val", "test": "test", "none": "guard / unused"}
# well-separated colours for classes 1..20; more are spread around the hue circle
_PALETTE = (
    (230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
    (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (220, 190, 255),
    (170, 110, 40), (255, 250, 200), (128, 0, 0), (170, 255, 195), (128, 128, 0), (255, 215, 180),
    (0, 0, 128), (128, 128, 128),
)


def class_colours(num_classes: int) -> np.ndarray:
    """(K+1, 3) uint8 lookup table: row 0 (unlabelled) is black, row k is class k's colour."""
    table = [UNLABELLED, *_PALETTE[:num_classes]]
    for k in range(len(_PALETTE), num_classes):  # golden-ratio hue steps, two brightness levels
        r, g, b = colorsys.hsv_to_rgb((k * 0.618033988749895) % 1.0, 0.75, 0.95 if k % 2 else 0.7)
        table.append((round(r * 255), round(g * 255), round(b * 255)))
    return np.array(table, dtype=np.uint8)


def texts_as_written(fig: Any) -> None:
    """Show every text of matplotlib figure ``fig`` as written. matplotlib typesets the text between two $ signs
    as TeX math: a class or store name such as "$5-$10" came out typeset, and one that is not valid TeX
    ("a$x^$") failed the whole image with a multi-line ValueError."""
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        text.set_parse_math(False)


def pick_bands(num_bands: int, wavelengths: Sequence[float | None] | None = None,
               bands: tuple[int, ...] | list[int] | None = None,
               bad: Sequence[int] | None = None) -> tuple[tuple[int, int, int], str]:
    """The (red, green, blue) band indices of the false-colour image and a note saying how they were chosen.

    Explicit ``bands`` win; else the bands nearest :data:`RGB_TARGETS_NM` when wavelengths are known (never
    a band without a centre);
    else the bands at 3/4, 1/2 and 1/4 of the band range. A band in ``bad`` (the source flags it bad: noise,
    as AVIRIS's water-vapour bands) is never chosen, unless every band is.
    """
    if bands is not None:
        # int() of each would take band 1 for 1.7 or True, and fail in a traceback for "abc"
        if not isinstance(bands, (tuple, list, np.ndarray)) or not all(
                isinstance(b, (int, np.integer)) and not isinstance(b, (bool, np.bool_)) for b in bands):
            raise InputError(f"bands must be three integer band indices (red, green, blue), got {shown(bands)}")
        picked = tuple(int(b) for b in bands)
        if len(picked) != 3:
            raise InputError(f"give three bands (red, green, blue), not {len(picked)}")
        bad = [b for b in picked if not 0 <= b < num_bands]
        if bad:
            raise InputError(f"band {bad[0]} is out of range; the scene has bands 0..{num_bands - 1}")
        return picked, "bands {}/{}/{} (chosen)".format(*picked)  # type: ignore[return-value]
    flagged = np.isin(np.arange(num_bands), list(bad or ()))
    if flagged.all():  # nothing else to show
        flagged[:] = False
    if wavelengths is not None:
        wl = fmt.wavelength_array(wavelengths)
        if np.isnan(wl[~flagged]).all():  # only bad bands have a centre: show those rather than none
            flagged[:] = False
        nearest = tuple(int(np.nanargmin(np.abs(wl - t))) for t in RGB_TARGETS_NM)
        wl[flagged] = np.nan
        picked = tuple(int(np.nanargmin(np.abs(wl - t))) for t in RGB_TARGETS_NM)
        got = "/".join(f"{wl[i]:.0f}" for i in picked)
        return picked, ("bands {}/{}/{} nearest 640/550/460 nm".format(*picked)  # type: ignore[return-value]
                        + f" ({got} nm)" + (_SKIPPED if picked != nearest else ""))
    good = np.flatnonzero(~flagged)
    at = [int(f * (num_bands - 1) + 0.5) for f in _FALLBACK_FRACTIONS]
    # the good band nearest each position (the lower one on a tie)
    picked = tuple(int(good[np.abs(good - i).argmin()]) for i in at)
    return picked, ("bands {}/{}/{} (no wavelengths: at 3/4, 1/2, 1/4 of the range)"  # type: ignore[return-value]
                    .format(*picked) + (_SKIPPED if list(picked) != at else ""))


def _stretch(values: np.ndarray, percentiles: tuple[float, float], gaps: np.ndarray | None = None) -> np.ndarray:
    """Per-channel linear stretch of (h, w, 3) values between two percentiles, to uint8; pixels at ``gaps``
    (no data) are black and take no part in the percentiles."""
    out = np.zeros(values.shape, dtype=np.uint8)
    for c in range(values.shape[-1]):
        v = values[..., c].astype(np.float64)
        data = v if gaps is None else v[~gaps]
        if not data.size:  # every sampled pixel is nodata (a thin swath seen every ``step`` pixels): all black
            break
        lo, hi = np.percentile(data, percentiles)
        if hi > lo:
            out[..., c] = np.round(np.clip((v - lo) / (hi - lo), 0.0, 1.0) * 255.0).astype(np.uint8)
    if gaps is not None:
        out[gaps] = 0
    return out


@dataclass(frozen=True)
class PreviewPanels:
    """The three panels of a preview, each (h, w, 3) uint8 RGB, sampled every ``step`` scene pixels.

    ``class_legend`` holds ``(label, name, colour, pixel count)`` for each class present in the scene,
    ``split_legend`` holds ``(split name, legend text, colour, pixel count)`` for each split present.
    """

    rgb: np.ndarray
    classes: np.ndarray
    splits: np.ndarray
    bands: tuple[int, int, int]
    band_note: str
    step: int
    class_legend: list[tuple[int, str, tuple[int, ...], int]]
    split_legend: list[tuple[str, str, tuple[int, int, int], int]]


def preview_panels(scene, bands: tuple[int, ...] | list[int] | None = None,
                   percentiles: tuple[float, float] = (2.0, 98.0), max_size: int = 1024) -> PreviewPanels:
    """Compute the preview panels of a scene (an open :class:`~hsgds.scene.Scene` or a store path).

    Parameters
    ----------
    bands
        (red, green, blue) band indices; default: see :func:`pick_bands`.
    percentiles
        Lower and upper percentile of each channel mapped to 0 and 255.
    max_size
        Scenes larger than this (pixels along the longer side) are sampled every ``step`` pixels, with
        the smallest ``step`` that fits; every tile is still read once.
    """
    from hsgds.scene import Scene, open_scene

    if not isinstance(scene, Scene):
        scene = open_scene(scene)
    try:
        lo, hi = (float(p) for p in percentiles)
    except (TypeError, ValueError):
        raise InputError(f"percentiles must be two numbers (low, high), got {shown(percentiles)}") from None
    if not 0.0 <= lo < hi <= 100.0:
        raise InputError(f"percentiles must satisfy 0 <= low < high <= 100, not {lo:g}, {hi:g}")
    # (int() would take 2 for 2.5 and fail in a traceback for None or inf)
    if isinstance(max_size, (bool, np.bool_)) or not isinstance(max_size, (int, np.integer)) or max_size < 1:
        raise InputError(f"max_size must be an integer >= 1, not {shown(max_size)}")
    h, w, b = scene.shape
    step = max(1, math.ceil(max(h, w) / int(max_size)))
    picked, note = pick_bands(b, scene.wavelengths, bands, scene.bad_bands)
    rows, cols = np.arange(0, h, step), np.arange(0, w, step)

    # false colour: each tile read once; keep its core pixels on the sampling grid, three bands
    values = np.empty((len(rows), len(cols), 3), dtype=scene.dtype)
    g = scene.grid
    band_idx = list(picked)
    for tile_id in range(g.num_tiles):
        y0, y1, x0, x1 = g.core_window(tile_id)
        ry = np.nonzero((rows >= y0) & (rows < y1))[0]
        rx = np.nonzero((cols >= x0) & (cols < x1))[0]
        if len(ry) == 0 or len(rx) == 0:
            continue
        tile = scene.read_tile(tile_id)
        ty = rows[ry] - y0 + g.halo
        tx = cols[rx] - x0 + g.halo
        values[ry[0]:ry[-1] + 1, rx[0]:rx[-1] + 1] = tile[np.ix_(ty, tx, band_idx)]
    rgb = _stretch(values, (lo, hi), scene.nodata_every(step))  # the tiles hold a fill where there was no data

    # class map
    labels = scene.labels.astype(np.int64)
    k = max(scene.num_classes, int(labels.max(initial=0)))
    lut = class_colours(k)
    classes = lut[labels[::step, ::step]]
    counts = np.bincount(labels.ravel(), minlength=k + 1)
    names = scene.class_names
    class_legend = [(c, names[c - 1] if names and c <= len(names) else f"class {c}",
                     tuple(int(v) for v in lut[c]), int(counts[c]))
                    for c in range(1, k + 1) if counts[c]]

    # split map: from the sample table (every labelled pixel has one entry)
    split_codes = np.full((h, w), -1, dtype=np.int16)
    table = scene.sample_table()
    ys, xs, _ = scene.samples(None)
    split_codes[ys, xs] = table["split"]
    split_lut = np.zeros((len(fmt.SPLIT_CODES) + 1, 3), dtype=np.uint8)  # row 0: unlabelled (-1 + 1)
    split_lut[0] = UNLABELLED
    for name, code in fmt.SPLIT_CODES.items():
        split_lut[code + 1] = SPLIT_COLOURS[name]
    splits = split_lut[split_codes[::step, ::step] + 1]
    split_counts = {name: int(c.sum()) for name, c in
                    fmt.split_class_counts(table["split"], table["label"], scene.num_classes).items()}
    split_legend = [(name, _SPLIT_LABELS[name], SPLIT_COLOURS[name], split_counts[name])
                    for name in ("train", "val", "test", "none") if split_counts[name]]
    return PreviewPanels(rgb=rgb, classes=classes, splits=splits, bands=picked, band_note=note, step=step,
                         class_legend=class_legend, split_legend=split_legend)


MIN_DPI, MAX_DPI = 10, 600  # 600 dpi: a figure ~7,500 pixels wide (~200 MB to render); far beyond, memory runs out


class GlyphWarning(HsgdsWarning):
    """Texts of an image (class or scene names) hold characters its font lacks: they show as boxes."""


# matplotlib's warning, one per character and drawing, each two lines on stderr: "Glyph 22303 (\N{CJK UNIFIED
# IDEOGRAPH-571F}) missing from font(s) DejaVu Sans." (before 3.6: "Glyph 22303 missing from current font.")
_MISSING_GLYPH = re.compile(r"Glyph (\d+)\b.* missing from (?:font\(s\) (.+)|current font)\.$", re.DOTALL)
_GLYPHS_SHOWN = 8


@contextmanager
def glyphs_warned_once(out: str | os.PathLike) -> Iterator[None]:
    """Draw image ``out`` inside: matplotlib's warnings of characters its font lacks are gathered into one
    :class:`GlyphWarning` naming them, issued at the end; any other warning is issued as it was."""
    caught: list[warnings.WarningMessage] = []
    missing: dict[str, None] = {}
    fonts: dict[str, None] = {}
    try:
        with warnings.catch_warnings(record=True) as recording:
            warnings.filterwarnings("always", message=r"Glyph \d+", category=UserWarning)  # every character
            try:
                yield
            finally:
                caught = list(recording)
    finally:  # after the recording ends: a warning issued inside it would be recorded again
        for w in caught:
            found = _MISSING_GLYPH.match(str(w.message)) if issubclass(w.category, UserWarning) else None
            if found is None:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
                continue
            missing[chr(int(found.group(1)))] = None
            fonts[found.group(2) or "matplotlib's font"] = None
    if missing:  # (only for an image written: a failed one's error is what matters)
        chars = listed((repr(c) for c in missing), _GLYPHS_SHOWN)
        warnings.warn(f"the names drawn in {Path(out).name} hold characters the font ({', '.join(fonts)}) lacks: "
                      f"{chars}; they show as boxes (name a font that has them first in matplotlib's "
                      "font.sans-serif, e.g. in a matplotlibrc)", GlyphWarning, stacklevel=3)


def render_preview(scene, out: str | os.PathLike, *, bands: tuple[int, ...] | list[int] | None = None,
                   percentiles: tuple[float, float] = (2.0, 98.0), max_size: int = 1024,
                   dpi: int = 120) -> Path:
    """Write the preview image (format from the file suffix: .png, .pdf, .svg, ...) and return its path.

    Needs matplotlib: ``pip install "hsgds[preview]"`` (raises :class:`~hsgds.errors.DependencyError`
    naming that extra when it is missing).
    """
    from hsgds.scene import Scene, open_scene

    require("matplotlib", "preview", "hsgds preview")
    figure_mod = require("matplotlib.figure", "preview", "hsgds preview")
    patches = require("matplotlib.patches", "preview", "hsgds preview")
    agg = require("matplotlib.backends.backend_agg", "preview", "hsgds preview")

    out = as_path(out, "out")
    formats = agg.FigureCanvasAgg(figure_mod.Figure()).get_supported_filetypes()
    if out.suffix.lower().lstrip(".") not in formats:
        raise InputError(f"cannot write a preview as {out.name!r}: name it with one of the suffixes "
                         f"{', '.join('.' + f for f in ('png', 'pdf', 'svg') if f in formats)}")
    check_writable(out)  # before every tile is read for the panels
    if isinstance(dpi, bool) or not isinstance(dpi, (int, float)) or not MIN_DPI <= dpi <= MAX_DPI:
        raise InputError(f"dpi must be a number in {MIN_DPI}..{MAX_DPI}, got {dpi!r}")
    if not isinstance(scene, Scene):
        scene = open_scene(scene)
    panels = preview_panels(scene, bands=bands, percentiles=percentiles, max_size=max_size)
    ph, pw = panels.rgb.shape[:2]
    panel_w = 4.0
    panel_h = max(1.0, min(8.0, panel_w * ph / pw))
    fig = figure_mod.Figure(figsize=(3 * panel_w + 0.6, panel_h + 2.4), dpi=dpi, layout="constrained")
    fig.get_layout_engine().set(w_pad=0.1, wspace=0.03)
    agg.FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    h, w, b = scene.shape
    sampled = f", every {panels.step} px" if panels.step > 1 else ""
    fig.suptitle(f"{scene.path.name}: {h}x{w}x{b} {scene.dtype}{sampled}", fontsize=11)

    def patch(colour: tuple[int, ...], text: str):
        return patches.Patch(facecolor=tuple(c / 255 for c in colour), edgecolor="black", linewidth=0.4,
                             label=text)

    lo, hi = percentiles
    titles = (f"false colour\n{panels.band_note}\nstretch {lo:g}-{hi:g} %",
              f"classes ({len(panels.class_legend)})", "split")
    images = (panels.rgb, panels.classes, panels.splits)
    for ax, image, title in zip(axes, images, titles):
        ax.imshow(image, interpolation="nearest")
        ax.set_title(title, fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    class_handles = [patch(colour, f"{c} {name} ({n})") for c, name, colour, n in panels.class_legend]
    class_handles.append(patch(UNLABELLED, "unlabelled"))
    split_handles = [patch(colour, f"{text} ({n})") for _, text, colour, n in panels.split_legend]
    split_handles.append(patch(UNLABELLED, "unlabelled"))
    legend_kw = dict(loc="upper center", bbox_to_anchor=(0.5, -0.02), fontsize=6.5, frameon=False,
                     handlelength=1.2, columnspacing=0.8)
    axes[1].legend(handles=class_handles, ncol=2 if len(class_handles) > 6 else 1, **legend_kw)
    axes[2].legend(handles=split_handles, ncol=1, **legend_kw)
    texts_as_written(fig)
    # written beside the target and renamed over it: a write that fails (disk full) or is interrupted leaves
    # no truncated image, and a preview already there stays as it was
    try:
        with glyphs_warned_once(out), atomic_path(out) as tmp:
            fig.savefig(tmp, format=out.suffix.lower().lstrip("."), bbox_inches="tight")
    except OSError as exc:
        raise InputError(f"cannot write {out} ({exc.strerror or exc}); free space on its disk or choose another "
                         "output path") from None
    return out
