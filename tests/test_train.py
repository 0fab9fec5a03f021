"""Metrics against an independent hand computation; the model; the timed loops; the demo on a tiny store."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import hsgds
from hsgds.errors import ConfigError
from hsgds.models import Hamida3D, SpectralSpatialCNN, load_model, make_model, save_checkpoint
from hsgds.train import classification_metrics, compute_only, confusion_matrix, evaluate, run_demo, train_steps


def test_metrics_match_a_hand_computation():
    # 3 classes, 10 samples. Confusion (rows true, cols pred):
    #   class 0: 3 right, 1 as class 1       -> row [3, 1, 0]
    #   class 1: 2 right, 1 as class 2       -> row [0, 2, 1]
    #   class 2: 1 right, 1 as class 0, 1 as 1 -> row [1, 1, 1]
    y_true = [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    y_pred = [0, 0, 0, 1, 1, 1, 2, 2, 0, 1]
    cm = confusion_matrix(y_true, y_pred, 3)
    assert cm.tolist() == [[3, 1, 0], [0, 2, 1], [1, 1, 1]]
    m = classification_metrics(y_true, y_pred, 3)
    # OA = 6/10; recalls 3/4, 2/3, 1/3 -> AA = (0.75 + 0.6667 + 0.3333)/3 = 0.58333
    assert m.oa == pytest.approx(0.6)
    assert m.per_class == pytest.approx((0.75, 2 / 3, 1 / 3))
    assert m.aa == pytest.approx((0.75 + 2 / 3 + 1 / 3) / 3)
    # kappa: row sums (4, 3, 3), column sums (4, 4, 2); pe = (4*4 + 3*4 + 3*2) / 100 = 0.34
    # kappa = (0.6 - 0.34) / (1 - 0.34) = 0.26 / 0.66
    assert m.kappa == pytest.approx(0.26 / 0.66)


def test_metrics_perfect_chance_and_absent_classes():
    m = classification_metrics([0, 1, 2, 2], [0, 1, 2, 2], 4)  # class 3 absent from the test split
    assert m.oa == 1.0 and m.aa == 1.0 and m.kappa == pytest.approx(1.0)
    assert np.isnan(m.per_class[3])
    # predicting a single class for everything: agreement no better than chance -> kappa 0
    m = classification_metrics([0, 0, 1, 1], [0, 0, 0, 0], 2)
    assert m.oa == 0.5 and m.aa == 0.5 and m.kappa == pytest.approx(0.0)
    assert m.as_dict()["per_class"] == [1.0, 0.0]


def test_aa_over_the_trained_classes_against_numpy():
    """A class a split left without train pixels is scored but never trained on: AA is also given over the
    classes that had train pixels, against numpy's recalls over those classes; classes without test pixels
    are in neither average; the report's per-class counts are numpy's."""
    rng = np.random.default_rng(7)
    k = 6
    t = rng.choice([0, 1, 2, 3, 5], 400)  # class 4 has no test pixel
    p = np.where(rng.random(400) < 0.7, t, rng.integers(0, k, 400))
    train = np.array([30, 0, 12, 0, 9, 4])  # classes 1 and 3: test only; class 4: train only
    m = classification_metrics(t, p, k, train_pixels=train)
    recall = {c: np.mean(p[t == c] == c) for c in np.unique(t)}
    assert m.aa == pytest.approx(np.mean(list(recall.values())))  # as before: every class with test pixels
    assert m.aa_trained == pytest.approx(np.mean([recall[c] for c in (0, 2, 5)]))
    assert m.untrained == (1, 3) and m.untested == (4,) and m.trained_scored == (0, 2, 5)
    d = m.as_dict()
    assert (d["aa_classes"], d["aa_trained_classes"]) == (5, 3)
    assert d["aa_trained"] == pytest.approx(m.aa_trained) and d["aa"] == m.aa
    assert d["test_pixels_per_class"] == np.bincount(t, minlength=k).tolist()
    assert d["train_pixels_per_class"] == train.tolist()
    # without the train pixels the new fields say so; with every class trained, the two averages agree
    plain = classification_metrics(t, p, k).as_dict()
    assert plain["aa_trained"] is None and plain["train_pixels_per_class"] is None and plain["aa"] == m.aa
    assert classification_metrics(t, p, k, train_pixels=np.ones(k)).aa_trained == pytest.approx(m.aa)
    # no scored class was trained: no number, rather than NaN in report.json
    none = classification_metrics(t, p, k, train_pixels=[0, 0, 0, 0, 5, 0])
    assert np.isnan(none.aa_trained) and none.as_dict()["aa_trained"] is None
    with pytest.raises(ValueError, match="train_pixels must be at most 6 counts, each >= 0"):
        classification_metrics(t, p, k, train_pixels=[1, -1, 0, 0, 0, 0])


def test_metrics_against_an_independent_loop():
    rng = np.random.default_rng(3)
    t = rng.integers(0, 7, 500)
    p = np.where(rng.random(500) < 0.6, t, rng.integers(0, 7, 500))
    k = 7
    cm = np.zeros((k, k))
    for a, b in zip(t, p):
        cm[a, b] += 1
    n = cm.sum()
    po = sum(cm[i, i] for i in range(k)) / n
    pe = sum(cm[i, :].sum() * cm[:, i].sum() for i in range(k)) / n**2
    m = classification_metrics(t, p, k)
    assert m.oa == pytest.approx(po)
    assert m.kappa == pytest.approx((po - pe) / (1 - pe))
    assert m.aa == pytest.approx(np.mean([cm[i, i] / cm[i].sum() for i in range(k)]))


def test_metrics_reject_bad_input():
    with pytest.raises(ValueError, match="differ in length"):
        confusion_matrix([0, 1], [0], 2)
    with pytest.raises(ValueError, match="outside 0..1"):
        confusion_matrix([0, 2], [0, 1], 2)
    with pytest.raises(ValueError, match="no samples"):
        classification_metrics([], [], 2)


def test_model_shapes_and_errors():
    m = make_model(40, 5, 7)
    assert isinstance(m, Hamida3D)
    assert m(torch.randn(3, 40, 7, 7)).shape == (3, 5)
    assert Hamida3D(37, 2, 3)(torch.randn(2, 37, 3, 3)).shape == (2, 2)
    with pytest.raises(ValueError, match="at least 37 bands"):
        Hamida3D(36, 2, 3)
    with pytest.raises(ValueError, match="NCHW"):
        m(torch.randn(3, 7, 7, 40))
    with pytest.raises(ValueError, match="patch_size"):
        Hamida3D(40, 5, 1)
    s = SpectralSpatialCNN(40, 5, 7)
    assert s(torch.randn(3, 40, 7, 7)).shape == (3, 5) and s(torch.randn(2, 40, 1, 1)).shape == (2, 5)
    with pytest.raises(ValueError, match="NCHW"):
        s(torch.randn(3, 7, 7, 40))


@pytest.mark.parametrize("cls, args, kwargs, message", [
    (SpectralSpatialCNN, ("30", 4, 5), {}, r"^SpectralSpatialCNN bands must be an integer >= 1, got '30'$"),
    (SpectralSpatialCNN, (30, 4.0, 5), {}, r"^SpectralSpatialCNN classes must be an integer >= 1, got 4.0$"),
    (SpectralSpatialCNN, (30, 4, True), {}, r"^SpectralSpatialCNN patch_size must be an integer >= 1, got True$"),
    (SpectralSpatialCNN, (30, 4, 0), {}, r"^SpectralSpatialCNN patch_size must be an integer >= 1, got 0$"),
    (SpectralSpatialCNN, (30, 4, 5), {"reduce": "8"}, r"^SpectralSpatialCNN reduce must be an integer >= 1"),
    (SpectralSpatialCNN, (30, 4, 5), {"width": 0}, r"^SpectralSpatialCNN width must be an integer >= 1, got 0$"),
    (SpectralSpatialCNN, (30, 4, 5), {"dropout": 1.0}, r"^SpectralSpatialCNN dropout must be a number in \[0, 1\), got 1.0$"),
    (SpectralSpatialCNN, (30, 4, 5), {"dropout": "0.2"}, r"^SpectralSpatialCNN dropout must be a number in \[0, 1\)"),
    (SpectralSpatialCNN, (30, 4, 5), {"dropout": -0.1}, r"^SpectralSpatialCNN dropout must be a number in \[0, 1\)"),
    (SpectralSpatialCNN, (30, 4, 5), {"dropout": float("nan")}, r"^SpectralSpatialCNN dropout must be a number"),
    (SpectralSpatialCNN, (30, 4, 5), {"dropout": False}, r"^SpectralSpatialCNN dropout must be a number"),
    (Hamida3D, ("40", 5, 7), {}, r"^Hamida3D bands must be an integer >= 1, got '40'$"),
    (Hamida3D, (40, 5.5, 7), {}, r"^Hamida3D classes must be an integer >= 1, got 5.5$"),
    (Hamida3D, (40, 5, 7.0), {}, r"^Hamida3D patch_size must be an integer >= 3, got 7.0$"),
    (Hamida3D, (40, 5, 7), {"width": None}, r"^Hamida3D width must be an integer >= 1, got None$"),
])
def test_model_arguments_are_checked_in_one_line(cls, args, kwargs, message):
    """Not torch's TypeError from deep inside a layer: which argument is wrong, and what it must be."""
    with pytest.raises(ConfigError, match=message):
        cls(*args, **kwargs)


def test_numpy_integers_make_the_same_model_and_a_checkpoint_that_loads(tmp_path):
    """numpy integers and floats are taken as the plain numbers they hold: the config a checkpoint keeps
    (read back with torch.load(weights_only=True), which refuses numpy scalars) is the plain one."""
    for cls, plain, numpy in ((SpectralSpatialCNN, (30, 4, 5), dict(reduce=np.int64(4), width=np.int32(8),
                                                                      dropout=np.float32(0.25))),
                              (Hamida3D, (40, 5, 7), dict(width=np.int16(4)))):
        model = cls(*(np.int64(v) for v in plain), **numpy)
        expected = {**dict(zip(("bands", "classes", "patch_size"), plain)),
                    **{k: v.item() for k, v in numpy.items()}}
        assert model.config == expected and all(type(v) is type(expected[k]) for k, v in model.config.items())
        path = save_checkpoint(tmp_path / f"{cls.__name__}.ckpt", model, patch_size=plain[2])
        assert load_model(path).module.config == expected


def test_loops_learn_and_time():
    torch.manual_seed(0)
    x = torch.randn(64, 40, 5, 5)
    y = (x[:, :10].mean((1, 2, 3)) > 0).long()  # learnable from the inputs
    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]
    model = make_model(40, 2, 5)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    t = compute_only(model, batches, opt, steps=30, warmup=1)
    assert t.steps == 30 and t.samples == 30 * 16 and t.elapsed_s > 0
    assert 0 <= t.stall_fraction < 1 and t.first_batch_s is not None
    assert t.as_dict()["steps_per_s"] > 0
    yt, yp = evaluate(model, batches, device="cpu")
    assert len(yt) == 64 and classification_metrics(yt, yp, 2).oa > 0.8
    # a loader that runs out ends the loop early; bfloat16 inputs are cast for a float32 model
    t2 = train_steps(model, [(a.bfloat16(), b) for a, b in batches], opt, device="cpu", steps=100,
                     dtype=torch.float32)
    assert t2.steps == 4


def test_run_demo_on_a_tiny_store(tmp_path):
    from hsgds.preprocess.convert import ConvertOptions, convert
    from hsgds.synthetic import make_scene

    cube, labels = make_scene(40, 36, 40, classes=3, dtype="uint16", seed=5)
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "g.npy", labels)
    store = convert(tmp_path / "c.npy", tmp_path / "s.zarr",
                    ConvertOptions(labels=tmp_path / "g.npy", train=0.3, max_patch=7))
    lines = []
    r = run_demo(store, epochs=2, patch_size=5, batch_size=32, device="cpu", log=lines.append,
                 out_dir=tmp_path / "demo")
    m = r["metrics"]
    assert 0 <= m.oa <= 1 and -1 <= m.kappa <= 1 and len(m.per_class) == 3
    assert r["train"].steps > 0 and r["test_pixels"] > 0
    assert r["train_loader"]["engine"] == "torch" and r["train_loader"]["patches"] > 0
    assert any("epoch 2/2" in s for s in lines)
    # the saved model reloads (no pickle) and predicts the same map as the one drawn in the PNG
    from matplotlib.image import imread

    from hsgds.inference import predict
    from hsgds.models import SpectralSpatialCNN, load_model

    loaded = load_model(r["checkpoint"])
    assert isinstance(loaded.module, SpectralSpatialCNN) and loaded.patch_size == 5 and loaded.bands == 40
    a = predict(store, loaded.module, patch_size=5, device="cpu")
    assert a.shape == (40, 36) and a.min() >= 1 and a.max() <= 3
    # the trained weights: the reloaded model's map scores the test split as the demo's model did (it only
    # checked the map's shape and range, which a model of fresh weights gives too); a pixel or two may flip
    # between the two runs' batches (rounding of near-ties)
    ty, tx, truth = hsgds.open_scene(store).samples("test")
    assert len(truth) == r["test_pixels"]
    assert abs(np.sum(a[ty, tx] == truth) - m.oa * len(truth)) <= 2, (np.mean(a[ty, tx] == truth), m.oa)
    assert imread(r["classmap"]).ndim == 3


def test_demo_defaults_agree():
    """The CLI's option defaults (kept literal so `hsgds --help` does not import torch) are run_demo's."""
    from hsgds import train
    from hsgds.cli import demo

    defaults = {p.name: p.default for p in demo.params}
    assert (defaults["epochs"], defaults["patch_size"], defaults["batch_size"], defaults["class_balance"]) == \
        (train.DEMO_EPOCHS, train.DEMO_PATCH_SIZE, train.DEMO_BATCH_SIZE, train.DEMO_CLASS_BALANCE)


def test_class_weights_and_the_weighted_step():
    """(largest / count) ** power per class, 1 for a class without train pixels; a training step with them is
    the step of torch's weighted cross-entropy written out here."""
    from hsgds.train import class_weights

    labels = np.array([0] * 16 + [1] * 4 + [3])
    counts = [16, 4, 0, 1]
    np.testing.assert_allclose(class_weights(counts, 0.5).numpy(), [1, 2, 1, 4])
    np.testing.assert_allclose(class_weights(counts, 1).numpy(), [1, 4, 1, 16])
    np.testing.assert_allclose(class_weights(counts, 0).numpy(), [1, 1, 1, 1])
    np.testing.assert_allclose(class_weights(counts, np.float32(0.5)).numpy(), [1, 2, 1, 4])
    for bad in (-1, float("inf"), True, "0.5"):
        with pytest.raises(ConfigError, match="must be a finite number >= 0"):
            class_weights(counts, bad)
    torch.manual_seed(0)
    x, y = torch.randn(21, 5), torch.from_numpy(labels)
    a = torch.nn.Linear(5, 4)
    b = torch.nn.Linear(5, 4)
    b.load_state_dict(a.state_dict())
    w = class_weights(counts)
    train_steps(a, [(x, y)], torch.optim.SGD(a.parameters(), lr=0.5), device="cpu", class_weight=w)
    opt = torch.optim.SGD(b.parameters(), lr=0.5)
    logp = torch.log_softmax(b(x), 1)
    (-(w[y] * logp[torch.arange(21), y]).sum() / w[y].sum()).backward()
    opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)


def test_demo_command_writes_report_model_and_map(tmp_path, hsgds_env, indian_pines_store, run_cli):
    import json
    import shutil

    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copytree(indian_pines_store, cache / "indian_pines.zarr")  # no second conversion
    hsgds_env("HSGDS_CACHE_DIR", str(cache))
    code, out, err = run_cli("demo", "--epochs", "1", "--patch-size", "3", "--batch-size", "256", "--device", "cpu",
                             "-o", tmp_path / "out")
    assert code == 0, err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["model"] == "SpectralSpatialCNN" and report["test_pixels"] > 9000
    assert 0 <= report["metrics"]["oa"] <= 1 and report["settings"]["epochs"] == 1
    assert (tmp_path / "out" / "classmap.png").read_bytes()[:4] == b"\x89PNG"
    assert "OA " in out and "model.ckpt" in out
    code, out, err = run_cli("predict", cache / "indian_pines.zarr", "--model", tmp_path / "out" / "model.ckpt",
                             "-o", tmp_path / "out" / "map.npy")
    assert code == 0, err
    # the checkpoint keeps the train statistics the model was normalized with ...
    from hsgds.models import load_model
    from hsgds.scene import open_scene

    trained_on = open_scene(cache / "indian_pines.zarr").stats["train"]
    saved = load_model(tmp_path / "out" / "model.ckpt").norm_stats
    assert saved is not None and np.array_equal(saved.mean, trained_on.mean) and np.array_equal(saved.std, trained_on.std)
    # ... so a new split of the store, with other train statistics, leaves the map unchanged
    code, _, err = run_cli("resplit", cache / "indian_pines.zarr", "--split", "blocks", "--train", "0.1")
    assert code == 0, err
    assert not np.array_equal(open_scene(cache / "indian_pines.zarr").stats["train"].mean, trained_on.mean)
    code, out, err = run_cli("predict", cache / "indian_pines.zarr", "--model", tmp_path / "out" / "model.ckpt",
                             "-o", tmp_path / "out" / "after_resplit.npy")
    assert code == 0, err
    assert "normalize:  zscore, with the statistics saved with the model" in out
    assert np.array_equal(np.load(tmp_path / "out" / "after_resplit.npy"), np.load(tmp_path / "out" / "map.npy"))
    # ... and is not scored against the new test split, which holds pixels the model was trained on
    assert "test split: not scored: the model was trained on this scene's labels under another split" in out
    assert "OA " not in out


def test_demo_names_classes_without_test_pixels_and_records_the_split(tmp_path, hsgds_env, indian_pines_store,
                                                                     run_cli):
    import json
    import shutil

    cache = tmp_path / "cache"
    cache.mkdir()
    store = cache / "indian_pines.zarr"
    shutil.copytree(indian_pines_store, store)
    hsgds_env("HSGDS_CACHE_DIR", str(cache))
    # a 10% block split of Indian Pines leaves Grass-pasture-mowed (7) and Stone-Steel-Towers (16) without test
    code, _, err = run_cli("resplit", store, "--split", "blocks", "--train", "0.1")
    assert code == 0, err
    code, out, err = run_cli("demo", "--epochs", "1", "--patch-size", "3", "--batch-size", "256", "--device", "cpu",
                             "-o", tmp_path / "out")
    assert code == 0, err
    assert re.search(r"AA \d+\.\d\d% \(14 of 16 classes; 2 have no test pixels\)", out), out
    per_class = next(line for line in out.splitlines() if line.startswith("per class:"))
    assert per_class.count("%") == 14 and "Grass-pasture-mowed (no test pixels)" in per_class
    assert "Stone-Steel-Towers (no test pixels)" in per_class
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    split = report["split"]
    assert (split["method"], split["train"], split["seed"]) == ("blocks", 0.1, 0)
    assert split["block_size"] > 0 and split["unsplit_classes"]
    # the block split keeps 15x15 footprints apart, so none of the 3x3 test patches overlaps a train patch
    assert split["leakage"] == {"patch_size": 3, "test_pixels": report["test_pixels"],
                                "test_pixels_overlapping_train": 0, "val_pixels": 0,
                                "val_pixels_overlapping_train": 0}


def test_demo_reports_aa_over_the_trained_classes_of_a_mask_split(tmp_path, hsgds_env, indian_pines_arrays, run_cli):
    """Indian Pines split by masks that give Alfalfa (1) and Oats (9) no train pixel and Grass-pasture-mowed (7)
    no test pixel: the printout marks them per class and gives AA over the 13 trained classes beside AA over
    the 15 tested ones; report.json keeps its keys and adds the per-class train and test counts (numpy's, from
    the masks) and aa_trained, numpy's mean over the trained classes of the recalls that the checkpoint's map
    (`hsgds predict`) gives on the test pixels."""
    import json

    from hsgds.datasets import INDIAN_PINES_CLASSES
    from hsgds.preprocess.convert import ConvertOptions, convert

    cube, labels = indian_pines_arrays
    draw = np.random.default_rng(0).random(labels.shape)
    train = (labels > 0) & (draw < 0.1) & ~np.isin(labels, [1, 9])
    test = (labels > 0) & ~train & (labels != 7)
    for name, a in (("cube", cube), ("gt", labels), ("train", train), ("test", test)):
        np.save(tmp_path / f"{name}.npy", a)
    cache = tmp_path / "cache"
    cache.mkdir()
    with pytest.warns(UserWarning, match="mask split"):
        convert(tmp_path / "cube.npy", cache / "indian_pines.zarr",
                ConvertOptions(labels=tmp_path / "gt.npy", class_names=INDIAN_PINES_CLASSES, split="masks",
                               train_mask=tmp_path / "train.npy", test_mask=tmp_path / "test.npy"))
    hsgds_env("HSGDS_CACHE_DIR", str(cache))
    code, out, err = run_cli("demo", "--epochs", "1", "--patch-size", "3", "--batch-size", "256", "--device", "cpu",
                             "-o", tmp_path / "out")
    assert code == 0, err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    metrics = report["metrics"]
    assert {"oa", "aa", "kappa", "per_class"} <= set(metrics)  # the keys before, kept
    assert metrics["train_pixels_per_class"] == np.bincount(labels[train], minlength=17)[1:].tolist()
    assert metrics["test_pixels_per_class"] == np.bincount(labels[test], minlength=17)[1:].tolist()
    assert (metrics["aa_classes"], metrics["aa_trained_classes"]) == (15, 13)
    # the recalls against the checkpoint's map, by numpy
    code, _, err = run_cli("predict", cache / "indian_pines.zarr", "--model", tmp_path / "out" / "model.ckpt", "-o",
                           tmp_path / "map.npy")
    assert code == 0, err
    pred, truth = np.load(tmp_path / "map.npy")[test], labels[test]
    recall = {c: np.mean(pred[truth == c] == c) for c in range(1, 17) if c != 7}
    assert metrics["per_class"] == pytest.approx([recall.get(c) for c in range(1, 17)], abs=1e-12)
    assert metrics["aa"] == pytest.approx(np.mean(list(recall.values())))
    assert metrics["aa_trained"] == pytest.approx(np.mean([v for c, v in recall.items() if c not in (1, 9)]))
    assert f"AA {100 * metrics['aa']:.2f}% (15 of 16 classes; 1 has no test pixels)" in out, out
    assert (f"AA over the 13 trained classes {metrics['aa_trained']:.2%}; classes 1 (Alfalfa), 9 (Oats) have no train "
            "pixels: scored, never trained on") in out, out
    per_class = next(line for line in out.splitlines() if line.startswith("per class:"))
    assert re.search(r"Alfalfa \d+% \(no train pixels\)", per_class) and re.search(r"Oats \d+% \(no train pixels\)",
                                                                                    per_class), per_class
    assert "Grass-pasture-mowed (no test pixels)" in per_class and per_class.count("no train") == 2


def test_a_store_without_test_pixels_is_refused_before_training(tmp_path, hsgds_env, npy_scene, run_cli):
    """An empty --test-mask is accepted with a warning; `hsgds demo` on such a store trained for its epochs and
    only then failed, and `hsgds predict` printed no score without a word. The demo (and run_demo) now refuse
    it in one line before training (nothing trained, no output folder), and predict says why no score follows;
    the store's test count is 0 by numpy over the masks, the train count not."""
    from hsgds.errors import InputError
    from hsgds.preprocess.convert import ConvertOptions, convert

    cp, lp, _, labels = npy_scene(b=4)
    train = (labels > 0) & (np.arange(labels.shape[1]) < 12)[None, :]
    np.save(tmp_path / "train.npy", train.astype(np.uint8))
    np.save(tmp_path / "test.npy", np.zeros(labels.shape, np.uint8))  # empty
    assert np.count_nonzero(train) > 0 and np.count_nonzero(np.load(tmp_path / "test.npy")) == 0
    cache = tmp_path / "cache"
    cache.mkdir()
    store = cache / "indian_pines.zarr"
    with pytest.warns(UserWarning, match="mask split"):
        convert(cp, store, ConvertOptions(labels=lp, split="masks", train_mask=tmp_path / "train.npy",
                                          test_mask=tmp_path / "test.npy"))
    hsgds_env("HSGDS_CACHE_DIR", str(cache))
    code, out, err = run_cli("demo", "--epochs", "1", "--patch-size", "3", "--batch-size", "16", "--device", "cpu",
                             "-o", tmp_path / "out")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"hsgds: error: {store} has no test pixels (its masks split left none): a model trained on "
                          "it could not be scored; give it a test split first"), err
    assert "training" not in out and not (tmp_path / "out").exists(), out
    logged: list[str] = []
    with pytest.raises(InputError, match="has no test pixels"):
        run_demo(store, epochs=1, patch_size=3, batch_size=16, device="cpu", out_dir=tmp_path / "out2",
                 log=logged.append)
    assert logged == [] and not (tmp_path / "out2").exists()
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "model.ckpt", SpectralSpatialCNN(4, int(labels.max()), 3, reduce=4, width=8),
                           patch_size=3)
    code, out, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "map.npy")
    assert code == 0, err
    assert (f"test split: none: the store's masks split has no test pixels, so the map is not scored (`hsgds info "
            f"{store}` shows its splits)") in out, out


def test_demo_with_an_unusable_cache_folder_is_one_line(tmp_path, hsgds_env, run_cli):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    hsgds_env("HSGDS_CACHE_DIR", str(blocker / "cache"))
    code, out, err = run_cli("demo", "--epochs", "0", "-o", tmp_path / "out")
    assert code == 2 and "HSGDS_CACHE_DIR" in err and "cache" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_demo_options_are_checked_before_any_work(tmp_path, run_cli):
    for args, message in ((("--patch-size", "17"), "--patch-size 17: the demo's patches are odd and at most 15x15"),
                          (("--patch-size", "8"), "pass an odd size from 1 to 15"),
                          (("--epochs", "-1"), "-1 is not in the range x>=0"),
                          (("--batch-size", "0"), "0 is not in the range x>=1")):
        code, out, err = run_cli("demo", *args, "-o", tmp_path / "out")
        assert code == 2 and message in err and out == "", (args, err)  # nothing converted or described
    assert not (tmp_path / "out").exists()


def test_a_failed_demo_leaves_no_empty_folder(tmp_path, run_cli):
    # the train loader refuses the device only after the scene was converted and described
    code, out, err = run_cli("demo", "--epochs", "1", "--device", "cuda:9", "-o", tmp_path / "out")
    assert code == 2 and "cuda:9" in err, err
    assert not (tmp_path / "out").exists()
