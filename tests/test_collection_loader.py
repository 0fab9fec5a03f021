"""PatchLoader over several scenes and pixels="all", against plain numpy cuts of the source cubes."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import zarr

import hsgds
from hsgds.errors import ConfigError, StoreError, TileReadError
from hsgds.preprocess.convert import ConvertOptions, convert
from tests.conftest import convert_quietly
from tests.envi import write_envi

HALO = 7  # max_patch 15
CLASSES = ("a", "b", "c", "d")


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """Seeded scenes of different sizes: A, B, C (6 bands, 400..900 nm), D (other class names), E (8 bands), F
    (8 bands, 40-px tiles with a 4-px halo: another tile shape), W (6 bands, 300..800 nm: other band indices for
    the same wavelengths). Every pixel labelled."""
    from hsgds.synthetic import make_scene

    d = tmp_path_factory.mktemp("coll")
    specs = {"A": (40, 35, 6, 400, CLASSES), "B": (23, 41, 6, 400, CLASSES), "C": (30, 30, 6, 400, CLASSES),
             "D": (20, 20, 6, 400, ("x", "y", "z", "w")), "E": (20, 20, 8, 400, CLASSES),
             "F": (45, 50, 8, 300, CLASSES), "W": (30, 30, 6, 300, CLASSES)}
    out = {}
    for i, (name, (h, w, b, wl0, names)) in enumerate(specs.items()):
        cube, labels = make_scene(h, w, b, classes=4, dtype="int16", seed=11 + i, labelled_fraction=1.0)
        labels[0, 0] = 4  # every scene has all four classes
        labels[1, 0] = 1
        np.save(d / f"{name}_gt.npy", labels)
        hdr = write_envi(d / f"{name}_cube", cube, [wl0 + 100 * k for k in range(b)])
        tile, max_patch = (40, 9) if name == "F" else (18, 15)
        opts = ConvertOptions(labels=d / f"{name}_gt.npy", tile=tile, max_patch=max_patch, train=0.3, val=0.2,
                              class_names=names)
        store = convert_quietly(hdr, d / f"{name}.zarr", opts)
        out[name] = (cube, labels, store)
    return out


def _cut(cube, ys, xs, p, padding="reflect"):
    mode = "constant" if padding == "zero" else padding
    padded = np.pad(cube, ((HALO, HALO), (HALO, HALO), (0, 0)), mode=mode).astype(np.float64)
    r = p // 2
    return np.stack([padded[y + HALO - r:y + HALO + r + 1, x + HALO - r:x + HALO + r + 1] for y, x in zip(ys, xs)])


def _train_px(cube, store):
    y, x, _ = hsgds.open_scene(store).samples("train")
    return cube[y, x].astype(np.float64)


def _collect(loader):
    got, lab, coords = [], [], []
    for p, lb, c in loader:
        got.append(p.float().numpy())
        lab.append(lb.numpy())
        coords.append(c.numpy())
    return np.concatenate(got), np.concatenate(lab), np.concatenate(coords)


def _reference(scenes, names, coords, p, bands=None, pooled=None, normalize="zscore"):
    """(N, p, p, B) float64 reference for (scene, y, x) rows, normalized with each scene's train stats
    (or ``pooled`` (mean, std))."""
    out = None
    for s, name in enumerate(names):
        cube, _, store = scenes[name]
        rows = coords[:, 0] == s
        ref = _cut(cube, coords[rows, 1], coords[rows, 2], p)
        train = _train_px(cube, store)
        sel = np.arange(cube.shape[2]) if bands is None else np.asarray(bands[s])
        ref = ref[..., sel]
        if normalize == "zscore":
            mean, std = (train.mean(0)[sel], train.std(0)[sel]) if pooled is None else pooled
            ref = (ref - mean) / np.where(std > 0, std, 1)
        if out is None:
            out = np.zeros((len(coords), *ref.shape[1:]))
        out[rows] = ref
    return out


@pytest.mark.parametrize("layout,dtype,p", [("NCHW", torch.float32, 7), ("NHWC", torch.float32, 15),
                                            ("NCHW", torch.bfloat16, 1)])
def test_collection_batches_equal_numpy_reference(scenes, layout, dtype, p):
    names = ["A", "B", "C"]
    with hsgds.PatchLoader([scenes[n][2] for n in names], patch_size=p, batch_size=64, split=None, layout=layout,
                           dtype=dtype, return_coords=True, device="cpu", seed=1) as loader:
        got, lab, coords = _collect(loader)
    assert coords.shape[1] == 3 and coords.dtype == np.int64
    expected = {(s, y, x) for s, n in enumerate(names)
                for y in range(scenes[n][0].shape[0]) for x in range(scenes[n][0].shape[1])}
    assert len(got) == len(expected) and set(map(tuple, coords.tolist())) == expected  # each labelled pixel once
    # tiles of all scenes are shuffled together: the first batches already mix scenes
    assert len(set(coords[:256, 0].tolist())) == 3
    ref = _reference(scenes, names, coords, p)
    if layout == "NCHW":
        ref = ref.transpose(0, 3, 1, 2)
    tol = 1e-5 if dtype == torch.float32 else 1.6e-2
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
    for s, n in enumerate(names):
        rows = coords[:, 0] == s
        np.testing.assert_array_equal(lab[rows], scenes[n][1][coords[rows, 1], coords[rows, 2]] - 1)


def test_single_store_keeps_two_coordinate_columns(scenes):
    with hsgds.PatchLoader(scenes["A"][2], patch_size=5, batch_size=32, return_coords=True, device="cpu") as ld:
        _, _, c = next(iter(ld))
    assert c.shape[1] == 2


def test_a_collection_of_one_scene_yields_three_coordinate_columns(scenes, tmp_path):
    """A list of one store, or a collection listing one scene, is a collection: (scene, y, x) rows, as
    documented, not a crash in the batch thread for want of the scene table."""
    from hsgds.collection import SceneEntry, write_collection

    folder = tmp_path / "one"
    folder.mkdir()
    shutil.copytree(scenes["A"][2], folder / "A.zarr")
    write_collection(folder, [SceneEntry.of_scene("A", hsgds.open_scene(folder / "A.zarr"))])
    opts = dict(patch_size=5, batch_size=32, split="train", return_coords=True, device="cpu", seed=2)
    with hsgds.PatchLoader(scenes["A"][2], **opts) as single:
        want = np.concatenate([c.numpy() for _, _, c in single])
    for store in ([scenes["A"][2]], folder):
        with hsgds.PatchLoader(store, **opts) as loader:
            got = np.concatenate([c.numpy() for _, _, c in loader])
        assert got.shape == (len(want), 3) and got.dtype == np.int64
        np.testing.assert_array_equal(got[:, 0], 0)
        np.testing.assert_array_equal(got[:, 1:], want)


def test_a_store_recording_micrometres_as_nanometres_is_named_when_selecting_by_wavelength(scenes, tmp_path):
    """An older converter stored a header's micrometres labelled as nanometres (0.4-0.9 "nm"): selecting bands
    by wavelength names that, not 'no band within 5 nm of 500 nm (nearest: 0.9 nm)'."""
    import json

    old = tmp_path / "old.zarr"
    shutil.copytree(scenes["A"][2], old)
    meta = json.loads((old / "zarr.json").read_text())
    meta["attributes"]["hsgds"]["wavelengths"] = [w / 1000 for w in meta["attributes"]["hsgds"]["wavelengths"]]
    (old / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"^scene 'old' records wavelengths 0\.4-0\.9, which are no band centres in "
                                          r"nm \(100-20000\); convert it again \(`hsgds convert --wavelengths nm\.txt`\) "
                                          r"or select bands by index$"):
        hsgds.PatchLoader(old, patch_size=5, batch_size=8, wavelengths=[500, 700], device="cpu")
    with hsgds.PatchLoader(old, patch_size=5, batch_size=8, bands=[1, 3], device="cpu") as loader:
        assert next(iter(loader))[0].shape[1] == 2  # by index it still loads


def test_a_header_in_micrometres_selects_the_bands_of_the_same_header_in_nanometres(tmp_path):
    """The same band centres written in µm and in nm record the same nm (1.011 µm * 1000 read
    1010.9999999999999 nm), so a wavelength exactly ``wavelength_tolerance`` away, or equally near two bands,
    takes the same band of either scene: the µm scene refused 1016 nm ('no band within 5 nm ... (nearest:
    1011 nm)') and took the other band of a tie."""
    cube = np.random.default_rng(0).integers(0, 999, (12, 12, 3)).astype(np.int16)
    nm = [995.0, 1005.0, 1011.0]
    stores = []
    for name, units, values in (("nm", "Nanometers", nm), ("um", "Micrometers", [v / 1000 for v in nm])):
        hdr = write_envi(tmp_path / name, cube)
        hdr.write_text(hdr.read_text() + f"wavelength units = {units}\nwavelength = {{{', '.join(map(str, values))}}}\n")
        stores.append(convert_quietly(hdr, tmp_path / f"{name}.zarr", ConvertOptions(max_patch=3)))
    assert [hsgds.open_scene(s).wavelengths for s in stores] == [nm, nm]
    # 1016 nm: 5 nm from band 2; 1000 nm: equally near bands 0 and 1, the first in band order taken
    with hsgds.PatchLoader(stores, patch_size=1, batch_size=200, pixels="all", shuffle=False, normalize=None,
                           wavelengths=[1016, 1000], wavelength_tolerance=5, return_coords=True,
                           device="cpu") as loader:
        got, _, coords = _collect(loader)
    for s in range(2):
        rows = coords[:, 0] == s
        np.testing.assert_array_equal(got[rows, :, 0, 0], cube[coords[rows, 1], coords[rows, 2]][:, [2, 0]])


def test_wavelength_selection_picks_each_scenes_nearest_band(scenes):
    names = ["A", "W"]  # A: 400..900 nm, W: 300..800 nm, so 500/700/800 nm are bands 1,3,4 of A and 2,4,5 of W
    with hsgds.PatchLoader([scenes[n][2] for n in names], patch_size=5, batch_size=50, split=None,
                           wavelengths=[502, 700, 797], return_coords=True, device="cpu") as loader:
        got, _, coords = _collect(loader)
    assert got.shape[1] == 3
    ref = _reference(scenes, names, coords, 5, bands=[[1, 3, 4], [2, 4, 5]]).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match=r"scene 'W' has no band within 5 nm of 900 nm \(nearest: 800 nm\)"):
        hsgds.PatchLoader([scenes[n][2] for n in names], patch_size=5, batch_size=8, wavelengths=[500, 900],
                          device="cpu")
    with pytest.raises(ConfigError, match=r"within 60 nm"):
        hsgds.PatchLoader([scenes[n][2] for n in names], patch_size=5, batch_size=8, wavelengths=[500, 1000],
                          wavelength_tolerance=60, device="cpu")
    # numpy's numbers are tolerances too (np.float32(5) was refused as "a number >= 0, got 5.0")
    for tolerance in (np.float32(5), np.int64(5)):
        with hsgds.PatchLoader([scenes[n][2] for n in names], patch_size=5, batch_size=8, wavelengths=[502, 700],
                               wavelength_tolerance=tolerance, device="cpu") as loader:
            assert loader.wavelength_tolerance == 5.0


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_scenes_of_other_band_counts_and_tile_shapes_share_the_ring(scenes, layout):
    names = ["A", "E", "F"]  # 6 bands in 32-px tiles, 8 bands in 32-px tiles, 8 bands in 48-px tiles
    stores = [scenes[n][2] for n in names]
    with hsgds.PatchLoader(stores, patch_size=9, batch_size=64, split=None, wavelengths=[500, 600, 900],
                           layout=layout, return_coords=True, device="cpu", seed=2,
                           ring_bytes=8 * hsgds.open_scene(stores[2]).grid.tile_nbytes) as loader:
        assert loader.stats.ring_bytes == loader.slots * hsgds.open_scene(stores[2]).grid.tile_nbytes
        got, _, coords = _collect(loader)
        assert loader.stats.bytes_read == sum(hsgds.open_scene(s).grid.tile_nbytes * hsgds.open_scene(s).grid.num_tiles
                                              for s in stores)
    assert len(got) == sum(scenes[n][0].shape[0] * scenes[n][0].shape[1] for n in names)
    ref = _reference(scenes, names, coords, 9, bands=[[1, 2, 5], [1, 2, 5], [2, 3, 6]])
    np.testing.assert_allclose(got, ref.transpose(0, 3, 1, 2) if layout == "NCHW" else ref, rtol=1e-5, atol=1e-5)
    # the scene that serves smaller patches is named ('this store' named none of several)
    with pytest.raises(ConfigError, match=r"^patch_size 11 is larger than scene 'F' serves \(9x9\); convert again with "
                                          r"--max-patch 11 \(a collection: the same convert-many command with it\), "
                                          r"or pass a smaller patch_size$"):
        hsgds.PatchLoader(stores, patch_size=11, batch_size=8, wavelengths=[500], device="cpu")
    with pytest.raises(ConfigError, match=r"^patch_size 17 is larger than 3 scenes serve \('A', 'E', 'F'; down to 9x9\)"):
        hsgds.PatchLoader(stores, patch_size=17, batch_size=8, wavelengths=[500], device="cpu")


def test_band_indices_select_the_same_bands_of_every_scene(scenes):
    names = ["A", "B"]
    with hsgds.PatchLoader([scenes[n][2] for n in names], patch_size=3, batch_size=40, split="train",
                           bands=[5, 0, 2], layout="NHWC", return_coords=True, device="cpu") as loader:
        got, _, coords = _collect(loader)
    ref = _reference(scenes, names, coords, 3, bands=[[5, 0, 2]] * 2)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # a band selection on one store goes through the same per-scene tables
    with hsgds.PatchLoader(scenes["A"][2], patch_size=3, batch_size=40, bands=[4], return_coords=True,
                           device="cpu") as loader:
        got, _, coords = _collect(loader)
    ref = _reference(scenes, ["A"], np.column_stack([np.zeros(len(coords), np.int64), coords]), 3, bands=[[4]])
    np.testing.assert_allclose(got, ref.transpose(0, 3, 1, 2), rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match="bands must be in 0..5"):
        hsgds.PatchLoader(scenes["A"][2], patch_size=3, batch_size=4, bands=[6], device="cpu")


@pytest.mark.parametrize("numba", [True, False], ids=["fused", "torch-ops"])
def test_a_collections_augmentation_follows_each_sample_not_the_batches(scenes, tmp_path, numba):
    """Augmentation through the per-scene tables (three scenes, a band selection repeating a band, pooled
    statistics, bfloat16; a collection folder whose stores open as reached): with flips and turns only, every
    patch is one of the 8 dihedral transforms of its plain patch, all 8 occurring; with noise and band dropout
    too, each (scene, y, x) gets the same bits whatever the batch size, ring size or rank of 2 (the
    per-sample keys are the samples' indices across the scenes), and a dropped band is exactly 0 where a
    kept one is the plain band (no single-scene test reaches the tables' cut with augmentation)."""
    from hsgds import defaults
    from hsgds.augment import apply_dihedral_numpy

    if numba:
        pytest.importorskip("numba")
    folder = _collection_of(scenes, tmp_path / "coll", ["A", "B", "C"])
    tile = hsgds.open_scene(folder / "A.zarr").grid.tile_nbytes
    opts = dict(patch_size=5, split="train", bands=[4, 1, 1], norm_scope="collection", dtype=torch.bfloat16,
                layout="NHWC", return_coords=True, device="cpu", seed=6)

    def by_sample(augment, batch_size=32, **kw):
        out = {}
        with defaults.set(numba=numba), hsgds.PatchLoader(folder, augment=augment, batch_size=batch_size,
                                                          **{**opts, **kw}) as loader:
            for p, _, c in loader:
                out.update(zip(map(tuple, c.tolist()), p.float().numpy()))
        return out

    plain = by_sample(None)
    turned = by_sample(hsgds.Augment(flip=True, rot90=True))
    assert turned.keys() == plain.keys() and len(plain) > 100
    codes = [[c for c in range(8) if np.array_equal(apply_dihedral_numpy(plain[k], c), t)] for k, t in turned.items()]
    assert all(codes) and {c[0] for c in codes} == set(range(8))
    aug = hsgds.Augment(flip=True, rot90=True, radiation_noise=0.5, band_dropout=0.3)
    want = by_sample(aug)
    for other in (by_sample(aug, batch_size=7), by_sample(aug, ring_bytes=5 * tile),
                  *(by_sample(aug, rank=r, world_size=2) for r in (0, 1))):
        assert other.keys() <= want.keys()
        for k, patch in other.items():
            assert np.array_equal(patch.view(np.uint32), want[k].view(np.uint32)), k
    dropped = by_sample(hsgds.Augment(band_dropout=0.3))
    zero = np.array([[(p[..., b] == 0).all() for b in range(3)] for p in dropped.values()])
    assert 0.2 < zero.mean() < 0.4
    for (k, p), z in zip(dropped.items(), zero):
        np.testing.assert_array_equal(p[..., ~z], plain[k][..., ~z])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_more_output_bands_than_a_scene_stores_are_cut_right_in_16_bits(scenes, dtype):
    """Several wavelengths nearest one band, or a band index given twice, give a pixel more output bands than
    it stores: 16-bit patches (whose tiles are normalized once in the ring, in place) equal numpy's. Written in
    place, a pixel's outputs ran into the next pixel's bytes: the last bands held another pixel's values."""
    names = ["A", "E"]  # 6 and 8 int16 bands from 400 nm, 100 nm apart: 9 wavelengths take 5 bands of each
    wavelengths = [400, 401, 500, 501, 600, 601, 700, 701, 800]
    with hsgds.PatchLoader([scenes[n][2] for n in names], patch_size=3, batch_size=64, split=None, dtype=dtype,
                           wavelengths=wavelengths, layout="NHWC", return_coords=True, device="cpu") as loader:
        got, _, coords = _collect(loader)
    ref = _reference(scenes, names, coords, 3, bands=[[0, 0, 1, 1, 2, 2, 3, 3, 4]] * 2)
    np.testing.assert_allclose(got, ref, rtol=1.6e-2, atol=1.6e-2)
    with hsgds.PatchLoader(scenes["A"][2], patch_size=3, batch_size=64, split=None, dtype=dtype,
                           bands=[5, 0, 1, 2, 3, 4, 5, 0], return_coords=True, device="cpu") as loader:
        got, _, coords = _collect(loader)
    ref = _reference(scenes, ["A"], np.column_stack([np.zeros(len(coords), np.int64), coords]), 3,
                     bands=[[5, 0, 1, 2, 3, 4, 5, 0]])
    np.testing.assert_allclose(got, ref.transpose(0, 3, 1, 2), rtol=1.6e-2, atol=1.6e-2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(wavelengths=["abc"]), "wavelengths must be a non-empty list of numbers"),
    (dict(wavelengths={500: 1}), "wavelengths must be a non-empty list of numbers"),
    (dict(wavelengths=[None]), "wavelengths must be a non-empty list of numbers"),
    (dict(wavelengths=[]), "wavelengths must be a non-empty list of numbers"),
    (dict(bands=["0"]), "bands must be a non-empty list of band indices"),
    (dict(bands=[0], wavelengths=[500]), "not both"),
    (dict(wavelengths=[500], wavelength_tolerance=True), "wavelength_tolerance must be a number"),
    # checked without wavelengths too: float('x') raised a bare ValueError when the loader kept it
    (dict(wavelength_tolerance="x"), "wavelength_tolerance must be a number >= 0 .nm., got 'x'"),
    # numpy arrays: their repr wraps, and a long one spans many lines
    (dict(bands=np.arange(300)), r"bands must be in 0..5 .*, got numpy array of shape \(300,\) int64 \[0, 1, 2, \.\.\.\]$"),
    (dict(bands=np.zeros((2, 2), int)), r"bands must be a non-empty list of band indices, got numpy array of shape \(2, 2\) int64 \[0, 0, \.\.\.\]$"),
    (dict(wavelengths=np.full(40, np.nan)), "wavelengths must be a non-empty list of numbers"),
])
def test_bad_band_selections_are_one_line_config_errors(scenes, kwargs, message):
    with pytest.raises(ConfigError, match=message) as raised:
        hsgds.PatchLoader([scenes["A"][2], scenes["C"][2]], patch_size=3, batch_size=4, device="cpu", **kwargs)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("normalize", ["zscore", "minmax"])
def test_collection_norm_scope_pools_train_pixels_exactly(scenes, normalize):
    names = ["A", "B", "C"]
    train = np.concatenate([_train_px(scenes[n][0], scenes[n][2]) for n in names])
    with hsgds.PatchLoader([scenes[n][2] for n in names], patch_size=3, batch_size=64, split="val",
                           normalize=normalize, norm_scope="collection", layout="NHWC", return_coords=True,
                           device="cpu") as loader:
        got, _, coords = _collect(loader)
    raw = _reference(scenes, names, coords, 3, normalize=None)
    if normalize == "zscore":
        lo, spread = train.mean(0), train.std(0)
    else:
        lo, spread = train.min(0), train.max(0) - train.min(0)
    np.testing.assert_allclose(got, (raw - lo) / spread, rtol=2e-5, atol=2e-5)
    with pytest.raises(ConfigError, match="norm_scope"):
        hsgds.PatchLoader(scenes["A"][2], patch_size=3, batch_size=4, norm_scope="global", device="cpu")


def test_a_wavelength_far_from_some_scenes_names_the_tolerance_that_serves_them_all(scenes):
    """Over several scenes, a wavelength too far from a scene's bands named that scene alone: raising the
    tolerance past it met the next scene, one error at a time over an archive. The message also counts the
    scenes that lack a band and names the tolerance that serves them all: numpy's farthest nearest band over the
    band centres zarr-python reads, rounded up to 0.1 nm, with which the loader is built (and 0.1 nm less fails)."""
    names, want = ["A", "W", "E"], np.array([455.0, 905.0])
    far = []
    for n in names:
        nm = np.asarray(zarr.open_group(scenes[n][2], mode="r").attrs["hsgds"]["wavelengths"], np.float64)
        far.append(np.abs(nm[None, :] - want[:, None]).min(axis=1).max())
    need = np.ceil(max(far) * 10) / 10
    missing = sum(f > 50 for f in far)
    assert (need, missing) == (105, 1)  # W (300..800 nm) is 105 nm from 905; A and E have 900 nm
    stores = [scenes[n][2] for n in names]
    with pytest.raises(ConfigError, match=r"^scene 'W' has no band within 50 nm of 905 nm \(nearest: 800 nm\); raise "
                                          r"wavelength_tolerance or drop that wavelength \(1 of 3 scenes lack a band "
                                          r"within 50 nm of one; wavelength_tolerance=105 gives each scene a band near "
                                          r"every one\)$"):
        hsgds.PatchLoader(stores, patch_size=5, batch_size=8, wavelengths=want.tolist(), wavelength_tolerance=50,
                          device="cpu")
    hsgds.PatchLoader(stores, patch_size=5, batch_size=8, wavelengths=want.tolist(), wavelength_tolerance=need,
                      device="cpu").close()
    with pytest.raises(ConfigError, match="lack a band"):
        hsgds.PatchLoader(stores, patch_size=5, batch_size=8, wavelengths=want.tolist(),
                          wavelength_tolerance=need - 0.1, device="cpu")


def test_mismatched_collections_are_refused_naming_the_scenes(scenes):
    with pytest.raises(ConfigError, match=r"classes: 'D' differ from 'A'"):
        hsgds.PatchLoader([scenes["A"][2], scenes["D"][2]], patch_size=3, batch_size=4, device="cpu")
    with pytest.raises(ConfigError, match=r"different band counts \(A: 6, B: 6, E: 8\); pass wavelengths="):
        hsgds.PatchLoader([scenes[n][2] for n in "ABE"], patch_size=3, batch_size=4, device="cpu")
    with pytest.raises(ConfigError, match="engine='torch'"):
        hsgds.PatchLoader([scenes["A"][2], scenes["B"][2]], patch_size=3, batch_size=4, engine="dali",
                          device="cpu")


def test_a_mismatch_among_many_scenes_names_every_value(scenes, tmp_path):
    """Over more scenes than a message lists one by one, each value is named with its scenes' count: a float32
    scene after twelve int16 ones (an archive of two sensors, listed sensor by sensor) was hidden in "and 1 more",
    so the message did not say which scenes differ."""
    cube, labels, _ = scenes["A"]
    np.save(tmp_path / "gt.npy", labels)
    opts = ConvertOptions(labels=tmp_path / "gt.npy", tile=18, max_patch=15, train=0.3, val=0.2,
                          class_names=CLASSES, dtype="float32")
    wide = convert_quietly(write_envi(tmp_path / "cube", cube, [400 + 100 * k for k in range(6)]),
                           tmp_path / "W.zarr", opts)
    many = [scenes["A"][2]] * 12
    assert hsgds.open_scene(wide).dtype == np.float32 and hsgds.open_scene(many[0]).dtype == np.int16
    with pytest.raises(ConfigError, match=r"^scenes have different dtype \(int16 in 12 scenes \(0:A, 1:A, 2:A "
                                          r"and 9 more\), float32 in 1 scene \(12:W\)\); convert them with one "
                                          r"--dtype \(e\.g\. hsgds convert --dtype float32; a collection: the same "
                                          r"hsgds convert-many command with --dtype float32\)$"):
        hsgds.PatchLoader([*many, wide], patch_size=3, batch_size=4, device="cpu")
    with pytest.raises(ConfigError, match=r"^scenes have different band counts \(6 in 12 scenes \(0:A, 1:A, 2:A "
                                          r"and 9 more\), 8 in 1 scene \(12:E\)\); pass wavelengths="):
        hsgds.PatchLoader([*many, scenes["E"][2]], patch_size=3, batch_size=4, device="cpu")


def test_scenes_with_and_without_class_names_are_refused_in_either_order(scenes, tmp_path):
    """Class names are compared whichever scene comes first: a scene without names beside one with them
    is a one-line ConfigError, not a TypeError (names first) or a silent pass (names second)."""
    d = scenes["A"][2].parent
    unnamed = convert_quietly(d / "A_cube.hdr", tmp_path / "A2.zarr",
                              ConvertOptions(labels=d / "A_gt.npy", tile=18, max_patch=15, train=0.3, val=0.2))
    assert hsgds.open_scene(unnamed).class_names is None
    for stores, bad, first in (([scenes["A"][2], unnamed], "A2", "A"), ([unnamed, scenes["A"][2]], "A", "A2")):
        # the fix names the names to give, those the named scene has (zarr-python reads them from its metadata)
        names = zarr.open_group(scenes["A"][2], mode="r").attrs["hsgds"]["class_names"]
        with pytest.raises(ConfigError, match=rf"classes: '{bad}' differ from '{first}' .*; convert the scenes "
                                              rf"without class names again with --class-names {','.join(names)} "
                                              r"\(a collection: the same convert-many command with it\)$"):
            hsgds.PatchLoader(stores, patch_size=3, batch_size=4, device="cpu")


def _all_pixels(loader):
    out = []
    for _, lab, c in loader:
        out.append(np.column_stack([c.numpy(), lab.numpy()]))
    return np.concatenate(out)


@pytest.mark.parametrize("stride", [1, 3])
def test_pixels_all_yields_every_pixel_once_in_tile_raster_order(tmp_path, stride):
    from hsgds.synthetic import make_scene

    cube, labels = make_scene(41, 37, 4, classes=3, dtype="uint16", seed=5, labelled_fraction=0.4)
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "g.npy", labels)
    store = convert(tmp_path / "c.npy", tmp_path / "s.zarr",
                    ConvertOptions(labels=tmp_path / "g.npy", tile=18, max_patch=15, padding="edge"))
    with hsgds.PatchLoader(store, patch_size=15, batch_size=50, pixels="all", stride=stride, shuffle=False,
                           normalize=None, return_coords=True, device="cpu") as loader:
        got, lab, coords = _collect(loader)
    ys, xs = np.meshgrid(np.arange(0, 41, stride), np.arange(0, 37, stride), indexing="ij")
    assert sorted(map(tuple, coords.tolist())) == sorted(zip(ys.ravel().tolist(), xs.ravel().tolist()))
    np.testing.assert_array_equal(lab, labels[coords[:, 0], coords[:, 1]].astype(np.int64) - 1)  # -1: unlabelled
    assert (lab == -1).any() and (lab >= 0).any()
    # tile by tile (tiles in grid order), raster order inside each tile
    tile = (coords[:, 0] // 18) * 3 + coords[:, 1] // 18
    assert np.all(np.diff(tile) >= 0)
    key = tile * 10_000 + coords[:, 0] * 100 + coords[:, 1]
    assert np.all(np.diff(key) > 0)
    np.testing.assert_array_equal(got, _cut(cube, coords[:, 0], coords[:, 1], 15, "edge").transpose(0, 3, 1, 2))


def _split_map(store):
    """(H, W) split code of each labelled pixel, -1 where unlabelled, from the store's sample table."""
    scene = hsgds.open_scene(store)
    table = scene.sample_table()
    split_map = np.full(scene.shape[:2], -1)
    ty, tx = np.divmod(table["tile"].astype(np.int64), scene.grid.ntx)
    split_map[ty * scene.grid.tile + table["y"], tx * scene.grid.tile + table["x"]] = table["split"]
    return split_map


def test_pixels_all_split_and_mask_restrict_pixels(scenes):
    cube, labels, store = scenes["A"]
    h, w = labels.shape
    split_map = _split_map(store)
    mask = np.zeros((h, w), bool)
    mask[5:30, 3:20] = True
    with hsgds.PatchLoader(store, patch_size=3, batch_size=64, pixels="all", split="train", mask=mask,
                           shuffle=False, return_coords=True, device="cpu") as loader:
        got = _all_pixels(loader)
    want = mask & ((split_map == 1) | (split_map == -1))
    assert sorted(map(tuple, got[:, :2].tolist())) == sorted(zip(*np.nonzero(want)))
    with pytest.raises(ConfigError, match=r"mask .* has shape \(3, 3\)"):
        hsgds.PatchLoader(store, patch_size=3, batch_size=4, pixels="all", mask=np.ones((3, 3), bool), device="cpu")
    with pytest.raises(ConfigError, match="stride"):
        hsgds.PatchLoader(store, patch_size=3, batch_size=4, stride=2, device="cpu")


def test_an_unknown_split_is_refused_over_unlabelled_scenes_too(tmp_path):
    """pixels='all' looked the split's name up only in a labelled scene's sample table: over unlabelled
    scenes a misspelt split was taken silently (the same call on a labelled store is refused)."""
    from hsgds.errors import InputError
    from hsgds.synthetic import make_scene

    cube, _ = make_scene(20, 20, 4, classes=2, dtype="int16", seed=3)
    np.save(tmp_path / "c.npy", cube)
    bare = convert(tmp_path / "c.npy", tmp_path / "bare.zarr", ConvertOptions(tile=28, max_patch=5))  # unlabelled
    for store, more in ((bare, {}), (bare, {"stride": 2}), (bare, {"mask": np.ones((20, 20), bool)}),
                        ([bare, bare], {})):
        with pytest.raises(InputError, match="unknown split 'trian'; choose one of none, train, val, test"):
            hsgds.PatchLoader(store, patch_size=3, batch_size=8, pixels="all", split="trian", device="cpu", **more)
    with hsgds.PatchLoader(bare, patch_size=3, batch_size=8, pixels="all", split="train", device="cpu") as loader:
        assert len(loader.samples) == 400  # a known split: every pixel of an unlabelled scene, as before


def test_labelled_pixels_of_unlabelled_scenes_are_refused_saying_they_have_no_labels(tmp_path):
    """The default loader (pixels='labelled', split='train') over unlabelled scenes said 'has no train pixels
    ...; see `hsgds info` for its splits' (or, with a mask, 'widen the mask'), as if a split were the problem:
    it names the missing labels and pixels='all', with any split or mask."""
    from hsgds.synthetic import make_scene

    cube, _ = make_scene(20, 20, 4, classes=2, dtype="int16", seed=3)
    np.save(tmp_path / "c.npy", cube)
    bare = convert(tmp_path / "c.npy", tmp_path / "bare.zarr", ConvertOptions(tile=28, max_patch=5))  # unlabelled
    for store, more in ((bare, {}), (bare, {"split": "val"}), (bare, {"mask": np.ones((20, 20), bool)}),
                        ([bare, bare], {}), ([bare, bare], {"mask": [None, np.ones((20, 20), bool)]})):
        with pytest.raises(ConfigError, match=r"ha(s|ve) no labelled pixels; convert with --labels, or pass "
                                              r"pixels='all' for every pixel \(label -1\)$"):
            hsgds.PatchLoader(store, patch_size=3, batch_size=8, device="cpu", **more)


@pytest.mark.parametrize("split,stride", [("train", 1), ("test", 2), ("val", 3)])
def test_pixels_all_with_a_split_keeps_memory_per_labelled_pixel(scenes, split, stride):
    """One store, every s-th pixel but the other splits' labelled ones: computed per batch (GridSamples with
    those pixels left out, not a list of every pixel), the same pixels in the same order as the split map
    says, with their labels."""
    from hsgds.format import SPLIT_CODES
    from hsgds.pixels import GridSamples

    cube, labels, store = scenes["B"]
    scene = hsgds.open_scene(store)
    h, w = labels.shape
    split_map = _split_map(store)
    with hsgds.PatchLoader(store, patch_size=3, batch_size=64, pixels="all", split=split, stride=stride,
                           shuffle=False, return_coords=True, device="cpu") as loader:
        assert isinstance(loader.samples, GridSamples)
        got, lab, coords = _collect(loader)
    keep = np.zeros((h, w), bool)
    keep[::stride, ::stride] = True
    keep &= (split_map == SPLIT_CODES[split]) | (split_map == -1)
    ys, xs = np.nonzero(keep)
    order = np.lexsort((xs, ys, (ys // 18) * scene.grid.ntx + xs // 18))  # tile by tile, raster order inside
    np.testing.assert_array_equal(coords, np.column_stack([ys[order], xs[order]]))
    np.testing.assert_array_equal(lab, labels[ys[order], xs[order]].astype(np.int64) - 1)
    assert (split_map[coords[:, 0], coords[:, 1]] != -1).any()  # the split's own labelled pixels stay


def test_pixels_all_over_a_collection_with_masks(scenes):
    names = ["A", "B"]
    masks = [None, np.zeros(scenes["B"][1].shape, bool)]
    masks[1][:, :7] = True
    with hsgds.PatchLoader([scenes[n][2] for n in names], patch_size=5, batch_size=100, pixels="all", stride=2,
                           mask=masks, return_coords=True, device="cpu") as loader:
        got = _all_pixels(loader)
    want = {(0, y, x) for y in range(0, 40, 2) for x in range(0, 35, 2)}
    want |= {(1, y, x) for y in range(0, 23, 2) for x in range(0, 7, 2)}
    assert len(got) == len(want) and set(map(tuple, got[:, :3].tolist())) == want
    with pytest.raises(ConfigError, match="list of 2"):
        hsgds.PatchLoader([scenes[n][2] for n in names], patch_size=5, batch_size=8, pixels="all",
                          mask=masks[1], device="cpu")


def test_the_mask_fingerprint_is_of_the_bits_of_every_scene():
    """A thousand scenes' masks: the same bits in any layout give the same fingerprint, one pixel of the last
    scene or a reshape changes it, an all-False mask is not None (the loader refuses it anyway), no mask
    at all is None."""
    from hsgds.loader import _masks_digest

    rng = np.random.default_rng(0)
    masks = [rng.random((23, 41)) < 0.3 for _ in range(1000)]
    key = _masks_digest(masks)
    assert key == _masks_digest([np.asfortranarray(m) for m in masks])
    assert key == _masks_digest([np.frombuffer(np.ascontiguousarray(m).view(np.uint8) * 7, bool).reshape(m.shape)
                                 for m in masks])  # bytes other than 1 that numpy reads as True
    flipped = [m.copy() for m in masks]
    flipped[999][22, 40] = not flipped[999][22, 40]
    assert _masks_digest(flipped) != key
    assert _masks_digest(masks[:999] + [masks[999].reshape(41, 23)]) != key
    assert _masks_digest(masks[:999] + [None]) != _masks_digest(masks[:999] + [np.zeros((23, 41), bool)]) != key
    assert _masks_digest([None] * 1000) is None


def _coord_batches(loader, limit=None):
    out = []
    for i, (_, _, c) in enumerate(loader):
        if limit is not None and i >= limit:
            break
        out.append(tuple(map(tuple, c.numpy())))
    return out


@pytest.mark.parametrize("stop_after", [0, 4, "end"])
def test_collection_resumes_exactly(scenes, stop_after):
    stores = [scenes[n][2] for n in "ABC"]
    opts = dict(patch_size=5, batch_size=24, split="train", return_coords=True, device="cpu", seed=4,
                shuffle_window=3, ring_bytes=6 * hsgds.open_scene(stores[0]).grid.tile_nbytes)
    with hsgds.PatchLoader(stores, **opts) as full:
        expected = _coord_batches(full) + _coord_batches(full)
    with hsgds.PatchLoader(stores, **opts) as first:
        n = len(first) if stop_after == "end" else stop_after
        it = iter(first)
        got = [tuple(map(tuple, next(it)[2].numpy())) for _ in range(n)]
        state = first.state_dict()
    with hsgds.PatchLoader(stores, **opts) as second:
        second.load_state_dict(state)
        got += _coord_batches(second) + _coord_batches(second)
    assert got == expected
    # other stores, or the same ones in another order (as many samples, other ones at each position): refused
    with hsgds.PatchLoader(stores[:2], **opts) as other, pytest.raises(ConfigError, match="saved with num_samples="):
        other.load_state_dict(state)
    with hsgds.PatchLoader(stores[::-1], **opts) as reordered, \
            pytest.raises(ConfigError, match=r"^loader state was saved over other samples \(another store or scene order"):
        reordered.load_state_dict(state)


def test_a_collection_resumes_only_under_the_same_masks(scenes):
    """Two masks selecting as many pixels in every tile (so the same sample counts) but other pixels: a state
    saved under one is refused by a loader under the other, which would yield other pixels for the rest of
    the epoch; the same masks (other arrays, a torch tensor, Fortran order) resume exactly; a state saved
    before states recorded the mask (no "mask" key) still loads."""
    stores = [scenes[n][2] for n in "AB"]
    one = [np.zeros(scenes[n][1].shape, bool) for n in "AB"]
    other = [m.copy() for m in one]
    one[0][2:16, 3], other[0][2:16, 4] = True, True  # scene A's first tile (18 px): 14 pixels either way
    one[1][:, 0] = other[1][:, 0] = True
    opts = dict(patch_size=5, batch_size=6, pixels="all", return_coords=True, device="cpu", seed=3,
                ring_bytes=4 * hsgds.open_scene(stores[0]).grid.tile_nbytes)
    with hsgds.PatchLoader(stores, mask=one, **opts) as full:
        expected = _coord_batches(full)
    with hsgds.PatchLoader(stores, mask=one, **opts) as first:
        it = iter(first)
        got = [tuple(map(tuple, next(it)[2].numpy())) for _ in range(3)]
        state = first.state_dict()
    with hsgds.PatchLoader(stores, mask=other, **opts) as wrong:
        assert wrong.samples.counts().tolist() == first.samples.counts().tolist()  # counts cannot tell them apart
        with pytest.raises(ConfigError) as refused:
            wrong.load_state_dict(state)
        message = str(refused.value)
        assert "saved with mask" in message and "build the loader with the same mask" in message
        assert "\n" not in message
        wrong.load_state_dict({k: v for k, v in state.items() if k != "mask"})  # a state saved before masks counted
    with hsgds.PatchLoader(stores, mask=None, **opts) as unmasked:
        with pytest.raises(ConfigError, match="saved with mask .* this loader has no mask"):
            unmasked.load_state_dict(state)
    same = [np.asfortranarray(one[0]), torch.from_numpy(one[1].copy())]
    with hsgds.PatchLoader(stores, mask=same, **opts) as second:
        second.load_state_dict(state)
        got += _coord_batches(second)
    assert got == expected
    # where the mask keeps exactly these pixels, against numpy
    want = {(s, int(y), int(x)) for s, m in enumerate(one) for y, x in zip(*np.nonzero(m))}
    assert {row[:3] for batch in got for row in batch} == want


def test_collection_shards_across_two_ranks(scenes):
    stores = [scenes[n][2] for n in "ABC"]
    shards = []
    for rank in (0, 1):
        with hsgds.PatchLoader(stores, patch_size=3, batch_size=16, split="train", rank=rank, world_size=2,
                               return_coords=True, device="cpu", seed=2) as ld:
            shards.append(_coord_batches(ld))
    assert len(shards[0]) == len(shards[1])
    seen = [c for shard in shards for batch in shard for c in batch]
    want = {(s, int(y), int(x)) for s, n in enumerate("ABC")
            for y, x in zip(*hsgds.open_scene(scenes[n][2]).samples("train")[:2])}
    assert set(seen) == want  # together the ranks cover every train sample (padding repeats a few)


def test_scene_missing_mid_epoch_names_scene_and_tile(scenes, tmp_path):
    stores = []
    for n in "AB":
        stores.append(shutil.copytree(scenes[n][2], tmp_path / f"{n}.zarr"))
    with hsgds.PatchLoader(stores, patch_size=3, batch_size=8, split=None, shuffle=False, device="cpu",
                           ring_bytes=2 * hsgds.open_scene(stores[0]).grid.tile_nbytes) as loader:
        it = iter(loader)
        next(it)
        shutil.rmtree(stores[1])
        with pytest.raises(TileReadError, match=r"B\.zarr.*tiles"):
            for _ in it:
                pass


def test_open_descriptors_stay_bounded(scenes):
    import os

    stores = [scenes[n][2] for n in "ABC"]
    before = len(os.listdir("/proc/self/fd"))
    peak = before
    with hsgds.PatchLoader(stores, patch_size=3, batch_size=8, split=None, device="cpu") as loader:
        for _ in loader:
            peak = max(peak, len(os.listdir("/proc/self/fd")))
    assert peak - before <= 64


def test_collection_path_is_read_like_a_list_of_its_stores(scenes, tmp_path):
    from hsgds.collection import SceneEntry, write_collection

    names = ["A", "B"]
    folder = tmp_path / "coll"
    folder.mkdir()
    for n in names:
        shutil.copytree(scenes[n][2], folder / f"{n}.zarr")
    write_collection(folder, [SceneEntry.of_scene(n, hsgds.open_scene(folder / f"{n}.zarr")) for n in names])
    opts = dict(patch_size=3, batch_size=32, split="train", return_coords=True, device="cpu", seed=5)
    with hsgds.PatchLoader(folder, **opts) as a, hsgds.PatchLoader(folder / "collection.json", **opts) as b, \
            hsgds.PatchLoader([scenes[n][2] for n in names], **opts) as c, \
            hsgds.PatchLoader(hsgds.open_collection(folder), **opts) as d:  # the object open_collection gives
        assert a.scenes.names == d.scenes.names == ("A", "B")
        got_a, got_b, got_c, got_d = _collect(a), _collect(b), _collect(c), _collect(d)
    for x, y in ((got_a, got_b), (got_a, got_c), (got_a, got_d)):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


def test_a_collection_loader_opens_each_store_when_it_first_reaches_it(tmp_path):
    """collection.json alone starts the loader: of 1,000 listed scenes only the first exists, and the
    loader is built and yields that scene's batch (equal to its own loader's) before it reaches the second,
    which is then named as missing."""
    import json

    from hsgds.collection import SceneEntry
    from hsgds.errors import StoreError
    from hsgds.synthetic import make_scene

    cube, _ = make_scene(20, 30, 4, classes=2, dtype="int16", seed=3)
    np.save(tmp_path / "cube.npy", cube)
    src = convert(tmp_path / "cube.npy", tmp_path / "src.zarr", ConvertOptions(tile=28, max_patch=5))  # unlabelled
    folder = tmp_path / "coll"
    (folder / "stores").mkdir(parents=True)
    template = SceneEntry.of_scene("x", hsgds.open_scene(src)).to_json(folder)
    assert (template["tile"], template["halo"], template["format_version"]) == (28, 2, 2)
    scenes = [dict(template, name=f"s{i:04d}", path=f"stores/s{i:04d}.zarr") for i in range(1000)]
    (folder / "collection.json").write_text(json.dumps({"format": "hsgds-collection", "format_version": 1,
                                                        "scenes": scenes}))
    shutil.copytree(src, folder / "stores/s0000.zarr")
    opts = dict(patch_size=3, batch_size=600, pixels="all", shuffle=False, device="cpu")
    tile_nbytes = hsgds.open_scene(src).grid.tile_nbytes
    # a ring of the first scene's two tiles: the reader cannot run ahead into the missing second store
    with hsgds.PatchLoader(folder, ring_bytes=2 * tile_nbytes, **opts) as loader, \
            hsgds.PatchLoader(src, **opts) as alone:
        assert len(loader.scenes) == 1000 and not any(s.is_open for s in loader.scenes.scenes)
        it = iter(loader)
        first, labels = next(it)  # the first scene's 600 pixels: its two tiles, one store opened
        want, want_labels = next(iter(alone))
        torch.testing.assert_close(first, want, rtol=0, atol=0)
        assert torch.equal(labels, want_labels) and (labels == -1).all()
        assert [s.is_open for s in loader.scenes.scenes[:3]] == [True, False, False]
        with pytest.raises(StoreError, match=r"scene 's0001': store .*s0001\.zarr is missing"):
            next(it)


@pytest.mark.parametrize("numba", [True, False], ids=["fused", "torch-ops"])
def test_deferred_collection_equals_its_stores_opened_first(scenes, tmp_path, numba):
    """Every pixel of a collection read with its stores opened as the loader reaches them (per-scene
    normalization filled in on first use) equals the same stores opened up front, bit for bit."""
    from hsgds import defaults
    from hsgds.collection import SceneEntry, write_collection

    names = ["A", "B", "C"]
    folder = tmp_path / "coll"
    folder.mkdir()
    for n in names:
        shutil.copytree(scenes[n][2], folder / f"{n}.zarr")
    write_collection(folder, [SceneEntry.of_scene(n, hsgds.open_scene(folder / f"{n}.zarr")) for n in names])
    opts = dict(patch_size=5, batch_size=64, pixels="all", stride=2, return_coords=True, device="cpu", seed=2)
    with defaults.set(numba=numba), hsgds.PatchLoader(folder, **opts) as deferred, \
            hsgds.PatchLoader([folder / f"{n}.zarr" for n in names], **opts) as opened:
        assert len(deferred._norm_later) == 3  # every scene's normalization waits for its first batch
        for (p, lb, c), (q, lb2, c2) in zip(deferred, opened, strict=True):
            assert torch.equal(c, c2) and torch.equal(lb, lb2)
            torch.testing.assert_close(p, q, rtol=0, atol=0)
        assert not deferred._norm_later


def test_a_deferred_collection_first_reached_under_inference_mode_then_outside(scenes, tmp_path):
    """The torch-ops cut (numba off, or not installed) of a collection: the per-scene normalization tables are
    made at the first batch and a scene's rows filled in when a batch first reaches it. Made under
    torch.inference_mode() (an evaluation batch), they were inference tensors that the rows of a scene reached
    later, outside it, could not be written into (torch's RuntimeError). The batches equal those of the stores
    opened up front."""
    from hsgds import defaults

    names = ["A", "B", "C"]
    folder = _collection_of(scenes, tmp_path / "coll", names)
    opts = dict(patch_size=5, batch_size=64, pixels="all", stride=2, return_coords=True, device="cpu", shuffle=False)
    with defaults.set(numba=False), hsgds.PatchLoader(folder, **opts) as deferred, \
            hsgds.PatchLoader([folder / f"{n}.zarr" for n in names], **opts) as opened:
        batches = iter(deferred)
        with torch.inference_mode():
            got = [next(batches)]
        assert len(deferred._norm_later) == 2  # (B and C are reached outside)
        got += list(batches)
        for (p, lb, c), (q, lb2, c2) in zip(got, opened, strict=True):
            assert torch.equal(c, c2) and torch.equal(lb, lb2)
            torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_a_deferred_collection_normalizes_its_tiles_in_the_ring(scenes, tmp_path):
    """bfloat16 over a collection whose scenes' statistics are read on first use: tiles normalized as they
    land in the ring (a reader thread reads a scene's statistics when it gets there before the batches do)
    give the same batches as the fused kernel on stored values, over two epochs through a ring of 4 slots
    for the 16 tiles (tiles read again each epoch)."""
    from hsgds import defaults

    folder = _collection_of(scenes, tmp_path / "coll", ["A", "B", "C"])
    opts = dict(patch_size=5, batch_size=32, pixels="all", stride=2, return_coords=True, device="cpu", seed=2,
                dtype=torch.bfloat16, ring_bytes=4 * hsgds.open_scene(folder / "A.zarr").grid.tile_nbytes)
    loaders = {}
    for flag in (True, False):
        with defaults.set(normalize_tiles=flag):
            loaders[flag] = hsgds.PatchLoader(folder, **opts)
    with loaders[True] as normalized, loaders[False] as stored:
        assert any("tiles normalized once" in r for r in normalized.stats.reasons)
        assert len(normalized._norm_later) == 3 and normalized.slots == 4
        for _ in range(2):
            for (p, lb, c), (q, lb2, c2) in zip(normalized, stored, strict=True):
                assert torch.equal(c, c2) and torch.equal(lb, lb2)
                assert torch.equal(p.view(torch.int16), q.view(torch.int16))
        assert not normalized._norm_later and normalized.stats.tiles_loaded > 16


def test_a_deferred_scene_that_would_overflow_float16_is_refused_when_first_reached(scenes, tmp_path):
    """A collection's scenes are checked against the output dtype as they are opened, not at start: B's
    train std of band 1 made 1e-3 (its values normalize far past 65504) starts a float16 loader without
    opening a store, and the first batch reaching B is refused naming it; float32 patches of B do pass
    65504 there."""
    import zarr

    folder = _collection_of(scenes, tmp_path / "coll", ["A", "B", "C"])
    std = zarr.open_array(folder / "B.zarr" / "stats" / "train" / "std", mode="r+")
    values = std[:]
    values[1] = 1e-3
    std[:] = values
    opts = dict(patch_size=3, batch_size=64, shuffle=False, return_coords=True, device="cpu")
    with hsgds.PatchLoader(folder, dtype=torch.float16, **opts) as loader:
        assert not any(s.is_open for s in loader.scenes.scenes)
        seen = set()
        with pytest.raises(ConfigError, match=r"^float16 patches would overflow to inf: output band 1 of scene 'B' "
                                              r"holds .*\* 1000, reaching"):
            for p, _, c in loader:
                assert torch.isfinite(p).all()
                seen.update(c[:, 0].tolist())
        assert seen == {0}  # A's batches came first
    with hsgds.PatchLoader(folder, dtype=torch.float32, **opts) as loader:
        assert max(float(p[c[:, 0] == 1, 1].abs().max()) for p, _, c in loader if (c[:, 0] == 1).any()) > 65504


def _collection_of(scenes, folder, names):
    """``folder`` holding copies of the named stores and their collection.json."""
    from hsgds.collection import SceneEntry, write_collection

    folder.mkdir()
    for n in names:
        shutil.copytree(scenes[n][2], folder / f"{n}.zarr")
    write_collection(folder, [SceneEntry.of_scene(n, hsgds.open_scene(folder / f"{n}.zarr")) for n in names])
    return folder


@pytest.mark.parametrize("split, rank, world", [("train", 0, 1), (None, 0, 1), ("test", 1, 2)])
def test_listed_samples_equal_the_stores_opened_first(scenes, tmp_path, split, rank, world):
    """A labelled collection's samples, counted per tile in collection.json and read from each store when
    its first sample is taken: the loader starts with no store opened, and every batch (patches, labels,
    scene coordinates) and every sample lookup equals the same stores opened up front."""
    from hsgds.pixels import ListedSamples

    names = ["A", "B", "C"]
    folder = _collection_of(scenes, tmp_path / "coll", names)
    opts = dict(patch_size=5, batch_size=64, split=split, return_coords=True, device="cpu", seed=4, rank=rank,
                world_size=world)
    with hsgds.PatchLoader(folder, **opts) as listed, \
            hsgds.PatchLoader([folder / f"{n}.zarr" for n in names], **opts) as opened:
        assert isinstance(listed.samples, ListedSamples)
        assert not any(s.is_open for s in listed.scenes.scenes)
        assert len(listed.samples) == len(opened.samples)
        np.testing.assert_array_equal(listed.samples.offsets, opened.samples.offsets)
        for (p, lb, c), (q, lb2, c2) in zip(listed, opened, strict=True):
            assert torch.equal(c, c2) and torch.equal(lb, lb2)
            torch.testing.assert_close(p, q, rtol=0, atol=0)
        assert all(s.is_open for s in listed.scenes.scenes)
        idx = np.random.default_rng(0).permutation(len(opened.samples))
        for a, b in zip(listed.samples.take(idx), opened.samples.take(idx), strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
        # the same samples, however the loader came to them: a state of one resumes in the other
        opened.load_state_dict(listed.state_dict())
        listed.load_state_dict(opened.state_dict())


def test_a_labelled_collection_starts_without_opening_a_store(scenes, tmp_path):
    """Of 1,000 listed labelled scenes only the first exists: the loader is built from collection.json
    alone and yields that scene's first train batch (equal to its own loader's); the second scene is named
    as missing when the loader reaches it."""
    import json

    from hsgds.collection import SceneEntry
    from hsgds.errors import StoreError

    folder = tmp_path / "coll"
    (folder / "stores").mkdir(parents=True)
    src = scenes["A"][2]
    template = SceneEntry.of_scene("x", hsgds.open_scene(src)).to_json(folder)
    listed = [dict(template, name=f"s{i:04d}", path=f"stores/s{i:04d}.zarr") for i in range(1000)]
    (folder / "collection.json").write_text(json.dumps({"format": "hsgds-collection", "format_version": 1,
                                                        "scenes": listed}))
    shutil.copytree(src, folder / "stores/s0000.zarr")
    opts = dict(patch_size=3, batch_size=32, split="train", shuffle=False, device="cpu")
    ring = 3 * hsgds.open_scene(src).grid.tile_nbytes
    with hsgds.PatchLoader(folder, ring_bytes=ring, **opts) as loader, hsgds.PatchLoader(src, **opts) as alone:
        assert len(loader.samples) == 1000 * len(alone.samples)
        assert not any(s.is_open for s in loader.scenes.scenes)
        it = iter(loader)
        got, labels = next(it)  # the first scene's first 32 train pixels: one store opened
        want, want_labels = next(iter(alone))
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert torch.equal(labels, want_labels)
        assert [s.is_open for s in loader.scenes.scenes[:3]] == [True, False, False]
        with pytest.raises(StoreError, match=r"scene 's0001': store .*s0001\.zarr is missing"):
            for _ in it:  # named when the loader reaches it (its tiles read ahead, or its samples)
                pass


def test_a_store_resplit_after_its_collection_is_named(scenes, tmp_path):
    """collection.json counts each split's samples per tile; a store re-split since then is refused,
    naming the scene and the fix, not read with a plan made for other counts."""
    from hsgds.errors import StoreError
    from hsgds.preprocess.resplit import resplit
    from hsgds.preprocess.splits import UnsplittableClassWarning

    folder = _collection_of(scenes, tmp_path / "coll", ["A", "B"])
    with pytest.warns(UnsplittableClassWarning, match=r"classes 1 \(1 px: 1 train, 0 test\), 4 \(1 px"):
        resplit(folder / "B.zarr", train=0.6, seed=9)  # (the fixture's one pixel of classes 1 and 4: train)
    with hsgds.PatchLoader(folder, patch_size=3, batch_size=64, split="train", device="cpu") as loader:
        with pytest.raises(StoreError, match=r"scene 'B' .*: its labelled samples differ from collection.json .*"
                                             r"re-split.*run `hsgds convert-many` again"):
            for _ in loader:
                pass


@pytest.mark.parametrize("pixels", ["all", "labelled"])
def test_an_epoch_keeps_one_scene_open_and_yields_the_same_batches(scenes, tmp_path, pixels):
    """With max_open_scenes=1 and no byte for label maps or sample tables, an epoch over six scenes through a
    ring of three tiles keeps at most one store open and the labels of at most three scenes (those of the
    resident tiles) at any batch, each dropped scene reopened, checked and read again when a batch needs
    it, and yields the same batches, bit for bit, as with the defaults."""
    from hsgds import defaults
    from hsgds.collection import SceneEntry, write_collection

    folder = tmp_path / "coll"
    folder.mkdir()
    names = ["A", "B", "C", "A2", "B2", "C2"]
    for n in names:
        shutil.copytree(scenes[n[0]][2], folder / f"{n}.zarr")
    write_collection(folder, [SceneEntry.of_scene(n, hsgds.open_scene(folder / f"{n}.zarr")) for n in names])
    opts = dict(patch_size=5, batch_size=8, pixels=pixels, return_coords=True, device="cpu", seed=3,
                ring_bytes=3 * hsgds.open_scene(folder / "A.zarr").grid.tile_nbytes)
    if pixels == "all":
        opts.update(stride=2, split=None)
    with hsgds.PatchLoader(folder, **opts) as ref:
        want = [tuple(t.clone() for t in batch) for batch in ref]
    with defaults.set(max_open_scenes=1, sample_cache_bytes=0), hsgds.PatchLoader(folder, **opts) as small:
        assert small.slots == 3
        got = []
        for batch in small:
            got.append(batch)
            assert sum(s.is_open for s in small.scenes.scenes) <= 1 and len(small.samples._per_scene) <= 3
    assert len(got) == len(want) > 6
    for (p, lb, c), (q, lb2, c2) in zip(got, want, strict=True):
        assert torch.equal(c, c2) and torch.equal(lb, lb2)
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert len({int(s) for _, _, c in got for s in c[:, 0]}) == 6  # every scene was read


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_pixel_but_other_splits_starts_without_opening_a_store(scenes, tmp_path, split):
    """pixels="all" with a split over a collection (self-supervised training that never sees a validation or
    test pixel): counted per tile from collection.json (each tile's pixels less the other splits' labelled
    ones), so no store is opened at construction, and every batch equals the same stores opened first."""
    from hsgds.pixels import ListedSamples

    names = ["A", "B", "C"]
    folder = _collection_of(scenes, tmp_path / "coll", names)
    opts = dict(patch_size=5, batch_size=64, pixels="all", split=split, return_coords=True, device="cpu", seed=5)
    with hsgds.PatchLoader(folder, **opts) as listed, \
            hsgds.PatchLoader([folder / f"{n}.zarr" for n in names], **opts) as opened:
        assert isinstance(listed.samples, ListedSamples)
        assert not any(s.is_open for s in listed.scenes.scenes)
        np.testing.assert_array_equal(listed.samples.offsets, opened.samples.offsets)
        for (p, lb, c), (q, lb2, c2) in zip(listed, opened, strict=True):
            assert torch.equal(c, c2) and torch.equal(lb, lb2)
            torch.testing.assert_close(p, q, rtol=0, atol=0)
    with hsgds.PatchLoader(folder, **opts, stride=2) as strided:  # a stride's lattice is not counted: opened
        assert not isinstance(strided.samples, ListedSamples)


# -- source nodata (format v3) ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nodata_pair(nodata_store, tmp_path_factory):
    """A collection of two 70 x 50 stores (tiles of 28): "swath" with nodata outside a slanted swath and
    "clear" with none; returns (folder, {name: nodata (H, W) bool})."""
    from hsgds.collection import SceneEntry, write_collection

    folder = tmp_path_factory.mktemp("nodata-coll")
    masks = {}
    for name, seed, none in (("swath", 3, False), ("clear", 4, True)):
        mask = np.zeros((70, 50), bool) if none else None
        store, _, _, masks[name] = nodata_store(70, 50, 8, seed=seed, nodata=mask)
        shutil.copytree(store, folder / f"{name}.zarr")
    write_collection(folder, [SceneEntry.of_scene(n, hsgds.open_scene(folder / f"{n}.zarr")) for n in masks])
    return folder, masks


def _pixel_rows(loader):
    return np.concatenate([c.numpy() for _, _, c in loader]).astype(np.int64)


@pytest.mark.parametrize("stride, split, unlisted", [(1, None, False), (2, None, False), (1, "train", False),
                                                     (1, None, True)])
def test_a_collection_over_every_pixel_leaves_out_nodata(nodata_pair, tmp_path, stride, split, unlisted):
    """From collection.json (stride 1: no store opened to start, the listing counting each tile's nodata
    pixels; a stride: only the scene with nodata is opened, for its map) and from the stores opened first:
    the same batches, exactly the pixels with data (less other splits' labelled ones), and two ranks cover
    them; a listing written before nodata_pixels existed gives the same (its stores are opened to tell)."""
    import json

    from hsgds.pixels import ListedSamples

    folder, masks = nodata_pair
    if unlisted:
        folder = shutil.copytree(folder, tmp_path / "old")
        doc = json.loads((folder / "collection.json").read_text())
        for entry in doc["scenes"]:
            del entry["nodata_pixels"], entry["tile_nodata"]
        (folder / "collection.json").write_text(json.dumps(doc))
    stores = [folder / f"{n}.zarr" for n in masks]
    opts = dict(patch_size=5, batch_size=64, pixels="all", stride=stride, split=split, return_coords=True,
                device="cpu", seed=9)
    with hsgds.PatchLoader(folder, **opts) as listed, hsgds.PatchLoader(stores, **opts) as opened:
        states = [s.is_open for s in listed.scenes.scenes]
        assert states == [stride != 1 or unlisted, unlisted]
        assert isinstance(listed.samples, ListedSamples) == (stride == 1 and not unlisted)
        assert len(listed) == len(opened)
        np.testing.assert_array_equal(listed.samples.offsets, opened.samples.offsets)
        for (p, lb, c), (q, lb2, c2) in zip(listed, opened, strict=True):
            assert torch.equal(c, c2) and torch.equal(lb, lb2)
            torch.testing.assert_close(p, q, rtol=0, atol=0)
        got = _pixel_rows(listed)
    want = set()
    for s, (name, mask) in enumerate(masks.items()):
        keep = np.zeros(mask.shape, bool)
        keep[::stride, ::stride] = True
        keep &= ~mask
        if split is not None:
            y, x, _ = hsgds.open_scene(folder / f"{name}.zarr").samples(None)
            ty, tx, _ = hsgds.open_scene(folder / f"{name}.zarr").samples(split)
            keep[y, x] = False
            keep[ty, tx] = True
        want |= {(s, int(y), int(x)) for y, x in zip(*np.nonzero(keep))}
    assert len(got) == len(want) and {tuple(r) for r in got.tolist()} == want
    shards = []
    for rank in (0, 1):
        with hsgds.PatchLoader(folder, rank=rank, world_size=2, **opts) as ld:
            shards.append(_pixel_rows(ld))
    assert len(shards[0]) == len(shards[1]) and len(want) <= len(shards[0]) * 2 <= len(want) + 2
    assert {tuple(r) for shard in shards for r in shard.tolist()} == want


def test_a_collection_listing_the_wrong_nodata_count_is_refused(nodata_pair, tmp_path):
    import json

    folder = shutil.copytree(nodata_pair[0], tmp_path / "coll")
    doc = json.loads((folder / "collection.json").read_text())
    assert [e["nodata_pixels"] for e in doc["scenes"]] == [int(nodata_pair[1]["swath"].sum()), 0]
    # each tile's count, against numpy over the mask (tiles of 28: 3 x 2)
    mask = nodata_pair[1]["swath"]
    assert doc["scenes"][0]["tile_nodata"] == [int(mask[y:y + 28, x:x + 28].sum()) for y in (0, 28, 56)
                                               for x in (0, 28)]
    assert doc["scenes"][1]["tile_nodata"] is None
    listed = doc["scenes"][0]["tile_nodata"]
    for bad, message in (([1] * 5, "tile_nodata must be null or 6 counts"),
                         ([*listed[:-1], listed[-1] + 1], "tile_nodata count .* nodata_pixels says")):
        doc["scenes"][0]["tile_nodata"] = bad
        (folder / "collection.json").write_text(json.dumps(doc))
        with pytest.raises(StoreError, match=rf"scene 0 \('swath'\): {message}"):
            hsgds.open_collection(folder)
    doc["scenes"][0]["tile_nodata"] = listed
    doc["scenes"][0]["nodata_pixels"] = 3
    doc["scenes"][0]["tile_nodata"] = None
    (folder / "collection.json").write_text(json.dumps(doc))
    with pytest.raises(StoreError, match=r"scene 'swath': the store's nodata pixel count differs from collection"):
        hsgds.PatchLoader(folder, patch_size=5, batch_size=8, pixels="all", device="cpu")
    doc["scenes"][0]["nodata_pixels"] = -1
    (folder / "collection.json").write_text(json.dumps(doc))
    with pytest.raises(StoreError, match=r"scene 0 \('swath'\): nodata_pixels must be null or an integer in 0..3500"):
        hsgds.open_collection(folder)


def test_pooled_statistics_of_unlabelled_scenes_weigh_only_their_pixels_with_data(tmp_path):
    """Scenes without a train split are normalized with the statistics of their pixels with data: pooled
    over a collection (norm_scope="collection"), each weighs its count of those, not H x W."""
    from hsgds.synthetic import make_scene
    from tests.conftest import swath_nodata

    stores, data = [], []
    for name, seed, gaps in (("swath", 1, True), ("clear", 2, False)):
        cube, _ = make_scene(70, 50, 8, classes=3, seed=seed)
        mask = swath_nodata(70, 50, seed) if gaps else np.zeros((70, 50), bool)
        source = cube.copy()
        source[mask] = -9999
        np.save(tmp_path / f"{name}.npy", source)
        stores.append(convert_quietly(tmp_path / f"{name}.npy", tmp_path / f"{name}.zarr",
                                      ConvertOptions(tile=28, max_patch=5, nodata=-9999.0)))
        data.append(cube[~mask].astype(np.float64))
    pixels = np.concatenate(data)
    with hsgds.PatchLoader(stores, patch_size=3, batch_size=8, pixels="all", norm_scope="collection",
                           device="cpu") as loader:
        np.testing.assert_allclose(loader.norm_stats.mean, pixels.mean(0), rtol=1e-9)
        np.testing.assert_allclose(loader.norm_stats.std, pixels.std(0), rtol=1e-9)


def test_scenes_of_other_band_centres_are_not_mixed_band_by_band(scenes):
    """Two sensors with as many bands (A: 400..900 nm, W: 300..800 nm, 6 each) loaded without wavelengths= were
    mixed band i with band i, other wavelengths, silently. Centres zarr-python reads that differ by more than
    wavelength_tolerance at a band index are refused in one line naming the band, both scenes and the tolerance
    that takes them by index anyway (all bands, or the bands= given); wavelengths= aligns them."""
    a, w = scenes["A"][2], scenes["W"][2]
    nm = {k: np.asarray(zarr.open_group(scenes[k][2], mode="r").attrs["hsgds"]["wavelengths"]) for k in "AW"}
    spread = np.abs(nm["A"] - nm["W"])
    assert spread.min() > 5
    with pytest.raises(ConfigError, match=rf"^scenes record other band centres at the same band index \(band 0: "
                                          rf"{nm['W'][0]:g} nm in 'W', {nm['A'][0]:g} nm in 'A'; 6 of 6 bands differ "
                                          r"by more than wavelength_tolerance=5 nm\), so band by band .* pass "
                                          rf"wavelengths=\[\.\.\.\] .* or wavelength_tolerance={spread.max():g} to "
                                          r"take them by index anyway$"):
        hsgds.PatchLoader([a, w], patch_size=3, batch_size=4, device="cpu")
    with pytest.raises(ConfigError, match=r"\(bands\[0\] \(band 2\): 500 nm in .W., 600 nm in .A.; 2 of 2 bands"):
        hsgds.PatchLoader([a, w], patch_size=3, batch_size=4, bands=[2, 4], wavelength_tolerance=99, device="cpu")
    # the tolerance the message names takes them by index; wavelengths= takes each scene's nearest band
    hsgds.PatchLoader([a, w], patch_size=3, batch_size=4, wavelength_tolerance=float(spread.max()), device="cpu").close()
    hsgds.PatchLoader([a, w], patch_size=3, batch_size=4, wavelengths=[500, 700], device="cpu").close()
    hsgds.PatchLoader([a, scenes["B"][2], scenes["C"][2]], patch_size=3, batch_size=4, device="cpu").close()
