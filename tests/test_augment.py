"""hsgds.augment: the counter-based generator, the per-sample parameters and the post-cut application,
checked against Random123's known-answer vectors and plain numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from hsgds import defaults
from hsgds.augment import (
    BANK_SIZE,
    BANK_STEP,
    Augment,
    Augmenter,
    apply_dihedral_numpy,
    dihedral_offsets,
    draw,
    noise_bank,
    philox4x32,
    philox4x32_numpy,
)
from hsgds.errors import ConfigError


@pytest.mark.parametrize("counter, key, expected", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
def test_philox_known_answers(counter, key, expected, compiled):
    """Random123's kat_vectors for philox4x32-10, from the compiled and the numpy version."""
    if compiled:
        pytest.importorskip("numba")
    with defaults.set(numba=compiled):
        assert tuple(int(v) for v in philox4x32(np.array([counter]), key)[0]) == expected


def test_compiled_philox_gives_the_numpy_words():
    pytest.importorskip("numba")
    rng = np.random.default_rng(0)
    counters = rng.integers(0, 2**32, (3, 517, 4), dtype=np.uint64)
    for key in ((0, 0), (0xFFFFFFFF, 1), (12345, 0xDEADBEEF)):
        with defaults.set(numba=True):
            fast = philox4x32(counters, key)
        assert fast.shape == (3, 517, 4) and fast.dtype == np.uint32
        np.testing.assert_array_equal(fast, philox4x32_numpy(counters, key))


@pytest.mark.parametrize("kwargs, message", [
    ({"flip": 1}, "flip must be True or False"),
    ({"radiation_noise": 1.5}, "radiation_noise is a probability"),
    ({"band_dropout": -0.1}, "band_dropout is a probability"),
    ({"mixture_noise": True}, "mixture_noise is a probability"),
    ({"radiation_scale": (1.1, 0.9)}, "low <= high"),
    ({"noise_std": float("nan")}, "noise_std must be a finite number"),
    ({"radiation_scale": (-5, 1.0)}, "0 < low <= high"),
    ({"radiation_scale": (1.0, float("inf"))}, "0 < low <= high"),
    ({"noise_std": -1.0}, "noise_std must be a finite number >= 0"),
    ({"noise_std": float("inf")}, "noise_std must be a finite number >= 0"),
    ({"flip": "no"}, "flip must be True or False"),
])
def test_bad_settings_are_one_line_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Augment(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"noise_std": 10**400}, "noise_std must be a finite number >= 0"),
    ({"radiation_scale": (0.9, 10**400)}, "0 < low <= high"),
    ({"radiation_scale": (10**400, 10**401)}, "0 < low <= high"),
    ({"radiation_noise": 10**400}, "radiation_noise is a probability"),
])
def test_integers_too_large_for_a_float_are_config_errors(kwargs, message):
    """An int beyond float range is refused like any other out-of-range number (it was numpy's TypeError
    'ufunc isfinite not supported'), in one line of bounded length."""
    with pytest.raises(ConfigError, match=message) as caught:
        Augment(**kwargs)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


@pytest.mark.parametrize("kwargs, message", [
    ({"noise_std": 1e300}, r"noise_std must be at most float32's largest value 3\.403e\+38 .*got 1e\+300"),
    ({"noise_std": 3.5e38}, r"noise_std must be at most float32's largest value"),
    ({"radiation_scale": (0.9, 1e300)}, r"radiation_scale must lie in float32's range, 1\.175e-38 <= low <= high <= 3\.403e\+38"),
    ({"radiation_scale": (1e-300, 1e-300)}, r"radiation_scale must lie in float32's range"),
    ({"radiation_scale": (1e-39, 1.0)}, r"radiation_scale must lie in float32's range"),
], ids=["std-1e300", "std-past-max", "high-1e300", "low-1e-300", "low-subnormal"])
def test_radiation_parameters_beyond_float32_are_config_errors(kwargs, message):
    """alpha and noise_std are applied as float32, to float64 patches too: beyond float32's range they turned
    into inf (float64 patches of inf, silently) or 0 (an alpha of 0: patches wiped). Refused in one line;
    float32's own extremes are taken."""
    with pytest.raises(ConfigError, match=message) as caught:
        Augment(**kwargs)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200
    tiny, big = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
    assert Augment(radiation_scale=(tiny, big), noise_std=big).radiation_scale == (tiny, big)


def test_numpy_scalars_are_accepted_as_plain_values():
    aug = Augment(flip=np.True_, radiation_noise=np.float32(0.5), band_dropout=np.float64(0.25))
    assert aug == Augment(flip=True, radiation_noise=0.5, band_dropout=0.25)
    assert type(aug.flip) is bool and type(aug.radiation_noise) is float
    # and a numpy pair as the scale (it was refused as not "(low, high)")
    assert Augment(radiation_scale=np.array([0.8, 1.2])).radiation_scale == (0.8, 1.2)
    with pytest.raises(ConfigError, match="radiation_scale must be"):
        Augment(radiation_scale=np.array([0.8, 1.2, 1.3]))


def test_dihedral_offsets_match_numpy_flips_and_transposes():
    p = 5
    patch = np.random.default_rng(0).integers(0, 1000, (p, p, 3))
    offsets = dihedral_offsets(p)
    seen = set()
    for code in range(8):
        a, b = offsets[code, ..., 0], offsets[code, ..., 1]
        np.testing.assert_array_equal(patch[a, b], apply_dihedral_numpy(patch, code))
        seen.add(patch[a, b].tobytes())
    assert len(seen) == 8  # 8 distinct transforms
    rotations = {np.rot90(patch, k).tobytes() for k in range(4)}
    assert {apply_dihedral_numpy(patch, c).tobytes() for c in (0, 3, 5, 6)} == rotations


def _codes(aug, n=40_000, epoch=0):
    return draw(aug, seed=7, epoch=epoch, index=np.arange(n), label=None, bands=4, patch_size=3).dihedral


def test_code_sets_and_uniformity():
    assert set(np.unique(_codes(Augment(flip=True)))) == {0, 1, 2, 3}
    assert set(np.unique(_codes(Augment(rot90=True)))) == {0, 3, 5, 6}
    codes = _codes(Augment(flip=True, rot90=True))
    counts = np.bincount(codes, minlength=8)
    assert (counts > 0).all()
    assert stats.chisquare(counts).pvalue > 1e-4
    assert _codes(Augment()) is None


def test_parameters_depend_on_the_sample_not_the_batch():
    aug = Augment(flip=True, rot90=True, radiation_noise=0.3, band_dropout=0.2)
    index = np.array([11, 5, 900, 42, 7])
    whole = draw(aug, 3, 2, index, None, bands=6, patch_size=3)
    for pos, i in enumerate(index):
        alone = draw(aug, 3, 2, np.array([i]), None, bands=6, patch_size=3)
        assert alone.dihedral[0] == whole.dihedral[pos]
        assert (pos in whole.radiated) == (len(alone.radiated) == 1)
        if len(alone.radiated):
            k = int(np.flatnonzero(whole.radiated == pos)[0])
            assert alone.alpha[0] == whole.alpha[k] and alone.bank_start[0] == whole.bank_start[k]
        np.testing.assert_array_equal(alone.dropped[:, 1], whole.dropped[whole.dropped[:, 0] == pos, 1])
    other_epoch = draw(aug, 3, 3, index, None, bands=6, patch_size=3)
    other_seed = draw(aug, 4, 2, index, None, bands=6, patch_size=3)
    # another epoch and another seed each draw again (either alone passed with the other ignored)
    assert not np.array_equal(whole.dihedral, other_epoch.dihedral)
    assert not np.array_equal(whole.dihedral, other_seed.dihedral)


def test_a_sample_twice_in_a_batch_is_never_its_own_mixture_partner():
    """A rank pads its share by repeating its first sample; when the share fits in one batch, both copies are in
    it. Their per-sample keys are equal, so each copy was the other's partner: the sample mixed with itself
    (left as it was), against the rule's 'another sample of the same class'. The rule as documented: both
    copies take the partner the sample has in the batch without its second copy (weights per sample)."""
    aug = Augment(mixture_noise=1.0)
    rng = np.random.default_rng(4)
    for _ in range(200):
        index = rng.choice(10_000, int(rng.integers(2, 30)), replace=False)
        label = rng.integers(0, 3, len(index))
        twice = int(rng.integers(len(index)))
        at = int(rng.integers(len(index) + 1))
        index2, label2 = np.insert(index, at, index[twice]), np.insert(label, at, label[twice])
        once, both = draw(aug, 5, 1, index, label, bands=4, patch_size=3), draw(aug, 5, 1, index2, label2, bands=4, patch_size=3)
        want = {int(index[m]): (int(index[q]), float(w)) for m, q, w in zip(once.mixed, once.partner, once.weight)}
        got = [(int(index2[m]), int(index2[q]), float(w)) for m, q, w in zip(both.mixed, both.partner, both.weight)]
        assert all(i != j for i, j, _ in got)
        assert sorted(got) == sorted((i, *want[i]) for i in index2.tolist() if i in want)


def test_mixture_partners_follow_the_documented_rule_in_plain_python():
    """The partner rule restated sample by sample, from the Philox words of the documented counter (index low,
    index high, epoch low, purpose 1 + 4 * epoch high): a labelled sample whose first uniform is below the
    probability is mixed with the next distinct sample of its class in the batch ordered by word 3 (cyclic),
    unless it is alone of its class; weight a1 / (a1 + a2), a = 0.01 + 0.99 * u from words 1 and 2. Batches
    of random composition (indices past 2**32, a repeated sample, unlabelled ones, epochs past 2**32) as the
    batch size, world size and ring size make them. (The loader's tests take the partners from draw itself.)"""
    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(1, 40))
        index = rng.choice(1 << 40 if trial % 2 else 500, n, replace=False).astype(np.int64)
        if trial % 3 == 0:
            index[-1] = index[0]  # a padded share's first sample again
        label = rng.integers(-1, 4, n)
        label[index == index[0]] = label[0]
        seed, epoch = int(rng.integers(0, 1 << 63)), int(rng.integers(0, 1 << 40))
        aug = Augment(mixture_noise=float(rng.choice([0.3, 1.0])))
        counter = np.stack([index & 0xFFFFFFFF, index >> 32, np.full(n, epoch & 0xFFFFFFFF),
                            np.full(n, 1 + 4 * (epoch >> 32))], 1).astype(np.uint64)
        words = philox4x32_numpy(counter, (seed & 0xFFFFFFFF, seed >> 32))
        u = (words >> 8) / float(1 << 24)
        want = {}
        for pos in range(n):
            key = {int(index[q]): int(words[q, 3]) for q in range(n) if label[q] == label[pos]}
            ring = sorted(key, key=key.get)
            if label[pos] < 0 or not u[pos, 0] < aug.mixture_noise or len(ring) < 2:
                continue
            a1, a2 = 0.01 + 0.99 * u[pos, 1], 0.01 + 0.99 * u[pos, 2]
            want[pos] = (ring[(ring.index(int(index[pos])) + 1) % len(ring)], np.float32(a1 / (a1 + a2)))
        got = draw(aug, seed, epoch, index, label, bands=3, patch_size=3)
        assert {int(m): (int(index[q]), w) for m, q, w in zip(got.mixed, got.partner, got.weight)} == want


def _batch_digest(batch):
    import hashlib

    h = hashlib.sha256()
    for field in ("dihedral", "radiated", "alpha", "bank_start", "mixed", "partner", "weight", "dropped"):
        h.update(np.ascontiguousarray(getattr(batch, field)).tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
def test_epochs_past_2_32_draw_their_own_parameters_and_earlier_ones_are_unchanged(compiled):
    """Epochs 0..3 draw exactly what they drew when the counter held 32 bits of the epoch (digests pinned
    from that code); epoch e + 2**32 no longer repeats epoch e, and its scalar draws are Philox of the
    documented counter (index low, index high, epoch low, purpose + 4 * epoch high) in plain numpy."""
    if compiled:
        pytest.importorskip("numba")
    aug = Augment(flip=True, rot90=True, radiation_noise=0.5, mixture_noise=0.5, band_dropout=0.3)
    index = np.r_[np.arange(0, 200, 3), (1 << 33) + np.arange(5)]
    label = np.arange(len(index)) % 3
    pinned = ["7452a59b67eb3ff5", "083f477f43ae4b91", "bd11f37c8554fcb2", "bad02340ca49f8d7"]
    with defaults.set(numba=compiled):
        digests = [_batch_digest(draw(aug, 11, e, index, label, bands=13, patch_size=5))
                   for e in (0, 1, 2, 3, 1 << 32, (1 << 32) + 1, (1 << 62) - 1)]
        assert digests[:4] == pinned
        assert len(set(digests)) == len(digests)  # 2**32 is not 0, 2**32 + 1 not 1
        late = draw(Augment(flip=True, rot90=True), 11, (5 << 32) + 3, index, None, bands=13, patch_size=5)
        with pytest.raises(ConfigError, match=r"epoch must be in 0\.\.2\*\*62-1"):
            draw(aug, 11, 1 << 62, index, label, bands=13, patch_size=5)
    counter = np.stack([index & 0xFFFFFFFF, index >> 32, np.full_like(index, 3), np.full_like(index, 0 + 4 * 5)], 1)
    np.testing.assert_array_equal(late.dihedral, (philox4x32_numpy(counter.astype(np.uint64), (11, 0))[:, 0] & 7))


def test_rates_within_binomial_intervals():
    n, bands = 20_000, 10
    aug = Augment(radiation_noise=0.1, band_dropout=0.05, mixture_noise=0.2)
    labels = np.arange(n) % 5
    b = draw(aug, 1, 0, np.arange(n), labels, bands=bands, patch_size=1)
    for hits, trials, prob in ((len(b.radiated), n, 0.1), (len(b.dropped), n * bands, 0.05),
                               (len(b.mixed), n, 0.2)):
        lo, hi = stats.binom.interval(0.9999, trials, prob)
        assert lo <= hits <= hi
    assert ((b.alpha >= 0.9) & (b.alpha <= 1.1)).all()
    assert (labels[b.mixed] == labels[b.partner]).all() and (b.mixed != b.partner).all()
    assert ((b.weight > 0) & (b.weight < 1)).all()


def test_noise_bank_is_standard_normal_and_seeded():
    bank = noise_bank(5)
    assert bank.dtype == np.float32 and np.isfinite(bank).all()
    assert abs(bank.mean()) < 0.01 and abs(bank.std() - 1) < 0.01
    assert stats.kstest(bank[:50_000], "norm").pvalue > 1e-4
    np.testing.assert_array_equal(bank, noise_bank(5))
    assert not np.array_equal(bank[:100], noise_bank(6)[:100])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_radiation_noise_recovers_alpha_and_std(layout):
    n, bands, p = 400, 8, 5
    rng = np.random.default_rng(2)
    clean = rng.normal(size=(n, bands, p, p)).astype(np.float32)
    aug = Augment(radiation_noise=1.0, noise_std=0.05)
    batch = draw(aug, 9, 0, np.arange(n), None, bands=bands, patch_size=p)
    out = torch.from_numpy(clean.copy() if layout == "NCHW" else clean.transpose(0, 2, 3, 1).copy())
    Augmenter(aug, 9, layout)(out, batch)
    got = out.numpy() if layout == "NCHW" else out.numpy().transpose(0, 3, 1, 2)
    for k in range(n):
        x, yv = clean[k].ravel(), got[k].ravel()
        alpha = float(x @ yv / (x @ x))  # least squares
        assert alpha == pytest.approx(batch.alpha[k], abs=0.02)
        assert np.std(yv - alpha * x) == pytest.approx(0.05, rel=0.2)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_radiation_noise_reads_its_window_pixel_major(layout):
    # the documented rule, against numpy: value (i, j, b) <- alpha * value + std * window[(i*p + j)*B + b]
    n, bands, p = 5, 3, 3
    clean = np.random.default_rng(4).normal(size=(n, p, p, bands)).astype(np.float32)  # NHWC
    aug = Augment(radiation_noise=1.0, noise_std=0.05)
    batch = draw(aug, 3, 0, np.arange(n), None, bands=bands, patch_size=p)
    out = torch.from_numpy(clean.copy() if layout == "NHWC" else clean.transpose(0, 3, 1, 2).copy())
    Augmenter(aug, 3, layout)(out, batch)
    got = out.numpy() if layout == "NHWC" else out.numpy().transpose(0, 2, 3, 1)
    bank = noise_bank(3)
    for k in range(n):
        window = bank[batch.bank_start[k]:batch.bank_start[k] + p * p * bands].reshape(p, p, bands)
        expect = clean[k] * batch.alpha[k] + np.float32(0.05) * window
        np.testing.assert_allclose(got[k], expect, rtol=1e-6, atol=1e-7)


def test_both_layouts_add_the_same_numbers():
    n, bands, p = 6, 3, 3
    clean = np.random.default_rng(1).normal(size=(n, bands, p, p)).astype(np.float32)
    aug = Augment(radiation_noise=0.5, mixture_noise=0.5, band_dropout=0.3)
    batch = draw(aug, 2, 1, np.arange(n), np.array([0, 0, 1, 1, 1, 2]), bands=bands, patch_size=p)
    a = torch.from_numpy(clean.copy())
    b = torch.from_numpy(clean.transpose(0, 2, 3, 1).copy())
    Augmenter(aug, 2, "NCHW")(a, batch)
    Augmenter(aug, 2, "NHWC")(b, batch)
    np.testing.assert_array_equal(a.numpy(), b.numpy().transpose(0, 3, 1, 2))


def test_mixture_and_dropout_follow_the_documented_rule():
    n, bands, p = 8, 4, 3
    clean = np.random.default_rng(3).normal(size=(n, bands, p, p)).astype(np.float32)
    labels = np.array([0, 1, 0, 1, 0, 2, 1, 0])
    aug = Augment(mixture_noise=1.0, band_dropout=0.25)
    batch = draw(aug, 4, 0, np.arange(100, 100 + n), labels, bands=bands, patch_size=p)
    out = torch.from_numpy(clean.copy())
    Augmenter(aug, 4, "NCHW")(out, batch)
    expect = clean.copy()
    for m, q, w in zip(batch.mixed, batch.partner, batch.weight):
        expect[m, :, 1, 1] = w * clean[m, :, 1, 1] + (1 - w) * clean[q, :, 1, 1]
    for pos, band in batch.dropped:
        expect[pos, band] = 0
    assert 5 not in batch.mixed  # alone of its class in the batch
    assert len(batch.mixed) == n - 1
    np.testing.assert_allclose(out.numpy(), expect, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_float64_patches_keep_float64_precision_through_noise_and_mixture(layout):
    """Radiation noise and mixture applied after the cut (DALI, CUDA, the CPU without numba) compute in
    the output's precision: float64 patches are not rounded to float32 on the way (they were: every
    radiated patch, and each mixed centre, held only float32 values)."""
    n, bands, p = 6, 3, 3
    clean = np.random.default_rng(5).normal(size=(n, bands, p, p))  # float64, not float32-representable
    labels = np.array([0, 0, 1, 1, 2, 2])
    aug = Augment(radiation_noise=1.0, mixture_noise=1.0)
    batch = draw(aug, 6, 0, np.arange(n), labels, bands=bands, patch_size=p)
    assert len(batch.radiated) == n and len(batch.mixed) > 0
    out = torch.from_numpy(clean.copy() if layout == "NCHW" else clean.transpose(0, 2, 3, 1).copy())
    Augmenter(aug, 6, layout)(out, batch)
    assert out.dtype == torch.float64
    got = out.numpy() if layout == "NCHW" else out.numpy().transpose(0, 3, 1, 2)
    bank = noise_bank(6).astype(np.float64)
    std = float(np.float32(aug.noise_std))
    expect = clean.copy()
    for k in range(n):
        window = bank[batch.bank_start[k]:batch.bank_start[k] + p * p * bands].reshape(p, p, bands)
        expect[k] = clean[k] * float(batch.alpha[k]) + std * window.transpose(2, 0, 1)
    radiated = expect.copy()
    for m, q, w in zip(batch.mixed, batch.partner, batch.weight):
        w = float(w)
        expect[m, :, 1, 1] = w * radiated[m, :, 1, 1] + (1 - w) * radiated[q, :, 1, 1]
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-12)


def test_patches_larger_than_the_bank_get_their_own_noise():
    """A patch of more than 2^20 values (224 bands x 69 x 69) reads the bank cyclically from its own start:
    the samples' noises differ (every one read the same window from 0 before: identical noise for every
    patch of every epoch), and the after-cut path adds each its window."""
    bands, p = 224, 69
    assert bands * p * p > BANK_SIZE
    aug = Augment(radiation_noise=1.0, noise_std=1.0, radiation_scale=(1.0, 1.0))
    batch = draw(aug, 8, 0, np.arange(200), None, bands=bands, patch_size=p)
    assert len(np.unique(batch.bank_start)) > 150
    assert (batch.bank_start % BANK_STEP == 0).all() and (batch.bank_start < BANK_SIZE).all()
    small = draw(aug, 8, 0, np.arange(3), None, bands=bands, patch_size=p)
    out = torch.zeros((3, p, p, bands))
    Augmenter(aug, 8, "NHWC")(out, small)
    bank = noise_bank(8)
    window = bands * p * p
    for k in range(3):
        expect = np.resize(np.roll(bank, -int(small.bank_start[k])), window).reshape(p, p, bands)
        np.testing.assert_array_equal(out[k].numpy(), expect)


def test_one_call_brings_a_batchs_arrays_to_the_device_and_changes_nothing():
    """The arrays of a batch's noise, mixture and dropout reach the device in one call of ``to_device`` (on CUDA
    the loader's pinned staging: one asynchronous copy, packed into one buffer), and the batch is the same as
    with one ``.to(device)`` per array. Here the packing runs on the CPU: the same bytes a pinned buffer holds."""
    from hsgds.batches import pack, packing, unpacked

    n, bands, p = 12, 5, 3
    clean = np.random.default_rng(4).normal(size=(n, bands, p, p)).astype(np.float32)
    aug = Augment(radiation_noise=0.5, mixture_noise=0.5, band_dropout=0.3)
    batch = draw(aug, 5, 0, np.arange(n), np.arange(n) % 3, bands=bands, patch_size=p)
    assert len(batch.radiated) and len(batch.mixed) and len(batch.dropped)
    calls = []

    def packed(arrays):
        calls.append([a.dtype for a in arrays])
        offsets, nbytes = packing(arrays)
        flat = np.zeros(nbytes, np.uint8)
        pack(flat, arrays, offsets)
        return unpacked(torch.from_numpy(flat), arrays, offsets)

    want, got = torch.from_numpy(clean.copy()), torch.from_numpy(clean.copy())
    Augmenter(aug, 5, "NCHW")(want, batch)
    Augmenter(aug, 5, "NCHW", to_device=packed)(got, batch)
    assert len(calls) == 1 and len(calls[0]) == 7  # rad, rows, alpha, mixed, partner, weight, dropped
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert not np.array_equal(got.numpy(), clean)
