"""TileRing on its own, over the real PosixReader and a real store (zarr-python is the reference for the
bytes): backpressure, reads in flight, reuse of freed slots without I/O, errors in the consumer, stop / close.
A slow source is used only where the timing must be made visible (reads overlapping, a read in flight)."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
import torch

from hsgds import defaults
from hsgds.errors import ChecksumError, ConfigError, HsgdsError, TileReadError
from hsgds.io import PosixReader, TileSource
from hsgds.ring import FREE, LOADING, TileRing
from hsgds.sampling import Interval
from hsgds.scene import open_scene

JOIN_S = 10  # generous bound for "does not hang"


class RecordingReader(PosixReader):
    """The real PosixReader, recording what the ring asked of it (and optionally slowed down)."""

    def __init__(self, source, delay: float = 0.0):
        super().__init__(source)
        self.ring: TileRing | None = None
        self.delay = delay
        self.reads: list[int] = []
        self.batches: list[list[int]] = []
        self.snapshots: list[tuple[int, int, int]] = []  # (tile, slots loading, slots not free) at each read
        self.active = self.max_active = 0
        self.started = threading.Event()
        self._rec = threading.Lock()

    def read_into(self, tile_id, dest):
        with self._rec:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.reads.append(tile_id)
        if self.ring is not None:
            with self.ring._cond:
                state = list(self.ring.state)
                slot = (dest.data_ptr() - self.ring.storage.data_ptr()) // dest.nbytes
                assert state[slot] == LOADING, "the reader was given a slot that is not being loaded"
            self.snapshots.append((tile_id, state.count(LOADING), sum(s != FREE for s in state)))
        self.started.set()
        try:
            time.sleep(self.delay)
            super().read_into(tile_id, dest)
        finally:
            with self._rec:
                self.active -= 1

    def read_many(self, requests):
        requests = list(requests)
        with self._rec:
            self.batches.append([t for t, _ in requests])
        super().read_many(requests)


class BatchedRecordingReader(RecordingReader):
    batched = True  # the ring hands it whole batches (as it does kvikio)


def _ring(store, slots, inflight=2, reader_cls=RecordingReader, delay=0.0):
    scene = open_scene(store)
    reader = reader_cls(TileSource.from_scene(scene), delay=delay)
    ring = TileRing(slots, scene.grid.tile_shape, torch.int16, "cpu", reader, inflight=inflight)
    reader.ring = ring
    return ring, reader


def _bytes(t) -> bytes:
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def _consume(ring, tiles, store, zarr_tile, pause=0.0, released=None):
    """One batch per tile, in order: acquire, check the bytes, release."""
    for b, t in enumerate(tiles):
        (slot,) = ring.acquire([t], timeout=JOIN_S)
        assert _bytes(ring.storage[slot]) == zarr_tile(store, t), f"tile {t} at batch {b}"
        time.sleep(pause)
        if released is not None:
            released.append(b)
        ring.release_batch(b)


def test_backpressure_reader_fills_only_free_slots(tile_store, zarr_tile):
    order = [5, 0, 11, 3, 7, 1, 9, 2, 10, 4, 8, 6]
    position = {t: i for i, t in enumerate(order)}
    ring, reader = _ring(tile_store, slots=3, inflight=2)
    released: list[int] = []
    ahead = []  # how far ahead of the consumer's releases each read started

    original = reader.read_into

    def read_into(tile_id, dest):
        ahead.append(position[tile_id] - len(released))
        original(tile_id, dest)

    reader.read_into = read_into
    try:
        ring.start([Interval(t, b, b) for b, t in enumerate(order)])
        _consume(ring, order, tile_store, zarr_tile, pause=0.01, released=released)
    finally:
        ring.close()
        reader.close()
    assert sorted(reader.reads) == sorted(order)  # each tile read once
    assert max(ahead) == 2  # the slow consumer let the reader fill the ring, and no further
    assert all(busy <= 3 and loading <= 2 for _, loading, busy in reader.snapshots)
    assert ring.stats.max_resident == 3 and ring.stats.max_inflight <= 2
    assert ring.stats.tiles_loaded == 12 and ring.stats.bytes_read == 12 * reader.source.nbytes


@pytest.mark.parametrize("cls", [RecordingReader, BatchedRecordingReader])
def test_reads_in_flight_are_bounded_and_batched(tile_store, zarr_tile, cls):
    ring, reader = _ring(tile_store, slots=12, inflight=3, reader_cls=cls, delay=0.05)
    try:
        ring.start([Interval(t, t, t) for t in range(12)])
        _consume(ring, range(12), tile_store, zarr_tile)
    finally:
        ring.close()
        reader.close()
    assert ring.stats.max_inflight == 3 and reader.max_active <= 3
    if cls.batched:  # every free slot claimed at once, up to the bound: one read_many per batch
        assert reader.batches[0] == [0, 1, 2] and all(len(b) <= 3 for b in reader.batches)
        assert sorted(t for b in reader.batches for t in b) == list(range(12))
    else:  # a reader that reads one after another gets one tile per thread, and they overlap
        assert all(len(b) == 1 for b in reader.batches) and reader.max_active == 3


def test_an_interval_overlapping_its_tiles_earlier_one_counts_as_reused(tile_store, zarr_tile):
    # (a rank's padding repeats its first samples: a tile's second interval can open before its first ends)
    ring, reader = _ring(tile_store, slots=2)
    try:
        ring.start([Interval(0, 0, 2), Interval(0, 1, 1)])
        _consume(ring, [0, 0, 0], tile_store, zarr_tile)
        assert reader.reads == [0]
        assert ring.stats.tiles_loaded == 1 and ring.stats.tiles_reused == 1  # one per interval
    finally:
        ring.close()


def test_freed_slots_are_reused_without_reading(tile_store, zarr_tile):
    ring, reader = _ring(tile_store, slots=6)
    try:
        ring.start([Interval(t, b, b) for b, t in enumerate(range(12))])
        _consume(ring, range(12), tile_store, zarr_tile)
        assert len(reader.reads) == 12 and ring.stats.tiles_reused == 0
        # tiles 6..11 are still in their (freed) slots: a new pass needing them reads nothing
        ring.start([Interval(t, b, b) for b, t in enumerate([8, 6, 11])])
        _consume(ring, [8, 6, 11], tile_store, zarr_tile)
        assert len(reader.reads) == 12 and ring.stats.tiles_reused == 3
        # tile 0 is read into the longest-freed slot (tile 7's); 9 and 10 are still there
        ring.start([Interval(t, b, b) for b, t in enumerate([0, 9, 10, 7])])
        _consume(ring, [0, 9, 10, 7], tile_store, zarr_tile)
        assert reader.reads[12:] == [0, 7] and ring.stats.tiles_reused == 5
    finally:
        ring.close()
        reader.close()


def _damaged(store, tmp_path, how):
    copy = tmp_path / "store.zarr"
    shutil.copytree(store, copy)
    path = TileSource.from_scene(open_scene(copy)).paths[4]
    if how == "missing":
        path.unlink()
    else:
        blob = bytearray(path.read_bytes())
        blob[100] ^= 1
        path.write_bytes(bytes(blob))
    return copy, path


@pytest.mark.parametrize("how, error", [("missing", TileReadError), ("flipped", ChecksumError)])
@pytest.mark.parametrize("cls", [RecordingReader, BatchedRecordingReader])
def test_reader_errors_surface_in_the_consumer(tile_store, tmp_path, zarr_tile, how, error, cls):
    store, path = _damaged(tile_store, tmp_path, how)
    ring, reader = _ring(store, slots=4, reader_cls=cls)
    try:
        ring.start([Interval(t, t, t) for t in range(12)])
        with pytest.raises(error) as err:
            _consume(ring, range(12), tile_store, zarr_tile)
        assert f"tile 4 ({path})" in str(err.value)
        with pytest.raises(error):  # it stays raised for this pass
            ring.acquire([5], timeout=JOIN_S)
        ring.start([Interval(t, t, t) for t in (0, 1)])  # a new pass starts clean
        _consume(ring, (0, 1), tile_store, zarr_tile)
    finally:
        ring.close()
        reader.close()


def test_on_load_runs_on_each_read_tile_before_the_consumer_sees_it(tile_store, zarr_tile):
    """The hook sees the tile as read (and verified) and the consumer sees what the hook made of it; a hook
    that fails is raised in the consumer like a read error."""
    scene = open_scene(tile_store)
    seen: list[int] = []

    def on_load(slot, tile):
        assert _bytes(ring.storage[slot]) == zarr_tile(tile_store, tile)
        ring.storage[slot].bitwise_not_()
        seen.append(tile)

    reader = PosixReader(TileSource.from_scene(scene))
    ring = TileRing(2, scene.grid.tile_shape, torch.int16, "cpu", reader, on_load=on_load)
    try:
        ring.start([Interval(t, t, t) for t in range(4)])
        for b in range(4):
            (slot,) = ring.acquire([b], timeout=JOIN_S)
            assert _bytes(ring.storage[slot].bitwise_not()) == zarr_tile(tile_store, b)
            ring.release_batch(b)
        assert sorted(seen) == [0, 1, 2, 3]
    finally:
        ring.close()

    def fail(slot, tile):
        raise ValueError(f"cannot rewrite tile {tile}")

    ring = TileRing(2, scene.grid.tile_shape, torch.int16, "cpu", reader, on_load=fail)
    try:
        ring.start([Interval(t, t, t) for t in (4, 5)])
        with pytest.raises(HsgdsError, match="cannot rewrite tile [45]"):  # read on two threads
            ring.acquire([4], timeout=JOIN_S)
    finally:
        ring.close()
        reader.close()


def _in_thread(fn) -> tuple[threading.Thread, list]:
    out: list = []

    def run():
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_stop_and_close_return_with_reads_in_flight(tile_store, zarr_tile):
    ring, reader = _ring(tile_store, slots=4, inflight=2, delay=0.3)
    try:
        ring.start([Interval(t, t, t) for t in range(12)])
        assert reader.started.wait(JOIN_S)
        stopper, _ = _in_thread(ring.stop)  # waits for the reads in flight, not for the pass
        stopper.join(JOIN_S)
        assert not stopper.is_alive() and len(reader.reads) <= 4
        ring.start([Interval(t, t, t) for t in (2, 3)])  # a stopped ring starts again and is correct
        _consume(ring, (2, 3), tile_store, zarr_tile)
        # a consumer waiting for a tile is woken by close() from another thread
        reader.started.clear()
        ring.start([Interval(t, t, t) for t in range(4, 12)])
        consumer, out = _in_thread(lambda: ring.acquire([11], timeout=JOIN_S))
        assert reader.started.wait(JOIN_S)
        closer, _ = _in_thread(ring.close)
        consumer.join(JOIN_S)
        closer.join(JOIN_S)
        assert not consumer.is_alive() and not closer.is_alive()
        assert isinstance(out[0], HsgdsError) and "closed" in str(out[0])
        ring.close()  # idempotent
        ring.stop()
    finally:
        ring.close()
        reader.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("hsgds") and t.is_alive()]


def test_reads_in_flight_setting(tile_store):
    scene = open_scene(tile_store)
    with PosixReader(TileSource.from_scene(scene)) as reader:
        args = (2, scene.grid.tile_shape, torch.int16, "cpu", reader)
        with defaults.set(read_inflight=7):
            ring = TileRing(*args)
            assert ring.inflight == 7
            ring.close()
        for bad in (0, -2):
            with pytest.raises(ConfigError, match="read_inflight must be >= 1"):
                TileRing(*args, inflight=bad)
