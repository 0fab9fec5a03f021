"""Tests for preprocess.splits: split invariants, stratification rules, guard band, argument errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from hsgds.errors import InputError
from hsgds.format import SPLIT_NONE, SPLIT_TEST, SPLIT_TRAIN, SPLIT_VAL
from hsgds.preprocess.splits import (
    block_assignment,
    block_split,
    default_block_size,
    mask_split,
    random_split,
    split_counts,
)

CODES = (SPLIT_NONE, SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST)


def random_labels(shape, n_classes, p_unlabelled=0.3, seed=0):
    rng = np.random.default_rng(seed)
    lab = rng.integers(1, n_classes + 1, size=shape)
    lab[rng.random(shape) < p_unlabelled] = 0
    return lab


def class_sizes_labels(sizes, seed=0):
    """A 1-row-per-class scene: class k+1 has sizes[k] pixels, the rest of each row unlabelled."""
    width = max(sizes) + 3
    lab = np.zeros((len(sizes), width), dtype=np.int32)
    for k, n in enumerate(sizes):
        lab[k, :n] = k + 1
    # shuffle columns per row so that positions are not trivially the first n
    rng = np.random.default_rng(seed)
    for row in lab:
        rng.shuffle(row)
    return lab


def check_basic(labels, split):
    """Shape, dtype, valid codes, unlabelled -> NONE."""
    assert split.shape == labels.shape
    assert split.dtype == np.uint8
    assert np.isin(split, CODES).all()
    assert (split[labels == 0] == SPLIT_NONE).all()


def count(labels, split, cls, code):
    return int(np.count_nonzero((labels == cls) & (split == code)))


# --- random_split ----------------------------------------------------------------------------------


def expected_sizes(n, train, val):
    """The documented rule, restated independently in plain Python."""
    def want(spec):
        return math.floor(spec * n + 0.5) if isinstance(spec, float) else spec
    t = want(train)
    if n >= 2:
        t = max(t, 1)
    avail = n - 1 if n >= 2 else n
    t = min(t, avail)
    v = min(want(val), avail - t) if val else 0
    return t, v, n - t - v


SIZES = [1, 2, 3, 4, 5, 10, 15, 57, 200]


@pytest.mark.parametrize(
    ("train", "val"),
    [(0.1, 0.0), (0.25, 0.25), (0.5, 0.45), (0.05, 0.1), (0.9, 0.0), (3, 0), (1, 1), (20, 5),
     (0.2, 4), (5, 0.3)],
)
def test_random_split_stratified_sizes(train, val):
    lab = class_sizes_labels(SIZES)
    split = random_split(lab, train=train, val=val, seed=3)
    check_basic(lab, split)
    assert not ((lab != 0) & (split == SPLIT_NONE)).any()  # complete
    for k, n in enumerate(SIZES, start=1):
        got = tuple(count(lab, split, k, c) for c in (SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST))
        assert got == expected_sizes(n, train, val), f"class {k} of {n} pixels"


@pytest.mark.parametrize(
    ("n", "train", "val", "want"),
    [
        (10, 0.25, 0.0, (3, 0, 7)),  # 2.5 rounds half up
        (10, 0.1, 0.15, (1, 2, 7)),  # 1.5 -> 2
        (2, 0.1, 0.0, (1, 0, 1)),  # at least one train pixel when n >= 2
        (1, 0.1, 0.0, (0, 0, 1)),  # a lone pixel whose fraction rounds to 0 is test
        (1, 0.6, 0.0, (1, 0, 0)),
        (1, 5, 0, (1, 0, 0)),  # a lone pixel with a count request is train
        (3, 5, 0, (2, 0, 1)),  # count capped to leave one test pixel
        (3, 1, 5, (1, 1, 1)),
        (2, 1, 1, (1, 0, 1)),  # train is served before val
        (4, 0.5, 0.45, (2, 1, 1)),  # round(1.8) = 2 val capped to n - 1 - train
    ],
)
def test_random_split_rule_examples(n, train, val, want):
    lab = np.zeros((3, 12), dtype=np.int64)
    lab.ravel()[:n] = 4
    split = random_split(lab, train=train, val=val, seed=0)
    got = tuple(count(lab, split, 4, c) for c in (SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST))
    assert got == want


def test_random_split_deterministic_and_seeded():
    lab = random_labels((40, 50), 6)
    a = random_split(lab, train=0.3, val=0.2, seed=7)
    b = random_split(lab, train=0.3, val=0.2, seed=7)
    c = random_split(lab, train=0.3, val=0.2, seed=8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # same per-class sizes whatever the seed
    for cls in range(1, 7):
        for code in (SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST):
            assert count(lab, a, cls, code) == count(lab, c, cls, code)


def test_random_split_accepts_numpy_scalars_and_lists():
    lab = [[0, 1, 1, 2], [2, 2, 1, 0]]
    a = random_split(lab, train=np.float32(0.5), val=np.int64(0), seed=1)
    b = random_split(np.array(lab, dtype=np.uint8), train=0.5, seed=1)
    check_basic(np.array(lab), a)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("offset", "dtype"), [(60000, np.uint16), (2**40, np.int64)])
def test_random_split_non_contiguous_and_large_labels(offset, dtype):
    base = random_labels((30, 40), 3, seed=2)
    lab = base.T  # Fortran-ordered view
    lab = np.where(lab > 0, lab + offset, 0).astype(dtype)  # class ids need not be 1..K
    split = random_split(lab, train=0.5, seed=0)
    check_basic(lab, split)
    for cls in np.unique(lab[lab > 0]):
        n = int((lab == cls).sum())
        assert count(lab, split, cls, SPLIT_TRAIN) == expected_sizes(n, 0.5, 0)[0]
    counts = split_counts(lab, split)
    assert sorted(counts["train"]) == sorted(int(c) for c in np.unique(lab[lab > 0]))


@pytest.mark.parametrize("fn", ["random", "block", "mask"])
def test_unlabelled_scene_gives_all_none(fn):
    lab = np.zeros((9, 11), dtype=np.int32)
    if fn == "random":
        split = random_split(lab)
    elif fn == "block":
        split = block_split(lab, block_size=4, guard=1)
    else:
        split = mask_split(lab, train_mask=np.ones_like(lab), test_mask=np.zeros_like(lab))
    check_basic(lab, split)
    assert (split == SPLIT_NONE).all()


# --- block_split -----------------------------------------------------------------------------------


def pixel_blocks_bruteforce(blocks, block_size, shape):
    """Per-pixel block code, computed pixel by pixel (independent of the module's expansion)."""
    h, w = shape
    pix = np.zeros(shape, dtype=np.uint8)
    for y in range(h):
        for x in range(w):
            pix[y, x] = blocks[y // block_size, x // block_size]
    return pix


def check_block_split(labels, split, blocks, block_size, guard):
    """Every invariant of a block split, brute force."""
    h, w = labels.shape
    check_basic(labels, split)
    assert blocks.shape == (-(-h // block_size), -(-w // block_size))
    # a block gets a split iff it holds labelled pixels
    for by in range(blocks.shape[0]):
        for bx in range(blocks.shape[1]):
            tile = labels[by * block_size:(by + 1) * block_size, bx * block_size:(bx + 1) * block_size]
            assert (blocks[by, bx] != SPLIT_NONE) == bool((tile != 0).any())
    pix = pixel_blocks_bruteforce(blocks, block_size, labels.shape)
    for y, x in zip(*np.nonzero(labels)):
        own = pix[y, x]
        win = pix[max(0, y - guard):y + guard + 1, max(0, x - guard):x + guard + 1]
        foreign = set(np.unique(win).tolist()) - {SPLIT_NONE, int(own)}
        if foreign:
            # guard band: a window touching a block of another split must drop the pixel
            assert split[y, x] == SPLIT_NONE, (y, x, own, foreign)
        else:
            # ...and nothing else is dropped
            assert split[y, x] == own, (y, x, own)


def test_block_split_guard_invariant_bruteforce():
    lab = random_labels((53, 47), 5, p_unlabelled=0.4, seed=11)
    for bs, guard, train, val in [(9, 3, 0.4, 0.2), (7, 3, 0.5, 0.0), (10, 0, 0.3, 0.3), (5, 2, 0.6, 0.1)]:
        kw = dict(block_size=bs, guard=guard, train=train, val=val, seed=5)
        split = block_split(lab, **kw)
        blocks = block_assignment(lab, **kw)
        check_block_split(lab, split, blocks, bs, guard)
        assert {SPLIT_TRAIN, SPLIT_TEST} <= set(np.unique(split).tolist())


def test_block_split_no_train_patch_sees_other_split():
    """The property users rely on, checked only from the returned map (no block_assignment).

    Surviving pixels of one block share a split; a train pixel's window contains no surviving pixel
    of val/test, nor any pixel of a block that is known (from its survivors) to be val/test.
    """
    lab = random_labels((60, 60), 4, p_unlabelled=0.2, seed=4)
    bs, guard = 8, 3
    split = block_split(lab, block_size=bs, guard=guard, train=0.4, val=0.2, seed=9)
    inferred = np.zeros((-(-60 // bs),) * 2, dtype=np.uint8)
    for by in range(inferred.shape[0]):
        for bx in range(inferred.shape[1]):
            tile = split[by * bs:(by + 1) * bs, bx * bs:(bx + 1) * bs]
            codes = set(np.unique(tile).tolist()) - {SPLIT_NONE}
            assert len(codes) <= 1  # one split per block
            inferred[by, bx] = codes.pop() if codes else SPLIT_NONE
    pix = pixel_blocks_bruteforce(inferred, bs, lab.shape)
    for y, x in zip(*np.nonzero(split)):
        s = split[y, x]
        sl = (slice(max(0, y - guard), y + guard + 1), slice(max(0, x - guard), x + guard + 1))
        assert set(np.unique(split[sl]).tolist()) <= {SPLIT_NONE, int(s)}
        assert set(np.unique(pix[sl]).tolist()) <= {SPLIT_NONE, int(s)}


def test_block_split_fraction_respected():
    lab = random_labels((120, 120), 5, p_unlabelled=0.0, seed=1)
    bs = 6
    blocks = block_assignment(lab, block_size=bs, guard=2, train=0.3, val=0.2, seed=0)
    pix = pixel_blocks_bruteforce(blocks, bs, lab.shape)
    n = lab.size
    one_block = bs * bs / n
    for code, frac in ((SPLIT_TRAIN, 0.3), (SPLIT_VAL, 0.2), (SPLIT_TEST, 0.5)):
        assert abs(np.count_nonzero(pix == code) / n - frac) <= one_block + 1e-9
    # with guard=0 the returned map is the assignment itself
    split = block_split(lab, block_size=bs, guard=0, train=0.3, val=0.2, seed=0)
    assert abs(np.count_nonzero(split == SPLIT_TRAIN) / n - 0.3) <= one_block + 1e-9


def test_block_split_fraction_counts_labelled_pixels_only():
    # left half densely labelled, right half sparsely: the target is a share of labelled pixels
    rng = np.random.default_rng(0)
    lab = np.zeros((80, 160), dtype=np.int32)
    lab[:, :80] = rng.integers(1, 4, (80, 80))
    sparse = rng.random((80, 80)) < 0.05
    lab[:, 80:][sparse] = 1
    blocks = block_assignment(lab, block_size=8, guard=1, train=0.25, seed=3)
    pix = pixel_blocks_bruteforce(blocks, 8, lab.shape)
    labelled = lab != 0
    got = np.count_nonzero(labelled & (pix == SPLIT_TRAIN)) / np.count_nonzero(labelled)
    assert abs(got - 0.25) <= 64 / np.count_nonzero(labelled) + 1e-9


def test_block_split_val_zero_gets_no_blocks():
    lab = random_labels((50, 50), 3, seed=2)
    for seed in range(5):
        blocks = block_assignment(lab, block_size=5, guard=1, train=0.7, seed=seed)
        assert not (blocks == SPLIT_VAL).any()


def test_block_split_deterministic_and_seeded():
    lab = random_labels((64, 64), 4, seed=3)
    kw = dict(block_size=8, guard=2, train=0.4, val=0.1)
    a = block_split(lab, seed=1, **kw)
    np.testing.assert_array_equal(a, block_split(lab, seed=1, **kw))
    assert not np.array_equal(a, block_split(lab, seed=2, **kw))


@pytest.mark.parametrize("core", [True, False])
def test_block_split_every_class_gets_train_pixels(core):
    # class 2 lives in a 2x2 patch of one 12x12 block: without the coverage rule, it would be train
    # for only ~20% of seeds (and, at a corner, guarded out by the neighbouring blocks even then).
    lab = np.ones((60, 60), dtype=np.int32)
    if core:
        lab[29:31, 29:31] = 2  # middle of block (2, 2): survives the guard whatever its neighbours
    else:
        lab[24:26, 24:26] = 2  # corner of block (2, 2): within the guard of three other blocks
    for seed in range(10):
        split = block_split(lab, block_size=12, guard=2, train=0.2, seed=seed)
        counts = split_counts(lab, split)
        assert counts["train"][1] > 0
        assert counts["train"][2] >= 1, seed
        if core:
            assert counts["train"][2] == 4, seed
        blocks = block_assignment(lab, block_size=12, guard=2, train=0.2, seed=seed)
        check_block_split(lab, split, blocks, 12, 2)


def test_block_split_default_block_size():
    lab = random_labels((100, 130), 3, seed=5)
    bs = default_block_size(lab.shape, 3)
    a = block_split(lab, guard=3, seed=0)
    np.testing.assert_array_equal(a, block_split(lab, block_size=bs, guard=3, seed=0))
    blocks = block_assignment(lab, guard=3, seed=0)
    check_block_split(lab, a, blocks, bs, 3)


@pytest.mark.parametrize(
    ("shape", "guard", "want"),
    [((145, 145), 7, 29), ((610, 340), 7, 42), ((1000, 2000), 0, 125), ((10, 10), 2, 9),
     ((512, 614, 200), 3, 64)],
)
def test_default_block_size(shape, guard, want):
    bs = default_block_size(shape, guard)
    assert bs == want
    assert bs > 2 * guard


def test_block_split_scene_smaller_than_one_block():
    lab = random_labels((5, 7), 2, p_unlabelled=0.0, seed=0)
    split = block_split(lab, block_size=15, guard=7, train=0.5)
    check_basic(lab, split)
    # a single block: no other split to guard against, and the coverage rule makes it train
    assert (split == SPLIT_TRAIN).all()


# --- hypothesis: invariants on small random maps ------------------------------------------------


@st.composite
def block_cases(draw):
    h = draw(st.integers(1, 20))
    w = draw(st.integers(1, 20))
    labels = draw(arrays(np.int16, (h, w), elements=st.integers(0, 4)))
    guard = draw(st.integers(0, 3))
    block_size = draw(st.integers(2 * guard + 1, 2 * guard + 7))
    train = draw(st.floats(0.05, 0.9))
    val = draw(st.sampled_from([0.0, 0.05, 0.3]))
    val = val if train + val < 0.99 else 0.0
    seed = draw(st.integers(0, 2**32 - 1))
    return labels, block_size, guard, train, val, seed


@settings(max_examples=60, deadline=None)
@given(block_cases())
def test_block_split_invariants_property(case):
    labels, block_size, guard, train, val, seed = case
    kw = dict(block_size=block_size, guard=guard, train=train, val=val, seed=seed)
    split = block_split(labels, **kw)
    blocks = block_assignment(labels, **kw)
    check_block_split(labels, split, blocks, block_size, guard)
    if val == 0:
        assert not (blocks == SPLIT_VAL).any()
    # class coverage: every class keeps at least one train pixel after the guard band
    for cls in np.unique(labels[labels != 0]):
        assert ((labels == cls) & (split == SPLIT_TRAIN)).any(), cls


@settings(max_examples=80, deadline=None)
@given(
    labels=arrays(np.int32, st.tuples(st.integers(1, 15), st.integers(1, 15)), elements=st.integers(0, 5)),
    train=st.one_of(st.floats(0.01, 0.6), st.integers(1, 10)),
    val=st.one_of(st.just(0.0), st.floats(0.01, 0.39), st.integers(1, 5)),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_split_invariants_property(labels, train, val, seed):
    split = random_split(labels, train=train, val=val, seed=seed)
    check_basic(labels, split)
    assert not ((labels != 0) & (split == SPLIT_NONE)).any()
    np.testing.assert_array_equal(split, random_split(labels, train=train, val=val, seed=seed))
    for cls in np.unique(labels[labels != 0]):
        n = int((labels == cls).sum())
        got = tuple(count(labels, split, cls, c) for c in (SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST))
        assert got == expected_sizes(n, train, val)
        if n >= 2:
            assert got[0] >= 1 and got[2] >= 1


# --- mask_split ------------------------------------------------------------------------------------


def test_mask_split_assigns_labelled_pixels_only():
    lab = np.array([[0, 1, 2, 3], [1, 0, 2, 2], [3, 3, 0, 1]])
    train = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    val = np.array([[0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=bool)
    test = np.array([[0, 0, 0, 0], [5, 5, 5, 0], [0, 0, 1, 1]], dtype=np.float32)
    split = mask_split(lab, train_mask=train, test_mask=test, val_mask=val)
    want = np.array([[0, 1, 2, 0], [3, 0, 3, 0], [0, 0, 0, 3]], dtype=np.uint8)
    np.testing.assert_array_equal(split, want)
    check_basic(lab, split)
    # without val_mask, the val pixel is in no split
    split = mask_split(lab, train_mask=train, test_mask=test)
    assert split[0, 2] == SPLIT_NONE


def test_mask_split_shape_mismatch():
    lab = np.ones((4, 5), dtype=np.int32)
    with pytest.raises(InputError, match=r"test_mask has shape \(5, 4\) but labels has shape \(4, 5\)"):
        mask_split(lab, train_mask=np.zeros((4, 5)), test_mask=np.zeros((5, 4)))
    with pytest.raises(InputError, match=r"val_mask has shape \(4, 5, 1\)"):
        mask_split(lab, train_mask=np.zeros((4, 5)), test_mask=np.zeros((4, 5)), val_mask=np.zeros((4, 5, 1)))


def test_mask_split_overlap_reports_count():
    lab = np.ones((4, 5), dtype=np.int32)
    train = np.zeros((4, 5), dtype=bool)
    test = np.zeros((4, 5), dtype=bool)
    val = np.zeros((4, 5), dtype=bool)
    train[0, :3] = True
    test[0, 1:] = True  # overlaps train on 2 pixels
    val[3, 4] = val[0, 4] = True  # overlaps test on 1 pixel
    msg = r"^3 pixels are in more than one split mask .*train_mask & test_mask: 2"
    with pytest.raises(InputError, match=msg):
        mask_split(lab, train_mask=train, test_mask=test, val_mask=val)
    # overlap on unlabelled pixels is still an error: the masks are inconsistent
    lab[0, :] = 0
    with pytest.raises(InputError, match="disjoint"):
        mask_split(lab, train_mask=train, test_mask=test)


# --- split_counts ----------------------------------------------------------------------------------


def test_split_counts_matches_bruteforce():
    lab = random_labels((30, 30), 5, seed=6)
    lab[lab == 3] = 0  # a gap in class ids
    split = block_split(lab, block_size=7, guard=2, train=0.4, val=0.2, seed=0)
    counts = split_counts(lab, split)
    assert list(counts) == ["train", "val", "test", "none"]
    names = {"train": SPLIT_TRAIN, "val": SPLIT_VAL, "test": SPLIT_TEST, "none": SPLIT_NONE}
    for name, code in names.items():
        assert list(counts[name]) == [1, 2, 4, 5]
        for cls, n in counts[name].items():
            assert type(cls) is int and type(n) is int
            assert n == count(lab, split, cls, code)
    assert sum(sum(d.values()) for d in counts.values()) == np.count_nonzero(lab)


def test_split_counts_errors():
    lab = np.ones((3, 3), dtype=np.int32)
    with pytest.raises(InputError, match=r"split_map has shape \(3, 4\) but labels has shape \(3, 3\)"):
        split_counts(lab, np.zeros((3, 4), dtype=np.uint8))
    with pytest.raises(InputError, match="codes outside"):
        split_counts(lab, np.full((3, 3), 7, dtype=np.uint8))
    with pytest.raises(InputError, match="integer SPLIT_"):
        split_counts(lab, np.zeros((3, 3), dtype=np.float32))


# --- argument errors -------------------------------------------------------------------------------

LAB = np.ones((8, 8), dtype=np.int32)


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        (np.ones((2, 3, 4), dtype=np.int32), r"2-D \(H, W\) array, got shape \(2, 3, 4\)"),
        (np.ones(5, dtype=np.int32), "2-D"),
        (np.ones((3, 3), dtype=np.float32), "integer array .* got dtype float32"),
        (np.ones((3, 3), dtype=bool), "got dtype bool"),
        (-np.ones((3, 3), dtype=np.int32), "found 9 negative pixels"),
    ],
)
@pytest.mark.parametrize("fn", ["random", "block", "mask", "counts"])
def test_bad_labels(labels, match, fn):
    with pytest.raises(InputError, match=match):
        if fn == "random":
            random_split(labels)
        elif fn == "block":
            block_split(labels, block_size=5, guard=1)
        elif fn == "mask":
            mask_split(labels, train_mask=np.zeros(labels.shape), test_mask=np.zeros(labels.shape))
        else:
            split_counts(labels, np.zeros(labels.shape, dtype=np.uint8))


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(train=0), "train pixel count must be >= 1, got 0"),
        (dict(train=0.0), r"train fraction must be in \(0, 1\), got 0.0"),
        (dict(train=-0.1), r"train fraction must be in \(0, 1\)"),
        (dict(train=-3), "train pixel count must be >= 1, got -3"),
        (dict(train=1.0), r"train fraction must be in \(0, 1\), got 1.0; pass a whole number"),
        (dict(train=float("nan")), "train fraction"),
        (dict(train=True), "train must be a fraction in .* or a per-class pixel count"),
        (dict(train="0.1"), "train must be a fraction"),
        (dict(val=-0.2), r"val fraction must be in \(0, 1\)"),
        (dict(val=-1), "val pixel count must be >= 1"),
        (dict(train=0.6, val=0.4), r"train \+ val fractions must be below 1 .* got 0.6 \+ 0.4 = 1"),
        (dict(train=0.7, val=0.5), "below 1"),
    ],
)
def test_random_split_bad_arguments(kw, match):
    with pytest.raises(InputError, match=match):
        random_split(LAB, **kw)


def test_random_split_mixed_kinds_not_summed():
    # a count and a fraction cannot be compared; the capping rule applies instead
    split = random_split(LAB, train=60, val=0.9)
    assert count(LAB, split, 1, SPLIT_TRAIN) == 60 and count(LAB, split, 1, SPLIT_TEST) == 1


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(block_size=14, guard=7), r"block_size \(14\) must be larger than 2\*guard \(14\)"),
        (dict(block_size=3, guard=2), r"use block_size >= 5 \(9 or more keeps most of each block\) or a smaller guard"),
        (dict(block_size=0, guard=0), "block_size must be >= 1, got 0"),
        (dict(block_size=4.5, guard=1), "block_size must be a whole number"),
        (dict(block_size=8, guard=-1), "guard must be >= 0, got -1"),
        (dict(block_size=8, guard=1.0), "guard must be a whole number"),
        (dict(block_size=8, guard=1, train=5), r"train must be a fraction in \(0, 1\) of the labelled"),
        (dict(block_size=8, guard=1, train=0.0), r"train fraction must be in \(0, 1\), got 0.0$"),
        (dict(block_size=8, guard=1, val=2), "val must be a fraction"),
        (dict(block_size=8, guard=1, train=0.5, val=0.5), "below 1"),
    ],
)
def test_block_split_bad_arguments(kw, match):
    with pytest.raises(InputError, match=match):
        block_split(LAB, **kw)
    with pytest.raises(InputError, match=match):
        block_assignment(LAB, **kw)


def test_default_block_size_bad_arguments():
    with pytest.raises(InputError, match="guard must be >= 0"):
        default_block_size((10, 10), -1)
    with pytest.raises(InputError, match="at least 2 dimensions"):
        default_block_size((10,), 1)
