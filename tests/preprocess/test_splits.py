"""Tests for preprocess.splits: split invariants, stratification rules, guard band, argument errors."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.ndimage import distance_transform_cdt

from hsgds.errors import InputError
from hsgds.format import SPLIT_NONE, SPLIT_TEST, SPLIT_TRAIN, SPLIT_VAL
from hsgds.preprocess.splits import (
    TrainShareWarning,
    UnsplittableClassWarning,
    block_split,
    block_split_details,
    candidate_block_sizes,
    default_block_size,
    make_split,
    mask_split,
    min_block_size,
    random_split,
    split_counts,
)
from hsgds.synthetic import make_scene, pavia_like_labels

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
    """The documented rule, restated independently in plain Python: train first, then test, then val get a
    pixel each, then the rounded requests are served train first."""
    def want(spec):
        return math.floor(Fraction(str(spec)) * n + Fraction(1, 2)) if isinstance(spec, float) else spec  # exact
    min_test = 1 if n >= 2 else 0
    min_val = 1 if val and n >= 3 else 0
    t = min(max(want(train), 1), n - min_test - min_val)
    v = min(max(want(val), min_val), n - t - min_test) if val else 0
    return t, v, n - t - v


def warned_small(caught, method="random split"):
    """{class: text in parentheses} of the one split warning that names classes."""
    import re

    texts = [str(w.message) for w in caught if issubclass(w.category, UnsplittableClassWarning)]
    assert len(texts) == 1 and texts[0].startswith(method), texts
    head = texts[0].split(" could not", 1)[0].split(" ha", 1)[0].split(" are missing", 1)[0]
    return {int(c): t for c, t in re.findall(r"(\d+) \(([^)]*)\)", head)}


SIZES = [1, 2, 3, 4, 5, 10, 15, 57, 200]


@pytest.mark.parametrize(
    ("train", "val"),
    [(0.1, 0.0), (0.25, 0.25), (0.5, 0.45), (0.05, 0.1), (0.9, 0.0), (3, 0), (1, 1), (20, 5),
     (0.2, 4), (5, 0.3)],
)
def test_random_split_stratified_sizes(train, val):
    lab = class_sizes_labels(SIZES)
    with pytest.warns(UnsplittableClassWarning) as caught:  # the classes of 1 (and 2 with val) pixels
        split = random_split(lab, train=train, val=val, seed=3)
    assert set(warned_small(caught)) == ({1, 2} if val else {1})
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
        (1, 0.1, 0.0, (1, 0, 0)),  # train first: a lone pixel is train, even where its fraction rounds to 0
        (1, 0.6, 0.0, (1, 0, 0)),
        (1, 5, 0, (1, 0, 0)),
        (1, 0.1, 0.2, (1, 0, 0)),
        (2, 0.1, 0.3, (1, 0, 1)),  # train, then test: val only from 3 pixels
        (3, 0.1, 0.1, (1, 1, 1)),  # a val pixel although 0.3 rounds to 0
        (3, 20, 0.5, (1, 1, 1)),  # a count is capped to leave test and val a pixel
        (5, 20, 5, (3, 1, 1)),
        (3, 5, 0, (2, 0, 1)),  # count capped to leave one test pixel
        (3, 1, 5, (1, 1, 1)),
        (2, 1, 1, (1, 0, 1)),  # train is served before val
        (4, 0.5, 0.45, (2, 1, 1)),  # round(1.8) = 2 val capped to n - 1 - train
    ],
)
def test_random_split_rule_examples(n, train, val, want):
    lab = np.zeros((3, 12), dtype=np.int64)
    lab.ravel()[:n] = 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        split = random_split(lab, train=train, val=val, seed=0)
    # named (with its counts) exactly when too small for every split asked for
    assert bool(caught) == (n < (3 if val else 2))
    if caught:
        t, v, e = want
        assert warned_small(caught) == {4: f"{n} px: {t} train, " + (f"{v} val, " if val else "") + f"{e} test"}
    got = tuple(count(lab, split, 4, c) for c in (SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST))
    assert got == want


def test_random_split_rounds_exact_halves_up():
    # a fraction is rounded half up as written: 0.29 of 50 pixels is 14.5, so 15; floor(f * n + 0.5) in
    # floating point gave 14 (0.29 * 50 == 14.499999999999998), for about 1 in 50 two-decimal halves
    cases = [(k, n) for k in range(1, 100) for n in range(4, 400) if (k * n) % 100 == 50]
    rng = np.random.default_rng(0)
    for k, n in [cases[i] for i in rng.choice(len(cases), 60, replace=False)] + [(29, 50), (35, 90), (57, 50)]:
        lab = np.zeros((2, n), dtype=np.int32)
        lab[0] = 1
        lab[1, :3] = 2  # another class: the split is stratified per class
        half_up = (k * n + 50) // 100  # integers: no floating point
        split = random_split(lab, train=k / 100, seed=k)
        assert count(lab, split, 1, SPLIT_TRAIN) == min(max(half_up, 1), n - 1), (k, n)
        split = random_split(lab, train=1, val=k / 100, seed=k)  # val rounds the same way
        assert count(lab, split, 1, SPLIT_VAL) == min(max(half_up, 1), n - 2), (k, n)


def test_random_split_tiny_classes_sweep():
    # seeded sweep: scenes of tiny classes (1-6 pixels) beside a large one, counts and fractions mixed
    rng = np.random.default_rng(0)
    for case in range(200):
        sizes = [int(n) for n in rng.integers(1, 7, size=rng.integers(1, 6))] + [60]
        train = [0.05, 0.1, 0.5, 1, 3, 20][case % 6]
        val = [0, 0.05, 0.2, 1, 2][case % 5]
        lab = class_sizes_labels(sizes, seed=case)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            split = random_split(lab, train=train, val=val, seed=case)
        got = per_class(lab, split)
        small = {}
        for k, n in enumerate(sizes, start=1):
            assert got[k] == expected_sizes(n, train, val), (case, k, n, train, val)
            assert got[k][0] >= 1 and (n < 2 or got[k][2] >= 1) and (n < 3 or not val or got[k][1] >= 1)
            if n < (3 if val else 2):
                t, v, e = got[k]
                small[k] = f"{n} px: {t} train, " + (f"{v} val, " if val else "") + f"{e} test"
        assert (warned_small(caught) if small else caught) == (small or [])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            np.testing.assert_array_equal(split, random_split(lab, train=train, val=val, seed=case))


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

H = 7  # patch radius (halo) of the scenes below: 15x15 patches, as the converter's default


def _ip_labels():
    from hsgds.datasets import indian_pines_files

    return np.load(indian_pines_files()[1], allow_pickle=False)


SCENES = {
    "indian_pines": _ip_labels,
    "pavia_like": lambda: pavia_like_labels(seed=0),  # elongated classes: roads, tree rows, shadows
    "blobs": lambda: make_scene(160, 160, 2, classes=8, seed=3)[1],  # compact smooth regions
}


@pytest.fixture(scope="module", params=list(SCENES))
def scene_labels(request):
    return request.param, SCENES[request.param]()


def train_distance(split):
    """Chebyshev distance of every pixel to the nearest train pixel (scipy, independent of the module)."""
    assert (split == SPLIT_TRAIN).any()
    return distance_transform_cdt(split != SPLIT_TRAIN, metric="chessboard")


def block_ids(shape, block_size, origin):
    """(H, W) block row and column of every pixel, computed from the documented grid definition."""
    yy, xx = np.indices(shape)
    return (yy - origin[0]) // block_size, (xx - origin[1]) // block_size


def class_diameter(labels, cls):
    ys, xs = np.nonzero(labels == cls)
    return max(np.ptp(ys), np.ptp(xs))


def per_class(labels, split):
    """{class: (train, val, test)} by plain numpy counting."""
    return {int(c): tuple(count(labels, split, c, code) for code in (SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST))
            for c in np.unique(labels[labels != 0])}


def can_be_split(labels, c, by, bx, guard):
    """Whether two pixels of class ``c`` in different blocks are more than 2 * guard apart (all pairs)."""
    ys, xs = np.nonzero(labels == c)
    blk = by[ys, xs] * 10_000 + bx[ys, xs]
    far = np.maximum(np.abs(ys[:, None] - ys[None, :]), np.abs(xs[:, None] - xs[None, :])) > 2 * guard
    return bool((far & (blk[:, None] != blk[None, :])).any())


def check_train_first(labels, r, guard):
    """Train comes first for a class that can be split (two pixels in different blocks more than 2 * guard
    apart): it has a train pixel, except where every block holding it, made train, would leave the scene no
    val/test pixel more than 2 * guard from train. The classes missing a split are exactly the unsplit ones,
    with their counts."""
    got = per_class(labels, r.split)
    missing = {c for c, (t, v, e) in got.items() if t == 0 or e == 0 or (r.val and v == 0)}
    assert set(r.unsplit) == missing
    assert r.counts == {c: got[c] for c in sorted(missing)}
    by, bx = block_ids(labels.shape, r.block_size, r.origin)
    for c, (t, _, _) in got.items():
        if t or not can_be_split(labels, c, by, bx, guard):
            continue
        for b in set(zip(by[labels == c].tolist(), bx[labels == c].tolist())):
            train = (r.split == SPLIT_TRAIN) | ((labels != 0) & (by == b[0]) & (bx == b[1]))
            dist = distance_transform_cdt(~train, metric="chessboard")
            assert not ((labels != 0) & ~train & (dist > 2 * guard)).any(), (c, b)


def check_stratified(labels, r, train, val, guard):
    """Every documented property of a block split, checked against independent computations."""
    split = r.split
    check_basic(labels, split)
    labelled = labels != 0
    n = np.count_nonzero(labelled)
    # 1. footprints disjoint: no val/test pixel within 2h of a train pixel (so no pixel is seen by both
    #    a train patch and a val/test patch of radius h)...
    dist = train_distance(split)
    assert (dist[(split == SPLIT_TEST) | (split == SPLIT_VAL)] > 2 * guard).all()
    # ...and the guard drops nothing it need not: every dropped labelled pixel is within 2h of train
    dropped = labelled & (split == SPLIT_NONE)
    assert (dist[dropped] <= 2 * guard).all()
    assert r.lost == np.count_nonzero(dropped)
    # 2. whole blocks: a train block is wholly train, val/test blocks hold no train pixel
    by, bx = block_ids(labels.shape, r.block_size, r.origin)
    assert by.min() == 0 and bx.min() == 0 and -r.block_size < min(r.origin) and max(r.origin) <= 0
    code = r.blocks[by, bx]
    assert ((code == SPLIT_NONE) == ~_block_has_labels(labels, by, bx))[labelled].all()
    assert (split[labelled & (code == SPLIT_TRAIN)] == SPLIT_TRAIN).all()
    assert np.isin(split[labelled & (code == SPLIT_TEST)], (SPLIT_TEST, SPLIT_NONE)).all()
    assert np.isin(split[labelled & (code == SPLIT_VAL)], (SPLIT_VAL, SPLIT_NONE)).all()
    # 3. overall train share within 3 points of a fractional target
    if isinstance(train, float):
        assert abs(np.count_nonzero(split == SPLIT_TRAIN) / n - train) <= 0.03 + 1e-12
    # 4. every class whose pixels lie more than 2h apart gets train and test (and val) pixels; the others
    #    are exactly the classes named, with their block count
    wanted = (SPLIT_TRAIN, SPLIT_TEST) + ((SPLIT_VAL,) if val else ())
    missing = {}
    for cls in np.unique(labels[labelled]):
        if all(((labels == cls) & (split == c)).any() for c in wanted):
            continue
        assert class_diameter(labels, cls) <= 2 * guard, f"class {cls} could be split but was not"
        blocks = {(int(a), int(b)) for a, b in zip(by[labels == cls], bx[labels == cls])}
        missing[int(cls)] = len(blocks)
    assert r.unsplit == missing
    check_train_first(labels, r, guard)
    return split


def _block_has_labels(labels, by, bx):
    has = np.zeros((by.max() + 1, bx.max() + 1), dtype=bool)
    has[by[labels != 0], bx[labels != 0]] = True
    return has[by, bx]


@pytest.mark.parametrize("train", [0.05, 0.1, 0.3, 0.5])
def test_block_split_properties(scene_labels, train):
    name, labels = scene_labels
    r = block_split_details(labels, train=train, guard=H, seed=0)
    split = check_stratified(labels, r, train, 0, H)
    assert r.block_size in candidate_block_sizes(labels.shape, H)
    # per class: the train share is near the target for every class of 100+ pixels that can be split,
    # except where taking more would leave it no test pixel (Indian Pines' class 4: 237 pixels in an
    # 18x21 field, less than 2 * 14 px across)
    for cls in np.unique(labels[labels != 0]):
        size = np.count_nonzero(labels == cls)
        if size < 100 or class_diameter(labels, cls) <= 4 * H:
            continue
        share = np.count_nonzero((labels == cls) & (split == SPLIT_TRAIN)) / size
        assert abs(share - train) <= max(0.1, train / 2), (name, cls, share)


def test_block_split_with_val(scene_labels):
    _, labels = scene_labels
    r = block_split_details(labels, train=0.1, val=0.1, guard=H, seed=1)
    check_stratified(labels, r, 0.1, 0.1, H)
    assert r.val


@pytest.mark.parametrize("train", [0.3, 0.5])
def test_block_split_val_and_test_share_what_the_guard_leaves(scene_labels, train):
    # the guard takes pixels from val and test alike: val keeps the share of the non-train pixels it was
    # asked for (0.1 / (1 - train)), so a high train share does not leave test almost empty
    name, labels = scene_labels
    r = block_split_details(labels, train=train, val=0.1, guard=H, seed=0)
    split = check_stratified(labels, r, train, 0.1, H)
    n_val, n_test = np.count_nonzero(split == SPLIT_VAL), np.count_nonzero(split == SPLIT_TEST)
    asked = 0.1 / (1 - train)
    # whole blocks, and a val pixel for every class that can be split: near the asked share, not exactly
    assert n_val / (n_val + n_test) <= asked + 0.12, (name, n_val, n_test)
    assert n_test >= n_val, (name, n_val, n_test)


@pytest.mark.parametrize(("train", "val"), [(20, 0), (50, 10)])
def test_block_split_per_class_counts(scene_labels, train, val):
    _, labels = scene_labels
    r = block_split_details(labels, train=train, val=val, guard=H, seed=0)
    split = check_stratified(labels, r, train, val, H)
    for cls in np.unique(labels[labels != 0]):
        if cls in r.unsplit or class_diameter(labels, cls) <= 4 * H:  # see test_block_split_properties
            continue
        # whole blocks: about the count asked, within one block's worth of the class, besides the blocks
        # that gave the classes that cannot be split their train pixels (train comes first)
        by, bx = block_ids(labels.shape, r.block_size, r.origin)
        for_unsplit = np.zeros(r.blocks.shape, dtype=bool)
        unsplit_train = np.isin(labels, list(r.unsplit)) & (split == SPLIT_TRAIN)
        for_unsplit[by[unsplit_train], bx[unsplit_train]] = True
        got = np.count_nonzero((labels == cls) & (split == SPLIT_TRAIN))
        rest = np.count_nonzero((labels == cls) & (split == SPLIT_TRAIN) & ~for_unsplit[by, bx])
        assert 0.5 * train <= got and rest <= train + r.block_size ** 2, (cls, got, rest)


def test_block_split_indian_pines_names_unsplittable_classes():
    labels = _ip_labels()
    # Alfalfa (1), Grass-pasture-mowed (7), Oats (9), Stone-Steel-Towers (16): every pixel of each lies
    # within 14 px of every other, so no guard of 2 * 7 px fits between a train and a test pixel
    assert [c for c in range(1, 17) if class_diameter(labels, c) <= 14] == [1, 7, 9, 16]
    with pytest.warns(UnsplittableClassWarning,
                      match=r"classes 1 \(3 blocks: 0 train, 10 test\), 7 \(4 blocks: 5 train, 0 test\), 9 .*, 16 "):
        split = block_split(labels, train=0.1, guard=H, seed=0)
    r = block_split_details(labels, train=0.1, guard=H, seed=0)
    np.testing.assert_array_equal(split, r.split)
    assert sorted(r.unsplit) == [1, 7, 9, 16]
    # each is on one side only, train or test, as the blocks of the other classes fall: none gets a train
    # block of its own, whose guard would drop the val/test pixels of the classes around it
    for c in r.unsplit:
        got = tuple(count(labels, split, c, code) for code in (SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST))
        assert (got[0] == 0) != (got[2] == 0) and got[1] == 0 and r.counts[c] == got


def test_make_split_warns_when_the_train_share_misses_the_target():
    # a 610x340 Pavia-like scene cut into 300 px blocks: train is whole blocks, far above the 10% asked for
    labels = pavia_like_labels(610, 340, seed=0)
    with pytest.warns(TrainShareWarning) as caught:
        split, _ = make_split(labels, "blocks", train=0.1, block_size=300, guard=7, seed=0)
    share = np.count_nonzero(split == SPLIT_TRAIN) / np.count_nonzero(labels)
    assert abs(share - 0.1) > 0.05
    assert str(caught[0].message) == (
        f"block split: train is {100 * share:.1f}% of the labelled pixels, not the 10.0% asked for (--train 0.1), "
        "with blocks of 300 px: use a smaller --block-size, or leave it out to let the converter choose")


def test_make_split_train_share_exactly_5_points_off_is_not_warned():
    # "more than 5 percentage points": 11 of 20 pixels (55%) at --train 0.5 is exactly 5 points off, and
    # was warned (0.55 - 0.5 > 0.05 in floating point) while 9 of 20 (45%) was not
    labels = np.ones((1, 20), np.int32)
    seen = set()
    for seed in range(12):  # blocks of 11 px on a seeded grid: train is one block of 9, 10 or 11 pixels
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            split, _ = make_split(labels, "blocks", train=0.5, guard=0, block_size=11, seed=seed)
        n_train = int(np.count_nonzero(split == SPLIT_TRAIN))
        seen.add(n_train)
        assert abs(20 * n_train - 10 * 20) <= 20  # within 5 points: |n/20 - 1/2| <= 1/20, in integers
        assert not [w for w in caught if w.category is TrainShareWarning], (seed, n_train)
    assert 11 in seen
    # 6 of 20 (30%) is far off, and warned
    with pytest.warns(TrainShareWarning, match=r"train is 30.0% of the labelled pixels, not the 50.0%"):
        make_split(np.ones((1, 20), np.int32), "blocks", train=0.5, guard=0, block_size=15, seed=11)


def test_make_split_adaptive_block_size_keeps_the_train_share_on_indian_pines():
    # the defaults (adaptive block size, 15x15 patches) give 11.1% for 10% (docs/splits.md): no share warning,
    # only the classes that cannot be split are named
    with pytest.warns(UnsplittableClassWarning) as caught:
        _, params = make_split(_ip_labels(), "blocks", train=0.1, guard=H, seed=0)
    assert params["adaptive_block_size"]
    assert [w.category for w in caught] == [UnsplittableClassWarning]


def test_block_split_deterministic_and_seeded():
    labels = pavia_like_labels(seed=1)
    a = block_split_details(labels, train=0.2, guard=3, seed=1)
    b = block_split_details(labels, train=0.2, guard=3, seed=1)
    np.testing.assert_array_equal(a.split, b.split)
    assert (a.block_size, a.origin, a.lost) == (b.block_size, b.origin, b.lost)
    c = block_split_details(labels, train=0.2, guard=3, seed=2)
    assert not np.array_equal(a.split, c.split)


def test_block_split_fixed_block_size_and_no_guard():
    labels = make_scene(90, 100, 2, classes=5, seed=4)[1]
    r = block_split_details(labels, train=0.3, block_size=9, guard=0, seed=0)
    assert r.block_size == 9 and r.lost == 0 and list(r.tried) == [9]
    # guard 0: every labelled pixel is in a split, whole blocks
    assert not ((labels != 0) & (r.split == SPLIT_NONE)).any()
    by, bx = block_ids(labels.shape, 9, r.origin)
    assert (r.split[labels != 0] == r.blocks[by, bx][labels != 0]).all()


def test_block_split_warning_without_a_guard_does_not_suggest_a_smaller_max_patch():
    """--max-patch 1 (guard 0) is the smallest guard: the warning suggested "a smaller --max-patch" and spoke of
    "0 px between train and the others". It names the class with its counts (numpy's) and says what can help:
    a smaller --block-size, which puts the class's pixels in more blocks (shown: at block size 2 it is split)."""
    lab = np.zeros((40, 40), dtype=np.int32)
    lab[:, :20], lab[:, 20:] = 1, 2
    lab[5:8, 5:8] = 3  # a 3x3 class: one 10-px block holds it all
    with pytest.warns(UnsplittableClassWarning) as caught:
        split, params = make_split(lab, "blocks", train=0.3, block_size=10, guard=0, seed=0)
    r = block_split_details(lab, train=0.3, block_size=10, guard=0, seed=0)
    assert list(r.unsplit) == [3] and params["unsplit_classes"] == {"3": 1}
    n = [int(np.count_nonzero((lab == 3) & (split == code))) for code in (SPLIT_TRAIN, SPLIT_TEST)]
    assert n[0] + n[1] == 9 and 0 in n
    text = str(caught[0].message)
    untrained = ("; class 3 got no train pixel: scored, never trained on (a train block of its own would take its "
                 "block's other pixels from val/test, or leave the scene none)") if n[0] == 0 else ""
    assert text == (f"block split: class 3 (1 block: {n[0]} train, {n[1]} test) could not be split into train and "
                    "test: too few pixels or blocks; such a class is missing from some split (--max-patch 1 has no "
                    "guard to narrow: a smaller --block-size puts a class's pixels in more blocks)" + untrained), text
    assert "smaller --max-patch" not in text and " px between" not in text
    assert 3 not in block_split_details(lab, train=0.3, block_size=2, guard=0, seed=0).unsplit
    # with a guard, the guard is what a smaller --max-patch narrows, as before
    with pytest.warns(UnsplittableClassWarning, match=r"with 2 px between .* \(a smaller --max-patch narrows"):
        make_split(lab, "blocks", train=0.3, block_size=10, guard=1, seed=0)


def test_block_split_tiny_scenes():
    # a 5x7 scene with guard 3: no two pixels are more than 2 * 3 px apart; the class is named
    lab = random_labels((5, 7), 1, p_unlabelled=0.0, seed=0)
    with pytest.warns(UnsplittableClassWarning, match=r"class 1 \([1-4] blocks?: \d+ train, 0 test\) could not be split"):
        split = block_split(lab, train=0.5, guard=3, block_size=15)
    check_basic(lab, split)
    # with guard 2 its two ends are far enough apart: train at one end, test at the other
    r = block_split_details(lab, train=0.5, guard=2, block_size=15, seed=0)
    assert not r.unsplit and {SPLIT_TRAIN, SPLIT_TEST} <= set(r.split.ravel().tolist())
    # two far-apart pixels of one class: train one, test the other
    lab = np.zeros((30, 30), dtype=np.int32)
    lab[0, 0] = lab[29, 29] = 1
    r = block_split_details(lab, train=0.5, guard=3, block_size=5, seed=0)
    assert sorted(r.split[lab != 0].tolist()) == [SPLIT_TRAIN, SPLIT_TEST] and not r.unsplit


def test_block_split_two_pixel_class_with_val_gets_train_first():
    # the reported gap: with val, a class of 2 far-apart pixels got val and test but no train
    lab = make_scene(60, 60, 2, classes=3, seed=1)[1]
    lab[5, 5], lab[54, 54] = 4, 4
    for seed in range(5):
        r = block_split_details(lab, train=0.1, val=0.1, guard=3, block_size=6, seed=seed)
        dist = train_distance(r.split)
        assert (dist[np.isin(r.split, (SPLIT_VAL, SPLIT_TEST))] > 6).all()
        check_train_first(lab, r, 3)
        assert per_class(lab, r.split)[4] == (1, 0, 1), seed  # too few for val: named with its counts
        assert r.unsplit[4] == 2 and "4 (2 blocks: 1 train, 0 val, 1 test)" in r.warning()


def test_block_split_class_that_cannot_be_split_is_never_val_only():
    # test comes before val: a class whose pixels all lie within the guard of each other (or in one block) is
    # train only or test only as the other classes' blocks fall; the val greedy took its whole block for val,
    # leaving it neither trained on nor scored (found by a property sweep: 6 of these 25 splits)
    lab = np.zeros((30, 30), np.int32)
    lab[:, :15], lab[:, 15:] = 1, 2
    lab[::2] = 0
    lab[21:24, 6:9] = 0
    lab[22, 7] = lab[22, 8] = lab[23, 7] = 3  # 3 pixels, at most 1 px apart
    for guard, block_size in [(0, 5), (1, 5), (2, 6), (1, None), (2, None)]:
        for seed in range(5):
            r = block_split_details(lab, train=0.2, val=3, guard=guard, block_size=block_size, seed=seed)
            for c in (1, 2, 3):
                codes = r.split[lab == c]
                val, test = np.count_nonzero(codes == SPLIT_VAL), np.count_nonzero(codes == SPLIT_TEST)
                assert val == 0 or test > 0, (guard, block_size, seed, c, np.bincount(codes, minlength=4))


def test_block_split_tiny_classes_sweep():
    # seeded sweep: blob scenes with 1-4 pixel classes scattered in, val or not: train first, no leakage,
    # the classes left short named with their counts, deterministic
    rng = np.random.default_rng(1)
    for case in range(40):
        lab = make_scene(40, 48, 2, classes=3, seed=case)[1].astype(np.int32)
        for c in range(4, 4 + int(rng.integers(1, 4))):
            for _ in range(int(rng.integers(1, 5))):
                lab[rng.integers(40), rng.integers(48)] = c
        guard = int(rng.integers(1, 4))
        val = [0, 0.1, 2][case % 3]
        train = [0.1, 0.3, 5][case % 3 - 1]
        r = block_split_details(lab, train=train, val=val, guard=guard, seed=case)
        check_basic(lab, r.split)
        dist = train_distance(r.split)
        assert (dist[np.isin(r.split, (SPLIT_VAL, SPLIT_TEST))] > 2 * guard).all(), case
        check_train_first(lab, r, guard)
        assert (r.warning() is None) == (not r.unsplit)
        for c, n in r.unsplit.items():
            assert f"{c} ({n} block{'' if n == 1 else 's'}: {r.counts[c][0]} train, " in r.warning()
        again = block_split_details(lab, train=train, val=val, guard=guard, seed=case)
        np.testing.assert_array_equal(r.split, again.split)


@pytest.mark.parametrize(
    ("shape", "guard", "want"),
    [((145, 145), 7, 29), ((610, 340), 7, 42), ((1000, 2000), 0, 125), ((10, 10), 2, 9),
     ((512, 614, 200), 3, 64)],
)
def test_default_block_size(shape, guard, want):
    assert default_block_size(shape, guard) == want
    sizes = candidate_block_sizes(shape, guard)
    assert sizes[-1] == want and sizes == sorted(set(sizes)) and sizes[0] >= min_block_size(guard)


# --- hypothesis: invariants on small random maps ------------------------------------------------


@st.composite
def block_cases(draw):
    h = draw(st.integers(1, 24))
    w = draw(st.integers(1, 24))
    labels = draw(arrays(np.int16, (h, w), elements=st.integers(0, 4)))
    guard = draw(st.integers(0, 3))
    block_size = draw(st.one_of(st.none(), st.integers(min_block_size(guard), 2 * guard + 7)))
    train = draw(st.one_of(st.floats(0.05, 0.9), st.integers(1, 30)))
    val = draw(st.sampled_from([0.0, 0.05, 0.3, 3]))
    if isinstance(train, float) and isinstance(val, float) and train + val >= 0.99:
        val = 0.0
    seed = draw(st.integers(0, 2**32 - 1))
    return labels, block_size, guard, train, val, seed


@settings(max_examples=60, deadline=None)
@given(block_cases())
def test_block_split_invariants_property(case):
    labels, block_size, guard, train, val, seed = case
    r = block_split_details(labels, block_size=block_size, guard=guard, train=train, val=val, seed=seed)
    if not labels.any():
        assert not r.split.any()
        return
    labelled = labels != 0
    if not (r.split == SPLIT_TRAIN).any():
        # no train pixel at all: only when any train block would leave no val/test pixel (train comes first,
        # but a split with nothing to evaluate on is not made)
        assert r.lost == 0 and r.unsplit
        check_train_first(labels, r, guard)
        return
    check_train_first(labels, r, guard)
    dist = train_distance(r.split)
    assert (dist[(r.split == SPLIT_TEST) | (r.split == SPLIT_VAL)] > 2 * guard).all()
    assert (dist[labelled & (r.split == SPLIT_NONE)] <= 2 * guard).all()
    by, bx = block_ids(labels.shape, r.block_size, r.origin)
    assert (r.split[labelled & (r.blocks[by, bx] == SPLIT_TRAIN)] == SPLIT_TRAIN).all()
    for cls in np.unique(labels[labelled]):
        if int(cls) not in r.unsplit:
            assert ((labels == cls) & (r.split == SPLIT_TRAIN)).any()
            assert ((labels == cls) & (r.split == SPLIT_TEST)).any()
    np.testing.assert_array_equal(
        r.split, block_split_details(labels, block_size=block_size, guard=guard, train=train, val=val,
                                     seed=seed).split)


# --- mask_split ------------------------------------------------------------------------------------


def test_mask_split_assigns_labelled_pixels_only():
    lab = np.array([[0, 1, 2, 3], [1, 0, 2, 2], [3, 3, 0, 1]])
    train = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    val = np.array([[0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=bool)
    test = np.array([[0, 0, 0, 0], [5, 5, 5, 0], [0, 0, 1, 1]], dtype=np.float32)
    with pytest.warns(UnsplittableClassWarning) as caught:  # the masks are kept; the classes are named
        split = mask_split(lab, train_mask=train, test_mask=test, val_mask=val)
    assert warned_small(caught, "mask split") == {
        1: "1 train, 0 val, 2 test", 2: "0 train, 1 val, 1 test", 3: "0 train, 0 val, 0 test"}
    want = np.array([[0, 1, 2, 0], [3, 0, 3, 0], [0, 0, 0, 3]], dtype=np.uint8)
    np.testing.assert_array_equal(split, want)
    check_basic(lab, split)
    # without val_mask, the val pixel is in no split
    with pytest.warns(UnsplittableClassWarning):
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
    split = block_split_details(lab, block_size=7, guard=2, train=0.4, val=0.2, seed=0).split
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
        (dict(block_size=3, guard=7), r"block_size \(3\) must be at least 4 for guard 7"),
        (dict(block_size=1, guard=0), r"block_size \(1\) must be at least 2 for guard 0"),
        (dict(block_size=0, guard=0), "block_size must be >= 1, got 0"),
        (dict(block_size=4.5, guard=1), "block_size must be a whole number"),
        (dict(block_size=8, guard=-1), "guard must be >= 0, got -1"),
        (dict(block_size=8, guard=1.0), "guard must be a whole number"),
        (dict(block_size=8, guard=1, train=0), "train pixel count must be >= 1, got 0"),
        (dict(block_size=8, guard=1, train=0.0), r"train fraction must be in \(0, 1\), got 0.0; pass a whole"),
        (dict(block_size=8, guard=1, val=-2), "val pixel count must be >= 1"),
        (dict(block_size=8, guard=1, train=0.5, val=0.5), "below 1"),
        (dict(train="0.1"), "train must be a fraction"),
    ],
)
def test_block_split_bad_arguments(kw, match):
    with pytest.raises(InputError, match=match):
        block_split(LAB, **kw)
    with pytest.raises(InputError, match=match):
        block_split_details(LAB, **kw)


def test_default_block_size_bad_arguments():
    with pytest.raises(InputError, match="guard must be >= 0"):
        default_block_size((10, 10), -1)
    with pytest.raises(InputError, match="at least 2 dimensions"):
        default_block_size((10,), 1)
