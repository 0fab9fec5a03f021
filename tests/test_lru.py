"""hsgds._lru.LruCache: what bounds the per-scene state of a loader over an archive."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hsgds._lru import LruCache


def test_count_limit_drops_the_least_recently_used():
    made = []
    cache = LruCache(limit=2)

    def make(k):
        made.append(k)
        return k * 10

    assert [cache.get(k, lambda k=k: make(k)) for k in (1, 2, 1, 3)] == [10, 20, 10, 30]
    assert 1 in cache and 3 in cache and 2 not in cache and len(cache) == 2  # 1 was used after 2
    assert cache.get(2, lambda: make(2)) == 20 and made == [1, 2, 3, 2]  # made again once dropped
    assert 1 not in cache


def test_byte_limit_keeps_what_fits_and_always_the_newest():
    cache = LruCache(max_bytes=100)
    for k in range(3):
        cache.get(k, lambda: np.zeros(40, np.uint8))
    assert [k in cache for k in range(3)] == [False, True, True] and cache.nbytes == 80
    cache.get("big", lambda: np.zeros(500, np.uint8))  # over the budget alone: kept, the rest dropped
    assert len(cache) == 1 and "big" in cache and cache.nbytes == 500
    cache.get("small", lambda: np.zeros(10, np.uint8))
    assert len(cache) == 1 and "small" in cache and cache.nbytes == 10


def test_a_failing_make_keeps_nothing():
    cache = LruCache(limit=3)

    def fail():
        raise OSError("gone")

    with pytest.raises(OSError):
        cache.get("k", fail)
    assert "k" not in cache and len(cache) == 0 and cache.get("k", lambda: 1) == 1


def test_threads_asking_at_once_make_a_value_once():
    cache = LruCache(limit=4)
    calls = []
    start = threading.Barrier(8)

    def make():
        calls.append(1)
        return object()

    got = []

    def ask():
        start.wait()
        got.append(cache.get("k", make))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len({id(v) for v in got}) == 1


@pytest.mark.parametrize("limit, max_bytes", [(0, None), (None, -1)])
def test_nonsense_limits_are_refused(limit, max_bytes):
    with pytest.raises(ValueError, match="keeps at least 1 value"):
        LruCache(limit=limit, max_bytes=max_bytes)


def test_min_count_holds_values_over_the_byte_budget():
    cache = LruCache(max_bytes=0, min_count=2)
    for k in range(3):
        cache.get(k, lambda: np.zeros(8, np.uint8))
    assert [k in cache for k in range(3)] == [False, True, True] and cache.nbytes == 16
    cache.min_count = 1
    cache.get(3, lambda: np.zeros(8, np.uint8))
    assert len(cache) == 1 and 3 in cache
