"""GridSamples (every s-th pixel, computed per batch) against a plain enumeration written here."""

from __future__ import annotations

import numpy as np
import pytest

import hsgds
from hsgds.errors import ConfigError
from hsgds.format import TileGrid
from hsgds.pixels import GridSamples


def enumerate_pixels(grids, stride, labels):
    """Every stride-th pixel of each scene in global tile order, raster order inside a tile: (tile, padded y,
    padded x, class index, scene y, scene x) per sample, by looping over tiles."""
    rows, first = [], 0
    for g, lab in zip(grids, labels):
        for ty in range(g.nty):
            for tx in range(g.ntx):
                for y in range(ty * g.tile, min((ty + 1) * g.tile, g.height)):
                    for x in range(tx * g.tile, min((tx + 1) * g.tile, g.width)):
                        if y % stride == 0 and x % stride == 0:
                            cls = -1 if lab is None else int(lab[y, x]) - 1
                            rows.append((first + ty * g.ntx + tx, y - ty * g.tile + g.halo,
                                         x - tx * g.tile + g.halo, cls, y, x))
        first += g.num_tiles
    return np.array(rows, dtype=np.int64).reshape(-1, 6)


@pytest.mark.parametrize("stride", [1, 2, 3, 7])
def test_grid_samples_equal_a_plain_enumeration(stride):
    rng = np.random.default_rng(stride)
    grids = [TileGrid(height=23, width=17, bands=3, dtype="int16", tile=8, halo=2),  # edge tiles cut short
             TileGrid(height=5, width=31, bands=3, dtype="int16", tile=6, halo=1),
             TileGrid(height=16, width=16, bands=3, dtype="int16", tile=16, halo=4)]
    labels = [rng.integers(0, 4, (23, 17)).astype(np.uint8), None, rng.integers(0, 3, (16, 16)).astype(np.uint16)]
    want = enumerate_pixels(grids, stride, labels)
    reads = []

    def reader(lab):
        def read():
            reads.append(1)
            return lab[::stride, ::stride]
        return read

    samples = GridSamples(grids, stride, [None if lab is None else reader(lab) for lab in labels])
    assert not reads  # label maps are read when a sample of their scene is first taken
    assert len(samples) == len(want)
    np.testing.assert_array_equal(np.repeat(np.arange(len(samples.counts())), samples.counts()), want[:, 0])
    idx = np.arange(len(samples))
    for picked in (idx, rng.permutation(idx)[:50], idx[::5]):
        got = np.stack([np.asarray(c, dtype=np.int64) for c in samples.take(picked)], axis=1)
        np.testing.assert_array_equal(got, want[picked])
    np.testing.assert_array_equal(samples.tile_of(idx), want[:, 0])
    np.testing.assert_array_equal(samples.label, want[:, 3])
    assert len(reads) == 2  # once per labelled scene


def test_grid_samples_keep_memory_per_tile():
    """A 40,000 x 40,000 scene at stride 1 (1.6 billion pixels): the set holds its 625 tiles' geometry."""
    g = TileGrid(height=40_000, width=40_000, bands=200, dtype="int16", tile=1600, halo=7)
    samples = GridSamples([g], 1, [None])
    assert len(samples) == 40_000 ** 2
    assert sum(a.nbytes for a in vars(samples).values() if isinstance(a, np.ndarray)) < 64 * 625
    tile, y, x, label, sy, sx = samples.take(np.array([0, 40_000 ** 2 - 1]))
    assert tile.tolist() == [0, 624] and sy.tolist() == [0, 39_999] and sx.tolist() == [0, 39_999]
    assert y.tolist() == [7, 1606] and label.tolist() == [-1, -1]


@pytest.mark.parametrize("stride", [1, 2, 3])
def test_grid_samples_leave_out_excluded_pixels(stride):
    """Excluded (tile, lattice index) pairs, drawn at random per tile (none, some, all of a tile), are
    skipped: the rest equals the plain enumeration without them, in the same order."""
    rng = np.random.default_rng(10 + stride)
    grids = [TileGrid(height=23, width=17, bands=3, dtype="int16", tile=8, halo=2),
             TileGrid(height=16, width=16, bands=3, dtype="int16", tile=16, halo=4)]
    labels = [rng.integers(0, 4, (23, 17)).astype(np.uint8), None]
    every = enumerate_pixels(grids, stride, labels)
    drop = np.zeros(len(every), bool)
    excluded = []
    first = 0
    for g in grids:
        tiles, index = [], []
        for t in range(g.num_tiles):
            rows = np.flatnonzero(every[:, 0] == first + t)
            n = rng.choice([0, len(rows), rng.integers(0, len(rows) + 1)]) if len(rows) else 0
            out = np.sort(rng.choice(len(rows), size=n, replace=False))
            drop[rows[out]] = True
            tiles += [t] * len(out)
            index += out.tolist()
        order = rng.permutation(len(tiles))  # any order: GridSamples sorts them
        excluded.append((np.array(tiles, np.int64)[order], np.array(index, np.int64)[order]))
        first += g.num_tiles
    assert drop.any() and not drop.all()
    want = every[~drop]
    samples = GridSamples(grids, stride, [None if lab is None else (lambda lab=lab: lab[::stride, ::stride])
                                          for lab in labels], excluded)
    assert len(samples) == len(want)
    np.testing.assert_array_equal(np.repeat(np.arange(len(samples.counts())), samples.counts()), want[:, 0])
    idx = np.arange(len(samples))
    for picked in (idx, rng.permutation(idx)[:40]):
        got = np.stack([np.asarray(c, dtype=np.int64) for c in samples.take(picked)], axis=1)
        np.testing.assert_array_equal(got, want[picked])


def test_sample_set_checks_its_mask_like_the_loader(tile_store):
    """An integer mask would index pixels instead of selecting them (silently wrong samples)."""
    scene = hsgds.open_scene(tile_store)
    h, w = scene.shape[:2]
    half = np.zeros((h, w), bool)
    half[: h // 2] = True
    kept = scene.sample_set(None, half)
    assert np.all(kept.scene_y < h // 2) and 0 < len(kept.label) < len(scene.sample_set(None).label)
    ragged = [[True] * w] * (h - 1) + [[True] * (w - 1)]  # a row short: numpy's ValueError named no mask
    for bad, message in ((half.astype(np.int64), "must be a boolean array"), (np.ones((h + 1, w), bool), "has shape"),
                         (np.True_, "has shape"), (ragged, "must be a boolean .H, W. array, got a list numpy cannot")):
        with pytest.raises(ConfigError, match=message):
            scene.sample_set(None, bad)
    with pytest.raises(ConfigError, match="mask for scene .* got a list numpy cannot read as one"):
        hsgds.PatchLoader(tile_store, patch_size=3, batch_size=8, mask=ragged, device="cpu")


def test_window_and_tile_reads_check_their_arguments(tile_store):
    from hsgds.errors import InputError

    scene = hsgds.open_scene(tile_store)
    h, w = scene.shape[:2]
    assert np.array_equal(scene.read(np.int64(1), 3, 0, 2), scene.read(1, 3, 0, 2))  # numpy ints are ints
    for args, error, message in (((1.5, 3, 0, 2), ConfigError, "a window bound must be an integer >= 0, got 1.5"),
                                 ((0, h + 1, 0, 2), InputError, "outside the scene"),
                                 ((-1, 3, 0, 2), ConfigError, "integer >= 0")):
        with pytest.raises(error, match=message):
            scene.read(*args)
    with pytest.raises(ConfigError, match="tile_id must be an integer"):
        scene.read_tile(1.0)
    with pytest.raises(InputError, match="out of range"):
        scene.read_tile(scene.grid.num_tiles)


# -- source nodata (format v3): never a sample ------------------------------------------------------------------
H_ND, W_ND, TILE_ND = 70, 50, 28


@pytest.fixture(scope="module")
def swath(nodata_store):
    """A 70 x 50 store (tiles of 28, the first wholly nodata) with nodata outside a slanted swath, and
    its split map (split code of each labelled pixel, -1 where unlabelled)."""
    store, _, labels, nodata = nodata_store(H_ND, W_ND, 8, seed=3, tile=TILE_ND)
    scene = hsgds.open_scene(store)
    table = scene.sample_table()
    split_map = np.full((H_ND, W_ND), -1)
    ty, tx = np.divmod(table["tile"].astype(np.int64), scene.grid.ntx)
    split_map[ty * TILE_ND + table["y"], tx * TILE_ND + table["x"]] = table["split"]
    return store, labels, nodata, split_map


def _raster(keep, tile, ntx):
    """(y, x) of the True pixels of ``keep`` tile by tile, raster order inside each tile (the loader's order
    without shuffling)."""
    ys, xs = np.nonzero(keep)
    order = np.lexsort((xs, ys, (ys // tile) * ntx + xs // tile))
    return np.column_stack([ys[order], xs[order]])


def _coords(loader):
    return np.concatenate([c.numpy() for _, _, c in loader]).astype(np.int64)


@pytest.mark.parametrize("stride, split, masked", [(1, None, False), (2, None, False), (1, None, True),
                                                   (1, "train", False), (3, "test", True)])
def test_pixels_all_never_yields_a_nodata_pixel(swath, stride, split, masked):
    """Every stride-th pixel where the source had data (less the other splits' labelled ones, inside the
    mask), in tile raster order, with len(loader) and the per-tile counts of exactly those pixels."""
    from hsgds.pixels import all_pixels

    store, labels, nodata, split_map = swath
    mask = None
    keep = np.zeros((H_ND, W_ND), bool)
    keep[::stride, ::stride] = True
    keep &= ~nodata
    if masked:
        mask = np.zeros((H_ND, W_ND), bool)
        mask[10:60, 5:45] = True
        keep &= mask
    if split is not None:
        keep &= (split_map == hsgds.format.SPLIT_CODES[split]) | (split_map == -1)
    want = _raster(keep, TILE_ND, 2)
    with hsgds.PatchLoader(store, patch_size=5, batch_size=32, pixels="all", stride=stride, split=split, mask=mask,
                           shuffle=False, return_coords=True, normalize=None, device="cpu") as loader:
        assert isinstance(loader.samples, GridSamples) != masked
        assert len(loader) == -(-len(want) // 32)
        counts = np.bincount((want[:, 0] // TILE_ND) * 2 + want[:, 1] // TILE_ND, minlength=6)
        np.testing.assert_array_equal(loader.samples.counts(), counts)
        assert counts[0] == 0  # the wholly nodata tile has no sample
        np.testing.assert_array_equal(_coords(loader), want)
        lab = np.concatenate([lb.numpy() for _, lb, _ in loader])
        np.testing.assert_array_equal(lab, labels[want[:, 0], want[:, 1]].astype(np.int64) - 1)
    got = all_pixels(hsgds.open_scene(store), stride, split, mask)
    np.testing.assert_array_equal(np.column_stack([got.scene_y, got.scene_x]), want)


def test_nodata_pixels_cost_memory_per_run(swath):
    """The left-out nodata pixels are held as runs (a few per lattice row of a tile), not one per pixel."""
    from hsgds.pixels import excluded_pixels

    store, _, nodata, _ = swath
    scene = hsgds.open_scene(store)
    tile, first, length = excluded_pixels(scene, 1, None)
    assert length.sum() == nodata.sum()
    assert len(tile) < nodata.sum() / 5
    samples = GridSamples([scene.grid], 1, [None], [(tile, first, length)])
    assert len(samples) == (~nodata).sum()


def test_pixels_all_over_nodata_shards_across_two_ranks_and_resumes(swath):
    """Two ranks together yield every pixel with data, each at most once more (a rank's last batch is
    padded); a saved position resumes exactly."""
    store, _, nodata, _ = swath
    opts = dict(patch_size=5, batch_size=40, pixels="all", return_coords=True, device="cpu", seed=7,
                shuffle_window=2)
    shards = []
    for rank in (0, 1):
        with hsgds.PatchLoader(store, rank=rank, world_size=2, **opts) as loader:
            shards.append(_coords(loader))
            assert len(loader) == -(-len(shards[-1]) // 40)
    assert len(shards[0]) == len(shards[1])
    seen = np.concatenate(shards)
    want = np.column_stack(np.nonzero(~nodata))
    assert {tuple(c) for c in seen.tolist()} == {tuple(c) for c in want.tolist()}
    assert len(want) <= len(seen) <= len(want) + 2
    with hsgds.PatchLoader(store, **opts) as full:
        expected = [c.numpy() for _, _, c in full]
    with hsgds.PatchLoader(store, **opts) as first:
        it = iter(first)
        got = [next(it)[2].numpy() for _ in range(5)]
        state = first.state_dict()
    with hsgds.PatchLoader(store, **opts) as second:
        second.load_state_dict(state)
        got += [c.numpy() for _, _, c in second]
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def test_excluded_runs_merge_neighbours_and_repeats():
    """Pairs in any order, some repeated (a pixel both of another split and nodata), become sorted runs;
    GridSamples leaves out the same pixels from either form."""
    from hsgds.pixels import excluded_runs

    tile = np.array([1, 0, 0, 0, 1, 0, 2, 0])
    index = np.array([3, 5, 4, 9, 4, 5, 0, 6])
    runs = excluded_runs(tile, index)
    assert [r.tolist() for r in runs] == [[0, 0, 1, 2], [4, 9, 3, 0], [3, 1, 2, 1]]
    g = TileGrid(height=12, width=8, bands=3, dtype="int16", tile=4, halo=1)
    pairs, merged = GridSamples([g], 1, [None], [(tile, index)]), GridSamples([g], 1, [None], [runs])
    assert len(pairs) == len(merged) == 96 - 7
    np.testing.assert_array_equal(pairs.offsets, merged.offsets)
    for a, b in zip(pairs.take(np.arange(len(pairs))), merged.take(np.arange(len(merged)))):
        np.testing.assert_array_equal(a, b)
    want = enumerate_pixels([g], 1, [None])
    drop = np.zeros(len(want), bool)
    for t, i in set(zip(tile.tolist(), index.tolist())):
        drop[np.flatnonzero(want[:, 0] == t)[i]] = True
    got = np.stack([np.asarray(c, np.int64) for c in merged.take(np.arange(len(merged)))], axis=1)
    np.testing.assert_array_equal(got, want[~drop])


# -- footprint_guard: pixels="all" patches that never show another split's labelled pixel ---------------------------

def _guard_reference(scene, split, patch, stride, nodata=None):
    """The centres a guarded loader must yield, by looping: every stride-th pixel with data whose patch window
    (clipped to the scene) holds no labelled pixel of a split other than ``split``."""
    h, w = scene.shape[:2]
    other = np.zeros((h, w), bool)
    t = scene.sample_table()
    code = {"train": 1, "val": 2, "test": 3}[split]
    y, x, _ = scene.samples(None)
    other[y[t["split"] != code], x[t["split"] != code]] = True
    r = patch // 2
    keep = set()
    for cy in range(0, h, stride):
        for cx in range(0, w, stride):
            if nodata is not None and nodata[cy, cx]:
                continue
            if not other[max(0, cy - r):cy + r + 1, max(0, cx - r):cx + r + 1].any():
                keep.add((cy, cx))
    return keep


@pytest.mark.parametrize("stride, patch, split", [(1, 5, "train"), (2, 7, "train"), (1, 3, "test")])
def test_footprint_guard_keeps_patches_clear_of_other_splits(synthetic_store, stride, patch, split):
    store = synthetic_store(37, 29, 4, classes=3, seed=21, labelled_fraction=0.05, tile=18, train=0.5)[0]
    scene = hsgds.open_scene(store)
    want = _guard_reference(scene, split, patch, stride)
    opts = dict(patch_size=patch, batch_size=32, pixels="all", split=split, stride=stride, shuffle=False,
                return_coords=True, device="cpu")
    with hsgds.PatchLoader(store, footprint_guard=True, **opts) as guarded, hsgds.PatchLoader(store, **opts) as plain:
        got = [tuple(c) for _, _, coords in guarded for c in coords.numpy().tolist()]
        assert len(guarded) == -(-len(want) // 32) and len(got) == len(want) and set(got) == want
        assert len(plain.samples) > len(guarded.samples)  # (footprints that show another split's pixel exist)
    mask = np.random.default_rng(3).random(scene.shape[:2]) < 0.5  # the listed path (a mask) gives the same
    with hsgds.PatchLoader(store, footprint_guard=True, mask=mask, **opts) as masked:
        got = {tuple(c) for _, _, coords in masked for c in coords.numpy().tolist()}
    assert got == {p for p in want if mask[p]}


def test_footprint_guard_needs_pixels_all_and_a_split_and_is_part_of_a_state(synthetic_store):
    store = synthetic_store(37, 29, 4, classes=3, seed=21, labelled_fraction=0.05, tile=18, train=0.5)[0]
    with pytest.raises(ConfigError, match="footprint_guard keeps pixels='all' patches clear"):
        hsgds.PatchLoader(store, patch_size=5, batch_size=8, pixels="all", footprint_guard=True, device="cpu")
    with pytest.raises(ConfigError, match="footprint_guard keeps pixels='all' patches clear"):
        hsgds.PatchLoader(store, patch_size=5, batch_size=8, footprint_guard=True, device="cpu")
    opts = dict(patch_size=5, batch_size=8, pixels="all", split="train", device="cpu")
    with hsgds.PatchLoader(store, footprint_guard=True, **opts) as a, hsgds.PatchLoader(store, **opts) as b:
        state = a.state_dict()
        with pytest.raises(ConfigError, match="saved with footprint_guard=True but this loader has "
                                              "footprint_guard=False"):
            b.load_state_dict(state)


def test_a_footprint_guard_that_leaves_no_centre_says_so(synthetic_store):
    """Every pixel labelled, half of them train: every centre is within 7 px of another split's labelled
    pixel, so footprint_guard leaves none (the reference, a loop over the scene's windows, agrees). The error
    said the scene 'has no train pixels ...; see `hsgds info` for its splits' (or, with a mask, 'widen the
    mask'), which it has: it names the guard and the patch size instead."""
    store = synthetic_store(37, 29, 4, classes=3, seed=21, labelled_fraction=1.0, tile=18, train=0.5)[0]
    assert not _guard_reference(hsgds.open_scene(store), "train", 15, 1)
    for mask in (None, np.ones((37, 29), bool)):
        with pytest.raises(ConfigError, match=r"has no pixel farther than patch_size // 2 = 7 px from another split's "
                                              r"labelled pixels \(footprint_guard=True, split='train'\); pass a smaller "
                                              r"patch_size, or footprint_guard=False$"):
            hsgds.PatchLoader(store, patch_size=15, batch_size=8, pixels="all", split="train", footprint_guard=True,
                              mask=mask, device="cpu")


def test_footprint_guard_over_a_collection_equals_its_opened_stores(synthetic_store, tmp_path):
    import shutil

    from hsgds.collection import SceneEntry, write_collection

    names = []
    for seed in (21, 22):
        store = synthetic_store(37, 29, 4, classes=3, seed=seed, labelled_fraction=0.05, tile=18, train=0.5)[0]
        shutil.copytree(store, tmp_path / f"s{seed}.zarr")
        names.append(f"s{seed}")
    write_collection(tmp_path, [SceneEntry.of_scene(n, hsgds.open_scene(tmp_path / f"{n}.zarr")) for n in names])
    opts = dict(patch_size=5, batch_size=32, pixels="all", split="train", shuffle=False, return_coords=True,
                device="cpu", footprint_guard=True)
    with hsgds.PatchLoader(tmp_path, **opts) as listed, \
            hsgds.PatchLoader([tmp_path / f"{n}.zarr" for n in names], **opts) as opened:
        got = np.concatenate([c.numpy() for _, _, c in listed])
        np.testing.assert_array_equal(got, np.concatenate([c.numpy() for _, _, c in opened]))
    for s, n in enumerate(names):
        want = _guard_reference(hsgds.open_scene(tmp_path / f"{n}.zarr"), "train", 5, 1)
        assert {(int(y), int(x)) for i, y, x in got.tolist() if i == s} == want
