"""The epoch plan: which samples, in which order, from which tiles, for this rank.

Everything here is a pure function of (seed, epoch, rank, world size, window, ring slots), so an epoch
can be resumed exactly from a batch index, and every rank computes every other rank's share without
communicating. No plan holds an array per sample, nor makes one while planning beyond its first window:
an unshuffled one is a range, a shuffled one the tile bounds of its windows, each window shuffled by a
generator of its own when a batch first reads from it (:class:`WindowedOrder`), so its memory and its
planning time follow the tiles, not the pixels.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from hsgds._wording import counted
from hsgds.errors import ConfigError

#: what to change when a batch's tiles do not fit the ring
RING_ADVICE = ("raise ring_bytes (its default is capped by the ring_cpu_bytes and ring_gpu_fraction settings) "
               "or lower batch_size")


class Samples(Protocol):
    """What an epoch plan reads of a set of samples sorted by tile: :class:`SampleSet`, one computed per
    batch (:class:`hsgds.pixels.GridSamples`), or one read per scene as it is reached
    (:class:`hsgds.pixels.ListedSamples`)."""

    @property
    def offsets(self) -> np.ndarray:  # (tiles + 1,): tile t holds samples offsets[t]:offsets[t + 1]
        ...

    @property
    def label(self) -> np.ndarray:  # every sample's class index (-1: unlabelled)
        ...

    def __len__(self) -> int: ...

    def counts(self) -> np.ndarray: ...

    def tile_of(self, idx: np.ndarray) -> np.ndarray: ...

    def take(self, idx: np.ndarray) -> tuple[np.ndarray, ...]: ...


@dataclass(frozen=True)
class SampleSet:
    """The samples of one split, sorted by tile: tile id, centre (y, x) in the tile's padded
    coordinates, class index (stored label - 1), scene (y, x) of the centre, and a per-tile offset table."""

    tile: np.ndarray
    y: np.ndarray
    x: np.ndarray
    label: np.ndarray
    scene_y: np.ndarray
    scene_x: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.tile)

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays."""
        return sum(a.nbytes for a in (self.tile, self.y, self.x, self.label, self.scene_y, self.scene_x,
                                      self.offsets))

    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def take(self, idx: np.ndarray) -> tuple[np.ndarray, ...]:
        """(tile, y, x, label, scene_y, scene_x) of the samples ``idx``."""
        return (self.tile[idx], self.y[idx], self.x[idx], self.label[idx], self.scene_y[idx], self.scene_x[idx])

    def tile_of(self, idx: np.ndarray) -> np.ndarray:
        return self.tile[idx]


class Interval(NamedTuple):
    """A tile resident in the ring from batch ``first`` to batch ``last`` (inclusive). A named tuple: an
    archive's epoch makes one per tile, tens of thousands (a frozen dataclass took 3 µs each)."""

    tile: int
    first: int
    last: int


#: A rank's share of the samples: (tiles, first sample, end sample) int64 arrays, one entry per tile it
#: reads; its samples are ``first[i]:end[i]`` of tile ``tiles[i]``, one piece after another.
Pieces = tuple[np.ndarray, np.ndarray, np.ndarray]

#: Residency while planning: (tile, first batch, last batch) int64 arrays, one entry per span; whole-array
#: operations until the plan's Intervals are made, once.
Spans = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class EpochPlan:
    """This rank's epoch: ``order`` (sample indices in yield order), batch size, and tile residency."""

    order: WindowedOrder | range  # a range when the samples are taken in their own order (unshuffled, one rank)
    batch_size: int
    num_batches: int
    intervals: tuple[Interval, ...]  # sorted by first use: the order in which tiles are loaded
    window: int

    def batch(self, b: int) -> np.ndarray:
        part = self.order[b * self.batch_size:(b + 1) * self.batch_size]
        return np.arange(part.start, part.stop, dtype=np.int64) if isinstance(part, range) else part

    def positions(self) -> np.ndarray:
        """The whole order as one array (tests and small plans: an archive's order is GBs)."""
        return np.asarray(self.order[0:len(self.order)], dtype=np.int64)

    def max_resident(self) -> int:
        return _max_live(np.array([iv.first for iv in self.intervals], dtype=np.int64),
                         np.array([iv.last for iv in self.intervals], dtype=np.int64), self.num_batches)

    def intervals_from(self, start: int) -> list[Interval]:
        """Residency needed to resume at batch ``start`` (from the first batch: the plan's own, not copied:
        an archive's epoch has one interval per tile, tens of thousands)."""
        if start <= 0:
            return list(self.intervals)
        return [Interval(iv.tile, max(iv.first, start), iv.last) for iv in self.intervals if iv.last >= start]


def shard_samples(offsets: np.ndarray, tile_order: np.ndarray, rank: int, world_size: int) -> Pieces:
    """Rank ``rank``'s share of the samples of ``tile_order``'s tiles taken tile after tile: the positions
    ``rank * N // world_size`` up to ``(rank + 1) * N // world_size`` of that sequence (N samples), as pieces
    (tiles, first sample, end sample): whole tiles, except that a tile where one share ends and the next
    begins is split between the two ranks (both read it). The shares differ by at most one sample, as
    torch's DistributedSampler's; dealing whole tiles left ranks up to a third of an epoch apart (more with
    few tiles per rank), which padding then filled with repeated samples."""
    order = np.asarray(tile_order, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    lo, hi = offsets[order], offsets[order + 1]
    ends = np.cumsum(hi - lo)
    starts = ends - (hi - lo)
    total = int(ends[-1]) if len(ends) else 0
    a, b = rank * total // world_size, (rank + 1) * total // world_size
    i, j = int(np.searchsorted(ends, a, side="right")), int(np.searchsorted(starts, b, side="left"))
    tiles, lo, hi = order[i:j], lo[i:j].copy(), hi[i:j].copy()
    if len(tiles):  # the first and last tile may be shared with the ranks before and after
        lo[0] += a - starts[i]
        hi[-1] -= ends[j - 1] - b
    return tiles, lo, hi


def share_sizes(total: int, world_size: int) -> list[int]:
    """Every rank's number of samples under :func:`shard_samples`."""
    return [(r + 1) * total // world_size - r * total // world_size for r in range(world_size)]


class WindowedOrder:
    """A rank's order, made one window at a time: window w's samples (its tiles' sample ranges, tile after
    tile) permuted by a generator of its own, seeded with (seed, epoch, rank, 1, w). The order is never
    held whole (an archive's 190M samples would take 1.5 GB as int64), nor made whole while planning: only
    the window that a batch reads from is, and its tiles are resident in the ring, so it is ring-sized.
    Positions past one pass over the tiles (padding up to the largest rank's share) repeat the order from
    its start."""

    def __init__(self, pieces: Pieces, bounds: np.ndarray, key: tuple[int, ...] | None, starts: np.ndarray,
                 length: int) -> None:
        self._pieces = pieces  # (tiles, first sample, end sample) of the rank's share
        self._bounds = bounds  # (windows + 1,): window w holds pieces[bounds[w]:bounds[w + 1]]
        self._key = key  # (seed, epoch, rank) of the shuffle; None: unshuffled
        self._starts = starts  # (windows + 1,): each window's first position
        self._main = int(starts[-1])
        self._length = length
        self._cached: tuple[int, np.ndarray | None] = (-1, None)  # replaced whole: safe across threads

    def __len__(self) -> int:
        return self._length

    def resized(self, length: int) -> WindowedOrder:
        """The same order cut to (or padded up to) ``length`` positions."""
        order = WindowedOrder(self._pieces, self._bounds, self._key, self._starts, length)
        order.keep(*self._cached)
        return order

    def keep(self, w: int, samples: np.ndarray | None) -> None:
        """Hold window w's samples (made already) for the next :meth:`window_samples`."""
        if samples is not None:
            self._cached = (w, samples)

    def window_pieces(self, w: int) -> Pieces:
        """Window w's pieces, in the order their samples are listed before the shuffle."""
        at = slice(self._bounds[w], self._bounds[w + 1])
        return self._pieces[0][at], self._pieces[1][at], self._pieces[2][at]

    def window_samples(self, w: int) -> np.ndarray:
        """Window w's samples in order."""
        cached_w, cached = self._cached
        if cached_w == w and cached is not None:
            return cached
        idx, _ = _window(self.window_pieces(w), self._key, w)
        self._cached = (w, idx)
        return idx

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop, step = key.indices(self._length)
        if step != 1:
            raise ValueError("a WindowedOrder is sliced with step 1")
        parts = [part for _, part in self.chunks(start, stop)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def chunks(self, start: int, stop: int) -> Iterator[tuple[int, np.ndarray]]:
        """(first position, samples) pieces of positions start..stop-1, at most a window each."""
        pos = start
        while pos < stop:
            main = pos if pos < self._main else (pos - self._main) % self._main
            w = int(np.searchsorted(self._starts, main, side="right")) - 1
            take = min(stop - pos, int(self._starts[w + 1]) - main)
            lo = main - int(self._starts[w])
            yield pos, self.window_samples(w)[lo:lo + take]
            pos += take


def window_bounds(num_tiles: int, window: int) -> np.ndarray:
    """Tile boundaries of the windows over ``num_tiles`` tiles: windows of ``window`` tiles, except that when
    there is more than one window the first ones ramp up, 2, 4, 8, ... tiles, so that an epoch's first
    batch waits for two tiles rather than a whole window (the reader fills the next, larger window while
    the small ones are consumed; a shuffle buffer that starts small, as WebDataset's ``initial``)."""
    sizes = []
    size = min(2, window) if window < num_tiles else window
    left = num_tiles
    while left > 0:
        sizes.append(min(size, left))
        left -= sizes[-1]
        size = min(window, 2 * size)
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)


def _window(pieces: Pieces, key: tuple[int, ...] | None, w: int, with_tiles: bool = False
            ) -> tuple[np.ndarray, np.ndarray | None]:
    """(samples, the tile of each if ``with_tiles``) of window w holding ``pieces``: their sample ranges
    one after another, permuted by the window's own generator when ``key`` (seed, epoch, rank) is given."""
    tiles, lo, hi = pieces
    idx = _ranges(lo, hi)
    of = np.repeat(tiles, hi - lo) if with_tiles else None  # each sample's tile, without a search
    if key is not None:
        rng = np.random.default_rng([*key, 1, w])
        if of is None:
            idx = rng.permutation(idx)
        else:  # the same draws as permutation(idx), applied to both
            perm = rng.permutation(len(idx))
            idx, of = idx[perm], of[perm]
    return idx, of


def _windowed_order(num_tiles: int, pieces: Pieces, window: int, key: tuple[int, ...] | None, batch_size: int,
                    limit: int) -> tuple[WindowedOrder, list[Spans]]:
    """The order of the samples of ``pieces`` (a rank's share: tiles and their sample ranges) in windows
    (:func:`window_bounds`) of pieces, each shuffled on its own (``key``: (seed, epoch, rank); None: piece
    after piece), and the residency of its positions below ``limit``. Only the first window is made here
    (its batches come next, and its tiles' exact first and last batches let the first batch start before
    the window's other tiles are read); a later window's tiles are resident from its first batch to its
    last, from the pieces' ranges alone, so planning costs O(tiles) beyond the first window, however many
    samples there are."""
    tiles, lo, hi = pieces
    bounds = window_bounds(len(tiles), window)
    starts = np.concatenate([[0], np.cumsum(hi - lo)[bounds[1:] - 1]]).astype(np.int64)
    first, of = _window((tiles[:bounds[1]], lo[:bounds[1]], hi[:bounds[1]]), key, 0, with_tiles=True)
    assert of is not None
    residency = _Residency(num_tiles, batch_size)
    residency.add(0, of[:limit])
    # every later window below the limit: its tiles resident from its first position's batch to its last's
    w = np.arange(1, len(bounds) - 1)
    wlo, whi = starts[w], np.minimum(starts[w + 1], limit)
    w, wlo, whi = w[wlo < whi], wlo[wlo < whi], whi[wlo < whi]
    n = bounds[w + 1] - bounds[w]  # pieces per window
    at = _ranges(bounds[w], bounds[w + 1])  # those windows' positions in the pieces
    spans = [residency.spans(), (tiles[at], np.repeat(wlo // batch_size, n), np.repeat((whi - 1) // batch_size, n))]
    order = WindowedOrder(pieces, bounds, key, starts, int(starts[-1]))
    order.keep(0, first)  # the epoch's first batches need it next: not made a second time
    return order, spans


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The integers of the ranges ``lo[i]:hi[i]``, one range after another, in one pass: the concatenated
    ranges, without a range per piece."""
    lo = np.asarray(lo, dtype=np.int64)
    n = np.asarray(hi, dtype=np.int64) - lo
    return np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(int(n.sum()), dtype=np.int64)


class _Residency:
    """The first and last batch in which each tile is used within one segment of the order, fed piece by
    piece (first position, tile of each sample): O(tiles) memory, whatever the number of samples."""

    def __init__(self, num_tiles: int, batch_size: int) -> None:
        self.batch_size = batch_size
        self.first = np.full(num_tiles, np.iinfo(np.int64).max, dtype=np.int64)
        self.last = np.full(num_tiles, -1, dtype=np.int64)

    def add(self, pos: int, tiles: np.ndarray) -> None:
        # scatter-min/max, O(n) (np.unique's sort took seconds for the ~10M samples of an archive)
        at = np.arange(pos, pos + len(tiles), dtype=np.int64)
        np.minimum.at(self.first, tiles, at)
        np.maximum.at(self.last, tiles, at)

    def spans(self) -> Spans:
        used = np.flatnonzero(self.last >= 0)
        return used, self.first[used] // self.batch_size, self.last[used] // self.batch_size


def _merged(parts: list[Spans]) -> Spans:
    """The spans of ``parts`` with each tile's overlapping or adjacent spans joined (a tile used at the end
    of one segment and the start of the next stays resident throughout), sorted by first use (first,
    last, tile): the order in which the ring loads them."""
    tile, first, last = (np.concatenate([p[i] for p in parts]).astype(np.int64) for i in range(3))
    if len(tile) == 0:
        return tile, first, last
    o = np.lexsort((first, tile))
    tile, first, last = tile[o], first[o], last[o]
    # each tile's running end (tiles sorted, so tile * big + last only grows within a tile)
    big = int(last.max()) + 2
    reach = np.maximum.accumulate(tile * big + last) - tile * big
    new_run = np.ones(len(tile), dtype=bool)
    new_run[1:] = (tile[1:] != tile[:-1]) | (first[1:] > reach[:-1] + 1)
    starts = np.flatnonzero(new_run)
    ends = np.concatenate([starts[1:], [len(tile)]]) - 1
    tile, first, last = tile[starts], first[starts], reach[ends]
    o = np.lexsort((tile, last, first))
    return tile[o], first[o], last[o]


def _as_intervals(spans: Spans) -> tuple[Interval, ...]:
    """The plan's Intervals, in the spans' order (made once per plan)."""
    return tuple(map(Interval, *(a.tolist() for a in spans)))


def _contiguous_spans(offsets: np.ndarray, batch_size: int, limit: int) -> Spans:
    """The residency of every tile when samples 0..limit-1 are taken in order (tile t holds samples
    ``offsets[t]:offsets[t + 1]``), from the offsets alone, sorted by first use."""
    offsets = np.asarray(offsets, dtype=np.int64)
    lo, hi = offsets[:-1], np.minimum(offsets[1:], limit)
    tiles = np.flatnonzero(hi > lo)
    return _merged([(tiles, lo[tiles] // batch_size, (hi[tiles] - 1) // batch_size)])


def _max_live(first: np.ndarray, last: np.ndarray, num_batches: int) -> int:
    """Most spans live in one batch."""
    if len(first) == 0:
        return 0
    delta = np.bincount(first, minlength=num_batches + 1) - np.bincount(last + 1, minlength=num_batches + 1)
    return int(np.cumsum(delta).max())


def max_batch_tiles(counts: np.ndarray, batch_size: int, loose: int = 2) -> int:
    """The most tiles one batch can need resident in any epoch's plan, from the samples per tile alone.

    A shuffled epoch orders the tiles at random, and when the ring is small its shuffle windows shrink to one
    tile each (:func:`plan_epoch`), so a batch is ``batch_size`` consecutive samples of tile after tile: it
    needs the most tiles when the tiles with fewest samples come together, whole inside it, between
    ``loose`` pieces of one sample or more (its first and last tile, and for a rank that pads, the end of its
    share, cut from a tile another rank reads too).

    Parameters
    ----------
    counts : np.ndarray
        Samples per tile (empty tiles are never read).
    batch_size : int
    loose : int
        Pieces of a batch that may be a single sample: 2, or 3 for a rank whose share is padded.

    Returns
    -------
    int
        The largest number of distinct tiles ``batch_size`` consecutive samples can span over every order of
        the tiles (an upper bound on any plan's residency per batch). O(tiles): only the ``batch_size``
        smallest counts are sorted.
    """
    counts = np.asarray(counts, dtype=np.int64)
    counts = counts[counts > 0]
    budget = batch_size - loose  # samples left for whole tiles between the loose pieces
    if budget <= 0:
        return min(len(counts), batch_size)
    # each tile holds a sample or more, so no more than ``budget`` whole tiles fit: only the smallest matter
    k = min(len(counts), budget)
    smallest = np.sort(np.partition(counts, k - 1)[:k]) if k < len(counts) else np.sort(counts)
    whole = int(np.searchsorted(np.cumsum(smallest), budget, side="right"))
    return min(len(counts), loose + whole)


def check_ring(counts: np.ndarray, *, batch_size: int, slots: int, shuffle: bool, world_size: int,
               drop_last: bool, tile_nbytes: int) -> None:
    """Refuse a ring that some epoch's batch would not fit in (:func:`max_batch_tiles`), whichever epoch.

    An unshuffled plan is the same every epoch, so the first epoch's plan is the check, and a ring that holds
    every tile with samples fits any batch; neither is bounded here.

    Raises
    ------
    ConfigError
        Naming the tiles a batch can need, the ``ring_bytes`` that holds them, and the largest batch size
        this ring fits.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if not shuffle or slots >= int(np.count_nonzero(counts)):
        return
    # a padded share ends with a piece of a tile cut between two ranks, then its first sample again
    loose = 3 if world_size > 1 and not drop_last else 2
    worst = max_batch_tiles(counts, batch_size, loose)
    if worst <= slots:
        return
    lo, hi = 1, batch_size - 1  # the largest batch that fits: the bound grows with the batch
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if max_batch_tiles(counts, mid, loose) <= slots else (lo, mid - 1)
    smaller = f"lower batch_size to {lo} or less" if max_batch_tiles(counts, lo, loose) <= slots else \
        "lower batch_size"
    raise ConfigError(f"a batch of {batch_size} can need {worst} tiles resident (in an epoch whose shuffled order "
                      f"puts tiles with few samples together) but the ring has {counted(slots, 'slot')}; raise ring_bytes to "
                      f"{worst * tile_nbytes} or more ({worst} tiles of {tile_nbytes} bytes; its default is capped "
                      f"by the ring_cpu_bytes and ring_gpu_fraction settings) or {smaller}")


def plan_epoch(samples: Samples, *, batch_size: int, seed: int, epoch: int, shuffle: bool, slots: int,
               window: int | None = None, rank: int = 0, world_size: int = 1, drop_last: bool = False) -> EpochPlan:
    """Plan one epoch for one rank.

    Tiles are ordered by a generator seeded with (seed, epoch) (the same on every rank), their samples
    cut into equal consecutive shares, one per rank (:func:`shard_samples`: a tile on a cut is read by
    both ranks), and a rank's tiles grouped into windows of ``window`` resident tiles whose samples are
    shuffled together (``window`` >= the rank's tile count gives a true global shuffle). Every rank
    yields the same number of batches: with ``drop_last`` each stops at the smallest share; otherwise
    each pads its order by repeating its own first sample (the shares differ by one sample at most).
    If a window needs more tiles resident than ``slots``, the window shrinks; if even one tile per
    window does not fit, ConfigError says how many slots are needed (in this epoch: :func:`check_ring`
    bounds every epoch's need from the counts alone).
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside world_size {world_size}")
    if len(samples) < world_size:
        raise ConfigError(f"the split has {counted(len(samples), 'sample')}, fewer than the {world_size} ranks; use fewer ranks")
    tiles = np.flatnonzero(samples.counts())
    rng = np.random.default_rng([seed, epoch])
    tile_order = rng.permutation(tiles) if shuffle else tiles
    mine = shard_samples(samples.offsets, tile_order, rank, world_size)
    sizes = share_sizes(len(samples), world_size)
    window = len(mine[0]) if window is None else max(1, window)
    if window > slots // 2 and len(mine[0]) > slots:
        window = max(1, slots // 2)  # double-buffer: the next window loads while this one is consumed
    if not shuffle and world_size == 1:
        # the samples in their own order (tile by tile): a range, and each tile's residency from the offset
        # table, so nothing here grows with the number of samples (a whole scene's pixels for inference)
        n = len(samples)
        num_batches = n // batch_size if drop_last else -(-n // batch_size)
        limit = num_batches * batch_size if drop_last else n
        spans = _contiguous_spans(samples.offsets, batch_size, limit)
        live = _max_live(spans[1], spans[2], num_batches)
        if live > slots:
            raise ConfigError(f"a batch of {batch_size} needs {live} tiles resident but the ring has {counted(slots, 'slot')}; "
                              + RING_ADVICE)
        return EpochPlan(range(limit), batch_size, num_batches, _as_intervals(spans), window)
    num_tiles = len(samples.offsets) - 1
    if drop_last:
        num_batches = min(sizes) // batch_size
        length = limit = num_batches * batch_size  # every rank stops at the smallest share
    else:
        num_batches = -(-max(sizes) // batch_size)
        length, limit = max(sizes), sizes[rank]  # past this rank's own share: its first samples again
    while True:
        order, parts = _windowed_order(num_tiles, mine, window, (seed, epoch, rank) if shuffle else None,
                                       batch_size, limit)
        order = order.resized(length)
        if length > limit:  # padding: this rank's first samples again, at positions limit..length-1
            pad = _Residency(num_tiles, batch_size)
            for pos, idx in order.chunks(limit, length):
                pad.add(pos, samples.tile_of(idx))
            parts.append(pad.spans())
        spans = _merged(parts)
        live = _max_live(spans[1], spans[2], num_batches)
        if live <= slots or window == 1:
            break
        window = max(1, window // 2)
    if live > slots:
        raise ConfigError(f"a batch of {batch_size} needs {live} tiles resident but the ring has {counted(slots, 'slot')}; "
                          + RING_ADVICE)
    return EpochPlan(order, batch_size, num_batches, _as_intervals(spans), window)
