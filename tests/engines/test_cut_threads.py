"""The torch engine's cutting threads (hsgds.engines.cut_threads): jobs in order, one handle per batch that
waits for all of its jobs and raises the first error, nothing of a job kept once it has ended, and threads
that end with their pool."""

from __future__ import annotations

import gc
import sys
import threading

import pytest

from hsgds.engines.cut_threads import CutThreads


def _named(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def test_a_handle_waits_for_all_of_its_jobs_in_order_on_named_initialized_threads():
    initialized, ran = [], []
    pool = CutThreads(1, "test-cut-order", lambda: initialized.append(threading.current_thread().name))
    gate = threading.Event()
    first = pool.submit(gate.wait)  # holds the only thread until the gate opens
    batch = pool.start([(ran.append, (k,)) for k in range(5)])
    assert not batch.done() and not first.done()
    gate.set()
    assert batch.result() is None and batch.result() is None  # asked again, like a Future
    assert batch.done() and first.done()
    assert ran == [0, 1, 2, 3, 4] and initialized == ["test-cut-order_0"]
    pool.grow(3)
    assert sorted(t.name for t in _named("test-cut-order")) == [f"test-cut-order_{k}" for k in range(3)]
    pool.shutdown()
    assert not _named("test-cut-order")


def test_the_first_error_is_raised_once_every_job_has_ended():
    pool = CutThreads(2, "test-cut-error", lambda: None)
    ended, gate = [], threading.Event()

    def fail(msg: str) -> None:
        raise ValueError(msg)

    def slow() -> None:
        gate.wait()
        ended.append(1)

    jobs = pool.start([(fail, ("first",)), (slow, ())])
    threading.Timer(0.05, gate.set).start()
    with pytest.raises(ValueError, match="first"):
        jobs.result()
    assert ended == [1]  # the error waited for the job still writing
    assert pool.start([]).done()  # no job: nothing to wait for
    pool.shutdown()


def test_an_ended_job_leaves_no_reference_to_its_arguments():
    """The engine's output pool reuses a buffer only once nothing references it: an idle thread must not."""
    pool = CutThreads(1, "test-cut-refs", lambda: None)
    buf = bytearray(16)
    before = sys.getrefcount(buf)
    pool.start([(len, (buf,))]).result()
    pool.start([(lambda: None, ())]).result()  # the thread is idle again, past the job that had buf
    assert sys.getrefcount(buf) == before
    pool.shutdown()


def test_a_dropped_pool_ends_its_idle_threads():
    pool = CutThreads(2, "test-cut-dropped", lambda: None)
    threads = _named("test-cut-dropped")
    assert len(threads) == 2 and all(t.daemon for t in threads)
    del pool
    gc.collect()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)


_WAITED_FOR_AT_EXIT = """
import time
from hsgds.engines.cut_threads import CutThreads

pool = CutThreads(1, "hsgds-cut", lambda: None)
jobs = pool.start([(time.sleep, (0.5,))])

def batches():  # a loader's iterator left unfinished: its finally waits for the batch cut ahead
    try:
        yield 1
    finally:
        jobs.result()
        print("waited")

it = batches()
next(it)
"""


def test_a_job_waited_for_as_the_interpreter_exits_is_run_first():
    """A job still running as the program ends, which an unfinished iterator waits for when it is finalized
    at exit: the threads finish their jobs before the interpreter shuts down (as an executor's do). As daemon
    threads they could no longer take the GIL by then, and the exit hung. In a subprocess: a hang is a
    timeout, not a stuck test run."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", _WAITED_FOR_AT_EXIT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "waited"
