"""Train/val/test split maps over a labelled scene.

Every split function takes ``labels``, a 2-D integer ``(H, W)`` array in which 0 means unlabelled and
``1..K`` are classes, and returns a ``uint8`` ``(H, W)`` map of :data:`hsgds.format` ``SPLIT_*`` codes.
Unlabelled pixels are always ``SPLIT_NONE``. Randomised splits are deterministic for a given ``seed``
(one :func:`numpy.random.default_rng` stream per call).

Three strategies:

* :func:`random_split` -- stratified per class, pixels drawn independently. Simple, but neighbouring
  train and test pixels share most of a patch, which inflates test scores for patch-based models.
* :func:`block_split` -- spatially disjoint: square blocks go to one split each, and a guard band
  removes every labelled pixel whose patch of radius ``guard`` would see a block of another split.
* :func:`mask_split` -- user-supplied masks (e.g. an official benchmark split).

:func:`split_counts` tabulates the result per split and class.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import numpy as np
from scipy.ndimage import maximum_filter

from hsgds.errors import InputError
from hsgds.format import SPLIT_CODES, SPLIT_NONE, SPLIT_TEST, SPLIT_TRAIN, SPLIT_VAL

__all__ = [
    "block_assignment",
    "block_split",
    "default_block_size",
    "mask_split",
    "random_split",
    "split_counts",
]

_SPLITS = (SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST)


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
        return
    if allow_count:
        raise InputError(
            f"{name} must be a fraction in (0, 1) or a per-class pixel count >= 1, got {value!r}"
        )
    raise InputError(f"{name} must be a fraction in (0, 1) of the labelled pixels, got {value!r}")


def _check_fraction_sum(train: Any, val: Any) -> None:
    if _is_float(train) and _is_float(val) and train + val >= 1.0:
        raise InputError(
            f"train + val fractions must be below 1 so that pixels are left for test, "
            f"got {train} + {val} = {train + val:g}"
        )


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
# random split


def _class_amounts(counts: np.ndarray, spec: float | int) -> np.ndarray:
    """Requested pixels per class before capping: round(frac * n) half up, or the count itself."""
    if _is_float(spec):
        # floor(x + 0.5) = round half up; np.round would round half to even (0.5 -> 0)
        return np.floor(float(spec) * counts + 0.5).astype(np.int64)
    return np.full(counts.shape, int(spec), dtype=np.int64)


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

    1. Requested sizes: a fraction ``f`` asks for ``floor(f * n + 0.5)`` pixels (round half up), a
       count ``c`` asks for ``c``.
    2. A class with ``n >= 2`` gets at least 1 train pixel, even if its fraction rounds to 0.
    3. At least one pixel is kept for test whenever ``n >= 2``: train is capped at ``n - 1``, then val
       at what train left (``n - 1 - n_train``). Train is served first, so a small class may get no
       val pixels. A class with a single pixel puts it in train if the request rounds to >= 1 (always
       for a count), else in test.
    4. The rest of the class is test. Which pixels go where is a uniform random permutation.
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
    _, inv, counts = _compact(flat[idx])

    n_train = _class_amounts(counts, train)
    n_train = np.maximum(n_train, (counts >= 2).astype(np.int64))
    avail = np.where(counts >= 2, counts - 1, counts)  # pixels allowed to leave test
    n_train = np.minimum(n_train, avail)
    n_val = np.zeros_like(n_train) if val == 0 else _class_amounts(counts, val)
    n_val = np.minimum(n_val, avail - n_train)

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
# block split


def default_block_size(shape: tuple[int, ...], guard: int = 7) -> int:
    """Block side used by :func:`block_split` when none is given.

    ``max(4 * guard + 1, min(H, W) // 8)``: about 8 blocks along the short side of the scene (so the
    split has enough blocks to approach the requested fractions), but never smaller than
    ``4 * guard + 1``, so that a block surrounded by blocks of other splits still keeps more than half
    of its side (the inner ``2 * guard + 1``) outside the guard band.
    """
    if len(shape) < 2:
        raise InputError(f"shape must have at least 2 dimensions (H, W), got {tuple(shape)}")
    g = _check_int("guard", guard, 0)
    h, w = int(shape[0]), int(shape[1])
    return max(4 * g + 1, min(h, w) // 8)


def _expand_blocks(blocks: np.ndarray, block_size: int, shape: tuple[int, int]) -> np.ndarray:
    """Per-block codes -> per-pixel codes, cropped to the scene."""
    h, w = shape
    return np.repeat(np.repeat(blocks, block_size, axis=0), block_size, axis=1)[:h, :w]


def _apply_guard(lab: np.ndarray, blocks: np.ndarray, block_size: int, guard: int) -> np.ndarray:
    """Split map from a block assignment, with the guard band applied."""
    pix = _expand_blocks(blocks, block_size, lab.shape)
    labelled = lab != 0
    out = np.where(labelled, pix, SPLIT_NONE).astype(np.uint8)
    if guard == 0:
        return out
    # How many distinct splits occur within Chebyshev distance `guard` of each pixel. A labelled
    # pixel sees its own split, so it survives only if it sees exactly one. Blocks without labelled
    # pixels are SPLIT_NONE and take part in no split, so they never cause a guard.
    size = 2 * guard + 1
    seen = np.zeros(lab.shape, dtype=np.uint8)
    for s in _SPLITS:
        seen += maximum_filter((pix == s).view(np.uint8), size=size, mode="constant", cval=0)
    out[seen > 1] = SPLIT_NONE
    return out


def _block_split(
    labels: Any, block_size: int | None, train: float, val: float, guard: int, seed: Any
) -> tuple[np.ndarray, np.ndarray, int]:
    """Shared body of :func:`block_split` and :func:`block_assignment`: (blocks, split map, size)."""
    lab = _check_labels(labels)
    g = _check_int("guard", guard, 0)
    if block_size is None:
        bs = default_block_size(lab.shape, g)
    else:
        bs = _check_int("block_size", block_size, 1)
    if bs <= 2 * g:
        raise InputError(
            f"block_size ({bs}) must be larger than 2*guard ({2 * g}), else the guard band removes every "
            f"pixel of a block whose neighbours are in other splits; use block_size >= {2 * g + 1} "
            f"({4 * g + 1} or more keeps most of each block) or a smaller guard"
        )
    _check_amount("train", train, allow_zero=False, allow_count=False)
    _check_amount("val", val, allow_zero=True, allow_count=False)
    _check_fraction_sum(train, val)

    h, w = lab.shape
    nby, nbx = -(-h // bs), -(-w // bs)
    blocks = np.zeros((nby, nbx), dtype=np.uint8)
    ys, xs = np.nonzero(lab)
    if ys.size == 0:
        return blocks, np.zeros(lab.shape, dtype=np.uint8), bs

    # Only blocks holding labelled pixels get a split; `ub` indexes them compactly.
    by, bx = ys // bs, xs // bs
    ub, binv, bcount = _compact(by * nbx + bx)
    classes, cinv, _ = _compact(lab[ys, xs])
    n_cls = classes.size

    rng = np.random.default_rng(seed)
    order = rng.permutation(ub.size)

    # Greedy fill in random block order: each block goes to the split furthest below its target
    # number of labelled pixels. Interleaving (rather than filling train first) spreads every split
    # over the scene and overshoots each target by less than one block.
    total = float(ys.size)
    target = [train * total, float(val) * total, (1.0 - train - val) * total]
    # a split with a zero target (val=0) never takes a block
    active = [k for k in range(3) if target[k] > 0]
    have = [0.0, 0.0, 0.0]
    pick = np.zeros(ub.size, dtype=np.int64)
    sizes = bcount.tolist()
    for b in order.tolist():  # plain Python: ~1 us per block, scenes have at most ~1e5 blocks
        k = max(active, key=lambda i: target[i] - have[i])  # ties -> train, then val, then test
        pick[b] = k
        have[k] += sizes[b]
    split_of = np.asarray(_SPLITS, dtype=np.uint8)[pick]

    blocks.reshape(-1)[ub] = split_of
    out = _apply_guard(lab, blocks, bs, g)

    # Class coverage: every class should keep at least one train pixel after the guard. For a class
    # without one, pick its pixel whose guard window touches the fewest blocks of val/test, and move
    # those blocks (at most 4, as block_size > 2*guard) to train: that pixel then survives. Moving
    # blocks to train never removes a train pixel elsewhere, so one pass over the classes suffices.
    train_cls = np.bincount(cinv[out[ys, xs] == SPLIT_TRAIN], minlength=n_cls)
    missing = np.flatnonzero(train_cls == 0)
    if missing.size:
        rank = np.zeros((nby, nbx), dtype=np.int64)  # blocks' position in the shuffled order
        rank.reshape(-1)[ub[order]] = np.arange(ub.size)

        def foreign(yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
            code = blocks[yy, xx]
            return ((code != SPLIT_TRAIN) & (code != SPLIT_NONE)).astype(np.int64)

        for c in missing:
            py, px = ys[cinv == c], xs[cinv == c]
            # first and last block row/column each pixel's window reaches
            y0, y1 = np.maximum(py - g, 0) // bs, np.minimum(py + g, h - 1) // bs
            x0, x1 = np.maximum(px - g, 0) // bs, np.minimum(px + g, w - 1) // bs
            two_y, two_x = (y1 != y0).astype(np.int64), (x1 != x0).astype(np.int64)
            cost = (foreign(y0, x0) + two_x * foreign(y0, x1) + two_y * foreign(y1, x0)
                    + two_y * two_x * foreign(y1, x1))
            # fewest blocks to move; ties -> earliest block in the shuffled order, then raster order
            k = np.lexsort((rank[py // bs, px // bs], cost))[0]
            if cost[k] == 0:
                continue  # an earlier move already freed a pixel of this class
            for yy in {int(y0[k]), int(y1[k])}:
                for xx in {int(x0[k]), int(x1[k])}:
                    if blocks[yy, xx] != SPLIT_NONE:
                        blocks[yy, xx] = SPLIT_TRAIN
        out = _apply_guard(lab, blocks, bs, g)
    return blocks, out, bs


def block_split(
    labels: Any,
    *,
    block_size: int | None = None,
    train: float = 0.5,
    val: float = 0.0,
    guard: int = 7,
    seed: Any = 0,
) -> np.ndarray:
    """Spatially disjoint split: whole blocks go to one split, with a guard band between splits.

    Parameters
    ----------
    labels : array_like of int, shape (H, W)
        0 = unlabelled, 1..K = classes.
    block_size : int, optional
        Side of the square blocks the scene is tiled into, from the top-left corner (the last row and
        column of blocks may be cut by the scene edge). Must be larger than ``2 * guard``. Default:
        :func:`default_block_size`.
    train, val : float
        Target fractions of the *labelled* pixels in train and val (before the guard band); ``val``
        may be 0. ``train + val`` must be below 1; the rest is test.
    guard : int
        Guard radius, normally the patch radius used in training (a 15x15 patch -> 7). 0 disables it.
    seed : int, optional
        Seed of :func:`numpy.random.default_rng`; the same seed gives the same map.

    Returns
    -------
    numpy.ndarray of uint8, shape (H, W)
        ``SPLIT_*`` codes.

    Notes
    -----
    Assignment (see :func:`block_assignment` for the per-block result):

    * Only blocks that contain labelled pixels are assigned; empty blocks belong to no split and
      never cause a guard.
    * Blocks are visited in a seeded random order; each goes to the split furthest below its target
      count of labelled pixels. Each split thus overshoots its target by less than one block, so the
      fractions are close when blocks are small compared with the scene.
    * Class coverage: if a class ends up with no train pixel after the guard band, its pixel whose
      guard window touches the fewest val/test blocks is chosen and those blocks (at most 4) are
      moved to train, so every class keeps at least one train pixel. This takes priority over the
      fractions (which drift by the moved blocks) and over val/test coverage: a class found in one
      block only goes wholly to train.

    Guard band: a labelled pixel is set to ``SPLIT_NONE`` when any pixel (labelled or not) within
    Chebyshev distance ``guard`` lies in a block assigned to another split. This applies to train,
    val and test alike, so no patch of radius ``guard`` centred on a pixel of one split contains a
    pixel of a block of another split.
    """
    return _block_split(labels, block_size, train, val, guard, seed)[1]


def block_assignment(
    labels: Any,
    *,
    block_size: int | None = None,
    train: float = 0.5,
    val: float = 0.0,
    guard: int = 7,
    seed: Any = 0,
) -> np.ndarray:
    """Per-block split codes that :func:`block_split` uses for the same arguments.

    Returns a uint8 array of shape ``(ceil(H / block_size), ceil(W / block_size))``; element
    ``[i, j]`` covers pixels ``[i*block_size:(i+1)*block_size, j*block_size:(j+1)*block_size]``.
    Blocks without labelled pixels are ``SPLIT_NONE``. Useful to plot or audit a split.
    """
    return _block_split(labels, block_size, train, val, guard, seed)[0]


# --------------------------------------------------------------------------------------------------
# masks and counts


def mask_split(
    labels: Any,
    *,
    train_mask: Any,
    test_mask: Any,
    val_mask: Any | None = None,
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
    masks: dict[str, np.ndarray] = {}
    for name, m in (("train_mask", train_mask), ("val_mask", val_mask), ("test_mask", test_mask)):
        if m is None:
            continue
        arr = np.asarray(m)
        if arr.shape != lab.shape:
            raise InputError(
                f"{name} has shape {arr.shape} but labels has shape {lab.shape}; masks must match the "
                "label map pixel for pixel"
            )
        masks[name] = arr != 0

    stacked = sum(m.astype(np.uint8) for m in masks.values())
    n_overlap = int(np.count_nonzero(stacked > 1))
    if n_overlap:
        names = list(masks)
        pairs = ", ".join(
            f"{a} & {b}: {int(np.count_nonzero(masks[a] & masks[b]))}"
            for i, a in enumerate(names) for b in names[i + 1:]
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
            f"{sorted(SPLIT_CODES.values())}; build it with one of the preprocess.splits functions"
        )
    classes, cinv, _ = _compact(lab[labelled])
    n_codes = max(SPLIT_CODES.values()) + 1
    table = np.bincount(
        codes.astype(np.int64) * classes.size + cinv, minlength=n_codes * classes.size
    ).reshape(n_codes, classes.size)
    order = ("train", "val", "test", "none")
    return {
        name: {int(c): int(n) for c, n in zip(classes, table[SPLIT_CODES[name]])} for name in order
    }
