"""The tile ring: preallocated slots that bound what the reader may hold (backpressure).

Slot life: free -> loading -> ready (resident) -> free. A loader thread fills free slots with tiles
in the order the epoch plan first needs them; the consumer waits only for the tiles of the batch it is
about to cut, and frees a tile after its last batch. On CUDA a freed slot is overwritten only after the
consumer's stream has passed an event recorded after that last use. Freed slots keep their tile, so a
tile needed again before its slot is reused is not read again (a split that fits is read once).
Reader errors are stored and raised in the consumer, naming the tile.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import numpy as np

from hsgds import defaults
from hsgds._wording import listed
from hsgds.errors import ConfigError, HsgdsError, TileReadError
from hsgds.io.base import ChunkReader
from hsgds.sampling import Interval

FREE, LOADING, READY = 0, 1, 2


@dataclass
class RingStats:
    """Queue statistics, as data."""

    slots: int = 0
    tiles_loaded: int = 0
    tiles_reused: int = 0
    bytes_read: int = 0
    reader_wait_s: float = 0.0  # the reader waited for a free slot (the consumer is slower: backpressure)
    consumer_wait_s: float = 0.0  # the consumer waited for a tile (the reader is slower: a stall)
    max_resident: int = 0  # most slots loading or ready at once (never exceeds ``slots``)
    max_inflight: int = 0  # most tiles being read at once (never exceeds ``inflight``)
    occupancy_sum: float = 0.0
    occupancy_samples: int = 0

    @property
    def mean_occupancy(self) -> float:
        return self.occupancy_sum / self.occupancy_samples if self.occupancy_samples else 0.0


class TileRing:
    """``slots`` tiles of ``tile_shape`` in one contiguous tensor ``storage`` (slots, S, S, B).

    At most ``inflight`` tiles are read at once (default: the ``read_inflight`` setting): the loader
    thread claims every free slot it may, up to that number, and hands them to the reader as one
    ``read_many`` batch when the reader overlaps its reads (kvikio), else one read per thread.
    ``on_load(slot, tile)``, when given, runs on the reading thread after each tile is read (and
    verified) and before the consumer may use it: e.g. the tile rewritten as the output's values.
    """

    def __init__(self, slots: int, tile_shape: tuple[int, ...], dtype: Any, device: Any,
                 reader: ChunkReader, inflight: int | None = None,
                 on_load: Callable[[int, int], None] | None = None) -> None:
        import torch

        if slots < 1:
            raise ConfigError(f"the ring needs at least one slot, got {slots}")
        inflight = int(defaults.get("read_inflight")) if inflight is None else int(inflight)
        if inflight < 1:
            raise ConfigError(f"read_inflight must be >= 1 (tiles read at once), got {inflight}; "
                              "see docs/settings.md")
        nbytes = slots * int(np.prod(tile_shape)) * torch.empty((), dtype=dtype).element_size()
        try:
            self.storage = torch.empty((slots, *tile_shape), dtype=dtype, device=device)
        except (RuntimeError, MemoryError) as exc:
            text = str(exc).lower()
            if not isinstance(exc, MemoryError) and "out of memory" not in text and "allocate" not in text:
                raise
            raise ConfigError(f"cannot allocate the tile ring: {slots} slots of {nbytes // slots} bytes = "
                              f"{nbytes / 2**20:.0f} MiB on {device}; pass a smaller ring_bytes "
                              f"(e.g. ring_bytes={max(2, slots // 2) * (nbytes // slots)})") from None
        self.device = torch.device(device)
        self.reader = reader
        self._on_load = on_load
        self.slots = slots
        self.state = [FREE] * slots
        self._busy = 0  # slots not FREE, kept with every state change (read per batch: O(1), not O(slots))
        self.tile_in = [-1] * slots  # which tile a slot holds (kept after it is freed, for reuse)
        self.freed_at = [0] * slots
        self.refs = [0] * slots  # residency intervals currently holding each slot
        self.events: list[Any] = [None] * slots
        self.slot_of: dict[int, int] = {}  # resident tile -> slot
        self.stats = RingStats(slots=slots)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._poll = float(defaults.get("ring_poll_s"))  # seconds between checks of the stop flag
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.inflight = inflight
        self._reading = 0  # tiles being read now (at most ``inflight``)
        # as many threads as reads may be in flight (no more than the slots): each batch starts at once
        self._pool = ThreadPoolExecutor(min(inflight, slots), thread_name_prefix="hsgds-read")
        self._pending: deque[Interval] = deque()
        self._futures: list[Future] = []
        self._release_at: dict[int, list[int]] = {}
        self._clock = 0
        self._closed = False

    # -- producer ------------------------------------------------------------------------------------
    def start(self, intervals: Iterable[Interval]) -> None:
        """Begin loading the residency ``intervals`` (sorted by first use) for one pass."""
        self.stop()
        event = self._consumer_event()
        with self._cond:
            if self._closed:  # by another thread (loader.close() while an iteration starts)
                raise HsgdsError("the loader was closed; its iterators yield nothing more: create a new loader")
            # tiles of an earlier pass that are still resident are freed (kept for reuse); its last
            # batch may still be running on the GPU, so they are overwritten only after this event
            for slot, st in enumerate(self.state):
                if st == READY:
                    self.events[slot] = event
                    self._free(slot)
            self._pending = deque(intervals)
            self._release_at = {}
            for iv in self._pending:
                self._release_at.setdefault(iv.last, []).append(iv.tile)
            self._error = None
            self._stop.clear()
            # published under the lock, before it starts: stop() from another thread sees this thread or none
            self._thread = thread = threading.Thread(target=self._produce, name="hsgds-ring", daemon=True)
        thread.start()

    def _take_slot(self, tile: int) -> tuple[int, bool] | None:
        """A slot for ``tile`` and whether it already holds it: the slot holding it (resident or freed but
        intact), else an empty one, else the longest-freed. None when no slot is free."""
        held = self.slot_of.get(tile)
        if held is not None and self.tile_in[held] == tile and self.state[held] != FREE:
            return held, True
        free = [s for s in range(self.slots) if self.state[s] == FREE]
        if not free:
            return None
        for s in free:
            if self.tile_in[s] == tile:
                return s, True
        s = min(free, key=lambda s: (self.tile_in[s] >= 0, self.freed_at[s]))
        return s, False

    def _ready_to_claim(self) -> tuple[int, bool] | None:
        """A slot for the next pending tile when it can be claimed now: it holds the tile already, or a
        read may start (fewer than ``inflight`` tiles are being read). Call with ``_cond`` held."""
        got = self._take_slot(self._pending[0].tile)
        if got is None or not (got[1] or self._reading < self.inflight):
            return None
        return got

    def _claim(self, slot: int, tile: int, cached: bool) -> None:
        """Make ``slot`` hold ``tile`` for one more residency interval. Call with ``_cond`` held."""
        self.refs[slot] += 1
        if self.refs[slot] > 1:  # resident (or loading) already, for an earlier interval still open: no read
            self.stats.tiles_reused += 1
            return
        if self.tile_in[slot] >= 0 and self.slot_of.get(self.tile_in[slot]) == slot:
            del self.slot_of[self.tile_in[slot]]
        self._set_state(slot, READY if cached else LOADING)
        self.tile_in[slot] = tile
        self.slot_of[tile] = slot
        self._note_occupancy()
        if cached:
            self.stats.tiles_reused += 1
            self._cond.notify_all()

    def _produce(self) -> None:
        try:
            while self._pending and not self._stop.is_set():
                t0 = time.perf_counter()
                group: list[tuple[int, int]] = []  # (slot, tile) to read now
                with self._cond:
                    got = self._ready_to_claim()
                    while got is None:  # backpressure: no free slot, or enough reads in flight
                        if self._stop.is_set() or self._error is not None:
                            return
                        self._cond.wait(self._poll)
                        got = self._ready_to_claim()
                    self.stats.reader_wait_s += time.perf_counter() - t0
                    # claim every slot that is free now, up to the reads allowed in flight: one batch
                    while got is not None:
                        slot, cached = got
                        self._claim(slot, self._pending.popleft().tile, cached)
                        if not cached:
                            group.append((slot, self.tile_in[slot]))
                            self._reading += 1
                        got = self._ready_to_claim() if self._pending else None
                    self.stats.max_inflight = max(self.stats.max_inflight, self._reading)
                if group:
                    self._submit(group)
        except BaseException as exc:  # surfaced in the consumer
            self._fail(exc)

    def _submit(self, group: list[tuple[int, int]]) -> None:
        """Start reading ``group``: one ``read_many`` for a batched reader, else one read per thread."""
        for slot, _ in group:
            event, self.events[slot] = self.events[slot], None
            if event is not None:
                event.synchronize()  # the consumer's last kernel on this slot has finished
        self._futures = [f for f in self._futures if not f.done()]
        for batch in ([group] if self.reader.batched else [[item] for item in group]):
            self._futures.append(self._pool.submit(self._load, batch))

    def _load(self, batch: list[tuple[int, int]]) -> None:
        ok = False
        try:
            if not self._stop.is_set():
                self.reader.read_many([(tile, self.tile_view(slot, tile)) for slot, tile in batch])
                if self._on_load is not None:
                    for slot, tile in batch:
                        self._on_load(slot, tile)
                ok = True
        except BaseException as exc:
            self._fail(exc)
        with self._cond:
            self._reading -= len(batch)
            for slot, tile in batch:
                if ok:
                    self._set_state(slot, READY)
                    self.stats.tiles_loaded += 1
                else:  # cancelled or failed: the slot's bytes are undefined, forget the tile
                    self._set_state(slot, FREE)
                    self.refs[slot] = 0
                    self.tile_in[slot] = -1
                    if self.slot_of.get(tile) == slot:
                        del self.slot_of[tile]
            self.stats.bytes_read = self.reader.bytes_read
            self._cond.notify_all()

    def tile_view(self, slot: int, tile: int) -> Any:
        """Slot ``slot`` as the destination of ``tile``: the whole slot, or (tiles of several sizes in slots
        sized for the largest) its first ``tile_nbytes`` bytes."""
        dest = self.storage[slot]
        n = self.reader.source.tile_nbytes(tile)
        if n == dest.numel() * dest.element_size():
            return dest
        return dest.view(-1)[:n // dest.element_size()]

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()

    def _set_state(self, slot: int, state: int) -> None:
        """Change a slot's state (under the condition's lock), keeping the count of busy slots."""
        self._busy += (state != FREE) - (self.state[slot] != FREE)
        self.state[slot] = state

    def _note_occupancy(self) -> None:
        self.stats.max_resident = max(self.stats.max_resident, self._busy)

    # -- consumer ------------------------------------------------------------------------------------
    def ready(self, tiles: Iterable[int]) -> np.ndarray | None:
        """The slots of ``tiles`` (same order) if every one is resident now, else None; never waits (a
        reader's error is raised, as by :meth:`acquire`)."""
        tiles = list(tiles)
        with self._cond:
            if self._error is not None:
                self._raise()
            slots = self._resident(tiles)
        return None if slots is None else np.asarray(slots, dtype=np.int64)

    def _resident(self, tiles: list[int]) -> list[int] | None:
        """The slots of ``tiles`` if all are resident (counted in the occupancy statistics), else None.
        Call with ``_cond`` held."""
        slots = [self.slot_of.get(t, -1) for t in tiles]
        if not all(s >= 0 and self.state[s] == READY for s in slots):
            return None
        self.stats.occupancy_sum += self._busy / self.slots
        self.stats.occupancy_samples += 1
        return slots

    def acquire(self, tiles: Iterable[int], timeout: float | None = None) -> np.ndarray:
        """Wait until every tile in ``tiles`` is resident; return their slots (same order)."""
        tiles = list(tiles)
        t0 = time.perf_counter()
        deadline = None if timeout is None else t0 + timeout
        with self._cond:
            while True:
                if self._error is not None:
                    self._raise()
                got = self._resident(tiles)
                if got is not None:
                    break
                slots = [self.slot_of.get(t, -1) for t in tiles]
                if self._closed:
                    raise HsgdsError("the loader was closed while waiting for tiles; create a new loader")
                if self._thread is None or not self._thread.is_alive():
                    if not any(s >= 0 and self.state[s] == LOADING for s in slots):
                        raise HsgdsError(f"tiles {listed(tiles)} were never scheduled for loading in this pass; ask for the "
                                         "tiles of the intervals given to start()")
                if deadline is not None and time.perf_counter() > deadline:
                    raise TimeoutError(f"tiles {listed(tiles)} not loaded after {timeout} s")
                self._cond.wait(self._poll)
        self.stats.consumer_wait_s += time.perf_counter() - t0
        return np.asarray(got, dtype=np.int64)

    def _raise(self) -> None:
        exc = self._error
        if isinstance(exc, HsgdsError):
            raise exc
        if isinstance(exc, OSError):
            raise TileReadError(f"reading a tile failed: {exc}") from exc
        raise HsgdsError(f"the tile reader failed: {exc!r}") from exc

    def release_batch(self, batch: int) -> None:
        """Free the tiles whose last use was ``batch`` (after the consumer's work on them is enqueued)."""
        tiles = self._release_at.pop(batch, ())
        if not tiles:
            return
        event = self._consumer_event()
        with self._cond:
            for t in tiles:
                slot = self.slot_of.get(t)
                if slot is not None and self.state[slot] == READY:
                    self.refs[slot] -= 1
                    if self.refs[slot] <= 0:
                        self.events[slot] = event
                        self._free(slot)
            self._cond.notify_all()

    def _consumer_event(self) -> Any:
        """On CUDA, an event recorded on the consumer's stream after everything it has enqueued so far."""
        if self.device.type != "cuda":
            return None
        import torch

        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _free(self, slot: int) -> None:
        self._set_state(slot, FREE)
        self.refs[slot] = 0
        self._clock += 1
        self.freed_at[slot] = self._clock

    # -- shutdown ------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the loader thread of the current pass; in-flight reads finish, nothing hangs."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        # one that start() has not started yet (close() from another thread) finds the stop flag set as it
        # starts and ends at once; join() would raise on it
        if thread is not None and thread.is_alive():
            thread.join()
        wait(self._futures)  # reads in flight finish (or see the stop flag) before slots are reused
        self._futures = []

    def close(self) -> None:
        if self._closed:
            return
        with self._cond:  # a consumer waiting in acquire() (another thread) wakes now, not after in-flight reads
            self._closed = True
            self._cond.notify_all()
        self.stop()
        self._pool.shutdown(wait=True)
