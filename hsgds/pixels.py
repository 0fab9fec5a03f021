"""Which pixels a loader yields from one scene: its labelled samples, or every s-th pixel.

Both give a :class:`~hsgds.sampling.SampleSet` sorted by tile (a tile's samples are one slice), built
with whole-array numpy operations (no Python per pixel). ``pixels="all"`` is what self-supervised
training and full-scene inference read: every ``stride``-th row and column of the scene, labelled or not
(label -1 where unlabelled), in raster order inside each tile; borders come from the store's padding.
Pixels where the source had no data (format v3's ``nodata`` map) are never yielded: they are left out
like the labelled pixels of other splits.

Over many scenes, two sets stand in for the joined SampleSet without holding or reading every scene's
samples up front: :class:`GridSamples` (every s-th pixel, computed from the tile geometry) and
:class:`ListedSamples` (labelled samples, counted per tile in ``collection.json``, read per scene).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np
from scipy.ndimage import maximum_filter

from hsgds import defaults
from hsgds import format as fmt
from hsgds._lru import LruCache
from hsgds.collection import DeferredScene
from hsgds.errors import StoreError
from hsgds.sampling import SampleSet
from hsgds.scene import Scene, check_mask

__all__ = ["PIXELS", "GridSamples", "ListedSamples", "all_pixels", "check_mask", "excluded_pixels", "excluded_runs",
           "labelled_pixels", "listed_samples_apply"]

PIXELS = ("labelled", "all")


def labelled_pixels(scene: Scene | DeferredScene, split: str | None, mask: np.ndarray | None = None) -> SampleSet:
    """The store's labelled samples of ``split`` (None: all of them), optionally restricted by ``mask``."""
    return scene.sample_set(split, mask)


def all_pixels(scene: Scene | DeferredScene, stride: int = 1, split: str | None = None,
               mask: np.ndarray | None = None, guard: int = 0) -> SampleSet:
    """Every ``stride``-th pixel (rows and columns, from 0, in scene coordinates), labelled or not, where
    the source had data (nodata pixels are left out).

    ``split`` drops the labelled pixels of other splits (unlabelled pixels stay: they belong to no
    split), so e.g. ``split="train"`` never shows a validation or test pixel; with ``guard`` r > 0 it also
    drops the pixels within r of one (Chebyshev distance: a (2r+1)-pixel patch centred there would show it).
    ``mask`` (H, W) keeps only the pixels where it is True. Order: tile by tile, raster order inside each tile.
    """
    # the pixels GridSamples computes (less the other splits' labelled ones), all of them, then masked
    every = GridSamples([scene.grid], stride, [sampled_labels(scene, stride)],
                        [excluded_pixels(scene, stride, split, guard)])
    tile, _, _, label, sy, sx = every.take(np.arange(len(every)))
    if mask is not None:
        keep = mask[sy, sx]
        tile, sy, sx, label = tile[keep], sy[keep], sx[keep], label[keep]
    return scene.samples_at(tile.astype(np.int64), sy, sx, label)


def excluded_pixels(scene: Scene | DeferredScene, stride: int, split: str | None, guard: int = 0
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The pixels of the ``stride`` lattice that :class:`GridSamples` leaves out of a scene: the labelled
    pixels of splits other than ``split`` (with ``guard`` r, every pixel within r of one), and the pixels
    where the source had no data. Returned as runs (tile, first lattice index within the tile, length),
    see :func:`excluded_runs`; None when nothing is left out (no split or no labels, and no nodata pixel).

    Reads the scene's sample table (with a split) and its nodata map at the lattice (when it has nodata
    pixels: a collection's scene is opened for it unless its entry lists none); while it runs, memory per
    left-out pixel of this one scene (with ``guard``, also a byte per scene pixel for the guarded map).
    """
    g = scene.grid
    tiles, ys, xs = [], [], []
    if split is not None and scene.num_samples:
        code = fmt.SPLIT_CODES.get(split)
        if code is None:
            scene.split_mask(np.zeros(0, np.uint8), split)  # raises the one-line unknown-split error
        table = scene.sample_table()
        other = table["split"] != code
        tile = table["tile"][other].astype(np.int64)
        ty, tx = np.divmod(tile, g.ntx)
        sy, sx = ty * g.tile + table["y"][other], tx * g.tile + table["x"][other]
        if guard > 0:  # every lattice pixel whose (2 guard + 1) footprint holds one of them
            near = np.zeros(scene.shape[:2], bool)
            near[sy, sx] = True
            near = maximum_filter(near, size=2 * guard + 1, mode="constant", cval=False)
            ly, lx = np.nonzero(near[::stride, ::stride])
            sy, sx = ly.astype(np.int64) * stride, lx.astype(np.int64) * stride
            tile = sy // g.tile * g.ntx + sx // g.tile
        on = (sy % stride == 0) & (sx % stride == 0)
        tiles.append(tile[on])
        ys.append(sy[on])
        xs.append(sx[on])
    nodata = scene.nodata_every(stride) if scene.has_nodata else None
    if nodata is not None:  # the map at the lattice: its (i, j) is scene pixel (i * stride, j * stride)
        ly, lx = np.nonzero(nodata)
        sy, sx = ly.astype(np.int64) * stride, lx.astype(np.int64) * stride
        tiles.append(sy // g.tile * g.ntx + sx // g.tile)
        ys.append(sy)
        xs.append(sx)
    if not tiles:
        return None
    tile, sy, sx = (np.concatenate(a) for a in (tiles, ys, xs))
    y0, x0, _, nx, _, _ = _lattice(g, stride)
    return excluded_runs(tile, (sy - y0[tile]) // stride * nx[tile] + (sx - x0[tile]) // stride)


def excluded_runs(tile: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Left-out pixels given as (tile, lattice index within the tile), in any order and possibly repeated,
    as runs of consecutive indices: (tile, first index, length), sorted by tile then index. A nodata
    region crossing a tile is a few runs per lattice row, not one entry per pixel."""
    tile, index = np.asarray(tile, np.int64), np.asarray(index, np.int64)
    order = np.lexsort((index, tile))
    tile, index = tile[order], index[order]
    if len(tile):  # a pixel both of another split and nodata (a damaged store) is left out once
        fresh = np.ones(len(tile), bool)
        fresh[1:] = (tile[1:] != tile[:-1]) | (index[1:] != index[:-1])
        tile, index = tile[fresh], index[fresh]
    new = np.ones(len(tile), bool)
    new[1:] = (tile[1:] != tile[:-1]) | (index[1:] != index[:-1] + 1)
    starts = np.flatnonzero(new)
    return tile[starts], index[starts], np.diff(np.append(starts, len(tile)))


def sampled_labels(scene: Scene | DeferredScene, stride: int) -> Callable[[], np.ndarray] | None:
    """What :class:`GridSamples` reads a scene's labels with, when it first needs them (None: the scene
    has no labelled pixel); a collection's scene is not opened before then."""
    if not scene.num_samples:
        return None
    return lambda: scene.labels_every(stride)


class _PerTileSamples(ABC):
    """What :class:`GridSamples` and :class:`ListedSamples` share: samples sorted by tile, found through the
    per-tile ``offsets`` table (tile t holds samples offsets[t]:offsets[t + 1]); ``take`` is theirs."""

    offsets: np.ndarray
    _per_scene: LruCache  # what each scene's samples are taken from (label map or sample set), by scene

    def keep_scenes(self, n: int) -> None:
        """Keep what was read for at least the ``n`` most recently used scenes, over ``sample_cache_bytes``
        if need be: with ``n`` the ring's slots, the scenes of every resident tile stay read (each batch
        would read them again otherwise)."""
        self._per_scene.min_count = max(1, n)

    @abstractmethod
    def take(self, idx: np.ndarray) -> tuple[np.ndarray, ...]:
        """(tile, y, x, label, scene_y, scene_x) of the samples ``idx``."""

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def tile_of(self, idx: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, np.asarray(idx, dtype=np.int64), side="right") - 1

    @property
    def label(self) -> np.ndarray:
        """Every sample's class index (taken for all of them: memory per sample, every store read)."""
        return self.take(np.arange(len(self)))[3]


class GridSamples(_PerTileSamples):
    """Every ``stride``-th pixel of one or more scenes, tile by tile and in raster order inside a tile (what
    :func:`all_pixels` enumerates, then joined with global tile ids), computed for the samples asked for
    instead of stored: per tile only its first sampled pixel and its sampled rows and columns are kept,
    so a whole scene's (or an archive's) pixels cost memory per tile, not per pixel. Same interface as
    :class:`~hsgds.sampling.SampleSet` where the loader and the epoch plan use it (``len``, ``offsets``,
    ``counts``, ``take``, ``tile_of``); ``labels`` give each scene's label map at the sampled pixels,
    ``labels[::stride, ::stride]`` (None: unlabelled), read when a sample of that scene is first taken.

    ``excluded`` (per scene, or None): sampled pixels left out, the labelled pixels of other splits and
    the source's nodata pixels (:func:`excluded_pixels`), as runs (tile, first lattice index, length) or
    as (tile, lattice index) pairs, one per pixel (made into runs scene by scene). They cost memory per
    run of consecutive left-out pixels in a tile's raster order (12 bytes each; the rest still per tile):
    a nodata region (the border of a rotated swath) costs about one run per lattice row it crosses in each
    tile, a whole nodata tile one run, an isolated left-out pixel one run. With ``s_r`` each run's first
    index and ``b_r`` the pixels of the tile's runs before it, the k-th pixel kept in a tile is its lattice
    index k plus the lengths of the tile's runs with ``s_r - b_r <= k``.
    """

    def __init__(self, grids: list[fmt.TileGrid], stride: int, labels: list[Callable[[], np.ndarray] | None],
                 excluded: list[tuple[np.ndarray, ...] | None] | None = None) -> None:
        self._y0, self._x0, self._ny, self._nx, self._oy, self._ox = (
            np.concatenate(col) for col in zip(*(_lattice(g, stride) for g in grids)))
        self._scene = np.repeat(np.arange(len(grids), dtype=np.int32), [g.num_tiles for g in grids])
        per_tile = self._ny * self._nx
        self._skip: np.ndarray | None = None  # per excluded run: tile * span + (s_r - b_r), sorted
        runs = [excluded_runs(*e) if len(e) == 2 else e for e in (excluded or []) if e is not None]
        if any(len(r[0]) for r in runs):
            first = np.concatenate([[0], np.cumsum([g.num_tiles for g in grids])])
            at = [s for s, e in enumerate(excluded or []) if e is not None]
            # scene after scene, each sorted by (tile, index): the joined runs stay sorted
            tile = np.concatenate([r[0] + first[s] for s, r in zip(at, runs)])
            start, length = (np.concatenate([np.asarray(r[i], np.int64) for r in runs]) for i in (1, 2))
            self._span = int(per_tile.max()) + 1
            self._run_start = fmt.tile_offsets(tile, len(per_tile))  # each tile's first run
            done = np.concatenate([[0], np.cumsum(length)])  # excluded pixels before each run, all tiles
            base = done[self._run_start[tile]]  # ... before its tile's first run
            self._skip = tile * self._span + (start - (done[:-1] - base))
            through = done[1:] - base  # its tile's excluded pixels up to the end of the run
            self._through = through.astype(np.int32 if self._span < 2**31 else np.int64)
            per_tile = per_tile - np.diff(done[self._run_start])
        self.offsets = np.concatenate([[0], np.cumsum(per_tile)]).astype(np.int64)
        self._stride, self._label_of = int(stride), labels
        self._per_scene = _per_scene_cache()  # label maps
        self._wide = len(self._scene) > np.iinfo(np.int32).max

    def take(self, idx: np.ndarray) -> tuple[np.ndarray, ...]:
        """(tile, y, x, label, scene_y, scene_x) of the samples ``idx``: y, x in the tile's padded
        coordinates, label the class index (-1 where unlabelled)."""
        idx = np.asarray(idx, dtype=np.int64)
        tile = self.tile_of(idx)
        k = idx - self.offsets[tile]
        if self._skip is not None:  # past the excluded runs before it in its tile
            r = np.searchsorted(self._skip, tile * self._span + k, side="right") - 1
            k = k + np.where(r >= self._run_start[tile], self._through[np.maximum(r, 0)], 0)
        row, col = np.divmod(k, self._nx[tile])
        sy, sx = self._y0[tile] + self._stride * row, self._x0[tile] + self._stride * col
        label = np.full(len(idx), -1, dtype=np.int32)
        if any(lab is not None for lab in self._label_of):
            scene = self._scene[tile]
            for s in np.unique(scene):
                if self._label_of[s] is not None:
                    at = scene == s
                    label[at] = self._labels(s)[sy[at] // self._stride, sx[at] // self._stride].astype(np.int32) - 1
        return (tile if self._wide else tile.astype(np.int32), (sy - self._oy[tile]).astype(np.int32),
                (sx - self._ox[tile]).astype(np.int32), label, sy.astype(np.int32), sx.astype(np.int32))

    def left_out(self) -> bytes:
        """Which pixels are left out, as the runs' lookup holds them (empty when none is): the same counts
        per tile can leave out other pixels (a store re-split), which a saved position must tell apart."""
        if self._skip is None:
            return b""
        return np.ascontiguousarray(self._skip, np.int64).tobytes() + np.ascontiguousarray(self._through, np.int64).tobytes()

    def _labels(self, s: int) -> np.ndarray:
        """Scene s's labels at the sampled pixels (the grid of multiples of the stride)."""
        read = self._label_of[s]
        assert read is not None  # take() asks only for labelled scenes
        return self._per_scene.get(s, read)


def _per_scene_cache() -> LruCache:
    """Label maps or sample sets by scene, read on first use and kept up to ``sample_cache_bytes`` (an epoch
    over an archive visits thousands of scenes; what was dropped is read again when next used)."""
    return LruCache(max_bytes=int(defaults.get("sample_cache_bytes")))


@functools.lru_cache(maxsize=64)  # an archive's scenes share a few grids
def _lattice(g: fmt.TileGrid, stride: int) -> tuple[np.ndarray, ...]:
    """Per tile of grid ``g``: the scene row and column of its first sampled pixel (multiples of
    ``stride``), its sampled rows and columns, and its padded origin (row, column). Shared: not to be
    modified."""
    ty, tx = np.divmod(np.arange(g.num_tiles, dtype=np.int64), g.ntx)
    y0, ny = _sampled(ty * g.tile, np.minimum((ty + 1) * g.tile, g.height), stride)
    x0, nx = _sampled(tx * g.tile, np.minimum((tx + 1) * g.tile, g.width), stride)
    return y0, x0, ny, nx, ty * g.tile - g.halo, tx * g.tile - g.halo


def _sampled(lo: np.ndarray, hi: np.ndarray, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """First multiple of ``stride`` in each [lo, hi) and how many there are (0 for none)."""
    first = -(-lo // stride) * stride
    return first, np.maximum(0, -(-(hi - first) // stride))


class ListedSamples(_PerTileSamples):
    """A collection's samples counted per tile from ``collection.json`` (each entry's ``tile_samples``) and
    read from a scene's store only when a sample of that scene is first taken, so a loader over an archive
    starts without opening a store: with ``pixels="labelled"`` the labelled samples of ``split``; with
    ``pixels="all"`` every pixel but the labelled ones of other splits and those without data (stride 1: the
    listing counts labelled and nodata pixels per tile, not a stride's lattice).
    The samples and their order are those of the scenes' own sample sets joined scene after scene (what the
    loader builds from opened stores); same interface as :class:`GridSamples`.
    """

    def __init__(self, scenes: list[DeferredScene], names: list[str], split: str | None,
                 pixels: str = "labelled") -> None:
        if split is not None and split not in fmt.SPLIT_CODES:
            Scene.split_mask(np.zeros(0, np.uint8), split)  # raises the one-line unknown-split error
        if pixels == "labelled":
            per_scene = [_listed_counts(s, split) for s in scenes]
        else:  # each tile's pixels less the labelled ones of the other splits and those without data
            per_scene = [_pixels_per_tile(s.grid) - _listed_counts(s, split, others=True)
                         - (0 if s.tile_nodata is None else np.asarray(s.tile_nodata, np.int64)) for s in scenes]
        self._pixels = pixels
        tiles = np.array([len(c) for c in per_scene], dtype=np.int64)
        self._scene_of_tile = np.repeat(np.arange(len(scenes), dtype=np.int64), tiles)
        self.offsets = np.concatenate([[0], np.cumsum(np.concatenate(per_scene))]).astype(np.int64)
        self._first = self.offsets[np.concatenate([[0], np.cumsum(tiles)])]  # each scene's first sample
        self._wide = len(self._scene_of_tile) > np.iinfo(np.int32).max
        self._scenes, self._names, self._split, self._counts = scenes, names, split, per_scene
        self._per_scene = _per_scene_cache()  # sample sets

    def take(self, idx: np.ndarray) -> tuple[np.ndarray, ...]:
        """(tile, y, x, label, scene_y, scene_x) of the samples ``idx``, tile ids global."""
        idx = np.asarray(idx, dtype=np.int64)
        tile = self.tile_of(idx)
        scene = self._scene_of_tile[tile]
        y, x, sy, sx = (np.empty(len(idx), np.int32) for _ in range(4))
        label = np.empty(len(idx), np.int32)
        for s in np.unique(scene).tolist():
            at = scene == s
            local = idx[at] - self._first[s]
            got = self._set(s)
            y[at], x[at], label[at] = got.y[local], got.x[local], got.label[local]
            sy[at], sx[at] = got.scene_y[local], got.scene_x[local]
        return tile if self._wide else tile.astype(np.int32), y, x, label, sy, sx

    def _set(self, s: int) -> SampleSet:
        """Scene s's samples of the split, from its store (when not kept since last read) and checked
        against its listing."""
        return self._per_scene.get(s, lambda: self._read_set(s))

    def _read_set(self, s: int) -> SampleSet:
        scene = self._scenes[s]
        got = scene.sample_set(self._split) if self._pixels == "labelled" else all_pixels(scene, 1, self._split)
        if not np.array_equal(got.counts(), self._counts[s]):
            raise StoreError(f"scene {self._names[s]!r} ({scene.path}): its labelled samples differ from "
                             "collection.json (the store was re-split or replaced after the collection was "
                             "written); re-split through the collection (`hsgds resplit COLLECTION ...` re-splits "
                             "every scene and lists the new counts), or run `hsgds convert-many` again (it "
                             "converts the store again with the manifest's split)")
        return got


def listed_samples_apply(scenes: tuple[Scene | DeferredScene, ...], pixels: str = "labelled") -> bool:
    """Whether :class:`ListedSamples` can give these scenes' samples without opening a store: every scene is
    a collection's, not opened yet, and its entry lists its samples per tile (or it has none); with
    ``pixels="all"`` also its nodata pixels per tile (or that it has none)."""
    return all(isinstance(s, DeferredScene) and not s.is_open and (s.tile_samples is not None or not s.num_samples)
               and (pixels == "labelled" or s.nodata_pixels == 0 or s.tile_nodata is not None) for s in scenes)


def _listed_counts(scene: DeferredScene, split: str | None, others: bool = False) -> np.ndarray:
    """Each tile's number of labelled samples of ``split`` (None: of every split), or with ``others`` of
    the other splits, from the scene's entry."""
    counts = np.zeros(scene.grid.num_tiles, np.int64)
    for name, listed in (scene.tile_samples or {}).items():
        if (split is None or name == split) != others:
            counts += listed
    return counts


def _pixels_per_tile(g: fmt.TileGrid) -> np.ndarray:
    """Each tile's number of scene pixels (its core, clipped to the scene)."""
    _, _, ny, nx, _, _ = _lattice(g, 1)
    return ny * nx
