"""PatchLoader(augment=...) end to end against the numpy reference: dihedral variants, their frequency,
independence from batch size and world size, noise statistics, band dropout rate, resume, engines."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

import hsgds
from hsgds import defaults
from hsgds.augment import apply_dihedral_numpy

P = 5


@pytest.fixture(scope="module")
def scene(synthetic_store):
    return synthetic_store(40, 36, 8, classes=4, dtype="int16", seed=3, labelled_fraction=1.0, tile=10,
                           max_patch=7, train=0.6, split_seed=1)[0]


def _run(store, augment, batch_size=64, engine="torch", rank=None, world_size=None, epoch=0, **kw):
    with hsgds.PatchLoader(store, patch_size=P, batch_size=batch_size, augment=augment, return_coords=True,
                           device="cpu", engine=engine, rank=rank, world_size=world_size, **kw) as loader:
        loader.set_epoch(epoch)
        out = [(p.numpy().copy(), lab.numpy(), c.numpy()) for p, lab, c in loader]
    patches, labels, coords = (np.concatenate(v) for v in zip(*out))
    return patches, labels, coords


def _by_coord(patches, coords):
    return {(int(y), int(x)): p for p, (y, x) in zip(patches, coords)}


def _codes(plain, turned, coords_plain, coords_turned):
    """Which dihedral code turns each plain patch into its augmented one (exactly one must)."""
    ref = _by_coord(plain, coords_plain)
    codes = {}
    for p, (y, x) in zip(turned, coords_turned):
        base = ref[(int(y), int(x))].transpose(1, 2, 0)  # NCHW -> (p, p, B)
        hits = [c for c in range(8) if np.array_equal(apply_dihedral_numpy(base, c), p.transpose(1, 2, 0))]
        assert len(hits) >= 1, f"patch at {(y, x)} is not a dihedral transform of the reference"
        codes[(int(y), int(x))] = hits[0]
    return codes


def test_augment_none_is_unchanged(scene):
    """augment=None yields the plain patches: each the numpy cut of the source cube around its centre (reflect
    padding, z-scored with the train pixels' statistics), never a turned or noisy variant; the same every run.
    (It compared two runs of the loader only, which agree whatever the loader does to them.)"""
    a = _run(scene, None)
    cube = np.load(scene.parent / "cube.npy").astype(np.float64)
    ty, tx, _ = hsgds.open_scene(scene).samples("train")
    mean, std = cube[ty, tx].mean(0), cube[ty, tx].std(0)
    r = P // 2
    padded = (np.pad(cube, ((r, r), (r, r), (0, 0)), mode="reflect") - mean) / np.where(std > 0, std, 1)
    want = np.stack([padded[y:y + P, x:x + P].transpose(2, 0, 1) for y, x in a[2]])
    assert len(want) == len(ty)
    np.testing.assert_allclose(a[0], want, rtol=1e-5, atol=1e-5)
    b = _run(scene, None)
    np.testing.assert_array_equal(a[0], b[0])


def test_every_patch_is_one_dihedral_variant_all_8_occur_and_ranks_agree(scene):
    aug = hsgds.Augment(flip=True, rot90=True)
    plain, _, cp = _run(scene, None)
    turned, _, ct = _run(scene, aug)
    codes = _codes(plain, turned, cp, ct)
    counts = np.bincount(list(codes.values()), minlength=8)
    assert (counts > 0).all()
    assert stats.chisquare(counts).pvalue > 1e-4
    # the same choice per sample with another batch size and across 2 ranks
    other, _, co = _run(scene, aug, batch_size=17)
    assert _codes(plain, other, cp, co) == codes
    for rank in (0, 1):
        part, _, cr = _run(scene, aug, rank=rank, world_size=2)
        got = _codes(plain, part, cp, cr)
        assert all(codes[k] == v for k, v in got.items())
    # another epoch draws again
    again, _, ca = _run(scene, aug, epoch=1)
    assert _codes(plain, again, cp, ca) != codes


def test_engines_give_the_same_flips(scene):
    pytest.importorskip("nvidia.dali")
    aug = hsgds.Augment(flip=True, rot90=True)
    a = _run(scene, aug, engine="torch", shuffle=False)
    b = _run(scene, aug, engine="dali", shuffle=False)
    np.testing.assert_array_equal(a[2], b[2])
    np.testing.assert_array_equal(a[0], b[0])


@pytest.fixture(params=["fused", "after-cut"])
def noise_path(request: pytest.FixtureRequest):
    """Radiation noise and band dropout inside the fused CPU cut (numba), or applied after the cut."""
    if request.param == "fused":
        pytest.importorskip("numba")
    with defaults.set(numba=request.param == "fused"):
        yield request.param


def test_radiation_noise_and_band_dropout_statistics(scene, noise_path):
    plain, _, cp = _run(scene, None)
    ref = _by_coord(plain, cp)
    noisy, _, cn = _run(scene, hsgds.Augment(radiation_noise=1.0, noise_std=0.05))
    for p, (y, x) in zip(noisy, cn):
        x0 = ref[(int(y), int(x))].ravel().astype(np.float64)
        y0 = p.ravel().astype(np.float64)
        alpha = x0 @ y0 / (x0 @ x0)
        assert 0.9 - 0.02 <= alpha <= 1.1 + 0.02
        assert np.std(y0 - alpha * x0) == pytest.approx(0.05, rel=0.35)
    dropped, _, cd = _run(scene, hsgds.Augment(band_dropout=0.2))
    zero = [(np.abs(p.reshape(p.shape[0], -1)).max(axis=1) == 0) for p in dropped]
    hits, trials = int(np.sum(zero)), sum(len(z) for z in zero)
    lo, hi = stats.binom.interval(0.9999, trials, 0.2)
    assert lo <= hits <= hi
    for p, (y, x) in zip(dropped, cd):  # kept bands are untouched
        keep = np.abs(p.reshape(p.shape[0], -1)).max(axis=1) > 0
        np.testing.assert_array_equal(p[keep], ref[(int(y), int(x))][keep])


def test_radiation_noise_without_normalize_is_in_the_stored_units(scene, noise_path):
    """With normalize=None the loader yields the stored values and noise_std is in their units (what the
    Augment docstring and the README say): here int16 counts, noise 5 counts, alpha 1; the reference is the
    converted .npy cube (patches whose window lies inside the scene)."""
    cube = np.load(scene.parent / "cube.npy").astype(np.float64)
    h, w, _ = cube.shape
    aug = hsgds.Augment(radiation_noise=1.0, radiation_scale=(1.0, 1.0), noise_std=5.0)
    noisy, _, coords = _run(scene, aug, normalize=None)
    r = P // 2
    residuals = [p.transpose(1, 2, 0).astype(np.float64) - cube[y - r:y + r + 1, x - r:x + r + 1]
                 for p, (y, x) in zip(noisy, coords) if r <= y < h - r and r <= x < w - r]
    assert len(residuals) > 100
    residual = np.concatenate([d.ravel() for d in residuals])
    assert np.std(residual) == pytest.approx(5.0, rel=0.05) and abs(np.mean(residual)) < 0.2


def _reference_batches(scene, aug, dtype, layout, seed=0, **kw):
    """(got, want) per batch, NHWC float64: the loader's augmented batches, and the documented rules applied in
    numpy to its plain float64 patches, with each sample's parameters drawn by its index in the sample set:
    dihedral code (output pixel (i, j) reads source (a, b) = (j, i) if t else (i, j), then a = p-1-a if v,
    b = p-1-b if h), then x <- alpha x + noise_std n (n the bank read pixel-major from the sample's start),
    then the centre spectrum mixed with the partner's, then dropped bands zeroed."""
    from hsgds.augment import BANK_SIZE, draw, noise_bank

    common = dict(patch_size=P, batch_size=48, device="cpu", return_coords=True, seed=seed, **kw)
    with hsgds.PatchLoader(scene, dtype=torch.float64, layout="NHWC", **common) as plain_loader:
        plain = {(int(y), int(x)): p for batch, _, c in plain_loader for p, (y, x) in zip(batch.numpy(), c.numpy())}
    got_want = []
    with hsgds.PatchLoader(scene, augment=aug, dtype=dtype, layout=layout, **common) as loader:
        take = loader.samples.take(np.arange(len(loader.samples)))
        index = {(int(y), int(x)): i for i, (y, x) in enumerate(zip(take[4], take[5]))}
        bank, bands = noise_bank(seed).astype(np.float64), loader.out_bands
        i, j = np.meshgrid(np.arange(P), np.arange(P), indexing="ij")
        for batch, labels, coords in loader:
            got = batch.to(torch.float64).numpy()
            got = got.transpose(0, 2, 3, 1) if layout == "NCHW" else got
            keys = [(int(y), int(x)) for y, x in coords.numpy()]
            d = draw(aug, seed, 0, np.array([index[k] for k in keys]), labels.numpy(), bands, P)
            want = np.stack([plain[k] for k in keys])
            for n, code in enumerate(d.dihedral):
                t, v, h = code >> 2 & 1, code >> 1 & 1, code & 1
                a, b = (j, i) if t else (i, j)
                want[n] = want[n][P - 1 - a if v else a, P - 1 - b if h else b]
            for n, alpha, start in zip(d.radiated, d.alpha, d.bank_start):
                window = bank[(start + np.arange(P * P * bands)) % BANK_SIZE].reshape(P, P, bands)
                want[n] = float(alpha) * want[n] + float(np.float32(aug.noise_std)) * window
            centre = want[:, P // 2, P // 2].copy()
            for m, q, w in zip(d.mixed, d.partner, d.weight):
                assert labels[m] == labels[q] >= 0 and m != q
                want[m, P // 2, P // 2] = float(w) * centre[m] + (1 - float(w)) * centre[q]
            for n, band in d.dropped:
                want[n, :, :, band] = 0
            got_want.append((got, want))
    return got_want


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-6), (torch.float16, 2e-3), (torch.float64, 1e-12)],
                         ids=["float32", "float16", "float64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_patches_follow_the_documented_rules(scene, noise_path, dtype, rtol, layout):
    """Every augmented patch equals the rules of hsgds.augment applied in numpy to the plain patch (within the
    output dtype's rounding), on the fused and after-cut paths, with all four steps at once and with band
    dropout fused (no mixture, no radiation: 16-bit tiles normalized in the ring)."""
    for aug in (hsgds.Augment(flip=True, rot90=True, radiation_noise=0.5, mixture_noise=0.5, band_dropout=0.2),
                hsgds.Augment(flip=True, rot90=True, band_dropout=0.3)):
        batches = _reference_batches(scene, aug, dtype, layout, seed=7)
        assert len(batches) > 10
        for got, want in batches:
            np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
            assert (got[want == 0] == 0).all()  # dropped bands exactly 0


@pytest.mark.parametrize("mixture", [0.3, 0.0], ids=["mixture", "no-mixture"])
def test_resume_mid_epoch_is_bit_identical(scene, noise_path, mixture):
    aug = hsgds.Augment(flip=True, rot90=True, radiation_noise=0.3, mixture_noise=mixture, band_dropout=0.1)
    kw = dict(patch_size=P, batch_size=32, augment=aug, device="cpu", seed=4)
    with hsgds.PatchLoader(scene, **kw) as loader:
        loader.set_epoch(2)
        full = [p.numpy().copy() for p, _ in loader]
    with hsgds.PatchLoader(scene, **kw) as loader:
        loader.set_epoch(2)
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = loader.state_dict()
    with hsgds.PatchLoader(scene, **kw) as loader:
        loader.load_state_dict(state)
        rest = [p.numpy().copy() for p, _ in loader]
    assert len(rest) == len(full) - 3
    for a, b in zip(rest, full[3:]):
        np.testing.assert_array_equal(a, b)
    with hsgds.PatchLoader(scene, patch_size=P, batch_size=32, device="cpu", seed=4) as other:
        with pytest.raises(hsgds.ConfigError, match="augment"):
            other.load_state_dict(state)


def test_a_ranks_resume_at_every_batch_boundary_is_bit_identical(scene):
    """Rank 1 of 3 (its share padded with its first sample), a ring of 4 slots for 16 tiles, every step on:
    a state taken at each batch boundary of epoch 0 and of epoch 1 (reached by iterating epoch 0 whole, not by
    set_epoch), 0 and the last included, resumes the rest of that epoch and then the next one bit for bit
    (the batch after the state is cut ahead when it is taken, where the fused kernel cuts ahead)."""
    aug = hsgds.Augment(flip=True, rot90=True, radiation_noise=0.3, mixture_noise=0.5, band_dropout=0.1)
    tile = hsgds.open_scene(scene).grid.tile_nbytes
    kw = dict(patch_size=P, batch_size=40, augment=aug, device="cpu", seed=8, rank=1, world_size=3,
              ring_bytes=4 * tile, return_coords=True)

    def bits(batches):
        return [(p.numpy().view(np.uint32).copy(), c.numpy().copy()) for p, _, c in batches]

    with hsgds.PatchLoader(scene, **kw) as loader:
        epochs = [bits(loader) for _ in range(3)]
    n = len(epochs[0])
    assert n > 3 and all(len(e) == n for e in epochs)
    for epoch in (0, 1):
        for b in range(n + 1):
            with hsgds.PatchLoader(scene, **kw) as loader:
                for _ in range(epoch):
                    bits(loader)  # a whole epoch: the next starts
                it = iter(loader)
                head = bits(next(it) for _ in range(b))
                state = loader.state_dict()
            assert (state["epoch"], state["batch"]) == (epoch, b)
            with hsgds.PatchLoader(scene, **kw) as loader:
                loader.load_state_dict(state)
                loader.set_epoch(epoch)  # the usual loop's call keeps the restored position
                got = head + bits(loader) + bits(loader)
            want = epochs[epoch] + epochs[epoch + 1]
            assert len(got) == len(want)
            for (p, c), (q, d) in zip(got, want):
                np.testing.assert_array_equal(c, d)
                np.testing.assert_array_equal(p, q)


def test_fused_and_after_cut_paths_agree(scene):
    """The same draws through the fused kernel and through the after-cut path: identical flips and
    dropped bands, radiation noise equal to float32 rounding (the paths may round a product differently)."""
    pytest.importorskip("numba")
    aug = hsgds.Augment(flip=True, rot90=True, radiation_noise=0.5, band_dropout=0.1)
    fused = _run(scene, aug, shuffle=False)
    with defaults.set(numba=False):
        after = _run(scene, aug, shuffle=False)
    np.testing.assert_array_equal(fused[2], after[2])
    np.testing.assert_array_equal(fused[0] == 0, after[0] == 0)
    np.testing.assert_allclose(fused[0], after[0], rtol=1e-6, atol=1e-6)


def test_epoch_2_32_is_not_epoch_0_on_either_noise_path(scene, noise_path):
    """The loader takes epochs past 2**32 (augmentation keys on 62 bits of the epoch): epoch 2**32 yields the
    same unshuffled pixels as epoch 0 but turns them its own way, the fused kernel and the after-cut path
    alike (each patch one dihedral variant of the plain one); its state resumes there."""
    aug = hsgds.Augment(flip=True, rot90=True, radiation_noise=0.5)
    plain, _, cp = _run(scene, None, shuffle=False)
    flips = hsgds.Augment(flip=True, rot90=True)
    turned, _, ct = _run(scene, flips, shuffle=False)
    codes0 = _codes(plain, turned, cp, ct)
    late, _, cl = _run(scene, flips, shuffle=False, epoch=1 << 32)
    codes_late = _codes(plain, late, cp, cl)
    assert codes_late.keys() == codes0.keys() and codes_late != codes0
    first, wrapped = (_run(scene, aug, shuffle=False, epoch=e)[0] for e in (0, 1 << 32))
    assert not np.array_equal(first, wrapped)
    with hsgds.PatchLoader(scene, patch_size=P, batch_size=64, augment=aug, device="cpu") as a, \
            hsgds.PatchLoader(scene, patch_size=P, batch_size=64, augment=aug, device="cpu") as b:
        a.set_epoch((1 << 62) - 1)
        b.load_state_dict(a.state_dict())
        assert b.epoch == (1 << 62) - 1
        with pytest.raises(hsgds.ConfigError, match=r"epoch must be below 2\*\*62"):
            a.set_epoch(1 << 62)


def test_bad_augment_is_a_config_error(scene):
    with pytest.raises(hsgds.ConfigError, match="augment must be an hsgds.Augment"):
        hsgds.PatchLoader(scene, patch_size=P, batch_size=8, device="cpu", augment={"flip": True})
    # the class itself (parentheses forgotten) is named as such, with the call to make (it said "got type")
    with pytest.raises(hsgds.ConfigError, match=r"^augment must be an hsgds.Augment\(\.\.\.\) or None, got the class "
                                                r"itself: create one, e.g. augment=hsgds.Augment\(flip=True\)$"):
        hsgds.PatchLoader(scene, patch_size=P, batch_size=8, device="cpu", augment=hsgds.Augment)


def test_radiation_noise_that_would_overflow_float16_is_refused(scene):
    """Radiation noise is bounded from the statistics (alpha up to radiation_scale's high, noise up to 8
    standard deviations): noise_std 1e6 or alpha 1e30 cannot be float16 (the float32 patches of the same
    settings hold values float16 turns into inf); the same Augment without radiation noise, or a noise that
    fits, is fine."""
    opts = dict(patch_size=P, batch_size=64, device="cpu", dtype=torch.float16)
    for aug, why in ((hsgds.Augment(radiation_noise=0.5, noise_std=1e6), r"plus up to 8 x noise_std 1e\+06\)"),
                     (hsgds.Augment(radiation_noise=0.5, radiation_scale=(1e30, 1e30)), r"alpha up to 1e\+30,")):
        with pytest.raises(hsgds.ConfigError, match=rf"^float16 patches would overflow to inf: output band \d+ of scene "
                                                    rf"'s' holds .*{why}.*, reaching .*or a smaller Augment"):
            hsgds.PatchLoader(scene, augment=aug, **opts)
        with hsgds.PatchLoader(scene, augment=aug, **{**opts, "dtype": torch.float32}) as loader:
            assert any(torch.isinf(p.half()).any() for p, _ in loader)
        with hsgds.PatchLoader(scene, augment=replace(aug, radiation_noise=0.0), **opts) as loader:
            assert all(torch.isfinite(p).all() for p, _ in loader)
    with hsgds.PatchLoader(scene, augment=hsgds.Augment(radiation_noise=1.0, noise_std=1000.0), **opts) as loader:
        assert all(torch.isfinite(p).all() for p, _ in loader)


def test_float64_patches_get_radiation_parameters_within_float32s_range(scene, noise_path):
    """alpha and noise_std are float32 on both noise paths, float64 patches included: noise_std=1e300 gave
    float64 patches of inf (after a RuntimeWarning), radiation_scale (1e-300, 1e-300) an alpha of 0, silently;
    the float32 overflow message even advised dtype=float64. Augment refuses them now; large values within
    float32's range give float64 patches that follow the rule, alpha * x + noise_std * N(0, 1), against the
    plain float64 patches in numpy."""
    for bad in ({"noise_std": 1e300}, {"radiation_scale": (1e300, 1e300)}, {"radiation_scale": (1e-300, 1e-300)}):
        with pytest.raises(hsgds.ConfigError, match=r"^Augment\.(noise_std|radiation_scale) must .*float32"):
            hsgds.Augment(radiation_noise=1.0, **bad)
    kw = dict(dtype=torch.float64, shuffle=False)
    plain, _, cp = _run(scene, None, **kw)
    aug = hsgds.Augment(radiation_noise=1.0, radiation_scale=(1e30, 1e30), noise_std=1e37)
    noisy, _, cn = _run(scene, aug, **kw)
    np.testing.assert_array_equal(cp, cn)
    assert np.isfinite(noisy).all()
    residual = (noisy - float(np.float32(1e30)) * plain) / float(np.float32(1e37))  # the N(0, 1) draws
    assert np.std(residual) == pytest.approx(1.0, rel=0.05) and abs(np.mean(residual)) < 0.05


def test_a_ranks_repeated_sample_is_mixed_with_another_sample(scene):
    """Two ranks over 5 pixels of one class: rank 0's share of 2 is padded with its first sample again, so
    its one batch holds that sample twice. Under mixture_noise=1.0 both copies are mixed with another pixel
    of the class: equal patches, each with its centre spectrum changed and every other pixel the plain one's
    (the two copies were each other's partners: one came out unmixed, the other mixed)."""
    labels = np.load(scene.parent / "gt.npy")
    ys, xs = np.nonzero(labels == 1)
    pick = np.linspace(0, len(ys) - 1, 5).astype(int)
    mask = np.zeros(labels.shape, bool)
    mask[ys[pick], xs[pick]] = True
    kw = dict(pixels="all", split=None, mask=mask, shuffle=False)
    plain, _, cp = _run(scene, None, batch_size=8, **kw)
    ref = _by_coord(plain, cp)
    got, lab, coords = _run(scene, hsgds.Augment(mixture_noise=1.0), batch_size=8, rank=0, world_size=2, **kw)
    keys = [(int(y), int(x)) for y, x in coords]
    assert len(keys) == 3 and len(set(keys)) == 2 and (lab == 0).all()  # one batch: a sample, another, the first again
    first = [k for k, key in enumerate(keys) if key == keys[0]]
    np.testing.assert_array_equal(got[first[0]], got[first[1]])
    r = P // 2
    for patch, key in zip(got, keys):
        changed = np.zeros((P, P), bool)
        changed[r, r] = True
        np.testing.assert_array_equal(patch[:, ~changed], ref[key][:, ~changed])
        assert np.abs(patch[:, r, r] - ref[key][:, r, r]).max() > 1e-3


def test_negative_zero_settings_resume_as_zero(scene):
    """Augment(band_dropout=-0.0) == Augment(): a state saved with one resumes with the other (the state
    holds repr(augment), which said '-0.0': 'loader state was saved with augment=...band_dropout=-0.0'
    refused it)."""
    zero = hsgds.Augment(flip=True, noise_std=-0.0, mixture_noise=-0.0, radiation_noise=-0.0, band_dropout=-0.0)
    plain = hsgds.Augment(flip=True, noise_std=0.0)
    assert zero == plain and repr(zero) == repr(plain)
    kw = dict(patch_size=P, batch_size=32, device="cpu", seed=4)
    with hsgds.PatchLoader(scene, augment=zero, **kw) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        rest = [p.numpy().copy() for p, _ in it]
    with hsgds.PatchLoader(scene, augment=plain, **kw) as loader:
        loader.load_state_dict(state)
        again = [p.numpy().copy() for p, _ in loader]
    assert len(again) == len(rest) > 0
    for a, b in zip(again, rest):
        np.testing.assert_array_equal(a, b)


def _collect(batches):
    out = [(p.numpy().copy(), lab.numpy(), c.numpy()) for p, lab, c in batches]
    return tuple(np.concatenate(v) for v in zip(*out))


def _same_bits(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.view(f"u{g.itemsize}"), w.view(f"u{w.itemsize}"))  # bits, -0.0 too


def test_set_epoch_after_iter_applies_to_the_next_iteration(scene):
    """An iterator yields the epoch in force when iter() was called, as torch's DataLoader reads its
    DistributedSampler's epoch then: set_epoch before the first next(), or midway, leaves its order and its
    augmentation that epoch's, bit for bit, and starts the next iteration at the epoch set. (Before, the
    order was the old epoch's and the augmentation, keyed on the epoch, the new one's.)"""
    aug = hsgds.Augment(flip=True, rot90=True, radiation_noise=0.5)
    want0, want1, want2 = (_run(scene, aug, epoch=e) for e in (0, 1, 2))
    # each epoch its own order and draws (epochs that all agreed would pass the checks below whatever was yielded)
    for a, b in ((want0, want1), (want1, want2), (want0, want2)):
        assert not np.array_equal(a[2], b[2]) and not np.array_equal(np.sort(a[0], 0), np.sort(b[0], 0))
    with hsgds.PatchLoader(scene, patch_size=P, batch_size=64, augment=aug, return_coords=True,
                           device="cpu") as loader:
        it = iter(loader)
        loader.set_epoch(1)
        _same_bits(_collect(it), want0)
        # the epoch set is the next iteration's, from its start; finishing epoch 0 did not advance past it
        assert (loader.epoch, loader.state_dict()["batch"]) == (1, 0)
        it = iter(loader)
        first = [next(it)]
        loader.set_epoch(2)  # midway: this iterator finishes epoch 1
        assert (loader.epoch, loader.state_dict()["batch"]) == (2, 0)
        _same_bits(_collect(first + list(it)), want1)
        assert (loader.epoch, loader.state_dict()["batch"]) == (2, 0)
        _same_bits(_collect(loader), want2)
        assert loader.epoch == 3  # a whole epoch still advances it
