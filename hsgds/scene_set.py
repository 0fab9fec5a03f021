"""The scenes one loader reads: resolved from its ``store`` argument, checked to fit together, and turned
into the tables below the loader works with (global tile ids, band selection, normalization).

A loader over several scenes gives every tile a global id (the scene's first id + its tile id): the epoch
plan, the ring and the reader work on global ids only, and the engine reads per-scene tables
(:class:`~hsgds.engines.base.SceneTables`: tile geometry, band index, offset/scale) on the device.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsgds import format as fmt
from hsgds._wording import counted, listed
from hsgds.augment import Augment
from hsgds.collection import Collection, DeferredScene, is_collection_path, open_collection
from hsgds.engines.base import SceneTables
from hsgds.errors import ConfigError, shown
from hsgds.io.base import TileSource
from hsgds.scene import BandStats, Scene, open_scene

__all__ = ["NORM_SCOPES", "SceneSet", "band_selection", "check_output_range", "checked_stats", "normalization",
           "normalization_rows", "open_scene_set", "pooled_stats", "scene_bands", "shared_stats"]

NORM_SCOPES = ("scene", "collection")
_LISTED = 12  # scenes named in a mismatch message before "... and N more"
# radiation noise adds noise_std * n, n from the augmentation's bank of normals: Box-Muller on 24-bit
# uniforms never gives |n| above sqrt(2 * 24 * ln 2) = 5.77, so 8 standard deviations bound it with room
NOISE_BOUND = 8.0


@dataclass(frozen=True)
class SceneSet:
    """Scenes in the loader's order, their names, and whether the input was a collection (several stores,
    or a collection path) rather than one store."""

    scenes: tuple[Scene | DeferredScene, ...]  # a collection's scenes are opened as the loader reaches them
    names: tuple[str, ...]
    is_collection: bool

    def __len__(self) -> int:
        return len(self.scenes)

    def tile_starts(self) -> np.ndarray:
        """Global id of each scene's first tile, and the total tile count last ((S + 1,) int64)."""
        return np.concatenate([[0], np.cumsum([s.grid.num_tiles for s in self.scenes])]).astype(np.int64)

    def tile_scene(self) -> np.ndarray:
        """The scene index of every global tile id (int32)."""
        counts = [s.grid.num_tiles for s in self.scenes]
        return np.repeat(np.arange(len(counts), dtype=np.int32), counts)

    def tile_source(self) -> TileSource:
        """Where every tile lives: of a collection's scenes, found when a tile is first read (the store is
        opened then, on the reader's thread, and checked against its entry)."""
        scenes = self.scenes
        if any(isinstance(s, DeferredScene) and not s.is_open for s in scenes):
            sizes = np.repeat([s.grid.tile_nbytes for s in scenes], np.diff(self.tile_starts())).tolist()
            v2 = all(isinstance(s, DeferredScene) and (s.format_version or 1) >= 2 for s in scenes)
            return TileSource.deferred(self.tile_starts().tolist(), sizes,
                                       lambda i: TileSource.from_scene(_opened(scenes[i])), v2)
        if len(scenes) == 1:
            return TileSource.from_scene(_opened(scenes[0]))
        return TileSource.concat([TileSource.from_scene(_opened(s)) for s in scenes])

    def check(self) -> None:
        """Refuse scenes that cannot be cut into one batch: mixed dtypes or classes. (Band counts are checked
        with the band selection; tile geometries may differ.)"""
        if len(self.scenes) == 1:
            return
        _same(self, "dtype", lambda s: str(s.dtype), "convert them with one --dtype (e.g. hsgds convert --dtype float32; "
              "a collection: the same hsgds convert-many command with --dtype float32)")
        labelled = [(n, s) for n, s in zip(self.names, self.scenes) if s.class_names or s.num_classes]
        if labelled:
            # each scene's own key (names, or the count of a scene without names): a scene with names and
            # one without disagree, whichever comes first
            def key(s: Any) -> Any:
                return tuple(s.class_names) if s.class_names else s.num_classes

            first = key(labelled[0][1])
            bad = [n for n, s in labelled if key(s) != first]
            if bad:
                names = next((s.class_names for _, s in labelled if s.class_names), None)
                fix = "load scenes with the same classes together"
                if names is not None and any(not s.class_names for _, s in labelled):
                    # the names to give, ready to paste (unless a name holds the list's own comma)
                    given = f" {','.join(names)}" if not any("," in n for n in names) else ""
                    fix = (f"convert the scenes without class names again with --class-names{given} (a collection: "
                           "the same convert-many command with it)")
                raise ConfigError(f"scenes disagree on their classes: {_names(bad)} differ from "
                                  f"{labelled[0][0]!r} ({_short(first)}); {fix}")


def _opened(scene: Scene | DeferredScene) -> Scene:
    return scene.open() if isinstance(scene, DeferredScene) else scene


def _names(names: Sequence[str]) -> str:
    return listed((repr(n) for n in names), _LISTED)


def _short(value: Any) -> str:
    text = str(list(value) if isinstance(value, tuple) else value)
    return text if len(text) < 120 else text[:117] + "..."


def _each(names: Sequence[str], values: Sequence[Any]) -> str:
    """Each scene's value; over more than ``_LISTED`` scenes, each value with its scenes' count and first names,
    so that every value is named whatever the order (41 int16 scenes listed first hid the 10 uint16 ones)."""
    if len(names) <= _LISTED:
        return listed((f"{n}: {v}" for n, v in zip(names, values)), _LISTED)
    groups: dict[str, list[str]] = {}
    for n, v in zip(names, values):
        groups.setdefault(str(v), []).append(n)
    return listed((f"{v} in {counted(len(ns), 'scene')} ({listed(ns, 3)})" for v, ns in groups.items()), _LISTED)


def _same(ss: SceneSet, what: str, key, fix: str) -> None:
    values = [key(s) for s in ss.scenes]
    if len(set(values)) > 1:
        raise ConfigError(f"scenes have different {what} ({_each(ss.names, values)}); {fix}")


def _scene_name(path: Path) -> str:
    return path.name[:-5] if path.name.endswith(".zarr") else path.name


def open_scene_set(store: Any) -> SceneSet:
    """Resolve a loader's ``store``: a store path, a Scene, a list of those, a :class:`Collection` or its path
    (a folder holding ``collection.json``, or that file)."""
    if isinstance(store, Scene):
        return SceneSet((store,), (_scene_name(store.path),), False)
    if isinstance(store, (str, os.PathLike)):
        path = Path(store)
        if is_collection_path(path):
            return _collection_scenes(open_collection(path))
        scene = open_scene(path)
        return SceneSet((scene,), (_scene_name(scene.path),), False)
    if isinstance(store, Collection):  # as hsgds.open_collection gave it: the same as its path
        return _collection_scenes(store)
    if isinstance(store, (list, tuple)):
        if not store:
            raise ConfigError("store is an empty list; pass at least one store path or Scene")
        scenes: list[Scene] = []
        for item in store:
            if not isinstance(item, (Scene, str, os.PathLike)):
                raise ConfigError(f"a list of stores holds store paths or Scenes, got {type(item).__name__}")
            scenes.append(item if isinstance(item, Scene) else open_scene(item))
        names = [_scene_name(s.path) for s in scenes]
        if len(set(names)) != len(names):  # same folder name in different places: name them by position
            names = [f"{i}:{n}" for i, n in enumerate(names)]
        return SceneSet(tuple(scenes), tuple(names), True)
    raise ConfigError(f"store must be a store path, a Scene, a list of them, a collection or its path, "
                      f"got {type(store).__name__}")


def _collection_scenes(coll: Collection) -> SceneSet:
    """A collection's scenes, deferred: nothing but collection.json is read now (stores are opened on first use)."""
    deferred = [coll.deferred(i) for i in range(len(coll))]
    listed: tuple[Scene | DeferredScene, ...] = (
        tuple(d for d in deferred if d is not None) if all(d is not None for d in deferred)
        else tuple(coll.scene(i) for i in range(len(coll))))
    if not listed:
        raise ConfigError(f"collection {coll.path} lists no scenes")
    return SceneSet(listed, tuple(coll.names), True)


def band_selection(ss: SceneSet, bands: Sequence[int] | None, wavelengths: Sequence[float] | None,
                   tolerance: float) -> list[np.ndarray] | None:
    """Each scene's stored band for each output band, or None when every scene gives all its bands.

    Raises
    ------
    ConfigError
        Different band counts without ``wavelengths``; a wavelength without a band within ``tolerance``;
        a band index out of range.
    """
    if bands is not None and wavelengths is not None:
        raise ConfigError("pass bands= (indices) or wavelengths= (nm), not both")
    check_tolerance(tolerance)  # also unused (no wavelengths): the loader keeps it as a float
    counts = [s.shape[2] for s in ss.scenes]
    if wavelengths is None and len(set(counts)) > 1:
        raise ConfigError(f"scenes have different band counts ({_each(ss.names, counts)}); pass wavelengths=[...] (nm) to "
                          "take each scene's band nearest each wavelength")
    if bands is None and wavelengths is None:
        _check_same_centres(ss, None, tolerance)
        return None
    if bands is not None:  # same-sensor scenes: one check, one array
        idx = scene_bands(ss.names[0], counts[0], None, bands, None, tolerance)
        _check_same_centres(ss, idx, tolerance)
        return [idx] * len(ss)
    picked = []
    for name, s in zip(ss.names, ss.scenes):
        try:
            picked.append(scene_bands(name, s.shape[2], s.wavelengths, bands, wavelengths, tolerance,
                                      bad=s.bad_bands))
        except ConfigError as exc:
            if len(ss) == 1 or not str(exc).endswith(_FAR_WAVELENGTH):
                raise
            # over an archive, raising the tolerance to pass this scene only meets the next: say what passes all
            raise ConfigError(f"{exc} ({_tolerance_for_all(ss, wavelengths or (), tolerance)})") from None
    return picked


def _check_same_centres(ss: SceneSet, bands: np.ndarray | None, tolerance: float) -> None:
    """Scenes taken band by band (all bands, or ``bands`` indices; no ``wavelengths``) must record the same
    centre at each band index, within ``tolerance`` nm (one sensor's flight lines differ by a fraction of a
    nm): two sensors with as many bands (224 each) would otherwise be mixed band i with band i, other
    wavelengths, silently. Scenes without centres are not compared."""
    rows = [(n, fmt.wavelength_array(s.wavelengths)) for n, s in zip(ss.names, ss.scenes) if s.wavelengths]
    if len(rows) < 2:
        return
    names = [n for n, _ in rows]
    nm = np.stack([r for _, r in rows])
    if bands is not None:
        nm = nm[:, bands]
    spread = np.nan_to_num(np.fmax.reduce(nm, axis=0) - np.fmin.reduce(nm, axis=0))  # NaN: no centres there
    if spread.max() <= tolerance:
        return
    b = int(np.argmax(spread))
    lo, hi = int(np.nanargmin(nm[:, b])), int(np.nanargmax(nm[:, b]))
    band = f"band {b}" if bands is None else f"bands[{b}] (band {int(bands[b])})"
    raise ConfigError(f"scenes record other band centres at the same band index ({band}: {nm[lo, b]:g} nm in "
                      f"{names[lo]!r}, {nm[hi, b]:g} nm in {names[hi]!r}; {int((spread > tolerance).sum())} of "
                      f"{len(spread)} bands differ by more than wavelength_tolerance={tolerance:g} nm), so band by band "
                      "they would mix other wavelengths; pass wavelengths=[...] (nm) to take each scene's band nearest "
                      f"each, or wavelength_tolerance={np.ceil(spread.max() * 10) / 10:g} to take them by index anyway")


def _tolerance_for_all(ss: SceneSet, wavelengths: Sequence[float], tolerance: float) -> str:
    """How many scenes lack a band within ``tolerance`` of some wavelength, and the tolerance that gives every
    scene (with band centres) a band near each: the farthest any nearest band is, rounded up to 0.1 nm."""
    want = np.asarray(wavelengths, dtype=np.float64)
    far = []
    for s in ss.scenes:
        nm = fmt.wavelength_array(() if s.wavelengths is None else s.wavelengths)
        nm[list(s.bad_bands or ())] = np.nan  # a band the source flags bad is never taken
        known = nm[~np.isnan(nm)]
        if known.size:
            far.append(float(np.abs(known[None, :] - want[:, None]).min(axis=1).max()))
    if not far:  # no scene has a good band with a centre: no tolerance helps
        return "no scene has a band with a centre that the source does not flag bad"
    missing = sum(f > tolerance for f in far)
    return (f"{missing} of {counted(len(ss), 'scene')} lack a band within {tolerance:g} nm of one; "
            f"wavelength_tolerance={np.ceil(max(far) * 10) / 10:g} gives each scene a band near every one")


#: what a loader's user can do about a wavelength a scene has no band near
_FAR_WAVELENGTH = "raise wavelength_tolerance or drop that wavelength"


#: what a loader's user can do about a wavelength whose only band near it the source flags bad
_BAD_WAVELENGTH = ("drop that wavelength, raise wavelength_tolerance to reach a good band, or pass bands= "
                   "(indices) to take the bad band on purpose")


def scene_bands(name: str, count: int, have: Sequence[float | None] | None, bands: Sequence[int] | None,
                wavelengths: Sequence[float] | None, tolerance: float, far: str = _FAR_WAVELENGTH,
                bad: Sequence[int] | None = None, bad_fix: str = _BAD_WAVELENGTH) -> np.ndarray:
    """The stored band of scene ``name`` (``count`` bands at wavelengths ``have``, None for a band without a
    centre) for each output band: ``bands`` (indices, taken as given, also those the source flags bad) or, for
    ``wavelengths`` (nm), its band nearest each within ``tolerance`` nm, never one without a centre (PRISMA's
    unused bands) nor one in ``bad`` (the bands the source flags bad: AVIRIS's water-vapour bands are noise).
    A one-line ConfigError says what does not fit and what to change (``far``: what, when a wavelength has
    no band near it; ``bad_fix``: when only a bad band is; a saved model's selection cannot be changed as a
    loader's can)."""
    if bands is not None:
        try:
            idx = np.asarray(bands)
        except (TypeError, ValueError):  # e.g. a ragged list: numpy's message names no option
            idx = np.empty(0)
        if idx.ndim != 1 or len(idx) == 0 or idx.dtype.kind not in "iu":
            raise ConfigError(f"bands must be a non-empty list of band indices, got {shown(bands, 120)}")
        if idx.min() < 0 or idx.max() >= count:
            raise ConfigError(f"bands must be in 0..{count - 1} (scene {name!r} has {count} bands), got {shown(bands, 120)}")
        return idx.astype(np.int64)
    try:
        want = np.asarray(wavelengths, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):  # e.g. ["abc"], a dict, an int past float: not numbers
        want = np.empty(0)
    if want.ndim != 1 or len(want) == 0 or not np.all(np.isfinite(want)):
        raise ConfigError(f"wavelengths must be a non-empty list of numbers (nm), got {shown(wavelengths, 120)}")
    check_tolerance(tolerance)
    nm = fmt.wavelength_array(() if have is None else have)
    known = np.flatnonzero(~np.isnan(nm))  # the bands with a centre: only they can be nearest
    if not known.size:
        raise ConfigError(f"scene {name!r} has no band wavelengths; convert it again with them (`hsgds convert "
                          "--wavelengths nm.txt`, or from an ENVI header that lists them) or select bands by index")
    lo, hi = nm[known].min(), nm[known].max()
    if lo < fmt.MIN_NM or hi > fmt.MAX_NM:
        # a store an older converter wrote from a header's micrometres labelled as nanometres (0.4-2.5 "nm")
        raise ConfigError(f"scene {name!r} records wavelengths {lo:g}-{hi:g}, which are no band centres "
                          f"in nm ({fmt.MIN_NM:g}-{fmt.MAX_NM:g}); convert it again (`hsgds convert --wavelengths "
                          "nm.txt`) or select bands by index")
    nearest = known[np.abs(nm[known][None, :] - want[:, None]).argmin(axis=1)]
    good = np.setdiff1d(known, np.asarray(bad if bad is not None else (), dtype=np.int64))
    if good.size:  # the nearest band the source does not flag bad (every band, when it flags none)
        taken = good[np.abs(nm[good][None, :] - want[:, None]).argmin(axis=1)]
        miss = np.abs(nm[taken] - want) > tolerance
    else:
        taken, miss = nearest, np.ones(len(want), bool)
    if miss.any():
        i = int(np.flatnonzero(miss)[0])
        j = int(nearest[i])
        if abs(nm[j] - want[i]) <= tolerance:  # a band is near, but flagged bad
            raise ConfigError(f"scene {name!r} has no good band within {tolerance:g} nm of {want[i]:g} nm: the "
                              f"nearest, band {j} ({nm[j]:g} nm), is flagged bad by the source (bbl); {bad_fix}")
        near = f"{nm[j]:g} nm"
        if good.size and j not in good:  # the nearest is bad: say which good one a tolerance has to reach
            near += f", flagged bad by the source; the nearest good band: {nm[taken[i]]:g} nm"
        raise ConfigError(f"scene {name!r} has no band within {tolerance:g} nm of {want[i]:g} nm (nearest: "
                          f"{near}); {far}")
    return taken.astype(np.int64)


def _fits_a_float(value: Any) -> bool:
    """Whether float(value) works (the loader keeps the tolerance as one: an int past it raised OverflowError)."""
    try:
        float(value)
    except OverflowError:
        return False
    return True


def check_tolerance(tolerance: Any) -> None:
    """A ConfigError unless ``tolerance`` is a real number >= 0 (Python's or numpy's, not a bool)."""
    if not (isinstance(tolerance, (int, float, np.integer, np.floating)) and not isinstance(tolerance, bool)
            and tolerance >= 0 and _fits_a_float(tolerance)):
        raise ConfigError(f"wavelength_tolerance must be a number >= 0 (nm), got {shown(tolerance)}")


def _train_count(scene: Scene) -> int:
    """Pixels the store's normalization statistics were computed from: its TRAIN samples, or every pixel
    with data when the scene has no train split (the converter's rule: nodata pixels are left out)."""
    if scene.stats["train"] is not None:
        return int(np.count_nonzero(scene.sample_table()["split"] == fmt.SPLIT_TRAIN))
    nodata = int(scene.meta.nodata["pixels"]) if scene.meta.nodata else 0
    return int(scene.shape[0] * scene.shape[1]) - nodata


def pooled_stats(parts: Sequence[tuple[int, BandStats]]) -> BandStats:
    """Exact statistics of the union of several pixel sets from their (count, stats): Chan et al.'s merge
    of counts, means and M2 (population variance), and min / max."""
    n = 0
    mean: np.ndarray | None = None  # None until the first set with pixels; then m2, lo, hi are arrays too
    m2: Any = None
    lo: Any = None
    hi: Any = None
    for count, st in parts:
        if count == 0:
            continue
        mu, var = np.asarray(st.mean, np.float64), np.asarray(st.std, np.float64) ** 2
        if mean is None:
            n, mean, m2 = count, mu.copy(), var * count
            lo, hi = np.asarray(st.min, np.float64), np.asarray(st.max, np.float64)
            continue
        total = n + count
        delta = mu - mean
        mean = mean + delta * (count / total)
        m2 = m2 + var * count + delta ** 2 * (n * count / total)
        lo, hi = np.minimum(lo, st.min), np.maximum(hi, st.max)
        n = total
    if mean is None:
        raise ConfigError("no scene has statistics to pool")
    return BandStats(mean=mean, std=np.sqrt(m2 / n), min=lo, max=hi)


def _select(st: BandStats, idx: np.ndarray | None) -> BandStats:
    if idx is None:
        return st
    return BandStats(*(np.asarray(a, np.float64)[idx] for a in (st.mean, st.std, st.min, st.max)))


def _offset_scale(st: BandStats, normalize: str) -> tuple[np.ndarray, np.ndarray]:
    if normalize == "zscore":
        offset, spread = np.asarray(st.mean, np.float64), np.asarray(st.std, np.float64)
    else:
        offset, spread = np.asarray(st.min, np.float64), np.asarray(st.max, np.float64) - np.asarray(st.min, np.float64)
    bad = ~(np.isfinite(offset) & np.isfinite(spread))
    if bad.any():  # an infinite spread would give a scale of 0, and inf * 0 patches of NaN
        b = int(np.flatnonzero(bad)[0])
        raise ConfigError(f"the band statistics are not finite ({int(bad.sum())} bands, e.g. output band {b}: "
                          f"offset {offset[b]:g}, spread {spread[b]:g}); the stored values are too large for them: "
                          "convert a rescaled cube, or pass normalize=None")
    if np.any(spread < 0):  # a negative std, or a max below the min: no data gives these, a damaged store does
        b = int(np.flatnonzero(spread < 0)[0])
        raise ConfigError(f"the band statistics are damaged (output band {b}: {'std' if normalize == 'zscore' else 'max - min'} "
                          f"{spread[b]:g} < 0); run `hsgds verify` and convert the source again")
    # a constant band carries no information: map it to 0 instead of dividing by zero
    scale = np.where(spread > 0, 1.0 / np.where(spread > 0, spread, 1.0), 1.0)
    return offset, scale


def shared_stats(ss: SceneSet, selection: list[np.ndarray] | None, scope: str,
                 given: Any = None) -> BandStats | None:
    """The one set of statistics (of the output bands) every scene is normalized with, when there is one:
    ``given`` (e.g. a training loader's ``norm_stats``), the train statistics pooled exactly over the scenes
    (``scope="collection"``; every store is read now), or the only scene's own. None when each of several
    scenes is normalized with its own (``scope="scene"``)."""
    bands = len(selection[0]) if selection is not None else ss.scenes[0].shape[2]
    if given is not None:
        if scope == "collection":
            raise ConfigError("pass norm_stats= (statistics to use) or norm_scope='collection' (pool the scenes'), "
                              "not both")
        return checked_stats(given, bands)
    if scope == "scene" and len(ss) > 1:
        return None
    picked = [_select(_opened(s).norm_stats, None if selection is None else selection[i])
              for i, s in enumerate(ss.scenes)]
    if len(ss) == 1:
        return picked[0]
    return pooled_stats([(_train_count(_opened(s)), st) for s, st in zip(ss.scenes, picked)])


def checked_stats(given: Any, bands: int) -> BandStats:
    """``given`` as float64 BandStats of ``bands`` bands, or a one-line ConfigError."""
    if not isinstance(given, BandStats):
        raise ConfigError(f"norm_stats must be an hsgds.BandStats (e.g. a training loader's .norm_stats), "
                          f"got {type(given).__name__}")
    arrays = {}
    for field in ("mean", "std", "min", "max"):
        a = np.asarray(getattr(given, field), dtype=np.float64)
        if a.shape != (bands,):
            raise ConfigError(f"norm_stats.{field} has shape {a.shape}, but the patches have {bands} bands; pass "
                              "the statistics of the bands the model was trained on")
        if not np.all(np.isfinite(a)):
            raise ConfigError(f"norm_stats.{field} holds a NaN or an infinity; pass finite statistics")
        arrays[field] = a
    if np.any(arrays["std"] < 0) or np.any(arrays["max"] < arrays["min"]):
        raise ConfigError("norm_stats has a negative std or a max below its min; pass statistics computed from data "
                          "(e.g. a training loader's .norm_stats)")
    return BandStats(**arrays)


def normalization(ss: SceneSet, normalize: str | None, selection: list[np.ndarray] | None,
                  shared: BandStats | None = None) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Per-scene (S, B) offset and scale: out = (x - offset) * scale, and the scenes whose rows are left
    for later (0 and 1 now): a collection's scenes not opened yet, whose rows :func:`normalization_rows`
    gives when the loader first reaches them.

    ``shared`` (see :func:`shared_stats`): the same row for every scene; None: each scene's own train
    statistics.
    """
    bands = len(selection[0]) if selection is not None else ss.scenes[0].shape[2]
    offset, scale = np.zeros((len(ss), bands)), np.ones((len(ss), bands))
    if normalize is None:
        return offset, scale, []
    if shared is not None:
        offset[:], scale[:] = _offset_scale(shared, normalize)
        return offset, scale, []
    later = [i for i, s in enumerate(ss.scenes) if isinstance(s, DeferredScene) and not s.is_open]
    now = sorted(set(range(len(ss))) - set(later))
    if now:
        offset[now], scale[now] = normalization_rows(ss, now, normalize, selection)
    return offset, scale, later


def normalization_rows(ss: SceneSet, scenes: Sequence[int], normalize: str, selection: list[np.ndarray] | None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """The (len(scenes), B) offset and scale rows of ``scenes`` (each scene's own statistics; a deferred
    scene's store is opened to read them)."""
    rows = [_offset_scale(_select(_opened(ss.scenes[i]).norm_stats, None if selection is None else selection[i]),
                          normalize) for i in scenes]
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


def scene_tables(ss: SceneSet, selection: list[np.ndarray] | None, offset: np.ndarray,
                 scale: np.ndarray) -> SceneTables:
    """The engine's per-scene tables."""
    side = np.array([s.grid.side for s in ss.scenes], dtype=np.int64)
    stride = np.array([s.grid.bands for s in ss.scenes], dtype=np.int64)
    if selection is None:
        band = np.broadcast_to(np.arange(stride[0], dtype=np.int64), (len(ss), int(stride[0]))).copy()
    else:
        band = np.stack(selection).astype(np.int64)
    return SceneTables(side=side, stride=stride, band=band, offset=offset, scale=scale)


def check_output_range(ss: SceneSet, i: int, selection: list[np.ndarray] | None, offset: np.ndarray,
                       scale: np.ndarray, dtype: torch.dtype, normalize: str | None, augment: Augment | None) -> None:
    """Refuse an output ``dtype`` that scene ``i``'s patches would overflow to inf: its (x - ``offset``) *
    ``scale`` (the rows it is normalized with) over the values its tiles hold, times the largest
    radiation scale plus :data:`NOISE_BOUND` noise standard deviations when radiation noise is on. From the
    per-band statistics alone: no pixel is read. A one-line ConfigError names the band and the fix."""
    scene = _opened(ss.scenes[i])
    # every pixel's statistics, not only the train ones: a patch holds its neighbours whatever their split,
    # and a tile normalized as it is read holds all its pixels
    st = scene.stats["all"]
    st = _select(scene.norm_stats if st is None else st, None if selection is None else selection[i])
    lo, hi = np.asarray(st.min, np.float64), np.asarray(st.max, np.float64)
    if scene.grid.halo > 0 and scene.meta.padding == "zero":  # the border's padding holds 0s too
        lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    normalized = np.maximum(np.abs((lo - offset) * scale), np.abs((hi - offset) * scale))
    radiated = augment is not None and augment.radiation_noise > 0
    gain, noise = 1.0, 0.0
    if augment is not None and radiated:  # alpha * x + noise_std * n, alpha at most radiation_scale's high
        gain, noise = augment.radiation_scale[1], NOISE_BOUND * augment.noise_std
    reach = normalized * gain + noise
    limit = float(torch.finfo(dtype).max)
    if not np.any(reach > limit):
        return
    b = int(np.argmax(reach))
    name = str(dtype).removeprefix("torch.")
    how = "not normalized" if normalize is None else f"normalized as (x - {offset[b]:.6g}) * {scale[b]:.6g}"
    if radiated:
        how += (f", then radiation noise (alpha up to {gain:g}, plus up to {NOISE_BOUND:g} x noise_std "
                f"{noise / NOISE_BOUND:g})")
    # the narrowest wider dtypes that hold the values: float32 or bfloat16, else float64
    wider = [d for d in ((torch.float32, torch.bfloat16), (torch.float64,))
             if dtype not in d and limit < float(torch.finfo(d[0]).max) and reach[b] <= float(torch.finfo(d[-1]).max)]
    fixes = [f"dtype={' or '.join(map(str, wider[0]))}"] if wider else []
    if normalize is None:
        fixes.append("normalize='zscore'")
    elif normalized[b] > limit:
        fixes.append("statistics of values like these (norm_stats=)")
    if radiated:
        fixes.append("a smaller Augment radiation_scale / noise_std")
    raise ConfigError(f"{name} patches would overflow to inf: output band {b} of scene {ss.names[i]!r} holds "
                      f"{lo[b]:g}..{hi[b]:g}, {how}, reaching {reach[b]:.4g} > {name}'s largest value {limit:.6g}; "
                      f"use {', or '.join(fixes)}")
