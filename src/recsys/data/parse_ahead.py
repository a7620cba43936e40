"""Parsing a stream's chunks ahead, on threads, while the caller works on the one before: the same results, sooner.

A streaming reader reads its chunks (bytes of whole lines, Parquet record batches) one after
the other, and parsing a chunk costs more than reading it. ``parsed_ahead`` reads the chunks on
a thread of its own and parses up to ``threads`` of them at once on a pool, while the caller
batches the chunk before: which pays where a parse releases the GIL for most of its time, as
the numba tokenisers and Arrow do. Chunks are served in order, and an error met reading ahead
(a line too long, an unreadable file) is raised after the chunks before it, where a single
thread would have met it: the rows, the steps and the errors are the same as without threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from queue import Empty, Full, Queue
from typing import Generic, TypeVar

ChunkT = TypeVar("ChunkT")
ParsedT = TypeVar("ParsedT")

_POLL_S = 0.05


@dataclass(frozen=True)
class _End:
    """The reading thread is done: at the end of the chunks, or at ``error``."""

    error: Exception | None = None


def parsed_ahead(
    parse: Callable[[ChunkT], ParsedT], chunks: Iterator[ChunkT], threads: int
) -> Generator[ParsedT, None, None]:
    """``parse`` of each of ``chunks``, in order; with more than one thread, read and parsed ahead as the module
    says. Close it (or run it to its end) before closing ``chunks``: its reading thread iterates them."""
    if threads == 1:
        yield from map(parse, chunks)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="parse") as pool:
        reading = _ReadingThread(chunks, parse, pool, threads)
        try:
            while True:
                item = reading.queue.get()
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    return
                yield item.result()
        finally:  # Closed early (a seek, the end of an epoch): the chunks read ahead are not wanted.
            reading.stop()


class _ReadingThread(Generic[ChunkT, ParsedT]):
    """Reads ``chunks`` and hands each to the pool to parse, putting the futures in ``queue`` in order, at most
    ``threads`` ahead of the caller, then an ``_End``."""

    def __init__(
        self,
        chunks: Iterator[ChunkT],
        parse: Callable[[ChunkT], ParsedT],
        pool: ThreadPoolExecutor,
        threads: int,
    ) -> None:
        self.queue: Queue[Future[ParsedT] | _End] = Queue(maxsize=threads)
        self._chunks, self._parse, self._pool = chunks, parse, pool
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="parse-read", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop reading, drop what was read ahead, and wait for the thread (which then no longer uses the chunks)."""
        self._stopping.set()
        while self._thread.is_alive() or not self.queue.empty():
            try:
                item = self.queue.get(timeout=_POLL_S)  # makes room for a put the thread waits on
            except Empty:
                continue
            if isinstance(item, Future):
                item.cancel()
        self._thread.join()

    def _run(self) -> None:
        try:
            for chunk in self._chunks:
                if not self._put(self._pool.submit(self._parse, chunk)):
                    return
        except Exception as error:
            self._put(_End(error))
            return
        self._put(_End())

    def _put(self, item: Future[ParsedT] | _End) -> bool:
        """Put ``item`` when there is room; False if stopped meanwhile."""
        while not self._stopping.is_set():
            try:
                self.queue.put(item, timeout=_POLL_S)
                return True
            except Full:
                continue
        if isinstance(item, Future):
            item.cancel()
        return False
