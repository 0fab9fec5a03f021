"""PatchLoader against an independent numpy reference; epochs, resume, sharding, backpressure, faults."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import torch

import hsgds
from hsgds import defaults
from hsgds.errors import ChecksumError, ConfigError, InputError, TileReadError
from hsgds.io import ChunkReader
from hsgds.preprocess.convert import ConvertOptions, convert

ENGINES = ["torch", "dali"]


def _engine_or_skip(engine):
    if engine == "dali":
        pytest.importorskip("nvidia.dali")
    return engine


def reference_patches(cube, padding, halo, train_px, ys, xs, p, normalize="zscore"):
    """Plain numpy: pad the source, cut p x p around each centre, normalize with train statistics."""
    mode = "constant" if padding == "zero" else padding
    padded = np.pad(cube, ((halo, halo), (halo, halo), (0, 0)), mode=mode).astype(np.float64)
    r = p // 2
    out = np.stack([padded[y + halo - r:y + halo + r + 1, x + halo - r:x + halo + r + 1] for y, x in zip(ys, xs)])
    if normalize == "zscore":
        mean, std = train_px.mean(0), train_px.std(0)
        out = (out - mean) / np.where(std > 0, std, 1)
    elif normalize == "minmax":
        lo, hi = train_px.min(0), train_px.max(0)
        out = (out - lo) / np.where(hi > lo, hi - lo, 1)
    return out  # (N, p, p, B)


@pytest.fixture(scope="module")
def border_scene(tmp_path_factory):
    """A small scene where every pixel, borders and corners included, is labelled; 3x3 tiles."""
    from hsgds.synthetic import make_scene

    d = tmp_path_factory.mktemp("border")
    cube, labels = make_scene(40, 35, 6, classes=4, dtype="uint16", seed=7, labelled_fraction=1.0)
    cube[0, 0, :] = 65000  # unsigned values above 32767 must survive
    np.save(d / "cube.npy", cube)
    np.save(d / "gt.npy", labels)
    stores = {}
    for padding in ("reflect", "edge", "zero"):
        stores[padding] = convert(d / "cube.npy", d / f"{padding}.zarr",
                                  ConvertOptions(labels=d / "gt.npy", padding=padding, tile=18, max_patch=15,
                                                 train=0.5, val=0.2))
    return cube, labels, stores


def _collect(loader):
    patches, labels, coords = [], [], []
    for batch in loader:
        p, lab, c = batch
        patches.append(p.float().cpu().numpy())
        labels.append(lab.cpu().numpy())
        coords.append(c.cpu().numpy())
    return np.concatenate(patches), np.concatenate(labels), np.concatenate(coords)


def _train_pixels(cube, store):
    y, x, _ = hsgds.open_scene(store).samples("train")
    return cube[y, x].astype(np.float64)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("padding,p,dtype,layout,normalize", [
    ("reflect", 13, torch.float32, "NCHW", "zscore"),
    ("reflect", 15, torch.bfloat16, "NHWC", "zscore"),
    ("edge", 5, torch.float16, "NCHW", "minmax"),
    ("zero", 1, torch.float32, "NHWC", None),
    ("zero", 15, torch.float32, "NCHW", "zscore"),
])
def test_every_patch_equals_numpy_reference(border_scene, engine, padding, p, dtype, layout, normalize):
    cube, labels, stores = border_scene
    store = stores[padding]
    with hsgds.PatchLoader(store, patch_size=p, batch_size=97, split=None, dtype=dtype, layout=layout,
                           normalize=normalize, engine=_engine_or_skip(engine), return_coords=True,
                           device="cpu") as loader:
        got, lab, coords = _collect(loader)
    assert len(got) == cube.shape[0] * cube.shape[1]  # every pixel, corners included, exactly once
    assert len({(y, x) for y, x in coords.tolist()}) == len(got)
    ref = reference_patches(cube, padding, 7, _train_pixels(cube, store), coords[:, 0], coords[:, 1], p, normalize)
    if layout == "NCHW":
        ref = ref.transpose(0, 3, 1, 2)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
    np.testing.assert_array_equal(lab, labels[coords[:, 0], coords[:, 1]] - 1)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_the_torch_ops_cut_serves_epochs_in_and_out_of_inference_mode(border_scene, layout):
    """An epoch under torch.inference_mode() (evaluation), then one outside it (training), on one loader whose
    torch engine cuts with torch ops (numba off, or not installed): the buffers it keeps, made in the first
    epoch, were inference tensors that the second could not write (torch's RuntimeError)."""
    _, _, stores = border_scene
    with defaults.set(numba=False), hsgds.PatchLoader(stores["reflect"], patch_size=5, batch_size=64, split=None,
                                                      shuffle=False, device="cpu", layout=layout) as loader:
        with torch.inference_mode():
            first = [patches.clone() for patches, _ in loader]
        second = [patches.clone() for patches, _ in loader]
    assert len(first) == len(second) and all(torch.equal(a, b) for a, b in zip(first, second))


def test_patch_larger_than_halo_is_a_clear_error(border_scene):
    store = border_scene[2]["reflect"]
    with pytest.raises(ConfigError, match="patch_size 17 is larger than this store serves .15x15.*--max-patch 17"):
        hsgds.PatchLoader(store, patch_size=17, batch_size=8, device="cpu")
    with pytest.raises(ConfigError, match="odd"):
        hsgds.PatchLoader(store, patch_size=4, batch_size=8, device="cpu")
    with pytest.raises(ConfigError, match="layout"):
        hsgds.PatchLoader(store, patch_size=5, batch_size=8, layout="CHW", device="cpu")


def _coords(loader, limit=None):
    out = []
    for i, (_, _, c) in enumerate(loader):
        if limit is not None and i >= limit:
            break
        out.append(c.numpy())
    return [tuple(map(tuple, c)) for c in out]


def _loader(store, **kw):
    opts = dict(patch_size=5, batch_size=16, split="train", return_coords=True, device="cpu", seed=3)
    opts.update(kw)
    return hsgds.PatchLoader(store, **opts)


def test_epochs_cover_split_and_orders_differ(border_scene):
    cube, labels, stores = border_scene
    store = stores["reflect"]
    y, x, _ = hsgds.open_scene(store).samples("train")
    with _loader(store) as a, _loader(store) as b:
        e0, e1 = _coords(a), _coords(a)
        assert a.epoch == 2
        same = _coords(b)
    flat0 = [c for batch in e0 for c in batch]
    assert sorted(flat0) == sorted(zip(y.tolist(), x.tolist()))
    assert e0 == same
    assert e0 != e1 and sorted(flat0) == sorted(c for batch in e1 for c in batch)


@pytest.mark.parametrize("stop_after", [3, "end"])
def test_exact_resume(border_scene, stop_after):
    store = border_scene[2]["reflect"]
    with _loader(store, shuffle_window=2, ring_bytes=4 * hsgds.open_scene(store).grid.tile_nbytes) as full:
        expected = _coords(full) + _coords(full)  # two uninterrupted epochs
    with _loader(store, shuffle_window=2, ring_bytes=4 * hsgds.open_scene(store).grid.tile_nbytes) as first:
        n = len(first) if stop_after == "end" else stop_after
        got = []
        it = iter(first)
        for _ in range(n):
            got.append(tuple(map(tuple, next(it)[2].numpy())))
        state = first.state_dict()
    with _loader(store, shuffle_window=2, ring_bytes=4 * hsgds.open_scene(store).grid.tile_nbytes) as second:
        second.load_state_dict(state)
        got += _coords(second)  # rest of this epoch
        got += _coords(second)  # and the next
    assert got == expected


def test_resume_refuses_other_settings(border_scene):
    store = border_scene[2]["reflect"]
    with _loader(store) as a, _loader(store, seed=9) as b:
        with pytest.raises(ConfigError, match="seed"):
            b.load_state_dict(a.state_dict())


def test_a_state_of_one_rank_says_to_relaunch_with_1_rank(border_scene):
    """A single process's state loaded by one of two ranks is refused naming the ranks to relaunch with in
    English ("relaunch with 1 ranks" read wrong); two or more stay plural."""
    store = border_scene[2]["reflect"]
    with _loader(store) as one, _loader(store, rank=0, world_size=2) as two:
        with pytest.raises(ConfigError, match=r"world_size=2; relaunch with 1 rank to resume, or start the next epoch"):
            two.load_state_dict(one.state_dict())
        with pytest.raises(ConfigError, match=r"world_size=1; relaunch with 2 ranks to resume"):
            one.load_state_dict(two.state_dict())


def test_resume_refuses_a_state_of_other_samples(border_scene, tmp_path, run_cli):
    """A state saved before a `hsgds resplit` (same settings, other train pixels), or over other stores, is a
    position in another sequence: refused, not resumed silently."""
    import shutil

    store = tmp_path / "s.zarr"
    shutil.copytree(border_scene[2]["reflect"], store)
    with _loader(store) as a:
        state = a.state_dict()
    code, _, err = run_cli("resplit", store, "--split", "random", "--train", "0.5", "--val", "0.2", "--seed", "7")
    assert code == 0, err
    with _loader(store) as b:
        assert len(b.samples) == state["num_samples"]  # the same stratified shares: the count cannot tell them apart
        with pytest.raises(ConfigError, match="saved over other samples .*re-split or replaced"):
            b.load_state_dict(state)
    with _loader(store) as c, _loader(store) as d:
        d.load_state_dict(c.state_dict())  # the same store: resumed
        for bad, message in ((None, "must be the dict PatchLoader.state_dict"),
                             ({**c.state_dict(), "batch": 10**9}, "invalid position"),
                             ({**c.state_dict(), "epoch": True}, "invalid position")):
            with pytest.raises(ConfigError, match=message):
                d.load_state_dict(bad)
        for epoch, message in ((1.7, "epoch must be an integer >= 0"), ("3", "epoch must be an integer"),
                               (1 << 62, "below 2..62")):
            with pytest.raises(ConfigError, match=message):
                d.set_epoch(epoch)


def test_resume_under_another_mask_names_the_mask(border_scene):
    """One scene: masks keeping as many pixels of each tile but other ones are refused with a message that
    names the mask (its samples digest alone said "other samples")."""
    store = border_scene[2]["reflect"]
    one, other = np.zeros((40, 35), bool), np.zeros((40, 35), bool)
    one[:18, 0], other[:18, 1] = True, True
    with _loader(store, mask=one, split=None) as a, _loader(store, mask=other, split=None) as b:
        assert a.samples.counts().tolist() == b.samples.counts().tolist()
        with pytest.raises(ConfigError, match=r"^loader state was saved with mask '[0-9a-f]{16}' but this loader has "
                                              r"mask '[0-9a-f]{16}' .*build the loader with the same mask"):
            b.load_state_dict(a.state_dict())
    with _loader(store, mask=one, split=None) as a, _loader(store, mask=one.copy(), split=None) as b:
        b.load_state_dict(a.state_dict())


def test_every_pixel_of_a_split_resumes_only_over_the_same_left_out_pixels(border_scene, tmp_path):
    """pixels='all' with a split leaves out the other splits' labelled pixels. A store converted again with a
    train pixel and a val pixel of one tile swapped keeps every tile's count, but the same positions are other
    pixels: its state was accepted (the digest held the counts alone for pixels='all') and the rest of the
    epoch was other pixels than an uninterrupted run over the store it was saved on. Refused now; the same
    split resumes exactly."""
    import warnings

    cube, labels, _ = border_scene
    np.save(tmp_path / "cube.npy", cube)
    np.save(tmp_path / "gt.npy", labels)
    train = np.zeros(labels.shape, np.uint8)
    train[:, ::2] = 1
    test = np.zeros_like(train)
    test[-4:] = 1  # (every class keeps train pixels)
    train[-4:] = 0
    swapped = train.copy()
    swapped[0, 0], swapped[0, 1] = 0, 1  # one tile: a train pixel becomes val, a val pixel train
    stores = {}
    for name, tm in (("one", train), ("other", swapped)):
        np.save(tmp_path / f"{name}_tm.npy", tm)
        np.save(tmp_path / f"{name}_vm.npy", (1 - tm) * (1 - test))
        np.save(tmp_path / f"{name}_te.npy", test)
        (tmp_path / name).mkdir()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the masks' class shares: said, not refused)
            stores[name] = convert(tmp_path / "cube.npy", tmp_path / name / "s.zarr", ConvertOptions(
                labels=tmp_path / "gt.npy", tile=18, max_patch=15, split="masks", train_mask=tmp_path / f"{name}_tm.npy",
                val_mask=tmp_path / f"{name}_vm.npy", test_mask=tmp_path / f"{name}_te.npy"))
    opts = dict(pixels="all", split="train", shuffle=False, normalize=None)
    with _loader(stores["one"], **opts) as a, _loader(stores["other"], **opts) as b:
        assert a.samples.counts().tolist() == b.samples.counts().tolist()  # the counts cannot tell them apart
        it = iter(a)
        next(it)
        state = a.state_dict()
        rest = _coords(it)
        assert _coords(b) != _coords(a)  # (0, 0) and (0, 1): one yielded by each
        with pytest.raises(ConfigError, match=r"^loader state was saved over other samples .*re-split or replaced"):
            b.load_state_dict(state)
    with _loader(stores["one"], **opts) as c:
        c.load_state_dict(state)
        assert _coords(c) == rest
    older = {k: v for k, v in state.items() if k != "left_out"}  # a state saved before the key existed
    with _loader(stores["one"], **opts) as d:
        d.load_state_dict(older)  # still loads: its samples digest is what it was
        assert _coords(d) == rest


def test_a_damaged_states_settings_are_refused_on_one_short_line(border_scene):
    """A state whose settings hold a long or odd value (a damaged file, an array) names it on one short line."""
    store = border_scene[2]["reflect"]
    with _loader(store) as a, _loader(store) as b:
        for value in (np.arange(10_000), "x" * 5_000, list(range(3_000))):
            state = {**a.state_dict(), "seed": value}
            with pytest.raises(ConfigError, match="^loader state was saved with seed=") as info:
                b.load_state_dict(state)
            assert "\n" not in str(info.value) and len(str(info.value)) < 400, str(info.value)


def test_rank_and_world_size_are_given_together_and_checked(border_scene):
    store = border_scene[2]["reflect"]
    for kwargs, message in ((dict(world_size=2), "pass both rank and world_size"),
                            (dict(rank=0.5, world_size=2), "rank must be an integer >= 0"),
                            (dict(rank=0, world_size="2"), "world_size must be an integer >= 1"),
                            (dict(rank=2, world_size=2), "rank must be in 0..world_size-1")):
        with pytest.raises(ConfigError, match=message):
            _loader(store, **kwargs)


def test_resume_refuses_a_state_of_an_older_order(border_scene):
    """A state saved before the shuffle windows ramped up names a position in an order this version no
    longer makes: refused, with what to do instead, rather than resumed to other samples."""
    store = border_scene[2]["reflect"]
    with _loader(store) as a, _loader(store) as b:
        state = {**a.state_dict(), "version": 1}
        with pytest.raises(ConfigError, match=r"older hsgds whose shuffled order differs.*set_epoch\(epoch \+ 1\)"):
            b.load_state_dict(state)
        with pytest.raises(ConfigError, match="version 'x', expected"):
            b.load_state_dict({**state, "version": "x"})
    # version 2 dealt whole tiles to ranks: a rank's position then is another order now; one rank's is the same
    with _loader(store, rank=1, world_size=2) as ranked:
        with pytest.raises(ConfigError, match=r"dealt whole tiles to the ranks.*set_epoch\(epoch \+ 1\)"):
            ranked.load_state_dict({**ranked.state_dict(), "version": 2})
    with _loader(store) as a, _loader(store) as b:
        it = iter(a)
        next(it)
        b.load_state_dict({**a.state_dict(), "version": 2})
        assert b.state_dict()["batch"] == 1 and b.state_dict()["version"] == 3


class SlowReader:
    """Wraps a reader to add latency per tile."""

    def __init__(self, inner, delay):
        self.inner, self.delay = inner, delay

    def __getattr__(self, name):
        return getattr(self.inner, name)

    read_many = ChunkReader.read_many  # the interface's loop over this wrapper's read_into

    def read_into(self, tile_id, dest):
        time.sleep(self.delay)
        self.inner.read_into(tile_id, dest)


def test_backpressure_slow_consumer_never_exceeds_ring(border_scene):
    store = border_scene[2]["reflect"]
    nbytes = hsgds.open_scene(store).grid.tile_nbytes
    with _loader(store, split=None, ring_bytes=3 * nbytes, batch_size=64, shuffle_window=1) as loader:
        for _ in loader:
            time.sleep(0.01)
        assert loader.stats.slots == 3
        assert loader.stats.max_resident <= 3
        assert loader.stats.reader_wait_s > 0  # the reader waited for free slots


def test_read_order_is_the_order_the_ring_reads(border_scene):
    store = border_scene[2]["reflect"]
    nbytes = hsgds.open_scene(store).grid.tile_nbytes
    with defaults.set(read_inflight=1), _loader(store, split=None, ring_bytes=3 * nbytes, batch_size=64,
                                                shuffle_window=1) as loader:
        order = loader.read_order()
        read: list[int] = []
        reader = loader.ring.reader
        real = reader.read_many

        def recorded(requests):
            requests = list(requests)
            read.extend(t for t, _ in requests)
            real(requests)

        reader.read_many = recorded
        for _ in loader:
            pass
        # every entry is one read into a slot, or a tile still intact in a freed slot (not read again)
        assert loader.stats.tiles_loaded == len(read) and loader.stats.tiles_reused == len(order) - len(read)
        left = iter(order)
        assert all(t in left for t in read)  # the reads follow the order (a subsequence of it)
        assert loader.read_order(1) != order  # another epoch, another order
        for bad in (-1, "1", 1.5):  # numpy's 'expected non-negative integer', int('x'), or 1.5 read as epoch 1
            with pytest.raises(ConfigError, match="epoch must be an integer >= 0"):
                loader.read_order(bad)


def test_slow_reader_stall_is_counted(border_scene):
    store = border_scene[2]["reflect"]
    with _loader(store, split=None, batch_size=64) as loader:
        loader._ring.reader = SlowReader(loader._ring.reader, 0.05)
        for _ in loader:
            pass
        assert loader.stats.consumer_wait_s >= 0.04


def _damaged_copy(store, tmp_path, how):
    import shutil

    dst = tmp_path / "damaged.zarr"
    shutil.copytree(store, dst)
    path = hsgds.open_scene(dst).tile_paths[4]
    if how == "truncate":
        path.write_bytes(path.read_bytes()[:-4096])
    elif how == "flip":
        raw = bytearray(path.read_bytes())
        raw[100] ^= 1
        path.write_bytes(bytes(raw))
    elif how == "delete":
        path.unlink()
    return dst


@pytest.mark.parametrize("how,error", [("truncate", TileReadError), ("flip", ChecksumError), ("delete", TileReadError)])
def test_damaged_tile_raises_naming_it(border_scene, tmp_path, how, error):
    store = _damaged_copy(border_scene[2]["reflect"], tmp_path, how)
    t0 = time.perf_counter()
    with _loader(store, split=None, shuffle=False) as loader:
        with pytest.raises(error, match="tile 4"):
            for _ in loader:
                pass
    assert time.perf_counter() - t0 < 5


def test_store_deleted_mid_epoch(border_scene, tmp_path):
    import shutil

    store = tmp_path / "gone.zarr"
    shutil.copytree(border_scene[2]["reflect"], store)
    nbytes = hsgds.open_scene(store).grid.tile_nbytes
    with _loader(store, split=None, shuffle=False, ring_bytes=2 * nbytes, batch_size=32) as loader:
        # the first tile read after the deletion is named, with its file and why (any TileReadError passed)
        with pytest.raises(TileReadError, match=r"^tile \d+ \(\S*gone\.zarr\S*\): cannot open \(No such file or "
                                                r"directory\)"):
            for i, _ in enumerate(loader):
                if i == 0:
                    shutil.rmtree(store)


class RaisingReader(SlowReader):
    def read_into(self, tile_id, dest):
        raise RuntimeError("disk on fire")


def test_reader_exception_reaches_consumer(border_scene):
    with _loader(border_scene[2]["reflect"]) as loader:
        loader._ring.reader = RaisingReader(loader._ring.reader, 0)
        with pytest.raises(hsgds.HsgdsError, match="disk on fire"):
            next(iter(loader))


def _hsgds_threads():
    return [t for t in threading.enumerate() if t.name.startswith("hsgds") and t.is_alive()]


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_early_break_and_interrupt_leave_nothing_behind(border_scene):
    store = border_scene[2]["reflect"]
    fds = _open_fds()
    with _loader(store, split=None, batch_size=8) as loader:
        for i, _ in enumerate(loader):
            if i == 2:
                break
        assert not [t for t in _hsgds_threads() if t.name == "hsgds-ring"]
        with pytest.raises(KeyboardInterrupt):
            for i, _ in enumerate(loader):
                if i == 1:
                    raise KeyboardInterrupt
        assert len(list(loader)) == len(loader)  # still usable after both
    assert _hsgds_threads() == []
    assert _open_fds() == fds
    loader.close()  # twice is fine
    with pytest.raises(hsgds.HsgdsError, match="closed"):
        iter(loader)


def _indian_pines_epoch(store, engine):
    """p=13, batch 256, one full train epoch: (patches, labels, coords)."""
    with hsgds.PatchLoader(store, patch_size=13, batch_size=256, engine=engine, device="cpu",
                           return_coords=True) as loader:
        return _collect(loader)


@pytest.mark.parametrize("engine", ENGINES)
def test_indian_pines_full_epoch(engine, indian_pines_store, indian_pines_arrays):
    """The 'done when' check: p=13, batch 256, a full train epoch with each engine, equal to numpy."""
    cube, gt = indian_pines_arrays
    got, lab, coords = _indian_pines_epoch(indian_pines_store, _engine_or_skip(engine))
    ref = reference_patches(cube, "reflect", 7, _train_pixels(cube, indian_pines_store), coords[:, 0], coords[:, 1],
                            13).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(lab, gt[coords[:, 0], coords[:, 1]] - 1)
    assert len(got) == 1027


def test_class_counts_are_the_labels_an_epoch_yields(indian_pines_store, monkeypatch):
    """class_counts() equals a count of the labels of one epoch of two ranks together (each sample once
    but the repeated one, taken out), and of pixels='all' (unlabelled, -1, not counted)."""
    kw = dict(patch_size=5, batch_size=128, device="cpu")
    loaders = [hsgds.PatchLoader(indian_pines_store, **kw, return_coords=True, rank=r, world_size=2) for r in (0, 1)]
    seen = {}
    for loader in loaders:
        with loader:
            for _, lab, coords in loader:
                seen.update(zip(map(tuple, coords.numpy().tolist()), lab.numpy().tolist()))
    want = np.bincount(list(seen.values()), minlength=16)
    np.testing.assert_array_equal(loaders[0].class_counts(), want)
    assert want.sum() == 1027 and want.min() >= 2
    with hsgds.PatchLoader(indian_pines_store, **kw, pixels="all", stride=3, shuffle=False) as every:
        labels = np.concatenate([lab.numpy() for _, lab in every])
        counts = every.class_counts()
        monkeypatch.setattr("hsgds.loader.CLASS_COUNT_BLOCK", 100)  # counted in blocks, the last one partial
        in_blocks = every.class_counts()
    assert (labels == -1).any() and len(counts) == 16
    np.testing.assert_array_equal(counts, np.bincount(labels[labels >= 0], minlength=16))
    np.testing.assert_array_equal(in_blocks, counts)


def test_indian_pines_engines_agree(indian_pines_store):
    """Same order and (to float32 rounding) the same patches from both engines. Needs DALI, checked first."""
    pytest.importorskip("nvidia.dali")
    torch_got, _, torch_coords = _indian_pines_epoch(indian_pines_store, "torch")
    dali_got, _, dali_coords = _indian_pines_epoch(indian_pines_store, "dali")
    np.testing.assert_array_equal(torch_coords, dali_coords)
    np.testing.assert_allclose(torch_got, dali_got, rtol=1e-6, atol=1e-6)


def test_split_that_fits_is_read_once_across_epochs(border_scene):
    store = border_scene[2]["edge"]
    scene = hsgds.open_scene(store)
    with _loader(store, split=None) as loader:
        for _ in range(3):
            for _ in loader:
                pass
        assert loader.stats.tiles_loaded == scene.grid.num_tiles
        assert loader.stats.bytes_read == scene.grid.num_tiles * scene.grid.tile_nbytes
        assert loader.stats.tiles_reused >= 2 * scene.grid.num_tiles
        # print(loader.stats): one line with the same numbers
        st = loader.stats
        line = str(st)
        assert "\n" not in line and line.startswith(f"{st.device}, reader {st.reader}, engine {st.engine}, ")
        assert f"{st.patches} patches in {st.batches} batches, {st.patches_per_s:,.0f} patches/s" in line
        assert f"({st.tiles_loaded} tile reads, {st.tiles_reused} reused)" in line
        assert f"median per batch: {st.host_us_median:.0f} µs on this thread" in line


def test_posix_reader_o_direct_reads_the_same_bytes(border_scene):
    from hsgds.io import PosixReader, TileSource

    scene = hsgds.open_scene(border_scene[2]["reflect"])
    source = TileSource.from_scene(scene)
    dest = torch.empty(source.nbytes + 1, dtype=torch.uint8)[1:]  # deliberately misaligned
    with PosixReader(source, direct=True) as reader:
        try:
            reader.read_into(3, dest)
        except TileReadError as exc:  # tmpfs and some overlay filesystems refuse O_DIRECT
            pytest.skip(f"O_DIRECT not supported here: {exc}")
        assert dest.numpy().tobytes() == scene.tile_paths[3].read_bytes()


def test_resume_needs_the_same_ring_and_set_epoch_keeps_the_position(border_scene):
    store = border_scene[2]["reflect"]
    nbytes = hsgds.open_scene(store).grid.tile_nbytes
    with _loader(store, split=None, ring_bytes=4 * nbytes) as full:
        expected = _coords(full)
    with _loader(store, split=None, ring_bytes=4 * nbytes) as first:
        it = iter(first)
        head = [tuple(map(tuple, next(it)[2].numpy())) for _ in range(5)]
        state = first.state_dict()
    with _loader(store, split=None, ring_bytes=6 * nbytes) as other_ring:
        with pytest.raises(ConfigError, match=f"ring of 4 tiles .* ring_bytes={4 * nbytes} "):
            other_ring.load_state_dict(state)
    with _loader(store, split=None, ring_bytes=4 * nbytes) as second:
        second.load_state_dict(state)
        second.set_epoch(0)  # the usual epoch loop: must not discard the restored position
        assert head + _coords(second) == expected
    with _loader(store, split=None, ring_bytes=4 * nbytes) as third:
        with pytest.raises(ConfigError, match="invalid position"):
            third.load_state_dict({**state, "batch": -1})


def test_a_state_loaded_while_an_iterator_runs_is_where_the_next_iteration_starts(border_scene):
    """load_state_dict, like set_epoch, sets the next iteration's position: an iterator already running
    finishes its own epoch without moving it (it used to overwrite the restored batch with its own)."""
    store = border_scene[2]["reflect"]
    with _loader(store, split=None) as full:
        full.set_epoch(3)
        expected = _coords(full)
    with _loader(store, split=None) as source:
        source.set_epoch(3)
        it = iter(source)
        head = [tuple(map(tuple, next(it)[2].numpy())) for _ in range(2)]
        state = source.state_dict()
    with _loader(store, split=None) as loader:
        running = iter(loader)
        next(running)
        loader.load_state_dict(state)
        assert len(list(running)) == len(loader) - 1  # epoch 0 to its end
        assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (3, 2)
        assert head + _coords(loader) == expected


def test_bad_loader_arguments_are_config_errors(border_scene):
    store = border_scene[2]["reflect"]
    nbytes = hsgds.open_scene(store).grid.tile_nbytes
    bad = [
        (dict(seed=-1), "seed must be an integer >= 0"),
        (dict(seed=1 << 70), "seed must be below 2..64"),
        (dict(shuffle_window=2.5), "shuffle_window .tiles. must be an integer"),
        (dict(drop_last="no"), "drop_last must be True or False, got str 'no'"),  # "no" would be true
        (dict(shuffle="yes"), "shuffle must be True or False"),
        (dict(return_coords=1), "return_coords must be True or False"),
        (dict(batch_size=True), "batch_size must be an integer >= 1, got True"),
        # a float reached torch.empty (TypeError from deep inside torch, after the samples were built)
        (dict(ring_bytes=2e6), "ring_bytes must be a whole number of bytes .*got float 2000000.0"),
        (dict(ring_bytes="1GB"), "ring_bytes must be a whole number of bytes .*got str '1GB'"),
        (dict(ring_bytes=True), "ring_bytes must be a whole number of bytes .*got bool True"),  # not 1 byte
    ]
    for kwargs, message in bad:
        with pytest.raises(ConfigError, match=message):
            hsgds.PatchLoader(store, patch_size=5, **{"batch_size": 8, "device": "cpu", **kwargs})
    with pytest.raises(ConfigError, match="has no pixel to yield inside the mask .*; widen the mask"):
        h, w = hsgds.open_scene(store).shape[:2]
        hsgds.PatchLoader(store, patch_size=5, batch_size=8, mask=np.zeros((h, w), bool), device="cpu")
    with pytest.raises(InputError, match=r"unknown split \['train', 'val'\]; choose one of .*\(one name\)"):
        hsgds.PatchLoader(store, patch_size=5, batch_size=8, split=["train", "val"], device="cpu")
    # numpy's integers and bools are what users compute settings with
    with hsgds.PatchLoader(store, patch_size=5, batch_size=np.int64(8), shuffle=np.True_, device="cpu") as loader:
        assert loader.batch_size == 8 and type(loader.batch_size) is int and next(iter(loader))[0].shape[0] == 8
    # a ring that cannot hold one batch is reported when the loader is built, not at the first batch
    with pytest.raises(ConfigError, match="needs .* tiles resident but the ring has 1 slot;"):
        hsgds.PatchLoader(store, patch_size=5, batch_size=900, split=None, ring_bytes=nbytes, device="cpu",
                          shuffle=False)


def test_drop_last_with_a_batch_larger_than_a_share_is_refused(border_scene):
    """drop_last=True with batch_size above the epoch's samples (or a rank's share) made a loader of 0
    batches: every epoch yielded nothing and training ran without a step, silently."""
    store = border_scene[2]["edge"]
    n = len(hsgds.open_scene(store).sample_set("train"))
    settings = dict(patch_size=3, device="cpu", drop_last=True)
    with pytest.raises(ConfigError, match=rf"batch_size={n + 1} with drop_last=True yields no batch: the epoch has "
                                          rf"{n} samples; lower batch_size to {n} or less, or pass drop_last=False"):
        hsgds.PatchLoader(store, batch_size=n + 1, **settings)
    share = n // 3
    with pytest.raises(ConfigError, match=rf"each of the 3 ranks has {share} samples; lower batch_size to {share}"):
        hsgds.PatchLoader(store, batch_size=share + 1, rank=2, world_size=3, **settings)
    for kwargs in (dict(batch_size=n), dict(batch_size=share, rank=2, world_size=3)):
        with hsgds.PatchLoader(store, **kwargs, **settings) as loader:
            assert len(loader) == 1 and [len(labels) for _, labels in loader] == [kwargs["batch_size"]]
    with hsgds.PatchLoader(store, batch_size=n + 1, patch_size=3, device="cpu") as loader:  # without drop_last
        assert [len(labels) for _, labels in loader] == [n]


def test_a_ring_too_small_for_some_epoch_is_refused_when_the_loader_is_built(tile_store):
    """A shuffled order puts tiles with few samples together in some epochs only: here epochs 3 and 10 of
    this loader needed 5 tiles for a batch where epoch 0 needed 3, and the loader built with a ring of 3 raised
    in epoch 3. Now it is refused when built, and the ring it names runs every epoch."""
    settings = dict(patch_size=5, batch_size=32, device="cpu", seed=4, pixels="all", stride=3)
    nbytes = hsgds.open_scene(tile_store).grid.tile_nbytes
    with pytest.raises(ConfigError, match=rf"a batch of 32 can need 5 tiles resident .* but the ring has 3 slots; "
                                          rf"raise ring_bytes to {5 * nbytes} or more .* or lower batch_size to 17 or less"):
        hsgds.PatchLoader(tile_store, ring_bytes=3 * nbytes, **settings)
    for ring_bytes, batch_size in ((5 * nbytes, 32), (3 * nbytes, 17)):
        with hsgds.PatchLoader(tile_store, ring_bytes=ring_bytes, **{**settings, "batch_size": batch_size}) as loader:
            for epoch in range(12):
                loader.set_epoch(epoch)
                assert sum(len(labels) for _, labels in loader) == len(loader.samples)
                assert loader.stats.max_resident <= loader.slots


def test_store_without_statistics_is_a_store_error(border_scene, tmp_path):
    import shutil

    store = tmp_path / "nostats.zarr"
    shutil.copytree(border_scene[2]["reflect"], store)
    shutil.rmtree(store / "stats")
    with pytest.raises(hsgds.StoreError, match="no band statistics"):
        hsgds.PatchLoader(store, patch_size=5, batch_size=8, device="cpu")


def test_infinite_statistics_are_refused_not_turned_into_nan_patches(border_scene, tmp_path):
    import shutil

    import zarr

    store = tmp_path / "inf.zarr"
    shutil.copytree(border_scene[2]["reflect"], store)
    std = zarr.open_array(store / "stats" / "train" / "std", mode="r+")
    values = std[:]
    values[1] = np.inf  # what a float64 cube of values near 1e300 gives
    std[:] = values
    with pytest.raises(ConfigError, match="band statistics are not finite .1 bands, e.g. output band 1: .*spread inf"):
        hsgds.PatchLoader(store, patch_size=5, batch_size=8, device="cpu")
    with hsgds.PatchLoader(store, patch_size=5, batch_size=8, device="cpu", normalize="minmax") as loader:
        assert torch.isfinite(next(iter(loader))[0]).all()  # min and max are finite: min-max still works
    values[1] = -5.0  # a damaged store: no data has a negative std
    std[:] = values
    with pytest.raises(ConfigError, match=r"band statistics are damaged \(output band 1: std -5 < 0\)"):
        hsgds.PatchLoader(store, patch_size=5, batch_size=8, device="cpu")


def _spread_stats(cube, band, reach):
    """Statistics (from the cube, in numpy) under which ``band``'s values farthest from its mean normalize to
    +-``reach``; the other bands get their own mean and std."""
    x = cube.reshape(-1, cube.shape[2]).astype(np.float64)
    mean, std = x.mean(0), x.std(0)
    std[band] = np.abs(x[:, band] - mean[band]).max() / reach
    return hsgds.BandStats(mean=mean, std=std, min=x.min(0), max=x.max(0))


def test_float16_patches_that_would_overflow_are_refused_from_the_statistics(border_scene):
    """Statistics normalizing a band beyond float16's largest value (65504) are refused up front, naming the
    band; below it the float16 patches are finite and reach what numpy says. The refused ones do give inf:
    the same patches in float32, cast to float16."""
    cube, _, stores = border_scene
    opts = dict(patch_size=3, batch_size=512, split=None, device="cpu", shuffle=False)
    with hsgds.PatchLoader(stores["reflect"], dtype=torch.float16, norm_stats=_spread_stats(cube, 2, 60000),
                           **opts) as loader:
        got = np.concatenate([p.float().numpy() for p, _ in loader])
    assert np.isfinite(got).all()
    np.testing.assert_allclose(np.abs(got[:, 2]).max(), 60000, rtol=1e-3)
    bad = _spread_stats(cube, 2, 70000)
    with pytest.raises(ConfigError, match=r"^float16 patches would overflow to inf: output band 2 of scene 'reflect' "
                                          r"holds .*reaching 7e\+04 > float16's largest value 65504; use "
                                          r"dtype=torch.float32 or torch.bfloat16, or statistics"):
        hsgds.PatchLoader(stores["reflect"], dtype=torch.float16, norm_stats=bad, **opts)
    with hsgds.PatchLoader(stores["reflect"], dtype=torch.float32, norm_stats=bad, **opts) as loader:
        assert any(torch.isinf(p.half()).any() for p, _ in loader)


def test_float16_without_normalization_is_checked_against_the_stored_maximum(border_scene, tmp_path):
    """normalize=None: uint16 values up to 65000 fit float16, 65535 does not (it is refused); zero padding
    counts as a value too: values near 60000 with a std of 0.5 fit (reflect padding) until the 0s of
    zero padding normalize to -120000."""
    cube, labels, stores = border_scene
    opts = dict(patch_size=3, batch_size=512, split=None, device="cpu", dtype=torch.float16)
    with hsgds.PatchLoader(stores["reflect"], normalize=None, **opts) as loader:
        assert all(torch.isfinite(p).all() for p, _ in loader)
    high = cube.copy()
    high[5, 6, 3] = 65535
    np.save(tmp_path / "high.npy", high)
    np.save(tmp_path / "gt.npy", labels)
    store = convert(tmp_path / "high.npy", tmp_path / "high.zarr", ConvertOptions(labels=tmp_path / "gt.npy"))
    with pytest.raises(ConfigError, match=r"output band 3 of scene 'high' holds \d+..65535, not normalized, reaching "
                                          r"6.554e\+04 > float16's .*or normalize='zscore'$"):
        hsgds.PatchLoader(store, normalize=None, **opts)
    h, w, b = cube.shape
    checker = (np.arange(h)[:, None] + np.arange(w)[None, :]) % 2  # values 60000, 60001: mean ~60000.5, std ~0.5
    flat = np.repeat((60000 + checker)[..., None], b, axis=2).astype(np.uint16)
    np.save(tmp_path / "flat.npy", flat)
    for padding in ("reflect", "zero"):
        convert(tmp_path / "flat.npy", tmp_path / f"{padding}.zarr",
                ConvertOptions(labels=tmp_path / "gt.npy", padding=padding, tile=18, max_patch=15))
    with hsgds.PatchLoader(tmp_path / "reflect.zarr", **opts) as loader:
        assert all(torch.isfinite(p).all() for p, _ in loader)
    with pytest.raises(ConfigError, match=r"output band 0 of scene 'zero' holds 0..60001, .*reaching 1.2e\+05"):
        hsgds.PatchLoader(tmp_path / "zero.zarr", **opts)
    with hsgds.PatchLoader(tmp_path / "zero.zarr", **{**opts, "dtype": torch.float32}) as loader:
        lowest = min(float(p.min()) for p, _ in loader)
    train = _train_pixels(flat, tmp_path / "zero.zarr")[:, 0]
    assert lowest == pytest.approx(-train.mean() / train.std(), rel=1e-5)  # the 0s of the padding, normalized


def test_posix_reader_keeps_no_descriptor_open(border_scene):
    store = border_scene[2]["reflect"]
    nbytes = hsgds.open_scene(store).grid.tile_nbytes
    fds = _open_fds()
    with _loader(store, split=None, ring_bytes=3 * nbytes, shuffle_window=1) as loader:
        for _ in loader:
            assert _open_fds() <= fds + 2  # a read in flight may hold one
        assert loader.stats.tiles_loaded >= hsgds.open_scene(store).grid.num_tiles
