"""hsgds.batches: batches prepared ahead on a thread, in order, errors at their batch, threads that end."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from hsgds.batches import BatchPrep, PinnedStaging, Prepared


def _make(log: list[int], fail_at: int | None = None):
    def make(b: int) -> Prepared:
        log.append(b)
        if b == fail_at:
            raise ValueError(f"bad batch {b}")
        rows = np.full((3, 4), b, dtype=np.int64)
        return Prepared(b, np.arange(4) + 4 * b, np.array([b]), np.zeros(4, np.int64), rows)
    return make


def _threads() -> int:
    return sum(t.name == "hsgds-batches" for t in threading.enumerate())


def test_batches_come_in_order_and_ahead():
    log: list[int] = []
    prep = BatchPrep(_make(log), 3, 9, depth=2)
    try:
        for b in range(3, 9):
            got = prep.get(b)
            assert got.batch == b and np.all(got.rows == b)
            if b == 3:
                deadline = time.monotonic() + 5
                while len(log) < 4 and time.monotonic() < deadline:  # 3 taken, 4 and 5 queued
                    time.sleep(0.01)
                assert log[:3] == [3, 4, 5] and len(log) <= 4 + 1  # never more than depth ahead (+1 in hand)
    finally:
        prep.close()
    assert log == list(range(3, 9))


def test_an_error_is_raised_at_its_batch():
    log: list[int] = []
    prep = BatchPrep(_make(log, fail_at=5), 0, 10)
    try:
        for b in range(5):
            assert prep.get(b).batch == b
        with pytest.raises(ValueError, match="bad batch 5"):
            prep.get(5)
    finally:
        prep.close()
    assert max(log) == 5  # nothing prepared after the failure


def test_close_ends_the_thread_even_when_it_waits():
    before = _threads()
    prep = BatchPrep(_make([]), 0, 1000, depth=1)  # blocks on a full queue at once
    time.sleep(0.05)
    assert _threads() == before + 1
    prep.close()
    prep.close()  # idempotent
    assert _threads() == before


def test_batches_out_of_order_are_a_programming_error():
    prep = BatchPrep(_make([]), 0, 3)
    try:
        with pytest.raises(RuntimeError, match="batch 1 asked for"):
            prep.get(1)
    finally:
        prep.close()


def test_a_wait_for_a_batch_that_never_comes_ends():
    """Waiting has a stop: a batch past the last, or a wait that another thread's close() cuts short,
    raises instead of blocking for ever."""
    prep = BatchPrep(_make([]), 0, 2)
    try:
        assert [prep.get(b).batch for b in (0, 1)] == [0, 1]
        with pytest.raises(RuntimeError, match="batch 2 will never be prepared: the preparing thread ended"):
            prep.get(2)
    finally:
        prep.close()

    gate = threading.Event()
    slow = BatchPrep(lambda b: gate.wait(30), 0, 1)  # its one batch waits for the gate
    try:
        threading.Timer(0.2, slow.close).start()
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="batch 0 will never be prepared: the loader was closed"):
            slow.get(0)
        assert time.monotonic() - t0 < 5
    finally:
        gate.set()
        slow.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_pinned_staging_reuses_buffers_without_overwriting_copies_in_flight():
    staging = PinnedStaging(torch.device("cuda"), count=2)
    outs, want = [], []
    for b in range(9):
        rows = np.arange(12, dtype=np.int64).reshape(3, 4) * (b + 1)
        outs.append(staging.stage(rows))
        want.append(rows.copy())
    torch.cuda.synchronize()
    for got, rows in zip(outs, want):
        assert got.is_cuda and np.array_equal(got.cpu().numpy(), rows)


def test_arrays_packed_into_one_buffer_read_back_as_they_were():
    """``PinnedStaging.stage_all``'s packing: arrays of any dtype and shape (empty ones included) in one byte
    buffer, each starting on an 8-byte boundary, read back as views equal to the arrays."""
    from hsgds.batches import pack, packing, unpacked

    rng = np.random.default_rng(0)
    arrays = [rng.integers(-9, 9, (3, 5)).astype(np.int64), rng.normal(size=7).astype(np.float32),
              np.zeros((0, 2), np.int64), rng.integers(0, 8, 3).astype(np.int8), np.array([True, False, True]),
              rng.normal(size=(2, 3)), rng.integers(0, 9, (4, 3)).astype(np.int64)[:, ::2]]  # last: not contiguous
    offsets, nbytes = packing(arrays)
    assert all(o % 8 == 0 for o in offsets) and nbytes >= sum(a.nbytes for a in arrays)
    flat = np.full(nbytes, 0xAB, np.uint8)
    pack(flat, arrays, offsets)
    got = unpacked(torch.from_numpy(flat), arrays, offsets)
    for a, t in zip(arrays, got):
        assert t.shape == a.shape and t.numpy().dtype == a.dtype
        np.testing.assert_array_equal(t.numpy(), a)
    assert packing([]) == ([], 1)
