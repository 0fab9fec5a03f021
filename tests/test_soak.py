"""Resource soak: 50 epochs with random early breaks, resumes from state_dict (same or new loader) and
loaders closed and reopened. Resident memory, open file descriptors and threads must stay flat, and
every epoch, however interrupted, must cover the split exactly once (docs/reliability.md)."""

from __future__ import annotations

import gc
import os
import random
import sys
import threading
import time

import pytest
import torch

import hsgds
from hsgds import defaults

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")

EPOCHS = 50
RSS_GROWTH_LIMIT = 8 << 20  # bytes, after warm-up


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def usage(collect: bool = True) -> dict[str, int]:
    """Resident memory (bytes), open file descriptors, OS threads, Python threads."""
    if collect:
        gc.collect()
    return {"rss": _status("VmRSS") * 1024, "fds": len(os.listdir("/proc/self/fd")),
            "os_threads": _status("Threads"), "py_threads": threading.active_count()}


def thread_names() -> list[str]:
    """The Python threads' names (what a failure message needs to say which thread is too many; the OS
    names them all "python")."""
    return sorted(t.name for t in threading.enumerate())


@pytest.fixture(scope="module")
def store(synthetic_store):
    return synthetic_store(48, 40, 8, classes=5, dtype="int16", seed=9, labelled_fraction=0.6, tile=18,
                           train=0.5)[0]


def _open(store, ring_bytes):
    return hsgds.PatchLoader(store, patch_size=7, batch_size=8, split="train", device="cpu", seed=4,
                             return_coords=True, shuffle_window=2, ring_bytes=ring_bytes)


def test_soak_50_epochs_with_breaks_and_resumes(store, record_property):
    scene = hsgds.open_scene(store)
    y, x, _ = scene.samples("train")
    everyone = sorted(zip(y.tolist(), x.tolist()))
    ring_bytes = 3 * scene.grid.tile_nbytes  # smaller than the split: tiles are evicted and read again
    rng = random.Random(2024)

    # warm-up: torch's thread pools, allocator arenas and lazy imports reach their steady state
    for _ in range(2):
        with _open(store, ring_bytes) as warm:
            for _ in range(2):
                for i, _ in enumerate(warm):
                    if i == 3:
                        break
                list(warm)
    before = usage()
    t0 = time.perf_counter()

    loader = _open(store, ring_bytes)
    breaks = reopened = batches = samples = 0
    peak = dict(before)
    before_names = peak_names = thread_names()
    seen: dict[int, list[tuple[int, int]]] = {}  # epoch -> centres yielded in it, across breaks and resumes
    while loader.epoch < EPOCHS:
        stop_at = rng.randrange(0, len(loader)) if rng.random() < 0.5 else None  # the last batch included
        epoch = loader.epoch
        for i, (p, _, c) in enumerate(loader):
            seen.setdefault(epoch, []).extend(map(tuple, c.tolist()))  # yielded = consumed (state_dict says so)
            samples += len(p)
            batches += 1
            if i == stop_at:
                break
        for e in [e for e in seen if e < loader.epoch]:  # finished epochs: each centre exactly once
            assert sorted(seen.pop(e)) == everyone, f"epoch {e} lost or repeated samples"
        now = usage(collect=False)
        if now["os_threads"] > peak["os_threads"]:
            peak_names = thread_names()
        for key in peak:
            peak[key] = max(peak[key], now[key])
        if stop_at is None:
            continue
        breaks += 1
        state = loader.state_dict()
        if rng.random() < 0.5:  # the job restarts: a new loader resumes from the saved state
            loader.close()
            loader = _open(store, ring_bytes)
            reopened += 1
        loader.load_state_dict(state)
    epochs, resumes = loader.epoch, breaks
    assert not seen
    loader.close()
    del loader
    elapsed = time.perf_counter() - t0
    after = usage()

    growth = after["rss"] - before["rss"]
    summary = {"epochs": epochs, "batches": batches, "samples": samples, "breaks": breaks, "resumes": resumes,
               "loaders_reopened": reopened, "seconds": round(elapsed, 2),
               "rss_before_mb": round(before["rss"] / 2**20, 1), "rss_after_mb": round(after["rss"] / 2**20, 1),
               "fds": (before["fds"], after["fds"]), "os_threads": (before["os_threads"], after["os_threads"]),
               "py_threads": (before["py_threads"], after["py_threads"]),
               "peak_during": {**peak, "rss": round(peak["rss"] / 2**20, 1)},
               "python_threads_at_peak": peak_names, "python_threads_before": before_names}
    record_property("soak", summary)
    print(f"\nsoak: {summary}")
    assert breaks >= 10 and reopened >= 5  # the random schedule really exercised both resume paths
    assert growth < RSS_GROWTH_LIMIT, summary
    assert after["fds"] == before["fds"], summary
    assert after["os_threads"] == before["os_threads"], summary
    assert after["py_threads"] == before["py_threads"], summary
    # while open, one loader holds its ring thread, a read thread per read in flight (read_inflight, at most
    # the ring's slots) and its engine's cutting threads (at most torch's thread count; a pool starts a
    # thread when none is idle, so how many of these exist moves with the machine's load), and a file
    # per tile at most
    cut_threads = min(torch.get_num_threads(), defaults.get("torch_threads"))
    allowed = before["os_threads"] + 1 + min(defaults.get("read_inflight"), 3) + cut_threads
    assert peak["os_threads"] <= allowed, summary
    assert peak["fds"] <= before["fds"] + scene.grid.num_tiles, summary
    assert peak["rss"] - before["rss"] < RSS_GROWTH_LIMIT, summary
    assert elapsed < 30, summary
