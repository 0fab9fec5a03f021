"""A model trained on a band selection or on shared statistics (``norm_scope="collection"``) is fed the same
input elsewhere: ``PatchLoader.norm_stats`` / ``norm_stats=``, ``hsgds.predict(..., wavelengths=, norm_stats=)``,
and a checkpoint that carries both to ``hsgds predict``. Against numpy cuts of the source cubes and numpy
statistics of their train pixels."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from torch import nn

import hsgds
from hsgds.errors import ConfigError, InputError
from hsgds.preprocess.convert import ConvertOptions, convert
from hsgds.scene import BandStats
from tests.envi import write_envi

HALO = 7  # max_patch 15
P = 3
WANT = [500.0, 700.0, 900.0]  # nm: bands 1, 3, 5 of A and B (400..900 nm), 2, 4, 6 of C (300..1000 nm)
PICKED = {"A": [1, 3, 5], "B": [1, 3, 5], "C": [2, 4, 6]}
#: torch's seed for the SpectralSpatialCNNs saved here: most seeds make a freshly initialised one map every pixel
#: of these scenes to one class whatever its input, and maps compared with it could not tell one input from
#: another (a checkpoint's statistics ignored passed); with this one the maps change with the statistics and the
#: bands (checked where it matters)
MODEL_SEED = 13


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """A and B (6 bands, 400..900 nm; B brighter, so pooled statistics differ from either scene's) to train
    on, and C (8 bands, 300..1000 nm) to predict. Every pixel labelled, 30% train."""
    from hsgds.synthetic import make_scene

    d = tmp_path_factory.mktemp("trained")
    out = {}
    for i, (name, (h, w, b, wl0)) in enumerate({"A": (30, 25, 6, 400), "B": (25, 30, 6, 400),
                                                "C": (20, 22, 8, 300)}.items()):
        cube, labels = make_scene(h, w, b, classes=4, dtype="int16", seed=31 + i, labelled_fraction=1.0)
        if name == "B":
            cube = (cube // 2 + 3000).astype(np.int16)
        np.save(d / f"{name}_gt.npy", labels)
        hdr = write_envi(d / f"{name}_cube", cube, [wl0 + 100 * k for k in range(b)])
        out[name] = (cube, convert(hdr, d / f"{name}.zarr", ConvertOptions(labels=d / f"{name}_gt.npy", tile=18,
                                                                             max_patch=15, train=0.3, val=0.2)))
    return out


def _pooled(scenes, names):
    """numpy statistics of the train pixels of ``names`` together, at the WANT bands."""
    px = []
    for n in names:
        cube, store = scenes[n]
        y, x, _ = hsgds.open_scene(store).samples("train")
        px.append(cube[y, x][:, PICKED[n]].astype(np.float64))
    px = np.concatenate(px)
    return px.mean(0), px.std(0), px.min(0), px.max(0)


def _every_patch(cube, bands, mean, std):
    """(H*W, B, p, p) numpy patches of every pixel (reflect padding), raster order, normalized."""
    h, w, _ = cube.shape
    padded = np.pad(cube[:, :, bands].astype(np.float64), ((HALO, HALO), (HALO, HALO), (0, 0)), mode="reflect")
    padded = (padded - mean) / std
    r = P // 2
    return np.stack([padded[y + HALO - r:y + HALO + r + 1, x + HALO - r:x + HALO + r + 1].transpose(2, 0, 1)
                     for y in range(h) for x in range(w)])


def _pooled_loader_stats(scenes):
    with hsgds.PatchLoader([scenes["A"][1], scenes["B"][1]], patch_size=P, batch_size=64, wavelengths=WANT,
                           norm_scope="collection", device="cpu") as loader:
        return loader.norm_stats


def test_loader_norm_stats_are_the_statistics_it_normalizes_with(scenes):
    stats = _pooled_loader_stats(scenes)
    for got, want in zip((stats.mean, stats.std, stats.min, stats.max), _pooled(scenes, "AB")):
        np.testing.assert_allclose(got, want, rtol=1e-10)
    with hsgds.PatchLoader([scenes["A"][1], scenes["B"][1]], patch_size=P, batch_size=64, device="cpu") as loader:
        assert loader.norm_stats is None  # each scene its own
    with hsgds.PatchLoader(scenes["A"][1], patch_size=P, batch_size=64, device="cpu") as loader:
        own = hsgds.open_scene(scenes["A"][1]).norm_stats
        assert all(np.array_equal(getattr(loader.norm_stats, f), getattr(own, f)) for f in ("mean", "std", "min", "max"))
    with hsgds.PatchLoader(scenes["A"][1], patch_size=P, batch_size=64, normalize=None, device="cpu") as loader:
        assert loader.norm_stats is None

    # another scene normalized with them: C's bands at the same wavelengths, minus the pooled mean, over the std
    cube = scenes["C"][0]
    with hsgds.PatchLoader(scenes["C"][1], patch_size=P, batch_size=97, split=None, pixels="all", shuffle=False,
                           wavelengths=WANT, norm_stats=stats, return_coords=True, device="cpu") as loader:
        batches = [(x.numpy(), yx.numpy()) for x, _, yx in loader]
    got, yx = np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])
    ref = _every_patch(cube, PICKED["C"], stats.mean, stats.std)[yx[:, 0] * cube.shape[1] + yx[:, 1]]
    assert len(got) == cube.shape[0] * cube.shape[1]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_norm_stats_that_do_not_fit_are_refused_in_one_line(scenes):
    stats = _pooled_loader_stats(scenes)
    store = scenes["C"][1]
    cases = [
        (dict(norm_stats=stats), r"norm_stats.mean has shape \(3,\), but the patches have 8 bands"),
        (dict(wavelengths=WANT, norm_stats=(stats.mean, stats.std)), "norm_stats must be an hsgds.BandStats"),
        (dict(wavelengths=WANT, norm_stats=stats, norm_scope="collection"), "not both"),
        (dict(wavelengths=WANT, norm_stats=stats, normalize=None), "applies with normalize='zscore' or 'minmax'"),
        (dict(wavelengths=WANT, norm_stats=BandStats(stats.mean, -stats.std, stats.min, stats.max)), "negative std"),
        (dict(wavelengths=WANT, norm_stats=BandStats(stats.mean * np.nan, stats.std, stats.min, stats.max)), "NaN"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            hsgds.PatchLoader(store, patch_size=P, batch_size=8, device="cpu", **kwargs)
        assert "\n" not in str(info.value)


class RandomConv(nn.Module):
    """A fixed random classifier of 3-band p x p patches."""

    def __init__(self, k=5, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(len(WANT), k, P)

    def forward(self, x):
        return self.conv(x).flatten(1)


def test_predict_feeds_the_model_its_training_bands_and_statistics(scenes):
    stats = _pooled_loader_stats(scenes)
    cube, store = scenes["C"]
    model = RandomConv()
    got = hsgds.predict(store, model, patch_size=P, batch_size=50, device="cpu", wavelengths=WANT, norm_stats=stats)
    with torch.no_grad():
        logits = model(torch.from_numpy(_every_patch(cube, PICKED["C"], stats.mean, stats.std)).float()).numpy()
    clear = np.diff(np.sort(logits, 1)[:, -2:], axis=1)[:, 0] > 1e-4  # near-ties may flip with float32 rounding
    assert clear.mean() > 0.95
    np.testing.assert_array_equal(got.reshape(-1)[clear], logits.argmax(1)[clear] + 1)
    # with C's own statistics the model sees other inputs: the map is not the same
    own = hsgds.predict(store, model, patch_size=P, batch_size=50, device="cpu", wavelengths=WANT)
    assert (own != got).mean() > 0.05


def _trained_checkpoint(path, stats, **recipe):
    from hsgds.models import SpectralSpatialCNN, save_checkpoint

    torch.manual_seed(MODEL_SEED)
    model = SpectralSpatialCNN(len(WANT), 4, P, reduce=4, width=8)
    return save_checkpoint(path, model, patch_size=P, norm_stats=stats, **recipe), model


def test_a_checkpoint_carries_bands_and_statistics_to_hsgds_predict(scenes, tmp_path, run_cli):
    from hsgds.collection import SceneEntry, write_collection
    from hsgds.models import load_model

    stats = _pooled_loader_stats(scenes)
    ckpt, model = _trained_checkpoint(tmp_path / "model.ckpt", stats, wavelengths=WANT)
    loaded = load_model(ckpt)
    assert loaded.wavelengths == WANT and loaded.band_indices is None and loaded.wavelength_tolerance == 5.0
    assert all(np.array_equal(getattr(loaded.norm_stats, f), getattr(stats, f)) for f in ("mean", "std", "min", "max"))

    coll = tmp_path / "coll"
    coll.mkdir()
    for name in "ABC":
        shutil.copytree(scenes[name][1], coll / f"{name}.zarr")
    write_collection(coll, [SceneEntry.of_scene(n, hsgds.open_scene(coll / f"{n}.zarr")) for n in "ABC"])
    maps = tmp_path / "maps"
    maps.mkdir()
    code, _, err = run_cli("predict", coll, "--model", ckpt, "-o", maps / "{name}.npy")
    assert code == 0, err
    for name in "ABC":
        want = hsgds.predict(scenes[name][1], model, patch_size=P, device="cpu", wavelengths=WANT, norm_stats=stats)
        assert np.array_equal(np.load(maps / f"{name}.npy", allow_pickle=False), want), name
        # the model's map depends on the statistics: each scene's own give another one
        own = hsgds.predict(scenes[name][1], model, patch_size=P, device="cpu", wavelengths=WANT)
        assert (own != want).any(), name
    code, out, err = run_cli("predict", scenes["C"][1], "--model", ckpt, "-o", tmp_path / "c.npy")
    assert code == 0, err
    assert np.array_equal(np.load(tmp_path / "c.npy"), np.load(maps / "C.npy"))
    assert "input:      3 bands, each scene's nearest good band within 5 nm of 500, 700, 900 nm" in out
    assert "normalize:  zscore, with the statistics saved with the model" in out

    # a selection one scene cannot give: refused before any work, naming the scene
    far, _ = _trained_checkpoint(tmp_path / "far.ckpt", stats, wavelengths=[500.0, 700.0, 1000.0])
    shutil.rmtree(maps)
    maps.mkdir()
    code, _, err = run_cli("predict", coll, "--model", far, "-o", maps / "{name}.npy")
    assert code == 2 and "scene 'A' has no band within 5 nm of 1000 nm" in err, err
    assert len(err.strip().splitlines()) == 1 and not any(maps.iterdir())
    indices, _ = _trained_checkpoint(tmp_path / "idx.ckpt", None, bands=[1, 3, 7])
    code, _, err = run_cli("predict", coll, "--model", indices, "-o", maps / "{name}.npy")
    assert code == 2 and "bands must be in 0..5 (scene 'A' has 6 bands)" in err, err


def test_checkpoint_recipes_are_checked_when_saved_and_loaded(scenes, tmp_path):
    from hsgds.models import load_model

    stats = _pooled_loader_stats(scenes)
    with pytest.raises(ConfigError, match="takes 3 bands but 4 wavelengths were given"):
        _trained_checkpoint(tmp_path / "x.ckpt", None, wavelengths=WANT + [1000.0])
    with pytest.raises(ConfigError, match="not both"):
        _trained_checkpoint(tmp_path / "x.ckpt", None, wavelengths=WANT, bands=[0, 1, 2])
    with pytest.raises(ConfigError, match="bands must be band indices"):
        _trained_checkpoint(tmp_path / "x.ckpt", None, bands=[0, "1", 2])
    with pytest.raises(ConfigError, match="wavelengths must be numbers"):
        _trained_checkpoint(tmp_path / "x.ckpt", None, wavelengths=[500.0, float("nan"), 900.0])
    own = hsgds.open_scene(scenes["A"][1]).norm_stats  # 6 bands, the model takes 3
    with pytest.raises(ConfigError, match=r"norm_stats.mean has shape \(6,\)"):
        _trained_checkpoint(tmp_path / "x.ckpt", own)
    assert not (tmp_path / "x.ckpt").exists()

    ckpt, _ = _trained_checkpoint(tmp_path / "m.ckpt", stats, bands=[0, 2, 4])
    state = torch.load(ckpt, weights_only=True)
    assert state["version"] == 2 and state["band_indices"] == [0, 2, 4]
    # a version-1 checkpoint (before the recipe) still loads: every scene's own statistics, all its bands
    old = {k: v for k, v in state.items() if k not in ("band_indices", "wavelengths", "wavelength_tolerance",
                                                       "norm_stats")}
    torch.save({**old, "version": 1}, tmp_path / "v1.ckpt")
    v1 = load_model(tmp_path / "v1.ckpt")
    assert v1.band_indices is None and v1.wavelengths is None and v1.norm_stats is None and v1.bands == 3
    forged = [
        ({"band_indices": [0, 2]}, "band_indices are not a list of 3 numbers"),
        ({"wavelengths": WANT}, "both band indices and wavelengths"),
        ({"wavelength_tolerance": -1.0}, "wavelength tolerance -1.0"),
        ({"norm_stats": {"mean": [0.0] * 3}}, "statistics are not mean, std, min, max lists"),
        ({"norm_stats": {**state["norm_stats"], "std": [float("nan")] * 3}}, "statistics do not fit"),
        ({"norm_stats": {**state["norm_stats"], "min": [0.0] * 5}}, "statistics do not fit"),
        ({"normalize": None}, "normalization statistics but normalize None"),
        ({"version": 2, "norm_stats": None, "wavelengths": None, "band_indices": None,
          "wavelength_tolerance": None}, "wavelength tolerance None"),
    ]
    for change, message in forged:
        torch.save({**state, **change}, tmp_path / "forged.ckpt")
        with pytest.raises(InputError, match=message):
            load_model(tmp_path / "forged.ckpt")
    del state["norm_stats"]
    torch.save(state, tmp_path / "forged.ckpt")
    with pytest.raises(InputError, match="lacks norm_stats"):
        load_model(tmp_path / "forged.ckpt")


def _same_stats(a, b):
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("mean", "std", "min", "max"))


def test_a_model_saved_with_its_loader_is_fed_what_the_loader_fed_it(scenes, tmp_path, run_cli):
    """``save_checkpoint(..., loader=)`` / ``save_program(..., loader=)``: patch size, normalization, band
    selection and the loader's statistics, so neither another scene nor a resplit changes the model's input."""
    from hsgds.models import SpectralSpatialCNN, load_model, save_checkpoint, save_program

    with hsgds.PatchLoader([scenes["A"][1], scenes["B"][1]], patch_size=P, batch_size=64, wavelengths=WANT,
                           norm_scope="collection", normalize="minmax", device="cpu") as pooled:
        stats = pooled.norm_stats
    torch.manual_seed(MODEL_SEED)
    model = SpectralSpatialCNN(len(WANT), 4, P, reduce=4, width=8)
    ckpt = save_checkpoint(tmp_path / "m.ckpt", model, loader=pooled)
    loaded = load_model(ckpt)
    assert (loaded.patch_size, loaded.normalize, loaded.wavelengths, loaded.band_indices) == (P, "minmax", WANT, None)
    assert _same_stats(loaded.norm_stats, stats) and loaded.wavelength_tolerance == 5.0
    code, _, err = run_cli("predict", scenes["C"][1], "--model", ckpt, "-o", tmp_path / "c.npy")
    assert code == 0, err
    want = hsgds.predict(scenes["C"][1], model, patch_size=P, device="cpu", normalize="minmax", wavelengths=WANT,
                         norm_stats=stats)
    assert np.array_equal(np.load(tmp_path / "c.npy"), want)
    # (C's own minmax statistics feed the model otherwise: the map tells them apart)
    assert (hsgds.predict(scenes["C"][1], model, patch_size=P, device="cpu", normalize="minmax",
                          wavelengths=WANT) != want).any()
    program = save_program(tmp_path / "m.pt2", _program(RandomConv()), loader=pooled)
    assert load_model(program).wavelengths == WANT and _same_stats(load_model(program).norm_stats, stats)

    # one scene, all its bands: its train statistics of the time, kept through a resplit of the store
    store = tmp_path / "A.zarr"
    shutil.copytree(scenes["A"][1], store)
    with hsgds.PatchLoader(store, patch_size=P, batch_size=64, bands=[0, 2, 4], device="cpu") as own:
        before = own.norm_stats
    ckpt = save_checkpoint(tmp_path / "a.ckpt", model, loader=own)
    code, out, err = run_cli("resplit", store, "--split", "blocks", "--train", "0.3", "--seed", "5")
    assert code == 0, err
    after = hsgds.open_scene(store).norm_stats
    assert not np.array_equal(after.mean[[0, 2, 4]], before.mean)
    loaded = load_model(ckpt)
    assert loaded.band_indices == [0, 2, 4] and _same_stats(loaded.norm_stats, before)
    assert loaded.class_names == hsgds.open_scene(store).class_names
    code, out, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "a.npy")
    assert code == 0 and "with the statistics saved with the model" in out, err
    want = hsgds.predict(store, model, patch_size=P, device="cpu", bands=[0, 2, 4], norm_stats=before)
    assert np.array_equal(np.load(tmp_path / "a.npy"), want)
    assert (hsgds.predict(store, model, patch_size=P, device="cpu", bands=[0, 2, 4]) != want).any()  # (after's)
    # in Python, the file itself (a path or hsgds.models.load_model's result) is fed the same input
    assert np.array_equal(hsgds.predict(store, ckpt, device="cpu"), want)
    assert np.array_equal(hsgds.predict(store, load_model(ckpt), patch_size=P, device="cpu"), want)


def test_predict_with_a_model_file_refuses_other_input_settings(scenes, tmp_path):
    from hsgds.models import SpectralSpatialCNN, save_checkpoint

    model = SpectralSpatialCNN(6, 4, P, reduce=4, width=8)
    store = scenes["A"][1]
    with hsgds.PatchLoader(store, patch_size=P, batch_size=8, device="cpu") as loader:
        ckpt = save_checkpoint(tmp_path / "six.ckpt", model, loader=loader)
    cases = [
        (store, dict(normalize="zscore"), "six.ckpt carries the input it was trained with; drop normalize="),
        (store, dict(bands=[0, 1, 2], norm_stats=None), "drop bands=, norm_stats="),
        (store, dict(patch_size=5), "was made for 3x3 patches, not 5x5; drop patch_size="),
        (scenes["C"][1], {}, "six.ckpt takes 6 bands but scene .*C.zarr. has 8"),
    ]
    for where, kwargs, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            hsgds.predict(where, ckpt, device="cpu", out=tmp_path / "m.npy", **kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="pass patch_size="):
        hsgds.predict(store, model, device="cpu")
    with pytest.raises(ConfigError, match="model must be a torch.nn.Module or a model file"):
        hsgds.predict(store, {"weights": 1}, patch_size=P)
    with pytest.raises(InputError, match="no model file .*missing.ckpt; pass a .pt2 program or a checkpoint"):
        hsgds.predict(store, tmp_path / "missing.ckpt")
    assert not (tmp_path / "m.npy").exists()


def test_saving_with_a_loader_takes_its_settings_only(scenes, tmp_path):
    from hsgds.models import SpectralSpatialCNN, save_checkpoint

    model = SpectralSpatialCNN(len(WANT), 4, P, reduce=4, width=8)
    store = scenes["A"][1]
    with hsgds.PatchLoader(store, patch_size=P, batch_size=8, bands=[0, 1, 2], device="cpu") as loader:
        pass
    with hsgds.PatchLoader(store, patch_size=P, batch_size=8, bands=[0, 1, 2], layout="NHWC", device="cpu") as nhwc:
        pass
    cases = [
        (dict(loader=loader, patch_size=P), "pass loader= or patch_size=, not both"),
        (dict(loader=loader, norm_stats=None, normalize="zscore"), "pass loader= or normalize=, norm_stats=, not both"),
        (dict(loader=nhwc), "yields NHWC batches"),
        (dict(loader=store), "loader must be the hsgds.PatchLoader the model was trained with, got PosixPath"),
        (dict(norm_stats=None), "pass loader= .* or patch_size="),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            save_checkpoint(tmp_path / "x.ckpt", model, **kwargs)
        assert "\n" not in str(info.value)
    assert not (tmp_path / "x.ckpt").exists()
    # a model that does not take the loader's batches: named before anything is written
    with pytest.raises(ConfigError, match="the model takes 3 bands but the loader yields 6; pass the loader"):
        save_checkpoint(tmp_path / "x.ckpt", model, loader=hsgds.PatchLoader(store, patch_size=P, batch_size=8,
                                                                                device="cpu"))
    with pytest.raises(ConfigError, match="the model takes 5x5 patches but the loader yields 3x3"):
        save_checkpoint(tmp_path / "x.ckpt", SpectralSpatialCNN(3, 4, 5, reduce=4, width=8), loader=loader)
    with pytest.raises(ConfigError, match="the program takes 3 bands but the loader yields 6"):
        hsgds.models.save_program(tmp_path / "x.pt2", _program(RandomConv()), loader=hsgds.PatchLoader(
            store, patch_size=P, batch_size=8, device="cpu"))
    assert not (tmp_path / "x.ckpt").exists() and not (tmp_path / "x.pt2").exists()
    # class names given explicitly win over the store's
    path = save_checkpoint(tmp_path / "n.ckpt", model, loader=loader, class_names=["w", "x", "y", "z"])
    assert torch.load(path, weights_only=True)["class_names"] == ["w", "x", "y", "z"]


def _program(model, batch=4):
    model.eval()
    return torch.export.export(model, (torch.randn(batch, len(WANT), P, P),),
                               dynamic_shapes=({0: torch.export.Dim("n", min=1, max=1 << 20)},))


@pytest.mark.parametrize("normalize", ["zscore", "minmax"])
def test_a_program_of_any_model_carries_its_recipe_too(scenes, tmp_path, run_cli, normalize):
    from hsgds.models import load_model, save_program

    stats = _pooled_loader_stats(scenes)
    model = RandomConv(seed=3)
    path = save_program(tmp_path / "m.pt2", _program(model), patch_size=P, normalize=normalize, wavelengths=WANT,
                        norm_stats=stats, class_names=["a", "b", "c", "d", "e"])
    loaded = load_model(path)
    assert (loaded.kind, loaded.bands, loaded.patch_size, loaded.normalize) == ("export", 3, P, normalize)
    assert loaded.wavelengths == WANT and loaded.class_names == ["a", "b", "c", "d", "e"]
    assert np.array_equal(loaded.norm_stats.max, stats.max)
    code, _, err = run_cli("predict", scenes["C"][1], "--model", path, "-o", tmp_path / "c.npy")
    assert code == 0, err
    want = hsgds.predict(scenes["C"][1], model, patch_size=P, device="cpu", normalize=normalize, wavelengths=WANT,
                         norm_stats=stats)
    assert np.array_equal(np.load(tmp_path / "c.npy"), want)
    # the same program saved plainly is fed all of C's 8 bands: refused before any work
    torch.export.save(_program(model), tmp_path / "plain.pt2")
    code, _, err = run_cli("predict", scenes["C"][1], "--model", tmp_path / "plain.pt2", "-o", tmp_path / "p.npy")
    assert code == 2 and "takes 3 bands but scene" in err and not (tmp_path / "p.npy").exists(), err


def test_programs_and_their_recipes_are_checked(scenes, tmp_path):
    from hsgds.models import load_model, save_program

    program = _program(RandomConv())
    cases = [
        (dict(program=RandomConv()), "must be a torch.export.ExportedProgram"),
        (dict(path=tmp_path / "m.pt"), "saved as .pt2; name the file m.pt2"),
        (dict(patch_size=5), "takes 3x3 patches, not patch_size=5"),
        (dict(patch_size=4), "positive odd integer"),
        (dict(normalize="l2"), "normalize must be"),
        (dict(wavelengths=WANT[:2]), "takes 3 bands but 2 wavelengths"),
        (dict(normalize=None, norm_stats=_pooled_loader_stats(scenes)), "not normalize=None"),
    ]
    for change, message in cases:
        kwargs = {"path": tmp_path / "m.pt2", "program": program, "patch_size": P, **change}
        with pytest.raises(ConfigError, match=message):
            save_program(kwargs.pop("path"), kwargs.pop("program"), **kwargs)
    assert not list(tmp_path.iterdir())
    forged = [
        ("not json", "is not JSON"),
        ('{"format": "other", "version": 1}', "not an hsgds program recipe"),
        ('{"format": "hsgds-program", "version": 1, "patch_size": 3}', "lacks normalize"),
    ]
    good = json.loads(_saved_recipe(save_program(tmp_path / "g.pt2", program, patch_size=P, wavelengths=WANT)))
    forged += [(json.dumps({**good, "patch_size": 5}), "patch size 5 is not the program's"),
               (json.dumps({**good, "normalize": "l2"}), "normalize 'l2'"),
               (json.dumps({**good, "layout": "NHWC"}), "layout 'NHWC' is not supported"),
               (json.dumps({**good, "class_names": "abcde"}), "class names are not a list of non-empty strings"),
               (json.dumps({**good, "class_names": ["a", None]}), "class names are not a list"),
               (json.dumps({**good, "wavelengths": [500.0]}), "wavelengths are not a list of 3 numbers"),
               (json.dumps({**good, "normalize": None, "norm_stats": {f: [1.0] * 3 for f in ("mean", "std", "min", "max")}}),
                "statistics but normalize None")]
    for text, message in forged:
        torch.export.save(program, tmp_path / "f.pt2", extra_files={"hsgds.json": text})
        with pytest.raises(InputError, match=message):
            load_model(tmp_path / "f.pt2")


def _saved_recipe(path):
    extra = {"hsgds.json": ""}
    torch.export.load(path, extra_files=extra)
    return extra["hsgds.json"]


def test_hsgds_info_says_what_a_model_file_takes(scenes, tmp_path, run_cli):
    stats = _pooled_loader_stats(scenes)
    ckpt, _ = _trained_checkpoint(tmp_path / "model.ckpt", stats, wavelengths=WANT)
    code, out, err = run_cli("info", ckpt)
    assert code == 0, err
    assert "hsgds checkpoint, SpectralSpatialCNN" in out
    assert "input:      3 bands, each scene's nearest good band within 5 nm of 500, 700, 900 nm; 3x3 patches, NCHW" in out
    assert "normalize:  zscore, with the statistics saved with the model" in out
    assert "classes:    4" in out
    torch.export.save(_program(RandomConv()), tmp_path / "plain.pt2")
    code, out, err = run_cli("info", tmp_path / "plain.pt2")
    assert code == 0, err
    assert "torch.export program" in out and "all bands of a 3-band scene; 3x3 patches" in out
    assert "zscore, with each scene's own train statistics" in out
    (tmp_path / "junk.ckpt").write_bytes(b"junk")
    code, out, err = run_cli("info", tmp_path / "junk.ckpt")
    assert code == 2 and "is not a usable model" in err and len(err.strip().splitlines()) == 1, err


def test_a_saved_models_far_wavelength_is_not_fixed_with_a_tolerance(scenes, tmp_path, run_cli):
    """A model file carries its tolerance (hsgds predict has no option for it, hsgds.predict refuses
    wavelength_tolerance= with a file): a scene without a band near one of its wavelengths cannot be predicted
    with it, and the message says so; a loader's message still says to raise its tolerance."""
    far, _ = _trained_checkpoint(tmp_path / "far.ckpt", None, wavelengths=[500.0, 700.0, 1000.0])
    store = scenes["A"][1]
    why = (f"was trained on a band selection that scene '{store}' cannot give: scene '{store}' has no band within "
           "5 nm of 1000 nm (nearest: 900 nm); the model was trained on that wavelength, so this scene cannot be "
           "predicted with it; use a model trained on bands this scene has")
    code, _, err = run_cli("predict", store, "--model", far, "-o", tmp_path / "a.npy")
    assert (code, err) == (2, f"hsgds: error: {far} {why}\n")
    with pytest.raises(ConfigError) as caught:
        hsgds.predict(store, far, device="cpu")
    assert str(caught.value) == f"{far} {why}"
    with pytest.raises(ConfigError, match=r"has no band within 5 nm of 1000 nm \(nearest: 900 nm\); raise "
                                          r"wavelength_tolerance or drop that wavelength$"):
        hsgds.PatchLoader(store, patch_size=P, batch_size=8, wavelengths=[500.0, 1000.0], device="cpu")


def test_a_recipes_wavelength_tolerance_follows_the_loaders_rule(scenes, tmp_path):
    """A numpy tolerance (what arithmetic on arrays gives) is taken as the loader takes it; a bool is no number
    of nm (it was saved as 1.0 nm)."""
    from hsgds.models import load_model

    stats = _pooled_loader_stats(scenes)
    ckpt, _ = _trained_checkpoint(tmp_path / "m.ckpt", stats, wavelengths=WANT, wavelength_tolerance=np.float32(7))
    assert load_model(ckpt).wavelength_tolerance == 7.0
    with pytest.raises(ConfigError, match=r"^wavelength_tolerance must be a number >= 0 \(nm\), got True$"):
        _trained_checkpoint(tmp_path / "b.ckpt", stats, wavelengths=WANT, wavelength_tolerance=True)
