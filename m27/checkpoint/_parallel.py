"""A few threads for the CPU-heavy parts of a save and a restore.

xxh3, zstd compression and zstd decompression all release the GIL, so hashing,
compressing and decompressing chunk batches on ``threads`` threads scales with the cores
(on a 2-core machine, up to ~2x). The pool is not ``concurrent.futures.ThreadPoolExecutor``
on purpose: that one refuses new work once the interpreter starts shutting down, before
``weakref.finalize`` runs, and the saves still in flight at exit must still be written.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Threads used when neither the caller nor the settings say: cores, at most this many.
MAX_DEFAULT_THREADS = 4


def default_threads() -> int:
    return max(1, min(MAX_DEFAULT_THREADS, os.cpu_count() or 1))


class Workers:
    """`count` daemon threads running submitted calls in FIFO order.

    With ``count == 1`` nothing is started and every call runs inline in the caller,
    which is both the cheapest and the easiest to reason about.
    """

    def __init__(self, count: int, name: str) -> None:
        self.count = max(1, count)
        self._name = name
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def _start(self) -> None:
        """Start the threads on first use (called with the lock held)."""
        for i in range(self.count):
            thread = threading.Thread(target=self._run, name=f"{self._name}-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)

    def submit(self, call: Callable[[], R]) -> Future[R]:
        future: Future[R] = Future()
        if self.count > 1:
            with self._lock:
                if not self._closed:
                    if not self._threads:
                        self._start()
                    self._queue.put((future, call))
                    return future
        # One thread, or closed: run inline.
        future.set_running_or_notify_cancel()
        try:
            future.set_result(call())
        except BaseException as exc:
            future.set_exception(exc)
        return future

    def map_ordered(
        self, fn: Callable[[T], R], items: Iterable[T], ahead: int = 0
    ) -> Generator[R, None, None]:
        """fn(item) for every item, results in order, at most `ahead` computed in advance.

        If the consumer stops early (an error while writing), queued calls are cancelled
        and running ones are waited for, so none outlives the buffers it reads.
        """
        ahead = ahead or 2 * self.count
        pending: deque[Future[R]] = deque()
        try:
            for item in items:
                pending.append(self.submit(partial(fn, item)))
                if len(pending) >= ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
            for future in pending:
                if not future.cancelled():
                    future.exception()  # waits; its error is not the one being raised

    def run_all(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """fn over every item; the first failure in item order is raised, others cancelled."""
        return list(self.map_ordered(fn, items, ahead=1 << 30))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            threads, self._threads = self._threads, []
        for _ in threads:
            self._queue.put(None)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()
