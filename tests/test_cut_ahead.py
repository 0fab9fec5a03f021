"""A CPU loader cuts batch b+1 on the engine's threads while batch b is handed out (setting cut_ahead):
the same bits as cutting each batch inside its own next(), batches the caller holds never change, and an
error of a batch started ahead is raised at that batch, not one batch early."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hsgds
from hsgds import defaults
from hsgds.engines import cpu_cut
from hsgds.errors import ConfigError
from hsgds.preprocess.convert import ConvertOptions, convert

pytestmark = pytest.mark.skipif(not cpu_cut.available(), reason="the fused CPU kernel (numba) cuts ahead")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from hsgds.synthetic import make_scene

    d = tmp_path_factory.mktemp("ahead")
    cube, labels = make_scene(60, 52, 8, classes=4, dtype="uint16", seed=11, labelled_fraction=1.0)
    np.save(d / "cube.npy", cube)
    np.save(d / "gt.npy", labels)
    return convert(d / "cube.npy", d / "s.zarr", ConvertOptions(labels=d / "gt.npy", tile=10, max_patch=7, train=0.6))


def _loaders(store, **opts):
    got = {}
    for on in (True, False):
        with defaults.set(cut_ahead=on):
            got[on] = hsgds.PatchLoader(store, **opts)
    return got


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("augment", [None, hsgds.Augment(flip=True, rot90=True, radiation_noise=0.3, band_dropout=0.1)])
def test_cutting_ahead_gives_the_same_batches_and_never_changes_a_held_batch(store, dtype, augment):
    """Two epochs through a ring of 5 slots for 36 tiles (tiles read again, slots reused while the next
    batch is being cut), with and without augmentation, 16-bit output from normalized tiles: the batches,
    labels and coordinates equal those cut inside next(), bit for bit; and the batch the caller still holds
    when it asks for the next one is unchanged after that (its buffer is not reused while held)."""
    tile_nbytes = hsgds.open_scene(store).grid.tile_nbytes
    loaders = _loaders(store, patch_size=5, batch_size=48, split=None, dtype=dtype, device="cpu", seed=3,
                       return_coords=True, ring_bytes=5 * tile_nbytes, augment=augment)
    with loaders[True] as ahead, loaders[False] as inside:
        assert any("cut on the engine's threads" in r for r in ahead.stats.reasons)
        assert not any("cut on the engine's threads" in r for r in inside.stats.reasons)
        assert ahead.slots == 5
        for epoch in range(2):
            ahead.set_epoch(epoch)
            inside.set_epoch(epoch)
            held = copy = None
            count = 0
            for (p, lb, c), (q, lb2, c2) in zip(ahead, inside, strict=True):
                if held is not None:
                    assert torch.equal(held.view(torch.int16 if dtype != torch.float32 else torch.int32), copy)
                assert torch.equal(c, c2) and torch.equal(lb, lb2)
                assert torch.equal(p.view(torch.int16) if dtype != torch.float32 else p.view(torch.int32),
                                   q.view(torch.int16) if dtype != torch.float32 else q.view(torch.int32))
                held = p
                copy = p.view(torch.int16 if dtype != torch.float32 else torch.int32).clone()
                count += 1
            assert count == len(ahead) > 4
        assert ahead.stats.tiles_loaded > 36  # tiles were read again into reused slots


def test_a_resumed_epoch_cut_ahead_is_the_uninterrupted_one(store):
    """A state saved after batch 3 (batch 4 already being cut ahead) resumes at batch 4: the rest of the
    epoch equals the uninterrupted run's."""
    opts = dict(patch_size=5, batch_size=40, split="train", device="cpu", seed=5, return_coords=True)
    with hsgds.PatchLoader(store, **opts) as whole:
        full = [(p.clone(), c.clone()) for p, _, c in whole]
    with hsgds.PatchLoader(store, **opts) as first:
        it = iter(first)
        for _ in range(4):
            next(it)
        state = first.state_dict()
    with hsgds.PatchLoader(store, **opts) as second:
        second.load_state_dict(state)
        rest = [(p, c) for p, _, c in second]
    assert len(rest) == len(full) - 4
    for (p, c), (q, c2) in zip(rest, full[4:], strict=True):
        assert torch.equal(c, c2) and torch.equal(p, q)


@pytest.mark.parametrize("on", [True, False])
def test_an_error_of_the_batch_started_ahead_is_raised_at_that_batch(tmp_path, on):
    """A collection's scene B would overflow float16 (its std of band 1 made 1e-3); B's statistics are read
    when a batch first reaches it, while the batch before is being handed out. Every batch before the first
    one holding B is yielded, with or without cutting ahead, and then the error names B."""
    import zarr

    from hsgds.synthetic import make_scene

    names = ["A", "B"]
    (tmp_path / "coll").mkdir()
    for i, name in enumerate(names):
        cube, labels = make_scene(30, 26, 8, classes=3, dtype="uint16", seed=20 + i, labelled_fraction=1.0)
        np.save(tmp_path / "c.npy", cube)
        np.save(tmp_path / "g.npy", labels)
        convert(tmp_path / "c.npy", tmp_path / "coll" / f"{name}.zarr",
                ConvertOptions(labels=tmp_path / "g.npy", tile=12, max_patch=5, train=0.6))
    from hsgds.collection import SceneEntry, write_collection

    write_collection(tmp_path / "coll", [SceneEntry.of_scene(n, hsgds.open_scene(tmp_path / "coll" / f"{n}.zarr"))
                                         for n in names])
    std = zarr.open_array(tmp_path / "coll" / "B.zarr" / "stats" / "train" / "std", mode="r+")
    values = std[:]
    values[1] = 1e-3
    std[:] = values
    opts = dict(patch_size=3, batch_size=64, shuffle=False, return_coords=True, device="cpu", split=None)
    with hsgds.PatchLoader(tmp_path / "coll", dtype=torch.float32, **opts) as reference:
        first_b = next(i for i, (_, _, c) in enumerate(reference) if (c[:, 0] == 1).any())
    assert first_b >= 2
    with defaults.set(cut_ahead=on), hsgds.PatchLoader(tmp_path / "coll", dtype=torch.float16, **opts) as loader:
        yielded = 0
        with pytest.raises(ConfigError, match=r"^float16 patches would overflow to inf: output band 1 of scene 'B'"):
            for p, _, c in loader:
                assert (c[:, 0] == 0).all() and torch.isfinite(p).all()
                yielded += 1
        assert yielded == first_b


_COLLECTED_ON_A_CUTTING_THREAD = """
import gc, sys, threading
import hsgds
from hsgds import defaults
from hsgds.engines import cpu_cut

calls, dropped = [], threading.Event()
real = cpu_cut.cut_range

def cut_range(*args):
    if threading.current_thread().name.startswith("hsgds-cut"):
        calls.append(1)
        if len(calls) == 2:  # batch 1's one job, cut ahead while batch 0 is handed out
            dropped.wait()
            gc.collect()  # the abandoned iterator is finalized on this cutting thread
    return real(*args)

cpu_cut.cut_range = cut_range
with defaults.set(cut_ahead=True, torch_threads=1, normalize_tiles=False):
    loader = hsgds.PatchLoader(sys.argv[1], patch_size=5, batch_size=16, split="train", device="cpu", seed=1)
gc.disable()  # only the collection on the cutting thread finalizes it
box = [iter(loader)]
box.append(box)  # a reference cycle: only the garbage collector frees the iterator
next(box[0])
del box
dropped.set()
loader.close()  # waits for the cutting thread
print("closed")
"""


def test_an_iterator_collected_on_a_cutting_thread_does_not_wait_for_itself(store):
    """An abandoned iterator in a reference cycle, finalized by the garbage collector on the cutting thread
    whose job is the batch it cut ahead: its cleanup waited for that batch, i.e. for the very job running
    it, and the thread (then close(), and the training loop) hung forever. It waits for nothing off the
    consuming thread now. In a subprocess, so that a hang is a timeout, not a stuck test run."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _COLLECTED_ON_A_CUTTING_THREAD, str(store)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "closed"
