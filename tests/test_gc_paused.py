"""hsgds._gc.gc_paused: the collector is off inside, restored as it was after, nested and across threads."""

from __future__ import annotations

import gc
import threading

import pytest

from hsgds._gc import gc_paused


@pytest.fixture(autouse=True)
def _collector_restored():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_restored_after_also_on_error():
    gc.enable()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still runs
    assert gc.isenabled()
    with pytest.raises(KeyError), gc_paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_a_collector_switched_off_by_the_caller_stays_off():
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()


def test_as_a_decorator():
    gc.enable()

    @gc_paused()
    def inside():
        return gc.isenabled()

    assert inside() is False and gc.isenabled()


def test_overlapping_blocks_in_two_threads_switch_it_on_once_both_end():
    gc.enable()
    entered, release = threading.Event(), threading.Event()

    def other():
        with gc_paused():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with gc_paused():
        t.start()
        entered.wait(10)
    assert not gc.isenabled()  # the other thread's block is still open
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_a_loader_leaves_the_collector_as_it_found_it(tmp_path):
    import numpy as np

    import hsgds
    from hsgds.preprocess.convert import ConvertOptions, convert
    from hsgds.synthetic import make_scene

    cube, labels = make_scene(24, 24, 4, classes=3, dtype="int16", seed=1, labelled_fraction=1.0)
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "g.npy", labels)
    store = convert(tmp_path / "c.npy", tmp_path / "s.zarr", ConvertOptions(labels=tmp_path / "g.npy", tile=28,
                                                                             max_patch=5, train=0.5))
    for on in (True, False):
        (gc.enable if on else gc.disable)()
        with hsgds.PatchLoader(store, patch_size=3, batch_size=8, device="cpu") as loader:
            next(iter(loader))
            assert gc.isenabled() is on
        with pytest.raises(hsgds.errors.InputError, match="unknown split"):  # raised inside the paused block
            hsgds.PatchLoader(store, patch_size=3, batch_size=8, device="cpu", split="nope")
        assert gc.isenabled() is on
