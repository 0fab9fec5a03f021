"""The torch engine's cutting threads: jobs taken in order from one queue, a batch's jobs waited for at once.

An executor's Future per job costs the thread that hands out a batch a Future, a work item and a
condition per range, and one wait per range: the ranges of a batch end at about the same time, so
waiting for each in turn often sleeps and wakes twice. Here a batch's ranges share one :class:`Jobs`
handle, which the last range to end releases, and :meth:`Jobs.result` waits on it once. On the 2-core
VM a batch of the fused CPU kernel costs the consuming thread measurably less CPU this way.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["CutThreads", "Jobs"]


class Jobs:
    """Some jobs on the cutting threads: :meth:`result` waits until all have ended, then raises the first
    error one raised (like a Future, it can be asked again)."""

    __slots__ = ("_left", "_count", "_ended", "_error")

    def __init__(self, count: int) -> None:
        self._left = count
        self._count = threading.Lock()
        self._ended = threading.Lock()
        self._error: BaseException | None = None
        if count > 0:
            self._ended.acquire()  # released by the last job to end

    def _end(self, error: BaseException | None) -> None:
        with self._count:
            if error is not None and self._error is None:
                self._error = error
            self._left -= 1
            last = self._left == 0
        if last:
            self._ended.release()

    def done(self) -> bool:
        """Whether every job has ended."""
        return not self._ended.locked()

    def result(self) -> None:
        """Wait until every job has ended; raise the first error one raised."""
        with self._ended:
            pass
        if self._error is not None:
            raise self._error


class CutThreads:
    """``size`` threads named ``{name}_0``, ``{name}_1``, ... that run jobs in the order they were
    started, each thread calling ``initializer`` first. Threads that a dropped pool leaves idle end (as
    an executor's do); :meth:`shutdown` also waits for them. As an executor's, the threads finish the jobs
    started and end before the interpreter shuts down: a batch cut ahead that an unfinished iterator
    waits for as it is finalized at exit is then cut, not waited for forever."""

    def __init__(self, size: int, name: str, initializer: Callable[[], None]) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self.size = 0
        # daemon threads (an interpreter exiting waits for none), told to end once the pool is dropped
        self._stop = weakref.finalize(self, _stop_threads, self._queue, self._threads)
        self._name, self._initializer = name, initializer
        self.grow(size)

    def grow(self, size: int) -> None:
        """At least ``size`` threads from now on."""
        while self.size < size:
            thread = threading.Thread(target=_run_jobs, args=(self._queue, self._initializer),
                                      name=f"{self._name}_{self.size}", daemon=True)
            thread.start()
            self._threads.append(thread)
            _LIVE[thread] = self._queue
            self.size += 1

    def start(self, jobs: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]) -> Jobs:
        """Start ``fn(*args)`` for each (fn, args) in ``jobs``; one handle for all of them."""
        handle = Jobs(len(jobs))
        for fn, args in jobs:
            self._queue.put((handle, fn, args))
        return handle

    def submit(self, fn: Callable[..., Any], *args: Any) -> Jobs:
        """Start one job (an executor's submit; the handle's result() is None)."""
        return self.start([(fn, args)])

    def shutdown(self, wait: bool = True) -> None:
        """End the threads once the jobs started before have run (``wait``: and wait for them)."""
        self._stop()
        if wait:
            for thread in self._threads:
                if thread is not threading.current_thread():
                    thread.join()


# every thread still running, and its pool's queue: ended and joined as the interpreter starts to shut
# down (concurrent.futures does the same for its executors' threads), while threads can still take the GIL
_LIVE: weakref.WeakKeyDictionary[threading.Thread, queue.SimpleQueue[Any]] = weakref.WeakKeyDictionary()


def _end_all_at_exit() -> None:
    live = list(_LIVE.items())
    for _, jobs in live:
        jobs.put(None)
    for thread, _ in live:
        thread.join()


# (private since Python 3.9; where it is missing, atexit runs after the interpreter stopped waiting for threads:
# the daemon threads then just stop, as before this hook)
getattr(threading, "_register_atexit", atexit.register)(_end_all_at_exit)


def _stop_threads(jobs: queue.SimpleQueue[Any], threads: list[threading.Thread]) -> None:
    for _ in threads:
        jobs.put(None)


def _run_jobs(jobs: queue.SimpleQueue[Any], initializer: Callable[[], None]) -> None:
    initializer()
    while True:
        job = jobs.get()
        if job is None:
            return
        handle, fn, args = job
        error = None
        try:
            fn(*args)
        except BaseException as exc:  # handed to whoever waits for the job
            error = exc
        # nothing of the job stays referenced while the thread waits for the next: the engine's output
        # pool reuses a buffer only once no reference to it is left
        del job, fn, args
        handle._end(error)
        del handle, error
