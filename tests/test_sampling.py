"""Epoch plans: coverage, determinism, sharding, residency bounds."""

from __future__ import annotations

import numpy as np
import pytest

from hsgds.errors import ConfigError
from hsgds.sampling import SampleSet, check_ring, max_batch_tiles, plan_epoch, shard_samples, window_bounds


def sample_set(counts, seed=0) -> SampleSet:
    counts = np.asarray(counts)
    tile = np.repeat(np.arange(len(counts)), counts)
    rng = np.random.default_rng(seed)
    n = len(tile)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return SampleSet(tile=tile, y=rng.integers(0, 9, n), x=rng.integers(0, 9, n), label=rng.integers(0, 3, n),
                     scene_y=np.arange(n), scene_x=np.arange(n), offsets=offsets)


COUNTS = [37, 0, 5, 120, 1, 64, 0, 33, 12, 90]


def test_epoch_covers_every_sample_once():
    s = sample_set(COUNTS)
    plan = plan_epoch(s, batch_size=16, seed=1, epoch=0, shuffle=True, slots=100)
    assert sorted(plan.positions().tolist()) == list(range(len(s)))
    assert plan.num_batches == -(-len(s) // 16)
    assert plan.max_resident() <= 100


def test_same_seed_same_order_other_epoch_other_order():
    s = sample_set(COUNTS)
    a = plan_epoch(s, batch_size=8, seed=3, epoch=0, shuffle=True, slots=4)
    b = plan_epoch(s, batch_size=8, seed=3, epoch=0, shuffle=True, slots=4)
    c = plan_epoch(s, batch_size=8, seed=3, epoch=1, shuffle=True, slots=4)
    d = plan_epoch(s, batch_size=8, seed=4, epoch=0, shuffle=True, slots=4)
    np.testing.assert_array_equal(a.positions(), b.positions())
    assert not np.array_equal(a.positions(), c.positions()) and not np.array_equal(a.positions(), d.positions())


def test_no_shuffle_is_tile_order():
    s = sample_set(COUNTS)
    plan = plan_epoch(s, batch_size=8, seed=0, epoch=5, shuffle=False, slots=3)
    np.testing.assert_array_equal(plan.positions(), np.arange(len(s)))


@pytest.mark.parametrize("slots", [3, 5, 8])
def test_residency_never_exceeds_the_ring(slots):
    s = sample_set(COUNTS)
    plan = plan_epoch(s, batch_size=16, seed=0, epoch=0, shuffle=True, slots=slots)
    assert plan.max_resident() <= slots
    # every batch's tiles are resident during that batch
    for b in range(plan.num_batches):
        needed = set(s.tile[plan.batch(b)].tolist())
        live = {iv.tile for iv in plan.intervals if iv.first <= b <= iv.last}
        assert needed <= live


def test_global_shuffle_when_everything_fits():
    s = sample_set(COUNTS)
    plan = plan_epoch(s, batch_size=32, seed=0, epoch=0, shuffle=True, slots=len(COUNTS))
    assert plan.window >= 8  # all non-empty tiles in one window
    first = s.tile[plan.batch(0)]
    assert len(set(first.tolist())) > 2


def test_ring_too_small_for_a_batch_is_a_clear_error():
    s = sample_set([1] * 40)
    with pytest.raises(ConfigError, match="needs .* tiles resident but the ring has 2 slots"):
        plan_epoch(s, batch_size=16, seed=0, epoch=0, shuffle=False, slots=2)


def _most_tiles_in_any_order(counts, batch_size):
    """Brute force: over every order of the tiles, the most distinct tiles among batch_size consecutive
    samples (anywhere in the sequence, not only at batch boundaries)."""
    import itertools

    counts = [c for c in counts if c]
    best = 0
    for order in itertools.permutations(range(len(counts))):
        seq = np.repeat(order, [counts[t] for t in order])
        for start in range(len(seq) - min(batch_size, len(seq)) + 1):
            best = max(best, len(set(seq[start:start + batch_size].tolist())))
    return best


@pytest.mark.parametrize("counts", [[3, 1, 4, 1, 5], [6, 6, 8, 9, 12, 16], [1, 1, 1, 1, 1, 1], [2, 0, 7, 3, 3, 9],
                                    [20, 1, 2, 30, 1]])
def test_max_batch_tiles_is_the_most_any_order_spans(counts):
    """The bound from the counts alone equals a brute force over every order of the tiles, for every batch
    size up to the whole split."""
    for batch_size in range(1, sum(counts) + 1):
        assert max_batch_tiles(np.array(counts), batch_size) == _most_tiles_in_any_order(counts, batch_size), \
            batch_size


@pytest.mark.parametrize("world,drop_last", [(1, False), (2, False), (3, False), (2, True)])
def test_a_ring_that_passes_the_check_plans_every_epoch(world, drop_last):
    """check_ring's promise: a ring it accepts fits every batch of every epoch, on every rank, whatever the
    shuffled order (before it, epoch 0 was the only one checked and later epochs could need more tiles)."""
    rng = np.random.default_rng(7)
    counts = np.concatenate([rng.integers(1, 4, 12), rng.integers(20, 60, 12)])
    s = sample_set(counts)
    batch_size = 16
    for slots in range(1, len(counts)):
        try:
            check_ring(s.counts(), batch_size=batch_size, slots=slots, shuffle=True, world_size=world,
                       drop_last=drop_last, tile_nbytes=4096)
        except ConfigError:
            continue
        for epoch in range(60):
            for rank in range(world):
                plan = plan_epoch(s, batch_size=batch_size, seed=1, epoch=epoch, shuffle=True, slots=slots,
                                  rank=rank, world_size=world, drop_last=drop_last)
                assert plan.max_resident() <= slots
        break
    else:
        raise AssertionError("no ring passed the check")
    # the ring one slot smaller is refused, naming the ring that fits
    with pytest.raises(ConfigError, match=f"a batch of 16 can need {slots} tiles resident .* the ring has "
                                          f"{slots - 1} slots; raise ring_bytes to {slots * 4096} or more"):
        check_ring(s.counts(), batch_size=batch_size, slots=slots - 1, shuffle=True, world_size=world,
                   drop_last=drop_last, tile_nbytes=4096)


def test_ring_check_names_the_batch_size_that_fits():
    counts = np.array([6, 6, 8, 8, 9, 9, 12, 16])
    with pytest.raises(ConfigError, match="lower batch_size to 21 or less"):
        check_ring(counts, batch_size=32, slots=4, shuffle=True, world_size=1, drop_last=False, tile_nbytes=4096)
    check_ring(counts, batch_size=21, slots=4, shuffle=True, world_size=1, drop_last=False, tile_nbytes=4096)
    # unshuffled: the same plan every epoch, checked by planning it; a ring holding every tile fits any batch
    check_ring(counts, batch_size=32, slots=4, shuffle=False, world_size=1, drop_last=False, tile_nbytes=4096)
    check_ring(counts, batch_size=32, slots=8, shuffle=True, world_size=1, drop_last=False, tile_nbytes=4096)


@pytest.mark.timeout(60)  # a bound that walked the 400M samples would need GBs and minutes: a hang, not a number
def test_ring_check_follows_the_tiles_not_the_samples():
    """An archive's split: 100,000 tiles and 400M samples are bounded from the per-tile counts (the bound
    sorts only the batch_size smallest counts)."""
    counts = np.full(100_000, 4096, dtype=np.int64)
    counts[::1000] = 3
    assert max_batch_tiles(counts, 256) == 2 + 84


@pytest.mark.parametrize("world,drop_last", [(2, False), (3, False), (2, True), (4, True)])
def test_shards_disjoint_complete_equal(world, drop_last):
    s = sample_set(COUNTS)
    plans = [plan_epoch(s, batch_size=8, seed=2, epoch=1, shuffle=True, slots=4, rank=r, world_size=world,
                        drop_last=drop_last) for r in range(world)]
    assert len({p.num_batches for p in plans}) == 1
    n = len(s)
    own = [set(p.positions()[:n // world].tolist()) for p in plans]  # every rank's share has >= n // world
    for i in range(world):
        for j in range(i + 1, world):
            assert not own[i] & own[j]
    if not drop_last:
        union = set(np.concatenate([p.positions() for p in plans]).tolist())
        assert union == set(range(len(s)))
        # the shares differ by one sample at most: padding repeats at most one per rank
        assert all(len(p.order) == -(-n // world) for p in plans)
        assert sum(len(p.order) for p in plans) - n < world
    else:
        for p in plans:
            assert len(p.order) == p.num_batches * 8 == n // world // 8 * 8


def test_more_ranks_than_samples():
    with pytest.raises(ConfigError, match="the split has 4 samples, fewer than the 5 ranks"):
        plan_epoch(sample_set([3, 0, 1]), batch_size=2, seed=0, epoch=0, shuffle=True, slots=4, rank=0,
                   world_size=5)
    with pytest.raises(ConfigError, match="the split has 1 sample, fewer than the 2 ranks"):  # (not "1 samples")
        plan_epoch(sample_set([1]), batch_size=2, seed=0, epoch=0, shuffle=True, slots=4, rank=0, world_size=2)
    # fewer tiles than ranks is fine: ranks share tiles
    plans = [plan_epoch(sample_set([3, 0, 2]), batch_size=2, seed=0, epoch=0, shuffle=True, slots=4, rank=r,
                        world_size=5) for r in range(5)]
    assert sorted(np.concatenate([p.positions() for p in plans]).tolist()) == list(range(5))


def test_resume_intervals_start_at_batch():
    s = sample_set(COUNTS)
    plan = plan_epoch(s, batch_size=16, seed=0, epoch=0, shuffle=True, slots=4)
    assert plan.intervals_from(0) == list(plan.intervals)  # from the start: every interval as planned
    ivs = plan.intervals_from(7)
    assert all(iv.first >= 7 and iv.last >= 7 for iv in ivs)
    needed = set(s.tile[plan.batch(7)].tolist())
    assert needed <= {iv.tile for iv in ivs if iv.first == 7}


@pytest.mark.parametrize("batch", [1, 7, 16, 64, 1000])
@pytest.mark.parametrize("drop_last", [False, True])
def test_unshuffled_plan_is_the_samples_in_order_with_each_tiles_residency(batch, drop_last):
    """One rank, unshuffled: the plan is a range over the samples, and every tile's residency (from the
    offset table) is what the per-sample computation gives for that order."""
    from hsgds.sampling import _as_intervals, _merged, _Residency

    s = sample_set(COUNTS)
    plan = plan_epoch(s, batch_size=batch, seed=0, epoch=0, shuffle=False, slots=100, drop_last=drop_last)
    n = len(s) // batch * batch if drop_last else len(s)
    assert isinstance(plan.order, range) and len(plan.order) == n
    got = np.concatenate([plan.batch(b) for b in range(plan.num_batches)] or [np.zeros(0, np.int64)])
    np.testing.assert_array_equal(got, np.arange(n))
    residency = _Residency(len(COUNTS), batch)
    residency.add(0, s.tile[:n])
    assert plan.intervals == _as_intervals(_merged([residency.spans()]))


def _reference_order(s: SampleSet, seed: int, epoch: int, rank: int, world: int, window: int, batch: int,
                     drop_last: bool) -> np.ndarray:
    """The order written out whole: tiles permuted by (seed, epoch), their samples listed tile after tile and
    cut into ``world`` consecutive shares of n // world or n // world + 1 samples, the rank's share grouped
    into windows of ``window`` tiles (when there are several, the first ones ramp up: 2, 4, 8, ... tiles;
    a tile cut between two ranks counts in both), window w's samples permuted by a generator seeded with
    (seed, epoch, rank, 1, w), cut to the smallest share or padded from the start to the largest."""
    counts = np.diff(s.offsets)
    tiles = np.random.default_rng([seed, epoch]).permutation(np.flatnonzero(counts))
    listed = [(int(t), int(i)) for t in tiles for i in range(s.offsets[t], s.offsets[t + 1])]
    n = len(listed)
    cuts = [r * n // world for r in range(world + 1)]
    share = listed[cuts[rank]:cuts[rank + 1]]
    mine: list[list[int]] = []  # the rank's tiles, each with its samples in the share
    for k, (t, i) in enumerate(share):
        if k == 0 or share[k - 1][0] != t:
            mine.append([])
        mine[-1].append(i)
    groups, size = [], min(2, window) if len(mine) > window else window
    while sum(map(len, groups)) < len(mine):
        done = sum(map(len, groups))
        groups.append(mine[done:done + size])
        size = min(2 * size, window)
    parts = [np.random.default_rng([seed, epoch, rank, 1, w]).permutation(np.concatenate(g))
             for w, g in enumerate(groups)]
    order = np.concatenate(parts)
    sizes = np.diff(cuts)
    if drop_last:
        return order[:min(sizes) // batch * batch]
    return np.resize(order, max(sizes))


@pytest.mark.parametrize("world,drop_last", [(1, False), (1, True), (2, False), (3, False), (3, True)])
@pytest.mark.parametrize("window", [1, 2, 4, 5])
def test_windowed_order_is_the_whole_order_made_window_by_window(world, drop_last, window):
    """The plan makes a window's order only when a batch reads from it: every batch, in any order, and the
    whole order equal the order written out whole."""
    s = sample_set([37, 0, 5, 120, 1, 64, 0, 33, 12, 90, 7, 250, 3], seed=4)
    for rank in range(world):
        plan = plan_epoch(s, batch_size=9, seed=6, epoch=3, shuffle=True, slots=4 * window + 4, window=window,
                          rank=rank, world_size=world, drop_last=drop_last)
        assert plan.window == window
        want = _reference_order(s, 6, 3, rank, world, window, 9, drop_last)
        np.testing.assert_array_equal(plan.positions(), want)
        for b in reversed(range(plan.num_batches)):  # any batch, in any order
            np.testing.assert_array_equal(plan.batch(b), want[b * 9:(b + 1) * 9])


def test_a_streamed_epoch_starts_with_small_windows():
    """More tiles than one window holds: the windows ramp up 2, 4, 8, ... tiles, so the first batch needs two
    tiles resident, not a whole window; a scene that fits one window keeps its one global shuffle."""
    assert window_bounds(40, 10).tolist() == [0, 2, 6, 14, 24, 34, 40]
    assert window_bounds(12, 12).tolist() == [0, 12]
    assert window_bounds(5, 1).tolist() == [0, 1, 2, 3, 4, 5]
    s = sample_set([50] * 100, seed=1)
    plan = plan_epoch(s, batch_size=32, seed=0, epoch=0, shuffle=True, slots=20)
    assert plan.window == 10
    assert len([iv for iv in plan.intervals if iv.first == 0]) == 2
    assert sorted(plan.positions().tolist()) == list(range(5000))  # still every sample once
    whole = plan_epoch(s, batch_size=32, seed=0, epoch=0, shuffle=True, slots=200)
    assert whole.window == 100 and len([iv for iv in whole.intervals if iv.first == 0]) > 10


def test_planning_a_shuffled_epoch_holds_no_array_per_sample():
    """4M samples over 400 tiles, 16 ring slots: planning and taking batches allocate a window's worth
    (8 tiles, 80k samples), not the epoch's order (32 MB of int64)."""
    import tracemalloc

    class Counted:  # samples known by their offset table only
        offsets = np.linspace(0, 4_000_000, 401).astype(np.int64)

        def __len__(self):
            return 4_000_000

        def counts(self):
            return np.diff(self.offsets)

        def tile_of(self, idx):
            return np.searchsorted(self.offsets, idx, side="right") - 1

    tracemalloc.start()
    try:
        plan = plan_epoch(Counted(), batch_size=256, seed=0, epoch=0, shuffle=True, slots=16)
        for b in range(0, plan.num_batches, 97):
            assert len(plan.batch(b)) == 256
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.window == 8
    assert peak < 4_000_000 * 8 / 4, f"{peak / 1e6:.1f} MB at peak"  # ~3 MB here; the whole order alone is 32 MB


@pytest.mark.parametrize("seed", range(20))
def test_merged_spans_equal_a_plain_python_merge(seed):
    """_merged joins each tile's overlapping or adjacent spans and sorts by (first, last, tile), with
    whole-array operations: the same as merging span by span in Python."""
    from hsgds.sampling import _merged

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    tile = rng.integers(0, 8, n)
    first = rng.integers(0, 30, n)
    last = first + rng.integers(0, 6, n)
    parts = [(tile[:n // 2], first[:n // 2], last[:n // 2]), (tile[n // 2:], first[n // 2:], last[n // 2:])]
    runs: dict[int, list[list[int]]] = {}
    for t, f, e in sorted(zip(tile.tolist(), first.tolist(), last.tolist())):
        r = runs.setdefault(t, [])
        if r and f <= r[-1][1] + 1:
            r[-1][1] = max(r[-1][1], e)
        else:
            r.append([f, e])
    want = sorted(((f, e, t) for t, rs in runs.items() for f, e in rs))
    got = _merged(parts)
    assert all(a.dtype == np.int64 for a in got)
    assert list(zip(got[1].tolist(), got[2].tolist(), got[0].tolist())) == want


@pytest.mark.parametrize("world", [2, 3, 8])
def test_each_rank_gets_a_consecutive_equal_share_of_the_samples(world):
    """shard_samples: rank r's pieces are positions r * n // world to (r + 1) * n // world of the samples
    listed tile after tile in the given order, as a plain list-and-slice gives."""
    rng = np.random.default_rng(world)
    counts = rng.choice([1, 2, 5, 100], size=50)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    order = rng.permutation(50)
    listed = [(int(t), i) for t in order for i in range(offsets[t], offsets[t + 1])]
    n = len(listed)
    for rank in range(world):
        tiles, lo, hi = shard_samples(offsets, order, rank, world)
        assert all(a.dtype == np.int64 for a in (tiles, lo, hi))
        got = [(int(t), i) for t, a, b in zip(tiles, lo, hi) for i in range(a, b)]
        assert got == listed[rank * n // world:(rank + 1) * n // world]
        assert np.all(hi > lo) and len(set(tiles.tolist())) == len(tiles)
