"""Full-scene inference: every pixel predicted exactly once (a model that reads the centre pixel's coordinates
from the patch), the map equal to the model over PatchLoader batches (both engines, every patch size, borders
and corners), masks, streamed probabilities, writers end to end, and the `hsgds predict` command."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import stat
import sys
import warnings
import zipfile

import numpy as np
import pytest
import torch
from torch import nn

import hsgds
from hsgds.errors import ConfigError, InputError
from hsgds.inference import predict
from hsgds.preprocess.convert import ConvertOptions, convert

H, W, B = 37, 29, 8
HAS_DALI = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None
ENGINES = ["torch", pytest.param("dali", marks=pytest.mark.skipif(not HAS_DALI, reason="DALI is not installed"))]


def coordinate_cube(h=H, w=W, b=B, seed=0):
    """Band 0 holds the row, band 1 the column of each pixel; the other bands are noise."""
    rng = np.random.default_rng(seed)
    cube = rng.integers(0, 1000, (h, w, b)).astype(np.int16)
    cube[:, :, 0] = np.arange(h)[:, None]
    cube[:, :, 1] = np.arange(w)[None, :]
    labels = rng.integers(0, 4, (h, w)).astype(np.uint8)
    return cube, labels


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A 37x29 scene in 3x2 tiles of 18x18 (the last row and column partly filled), halo 7 (p <= 15)."""
    d = tmp_path_factory.mktemp("predict")
    cube, labels = coordinate_cube()
    np.save(d / "cube.npy", cube)
    np.save(d / "gt.npy", labels)
    return convert(d / "cube.npy", d / "s.zarr", ConvertOptions(labels=d / "gt.npy", tile=18, max_patch=15))


class CentreCoordinates(nn.Module):
    """Logits whose argmax is the centre pixel's index y * W + x, and a count of how often each pixel came."""

    def __init__(self, h=H, w=W):
        super().__init__()
        self.h, self.w = h, w
        self.seen = torch.zeros(h * w, dtype=torch.int64)

    def forward(self, x):
        c = x.shape[-1] // 2
        idx = x[:, 0, c, c].round().long() * self.w + x[:, 1, c, c].round().long()
        self.seen += torch.bincount(idx.cpu(), minlength=self.h * self.w)
        return nn.functional.one_hot(idx, self.h * self.w).to(x.dtype)


class RandomConv(nn.Module):
    """A fixed random patch classifier: one p x p convolution to K logits."""

    def __init__(self, p, k=6, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(B, k, p)

    def forward(self, x):
        return self.conv(x).flatten(1)


def test_every_pixel_predicted_exactly_once(store):
    model = CentreCoordinates()
    out = predict(store, model, patch_size=5, batch_size=100, device="cpu", normalize=None)
    assert out.dtype == np.uint16 and out.shape == (H, W)
    assert np.array_equal(out, np.arange(H * W).reshape(H, W) + 1)  # each pixel's own centre
    assert np.array_equal(model.seen.numpy(), np.ones(H * W))  # and each exactly once


@pytest.fixture(scope="module")
def thin_stores(tmp_path_factory):
    """A 1-row and a 1-column scene (edge padding: one row cannot be reflected) of 3 tiles, the last partly
    filled, halo 3 (p <= 7)."""
    d = tmp_path_factory.mktemp("thin")
    stores = {}
    for h, w in ((1, 23), (23, 1)):
        cube, _ = coordinate_cube(h, w)
        np.save(d / f"{h}x{w}.npy", cube)
        stores[h, w] = convert(d / f"{h}x{w}.npy", d / f"{h}x{w}.zarr", ConvertOptions(tile=10, max_patch=7,
                                                                                       padding="edge"))
    return stores


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("h, w, p, batch_size, dtype, masked", [
    (1, 23, 7, 1, torch.float32, False),  # a batch per pixel
    (23, 1, 3, 7, torch.bfloat16, True),  # a prime batch size, a batch spanning tiles, a mask of the ends
    (1, 23, 5, 1000, torch.bfloat16, True),  # one batch larger than the scene
    (23, 1, 1, 1000, torch.float32, False),
])
def test_thin_scenes_get_every_pixel_predicted_exactly_once(thin_stores, engine, h, w, p, batch_size, dtype, masked):
    """One-row and one-column scenes: every pixel (or every pixel of a mask holding each end) gets its own
    centre, each once, from either engine, in float32 and bfloat16, batch by batch or all in one batch."""
    model = CentreCoordinates(h, w)
    mask = None
    if masked:
        mask = np.zeros((h, w), bool)
        mask.reshape(-1)[[0, 1, h * w - 1]] = True
    out = predict(thin_stores[h, w], model, patch_size=p, batch_size=batch_size, device="cpu", dtype=dtype,
                  normalize=None, engine=engine, mask=mask)
    want = np.arange(h * w).reshape(h, w) + 1
    keep = np.ones((h, w), bool) if mask is None else mask
    assert out.dtype == np.uint8 and np.array_equal(out, np.where(keep, want, 0))
    assert np.array_equal(model.seen.numpy().reshape(h, w), keep.astype(np.int64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_torch_ops_cut_predicts_nhwc_batches_its_threads_cut(store, dtype):
    """The torch engine's CPU path without the fused kernel (numba off, or not installed) shares a batch's
    chunks out to its threads, which cut NHWC patches straight into the output. predict allocated that output
    under torch.inference_mode(), which is per thread: the threads outside it could not write an inference
    tensor, and predict failed with torch's RuntimeError. Every pixel gets its own centre, once."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))  # (a batch goes to at most this many threads)
    model = CentreCoordinates()
    try:  # chunks of a few patches: several per batch
        with hsgds.defaults.set(numba=False, torch_chunk_bytes=4096):
            out = predict(store, lambda_module(lambda x: model(x.permute(0, 3, 1, 2))), patch_size=5,
                          batch_size=300, device="cpu", dtype=dtype, normalize=None, layout="NHWC")
    finally:
        torch.set_num_threads(threads)
    assert np.array_equal(out, np.arange(H * W).reshape(H, W) + 1)
    assert np.array_equal(model.seen.numpy(), np.ones(H * W))


def lambda_module(fn):
    """``fn`` as a module (predict takes a torch.nn.Module)."""

    class Fn(nn.Module):
        def forward(self, x):
            return fn(x)

    return Fn()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("p", [1, 3, 5, 7, 9, 11, 13, 15])
def test_map_equals_the_model_over_loader_batches(store, engine, p):
    model = RandomConv(p, seed=p)
    got = predict(store, model, patch_size=p, batch_size=97, device="cpu", engine=engine)
    # reference: the same model over PatchLoader batches of every pixel, scattered by numpy
    ref = np.zeros((H, W), np.int64)
    with hsgds.PatchLoader(store, patch_size=p, batch_size=61, pixels="all", split=None, shuffle=False,
                           return_coords=True, device="cpu", engine=engine) as loader, torch.no_grad():
        for x, _, yx in loader:
            yx = yx.numpy()
            ref[yx[:, 0], yx[:, 1]] = model(x).argmax(1).numpy() + 1
    assert (ref > 0).all()
    assert np.array_equal(got, ref)
    # the corners and edges come from the store's reflect padding: check them against numpy
    cube = coordinate_cube()[0].astype(np.float64)
    st = hsgds.open_scene(store).norm_stats
    r = p // 2
    padded = np.pad((cube - st.mean) / np.where(st.std > 0, st.std, 1), ((r, r), (r, r), (0, 0)), mode="reflect")
    border = [(y, x) for y in (0, 1, H - 2, H - 1) for x in range(W)] + [(y, x) for y in range(H) for x in (0, W - 1)]
    patches = np.stack([padded[y:y + p, x:x + p].transpose(2, 0, 1) for y, x in border])
    with torch.no_grad():
        logits = model(torch.from_numpy(patches).float()).numpy()
    for (y, x), row in zip(border, logits):
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] > 1e-4:  # a near-tie could flip with float32 rounding: skip those
            assert got[y, x] == row.argmax() + 1, (y, x)


def test_mask_leaves_zero_outside(store):
    rng = np.random.default_rng(5)
    mask = rng.random((H, W)) < 0.3
    model = CentreCoordinates()
    out = predict(store, model, patch_size=3, batch_size=64, device="cpu", normalize=None, mask=mask)
    expected = np.where(mask, np.arange(H * W).reshape(H, W) + 1, 0)
    assert np.array_equal(out, expected)
    assert np.array_equal(model.seen.numpy().reshape(H, W), mask.astype(np.int64))
    as_tensor = predict(store, CentreCoordinates(), patch_size=3, batch_size=64, device="cpu", normalize=None,
                        mask=torch.from_numpy(mask))  # a torch mask too (on the GPU: tests/test_gpu.py)
    assert np.array_equal(as_tensor, expected)
    with pytest.raises(ConfigError, match="boolean"):
        predict(store, model, patch_size=3, mask=mask.astype(np.uint8), device="cpu")
    with pytest.raises(ConfigError, match=f"has shape \\(3, 4\\), but the scene is {H}x{W}"):
        predict(store, model, patch_size=3, mask=np.ones((3, 4), bool), device="cpu")
    with pytest.raises(ConfigError, match="selects no pixel"):
        predict(store, model, patch_size=3, mask=np.zeros((H, W), bool), device="cpu")


def test_progress_counts_the_pixels_predicted(store):
    """``progress`` hears of every batch: the pixels done so far, out of those to predict (under the mask)."""
    mask = np.random.default_rng(9).random((H, W)) < 0.6
    calls = []
    predict(store, CentreCoordinates(), patch_size=3, batch_size=50, device="cpu", normalize=None, mask=mask,
            progress=lambda done, total: calls.append((done, total)))
    n = int(mask.sum())
    assert [done for done, _ in calls] == [min(n, 50 * (i + 1)) for i in range(-(-n // 50))]
    assert {total for _, total in calls} == {n}


def test_probabilities_streamed_to_npy(store, tmp_path):
    model = RandomConv(3, k=4, seed=1)
    mask = np.ones((H, W), bool)
    mask[:3] = False
    out = predict(store, model, patch_size=3, batch_size=50, device="cpu", mask=mask,
                  probabilities=tmp_path / "p.npy", out=tmp_path / "map.npy")
    probs = np.load(tmp_path / "p.npy", allow_pickle=False)
    assert probs.dtype == np.float16 and probs.shape == (H, W, 4)
    assert (probs[:3] == 0).all()
    assert np.allclose(probs[3:].astype(np.float32).sum(-1), 1, atol=4e-3)
    assert np.array_equal(np.where(mask, probs.argmax(-1) + 1, 0), out) or \
        (np.where(mask, probs.argmax(-1) + 1, 0) != out).sum() <= 2  # float16 rounding may tie two classes
    assert np.array_equal(np.load(tmp_path / "map.npy", allow_pickle=False), out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.npy", "p.npy"]


def test_bad_inputs_write_nothing(store, tmp_path):
    with pytest.raises(InputError, match="unknown suffix"):
        predict(store, RandomConv(3), patch_size=3, out=tmp_path / "m.jpg", device="cpu")
    with pytest.raises(InputError, match=r"the model failed on a \(.*check that it takes 8 bands"):
        predict(store, RandomConv(5), patch_size=3, out=tmp_path / "m.npy", probabilities=True, device="cpu")

    class Flat(nn.Module):
        def forward(self, x):
            return x.sum()

    with pytest.raises(InputError, match="must return \\(N, K\\) logits"):
        predict(store, Flat(), patch_size=3, out=tmp_path / "m.npy", probabilities=True, device="cpu")
    with pytest.raises(ConfigError, match="pass out="):
        predict(store, RandomConv(3), patch_size=3, probabilities=True, device="cpu")

    class NaNOnTheFirstRows(RandomConv):  # argmax would make a valid-looking map of these NaN rows
        def forward(self, x):
            logits = super().forward(x)
            logits[:10, 2] = torch.nan
            return logits

    with pytest.raises(InputError, match=f"NaN or infinite logits for 50 of {H * W} pixels; nothing was written"):
        predict(store, NaNOnTheFirstRows(3), patch_size=3, batch_size=256, out=tmp_path / "m.npy",
                probabilities=True, device="cpu")

    class NaNOnTheLastVariant(RandomConv):  # with tta: the 8th model call of each batch (a dihedral variant)
        calls = 0

        def forward(self, x):
            logits = super().forward(x)
            self.calls += 1
            if self.calls % 8 == 0:
                logits[:10, 2] = torch.nan
            return logits

    with pytest.raises(InputError, match=f"NaN or infinite logits for 50 of {H * W} pixels; nothing was written"):
        predict(store, NaNOnTheLastVariant(3), patch_size=3, batch_size=256, out=tmp_path / "m.npy",
                probabilities=True, device="cpu", tta=True)
    with pytest.raises(ConfigError, match="both be written to"):
        predict(store, RandomConv(3), patch_size=3, out=tmp_path / "m.npy", probabilities=tmp_path / "m.npy")
    bad_arguments = [
        (dict(out=5), "out must be a path"),
        (dict(batch_size="64"), "batch_size must be an integer >= 1, got '64'"),
        (dict(tta="no"), "tta must be True or False"),
        (dict(device="banana"), "device='banana' is not a device"),
        # (it was first called after the first batch: a TypeError once the model had run)
        (dict(progress=5), "progress must be a function of \\(pixels predicted, pixels to predict\\) or None, "
                           "got int 5"),
    ]
    for kwargs, message in bad_arguments:
        with pytest.raises(ConfigError, match=message):
            predict(store, RandomConv(3), patch_size=3, **kwargs)
    with pytest.raises(ConfigError, match="a store must be a path"):
        predict(None, RandomConv(3), patch_size=3)
    assert list(tmp_path.iterdir()) == []


def test_a_collection_is_refused_with_how_to_predict_its_scenes(store, tmp_path):
    """hsgds.predict maps one scene: a Collection was refused as "a store must be a path ..., got Collection",
    which did not say what to do instead."""
    import shutil

    from hsgds.collection import SceneEntry, open_collection, write_collection
    from hsgds.scene import open_scene

    for name in ("north", "south"):
        shutil.copytree(store, tmp_path / f"{name}.zarr")
    write_collection(tmp_path, [SceneEntry.of_scene(n, open_scene(tmp_path / f"{n}.zarr")) for n in ("north", "south")])
    with pytest.raises(ConfigError) as caught:
        predict(open_collection(tmp_path), RandomConv(3), patch_size=3, out=tmp_path / "m.npy")
    assert str(caught.value) == (
        "predict maps one scene, got a collection of 2 scenes: predict each, e.g. for name, scene in "
        "zip(coll.names, coll): hsgds.predict(scene, model, out=f'maps/{name}.tif'), or run hsgds predict "
        f"{tmp_path} --model MODEL -o 'maps/{{name}}.tif'")
    assert not (tmp_path / "m.npy").exists()


def test_probabilities_takes_numpy_bools_as_tta_does(store, tmp_path):
    """probabilities=np.True_ (a flag read from an array) writes beside `out` as True does, np.False_ writes
    nothing: both were refused as "must be True, False or a .npy or .tif path" (tta= took them)."""
    model = RandomConv(3, k=4, seed=2)
    want = predict(store, model, patch_size=3, device="cpu", probabilities=tmp_path / "want.npy")
    got = predict(store, model, patch_size=3, device="cpu", probabilities=np.True_, out=tmp_path / "m.npy")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.load(tmp_path / "m.probabilities.npy", allow_pickle=False),
                                  np.load(tmp_path / "want.npy", allow_pickle=False))
    predict(store, model, patch_size=3, device="cpu", probabilities=np.False_, out=tmp_path / "n.npy")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npy", "m.probabilities.npy", "n.npy", "want.npy"]


def test_a_folder_where_a_map_writes_its_companion_file_is_refused_before_any_work(store, tmp_path):
    """-o m.hdr beside a folder m.img (the ENVI binary's name), or -o m.tif beside a folder m.tif.aux.xml (its
    category sidecar): an IsADirectoryError once the whole scene was predicted. Now one line before the model
    runs; the folders stay as they were."""
    (tmp_path / "m.img").mkdir()
    (tmp_path / "m.tif.aux.xml").mkdir()
    model = CentreCoordinates()
    for out, companion in (("m.hdr", "m.img"), ("m.tif", "m.tif.aux.xml")):
        with pytest.raises(InputError, match=f"^cannot write {tmp_path / out}: the {companion} written beside it is a "
                                             "directory there; name another file$"):
            predict(store, model, patch_size=3, device="cpu", normalize=None, out=tmp_path / out)
    assert model.seen.sum() == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.img", "m.tif.aux.xml"]
    assert all(p.is_dir() and not any(p.iterdir()) for p in tmp_path.iterdir())


def test_class_names_an_envi_map_cannot_hold_are_refused_before_any_work(store, tmp_path):
    """A model's class name holding a comma cannot be listed in an ENVI header (SPy would read it back as two
    names; hsgds wrote it with a ';' without a word): refused on one line before the model runs, nothing
    written; a GeoTIFF holds it."""
    from hsgds.models import SpectralSpatialCNN, save_checkpoint

    model = SpectralSpatialCNN(B, 4, 5, reduce=4, width=8)
    ckpt = save_checkpoint(tmp_path / "model.ckpt", model, patch_size=5, class_names=["a", "b, c", "d", "e"])
    calls = []
    with pytest.raises(ConfigError, match=r"^cannot write m\.hdr: the name of class 2 \('b, c'\) holds a comma, "
                                          r".*rename the class, or write a \.tif$"):
        predict(store, ckpt, device="cpu", out=tmp_path / "m.hdr", progress=lambda *a: calls.append(a))
    assert calls == [] and sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]


def test_class_names_that_are_no_unicode_text_are_refused_before_any_work(tmp_path, run_cli):
    """`--class-names` given bytes that are not UTF-8 (a Latin-1 terminal) reached the store as unpaired
    surrogates (convert refuses them now; a store converted before holds them); every map that holds names
    (.tif, .hdr, .png) and a probabilities GeoTIFF then failed with UnicodeEncodeError and a traceback once the
    whole scene was predicted. Refused in one line before the model runs; a .npy map (no names) is written."""
    cube, labels = coordinate_cube(seed=15)
    np.save(tmp_path / "cube.npy", cube)
    np.save(tmp_path / "gt.npy", labels)
    store = convert(tmp_path / "cube.npy", tmp_path / "s.zarr",
                    ConvertOptions(labels=tmp_path / "gt.npy", class_names=("mais", "b", "c")))
    root = json.loads((store / "zarr.json").read_text())
    root["attributes"]["hsgds"]["class_names"][0] = "ma\udcefs"  # as an hsgds before the check stored them
    (store / "zarr.json").write_text(json.dumps(root))
    (tmp_path / "maps").mkdir()
    model = CentreCoordinates()
    for outputs in ({"out": tmp_path / "maps" / "m.tif"}, {"out": tmp_path / "maps" / "m.hdr"},
                    {"out": tmp_path / "maps" / "m.png"},
                    {"out": tmp_path / "maps" / "m.npy", "probabilities": tmp_path / "maps" / "p.tif"}):
        with pytest.raises(ConfigError, match=r"^cannot write m?p?\.(tif|hdr|png): the name of class 1 "
                                              r"\('ma\\udcefs'\) holds '\\udcef', which is no Unicode text"):
            predict(store, model, patch_size=3, device="cpu", normalize=None, **outputs)
    assert model.seen.sum() == 0 and list((tmp_path / "maps").iterdir()) == []
    from hsgds.models import SpectralSpatialCNN, save_checkpoint

    ckpt = save_checkpoint(tmp_path / "model.ckpt", SpectralSpatialCNN(B, 3, 3, reduce=4, width=8), patch_size=3)
    code, _, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "maps" / "m.tif")  # (the store's names)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "which is no Unicode text" in err, err
    out = predict(store, model, patch_size=3, device="cpu", normalize=None, out=tmp_path / "maps" / "m.npy")
    assert np.array_equal(np.load(tmp_path / "maps" / "m.npy"), out)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")
@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_symlink_or_fifo_at_an_output_path_is_refused_before_any_work(store, tmp_path, kind):
    """A symbolic link or a FIFO where predict writes the map, a companion file (an ENVI map's .img, a
    GeoTIFF's .aux.xml) or the probabilities was replaced by a regular file once the whole scene was predicted
    (the link's target left stale, a pipe's reader waiting). Now one line before the model runs; the link, its
    target and the FIFO stay as they were."""
    target = tmp_path / "target.txt"
    target.write_text("kept")
    maps = tmp_path / "maps"
    maps.mkdir()
    described = {"symlink": "a symbolic link", "fifo": r"a FIFO \(named pipe\)"}[kind]
    model = CentreCoordinates()
    cases = [("m.npy", "m.npy", None, f"^cannot write {maps / 'm.npy'}: it is {described}, which writing would "
                                      "replace with a file; choose another output path$"),
             ("m.hdr", "m.img", None, f"^cannot write {maps / 'm.hdr'}: the m.img written beside it is {described} "
                                      "there; name another file$"),
             ("m.tif", "m.tif.aux.xml", None, f"the m.tif.aux.xml written beside it is {described} there"),
             ("m.npy", "p.npy", maps / "p.npy", f"^cannot write {maps / 'p.npy'}: it is {described}"),
             ("m.npy", "m.probabilities.npy", True, f"^cannot write {maps / 'm.probabilities.npy'}: it is {described}")]
    for out, special, probabilities, message in cases:
        if kind == "symlink":
            (maps / special).symlink_to(target)
        else:
            os.mkfifo(maps / special)
        with pytest.raises(InputError, match=message):
            predict(store, model, patch_size=3, device="cpu", normalize=None, out=maps / out,
                    probabilities=probabilities or False)
        assert model.seen.sum() == 0
        st_mode = os.lstat(maps / special).st_mode
        assert stat.S_ISLNK(st_mode) if kind == "symlink" else stat.S_ISFIFO(st_mode)
        assert sorted(p.name for p in maps.iterdir()) == [special]
        (maps / special).unlink()
    assert target.read_text() == "kept"


def test_output_paths_with_a_newline_or_thousands_of_characters_are_shown_on_one_short_line(store, tmp_path):
    """An -o or probabilities path holding a newline made a two-line error, one of thousands of characters as
    long a one: shown escaped and clipped in the middle, the file name kept; the model never runs."""
    import re

    model = CentreCoordinates()
    long_folder = tmp_path / ("d" * 3000)
    cases = [({"out": tmp_path / "no\nsuch" / "m.npy"},
              re.escape(f"cannot write {tmp_path}/no\\nsuch/m.npy: the folder {tmp_path}/no\\nsuch does not exist")),
             ({"out": long_folder / "m.npy"}, r"^cannot write /.*d\.\.\.m\.npy: File name too long; choose another "),
             ({"out": tmp_path.joinpath(*["d" * 200] * 15, "m.npy")},
              r"^cannot write /.*d\.\.\.m\.npy: the folder /.*dd does not exist"),
             ({"out": tmp_path / "m.npy", "probabilities": tmp_path / "p\nq" / "p.npy"},
              re.escape(f"cannot write {tmp_path}/p\\nq/p.npy: the folder")),
             ({"out": tmp_path / "m\n.xyz"}, re.escape("cannot write a class map as 'm\\n.xyz': unknown suffix '.xyz'"))]
    for kwargs, want in cases:
        with pytest.raises(InputError, match=want) as caught:
            predict(store, model, patch_size=3, device="cpu", normalize=None, **kwargs)
        assert "\n" not in str(caught.value) and len(str(caught.value)) < 1000, caught.value
    assert model.seen.sum() == 0 and list(tmp_path.iterdir()) == []


def test_model_mode_restored(store):
    model = RandomConv(3)
    model.train()
    predict(store, model, patch_size=3, device="cpu")
    assert model.training



def test_patches_follow_the_model_dtype_and_device(store):
    """A bfloat16 model is fed bfloat16 patches without being told; a device the model is not on is refused."""
    torch.manual_seed(0)
    model = RandomConv(3).to(torch.bfloat16)
    got = predict(store, model, patch_size=3)
    assert np.array_equal(got, predict(store, model, patch_size=3, dtype=torch.bfloat16, device="cpu"))
    with pytest.raises(InputError, match="torch.float32 NCHW patch batch"):
        predict(store, model, patch_size=3, dtype=torch.float32)
    with pytest.raises(ConfigError, match=r"the model is on cpu but device='cuda:1'; move it there \(model.to"):
        predict(store, RandomConv(3), patch_size=3, device="cuda:1")

def test_a_constant_float64_band_reads_0_as_documented(tmp_path):
    """A float64 band holding one value: its mean and std, accumulated tile by tile, carried float64 rounding
    (a std of 1e-12 about 608.6395...), and z-scoring divided by it: the band read an arbitrary value (another
    in another scene) where a constant band reads 0. The store records its mean as the value and std 0
    (read with zarr-python), and the model is fed 0 there, the other bands numpy's z-score."""
    import zarr

    rng = np.random.default_rng(3)
    cube = rng.random((H, W, 4)) * 1000
    cube[:, :, 2] = 608.6395289271209
    labels = rng.integers(0, 4, (H, W)).astype(np.uint8)
    np.save(tmp_path / "cube.npy", cube)
    np.save(tmp_path / "gt.npy", labels)
    store = convert(tmp_path / "cube.npy", tmp_path / "s.zarr", ConvertOptions(labels=tmp_path / "gt.npy", tile=14,
                                                                                max_patch=3, train=0.5))
    g = zarr.open_group(str(store), mode="r")
    for which in ("all", "train"):
        assert g[f"stats/{which}/std"][2] == 0 and g[f"stats/{which}/mean"][2] == 608.6395289271209

    fed = []

    class Keep(nn.Module):
        def forward(self, x):
            fed.append(x.clone())
            return x.flatten(1)[:, :3]

    predict(store, Keep(), patch_size=1, device="cpu", dtype=torch.float64)
    x = torch.cat(fed).numpy()[:, :, 0, 0]
    assert (x[:, 2] == 0).all()
    st = hsgds.open_scene(store).norm_stats
    other = [0, 1, 3]
    np.testing.assert_allclose(np.sort(x[:, other], 0), np.sort((cube.reshape(-1, 4)[:, other] - st.mean[other]) /
                                                                st.std[other], 0), rtol=1e-12)


def test_float16_patches_that_would_overflow_are_refused_before_predicting(store, tmp_path):
    """A float16 model given statistics that normalize band 2 (values 0..999) past float16's 65504 is
    refused before anything is written; its own statistics are fine."""
    cube, _ = coordinate_cube()
    x = cube.reshape(-1, B).astype(np.float64)
    std = x.std(0)
    std[2] = 1e-3
    stats = hsgds.BandStats(mean=x.mean(0), std=std, min=x.min(0), max=x.max(0))
    assert np.abs(x[:, 2] - x[:, 2].mean()).max() / 1e-3 > 65504  # what band 2 would reach
    model = RandomConv(3).half()
    with pytest.raises(ConfigError, match=r"^float16 patches would overflow to inf: output band 2 of scene 's'"):
        predict(store, model, patch_size=3, device="cpu", norm_stats=stats, out=tmp_path / "map.npy")
    assert not (tmp_path / "map.npy").exists()
    assert predict(store, model, patch_size=3, device="cpu").shape == (H, W)


# -- source nodata (format v3): 0 in every output, like a pixel outside the mask -----------------------------------

@pytest.fixture(scope="module")
def nodata_scene(nodata_store):
    """The coordinate scene in tiles of 18 (halo 7), with no data outside a slanted swath and in its first tile."""
    store, _, labels, nodata = nodata_store(H, W, B, tile=18, max_patch=15, scene=coordinate_cube())
    return store, labels, nodata


def test_nodata_pixels_are_never_predicted(nodata_scene):
    store, _, nodata = nodata_scene
    model = CentreCoordinates()
    out = predict(store, model, patch_size=3, batch_size=64, device="cpu", normalize=None)
    assert np.array_equal(out, np.where(nodata, 0, np.arange(H * W).reshape(H, W) + 1))
    assert np.array_equal(model.seen.numpy().reshape(H, W), (~nodata).astype(np.int64))
    mask = np.random.default_rng(6).random((H, W)) < 0.4
    out = predict(store, model, patch_size=3, batch_size=64, device="cpu", normalize=None, mask=mask)
    assert np.array_equal(out, np.where(mask & ~nodata, np.arange(H * W).reshape(H, W) + 1, 0))
    with pytest.raises(ConfigError, match="every pixel inside the mask has no data"):
        predict(store, model, patch_size=3, device="cpu", mask=nodata)


@pytest.mark.parametrize("suffix", [".npy", ".hdr", ".tif", ".png"])
def test_every_output_holds_0_at_nodata_pixels(nodata_scene, tmp_path, suffix):
    """The map written (and the probabilities) read back 0 where the source had no data, as where no pixel
    was predicted; the PNG's error panel counts only labelled pixels, which nodata ones never are."""
    store, labels, nodata = nodata_scene
    assert not labels[nodata].any()
    out = predict(store, RandomConv(3, k=4), patch_size=3, batch_size=50, device="cpu", out=tmp_path / f"m{suffix}",
                  probabilities=tmp_path / "p.npy")
    assert (out[nodata] == 0).all() and (out[~nodata] > 0).all()
    probs = np.load(tmp_path / "p.npy", allow_pickle=False)
    assert (probs[nodata] == 0).all()
    assert np.allclose(probs[~nodata].astype(np.float32).sum(-1), 1, atol=4e-3)
    if suffix == ".npy":
        written = np.load(tmp_path / "m.npy", allow_pickle=False)
    elif suffix == ".hdr":
        written = np.fromfile(tmp_path / "m.img", dtype=out.dtype).reshape(H, W)
    elif suffix == ".tif":
        written = _gdal(tmp_path / "m.tif")[2]
    else:
        assert (tmp_path / "m.png").stat().st_size > 0
        return
    assert np.array_equal(written, out)


# -- georeference end to end: source written independently, output read back with rasterio -----------------

def _gdal(path):
    rasterio = pytest.importorskip("rasterio")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rasterio.open(path) as ds:
            return ds.crs, ds.transform, ds.read(1) if ds.count == 1 else None


def _georeferenced_store(tmp_path, seed):
    """The coordinate cube written as a GeoTIFF (EPSG:32616) by rasterio and converted; (source, store)."""
    rasterio = pytest.importorskip("rasterio")
    from rasterio.crs import CRS
    from rasterio.transform import Affine

    cube, _ = coordinate_cube(seed=seed)
    src = tmp_path / "cube.tif"
    with rasterio.open(src, "w", driver="GTiff", height=H, width=W, count=B, dtype="int16",
                       crs=CRS.from_epsg(32616), transform=Affine(30, 0, 620000.5, 0, -30, 4000000.25)) as dst:
        dst.write(cube.transpose(2, 0, 1))
    return src, convert(src, tmp_path / "s.zarr", ConvertOptions())


def test_geotiff_source_to_georeferenced_class_map(tmp_path):
    src, store = _georeferenced_store(tmp_path, seed=3)
    out = predict(store, RandomConv(3), patch_size=3, device="cpu", out=tmp_path / "map.tif")
    crs, transform, data = _gdal(tmp_path / "map.tif")
    src_crs, src_transform, _ = _gdal(src)
    assert crs == src_crs and transform == src_transform
    assert np.array_equal(data, out)


def test_a_geotiff_source_without_a_crs_gives_a_map_on_its_grid(tmp_path):
    """A source GeoTIFF with a transform but no CRS (GDAL writes no geokeys for it): the map and the probabilities
    are on the source's grid as rasterio reads it, without a CRS, as from an ENVI source's map info without one
    (the store had dropped the transform)."""
    rasterio = pytest.importorskip("rasterio")
    from rasterio.transform import Affine

    cube, _ = coordinate_cube(seed=12)
    src = tmp_path / "cube.tif"
    with rasterio.open(src, "w", driver="GTiff", height=H, width=W, count=B, dtype="int16",
                       transform=Affine(2.5, 0, 1000.0, 0, -2.5, 5000.0)) as dst:
        dst.write(cube.transpose(2, 0, 1))
    store = convert(src, tmp_path / "s.zarr", ConvertOptions())
    out = predict(store, RandomConv(3), patch_size=3, device="cpu", out=tmp_path / "map.tif", probabilities=True)
    src_crs, src_transform, _ = _gdal(src)
    assert src_crs is None and src_transform == Affine(2.5, 0, 1000.0, 0, -2.5, 5000.0)
    for written in ("map.tif", "map.probabilities.tif"):
        crs, transform, data = _gdal(tmp_path / written)
        assert crs is None and transform == src_transform, written
    assert np.array_equal(_gdal(tmp_path / "map.tif")[2], out)


def test_a_crs_gdal_cannot_read_is_refused_before_any_work(tmp_path, run_cli):
    """An ENVI source whose coordinate system string GDAL cannot read (the store records it as given): -o
    map.tif (or probabilities as a GeoTIFF) failed with rasterio's CRSError once the whole scene was predicted,
    after a probabilities .npy was already written, and the command showed a traceback. Now one line before
    the model runs, nothing written; an ENVI map keeps the string as the source had it."""
    envi = pytest.importorskip("spectral.io.envi")
    cube, _ = coordinate_cube(seed=13)
    envi.save_image(str(tmp_path / "cube.hdr"), cube, interleave="bil", ext=".img",
                    metadata={"map info": ["Arbitrary", "1", "1", "1000", "5000", "30", "30"],
                              "coordinate system string": "garbage"})
    store = convert(tmp_path / "cube.hdr", tmp_path / "s.zarr", ConvertOptions())
    assert hsgds.open_scene(store).meta.georeference["crs_wkt"] == "garbage"
    model = CentreCoordinates()
    (tmp_path / "maps").mkdir()
    for outputs in ({"out": tmp_path / "maps" / "m.tif", "probabilities": tmp_path / "maps" / "p.npy"},
                    {"out": tmp_path / "maps" / "m.npy", "probabilities": tmp_path / "maps" / "p.tif"}):
        with pytest.raises(InputError, match="as a GeoTIFF: GDAL cannot read the coordinate reference system"):
            predict(store, model, patch_size=3, device="cpu", normalize=None, **outputs)
    assert model.seen.sum() == 0 and list((tmp_path / "maps").iterdir()) == []
    ckpt, _ = _checkpoint(tmp_path, p=3)
    code, out, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "maps" / "m.tif")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "GDAL cannot read" in err, err
    assert list((tmp_path / "maps").iterdir()) == []
    predict(store, model, patch_size=3, device="cpu", normalize=None, out=tmp_path / "maps" / "m.hdr")
    assert "coordinate system string = {garbage}" in (tmp_path / "maps" / "m.hdr").read_text()


def test_probabilities_as_a_georeferenced_geotiff(tmp_path):
    """probabilities=*.tif: a float32 GeoTIFF of K bands on the source's grid (CRS and transform as GDAL reads
    the source), each band the class's probability exactly as the .npy holds it, named after its class; the
    pixels not predicted (outside the mask) are NaN, the declared nodata; nothing is left beside it."""
    rasterio = pytest.importorskip("rasterio")
    from rasterio.crs import CRS

    src, store = _georeferenced_store(tmp_path, seed=4)
    mask = np.random.default_rng(11).random((H, W)) < 0.7
    kw = dict(patch_size=3, batch_size=40, device="cpu", mask=mask)
    predict(store, RandomConv(3, k=4), probabilities=tmp_path / "p.npy", **kw)
    predict(store, RandomConv(3, k=4), probabilities=tmp_path / "p.tif", **kw)
    want = np.load(tmp_path / "p.npy", allow_pickle=False)
    with rasterio.open(tmp_path / "p.tif") as ds:
        assert ds.count == 4 and ds.dtypes == ("float32",) * 4
        assert ds.crs == CRS.from_epsg(32616) and ds.transform == _gdal(src)[1]
        assert ds.descriptions == tuple(f"probability of class {k}" for k in range(1, 5))
        assert np.isnan(ds.nodata) and (ds.read_masks(1) == np.where(mask, 255, 0)).all()
        got = ds.read()
    np.testing.assert_array_equal(got.transpose(1, 2, 0), np.where(mask[..., None], want.astype(np.float32), np.nan))
    assert (want[~mask] == 0).all() and np.allclose(got[:, mask].sum(0), 1, atol=4e-3)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    with pytest.raises(InputError, match=r"written as .npy or a GeoTIFF \(.tif\); name the file p.npy or p.tif"):
        predict(store, RandomConv(3, k=4), probabilities=tmp_path / "p.png", **kw)
    # beside a GeoTIFF map, probabilities=True writes a GeoTIFF too
    predict(store, RandomConv(3, k=4), probabilities=True, out=tmp_path / "map.tif", **kw)
    with rasterio.open(tmp_path / "map.probabilities.tif") as ds:
        np.testing.assert_array_equal(ds.read().transpose(1, 2, 0), got.transpose(1, 2, 0))


@pytest.mark.parametrize("ignore", [False, True])
def test_a_pixel_is_point_source_gives_maps_at_its_ground_position(tmp_path, run_cli, ignore):
    """A GeoTIFF source whose coordinates name pixel centres (PixelIsPoint: rasterio's AREA_OR_POINT=Point), which
    GDAL reads half a pixel apart under GTIFF_POINT_GEO_IGNORE=TRUE. The map and the probabilities were written
    PixelIsArea on the store's corner grid, which GDAL reads alike under either setting: under TRUE (a user's
    environment) half a pixel off the source. Now they are PixelIsPoint too: written and read under the setting
    the source is read with, pixel (0, 0)'s centre is the source's."""
    rasterio = pytest.importorskip("rasterio")
    from rasterio.crs import CRS
    from rasterio.transform import Affine

    cube, _ = coordinate_cube(seed=14)
    src = tmp_path / "cube.tif"
    with rasterio.open(src, "w", driver="GTiff", height=H, width=W, count=B, dtype="int16",
                       crs=CRS.from_epsg(32616), transform=Affine(30, 0, 620000.5, 0, -30, 4000000.25)) as dst:
        dst.update_tags(AREA_OR_POINT="Point")
        dst.write(cube.transpose(2, 0, 1))
    store = convert(src, tmp_path / "s.zarr", ConvertOptions())
    with rasterio.Env(GTIFF_POINT_GEO_IGNORE=ignore):
        out = predict(store, RandomConv(3, k=4), patch_size=3, device="cpu", out=tmp_path / "map.tif",
                      probabilities=True)
        with rasterio.open(src) as ds:
            centre = ds.xy(0, 0)
        # the setting takes effect: the tiepoint (620015.5, 3999985.25) is the centre, or under TRUE the corner
        assert centre == (620015.5 + 15 * ignore, 3999985.25 - 15 * ignore)
        for written in ("map.tif", "map.probabilities.tif"):
            with rasterio.open(tmp_path / written) as ds:
                assert ds.xy(0, 0) == centre and ds.crs == CRS.from_epsg(32616), written
                assert ds.tags()["AREA_OR_POINT"] == "Point", written
                if ds.count == 1:
                    assert np.array_equal(ds.read(1), out)
    code, text, _ = run_cli("info", store)
    assert code == 0 and "origin (620000.5, 4000000.25), pixel 30 x -30; the source's coordinates name pixel " \
                          "centres (PixelIsPoint)" in text
    assert hsgds.open_scene(store).to_xarray().attrs["AREA_OR_POINT"] == "Point"


def test_envi_source_to_georeferenced_class_map(tmp_path):
    envi = pytest.importorskip("spectral.io.envi")
    cube, _ = coordinate_cube(seed=4)
    map_info = ["UTM", "1", "1", "500000.0", "4100000.0", "20.0", "20.0", "33", "North", "WGS-84", "units=Meters"]
    envi.save_image(str(tmp_path / "cube.hdr"), cube, metadata={"map info": map_info}, interleave="bil", ext=".img")
    store = convert(tmp_path / "cube.hdr", tmp_path / "s.zarr", ConvertOptions())
    out = predict(store, RandomConv(3), patch_size=3, device="cpu", out=tmp_path / "map.tif")
    crs, transform, data = _gdal(tmp_path / "map.tif")
    src_crs, src_transform, _ = _gdal(tmp_path / "cube.img")
    assert crs == src_crs and transform == src_transform and crs.to_epsg() == 32633
    assert np.array_equal(data, out)


#: a custom Lambert conformal conic CRS, known by its WKT alone (no EPSG code)
LCC_WKT = ('PROJCS["custom_lcc",GEOGCS["WGS 84",DATUM["WGS_1984",SPHEROID["WGS 84",6378137,298.257223563]],'
           'PRIMEM["Greenwich",0],UNIT["degree",0.0174532925199433]],PROJECTION["Lambert_Conformal_Conic_2SP"],'
           'PARAMETER["standard_parallel_1",33],PARAMETER["standard_parallel_2",45],PARAMETER["latitude_of_origin",23],'
           'PARAMETER["central_meridian",-96],PARAMETER["false_easting",0],PARAMETER["false_northing",0],UNIT["metre",1]]')


def _variant_source(tmp_path, variant):
    """The coordinate cube written as a georeference ``variant`` by its format's own library: a GeoTIFF by
    rasterio (GDAL), an ENVI image by SPy; returns (the file to convert, the file GDAL reads its grid from)."""
    rasterio = pytest.importorskip("rasterio")
    from rasterio.crs import CRS
    from rasterio.transform import Affine

    cube, _ = coordinate_cube(seed=14)
    if variant.startswith("envi"):
        envi = pytest.importorskip("spectral.io.envi")
        info = ["UTM", "1.5", "1.5", "500000.0", "4100000.0", "20.0", "20.0", "33", "North", "WGS-84",
                "units=Meters", "rotation=25"]  # reference: the first pixel's centre; a CRS in WKT alone (ESRI's)
        envi.save_image(str(tmp_path / "cube.hdr"), cube, interleave="bil", ext=".img", metadata={
            "map info": info, "coordinate system string": CRS.from_epsg(32633).to_wkt(version="WKT1_ESRI")})
        return tmp_path / "cube.hdr", tmp_path / "cube.img"
    transform, crs = {
        "rotated": (Affine.translation(1000, 5000) @ Affine.rotation(20) @ Affine.scale(30, -30), CRS.from_epsg(32616)),
        "point": (Affine(30, 0, 620000, 0, -30, 4000000), CRS.from_epsg(32616)),
        "wkt": (Affine(30, 0, 1000, 0, -30, 5000), CRS.from_wkt(LCC_WKT)),
        "sheared": (Affine(30, 5, 1000, 0, -30, 5000), CRS.from_epsg(32616))}[variant]
    src = tmp_path / "cube.tif"
    with rasterio.open(src, "w", driver="GTiff", height=H, width=W, count=B, dtype="int16", crs=crs,
                       transform=transform) as dst:
        if variant == "point":
            dst.update_tags(AREA_OR_POINT="Point")  # (GDAL writes the pixel centre's coordinates, PixelIsPoint)
        dst.write(cube.transpose(2, 0, 1))
    return src, src


@pytest.mark.parametrize("variant", ["rotated", "point", "wkt", "envi_rotated_wkt", "sheared"])
def test_every_output_is_on_the_sources_grid_as_gdal_reads_both(tmp_path, variant):
    """A rotated grid (GeoTIFF rotation terms, ENVI map info rotation=), a PixelIsPoint GeoTIFF, an ENVI map info
    referenced at a pixel centre, a CRS given only as WKT (a GeoTIFF's user-defined one, an ENVI coordinate
    system string): the GeoTIFF map, the probabilities GeoTIFF and the ENVI map (its .img, as GDAL's ENVI driver
    reads it) have the CRS and transform rasterio reads from the source. A sheared grid, which an ENVI map info
    cannot hold, made an ENVI map without any georeference: it is refused before any work, in one line."""
    src, grid = _variant_source(tmp_path, variant)
    store = convert(src, tmp_path / "s.zarr", ConvertOptions())
    src_crs, src_transform, _ = _gdal(grid)
    assert src_crs is not None
    outputs = ["map.tif", "map.probabilities.tif"]
    out = predict(store, RandomConv(3, k=3), patch_size=3, device="cpu", out=tmp_path / "map.tif", probabilities=True)
    if variant == "sheared":
        model = CentreCoordinates()
        with pytest.raises(InputError, match=r"^cannot write map\.hdr as an ENVI map: the store's grid is sheared "
                                             r"\(transform .*\); write a \.tif, which holds any grid$") as caught:
            predict(store, model, patch_size=3, device="cpu", normalize=None, out=tmp_path / "map.hdr")
        assert "\n" not in str(caught.value) and model.seen.sum() == 0
        assert not (tmp_path / "map.hdr").exists() and not (tmp_path / "map.img").exists()
    else:
        predict(store, RandomConv(3, k=3), patch_size=3, device="cpu", out=tmp_path / "map.hdr")
        outputs.append("map.img")
    for name in outputs:
        crs, transform, data = _gdal(tmp_path / name)
        assert crs == src_crs, (name, crs, src_crs)
        np.testing.assert_allclose(transform.to_gdal(), src_transform.to_gdal(), rtol=0, atol=1e-6, err_msg=name)
        if data is not None:
            assert np.array_equal(data, out), name


def test_prisma_l2d_source_to_georeferenced_class_map(tmp_path, run_cli):
    """A PRISMA L2D HE5 file (written by h5py in PRISMA's layout, its grid in root attributes: Epsg_Code and the
    centres of its corner pixels) converted and predicted with the commands: the map, as rasterio reads it, is in
    the file's EPSG code on the 30 m grid whose corner pixels are centred where the file says (the transform
    computed here from the attributes as h5py reads them), and `hsgds info` describes the source's grid as a
    GeoTIFF's."""
    rasterio = pytest.importorskip("rasterio")
    import h5py
    from rasterio.crs import CRS
    from rasterio.transform import Affine

    from tests.sensors import PRISMA_VNIR, write_prisma

    cube, _ = coordinate_cube(seed=7)
    swir, _ = coordinate_cube(b=4, seed=8)
    src = write_prisma(tmp_path / "PRS_L2D_STD_20231229050902_20231229050907_0001.he5", cube, swir,
                       [900.0 - 50 * i for i in range(B)], [2400.0, 2000.0, 1500.0, 1000.0])
    with h5py.File(src, "r") as f:
        epsg = int(f.attrs["Epsg_Code"])
        ul = float(f.attrs["Product_ULcorner_easting"]), float(f.attrs["Product_ULcorner_northing"])
        lr = float(f.attrs["Product_LRcorner_easting"]), float(f.attrs["Product_LRcorner_northing"])
    expected = Affine.translation(ul[0] - 15, ul[1] + 15) @ Affine.scale(30, -30)
    read = ("--key", PRISMA_VNIR, "--band-axis", "middle")
    code, out, err = run_cli("info", src, *read)
    assert code == 0 and (f"georef:     EPSG:{epsg}; origin ({ul[0] - 15:.10g}, {ul[1] + 15:.10g}), pixel 30 x -30\n"
                          in out), out + err
    code, _, err = run_cli("convert", src, *read, "-o", tmp_path / "p.zarr")
    assert code == 0 and "warning" not in err, err
    checkpoint, _ = _checkpoint(tmp_path, p=3)
    code, _, err = run_cli("predict", tmp_path / "p.zarr", "--model", checkpoint, "-o", tmp_path / "map.tif")
    assert code == 0, err
    with rasterio.open(tmp_path / "map.tif") as ds:
        assert ds.crs == CRS.from_epsg(epsg) and ds.transform == expected and ds.shape == (H, W)
        # the corner pixels' centres, as rasterio places them, are the file's corners
        assert ds.xy(0, 0) == ul and ds.xy(H - 1, W - 1) == lr


def test_an_output_naming_the_source_or_the_store_is_refused_and_nothing_changes(tmp_path, run_cli):
    """-o naming the cube a store was converted from (a GeoTIFF, an ENVI header whose .img would be replaced),
    its ground truth, or a path inside the store: refused before any work, the files byte for byte as they
    were. A file that only shares a source's name (a class map written earlier, in another folder) is
    replaced as any output is."""
    envi = pytest.importorskip("spectral.io.envi")
    src, tif_store = _georeferenced_store(tmp_path, seed=5)
    cube, labels = coordinate_cube(seed=6)
    envi.save_image(str(tmp_path / "e.hdr"), cube, interleave="bil", ext=".img")
    np.save(tmp_path / "gt.npy", labels)
    envi_store = convert(tmp_path / "e.hdr", tmp_path / "e.zarr", ConvertOptions(labels=tmp_path / "gt.npy"))
    before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    refused = [(tif_store, {"out": src}, "the source cube s.zarr was converted from"),
               (tif_store, {"out": tmp_path / "map.npy", "probabilities": src}, "the source cube"),
               (envi_store, {"out": tmp_path / "e.hdr"}, "the source cube e.zarr was converted from"),
               (envi_store, {"out": tmp_path / "gt.npy"}, "the ground truth e.zarr was converted from"),
               (envi_store, {"out": tmp_path / "e.zarr" / "map.npy"}, "it is inside the store")]
    for store, outputs, message in refused:
        with pytest.raises(InputError, match=message):
            predict(store, RandomConv(3), patch_size=3, device="cpu", **outputs)
    checkpoint, _ = _checkpoint(tmp_path, p=3)
    code, _, stderr = run_cli("predict", envi_store, "--model", checkpoint, "-o", tmp_path / "e.hdr")
    assert code == 2 and "it is the source cube e.zarr was converted from" in stderr, stderr
    assert {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and p != checkpoint} == before
    (tmp_path / "maps").mkdir()  # the source's name elsewhere: an earlier map, not the cube
    np.save(tmp_path / "maps" / "gt.npy", np.zeros((2, 2), np.uint8))
    for _ in range(2):  # (the second time the map there has the ground truth's size: its sha256 tells them apart)
        out = predict(envi_store, RandomConv(3), patch_size=3, device="cpu", out=tmp_path / "maps" / "gt.npy")
        assert np.array_equal(np.load(tmp_path / "maps" / "gt.npy"), out)
    assert (tmp_path / "maps" / "gt.npy").stat().st_size == (tmp_path / "gt.npy").stat().st_size
    # a header edited by hand since the conversion (its size changed): the binary still holds every pixel
    with open(tmp_path / "e.hdr", "a") as f:
        f.write("description = {edited}\n")
    img = (tmp_path / "e.img").read_bytes()
    with pytest.raises(InputError, match="the source cube e.zarr was converted from"):
        predict(envi_store, RandomConv(3), patch_size=3, device="cpu", out=tmp_path / "e.hdr")
    assert (tmp_path / "e.img").read_bytes() == img


def test_an_output_naming_envi_ground_truth_is_refused_whichever_file_was_given(tmp_path):
    """Ground truth given as an ENVI header or as its binary (written by hand): the store records both files,
    and -o naming the header (whose binary the map would replace) is refused, the files as they were."""
    from tests.envi import write_envi_labels

    cube, labels = coordinate_cube(seed=7)
    np.save(tmp_path / "c.npy", cube)
    hdr = write_envi_labels(tmp_path / "gt.hdr", labels)
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    for given in (hdr, tmp_path / "gt.img"):
        store = convert(tmp_path / "c.npy", tmp_path / f"{given.suffix[1:]}.zarr", ConvertOptions(labels=given))
        assert hsgds.open_scene(store).meta.labels_source["files"] == ["gt.img", "gt.hdr"]
        with pytest.raises(InputError, match=f"the ground truth {store.name} was converted from"):
            predict(store, RandomConv(3), patch_size=3, device="cpu", out=hdr)
    assert {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_ground_truth_changed_since_conversion_is_still_refused_by_its_path(tmp_path, run_cli):
    """The guard recognised ground truth by the sha256 over its files: once the ENVI header (or binary) was
    edited after the conversion, `hsgds predict -o gt.hdr` wrote over it. The store records where the files
    lay (their resolved paths relative to the store's folder, read here with zarr-python), and a path match
    needs no content, also once the project folder moved whole. A store written before (no paths) still
    recognises ground truth as converted, by name and sha256."""
    import json
    import shutil

    import zarr

    from tests.envi import write_envi_labels

    cube, labels = coordinate_cube(seed=8)
    np.save(tmp_path / "c.npy", cube)
    hdr = write_envi_labels(tmp_path / "gt.hdr", labels)
    store = convert(tmp_path / "c.npy", tmp_path / "s.zarr", ConvertOptions(labels=hdr))
    record = zarr.open_group(store, mode="r").attrs["hsgds"]["labels_source"]
    assert record["paths"] == ["gt.img", "gt.hdr"]
    checkpoint, _ = _checkpoint(tmp_path, p=3)
    with open(hdr, "a") as f:  # edited by hand since the conversion
        f.write("description = {edited}\n")
    before = {p: p.read_bytes() for p in (hdr, tmp_path / "gt.img")}
    (tmp_path / "link").symlink_to(tmp_path, target_is_directory=True)
    for out in (hdr, tmp_path / "link" / "gt.hdr"):  # (-o gt.hdr writes gt.img too)
        code, stdout, err = run_cli("predict", store, "--model", checkpoint, "-o", out)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"hsgds: error: cannot write {out}: it is the ground truth s.zarr was converted "
                              "from; writing there would destroy it"), err
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("s.zarr", "gt.img", "gt.hdr"):
        (shutil.copytree if name.endswith(".zarr") else shutil.copy)(tmp_path / name, moved / name)
    with pytest.raises(InputError, match="it is the ground truth s.zarr was converted from"):
        predict(moved / "s.zarr", RandomConv(3), patch_size=3, device="cpu", out=moved / "gt.hdr")
    (tmp_path / "gt.img").write_bytes(np.zeros_like(labels).tobytes())  # the binary too: nothing matches now
    before[tmp_path / "gt.img"] = (tmp_path / "gt.img").read_bytes()
    with pytest.raises(InputError, match="it is the ground truth s.zarr was converted from"):
        predict(store, RandomConv(3), patch_size=3, device="cpu", out=hdr)
    assert {p: p.read_bytes() for p in before} == before
    # an older store, without paths: the ground truth as converted is refused (by name and sha256)
    write_envi_labels(hdr, labels)
    doc = json.loads((store / "zarr.json").read_text())
    del doc["attributes"]["hsgds"]["labels_source"]["paths"]
    (store / "zarr.json").write_text(json.dumps(doc))
    assert "paths" not in hsgds.open_scene(store).meta.labels_source
    with pytest.raises(InputError, match="it is the ground truth s.zarr was converted from"):
        predict(store, RandomConv(3), patch_size=3, device="cpu", out=hdr)


def test_a_collection_pattern_naming_its_sources_is_refused_before_any_scene(tmp_path, run_cli):
    """-o raw/{name}.tif where the scenes were converted from raw/<name>.tif: exit 2 naming the scene, before
    any scene is predicted (not each scene failing in turn, with advice to run the same command again)."""
    rasterio = pytest.importorskip("rasterio")
    from hsgds.preprocess.convert_many import convert_many

    raw = tmp_path / "raw"
    raw.mkdir()
    for i, name in enumerate(("a", "b")):
        cube, _ = coordinate_cube(seed=20 + i)
        with rasterio.open(raw / f"{name}.tif", "w", driver="GTiff", height=H, width=W, count=B, dtype="int16",
                           crs="EPSG:32616", transform=rasterio.Affine(30, 0, 6e5, 0, -30, 4e6)) as dst:
            dst.write(cube.transpose(2, 0, 1))
    (tmp_path / "m.csv").write_text("source\nraw/a.tif\nraw/b.tif\n")
    convert_many(tmp_path / "m.csv", tmp_path / "coll", ConvertOptions(max_patch=5), workers=1)
    before = {p.name: p.read_bytes() for p in raw.iterdir()}
    checkpoint, _ = _checkpoint(tmp_path, p=3)
    code, out, err = run_cli("predict", tmp_path / "coll", "--model", checkpoint, "-o", raw / "{name}.tif")
    assert code == 2 and err.strip().splitlines()[-1].startswith(
        f"hsgds: error: a: cannot write {raw / 'a.tif'}: it is the source cube a.zarr was converted from"), err
    assert "wrote" not in out and {p.name: p.read_bytes() for p in raw.iterdir()} == before


def test_an_output_naming_the_model_file_or_the_other_output_is_refused(store, tmp_path, run_cli):
    """The model file is an input of the run too: a checkpoint named model.npy (any name loads) was replaced by
    `-o model.npy` after it was read. Refused as -o or --probabilities, as is -o equal to --probabilities: exit 2,
    one line, nothing written, the model's bytes as they were."""
    from hsgds.models import SpectralSpatialCNN, load_model, save_checkpoint

    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "model.npy", SpectralSpatialCNN(B, 4, 5, reduce=4, width=8), patch_size=5)
    before = ckpt.read_bytes()
    refused = [(("-o", ckpt), f"cannot write {ckpt}: it is the model file model.npy this run reads; choose another "
                              "output path"),
               (("-o", tmp_path / "map.npy", "--probabilities", ckpt), f"cannot write {ckpt}: it is the model file"),
               (("-o", tmp_path / "map.npy", "--probabilities", tmp_path / "map.npy"),
                f"probabilities and the class map would both be written to {tmp_path / 'map.npy'}")]
    for args, message in refused:
        code, _, err = run_cli("predict", store, "--model", ckpt, *args)
        assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith(f"hsgds: error: {message}"), err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model.npy"] and ckpt.read_bytes() == before
    for model in (ckpt, load_model(ckpt)):  # the API, given the file or the model loaded from it
        with pytest.raises(InputError, match="it is the model file model.npy this run reads"):
            predict(store, model, device="cpu", out=ckpt)
    assert ckpt.read_bytes() == before


def test_predict_errors_name_the_command_line_options(store, tmp_path, run_cli):
    """A library error about a parameter that an option of `hsgds predict` sets is said with the option
    (--batch-size, --device), not the Python parameter (batch_size, device=) the user never typed; over a
    collection once, before any scene (it was a failure per scene, exit 1, in the parameter's words)."""
    import shutil

    from hsgds.collection import SceneEntry, write_collection
    from hsgds.models import SpectralSpatialCNN, save_checkpoint
    from hsgds.scene import open_scene

    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "m.ckpt", SpectralSpatialCNN(B, 4, 5, reduce=4, width=8), patch_size=5)
    coll = tmp_path / "coll"
    coll.mkdir()
    for name in ("north", "south"):
        shutil.copytree(store, coll / f"{name}.zarr")
    write_collection(coll, [SceneEntry.of_scene(n, open_scene(coll / f"{n}.zarr")) for n in ("north", "south")])
    for args, message in ((("--batch-size", "0"), "--batch-size must be an integer >= 1, got 0"),
                          (("--device", "gpu9"), "--device 'gpu9' is not a device; use 'auto', 'cpu', 'cuda' or "
                                                 "'cuda:N'")):
        code, _, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "map.npy", *args)
        assert code == 2 and err == f"hsgds: error: {message}\n", err
        code, out, err = run_cli("predict", coll, "--model", ckpt, "-o", tmp_path / "{name}.npy", *args)
        assert code == 2 and err == f"hsgds: error: {message}\n", err
    assert not list(tmp_path.glob("*.npy"))
    with pytest.raises(ConfigError, match="^batch_size must be an integer >= 1, got 0$"):  # the API's own words
        predict(store, ckpt, device="cpu", batch_size=0)


def test_a_collection_map_naming_another_scenes_source_is_refused_before_any_scene(tmp_path, run_cli):
    """Each scene's outputs were compared with its own inputs only: with scene x converted from raw/y.npy and
    scene y from raw/z.npy, -o raw/{name}.npy wrote x's map and then y's over raw/y.npy, x's source. Every
    output is compared with every scene's store, source and ground truth: exit 2 naming the scene, before any
    scene is predicted."""
    from hsgds.preprocess.convert_many import convert_many

    raw = tmp_path / "raw"
    raw.mkdir()
    for i, name in enumerate(("y", "z")):
        cube, labels = coordinate_cube(seed=30 + i)
        np.save(raw / f"{name}.npy", cube)
        np.save(raw / f"gt_{name}.npy", labels)
    (tmp_path / "m.csv").write_text("source,labels,name\nraw/y.npy,raw/gt_y.npy,x\nraw/z.npy,,y\n")
    convert_many(tmp_path / "m.csv", tmp_path / "coll", ConvertOptions(max_patch=5), workers=1)
    before = {p.name: p.read_bytes() for p in raw.iterdir()}
    checkpoint, _ = _checkpoint(tmp_path, p=3)
    code, out, err = run_cli("predict", tmp_path / "coll", "--model", checkpoint, "-o", raw / "{name}.npy")
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"hsgds: error: y: cannot write {raw / 'y.npy'}: it is the source cube x.zarr was converted from; "
        "writing there would destroy it: choose another output path"), err
    code, out, err = run_cli("predict", tmp_path / "coll", "--model", checkpoint, "-o", tmp_path / "{name}.npy",
                             "--probabilities", raw / "gt_{name}.npy")
    assert code == 2 and err.strip().splitlines()[-1].startswith(
        f"hsgds: error: y: cannot write {raw / 'gt_y.npy'}: it is the ground truth x.zarr was converted from"), err
    assert "wrote" not in out and {p.name: p.read_bytes() for p in raw.iterdir()} == before
    assert not list(tmp_path.glob("*.npy"))
    code, out, err = run_cli("predict", tmp_path / "coll", "--model", checkpoint, "-o", tmp_path / "{name}.npy")
    assert code == 0 and sorted(p.name for p in tmp_path.glob("*.npy")) == ["x.npy", "y.npy"], err


def test_an_enmap_image_whose_metadata_file_was_deleted_is_still_refused(tmp_path, run_cli):
    """An EnMAP store records the image and its METADATA.XML as its source files; once the XML was deleted the
    image was no longer recognised (the files beside it no longer matched) and `-o IMAGE.TIF` replaced it. The
    store records where its source files lay (as the ground truth's: relative to its folder, read here with
    zarr-python), and a file there is refused whatever is left beside it; a store without those paths (an
    older one, or one moved without its sources) still recognises the image by its name and size."""
    import json
    import shutil

    import zarr

    from tests.sensors import enmap_xml, write_enmap

    cube, _ = coordinate_cube(seed=9)
    image = write_enmap(tmp_path, cube, enmap_xml([str(450 + 10 * i) for i in range(B)]))
    xml = next(tmp_path.glob("*-METADATA.XML"))
    store = convert(image, tmp_path / "e.zarr", ConvertOptions())
    record = zarr.open_group(store, mode="r").attrs["hsgds"]["source"]
    assert record["files"] == record["paths"] == [image.name, xml.name]
    xml.unlink()
    checkpoint, _ = _checkpoint(tmp_path, p=3)
    before = image.read_bytes()
    code, out, err = run_cli("predict", store, "--model", checkpoint, "-o", image)
    assert code == 2 and err == (f"hsgds: error: cannot write {image}: it is the source cube e.zarr was converted "
                                 "from; writing there would destroy it: choose another output path\n"), err
    assert image.read_bytes() == before and not image.with_name(image.name + ".aux.xml").exists()
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    shutil.copytree(store, moved / "e.zarr")  # the store alone: its recorded paths now name nothing
    doc = json.loads((store / "zarr.json").read_text())
    del doc["attributes"]["hsgds"]["source"]["paths"]  # as an older store
    (store / "zarr.json").write_text(json.dumps(doc))
    for s in (store, moved / "e.zarr"):
        with pytest.raises(InputError, match="it is the source cube e.zarr was converted from"):
            predict(s, RandomConv(3), patch_size=3, device="cpu", out=image)
    assert image.read_bytes() == before


# -- the command ---------------------------------------------------------------------------------------------

#: torch's seed for _checkpoint's model: most seeds make a freshly initialised SpectralSpatialCNN map every pixel
#: of these scenes to one class whatever its input (seed 0: class 1), so that a map compared with it could not
#: tell one input or option from another (`hsgds predict --tta` ignored passed); with this one the map holds
#: two classes and test-time augmentation changes some pixels (checked where it matters)
MODEL_SEED = 28


def _checkpoint(tmp_path, bands=B, classes=4, p=5):
    from hsgds.models import SpectralSpatialCNN, save_checkpoint

    torch.manual_seed(MODEL_SEED)
    model = SpectralSpatialCNN(bands, classes, p, reduce=4, width=8)
    return save_checkpoint(tmp_path / "model.ckpt", model, patch_size=p, class_names=["a", "b", "c", "d"]), model


def test_cli_predict_names_a_read_only_output_folder_before_predicting(store, tmp_path):
    """A folder the map cannot be written to is named up front, in one line (it was found only when the
    finished map was written: after the whole inference)."""
    import os
    import shutil
    import subprocess
    import sys

    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permissions cannot be enforced")
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    ckpt, _ = _checkpoint(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        proc = subprocess.run([*prefix, sys.executable, "-m", "hsgds.cli", "predict", str(store), "--model", str(ckpt),
                               "-o", str(ro / "map.npy"), "--device", "cpu"], capture_output=True, text=True, timeout=120)
    finally:
        ro.chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"hsgds: error: cannot write {ro / 'map.npy'}: the folder {ro} is not "
                                                "writable (Permission denied); choose another output path"]
    assert os.listdir(ro) == []


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal for stderr needs POSIX")
def test_cli_predict_draws_a_progress_bar_on_a_terminal(store, tmp_path):
    """On a terminal (stderr is a pseudo-terminal here) the command shows how far the scene is, ending at 100%."""
    import pty
    import subprocess

    ckpt, _ = _checkpoint(tmp_path)
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "hsgds.cli", "predict", str(store), "--model", str(ckpt), "-o",
                               str(tmp_path / "map.npy"), "--device", "cpu", "--batch-size", "100"],
                              stdout=subprocess.PIPE, stderr=follower, text=True, timeout=120)
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # the terminal's other end is closed and drained
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    assert proc.returncode == 0
    text = shown.decode(errors="replace")
    assert f"{os.path.basename(store)} pixels" in text and "100%" in text, text
    assert "pixels done" not in text, text  # a batch job's log lines are for a stderr that is not a terminal
    assert "wrote" in proc.stdout and (tmp_path / "map.npy").is_file()


def test_cli_predict_with_a_checkpoint_and_an_exported_program(store, tmp_path, run_cli):
    ckpt, model = _checkpoint(tmp_path)
    code, out, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "a.npy", "--batch-size", "77",
                             "--probabilities", tmp_path / "p.npy")
    assert code == 0, err
    assert "normalize:  zscore, with each scene's own train statistics" in out  # said, as the model carries none
    a = np.load(tmp_path / "a.npy", allow_pickle=False)
    assert np.array_equal(a, predict(store, model, patch_size=5, device="cpu"))
    assert len(np.unique(a)) > 1  # a map that can tell the options below apart
    assert np.load(tmp_path / "p.npy", allow_pickle=False).shape == (H, W, 4)
    model.eval()
    program = torch.export.export(model, (torch.randn(8, B, 5, 5),),
                                  dynamic_shapes=({0: torch.export.Dim("n", min=1, max=1 << 20)},))
    torch.export.save(program, tmp_path / "m.pt2")
    code, out, err = run_cli("predict", store, "--model", tmp_path / "m.pt2", "-o", tmp_path / "b.npy")
    assert code == 0, err
    assert np.array_equal(np.load(tmp_path / "b.npy", allow_pickle=False), a)
    # the same program under another name is still read as a program, not as a checkpoint
    (tmp_path / "m.pt").write_bytes((tmp_path / "m.pt2").read_bytes())
    code, out, err = run_cli("predict", store, "--model", tmp_path / "m.pt", "-o", tmp_path / "c.npy")
    assert code == 0, err
    assert np.array_equal(np.load(tmp_path / "c.npy", allow_pickle=False), a)
    code, out, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "t.npy", "--tta")
    assert code == 0, err
    tta = np.load(tmp_path / "t.npy", allow_pickle=False)
    assert np.array_equal(tta, predict(store, model, patch_size=5, device="cpu", tta=True))
    assert (tta != a).any()  # --tta changed the map (before, a map of one class passed with --tta ignored)


def test_cli_predict_says_in_one_line_which_characters_of_a_png_maps_names_the_font_lacks(store, tmp_path):
    """A model whose class names are CJK, which matplotlib's default font lacks: `hsgds predict -o m.png` printed
    two lines of matplotlib's UserWarning per character (and drawing) on stderr; it prints one hsgds warning line
    naming them, and writes the map."""
    import subprocess

    from matplotlib.font_manager import FontProperties, findfont
    from matplotlib.ft2font import FT2Font

    from hsgds.models import SpectralSpatialCNN, save_checkpoint

    font = FT2Font(findfont(FontProperties()))  # the font matplotlib draws with, and its own character map
    if 0x571F in font.get_charmap():
        pytest.skip(f"matplotlib's default font {font.family_name} draws CJK")
    torch.manual_seed(MODEL_SEED)
    model = SpectralSpatialCNN(B, 4, 5, reduce=4, width=8)
    ckpt = save_checkpoint(tmp_path / "model.ckpt", model, patch_size=5, class_names=[f"土 {c}" for c in "abcd"])
    proc = subprocess.run([sys.executable, "-m", "hsgds.cli", "predict", str(store), "--model", str(ckpt), "-o",
                           str(tmp_path / "m.png"), "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Glyph" not in proc.stderr and "UserWarning" not in proc.stderr, proc.stderr
    assert [line for line in proc.stderr.splitlines() if "warning" in line] == [
        f"hsgds: warning: the names drawn in m.png hold characters the font ({font.family_name}) lacks: '土'; they "
        "show as boxes (name a font that has them first in matplotlib's font.sans-serif, e.g. in a matplotlibrc)"]
    assert (tmp_path / "m.png").stat().st_size > 0


def test_cli_predict_scores_the_map_on_the_stores_test_split(store, tmp_path, run_cli):
    """On a labelled store the command scores the map on its test split, the numbers numpy gives from the
    samples zarr-python reads; masked-out or unlabelled-only stores print no score."""
    import re

    import zarr

    ckpt, _ = _checkpoint(tmp_path)
    code, out, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "a.npy")
    assert code == 0, err
    classmap = np.load(tmp_path / "a.npy")
    g = zarr.open_group(store, mode="r")
    y, x = g["samples/y"][...], g["samples/x"][...]
    tile = g["samples/tile"][...]
    t, ntx = 18, -(-W // 18)
    sy, sx = (tile // ntx) * t + y, (tile % ntx) * t + x  # tile-local to scene coordinates
    test = g["samples/split"][...] == 3  # (docs/format.md: 3 test)
    truth, pred = g["labels"][...][sy[test], sx[test]], classmap[sy[test], sx[test]]
    oa = np.mean(truth == pred)
    classes = np.unique(truth)
    aa = np.mean([np.mean(pred[truth == c] == c) for c in classes])
    chance = sum(np.mean(truth == c) * np.mean(pred == c) for c in range(1, 5))
    kappa = (oa - chance) / (1 - chance)
    line = re.search(r"^test split: (\d+) pixels of the store's labels: OA ([\d.]+)%, AA ([\d.]+)%, kappa (-?[\d.]+)$",
                     out, re.M)
    assert line, out
    assert int(line[1]) == test.sum()
    assert (float(line[2]), float(line[3]), float(line[4])) == (round(100 * oa, 2), round(100 * aa, 2), round(kappa, 4))
    unlabelled = convert(os.path.join(os.path.dirname(store), "cube.npy"), tmp_path / "u.zarr", ConvertOptions(tile=18, max_patch=15))
    code, out, err = run_cli("predict", unlabelled, "--model", ckpt, "-o", tmp_path / "u.npy")
    assert code == 0 and "wrote" in out and "test split" not in out, out + err


def test_cli_predict_gives_aa_over_the_trained_classes_of_a_mask_split(tmp_path, run_cli):
    """A mask split leaving class 3 without train pixels (test only) and class 4 without test pixels: the
    command's AA is numpy's over the 4 classes with test pixels, as before, and a second number is numpy's
    over the 3 of them that had train pixels, naming the class scored but never trained on and the class
    without test pixels. (Before, AA was the only number, with the untrained class's guaranteed error in it.)"""
    import re

    from hsgds.models import SpectralSpatialCNN, save_checkpoint
    from hsgds.scene import open_scene

    rng = np.random.default_rng(11)
    cube = rng.integers(0, 1000, (H, W, B)).astype(np.int16)
    labels = rng.integers(0, 6, (H, W)).astype(np.uint8)  # classes 1..5, 0 unlabelled
    draw = rng.random((H, W))
    train = (labels > 0) & (draw < 0.3) & (labels != 3)
    test = (labels > 0) & ~train & (labels != 4)
    for name, a in (("cube", cube), ("gt", labels), ("train", train.astype(np.uint8)), ("test", test.astype(np.uint8))):
        np.save(tmp_path / f"{name}.npy", a)
    names = ["a", "b", "c", "d", "e"]
    with pytest.warns(UserWarning, match="mask split: classes 3 .* 4 .* missing from some split"):
        store = convert(tmp_path / "cube.npy", tmp_path / "m.zarr",
                        ConvertOptions(labels=tmp_path / "gt.npy", tile=18, max_patch=15, split="masks",
                                       train_mask=tmp_path / "train.npy", test_mask=tmp_path / "test.npy",
                                       class_names=names))
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "model.ckpt", SpectralSpatialCNN(B, 5, 5, reduce=4, width=8), patch_size=5,
                           class_names=names)
    code, out, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "map.npy")
    assert code == 0, err
    pred = np.load(tmp_path / "map.npy")[test]
    truth = labels[test]
    assert open_scene(store).samples("test")[2].size == test.sum()  # the store holds the masks' split
    recall = {c: np.mean(pred[truth == c] == c) for c in (1, 2, 3, 5)}
    line = re.search(r"^test split: (\d+) pixels of the store's labels: OA ([\d.]+)%, AA ([\d.]+)%, kappa", out, re.M)
    assert line and int(line[1]) == test.sum(), out
    assert float(line[3]) == round(100 * np.mean(list(recall.values())), 2)
    assert "test split: AA averages 4 of 5 classes; class 4 (d) has no test pixels" in out, out
    trained = re.search(r"^test split: AA over the 3 trained classes ([\d.]+)%; class 3 \(c\) has no train pixels in "
                        r"the store's split: scored, never trained on$", out, re.M)
    assert trained, out
    assert float(trained[1]) == round(100 * np.mean([recall[c] for c in (1, 2, 5)]), 2)


@pytest.mark.parametrize("tta", [False, True])
def test_float64_logits_past_float32s_range_give_their_softmax(store, tmp_path, tta):
    """A float64 model's logits were cast to float32 for the softmax: those past float32's largest value
    (3.4e38) became inf and their probabilities NaN, in a file otherwise valid (and in a probabilities
    GeoTIFF, NaN is nodata: a predicted pixel showed as never predicted). The softmax is taken in float64 (with
    tta too: every variant has the centre's logits, and the mean of 8 equal probabilities is that probability)."""
    rng = np.random.default_rng(3)
    table = torch.from_numpy(rng.normal(0, 1e39, (H * W, 3)))  # (float64: past float32's range)
    model = lambda_module(lambda x: table[(x[:, 0, 1, 1].round().long() * W + x[:, 1, 1, 1].round().long())])
    out = predict(store, model, patch_size=3, device="cpu", dtype=torch.float64, normalize=None, tta=tta,
                  out=tmp_path / "m.npy", probabilities=tmp_path / "p.npy")
    probs = np.load(tmp_path / "p.npy")
    want = torch.softmax(table, dim=1).reshape(H, W, 3).to(torch.float16).numpy()
    np.testing.assert_array_equal(probs, want)
    np.testing.assert_array_equal(out, table.argmax(1).reshape(H, W).numpy() + 1)


def test_a_model_file_runs_in_the_dtype_asked_for(store, tmp_path):
    """dtype= with a model file: the patches were cut in that dtype but the module loaded from the file stayed
    float32, so every dtype but float32 failed on the first batch ("Input type (double) and bias type (float)
    should be the same; check that it takes 8 bands"). The module now runs in the patches' dtype: float64 gives
    the map of the model in float64 over PatchLoader's float64 batches."""
    import copy

    ckpt, model = _checkpoint(tmp_path, p=3)
    model.eval()
    torch.export.save(torch.export.export(model, (torch.randn(8, B, 3, 3),),
                                          dynamic_shapes=({0: torch.export.Dim("n")},)), tmp_path / "m.pt2")
    reference = np.zeros((H, W), np.int64)
    double = copy.deepcopy(model).double()
    with hsgds.PatchLoader(store, patch_size=3, batch_size=100, pixels="all", split=None, shuffle=False,
                           return_coords=True, device="cpu", dtype=torch.float64) as loader, torch.inference_mode():
        for x, _, yx in loader:
            reference[yx[:, 0], yx[:, 1]] = double(x).argmax(1).numpy() + 1
    for path in (ckpt, tmp_path / "m.pt2"):
        np.testing.assert_array_equal(predict(store, path, device="cpu", dtype=torch.float64), reference)
        for dtype in (torch.float16, "bfloat16"):  # (rounded patches: a few pixels may change class)
            assert (predict(store, path, device="cpu", dtype=dtype) == reference).mean() > 0.9


def test_a_program_of_a_fixed_batch_size_gets_its_last_batch_padded(store, tmp_path, run_cli):
    """torch.export without dynamic_shapes fixes the batch size: every batch is that size, the last one (37 x 29
    = 1073 pixels = 67 x 16 + 1) padded, and the padding's outputs dropped; another batch size is refused."""
    ckpt, model = _checkpoint(tmp_path)
    model.eval()
    torch.export.save(torch.export.export(model, (torch.randn(16, B, 5, 5),)), tmp_path / "fixed.pt2")
    reference = predict(store, model, patch_size=5, device="cpu", batch_size=50)
    assert np.array_equal(predict(store, tmp_path / "fixed.pt2", device="cpu"), reference)
    assert np.array_equal(predict(store, tmp_path / "fixed.pt2", device="cpu", tta=True),
                          predict(store, model, patch_size=5, device="cpu", tta=True))
    with pytest.raises(ConfigError, match="takes batches of exactly 16 patches .*dynamic_shapes"):
        predict(store, tmp_path / "fixed.pt2", device="cpu", batch_size=32)
    code, out, err = run_cli("predict", store, "--model", tmp_path / "fixed.pt2", "-o", tmp_path / "f.npy")
    assert code == 0 and "batches of exactly 16 (fixed at export)" in out, err
    assert np.array_equal(np.load(tmp_path / "f.npy", allow_pickle=False), reference)
    # the program's module passed itself: not padded, so said how to feed it (not "check the bands")
    module = torch.export.load(tmp_path / "fixed.pt2").module()
    for batch_size in (None, 16):  # 16: the last batch (1073 = 67 x 16 + 1) fails
        with pytest.raises(InputError, match=r"x.size\(\)\[0\] == 16.*it takes batches of exactly 16 patches "
                                             r"\(fixed at export\): pass its .pt2 file"):
            predict(store, module, patch_size=5, device="cpu", batch_size=batch_size)


def test_a_program_of_a_bounded_batch_size_is_fed_batches_in_its_range(store, tmp_path):
    """A program exported with Dim("n", min=16, max=64): the default batch size is cut to 64 (it failed on the
    first batch of 1024), a last batch under 16 is padded (it failed after the whole scene: 1073 = 67 x 16 + 1),
    and a batch size outside the range is refused before any work."""
    _, model = _checkpoint(tmp_path)
    model.eval()
    n = torch.export.Dim("n", min=16, max=64)
    program = torch.export.export(model, (torch.randn(32, B, 5, 5),), dynamic_shapes=({0: n},))
    torch.export.save(program, tmp_path / "bounded.pt2")
    reference = predict(store, model, patch_size=5, device="cpu", batch_size=50)
    for batch_size in (None, 16, 64):
        assert np.array_equal(predict(store, tmp_path / "bounded.pt2", device="cpu", batch_size=batch_size), reference)
    for batch_size in (8, 128):
        with pytest.raises(ConfigError, match=rf"takes batches of 16 to 64 patches \(bounded at export\), not "
                                              rf"{batch_size}; pass a batch size in that range"):
            predict(store, tmp_path / "bounded.pt2", device="cpu", batch_size=batch_size, out=tmp_path / "m.npy")
    assert not (tmp_path / "m.npy").exists()


def test_a_model_failing_on_a_later_batch_is_one_line(store):
    class FailsLater(RandomConv):
        calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("out of\nmemory")
            return super().forward(x)

    with pytest.raises(InputError, match=r"the model failed on a \(64, 8, 5, 5\) .*RuntimeError: out of memory\); "
                                         "after 128 pixels were predicted"):
        predict(store, FailsLater(5), patch_size=5, batch_size=64, device="cpu")


def test_a_model_out_of_memory_is_told_to_take_smaller_batches(store, tmp_path, run_cli, monkeypatch):
    """A model running out of memory (CUDA's OutOfMemoryError, or the host's MemoryError) on the first batch was
    told to "check that it takes 8 bands and 5x5 patches", which it does: it is told to take smaller batches,
    in the API's words and the command's (exit 2, one line, nothing written)."""
    from hsgds.models import load_model

    class OutOfMemory(nn.Module):
        def __init__(self, module, error):
            super().__init__()
            self.module, self.error = module, error

        def forward(self, x):
            if x.shape[0] > 16:
                raise self.error("CUDA out of memory. Tried to allocate 20.00 GiB")
            return self.module(x)

    for error in (torch.OutOfMemoryError, MemoryError):
        with pytest.raises(InputError, match=rf"the model failed on a \(64, 8, 5, 5\) .*\({error.__name__}: CUDA out of "
                                             r"memory\. Tried to allocate 20\.00 GiB\); it ran out of memory on 64 "
                                             r"patches at once: pass a smaller batch_size \(e\.g\. 16\)$"):
            predict(store, OutOfMemory(RandomConv(5), error), patch_size=5, batch_size=64, device="cpu")
    ckpt, _ = _checkpoint(tmp_path)
    loaded = load_model(ckpt)
    loaded = dataclasses.replace(loaded, module=OutOfMemory(loaded.module, torch.OutOfMemoryError))
    with pytest.raises(InputError, match=r"pass a smaller batch_size \(e\.g\. 256\)$"):
        predict(store, loaded, device="cpu")  # (default batch_size: 1024 patches)
    monkeypatch.setattr(hsgds.models, "load_model", lambda *a, **k: loaded)  # (the command loads the file itself)
    code, _, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "m.npy", "--device", "cpu")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.strip().endswith("it ran out of memory on 1024 patches at once: pass a smaller --batch-size (e.g. "
                                "256)"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]


def test_a_model_changing_its_output_on_a_later_batch_is_one_line(tmp_path, store):
    """Every batch's logits are checked, not only the first's: more classes later would be cut to the map's
    uint8 (class 300 read as 44) or fail deep in the probabilities file; a bool or complex output has no
    argmax. One line, nothing written."""

    class MoreClassesLater(nn.Module):
        calls = 0

        def forward(self, x):
            self.calls += 1
            return torch.zeros(x.shape[0], 4 if self.calls == 1 else 300)

    for probabilities in (False, tmp_path / "p.npy"):
        with pytest.raises(InputError, match=r"the model returned \(100, 300\) for 100 patches after returning "
                                             r"4 logits per pixel; it must return the same K for every batch"):
            predict(store, MoreClassesLater(), patch_size=3, batch_size=100, device="cpu",
                    out=tmp_path / "m.npy", probabilities=probabilities)

    class Returns(nn.Module):
        def __init__(self, dtype):
            super().__init__()
            self.dtype = dtype

        def forward(self, x):
            return torch.ones(x.shape[0], 3, dtype=self.dtype)

    for dtype in (torch.bool, torch.complex64):
        with pytest.raises(InputError, match=rf"the model returned {dtype} logits; it must return real numbers"):
            predict(store, Returns(dtype), patch_size=3, device="cpu", out=tmp_path / "m.npy")
    assert list(tmp_path.iterdir()) == []


def test_tta_feeds_contiguous_variants_and_names_a_failing_variant_in_one_line(store):
    """A model that works on the loader's batches works under tta too: the quarter-turned variants are
    contiguous (a transposed view broke x.view(n, -1)); a model failing on a variant is one line."""

    class Flat(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc = nn.Linear(B * 9, 4)

        def forward(self, x):
            return self.fc(x.view(x.shape[0], -1))

    assert predict(store, Flat(), patch_size=3, device="cpu", tta=True).shape == (H, W)

    class FailsOnAVariant(RandomConv):
        calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 5:
                raise RuntimeError("out of memory")
            return super().forward(x)

    with pytest.raises(InputError, match=r"the model failed on a \(64, 8, 3, 3\) .*RuntimeError: out of memory\); "
                                         "after 0 pixels were predicted"):
        predict(store, FailsOnAVariant(3), patch_size=3, batch_size=64, device="cpu", tta=True)


def test_tta_at_patch_size_1_calls_the_model_once_per_batch(store, tmp_path):
    """The 8 dihedral variants of a 1x1 patch are the patch itself: tta=True ran the model 8 times on the same
    input. It runs once per batch now, and gives what tta=False gives (map and probabilities)."""

    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(1)
            self.fc = nn.Linear(B, 5)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return self.fc(x.flatten(1))

    model = Counting()
    batches = -(-H * W // 100)  # every pixel, 100 a batch
    tta = predict(store, model, patch_size=1, batch_size=100, device="cpu", tta=True,
                  probabilities=tmp_path / "tta.npy")
    assert model.calls == batches
    plain = predict(store, model, patch_size=1, batch_size=100, device="cpu", probabilities=tmp_path / "plain.npy")
    assert model.calls == 2 * batches
    np.testing.assert_array_equal(tta, plain)
    np.testing.assert_array_equal(np.load(tmp_path / "tta.npy"), np.load(tmp_path / "plain.npy"))
    # the reference: the model on every pixel's spectrum, normalized as the loader does (z-score by the train
    # split's statistics)
    offset, scale = hsgds.normalization_constants(hsgds.open_scene(store), "zscore")
    cube = np.load(store.parent / "cube.npy").astype(np.float64)
    with torch.inference_mode():
        logits = model.fc(torch.from_numpy(((cube - offset) * scale).reshape(-1, B).astype(np.float32)))
    top2 = torch.topk(logits, 2).values
    clear = (top2[:, 0] - top2[:, 1] > 1e-4).numpy().reshape(H, W)  # (a near tie may round either way)
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(tta[clear], (logits.argmax(1).numpy().reshape(H, W) + 1)[clear])


def test_the_map_is_labelled_with_the_class_names_the_model_file_carries(store, tmp_path, run_cli):
    ckpt, _ = _checkpoint(tmp_path)  # names a, b, c, d; the store has none
    assert hsgds.open_scene(store).class_names is None
    code, out, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "m.hdr")
    assert code == 0, err
    header = (tmp_path / "m.hdr").read_text()
    assert "class names = {Unclassified, a, b, c, d}" in header


def test_cli_predict_refuses_bad_models_in_one_line(store, tmp_path, run_cli):
    ckpt, _ = _checkpoint(tmp_path)
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a model at all")
    other_bands, _ = _checkpoint(tmp_path / "..", bands=B + 1)
    cases = [
        (("--model", garbage), "is not a usable model"),
        (("--model", tmp_path / "missing.pt2"), "no model file"),
        (("--model", other_bands), "takes 9 bands but"),
        (("--model", ckpt, "--patch-size", "7"), "made for 5x5 patches, not 7x7"),
        (("--model", ckpt, "--patch-size", "17"), "made for 5x5"),
        (("--model", ckpt, "--patch-size", "0"), "--patch-size must be a positive odd number (patches are pixel-centred), got 0"),
        (("--model", ckpt, "--patch-size", "-3"), "--patch-size must be a positive odd number (patches are pixel-centred), got -3"),
    ]
    bad_pt2 = tmp_path / "bad.pt2"
    bad_pt2.write_bytes(b"PK\x03\x04 broken zip")
    cases.append((("--model", bad_pt2), "torch.export.load failed"))
    report = tmp_path / "report.json"  # the file next to the demo's checkpoint, passed by mistake
    report.write_text('{"store": "ip.zarr"}')
    cases.append((("--model", report), "not a zip archive as torch.save / torch.export write (it starts b'{\"store"))
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(ckpt.read_bytes()[:1000])
    cases.append((("--model", truncated), "a truncated or damaged zip archive"))
    foreign_zip = tmp_path / "foreign.ckpt"
    with zipfile.ZipFile(foreign_zip, "w") as z:
        z.writestr("readme.txt", "not a torch file")
    cases.append((("--model", foreign_zip), "torch.load(weights_only=True) failed"))
    (tmp_path / "out").mkdir()
    for args, message in cases:
        code, out, err = run_cli("predict", store, *args, "-o", tmp_path / "out" / "m.tif")
        assert code == 2, (args, err)
        assert message in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "out" / "m.jpg")
    assert code == 2 and "unknown suffix" in err
    code, _, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "out" / "m.npy",
                           "--probabilities", tmp_path / "out" / "p.bin")
    assert code == 2 and "as .npy" in err
    assert list((tmp_path / "out").iterdir()) == []


def test_a_damaged_program_is_one_line_without_torch_log(tmp_path, capfd, caplog):
    """torch.export.load logs the real error (a multi-line warning with a traceback) and raises "check the
    warnings above": only our line is left, naming the logged error, and torch's logger is as it was."""
    import logging

    from hsgds.models import load_model

    torch.export.save(torch.export.export(nn.Linear(3, 2), (torch.randn(4, 3),)), tmp_path / "good.pt2")
    whole = (tmp_path / "good.pt2").read_bytes()
    (tmp_path / "empty.pt2").write_bytes(b"")
    (tmp_path / "truncated.pt2").write_bytes(whole[:len(whole) // 2])
    with zipfile.ZipFile(tmp_path / "format_only.pt2", "w") as z:
        z.writestr("archive_format", "pt2")
    logger = logging.getLogger("torch.export")
    before = logger.handlers[:], logger.level, logger.propagate
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    for name, cause in [("empty", "not a ZIP archive"), ("truncated", "failed finding central directory"),
                        ("format_only", "file in archive is not in a subdirectory: archive_format")]:
        with pytest.raises(InputError, match="torch.export.load failed") as info:
            load_model(tmp_path / f"{name}.pt2")
        assert cause in str(info.value) and "warnings above" not in str(info.value)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert not [r for r in caplog.records if r.name.startswith("torch.export")]
    assert (logger.handlers, logger.level, logger.propagate) == before


def test_package_attribute_is_the_function():
    import hsgds.inference

    assert hsgds.predict is hsgds.inference.predict and callable(hsgds.predict)


@pytest.mark.parametrize("change,message", [
    ({"format": "other"}, "not an hsgds checkpoint"),
    ({"version": 99}, "checkpoint version 99"),
    ({"model": "os.system"}, "unknown model class 'os.system'"),
    ({"patch_size": 4}, "not a positive odd integer"),
    ({"kwargs": {"bands": 8, "classes": 4, "patch_size": 5, "reduce": 4, "width": 9}}, "weights do not fit"),
    ({"kwargs": {"bands": 8, "nonsense": 1}}, "weights do not fit"),
    ({"state_dict": None}, "do not fit"),
    ({"bands": "x"}, r"its bands \('x'\) and classes \(4\) are not both positive integers"),
    ({"bands": None}, "its bands"),
    ({"classes": "four"}, "classes \\('four'\\)"),
    ({"classes": 0}, "classes \\(0\\)"),
    ({"bands": True}, "its bands"),
    ({"classes": 7}, "it says 8 bands and 7 classes, but its SpectralSpatialCNN takes 8 bands and returns 4"),
    ({"bands": 9}, "it says 9 bands"),
    ({"normalize": "l2"}, "normalize 'l2'"),
    ({"layout": "NHWC"}, "layout 'NHWC' is not supported"),
    ({"class_names": "abcd"}, "class names are not a list of non-empty strings"),
    ({"class_names": [1, 2, 3, 4]}, "class names are not a list"),
    ({"class_names": ["a", "", "c", "d"]}, "class names are not a list"),
    ({"class_names": ["a", "b\nc", "c", "d"]}, "the name of its class 2 holds the control character '\\\\n'"),
    ({"class_names": ["a", "b"]}, "2 class names for the model's 4 classes"),
    ({"class_names": list("abcdefghi")}, "9 class names for the model's 4 classes"),
])
def test_forged_checkpoints_are_refused(tmp_path, change, message):
    from hsgds.models import load_model

    ckpt, _ = _checkpoint(tmp_path)
    state = torch.load(ckpt, weights_only=True)
    state.update(change)
    torch.save(state, tmp_path / "forged.ckpt")
    with pytest.raises(InputError, match=message):
        load_model(tmp_path / "forged.ckpt")


def test_class_names_are_one_per_class_when_saved_and_loaded(tmp_path):
    from hsgds.models import SpectralSpatialCNN, load_model, save_checkpoint, save_program

    model = SpectralSpatialCNN(B, 4, 5, reduce=4, width=8).eval()
    program = torch.export.export(model, (torch.randn(8, B, 5, 5),))
    cases = [("corn", "class_names must be a sequence of names .* got str 'corn'"),
             (["a", "b"], "returns 4 classes but 2 class names were given"),
             (list("abcdef"), "returns 4 classes but 6 class names were given"),
             (["a", "", "c", "d"], "class_names must be non-empty strings"),
             (["a", 2, "c", "d"], "class_names must be non-empty strings"),
             (["a", "b", "c\td", "e"], r"class_names: the name of class 3 \('c\\td'\) holds the control character "
                                        "'.t'; give names without")]
    for names, message in cases:
        with pytest.raises(ConfigError, match=message):
            save_checkpoint(tmp_path / "m.ckpt", model, patch_size=5, class_names=names)
        with pytest.raises(ConfigError, match=message):
            save_program(tmp_path / "m.pt2", program, patch_size=5, class_names=names)
    assert not list(tmp_path.iterdir())
    assert load_model(save_checkpoint(tmp_path / "m.ckpt", model, patch_size=5, class_names=tuple("abcd"))).class_names \
        == list("abcd")
    # a program's recipe naming other than its 4 outputs is refused when loaded
    torch.export.save(program, tmp_path / "f.pt2", extra_files={"hsgds.json": json.dumps({
        "format": "hsgds-program", "version": 1, "patch_size": 5, "normalize": "zscore", "layout": "NCHW",
        "class_names": list("abcdef"), "band_indices": None, "wavelengths": None, "wavelength_tolerance": 5.0,
        "norm_stats": None})})
    with pytest.raises(InputError, match="6 class names for the model's 4 classes"):
        load_model(tmp_path / "f.pt2")


def test_a_program_of_dynamic_patch_size_is_saved_with_one_in_its_range(tmp_path):
    from hsgds.models import SpectralSpatialCNN, load_model, save_program

    model = SpectralSpatialCNN(B, 4, 5, reduce=4, width=8).eval()
    n, side, half = torch.export.Dim("n", max=1 << 20), torch.export.Dim("p", min=3, max=15), torch.export.Dim("h", min=1, max=7)
    bounded = [torch.export.export(model, (torch.randn(8, B, 5, 5),), dynamic_shapes=({0: n, 2: side, 3: side},)),
               torch.export.export(model, (torch.randn(8, B, 5, 5),),
                                   dynamic_shapes=({0: n, 2: 2 * half + 1, 3: 2 * half + 1},))]
    for program in bounded:
        for p in (1, 17, 21):
            with pytest.raises(ConfigError, match=f"takes patches of 3x3 to 15x15 .*not patch_size={p}"):
                save_program(tmp_path / "m.pt2", program, patch_size=p)
        assert load_model(save_program(tmp_path / "m.pt2", program, patch_size=15)).patch_size == 15
        program.module()(torch.randn(2, B, 15, 15))  # what the range says the program takes, it does
        # a recipe outside the range is refused when loaded
        torch.export.save(program, tmp_path / "f.pt2", extra_files={"hsgds.json": json.dumps({
            "format": "hsgds-program", "version": 1, "patch_size": 21, "normalize": "zscore", "layout": "NCHW",
            "class_names": None, "band_indices": None, "wavelengths": None, "wavelength_tolerance": 5.0,
            "norm_stats": None})})
        with pytest.raises(InputError, match="patch size 21 is outside the program's 3x3 to 15x15"):
            load_model(tmp_path / "f.pt2")
    # without a bound (Dim.AUTO: torch records >= 2 but runs 1x1 too) any odd size is taken
    auto = torch.export.Dim.AUTO
    program = torch.export.export(model, (torch.randn(8, B, 5, 5),), dynamic_shapes=({0: auto, 2: auto, 3: auto},))
    for p in (1, 21):
        assert load_model(save_program(tmp_path / "m.pt2", program, patch_size=p)).patch_size == p


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_model_files_are_saved_only_as_new_or_regular_files(tmp_path):
    """The path is checked before any work: the atomic rename must not replace a folder, a FIFO (or a device)
    or what a symlink points at, and a missing folder is named, not the temporary file."""
    from hsgds.models import SpectralSpatialCNN, save_checkpoint, save_program

    model = SpectralSpatialCNN(B, 4, 5, reduce=4, width=8).eval()
    program = torch.export.export(model, (torch.randn(8, B, 5, 5),))
    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo.pt2")
    (tmp_path / "link.pt2").symlink_to(tmp_path / "fifo.pt2")
    (tmp_path / "dir.pt2").mkdir()
    cases = [(tmp_path / "missing" / "m.pt2", "missing does not exist; name a file in an existing folder"),
             (tmp_path / "file" / "m.pt2", "file is not a folder"),
             (tmp_path / "dir.pt2", "it is a folder"),
             (tmp_path / "fifo.pt2", "not a regular file"),
             (tmp_path / "link.pt2", "not a regular file"),
             (None, "must be a path .*got NoneType"),
             (3, "must be a path .*got int 3")]
    for path, message in cases:
        for save, what in ((save_checkpoint, model), (save_program, program)):
            with pytest.raises(ConfigError, match=message) as info:
                save(path, what, patch_size=5)
            assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.pt2", "fifo.pt2", "file", "link.pt2"]
    assert (tmp_path / "link.pt2").is_symlink() and stat.S_ISFIFO(os.stat(tmp_path / "fifo.pt2").st_mode)
    # an existing regular file is replaced
    (tmp_path / "old.pt2").write_text("old")
    save_program(tmp_path / "old.pt2", program, patch_size=5)
    assert zipfile.is_zipfile(tmp_path / "old.pt2")


def test_a_checkpoint_holds_plain_model_arguments_only(tmp_path):
    from hsgds.models import SpectralSpatialCNN, save_checkpoint

    model = SpectralSpatialCNN(B, 4, 5, reduce=4, width=8)
    for value, message in ((lambda x: x, "config\\['extra'\\] \\(function .*cannot be pickled"),
                           (np.int64(3), "config\\['extra'\\] \\(int64 .*would not load with torch.load")):
        model.config["extra"] = value
        with pytest.raises(ConfigError, match=message):
            save_checkpoint(tmp_path / "m.ckpt", model, patch_size=5)
    assert not list(tmp_path.iterdir())


def test_forged_checkpoint_fields_are_one_line_in_the_commands(store, tmp_path, run_cli):
    ckpt, _ = _checkpoint(tmp_path)
    for change in ({"bands": "x"}, {"classes": None}, {"class_names": list("abcdefghi")}):
        state = torch.load(ckpt, weights_only=True)
        state.update(change)
        torch.save(state, tmp_path / "forged.ckpt")
        for args in (("info", tmp_path / "forged.ckpt"),
                     ("predict", store, "--model", tmp_path / "forged.ckpt", "-o", tmp_path / "m.hdr")):
            code, _, err = run_cli(*args)
            assert code == 2 and "is not a usable model" in err and len(err.strip().splitlines()) == 1, (change, err)
    assert not (tmp_path / "m.hdr").exists()


def test_ring_is_small_whatever_the_scene(store):
    from hsgds.inference import ring_bytes_for

    scene = hsgds.open_scene(store)
    tile = scene.grid.tile_nbytes
    # tiles of 324, 198, 324, 198, 18 and 11 pixels: a batch of 100 spans at most the last 3; twice that
    assert ring_bytes_for(scene, 100) == 6 * tile
    assert ring_bytes_for(scene, 10) == 4 * tile  # at least 4 slots
    sparse = np.zeros((H, W), bool)
    sparse[::9, ::9] = True  # 20 pixels over all 6 tiles: one batch of 100 spans every tile
    assert ring_bytes_for(scene, 100, sparse) == 2 * 6 * tile


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_tta_is_the_mean_probability_over_the_8_dihedral_variants(store, layout, tmp_path):
    """tta=True: the written probabilities are the mean softmax over the 8 flips / quarter turns of each
    patch (numpy-transformed patches from the loader as the reference), and the map is its argmax."""
    from hsgds.augment import apply_dihedral_numpy

    p = 5
    model = RandomConv(p, seed=3)
    hwc = layout == "NHWC"

    class Net(nn.Module):  # the model sees the loader's layout
        def forward(self, x):
            return model(x.permute(0, 3, 1, 2) if hwc else x)

    net = Net()
    classmap = predict(store, net, patch_size=p, batch_size=200, device="cpu", layout=layout, tta=True,
                       probabilities=tmp_path / "prob.npy")
    prob = np.load(tmp_path / "prob.npy")
    with hsgds.PatchLoader(store, patch_size=p, batch_size=200, split=None, pixels="all", shuffle=False,
                           return_coords=True, device="cpu", layout=layout) as loader, torch.inference_mode():
        for patches, _, coords in loader:
            hw = patches.numpy() if hwc else patches.numpy().transpose(0, 2, 3, 1)  # (N, p, p, B)
            mean = 0
            for code in range(8):
                variant = np.stack([apply_dihedral_numpy(q, code) for q in hw])
                x = torch.from_numpy(np.ascontiguousarray(variant if hwc else variant.transpose(0, 3, 1, 2)))
                mean = mean + torch.softmax(net(x).float(), 1).numpy()
            mean /= 8
            y, xx = coords[:, 0].numpy(), coords[:, 1].numpy()
            np.testing.assert_allclose(prob[y, xx].astype(np.float32), mean, atol=1e-3)
            ambiguous = np.sort(mean, 1)[:, -1] - np.sort(mean, 1)[:, -2] < 1e-5
            np.testing.assert_array_equal(classmap[y, xx][~ambiguous], mean.argmax(1)[~ambiguous] + 1)
    plain = predict(store, net, patch_size=p, batch_size=200, device="cpu", layout=layout)
    assert (plain != classmap).any()  # a model that is not invariant: TTA changes some pixels


def test_cli_predict_a_collection_writes_a_map_per_scene(store, tmp_path, run_cli):
    """``hsgds predict COLLECTION -o maps/{name}.npy``: each scene's map equals hsgds.predict on that store
    alone; checks of every scene and output come before any work (exit 2, nothing written); a scene that
    fails is named while the others are predicted (exit 1)."""
    import shutil

    from hsgds.collection import SceneEntry, write_collection
    from hsgds.scene import open_scene

    ckpt, model = _checkpoint(tmp_path)
    coll = tmp_path / "coll"
    coll.mkdir()
    for name in ("north", "south"):
        shutil.copytree(store, coll / f"{name}.zarr")
    write_collection(coll, [SceneEntry.of_scene(n, open_scene(coll / f"{n}.zarr")) for n in ("north", "south")])
    maps = tmp_path / "maps"
    maps.mkdir()
    want = predict(store, model, patch_size=5, device="cpu")

    code, out, err = run_cli("predict", coll, "--model", ckpt, "-o", tmp_path / "one.npy")
    assert code == 2 and "{name}" in err and len(err.strip().splitlines()) == 1, err
    # the example is that option's own path with {name} in it (it offered maps/{name}.tif for --probabilities too)
    assert err.endswith(f"e.g. {tmp_path / 'one_{name}.npy'}\n"), err
    code, out, err = run_cli("predict", coll, "--model", ckpt, "-o", maps / "{name}.npy", "--probabilities",
                             maps / "p.npy")
    assert code == 2 and err == (f"hsgds: error: --probabilities {maps / 'p.npy'} would be written once per scene of "
                                 f"the collection; name each scene's file with {{name}}, e.g. {maps / 'p_{name}.npy'}\n")
    code, out, err = run_cli("predict", coll, "--model", ckpt, "-o", tmp_path / "nowhere" / "{name}.npy")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    other_bands, _ = _checkpoint(tmp_path / "..", bands=B + 1)
    code, out, err = run_cli("predict", coll, "--model", ckpt, "-o", maps / "{name}.npy", "--probabilities",
                             maps / "{name}.npy")
    assert code == 2 and "would both write" in err and len(err.strip().splitlines()) == 1, err
    code, out, err = run_cli("predict", coll, "--model", other_bands, "-o", maps / "{name}.npy")
    assert code == 2 and "scene 'north'" in err and "takes 9 bands" in err, err
    assert not any(maps.iterdir())

    code, out, err = run_cli("predict", coll, "--model", ckpt, "-o", maps / "{name}.npy", "--probabilities",
                             maps / "{name}.p.npy")
    assert code == 0, err
    for name in ("north", "south"):
        assert np.array_equal(np.load(maps / f"{name}.npy", allow_pickle=False), want)
        assert np.load(maps / f"{name}.p.npy", allow_pickle=False).shape == (H, W, 4)

    shutil.rmtree(coll / "north.zarr")
    (maps / "south.npy").unlink()
    code, out, err = run_cli("predict", coll, "--model", ckpt, "-o", maps / "{name}.npy")
    assert code == 1 and "hsgds: failed: north: " in err and "is missing" in err
    assert np.array_equal(np.load(maps / "south.npy", allow_pickle=False), want)


@pytest.mark.parametrize("name", ["../up", "sub/down", "."])
def test_a_collection_scene_name_that_is_no_file_name_is_refused_before_any_scene(store, tmp_path, run_cli, name):
    """A hand-written collection.json may name a scene with a path: with -o maps/{name}.npy, '../up' wrote its
    map beside maps/, outside the folder given. Refused up front (exit 2, nothing written); names with spaces
    and non-ASCII letters are file names and are predicted."""
    from hsgds.collection import SceneEntry, write_collection
    from hsgds.scene import open_scene

    ckpt, model = _checkpoint(tmp_path)
    maps = tmp_path / "out" / "maps"
    maps.mkdir(parents=True)
    write_collection(tmp_path, [SceneEntry.of_scene(n, open_scene(store)) for n in ("scène 1", name)])
    code, _, err = run_cli("predict", tmp_path, "--model", ckpt, "-o", maps / "{name}.npy")
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"scene {name!r} of " in err, err
    assert not any(maps.iterdir()) and sorted(p.name for p in (tmp_path / "out").iterdir()) == ["maps"]
    write_collection(tmp_path, [SceneEntry.of_scene(n, open_scene(store)) for n in ("scène 1", "日本 2")])
    code, _, err = run_cli("predict", tmp_path, "--model", ckpt, "-o", maps / "{name}.npy")
    assert code == 0, err
    want = predict(store, model, patch_size=5, device="cpu")
    for n in ("scène 1", "日本 2"):
        assert np.array_equal(np.load(maps / f"{n}.npy", allow_pickle=False), want)


def test_cli_predict_a_collection_with_tta_equals_each_scene_predicted_with_tta(store, tmp_path, run_cli):
    """``hsgds predict COLLECTION --tta``: each scene's map and probabilities are what hsgds.predict gives for that
    store alone with tta=True (two scenes of other sizes and values, each normalized with its own statistics),
    and --tta changes both maps (a collection run that dropped it would fail the first check)."""
    import shutil

    from hsgds.collection import SceneEntry, write_collection
    from hsgds.scene import open_scene
    from tests.conftest import convert_quietly

    ckpt, model = _checkpoint(tmp_path)
    coll = tmp_path / "coll"
    coll.mkdir()
    shutil.copytree(store, coll / "north.zarr")
    cube, labels = coordinate_cube(31, 40, seed=5)
    np.save(tmp_path / "cube5.npy", cube)
    np.save(tmp_path / "gt5.npy", labels)
    convert_quietly(tmp_path / "cube5.npy", coll / "south.zarr", ConvertOptions(labels=tmp_path / "gt5.npy", tile=18,
                                                                               max_patch=15))
    write_collection(coll, [SceneEntry.of_scene(n, open_scene(coll / f"{n}.zarr")) for n in ("north", "south")])
    maps = tmp_path / "maps"
    maps.mkdir()
    code, out, err = run_cli("predict", coll, "--model", ckpt, "-o", maps / "{name}.npy", "--probabilities",
                             maps / "{name}.p.npy", "--tta")
    assert code == 0, err
    code, out, err = run_cli("predict", coll, "--model", ckpt, "-o", maps / "{name}.plain.npy")
    assert code == 0, err
    for name in ("north", "south"):
        alone = predict(coll / f"{name}.zarr", model, patch_size=5, device="cpu", tta=True,
                        probabilities=tmp_path / f"{name}.p.npy")
        got = np.load(maps / f"{name}.npy", allow_pickle=False)
        assert np.array_equal(got, alone), name
        assert np.array_equal(np.load(maps / f"{name}.p.npy"), np.load(tmp_path / f"{name}.p.npy")), name
        assert len(np.unique(got)) > 1, name  # a map that depends on its input
        assert (got != np.load(maps / f"{name}.plain.npy", allow_pickle=False)).any(), name  # --tta changed it


def test_two_scenes_whose_outputs_are_one_file_are_refused_before_any_work(store, tmp_path, run_cli):
    """Scenes x and x.p with ``-o maps/{name}.npy --probabilities maps/{name}.p.npy``: x's probabilities and
    x.p's map are one file, and the later scene would replace the earlier's output without a word. Refused in
    one line, exit 2, nothing written; outputs named apart are written."""
    import shutil

    from hsgds.collection import SceneEntry, write_collection
    from hsgds.scene import open_scene

    ckpt, _ = _checkpoint(tmp_path)
    coll = tmp_path / "coll"
    coll.mkdir()
    names = ("x", "x.p")
    for name in names:
        shutil.copytree(store, coll / f"{name}.zarr")
    write_collection(coll, [SceneEntry.of_scene(n, open_scene(coll / f"{n}.zarr")) for n in names])
    maps = tmp_path / "maps"
    maps.mkdir()
    code, _, err = run_cli("predict", coll, "--model", ckpt, "-o", maps / "{name}.npy", "--probabilities",
                           maps / "{name}.p.npy")
    assert code == 2 and err == (f"hsgds: error: scenes 'x' and 'x.p' would both write {maps / 'x.p.npy'}; name the "
                                 "outputs so that each scene's differ (e.g. -o maps/{name}.tif --probabilities "
                                 "probs/{name}.npy)\n"), err
    assert not any(maps.iterdir())
    code, _, err = run_cli("predict", coll, "--model", ckpt, "-o", maps / "{name}.npy", "--probabilities",
                           maps / "p_{name}.npy")
    assert code == 0, err
    assert sorted(p.name for p in maps.iterdir()) == ["p_x.npy", "p_x.p.npy", "x.npy", "x.p.npy"]


def test_a_sparse_mask_keeps_the_ring_within_its_budget(store):
    """A mask of one pixel in each tile spreads a batch over every tile, all resident at once: predict then
    cuts smaller batches so that its ring stays within the loader's cap (HSGDS_RING_CPU_BYTES on the CPU), and
    the map is the same. (Before, the ring grew to twice the tiles a batch spans, however many.)"""
    from hsgds import defaults
    from hsgds.scene import open_scene

    tile = open_scene(store).grid.tile_nbytes
    mask = np.zeros((H, W), bool)
    for y in (3, 21, 36):  # one pixel in each of the 3 x 2 tiles of 18 x 18
        for x in (5, 23):
            mask[y, x] = True
    full = predict(store, CentreCoordinates(), patch_size=5, batch_size=100, device="cpu", normalize=None)
    calls: list[tuple[int, int]] = []
    with defaults.set(ring_cpu_bytes=4 * tile):  # 4 tiles: batches spanning 2 tiles, read ahead by 2 more
        got = predict(store, CentreCoordinates(), patch_size=5, batch_size=100, device="cpu", normalize=None,
                      mask=mask, progress=lambda done, total: calls.append((done, total)))
    assert np.array_equal(got, np.where(mask, full, 0))
    assert calls == [(2, 6), (4, 6), (6, 6)]
    calls.clear()
    predict(store, CentreCoordinates(), patch_size=5, batch_size=100, device="cpu", normalize=None, mask=mask,
            progress=lambda done, total: calls.append((done, total)))
    assert calls == [(6, 6)]  # room for the batch asked for: one batch


@pytest.mark.parametrize("seed", range(20))
def test_the_batch_in_budget_is_the_largest_whose_span_fits(seed):
    """_batch_in_budget against brute force: the tiles a batch covers, counted pixel by pixel from every start."""
    from types import SimpleNamespace

    from hsgds.inference import _batch_in_budget

    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 6, rng.integers(1, 15))
    owner = np.repeat(np.arange(len(counts)), counts)  # the tile of each pixel, in predict's order

    def span(b):
        return max(len(set(owner[i:i + b])) for i in range(len(owner)))

    g = SimpleNamespace(nty=1, ntx=len(counts), tile_nbytes=4096, core_window=lambda t: (0, 1, 0, int(counts[t])))
    scene = SimpleNamespace(grid=g)
    batch, fits = int(rng.integers(1, 40)), int(rng.integers(4, 12))
    got, ring = _batch_in_budget(scene, batch, None, fits * 4096)
    assert got == max(b for b in range(1, batch + 1) if 2 * span(b) <= fits)  # (span(1) is 1; fits >= 4)
    assert ring == max(4, 2 * span(got)) * 4096


#: a progress line of predict in a log: a scene's pixels, or over a collection its scenes, done of all
PROGRESS_LINE = __import__("re").compile(
    r"^hsgds: predict: (?:(?P<scene>\S+): )?(?P<done>[\d,]+) of (?P<total>[\d,]+) (?P<noun>pixel|scene)s done"
    r"(?: \((?P<failed>[\d,]+) failed\))?, (?:[\d,]+ (?:pixel|scene)s per s|[\d.]+ s per (?:pixel|scene))"
    r"(?P<left>, about \S+ left)?$")


def _progress_lines(stderr: str) -> list[tuple]:
    """(scene or None, done, total, noun, failed, time left said) of each progress line."""
    return [(m["scene"], int(m["done"].replace(",", "")), int(m["total"].replace(",", "")), m["noun"],
             int((m["failed"] or "0").replace(",", "")), m["left"] is not None)
            for m in map(PROGRESS_LINE.match, stderr.splitlines()) if m]


def test_a_batch_jobs_log_gets_pixel_progress_lines_at_most_every_interval(store, tmp_path, run_cli, hsgds_env):
    """On a stderr that is not a terminal (captured here, as in a batch job's log) no bar is drawn, and a big
    scene's prediction said nothing for minutes: it now writes a line as batches finish, at most every
    HSGDS_PROGRESS_LOG_S seconds, and one when the last finishes. At 0 a line per batch of 100, counting up to
    the pixels of the labels zarr-python reads; at a day only the last line."""
    import zarr

    ckpt, _ = _checkpoint(tmp_path)
    pixels = int(np.prod(zarr.open_group(store, mode="r")["labels"].shape))
    assert pixels == H * W
    name = os.path.basename(store)
    hsgds_env("HSGDS_PROGRESS_LOG_S", "0")
    code, _, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "a.npy", "--batch-size", "100",
                           "--device", "cpu")
    assert code == 0, err
    done = [*range(100, pixels, 100), pixels]
    assert _progress_lines(err) == [(name, k, pixels, "pixel", 0, k < pixels) for k in done], err

    hsgds_env("HSGDS_PROGRESS_LOG_S", "86400")  # the prediction takes less than a day: the last line alone
    code, _, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "b.npy", "--batch-size", "100",
                           "--device", "cpu")
    assert code == 0, err
    assert _progress_lines(err) == [(name, pixels, pixels, "pixel", 0, False)], err


def test_a_batch_jobs_log_gets_a_line_per_scene_of_a_collection(store, tmp_path, run_cli, hsgds_env):
    """Over a collection, in a log, a line as a scene finishes (at most every HSGDS_PROGRESS_LOG_S): the scenes
    done of the collection's, with those failed as many as the "hsgds: failed:" lines before it; each scene's
    own pixel lines come before its scene line. At a day: each scene's last pixel line and the last scene line."""
    import shutil

    from hsgds.collection import SceneEntry, write_collection
    from hsgds.scene import open_scene

    ckpt, _ = _checkpoint(tmp_path)
    coll = tmp_path / "coll"
    coll.mkdir()
    names = ("east", "north", "south")
    for name in names:
        shutil.copytree(store, coll / f"{name}.zarr")
    write_collection(coll, [SceneEntry.of_scene(n, open_scene(coll / f"{n}.zarr")) for n in names])
    shutil.rmtree(coll / "east.zarr")  # fails, named, while the others are predicted
    maps = tmp_path / "maps"
    maps.mkdir()
    pixels = H * W

    def lines_with_failures(err: str) -> list[tuple]:
        """The progress lines, and a ("failed", name) entry where a scene's failure is named."""
        found = []
        for line in err.splitlines():
            if line.startswith("hsgds: failed: "):
                found.append(("failed", line.split(":")[2].strip()))
            found += _progress_lines(line)
        return found

    hsgds_env("HSGDS_PROGRESS_LOG_S", "0")
    code, _, err = run_cli("predict", coll, "--model", ckpt, "-o", maps / "{name}.npy", "--batch-size", "500",
                           "--device", "cpu")
    assert code == 1, err
    per_scene = [(k, pixels, "pixel", 0, k < pixels) for k in (500, 1000, pixels)]
    assert lines_with_failures(err) == [
        ("failed", "east"), (None, 1, 3, "scene", 1, True),
        *[("north.zarr", *line) for line in per_scene], (None, 2, 3, "scene", 1, True),
        *[("south.zarr", *line) for line in per_scene], (None, 3, 3, "scene", 1, False)], err

    hsgds_env("HSGDS_PROGRESS_LOG_S", "86400")
    code, _, err = run_cli("predict", coll, "--model", ckpt, "-o", maps / "{name}.npy", "--batch-size", "500",
                           "--device", "cpu")
    assert code == 1, err
    assert lines_with_failures(err) == [
        ("failed", "east"), ("north.zarr", pixels, pixels, "pixel", 0, False),
        ("south.zarr", pixels, pixels, "pixel", 0, False), (None, 3, 3, "scene", 1, False)], err


def test_a_map_that_cannot_be_written_leaves_no_new_probabilities(store, tmp_path):
    """The map's folder is replaced by a file while the scene is predicted: the map cannot be written, and the
    probabilities (in another folder) are not committed either, so the old pair stays as it was, never new
    probabilities beside an old map."""
    maps, probs = tmp_path / "maps", tmp_path / "probs"
    maps.mkdir()
    probs.mkdir()
    old = np.zeros((2, 2, 2), np.float16)
    np.save(probs / "p.npy", old)

    def folder_gone(done, total):
        if done == total:
            maps.rmdir()
            maps.write_text("not a folder")

    with pytest.raises((InputError, OSError)):
        predict(store, CentreCoordinates(), patch_size=3, batch_size=200, device="cpu", normalize=None,
                out=maps / "m.npy", probabilities=probs / "p.npy", progress=folder_gone)
    assert np.array_equal(np.load(probs / "p.npy"), old)  # the previous probabilities, untouched
    assert sorted(p.name for p in probs.iterdir()) == ["p.npy"]  # and no temporary file left


def test_a_map_is_not_scored_on_test_pixels_the_model_was_trained_on(tmp_path, run_cli):
    """`hsgds predict` scores a map against the store's test split. A model file saved with loader= records the
    loader's split and each scene's labels and split (collection.split_record), so a store re-split since
    training (whose test pixels may be the model's training pixels), or a model trained on every labelled pixel,
    is not scored, in one line; the same split, or a model file without the record, is scored as before."""
    import shutil

    import torch

    from hsgds.models import SpectralSpatialCNN, load_model, save_checkpoint, save_program
    from hsgds.preprocess.resplit import resplit

    cube, labels = coordinate_cube()
    np.save(tmp_path / "cube.npy", cube)
    np.save(tmp_path / "gt.npy", labels)
    s = convert(tmp_path / "cube.npy", tmp_path / "s.zarr", ConvertOptions(labels=tmp_path / "gt.npy", tile=18,
                                                                           max_patch=15, split="random", train=0.3))
    model = SpectralSpatialCNN(B, 3, 3, reduce=4, width=8)
    files = {}
    for split in ("train", None):
        with hsgds.PatchLoader(s, patch_size=3, batch_size=64, split=split) as loader:
            files[split] = save_checkpoint(tmp_path / f"{split}.ckpt", model, loader=loader)
            patches = next(iter(loader))[0]
            program = torch.export.export(model.eval(), (patches,), dynamic_shapes=({0: torch.export.Dim("n")},))
            files[f"{split}.pt2"] = save_program(tmp_path / f"{split}.pt2", program, loader=loader)
    files["older"] = save_checkpoint(tmp_path / "older.ckpt", model, patch_size=3)  # no record: scored
    record = load_model(files["train"]).trained_on
    labels_sha = hsgds.open_scene(s).meta.labels_source["sha256"]
    assert record is not None and record["split"] == "train" and [r["labels"] for r in record["scenes"]] == [labels_sha]
    assert load_model(files["older"]).trained_on is None
    code, out, _ = run_cli("info", files["train"])
    assert code == 0 and ("trained on: the train split of 1 labelled scene (their labels and splits recorded: a map "
                          "of one re-split since is not scored)") in out

    def test_line(model_file):
        code, out, err = run_cli("predict", s, "--model", model_file, "-o", tmp_path / "map.npy")
        assert code == 0, err
        return [line for line in out.splitlines() if line.startswith("test split:")]

    for key in ("train", "train.pt2", "older"):
        assert test_line(files[key])[0].startswith("test split: ") and "OA " in test_line(files[key])[0], key
    for key in (None, "None.pt2"):
        assert test_line(files[key]) == ["test split: not scored: the model was trained on every labelled pixel of "
                                         "this scene (a loader with split=None), so its test pixels were trained on; "
                                         "score a model trained with split='train'"]
    copy = shutil.copytree(s, tmp_path / "copy.zarr")  # the same scene at another path: the same record
    code, out, _ = run_cli("predict", copy, "--model", files["train"], "-o", tmp_path / "copy.npy")
    assert code == 0 and "OA " in out
    resplit(s, "random", train=0.3, seed=1)
    for key in ("train", "train.pt2"):
        assert test_line(files[key]) == ["test split: not scored: the model was trained on this scene's labels under "
                                         "another split (the store was re-split or converted again since), so some of "
                                         "its test pixels may have been trained on; score it on the split it was "
                                         "trained on, or train again on this one"]
    assert "OA " in test_line(files["older"])[0]  # (unknown: scored as before)
    # a damaged record is refused as any damaged model file is
    state = torch.load(files["train"], weights_only=True)
    state["trained_on"] = {"split": "train", "scenes": [{"labels": 3}]}
    torch.save(state, tmp_path / "damaged.ckpt")
    with pytest.raises(InputError, match=r"not a usable model: its record of the splits it was trained on .* damaged"):
        load_model(tmp_path / "damaged.ckpt")
