"""Runtime faults test_loader.py does not cover: slow storage with a fast consumer, a consumer that raises,
two loaders on one store, a loader used after (or closed during) iteration (docs/reliability.md)."""

from __future__ import annotations

import os
import random
import threading
import time

import numpy as np
import pytest

import hsgds
from hsgds.errors import HsgdsError
from hsgds.io import ChunkReader


@pytest.fixture(scope="module")
def store(synthetic_store):
    """40x35x6 uint16, every pixel labelled, 3x2 tiles of 18 px (halo 7)."""
    return synthetic_store(40, 35, 6, classes=4, dtype="uint16", seed=3, labelled_fraction=1.0, tile=18,
                           train=0.5)[0]


def _loader(store, **kw):
    opts = dict(patch_size=5, batch_size=16, split="train", return_coords=True, device="cpu", seed=1)
    opts.update(kw)
    return hsgds.PatchLoader(store, **opts)


def _epoch(loader):
    """One epoch as (patches, labels, coords) arrays, in yield order."""
    out = [(p.numpy().copy(), lab.numpy().copy(), c.numpy().copy()) for p, lab, c in loader]
    return tuple(np.concatenate(parts) for parts in zip(*out))


def _same(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def _ring_threads():
    return [t for t in threading.enumerate() if t.name.startswith("hsgds") and t.is_alive()]


class JitterReader:
    """Wraps a reader: 50-65 ms of latency per tile, sometimes a 120 ms spike (a slow disk)."""

    def __init__(self, inner, seed=0):
        self.inner, self.rng, self.lock = inner, random.Random(seed), threading.Lock()
        self.delays = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    read_many = ChunkReader.read_many  # the interface's loop over this wrapper's read_into

    def read_into(self, tile_id, dest):
        with self.lock:
            delay = 0.12 if self.rng.random() < 0.1 else self.rng.uniform(0.05, 0.065)
            self.delays.append(delay)
        time.sleep(delay)
        self.inner.read_into(tile_id, dest)


def test_slow_storage_fast_consumer_yields_exactly_the_same(store):
    nbytes = hsgds.open_scene(store).grid.tile_nbytes
    with _loader(store, split=None, ring_bytes=2 * nbytes, shuffle_window=1) as fast:
        expected = _epoch(fast)
    with _loader(store, split=None, ring_bytes=2 * nbytes, shuffle_window=1) as slow:
        slow._ring.reader = jitter = JitterReader(slow._ring.reader)
        t0 = time.perf_counter()
        got = _epoch(slow)
        elapsed = time.perf_counter() - t0
        stats = slow.stats
    _same(got, expected)
    assert len(jitter.delays) >= 6  # every tile went through the slow reader
    # The consumer waited for the slow reader: at least for the first tile, as nothing is resident before it lands
    # (a bound on the share of all delays would depend on how fast this machine's consumer is at the moment).
    assert stats.consumer_wait_s > 0.5 * min(jitter.delays)
    assert stats.max_resident <= 2
    assert elapsed < sum(jitter.delays) + 5  # waits end when tiles land: no polling stall, no hang


def test_consumer_raising_leaves_loader_usable(store):
    fds = len(os.listdir("/proc/self/fd"))
    with _loader(store) as fresh:
        first = _epoch(fresh)
    with _loader(store) as loader:
        with pytest.raises(ValueError, match="training step failed"):
            for i, _ in enumerate(loader):
                if i == 2:
                    raise ValueError("training step failed")
        assert not [t for t in _ring_threads() if t.name == "hsgds-ring"]  # the pass was stopped
        _same(_epoch(loader), first)  # a new iteration restarts the interrupted epoch, bit-identical
    assert _ring_threads() == []
    assert len(os.listdir("/proc/self/fd")) == fds


def test_two_loaders_on_one_store_interleaved(store):
    scene = hsgds.open_scene(store)
    settings = [dict(patch_size=5, seed=1), dict(patch_size=9, seed=2, split=None, batch_size=7, shuffle_window=2,
                                                 ring_bytes=2 * scene.grid.tile_nbytes)]
    alone = []
    for kw in settings:
        with _loader(store, **kw) as one:
            alone.append(_epoch(one))
    got = [[], []]
    with _loader(store, **settings[0]) as a, _loader(scene, **settings[1]) as b:
        ia, ib = iter(a), iter(b)
        done = [False, False]
        while not all(done):  # strictly alternating, each at its own pace
            for k, it in enumerate((ia, ib)):
                if not done[k]:
                    try:
                        p, lab, c = next(it)
                        got[k].append((p.numpy().copy(), lab.numpy().copy(), c.numpy().copy()))
                    except StopIteration:
                        done[k] = True
    for k in range(2):
        _same(tuple(np.concatenate(parts) for parts in zip(*got[k])), alone[k])


def test_iterator_used_after_close_raises(store):
    loader = _loader(store)
    it = iter(loader)
    next(it)
    loader.close()
    with pytest.raises(HsgdsError, match="closed"):
        next(it)
    with pytest.raises(HsgdsError, match="closed"):
        iter(loader)
    assert _ring_threads() == []


def test_close_stops_the_preparing_thread_of_a_suspended_iterator(store):
    """An iterator left mid-epoch and still referenced (a training loop that returned early, keeping it)
    had its batch-preparing thread waking every 0.1 s after loader.close() until the iterator was dropped.
    close() stops it; the iterator then raises the closed error."""
    loader = _loader(store)
    it = iter(loader)
    next(it)
    loader.close()
    assert _ring_threads() == []
    with pytest.raises(HsgdsError, match="closed"):
        next(it)


def test_close_from_another_thread_wakes_a_waiting_consumer(store):
    """A consumer blocked on a slow tile is woken by close() from another thread, with a clear error."""

    class Stuck(JitterReader):
        def read_into(self, tile_id, dest):
            time.sleep(2.0)
            self.inner.read_into(tile_id, dest)

    loader = _loader(store, shuffle=False)
    loader._ring.reader = Stuck(loader._ring.reader)
    closer = threading.Timer(0.2, loader.close)
    closer.start()
    t0 = time.perf_counter()
    with pytest.raises(HsgdsError, match="closed"):
        for _ in loader:
            pass
    assert time.perf_counter() - t0 < 1.5  # woken by close(), not by the end of the stuck read
    closer.join(5)  # close() itself returns once the read in flight has finished
    assert not closer.is_alive()
    assert _ring_threads() == []


def test_close_from_another_thread_as_an_iteration_starts(store, monkeypatch):
    """close() from another thread landing while iter() starts the ring (its reading thread made, not yet
    started) closes the loader: it raised "cannot join thread before it is started" and left the reader and
    engine open. The iteration then ends with the one-line closed error, and no thread is left."""
    loader = _loader(store)
    errors = []

    def close():
        try:
            loader.close()
        except BaseException as exc:  # noqa: BLE001 - what the closing thread would have printed
            errors.append(exc)

    start = threading.Thread.start

    def start_after_a_close(thread):
        if thread.name == "hsgds-ring":  # the window: close() in another thread, to its end, first
            closer = threading.Thread(target=close)
            start(closer)
            closer.join()
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_after_a_close)
    with pytest.raises(HsgdsError, match="closed"):
        for _ in loader:
            pass
    monkeypatch.undo()
    assert errors == []
    assert loader._closed and loader._ring._closed
    assert _ring_threads() == []


def test_close_from_another_thread_as_a_batch_starts(store, monkeypatch):
    """close() from another thread landing after the consumer checked that the loader is open and before it
    started a batch's cut (here: as the next batch's tiles are looked up, to be cut ahead): the cut did start,
    on a pool of cutting threads the engine made again after close() had shut its own, and that thread was
    left behind. Now no cut starts on a closed loader: the iteration ends with the one-line closed error
    and no thread is left."""
    from hsgds import defaults
    from hsgds.engines import cpu_cut
    from hsgds.ring import TileRing

    if not cpu_cut.available():
        pytest.skip("the fused CPU kernel (numba) cuts ahead")
    with defaults.set(cut_ahead=True):
        loader = _loader(store, shuffle=False)
    ready = TileRing.ready
    closed = []

    def ready_after_a_close(ring, tiles):
        if not closed:
            closer = threading.Thread(target=loader.close)
            closer.start()
            closer.join()
            closed.append(True)
        return ready(ring, tiles)

    monkeypatch.setattr(TileRing, "ready", ready_after_a_close)
    with pytest.raises(HsgdsError, match="closed"):
        for _ in loader:
            pass
    assert closed
    assert _ring_threads() == []


def test_a_construction_failing_late_releases_what_it_built(store, monkeypatch):
    """A loader whose construction fails after its ring was allocated (here the reader's one-time
    registration of the ring, e.g. GDS refusing to pin it) closes its ring, engine and reader: on CUDA they
    hold device memory and file handles, which are not left for the garbage collector; the error is the one
    raised."""
    from hsgds.engines.torch_engine import TorchEngine
    from hsgds.io.posix import PosixReader
    from hsgds.ring import TileRing

    closed = []
    for cls in (PosixReader, TileRing, TorchEngine):
        def close(self, _close=cls.close, _name=cls.__name__):
            closed.append(_name)
            _close(self)

        monkeypatch.setattr(cls, "close", close)
    monkeypatch.setattr(PosixReader, "register", lambda self, storage: (_ for _ in ()).throw(
        MemoryError("cannot pin the ring")))
    with pytest.raises(MemoryError, match="cannot pin the ring"):
        _loader(store, reader="posix", engine="torch")
    assert sorted(closed) == ["PosixReader", "TileRing", "TorchEngine"]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_tile_of_a_later_store_is_named_as_hsgds_verify_names_it(store, tmp_path, run_cli, damage):
    """A loader over several stores numbers tiles across them (store 2's tile 3 is tile 9 after store 1's 6).
    Its error named that global number beside store 2's chunk path ("tile 9" of a store of 6 tiles), where
    `hsgds verify` of the store names "tile 3". Both name the store's own tile now."""
    import shutil

    stores = [shutil.copytree(store, tmp_path / f"s{i}.zarr") for i in range(2)]
    path = hsgds.open_scene(stores[1]).tile_paths[3]
    if damage == "flip":
        data = bytearray(path.read_bytes())
        data[100] ^= 1
        path.write_bytes(bytes(data))
    else:
        os.truncate(path, 4096)
    code, _, err = run_cli("verify", stores[1])
    assert code == 2 and f"tile 3 ({path})" in err, err
    with _loader(stores, split=None, shuffle=False) as loader, pytest.raises(HsgdsError) as raised:
        for _ in loader:
            pass
    assert str(raised.value).startswith(f"tile 3 ({path}) "), raised.value
