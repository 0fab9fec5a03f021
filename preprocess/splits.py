"""Train/val/test split maps over a labelled scene.

Every split function takes ``labels``, a 2-D integer ``(H, W)`` array in which 0 means unlabelled and
``1..K`` are classes, and returns a ``uint8`` ``(H, W)`` map of :data:`hsgds.format` ``SPLIT_*`` codes.
Unlabelled pixels are always ``SPLIT_NONE``. Randomised splits are deterministic for a given ``seed``
(one :func:`numpy.random.default_rng` stream per call).

Three strategies:

* :func:`random_split` -- stratified per class, pixels drawn independently. Simple, but neighbouring
  train and test pixels share most of a patch, which inflates test scores for patch-based models
  (``hsgds info`` reports how many test patches overlap a train patch).
* :func:`block_split` -- spatially disjoint and stratified. The scene is cut into square blocks (the
  block size is chosen adaptively, the grid origin is seeded); blocks are moved to train greedily so
  that each class's train share approaches the target, preferring blocks next to train blocks (so the
  guard drops few pixels) and never taking a class's last val/test pixels; then every class that can be
  split but is still without train gets a train block (train comes first); val
  blocks are chosen the same way from the rest; the rest is test. The guard is applied on one side: every val/test pixel
  within Chebyshev distance ``2 * guard`` of a train pixel is dropped, so no scene pixel is seen by a
  train patch and a val/test patch of radius ``guard``. Classes that cannot be split (all pixels close
  together, or in one block) are named in an :class:`UnsplittableClassWarning`. The full algorithm is
  in :func:`block_split`'s notes and in docs/splits.md.
* :func:`mask_split` -- user-supplied masks (e.g. an official benchmark split), kept as given; classes
  they leave out of a split are named.

Train comes first in :func:`random_split` and :func:`block_split`: every class gets a train pixel before
test, and test before val (in a block split, every class that can be split: one whose pixels all lie
within the guard of each other keeps the side the other classes' blocks give it, since a train block of its
own would drop their val/test pixels around it); a class too small for every split is named, with its
counts, in an :class:`UnsplittableClassWarning` (docs/splits.md, "Train first").

:func:`make_split` is what the converter and ``hsgds resplit`` call; :func:`split_counts` tabulates a
split per split and class.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from numbers import Integral, Real
from typing import Any

import numpy as np
from scipy.ndimage import maximum_filter

from hsgds.errors import ConfigError, HsgdsWarning, InputError, shown
from hsgds.format import (
    SPLIT_CODES,
    SPLIT_NONE,
    SPLIT_TEST,
    SPLIT_TRAIN,
    SPLIT_VAL,
    random_split_sizes,
    split_class_counts,
)

__all__ = [
    "TRAIN_SHARE_TOLERANCE",
    "TRAIN_SHARE_WARN",
    "BlockSplit",
    "SplitWarning",
    "TrainShareWarning",
    "UnsplittableClassWarning",
    "block_split",
    "block_split_details",
    "candidate_block_sizes",
    "check_amounts",
    "check_has_train",
    "check_split_options",
    "default_block_size",
    "make_split",
    "mask_split",
    "min_block_size",
    "random_split",
    "split_counts",
]

# --------------------------------------------------------------------------------------------------
# argument checks


def _check_labels(labels: Any) -> np.ndarray:
    """Return ``labels`` as a 2-D integer ndarray or raise InputError."""
    arr = np.asarray(labels)
    if arr.ndim != 2:
        raise InputError(f"labels must be a 2-D (H, W) array, got shape {arr.shape}")
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise InputError(
            f"labels must be an integer array (0 = unlabelled, 1..K = classes), got dtype {arr.dtype}; "
            "cast it with labels.astype(np.int32) after checking it holds whole numbers"
        )
    if arr.size and arr.min() < 0:
        raise InputError(
            f"labels must be >= 0 (0 = unlabelled), found {int((arr < 0).sum())} negative pixels; "
            "map no-data values to 0"
        )
    return arr


def _is_int(x: Any) -> bool:
    # bool is an Integral but train=True is certainly a mistake
    return isinstance(x, Integral) and not isinstance(x, (bool, np.bool_))


def _is_float(x: Any) -> bool:
    return isinstance(x, Real) and not isinstance(x, Integral)


def _check_amount(name: str, value: Any, *, allow_zero: bool, allow_count: bool) -> None:
    """Validate a ``train``/``val`` amount: a fraction in (0, 1) or (if allowed) a count >= 1."""
    if allow_zero and (_is_int(value) or _is_float(value)) and value == 0:
        return
    if _is_float(value):
        if not (math.isfinite(value) and 0.0 < value < 1.0):
            raise InputError(
                f"{name} fraction must be in (0, 1), got {value}"
                + ("; pass a whole number (e.g. 20) for a per-class pixel count" if allow_count else "")
            )
        return
    if _is_int(value) and allow_count:
        if value < 1:
            raise InputError(f"{name} pixel count must be >= 1, got {value}")
        if value >= 1 << 63:  # counts are int64 (numpy raised OverflowError past it)
            raise InputError(f"{name} pixel count must be below 2**63, got {shown(value)}")
        return
    if allow_count:
        raise InputError(
            f"{name} must be a fraction in (0, 1) or a per-class pixel count >= 1, got {shown(value)}"
        )
    raise InputError(f"{name} must be a fraction in (0, 1) of the labelled pixels, got {shown(value)}")


def _check_fraction_sum(train: Any, val: Any) -> None:
    if _is_float(train) and _is_float(val) and train + val >= 1.0:
        raise InputError(
            f"train + val fractions must be below 1 so that pixels are left for test, "
            f"got {train} + {val} = {train + val:g}"
        )


def check_amounts(train: Any, val: Any, names: tuple[str, str] = ("--train", "--val")) -> None:
    """Validate ``train`` and ``val`` as the split functions do, the messages naming the options: for the
    commands, which check them before any file is read (also when no split is made)."""
    _check_amount(names[0], train, allow_zero=False, allow_count=True)
    _check_amount(names[1], val, allow_zero=True, allow_count=True)
    _check_fraction_sum(train, val)


#: the options a split method does not read: given with it, they would be ignored without a word
_UNUSED_OPTIONS = {"random": ("--block-size",), "masks": ("--train", "--val", "--block-size", "--seed")}


def check_split_options(method: str, given: Any) -> None:
    """Refuse options (``given``: the ones the user set, as flags) that split ``method`` would ignore:
    ``--block-size`` without ``--split blocks`` (a random split, with every test patch overlapping train
    patches, where blocks were meant), or ``--train``/``--val``/``--seed`` with ``--split masks``."""
    unused = [flag for flag in _UNUSED_OPTIONS.get(method, ()) if flag in given]
    if not unused:
        return
    if method == "masks":
        raise ConfigError(f"{' '.join(unused)} {'means' if len(unused) == 1 else 'mean'} nothing with --split masks: "
                         f"the masks decide the split (a val split: --val-mask); drop {' '.join(unused)}")
    raise ConfigError(f"--block-size means nothing with --split {method} (only --split blocks cuts the scene into "
                     "blocks); pass --split blocks, or drop --block-size")


def check_has_train(codes: np.ndarray, method: str, block_size: int | None = None) -> None:
    """Refuse a split of labelled pixels that has no train pixel: a store without train statistics would
    silently normalize with every pixel's, and there is nothing to train on."""
    if np.any(np.asarray(codes) == SPLIT_TRAIN):
        return
    if method == "masks":
        raise InputError("--train-mask covers none of the labelled pixels, so the split has no train pixel; "
                         "check the mask (nonzero = train)")
    if method == "blocks" and block_size is not None:
        fix = f"use a smaller --block-size than {block_size} (or leave it out: adaptive)"
    else:
        fix = "use a larger --train"
    raise InputError(f"--split {method} gives no train pixel on these labels; {fix}")


def _check_int(name: str, value: Any, minimum: int) -> int:
    if not _is_int(value):
        raise InputError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    if value < minimum:
        raise InputError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _compact(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True, return_counts=True)`` for non-negative ints.

    Uses bincount when the value range is small (class ids, block ids): several times faster than
    the sort inside np.unique on scenes with millions of labelled pixels.
    """
    if values.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    top = int(values.max())
    if top > max(1 << 20, 4 * values.size):
        uniq, inv, counts = np.unique(values, return_inverse=True, return_counts=True)
        return uniq, inv.ravel(), counts  # numpy 2.0.x returns inverse in the input's shape
    counts = np.bincount(values, minlength=top + 1)
    uniq = np.flatnonzero(counts)
    remap = np.zeros(top + 1, dtype=np.int64)
    remap[uniq] = np.arange(uniq.size)
    return uniq, remap[values], counts[uniq]


# --------------------------------------------------------------------------------------------------
# warning text, shared by the split methods


def _counts_text(train: Any, val: Any, test: Any, with_val: bool) -> str:
    return f"{int(train)} train, " + (f"{int(val)} val, " if with_val else "") + f"{int(test)} test"


def _splits_text(with_val: bool) -> str:
    return "train, val and test" if with_val else "train and test"


def _classes_text(parts: dict[int, str]) -> str:
    """``class 3 (...)`` / ``classes 3 (...), 5 (...)``."""
    return f"class{'' if len(parts) == 1 else 'es'} " + ", ".join(f"{c} ({text})" for c, text in parts.items())


# --------------------------------------------------------------------------------------------------
# random split


def random_split(
    labels: Any,
    *,
    train: float | int = 0.1,
    val: float | int = 0.0,
    seed: Any = 0,
) -> np.ndarray:
    """Stratified random split: each class is split on its own.

    Parameters
    ----------
    labels : array_like of int, shape (H, W)
        0 = unlabelled, 1..K = classes.
    train, val : float or int
        A float in (0, 1) is a fraction of each class; an int >= 1 is a pixel count per class. ``val``
        may be 0 (the default: no validation split). The two may be of different kinds. When both are
        fractions their sum must be below 1.
    seed : int, optional
        Seed of :func:`numpy.random.default_rng`; the same seed gives the same map.

    Returns
    -------
    numpy.ndarray of uint8, shape (H, W)
        ``SPLIT_*`` codes; every labelled pixel is train, val or test, unlabelled pixels are none.

    Notes
    -----
    Per class of ``n`` pixels:

    1. Requested sizes: a fraction ``f`` asks for ``f * n`` pixels rounded half up (exactly, for ``f`` as
       written: 0.29 of 50 pixels asks for 15), a
       count ``c`` asks for ``c``.
    2. Train comes first: every class gets at least 1 train pixel, then 1 test pixel (``n >= 2``), then
       1 val pixel when ``val`` is not 0 (``n >= 3``), even where a fraction rounds to 0.
    3. Train is capped so those minimums stay (``n - 1``, ``n - 2`` with val), then val at what train
       left minus the test pixel. Train is served first, so a small class may get fewer val pixels than
       asked (never fewer than 1 from 3 pixels).
    4. The rest of the class is test. Which pixels go where is a uniform random permutation.

    Warns
    -----
    UnsplittableClassWarning
        Naming each class too small for every split asked for (1 pixel; 2 with ``val``), with its counts.
    """
    lab = _check_labels(labels)
    _check_amount("train", train, allow_zero=False, allow_count=True)
    _check_amount("val", val, allow_zero=True, allow_count=True)
    _check_fraction_sum(train, val)

    out = np.zeros(lab.shape, dtype=np.uint8)
    flat = lab.ravel()
    idx = np.flatnonzero(flat)
    if idx.size == 0:
        return out
    classes, inv, counts = _compact(flat[idx])

    n_train, n_val = random_split_sizes(counts, train, val)  # (hsgds verify checks stores by the same rule)
    short = counts < 2 + (val != 0)
    if short.any():
        n_test = counts - n_train - n_val
        parts = {int(classes[c]): f"{counts[c]} px: {_counts_text(n_train[c], n_val[c], n_test[c], val != 0)}"
                 for c in np.flatnonzero(short)}
        order = "its second to test, its third to val" if val != 0 else "its second to test"
        warnings.warn(f"random split: {_classes_text(parts)} {'has' if len(parts) == 1 else 'have'} too few pixels for {_splits_text(val != 0)}: a "
                      f"class's first pixel goes to train, {order}; such a class is missing from some split",
                      UnsplittableClassWarning, stacklevel=2)

    # One global permutation, then a stable sort by class: random order within each class, all
    # classes at once (no per-class Python loop for scenes with millions of labelled pixels).
    rng = np.random.default_rng(seed)
    perm = rng.permutation(idx.size)
    keys = inv[perm]
    if counts.size <= np.iinfo(np.uint16).max:
        keys = keys.astype(np.uint16)  # numpy's stable sort is a radix sort for 16-bit keys: ~4x faster
    order = perm[np.argsort(keys, kind="stable")]
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.empty(idx.size, dtype=np.int64)
    rank[order] = np.arange(idx.size) - np.repeat(starts, counts)

    t = n_train[inv]
    code = np.where(rank < t, SPLIT_TRAIN, np.where(rank < t + n_val[inv], SPLIT_VAL, SPLIT_TEST))
    out.ravel()[idx] = code
    return out


# --------------------------------------------------------------------------------------------------
# block split: stratified assignment of blocks, guard on the val/test side

#: The overall train share of a fractional ``train`` is kept within this of the target.
TRAIN_SHARE_TOLERANCE = 0.03
#: Weight of the guard loss against the per-class share error in the greedy block choice. The loss is
#: counted in shares of a mean-sized class (pixels * K / N): with weight 3, dropping 10% of a mean class's
#: worth of val/test pixels costs as much as missing a class's train target by 30 points. Chosen on
#: Indian Pines and the synthetic scenes of the tests (1, 3 and 10 tried; 3 lost fewest pixels overall).
_LOSS_WEIGHT = 3.0
#: A block that gives a class its first pixel of a split earns this much (a full share): a class with
#: train and test pixels can be learnt and measured, whatever its size.
_FIRST_PIXEL_BONUS = 1.0
#: Seeded relative perturbation of the block scores (besides the seeded grid origin), so that seeds
#: give different splits of similar quality.
_JITTER = 0.2
#: The greedy keeps adding train blocks (even at a loss) until the train share is this close below target.
_MANDATORY_SLACK = 0.015
#: ...and until every class that can be split has at least this share of its own target.
_CLASS_FLOOR = 0.7
#: The local search runs on this many of the block sizes, the best after the greedy.
_REFINED = 2
_ORIGINS = 3  # grid origins tried for each refined block size
#: ...and moves no class's train count further than this share of its target from it.
_REFINE_DRIFT = 0.25


#: A block split whose train share of the labelled pixels is further than this from a fractional ``train``
#: (absolute, 0.05 = 5 percentage points) issues a :class:`TrainShareWarning`.
TRAIN_SHARE_WARN = 0.05


class SplitWarning(HsgdsWarning):
    """A split was made but is not what was asked for; the commands show these as one line each."""


class UnsplittableClassWarning(SplitWarning):
    """Some classes did not get pixels in every split (too few pixels or blocks, all within the guard, or
    left out by the masks); each is named with its counts."""


class TrainShareWarning(SplitWarning):
    """A block split's train share misses a fractional ``train`` by more than :data:`TRAIN_SHARE_WARN`."""


@dataclass(frozen=True)
class BlockSplit:
    """Result of :func:`block_split_details`.

    Attributes
    ----------
    split : numpy.ndarray of uint8, shape (H, W)
        ``SPLIT_*`` codes per pixel.
    blocks : numpy.ndarray of uint8, shape (nby, nbx)
        Split of each block (``SPLIT_NONE`` for blocks without labelled pixels). Block ``[i, j]``
        covers rows ``origin[0] + i * block_size`` up to (excluding) ``origin[0] + (i + 1) * block_size``,
        and likewise for columns, clipped to the scene.
    block_size : int
        Side of the blocks (the chosen one when the size was adaptive).
    origin : (int, int)
        Scene coordinates of the top-left corner of block ``[0, 0]`` (``-block_size < origin <= 0``).
    guard : int
        Patch radius ``h``: no val/test pixel lies within Chebyshev distance ``2 * h`` of a train pixel.
    lost : int
        Labelled pixels of val/test blocks dropped by the guard (``SPLIT_NONE``).
    unsplit : dict of int to int
        Classes without a pixel in some split (test, or val when asked: every class gets train pixels),
        mapped to the number of blocks their pixels lie in, ascending by class.
    tried : dict of int to tuple
        Per block size tried (its best origin), ``(classes that could be split but were not, excess of the
        train share over the tolerance, such classes below _CLASS_FLOOR of their train target, guard loss +
        per-class share error)``: the ranking key, smallest wins.
    """

    split: np.ndarray
    blocks: np.ndarray
    block_size: int
    origin: tuple[int, int]
    guard: int
    lost: int
    unsplit: dict[int, int]
    tried: dict[int, tuple[int, float, int, float]]
    val: bool = False
    #: per unsplit class, its (train, val, test) pixels
    counts: dict[int, tuple[int, int, int]] = field(default_factory=dict)

    def warning(self) -> str | None:
        """One line naming the classes that could not be split, with their counts, or None when every class was."""
        if not self.unsplit:
            return None
        parts = {c: f"{n} block{'' if n == 1 else 's'}: {_counts_text(*self.counts[c], self.val)}"
                 for c, n in self.unsplit.items()} if self.counts else {
                 c: f"{n} block{'' if n == 1 else 's'}" for c, n in self.unsplit.items()}
        d = 2 * self.guard
        if self.guard:
            text = (f"block split: {_classes_text(parts)} could not be split into {_splits_text(self.val)} with {d} "
                    "px between train and the others: too few pixels or blocks, or all close together; such a class "
                    "is missing from some split (a smaller --max-patch narrows the guard)")
        else:  # --max-patch 1: no guard to narrow; whole blocks are what keeps a class on one side
            text = (f"block split: {_classes_text(parts)} could not be split into {_splits_text(self.val)}: too few "
                    "pixels or blocks; such a class is missing from some split (--max-patch 1 has no guard to "
                    "narrow: a smaller --block-size puts a class's pixels in more blocks)")
        untrained = [c for c in self.unsplit if self.counts and self.counts[c][0] == 0]
        if untrained:
            # (without a guard nothing around the block is dropped: the block itself goes to train whole)
            cost = "drop the val/test pixels around it" if self.guard else "take its block's other pixels from val/test"
            text += (f"; class{'' if len(untrained) == 1 else 'es'} {', '.join(map(str, untrained))} got no train "
                     f"pixel: scored, never trained on (a train block of its own would {cost}, or leave the scene none)")
        return text


def default_block_size(shape: tuple[int, ...], guard: int = 7) -> int:
    """Largest block side the adaptive block size tries: ``max(4 * guard + 1, min(H, W) // 8)``.

    About 8 blocks along the short side of the scene, and never narrower than the guard band around a
    block (``2 * guard`` on both sides).
    """
    if len(shape) < 2:
        raise InputError(f"shape must have at least 2 dimensions (H, W), got {tuple(shape)}")
    g = _check_int("guard", guard, 0)
    h, w = int(shape[0]), int(shape[1])
    return max(4 * g + 1, min(h, w) // 8)


def min_block_size(guard: int) -> int:
    """Smallest block side accepted: ``max(2, ceil(guard / 2))``.

    The guard bookkeeping pairs each labelled pixel with the blocks within ``2 * guard`` of it, about
    ``(4 * guard / block_size + 2) ** 2`` of them; smaller blocks would also cost guard loss all round.
    """
    return max(2, -(-int(guard) // 2))


def check_block_size_option(block_size: int | None, halo: int, more: str) -> None:
    """``--block-size`` against :func:`min_block_size` for a store's halo, in the commands' words (the guard is
    the halo that ``--max-patch`` sets); :func:`block_split` names its own Python arguments. ``more``: ends the fix."""
    least = min_block_size(halo)
    if block_size is not None and block_size < least:
        raise InputError(f"--block-size {block_size} is too small for --max-patch {2 * halo + 1}: blocks must be at "
                         f"least {least} pixels (each is guarded by the patch halo of {halo} pixels; smaller blocks "
                         f"make the guard bookkeeping explode); pass --block-size {least} or more{more}")


def candidate_block_sizes(shape: tuple[int, ...], guard: int = 7) -> list[int]:
    """Block sides tried when none is given: from a quarter of :func:`default_block_size` up to it, in
    steps of about 1.4x (Indian Pines, guard 7: 8, 11, 15, 21, 29)."""
    top = default_block_size(shape, guard)
    b = max(min_block_size(guard), -(-top // 4))
    out = []
    while b < top:
        out.append(b)
        b = max(b + 1, int(round(b * 1.4)))
    out.append(top)
    return out


def _targets(counts: np.ndarray, spec: float | int) -> np.ndarray:
    """Wanted pixels per class: ``spec * n`` for a fraction (unrounded), ``min(spec, n - 1)`` for a count."""
    if _is_float(spec) or spec == 0:
        return float(spec) * counts.astype(np.float64)
    return np.minimum(float(spec), np.maximum(counts - 1, 1)).astype(np.float64)


def _csr(ptr: np.ndarray, data: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Entries of ``rows`` in a CSR (ptr, data): (the data, the row each entry came from)."""
    lengths = ptr[rows + 1] - ptr[rows]
    start = np.repeat(ptr[rows] - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return data[start + np.arange(int(lengths.sum()))], np.repeat(rows, lengths)


def _group(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR grouping of ``arange(len(keys))`` by key in ``0..n-1``: (ptr, members)."""
    order = np.argsort(keys, kind="stable")
    return np.concatenate(([0], np.cumsum(np.bincount(keys, minlength=n)))), order


@dataclass
class _Grid:
    """The labelled pixels of a scene on one block grid."""

    bs: int
    origin: tuple[int, int]
    shape: tuple[int, int]  # blocks (nby, nbx)
    ub: np.ndarray  # flat grid index of each block holding labelled pixels (compact block ids index it)
    blk: np.ndarray  # compact block id of each labelled pixel
    hist: np.ndarray  # (nb, K) pixels per block and class
    bptr: np.ndarray  # CSR: labelled pixels of each block
    bpix: np.ndarray
    ptr: np.ndarray  # CSR: per labelled pixel, the blocks whose window (block grown by 2*guard) holds it
    pair_blk: np.ndarray
    wptr: np.ndarray  # CSR: per block, the labelled pixels in its window
    wpix: np.ndarray


def _make_grid(shape: tuple[int, int], ys: np.ndarray, xs: np.ndarray, cls: np.ndarray, k: int, bs: int,
               origin: tuple[int, int], guard: int) -> _Grid:
    h, w = shape
    oy, ox = origin
    nby, nbx = -(-(h - oy) // bs), -(-(w - ox) // bs)
    by, bx = (ys - oy) // bs, (xs - ox) // bs
    ub, blk, _ = _compact(by * nbx + bx)
    nb = ub.size
    hist = np.bincount(blk * k + cls, minlength=nb * k).reshape(nb, k)
    bptr, bpix = _group(blk, nb)
    # per axis, the blocks b whose window [b*bs - 2g, (b+1)*bs + 2g) holds the pixel
    d = 2 * guard
    lo_y = np.maximum(-(-(ys - oy - d - bs + 1) // bs), 0)
    lo_x = np.maximum(-(-(xs - ox - d - bs + 1) // bs), 0)
    hi_y, hi_x = np.minimum((ys - oy + d) // bs, nby - 1), np.minimum((xs - ox + d) // bs, nbx - 1)
    r = -(-2 * d // bs) + 1
    dy, dx = np.divmod(np.arange(r * r), r)
    cy, cx = lo_y[:, None] + dy[None, :], lo_x[:, None] + dx[None, :]
    flat = np.where((cy <= hi_y[:, None]) & (cx <= hi_x[:, None]), cy * nbx + cx, nby * nbx)
    remap = np.full(nby * nbx + 1, -1, dtype=np.int64)
    remap[ub] = np.arange(nb)
    comp = remap[flat]  # -1: outside the grid, or a block without labelled pixels
    keep = comp >= 0
    ptr = np.concatenate(([0], np.cumsum(keep.sum(axis=1))))
    pair_blk = comp[keep]
    pair_pix = np.repeat(np.arange(ys.size), keep.sum(axis=1))
    wptr, worder = _group(pair_blk, nb)
    return _Grid(bs, origin, (nby, nbx), ub, blk, hist, bptr, bpix, ptr, pair_blk, wptr, pair_pix[worder])


def _splittable(g: _Grid, ys: np.ndarray, xs: np.ndarray, cls: np.ndarray, guard: int) -> np.ndarray:
    """Per class: whether two of its pixels in different blocks are more than ``2 * guard`` apart."""
    nb, k = g.hist.shape
    key = g.blk * k + cls
    boxes = []
    for coord in (ys, xs):
        lo = np.full(nb * k, np.iinfo(np.int64).max, dtype=np.int64)
        hi = np.full(nb * k, np.iinfo(np.int64).min, dtype=np.int64)
        np.minimum.at(lo, key, coord)
        np.maximum.at(hi, key, coord)
        boxes.append((lo.reshape(nb, k), hi.reshape(nb, k)))
    out = np.zeros(k, dtype=bool)
    for c in range(k):
        rows = np.flatnonzero(g.hist[:, c])
        if rows.size < 2:
            continue
        far = np.zeros((rows.size, rows.size), dtype=np.int64)  # farthest pixels of blocks a and b
        for lo, hi in boxes:
            a, b = lo[rows, c], hi[rows, c]
            far = np.maximum(far, np.maximum(b[:, None] - a[None, :], b[None, :] - a[:, None]))
        np.fill_diagonal(far, 0)
        out[c] = bool((far > 2 * guard).any())
    return out


def _kept_blocks(keep: np.ndarray, need: int, alive: np.ndarray, train: np.ndarray) -> np.ndarray:
    """Per class, the val/test blocks (with free pixels) a train move must leave it: none for a class that
    cannot be split; else ``need`` (test, and val when asked) once it has train, only its test block
    before (train comes first: its val block may go to train); never more than it has."""
    return np.where(keep, np.minimum(np.where(train > 0, need, 1), alive), 0)


@dataclass
class _Assignment:
    in_train: np.ndarray  # per block
    in_val: np.ndarray  # per block
    is_train: np.ndarray  # per labelled pixel
    near: np.ndarray  # per labelled pixel: within 2*guard of a train pixel (and not train)


def _assign(g: _Grid, ys: np.ndarray, xs: np.ndarray, cls: np.ndarray, n_cls: np.ndarray, guard: int,
            t_train: np.ndarray, t_val: np.ndarray | None, keep: np.ndarray, jitter: np.ndarray,
            refine: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None) -> _Assignment:
    """Greedy train then val block choice on one grid (see :func:`block_split`'s notes); ``refine``
    improves the train blocks between the two."""
    nb, k = g.hist.shape
    n = ys.size
    w = 1.0 / n_cls
    need = 1 if t_val is None else 2  # blocks with val/test pixels a splittable class keeps (test, val)
    is_train = np.zeros(n, dtype=bool)
    near = np.zeros(n, dtype=bool)
    # `free` pixels: neither train nor within the guard of one. Per block and class: free pixels in the
    # block's window (`reach`, what moving the block to train would take from val/test at most), in the
    # block itself (`own`), and guarded pixels in the block (`own_near`, given back if it goes to train).
    pair_pix = np.repeat(np.arange(n), np.diff(g.ptr))
    pair_cls = cls[pair_pix]
    reach = np.bincount(g.pair_blk * k + pair_cls, minlength=nb * k).reshape(nb, k).astype(np.int64)
    # the same per (window block j, block b, class c): which blocks would keep free pixels of a class
    grp_ids, pair_grp, grp_count = _compact((g.pair_blk * nb + g.blk[pair_pix]) * k + pair_cls)
    grp_j, rest = np.divmod(grp_ids, nb * k)
    grp_b, grp_c = np.divmod(rest, k)
    own = g.hist.astype(np.int64).copy()
    own_near = np.zeros((nb, k), dtype=np.int64)
    free = n_cls.astype(np.int64).copy()
    train = np.zeros(k)
    in_train = np.zeros(nb, dtype=bool)
    d = 2 * guard
    floor = t_train.sum() - _MANDATORY_SLACK * n  # below this many train pixels, any improving move is made

    def leave_free(pix: np.ndarray) -> None:
        blocks, rows = _csr(g.ptr, g.pair_blk, pix)
        np.subtract.at(reach, (blocks, cls[rows]), 1)
        np.subtract.at(grp_count, _csr(g.ptr, pair_grp, pix)[0], 1)
        np.subtract.at(own, (g.blk[pix], cls[pix]), 1)
        np.subtract.at(free, cls[pix], 1)

    def guarded_by(j: int) -> np.ndarray:
        """Free pixels outside block ``j`` within Chebyshev distance 2*guard of it (exact, on a local raster)."""
        pix = g.bpix[g.bptr[j]:g.bptr[j + 1]]
        win = g.wpix[g.wptr[j]:g.wptr[j + 1]]
        win = win[~is_train[win] & ~near[win] & (g.blk[win] != j)]
        if win.size == 0 or d == 0:
            return win[:0]
        y0, x0 = int(ys[pix].min()) - d, int(xs[pix].min()) - d
        hh, ww = int(ys[pix].max()) + d + 1 - y0, int(xs[pix].max()) + d + 1 - x0
        img = np.zeros((hh, ww), dtype=bool)
        img[ys[pix] - y0, xs[pix] - x0] = True
        img = maximum_filter(img, size=2 * d + 1, mode="constant", cval=False)
        wy, wx = ys[win] - y0, xs[win] - x0
        inside = (wy >= 0) & (wy < hh) & (wx >= 0) & (wx < ww)
        hit = np.zeros(win.size, dtype=bool)
        hit[inside] = img[wy[inside], wx[inside]]
        return win[hit]

    while True:
        dev = np.abs(train - t_train)
        gain = ((dev - np.abs(train + g.hist - t_train)) * w).sum(axis=1)
        # the first train pixel of a class that can be split is worth a bonus (train comes first)
        first = ((g.hist > 0) & (train == 0) & (t_train > 0) & keep).sum(axis=1)
        gain += _FIRST_PIXEL_BONUS * first
        lost = (reach - own - own_near).sum(axis=1) * (k / n)  # pixels, in units of a mean class
        # blocks that keep free pixels of each class if block j goes to train (j itself among the lost)
        alive = own > 0
        own_g = own[grp_b, grp_c]
        dead = (own_g > 0) & (own_g == grp_count)
        left = alive.sum(axis=0) - np.bincount(grp_j * k + grp_c, weights=dead, minlength=nb * k).reshape(nb, k)
        feasible = ~in_train & ~(left < _kept_blocks(keep, need, alive.sum(axis=0), train)).any(axis=1)
        cand = feasible & (gain > 1e-12)
        score = gain * jitter - _LOSS_WEIGHT * lost
        if train.sum() >= floor:
            # past the overall share's lower bound: only moves that pay for their loss, or that serve a
            # class that can be split and is still far below its target
            short = keep & (train < _CLASS_FLOOR * t_train)
            cand &= (score > 0) | (g.hist[:, short] > 0).any(axis=1)
        if not cand.any():
            break
        j = int(np.argmax(np.where(cand, score, -np.inf)))
        in_train[j] = True
        train += g.hist[j]
        pix = g.bpix[g.bptr[j]:g.bptr[j + 1]]
        was_near = pix[near[pix]]
        np.subtract.at(own_near, (g.blk[was_near], cls[was_near]), 1)
        near[was_near] = False
        leave_free(pix[~is_train[pix] & ~np.isin(pix, was_near)])
        is_train[pix] = True
        newly = guarded_by(j)
        near[newly] = True
        np.add.at(own_near, (g.blk[newly], cls[newly]), 1)
        leave_free(newly)

    if refine is not None:
        in_train, is_train, near = refine(in_train)
    fp = ~is_train & ~near
    own = np.bincount(g.blk[fp] * k + cls[fp], minlength=nb * k).reshape(nb, k)
    # train first: a class that can be split but was left without train (its blocks kept for val/test) gets
    # the block holding it that costs the other classes least. Not a class whose pixels all lie within the
    # guard of each other: it could never also be tested, and its own train block's guard would drop the
    # val/test pixels of the classes around it (on Indian Pines at --train 0.1, 914 more pixels, and
    # Corn-mintill's test 237 -> 21). A block that would leave the scene without val/test pixels is not taken.
    train = np.bincount(cls[is_train], minlength=k)
    for c in np.flatnonzero((train == 0) & keep):
        if train[c]:
            continue  # served by the block taken for an earlier class
        alive = (own > 0).sum(axis=0)
        kept = _kept_blocks(keep, need, alive, train)
        options = []
        for j in np.flatnonzero(g.hist[:, c]).tolist():
            pix = g.bpix[g.bptr[j]:g.bptr[j + 1]]
            gone = np.concatenate((pix[fp[pix]], guarded_by(j)))  # pixels leaving val/test
            after = own.copy()
            np.subtract.at(after, (g.blk[gone], cls[gone]), 1)
            if not after.any():
                continue
            broken = np.delete((after > 0).sum(axis=0) < kept, c)
            # least: other classes losing coverage, then the class losing its own val/test, then guard loss
            options.append(((int(broken.sum()), int(not after[:, c].any()), gone.size), j, pix, gone))
        if not options:
            continue
        _, j, pix, gone = min(options, key=lambda o: o[0])
        in_train[j] = True
        np.subtract.at(own, (g.blk[gone], cls[gone]), 1)
        fp[gone] = False
        is_train[pix] = True
        near[pix] = False
        near[gone[~np.isin(gone, pix)]] = True
        train += np.bincount(cls[pix], minlength=k)
    free = np.bincount(cls[fp], minlength=k)
    in_val = np.zeros(nb, dtype=bool)
    if t_val is not None:
        # the guard takes its pixels from val and test alike: val keeps the share of the non-train pixels
        # it was asked for (V / (1 - T) for fractions), of those the guard left, so test is not starved
        asked = np.divide(t_val, n_cls - t_train, out=np.zeros(k), where=n_cls - t_train > 0)
        t_val = np.minimum(t_val, asked * free)
        val = np.zeros(k)
        test_left = free.copy()
        while True:
            dev = np.abs(val - t_val)
            gain = ((dev - np.abs(val + own - t_val)) * w).sum(axis=1)
            gain += _FIRST_PIXEL_BONUS * ((own > 0) & (val == 0) & (t_val > 0) & keep).sum(axis=1)
            # every class keeps its last test pixels, also one that cannot be split (test comes before val: a
            # class without train would otherwise end up val only, neither trained on nor scored)
            guarded = test_left >= 1
            feasible = ~in_train & ~in_val & ~((test_left - own < 1) & guarded).any(axis=1)
            cand = feasible & (gain > 1e-12)
            if not cand.any():
                break
            j = int(np.argmax(np.where(cand, gain * jitter, -np.inf)))
            in_val[j] = True
            val += own[j]
            test_left -= own[j]
    return _Assignment(in_train, in_val, is_train, near)


def _box_count(a: np.ndarray, r: int) -> np.ndarray:
    """Per pixel, the number of nonzero pixels of ``a`` within Chebyshev distance ``r`` (zero outside)."""
    h, w = a.shape
    c = np.zeros((h + 2 * r + 1, w + 2 * r + 1), dtype=np.int32)
    c[r + 1:r + 1 + h, r + 1:r + 1 + w] = a
    c = c.cumsum(axis=0).cumsum(axis=1)
    e = 2 * r + 1
    return c[e:e + h, e:e + w] - c[:h, e:e + w] - c[e:e + h, :w] + c[:h, :w]


def _refiner(g: _Grid, shape: tuple[int, int], ys: np.ndarray, xs: np.ndarray, cls: np.ndarray, n_cls: np.ndarray,
             guard: int, t_train: np.ndarray, keep: np.ndarray, need: int, share_range: tuple[float, float] | None,
             rng: np.random.Generator) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Local search after the greedy: flip single blocks between train and not-train while that lowers
    (guard loss / N + mean per-class train share error), keeping every class's coverage (train pixels,
    val/test blocks), its train floor and the overall share band. Exact: the guard is recomputed around
    each flipped block."""
    nb, k = g.hist.shape
    n = ys.size
    d = 2 * guard
    h, w = shape
    labelled = np.zeros(shape, dtype=bool)
    labelled[ys, xs] = True
    cls_img = np.zeros(shape, dtype=np.int64)
    cls_img[ys, xs] = cls
    blk_img = np.zeros(shape, dtype=np.int64)
    blk_img[ys, xs] = g.blk
    weight = 1.0 / (n_cls * k)
    floor = _CLASS_FLOOR * t_train
    boxes = []
    for j in range(nb):
        pix = g.bpix[g.bptr[j]:g.bptr[j + 1]]
        y0, y1 = max(int(ys[pix].min()) - d, 0), min(int(ys[pix].max()) + d + 1, h)
        x0, x1 = max(int(xs[pix].min()) - d, 0), min(int(xs[pix].max()) + d + 1, w)
        boxes.append((y0, y1, x0, x1, pix))

    def run(in_train: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        in_train = in_train.copy()
        train_img = np.zeros(shape, dtype=bool)
        train_px = in_train[g.blk]
        train_img[ys[train_px], xs[train_px]] = True
        cover = _box_count(train_img, d) if d > 0 else train_img.astype(np.int32)
        fp_img = labelled & ~train_img & (cover == 0)
        own = np.bincount(g.blk[fp_img[ys, xs]] * k + cls[fp_img[ys, xs]], minlength=nb * k).reshape(nb, k)
        alive = (own > 0).sum(axis=0)
        train = np.bincount(cls[train_px], minlength=k).astype(np.float64)
        for _ in range(8):
            improved = False
            for j in rng.permutation(nb).tolist():
                y0, y1, x0, x1, pix = boxes[j]
                sign = -1 if in_train[j] else 1
                local = np.zeros((y1 - y0, x1 - x0), dtype=bool)
                local[ys[pix] - y0, xs[pix] - x0] = True
                cov0 = cover[y0:y1, x0:x1]
                cov1 = cov0 + sign * (_box_count(local, d) if d > 0 else local)
                lab = labelled[y0:y1, x0:x1]
                tr0 = train_img[y0:y1, x0:x1]
                tr1 = (tr0 & ~local) | (local if sign > 0 else False)
                lost0 = lab & ~tr0 & (cov0 > 0)
                lost1 = lab & ~tr1 & (cov1 > 0)
                new_train = train + sign * g.hist[j]
                d_err = ((np.abs(new_train - t_train) - np.abs(train - t_train)) * weight).sum()
                d_j = (int(lost1.sum()) - int(lost0.sum())) / n + d_err
                if d_j >= -1e-12:
                    continue
                if share_range is not None and not share_range[0] <= new_train.sum() / n <= share_range[1]:
                    continue
                if (((train >= 1) & (new_train < 1)) | (keep & (train >= floor) & (new_train < floor))).any():
                    continue
                # no class's train count may drift further from its target than _REFINE_DRIFT of it
                dev0, dev1 = np.abs(train - t_train), np.abs(new_train - t_train)
                if ((dev1 > dev0) & (dev1 > _REFINE_DRIFT * t_train)).any():
                    continue
                # val/test blocks left per class
                f0, f1 = lab & ~tr0 & (cov0 == 0), lab & ~tr1 & (cov1 == 0)
                bl, cl = blk_img[y0:y1, x0:x1], cls_img[y0:y1, x0:x1]
                delta = np.zeros((nb, k), dtype=np.int64)
                np.add.at(delta, (bl[f1], cl[f1]), 1)
                np.subtract.at(delta, (bl[f0], cl[f0]), 1)
                rows = np.flatnonzero(delta.any(axis=1))
                own_new = own[rows] + delta[rows]
                new_alive = alive + (own_new > 0).sum(axis=0) - (own[rows] > 0).sum(axis=0)
                if (new_alive < _kept_blocks(keep, need, alive, train)).any():
                    continue
                # accept
                in_train[j] = sign > 0
                train = new_train
                cover[y0:y1, x0:x1] = cov1
                train_img[y0:y1, x0:x1] = tr1
                own[rows] = own_new
                alive = new_alive
                improved = True
            if not improved:
                break
        is_train = train_img[ys, xs]
        near = ~is_train & (cover[ys, xs] > 0)
        return in_train, is_train, near

    return run


def _check_block_args(labels: Any, block_size: Any, train: Any, val: Any, guard: Any) -> tuple[np.ndarray, int]:
    lab = _check_labels(labels)
    g = _check_int("guard", guard, 0)
    if block_size is not None:
        bs = _check_int("block_size", block_size, 1)
        if bs < min_block_size(g):
            raise InputError(f"block_size ({bs}) must be at least {min_block_size(g)} for guard {g} "
                             "(smaller blocks make the guard bookkeeping explode); use a larger block size")
    _check_amount("train", train, allow_zero=False, allow_count=True)
    _check_amount("val", val, allow_zero=True, allow_count=True)
    _check_fraction_sum(train, val)
    return lab, g


def block_split_details(
    labels: Any,
    *,
    block_size: int | None = None,
    train: float | int = 0.1,
    val: float | int = 0.0,
    guard: int = 7,
    seed: Any = 0,
) -> BlockSplit:
    """:func:`block_split` with everything it decided: blocks, chosen size, guard loss, unsplit classes.

    Takes the same arguments as :func:`block_split` and returns a :class:`BlockSplit`; issues no warning
    (see :meth:`BlockSplit.warning`).
    """
    lab, g = _check_block_args(labels, block_size, train, val, guard)
    h, w = lab.shape
    ys, xs = np.nonzero(lab)
    sizes = candidate_block_sizes(lab.shape, g) if block_size is None else [int(block_size)]
    rng = np.random.default_rng(seed)
    origins = [(-int(rng.integers(b)), -int(rng.integers(b))) for b in sizes]
    want_val = val != 0
    if ys.size == 0:
        bs, origin = sizes[-1], origins[-1]
        blocks = np.zeros((-(-(h - origin[0]) // bs), -(-(w - origin[1]) // bs)), dtype=np.uint8)
        return BlockSplit(np.zeros(lab.shape, np.uint8), blocks, bs, origin, g, 0, {}, {}, want_val)
    classes, cls, n_cls = _compact(lab[ys, xs])
    k = classes.size
    t_train = _targets(n_cls, train)
    t_val = _targets(n_cls, val) if want_val else None
    # a class whose pixels are all within 2*guard of each other cannot have both train and val/test
    diameter = np.zeros(k, dtype=np.int64)
    for coord in (ys, xs):
        lo = np.full(k, np.iinfo(np.int64).max)
        hi = np.full(k, np.iinfo(np.int64).min)
        np.minimum.at(lo, cls, coord)
        np.maximum.at(hi, cls, coord)
        diameter = np.maximum(diameter, hi - lo)
    far_apart = diameter > 2 * g

    margin = min(TRAIN_SHARE_TOLERANCE - 0.005, 0.2 * float(train)) if _is_float(train) else 0.0
    band = (train - margin, train + margin) if _is_float(train) else None

    def attempt(bs: int, origin: tuple[int, int], seeds: tuple[int, int], refined: bool):
        grid = _make_grid(lab.shape, ys, xs, cls, k, bs, origin, g)
        jitter = 1.0 + _JITTER * np.random.default_rng(seeds[0]).random(grid.ub.size)
        keep = _splittable(grid, ys, xs, cls, g)
        refine = _refiner(grid, lab.shape, ys, xs, cls, n_cls, g, t_train, keep, 1 + want_val, band,
                          np.random.default_rng(seeds[1])) if refined else None
        a = _assign(grid, ys, xs, cls, n_cls, g, t_train, t_val, keep, jitter, refine)
        code = np.where(a.is_train, SPLIT_TRAIN,
                        np.where(a.near, SPLIT_NONE, np.where(a.in_val[grid.blk], SPLIT_VAL, SPLIT_TEST)))
        per = np.zeros((4, k), dtype=np.int64)
        np.add.at(per, (code, cls), 1)
        missing = (per[SPLIT_TRAIN] == 0) | (per[SPLIT_TEST] == 0) | ((per[SPLIT_VAL] == 0) & want_val)
        share = per[SPLIT_TRAIN].sum() / ys.size
        excess = max(0.0, abs(share - train) - TRAIN_SHARE_TOLERANCE) if _is_float(train) else 0.0
        error = np.abs(per[SPLIT_TRAIN] - t_train) / n_cls
        if want_val:
            error = error + np.abs(per[SPLIT_VAL] - t_val) / n_cls
        # classes that can be split but got less than _CLASS_FLOOR of their train target
        short = int(((per[SPLIT_TRAIN] < _CLASS_FLOOR * t_train) & far_apart).sum())
        key = (int((missing & far_apart).sum()), round(float(excess), 9), short,
               round(float(per[SPLIT_NONE].sum() / ys.size + error.mean()), 9))
        return key, (grid, a, code, per, missing)

    # greedy on every size, then the local search on the best _REFINED of them
    seeds = [(int(rng.integers(2**63)), int(rng.integers(2**63))) for _ in sizes]
    greedy = {bs: attempt(bs, origin, sd, False) for bs, origin, sd in zip(sizes, origins, seeds)}
    tried: dict[int, tuple[int, float, int, float]] = {bs: r[0] for bs, r in greedy.items()}
    best = min(greedy.values(), key=lambda r: r[0])
    refined = sorted(range(len(sizes)), key=lambda i: tried[sizes[i]])[:_REFINED]
    # the guard's loss depends on where the grid falls: the best sizes are also tried at other origins
    shifted = [(-int(rng.integers(sizes[i])), -int(rng.integers(sizes[i])), int(rng.integers(2**63)),
                int(rng.integers(2**63))) for i in refined for _ in range(_ORIGINS - 1)]
    runs = [(sizes[i], origins[i], seeds[i]) for i in refined]
    runs += [(sizes[i], (oy, ox), (s0, s1)) for i, (oy, ox, s0, s1) in zip(np.repeat(refined, _ORIGINS - 1), shifted)]
    for bs, origin, sd in runs:
        result = attempt(bs, origin, sd, True)
        tried[bs] = min(tried[bs], result[0])
        if result[0] < best[0]:
            best = result
    _, (grid, a, code, per, missing) = best
    out = np.zeros(lab.shape, dtype=np.uint8)
    out[ys, xs] = code
    blocks = np.zeros(grid.shape, dtype=np.uint8)
    block_code = np.where(a.in_train, SPLIT_TRAIN, np.where(a.in_val, SPLIT_VAL, SPLIT_TEST)).astype(np.uint8)
    blocks.reshape(-1)[grid.ub] = block_code
    n_blocks = (grid.hist > 0).sum(axis=0)
    unsplit = {int(classes[c]): int(n_blocks[c]) for c in np.flatnonzero(missing)}
    counts = {int(classes[c]): (int(per[SPLIT_TRAIN, c]), int(per[SPLIT_VAL, c]), int(per[SPLIT_TEST, c]))
              for c in np.flatnonzero(missing)}
    return BlockSplit(out, blocks, grid.bs, grid.origin, g, int(per[SPLIT_NONE].sum()), unsplit, tried, want_val,
                      counts)


def block_split(
    labels: Any,
    *,
    block_size: int | None = None,
    train: float | int = 0.1,
    val: float | int = 0.0,
    guard: int = 7,
    seed: Any = 0,
) -> np.ndarray:
    """Spatially disjoint, stratified split: whole blocks go to one split, val/test keep away from train.

    Parameters
    ----------
    labels : array_like of int, shape (H, W)
        0 = unlabelled, 1..K = classes.
    block_size : int, optional
        Side of the square blocks. Default: adaptive, the best of :func:`candidate_block_sizes` (see
        Notes). At least :func:`min_block_size`.
    train, val : float or int
        A float in (0, 1) is the wanted share of each class (so also of all labelled pixels); an int
        >= 1 is a pixel count per class (capped at ``n - 1``). ``val`` may be 0 (no val split).
    guard : int
        Patch radius ``h`` of the largest patch used (a 15x15 patch -> 7). No val or test pixel is
        left within Chebyshev distance ``2 * guard`` of a train pixel, so no scene pixel is seen by
        both a train patch and a val/test patch. 0 disables the guard.
    seed : int, optional
        Seeds the grid origin and the tie-breaking; the same seed gives the same map.

    Returns
    -------
    numpy.ndarray of uint8, shape (H, W)
        ``SPLIT_*`` codes. Guarded pixels are ``SPLIT_NONE``.

    Warns
    -----
    UnsplittableClassWarning
        Naming each class left without a pixel in some split, with its block count.

    Notes
    -----
    The scene is cut into square blocks on a grid whose origin is shifted by a seeded offset. With
    ``n[b, c]`` the pixels of class ``c`` in block ``b``, ``N[c]`` the class's size and ``t[c]`` its train
    target (docs/splits.md has the same with examples and tables):

    1. **Train, greedily.** Repeatedly move to train the block with the best score
       ``gain * (1 + 0.2 u_b) - 3 * loss``: ``gain`` is the drop of ``sum_c |train[c] - t[c]| / N[c]`` plus 1
       for each splittable class the block gives its first train pixel; ``loss`` counts the val/test
       pixels the guard would newly drop (in the block grown by ``2 * guard``, in units of a mean class,
       ``pixels * K / N``), so train areas stay compact; ``u_b`` is seeded. Candidates have a positive gain
       and never leave a splittable class without a val/test block (two with val). The best candidate is
       taken even at a loss until the train share is within 1.5 points below target and every splittable
       class has 70% of its target; after that only candidates with a positive score.
    2. **Local search.** Single blocks flip between train and not-train while that lowers ``guard loss /
       N + mean_c |train[c] - t[c]| / N[c]``, keeping coverage, the 70% floors, every class within 25% of
       its target (or no further off than it was) and the share within ``min(2.5 points, T / 5)``.
       **Train first:** a class that can be split but is still without train then gets the block holding
       it that leaves the fewest
       other classes without val/test blocks, then keeps its own val/test, then drops fewest pixels; never
       one that would leave the scene no val/test pixel.
    3. **Guard, on one side.** Train pixels are kept; every other labelled pixel within Chebyshev
       distance ``2 * guard`` of a train pixel becomes ``SPLIT_NONE``.
    4. **Val, greedily** (when ``val`` is not 0), the same way over the remaining blocks with their
       surviving pixels, never taking a class's last test block (also of a class that cannot be split:
       test comes before val). Val and test are not guarded from each
       other.
    5. The rest is test.
    6. **Block size.** Without ``block_size``, steps 1-5 run for each of :func:`candidate_block_sizes` (the
       local search for the two best after the greedy) and the result with, in this order, the fewest
       classes left without a split although their pixels lie more than ``2 * guard`` apart, a train share
       within ``TRAIN_SHARE_TOLERANCE`` of a fractional target, and the least (guard loss + mean per-class
       share error) wins.

    A class "can be split" when two of its pixels in different blocks are more than ``2 * guard`` apart;
    the others (and any the search could not serve) miss a split and are named in the warning.
    """
    result = block_split_details(labels, block_size=block_size, train=train, val=val, guard=guard, seed=seed)
    message = result.warning()
    if message is not None:
        warnings.warn(message, UnsplittableClassWarning, stacklevel=2)
    return result.split


def make_split(labels: Any, method: str, *, train: float | int = 0.1, val: float | int = 0.0,
               block_size: int | None = None, guard: int = 7, seed: int = 0) -> tuple[np.ndarray, dict[str, Any]]:
    """A ``random`` or ``blocks`` split map and the parameters a store records for it (``split`` metadata).

    Used by ``hsgds convert`` and ``hsgds resplit``. A block split that leaves classes unsplit issues an
    :class:`UnsplittableClassWarning`, one whose train share misses a fractional ``train`` by more than
    :data:`TRAIN_SHARE_WARN` a :class:`TrainShareWarning`; its record holds the chosen block size and origin, the guard, the
    labelled pixels the guard dropped (``guard_lost``) and the unsplit classes with their block counts.
    """
    params: dict[str, Any] = {"method": method, "seed": seed}
    lab = _check_labels(labels)
    if not lab.any():
        return np.zeros(lab.shape, np.uint8), {"method": "none"}
    if method == "random":
        params.update(train=train, val=val)
        return random_split(lab, train=train, val=val, seed=seed), params
    if method != "blocks":
        raise InputError(f"unknown split method {method!r}; choose random or blocks")
    result = block_split_details(lab, block_size=block_size, train=train, val=val, guard=guard, seed=seed)
    params.update(train=train, val=val, block_size=result.block_size, block_origin=list(result.origin),
                  adaptive_block_size=block_size is None, guard=result.guard, guard_distance=2 * result.guard,
                  guard_lost=result.lost, unsplit_classes={str(c): n for c, n in result.unsplit.items()})
    message = result.warning()
    if message is not None:
        warnings.warn(message, UnsplittableClassWarning, stacklevel=2)
    message = _share_warning(result, lab, train, adaptive=block_size is None)
    if message is not None:
        warnings.warn(message, TrainShareWarning, stacklevel=2)
    return result.split, params


def _share_warning(result: BlockSplit, labels: np.ndarray, train: float | int, adaptive: bool) -> str | None:
    """One line when the train share of the labelled pixels misses a fractional ``train`` by more than
    :data:`TRAIN_SHARE_WARN`; None otherwise (also without train pixels: the commands refuse such a split)."""
    n_train = int(np.count_nonzero(result.split == SPLIT_TRAIN))
    if not _is_float(train) or n_train == 0:
        return None
    n_labelled = int(np.count_nonzero(labels))
    share = n_train / n_labelled
    # exactly, as written: in floating point 11 of 20 pixels (55%) was more than 5 points from 0.5 (and 45% not)
    if abs(Fraction(n_train, n_labelled) - Fraction(repr(float(train)))) <= Fraction(repr(TRAIN_SHARE_WARN)):
        return None
    if adaptive:
        fix = "no adaptive block size came closer on these labels; a smaller --block-size or another --seed may"
    else:
        fix = "use a smaller --block-size, or leave it out to let the converter choose"
    return (f"block split: train is {100 * share:.1f}% of the labelled pixels, not the {100 * float(train):.1f}% "
            f"asked for (--train {train:g}), with blocks of {result.block_size} px: {fix}")


# --------------------------------------------------------------------------------------------------
# masks and counts


def mask_split(
    labels: Any,
    *,
    train_mask: Any,
    test_mask: Any,
    val_mask: Any | None = None,
    names: Mapping[str, str] | None = None,
) -> np.ndarray:
    """Split from user-supplied masks (nonzero = in the split), e.g. an official benchmark split.

    Parameters
    ----------
    labels : array_like of int, shape (H, W)
        0 = unlabelled, 1..K = classes.
    train_mask, test_mask : array_like, shape (H, W)
        Nonzero where a pixel belongs to the split.
    val_mask : array_like, shape (H, W), optional
        Nonzero where a pixel belongs to val; default: no val split.
    names : mapping of str to str, optional
        How errors name ``labels`` and the masks (keys ``"labels"``, ``"train_mask"``, ``"val_mask"``,
        ``"test_mask"``); default: the parameter names. The converter passes its options (``--train-mask
        tm.npy``), as the user typed them.

    Returns
    -------
    numpy.ndarray of uint8, shape (H, W)
        ``SPLIT_*`` codes. Labelled pixels in no mask, and all unlabelled pixels, are ``SPLIT_NONE``.

    Raises
    ------
    InputError
        A mask's shape differs from the labels' shape, or masks overlap (any pixel, labelled or not,
        in more than one mask).
    """
    lab = _check_labels(labels)
    called = {"labels": "labels", "train_mask": "train_mask", "val_mask": "val_mask", "test_mask": "test_mask",
              **(names or {})}
    masks: dict[str, np.ndarray] = {}
    for name, m in (("train_mask", train_mask), ("val_mask", val_mask), ("test_mask", test_mask)):
        if m is None:
            continue
        arr = np.asarray(m)
        if arr.shape != lab.shape:
            raise InputError(
                f"{called[name]} has shape {arr.shape} but {called['labels']} has shape {lab.shape}; masks must "
                "match the label map pixel for pixel"
            )
        masks[name] = arr != 0

    stacked = sum(m.astype(np.uint8) for m in masks.values())
    n_overlap = int(np.count_nonzero(stacked > 1))
    if n_overlap:
        given = list(masks)
        pairs = ", ".join(
            f"{called[a]} & {called[b]}: {int(np.count_nonzero(masks[a] & masks[b]))}"
            for i, a in enumerate(given) for b in given[i + 1:]
            if (masks[a] & masks[b]).any()
        )
        raise InputError(
            f"{n_overlap} pixels are in more than one split mask ({pairs}); make the masks disjoint"
        )

    out = np.zeros(lab.shape, dtype=np.uint8)
    labelled = lab != 0
    out[masks["train_mask"] & labelled] = SPLIT_TRAIN
    if "val_mask" in masks:
        out[masks["val_mask"] & labelled] = SPLIT_VAL
    out[masks["test_mask"] & labelled] = SPLIT_TEST
    # the masks are the user's: reported, never changed
    with_val = "val_mask" in masks
    classes, cinv, _ = _compact(lab[labelled])
    table = split_class_counts(out[labelled], cinv, classes.size - 1)
    missing = (table["train"] == 0) | (table["test"] == 0) | ((table["val"] == 0) & with_val)
    if missing.any() and (out == SPLIT_TRAIN).any():  # no train at all: the commands refuse the split
        parts = {int(classes[c]): _counts_text(table["train"][c], table["val"][c], table["test"][c], with_val)
                 for c in np.flatnonzero(missing)}
        warnings.warn(f"mask split: {_classes_text(parts)} {'is' if len(parts) == 1 else 'are'} "
                      f"missing from some split of the masks; a class without train pixels is evaluated but never "
                      "trained on", UnsplittableClassWarning, stacklevel=2)
    return out


def split_counts(labels: Any, split_map: Any) -> dict[str, dict[int, int]]:
    """Per split, the number of labelled pixels of each class.

    Returns ``{"train": {class: n, ...}, "val": {...}, "test": {...}, "none": {...}}``. Every split
    lists every class present in ``labels`` (ascending, zero counts included) so the result prints as
    a table; ``"none"`` counts labelled pixels in no split (e.g. guard band). Unlabelled pixels are not
    counted.
    """
    lab = _check_labels(labels)
    sm = np.asarray(split_map)
    if sm.shape != lab.shape:
        raise InputError(
            f"split_map has shape {sm.shape} but labels has shape {lab.shape}; they must match"
        )
    if sm.dtype == np.bool_ or not np.issubdtype(sm.dtype, np.integer):
        raise InputError(f"split_map must hold integer SPLIT_* codes, got dtype {sm.dtype}")
    labelled = lab != 0
    codes = sm[labelled]
    bad = (codes < 0) | (codes > max(SPLIT_CODES.values()))
    if bad.any():
        raise InputError(
            f"split_map has {int(bad.sum())} labelled pixels with codes outside "
            f"{sorted(SPLIT_CODES.values())}; build it with one of the hsgds.preprocess.splits functions"
        )
    classes, cinv, _ = _compact(lab[labelled])
    table = split_class_counts(codes, cinv, classes.size - 1)  # counted by class index 0..C-1
    order = ("train", "val", "test", "none")
    return {name: {int(c): int(n) for c, n in zip(classes, table[name])} for name in order}

