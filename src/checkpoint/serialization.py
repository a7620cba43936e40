"""Torch files of a checkpoint: written with their SHA-256 taken on the way, read back only if it matches.

Every file goes through fsspec, so the same code writes to local disk, memory or an object store.
Reading uses ``torch.load(weights_only=True)``: a file that tries to run code while it is
unpickled is refused instead of executed.
"""

from __future__ import annotations

import functools
import hashlib
import pickle
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch
from fsspec import AbstractFileSystem

from checkpoint.errors import CheckpointError, CorruptCheckpointError, UnsafeCheckpointError
from checkpoint.metadata import FileRecord

# What ``torch.load(weights_only=True)`` reads back without an allow-list; checked before writing
# so that an unloadable state fails at save time, when it can still be fixed, not at resume time.
_LEAF_TYPES = (torch.Tensor, int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)
_CONTAINER_TYPES = (dict, OrderedDict, list, tuple)

_HASH_CHUNK_BYTES = 16 * 1024 * 1024


class _HashingWriter:
    """A file-like object that hashes each chunk beside writing it.

    ``torch.save`` hands ``write`` memory views that are valid only until ``write`` returns: a
    CUDA tensor's storage arrives as a temporary CPU copy that torch frees as soon as its record
    is written, and the pickled object tree as a bytes object freed when ``torch.save`` returns.
    So no view is kept past ``write``: a large chunk is hashed on a helper thread while this
    thread writes it to the file (both release the GIL), and ``write`` returns once both are
    done; small chunks are copied and gathered first. Keeping the views for later hashing read
    freed memory (a segfault in the first checkpoint of every GPU run).
    """

    def __init__(self, file: Any) -> None:
        self._file = file
        self._sha256 = hashlib.sha256()
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-sha256")
        self._small: bytearray = bytearray()
        self.size = 0
        self.write_error: OSError | None = None
        """The failure of the file's own ``write``, which ``torch.save`` reports only as "unexpected pos"."""

    def write(self, chunk: bytes | memoryview) -> int:
        length = len(chunk)
        if length < _HASH_BATCH_BYTES:
            self._write_to_file(chunk)
            self._small += chunk
            if len(self._small) >= _HASH_BATCH_BYTES:
                self._hash_small()
        else:
            self._hash_small()
            hashed = self._hasher.submit(self._sha256.update, chunk)
            try:
                self._write_to_file(chunk)
            finally:
                hashed.result()  # The chunk's memory may be freed once this returns.
        self.size += length
        return length

    def _write_to_file(self, chunk: bytes | memoryview) -> None:
        try:
            self._file.write(chunk)
        except OSError as ex:
            self.write_error = ex
            raise

    def _hash_small(self) -> None:
        if self._small:
            self._hasher.submit(self._sha256.update, bytes(self._small))
            self._small.clear()

    def flush(self) -> None:
        self._file.flush()

    def finish(self) -> str:
        """The SHA-256 of everything written, once every queued chunk is hashed."""
        self._hash_small()
        self._hasher.shutdown(wait=True)
        return self._sha256.hexdigest()

    def __enter__(self) -> _HashingWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._hasher.shutdown(wait=True)  # Also when torch.save failed half-way.


_HASH_BATCH_BYTES = 1 << 20


def check_serializable(state: Mapping[str, Any], name: str) -> None:
    """Raise ``CheckpointError`` naming the first value that a weights-only load could not read back."""
    _check_value(state, name)


def _check_value(value: Any, where: str) -> None:
    if isinstance(value, _LEAF_TYPES):
        return
    if type(value) in (dict, OrderedDict):
        for key, item in value.items():
            if not isinstance(key, int | str):
                raise CheckpointError(
                    f"The keys of `{where}` must be strings or integers, but one is a {type(key).__name__} instead."
                )
            _check_value(item, f"{where}[{key!r}]")
        return
    if isinstance(value, list | tuple) and type(value) in _CONTAINER_TYPES:
        for index, item in enumerate(value):
            _check_value(item, f"{where}[{index}]")
        return
    raise CheckpointError(
        f"`{where}` must be a tensor, a number, a string or a dict/list/tuple of those, "
        f"but is a {type(value).__module__}.{type(value).__qualname__} instead."
    )


def write_torch_file(fs: AbstractFileSystem, path: str, state: Mapping[str, Any]) -> FileRecord:
    """Save ``state`` to ``path`` and return the record of the bytes written.

    A failed write (a full disk) raises its own ``OSError``: torch's writer replaces it with a
    ``RuntimeError`` about zip positions that says nothing of the disk.
    """
    writer: _HashingWriter | None = None
    try:
        with fs.open(path, "wb") as file, _zip_crc32_disabled(), _HashingWriter(file) as writer:
            torch.save(state, writer)  # type: ignore[arg-type]  # Any object with write() will do.
            sha256 = writer.finish()
    except RuntimeError:
        if writer is not None and writer.write_error is not None:
            raise writer.write_error from None
        raise
    return FileRecord(size=writer.size, sha256=sha256)


class _Crc32Switch:
    """Counts the writers inside :func:`_zip_crc32_disabled` where torch keeps one option for the
    whole process (torch 2.11 does; 2.13 keeps one per thread): the first writer in turns it off,
    the last one out restores it. Each writer saving and restoring it itself, one could restore
    "off", read while another had it off, and leave it so for the process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writers = 0
        self.previous = True


_CRC32_SWITCH = _Crc32Switch()


@functools.cache
def _crc32_option_is_per_thread() -> bool:
    """Whether an option set on one thread leaves the others' as it was (asked once: a thread of
    its own flips the option, the caller looks, the thread flips it back)."""
    flipped, looked = threading.Event(), threading.Event()

    def flip_and_restore() -> None:
        before = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(not before)
        flipped.set()
        looked.wait()
        torch.serialization.set_crc32_options(before)

    before = torch.serialization.get_crc32_options()
    thread = threading.Thread(target=flip_and_restore, name="crc32-probe")
    thread.start()
    flipped.wait()
    per_thread = torch.serialization.get_crc32_options() == before
    looked.set()
    thread.join()
    return per_thread


@contextmanager
def _zip_crc32_disabled() -> Iterator[None]:
    """Skip the CRC-32 that ``torch.save`` computes for each zip record.

    The SHA-256 of the whole file already vouches for every byte, and the CRC-32 costs about
    as much CPU as the rest of ``torch.save``. ``torch.load`` reads files without it; only
    external zip tools warn. Where the option is process-wide, a ``torch.save`` that another
    thread runs meanwhile also skips it.
    """
    if _crc32_option_is_per_thread():
        previous = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)
        try:
            yield
        finally:
            torch.serialization.set_crc32_options(previous)
        return
    switch = _CRC32_SWITCH
    with switch.lock:
        if switch.writers == 0:
            switch.previous = torch.serialization.get_crc32_options()
            torch.serialization.set_crc32_options(False)
        switch.writers += 1
    try:
        yield
    finally:
        with switch.lock:
            switch.writers -= 1
            if switch.writers == 0:
                torch.serialization.set_crc32_options(switch.previous)


def read_torch_file(fs: AbstractFileSystem, path: str, expected: FileRecord) -> dict[str, Any]:
    """Load ``path`` to CPU if it matches ``expected``; refuse altered or unsafe files.

    A helper thread streams the file through SHA-256 while ``torch.load`` parses it: the
    weights-only load cannot run code, so parsing an altered file is harmless, and its result
    is thrown away unless the checksum matches. Streaming twice from the page cache is cheaper
    than holding a second copy of the file in memory.
    """
    if not fs.exists(path):
        raise CorruptCheckpointError(f"`{path}` must exist as the metadata lists it, but is missing.")
    size = fs.size(path)
    if size != expected.size:
        raise CorruptCheckpointError(
            f"`{path}` must be {expected.size} bytes as the metadata records, but is {size} instead."
        )
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-hash") as hasher_thread:
        digest = hasher_thread.submit(_sha256_of_file, fs, path, size)
        try:
            with fs.open(path, "rb") as file:
                state = torch.load(file, map_location="cpu", weights_only=True)
            load_error: Exception | None = None
        except Exception as ex:
            load_error = ex
        if digest.result() != expected.sha256:
            raise CorruptCheckpointError(
                f"`{path}` does not match the SHA-256 recorded in the metadata; it is corrupted."
            ) from load_error
    if isinstance(load_error, pickle.UnpicklingError):
        # torch's message goes on to suggest `weights_only=False`, which is what must never happen
        # to a checkpoint of unknown origin; name the offending object and stop there.
        offending = re.search(r"Unsupported global: GLOBAL (\S+)|Unsupported operand \S+", str(load_error))
        reason = offending.group(0) if offending else "it holds objects other than tensors and plain values"
        raise UnsafeCheckpointError(
            f"`{path}` holds objects that a weights-only load refuses ({reason}), so it was not loaded."
        ) from load_error
    if load_error is not None:
        raise load_error
    if not isinstance(state, dict):
        raise CorruptCheckpointError(f"`{path}` must hold a dict, but holds a {type(state).__name__}.")
    return state


def _sha256_of_file(fs: AbstractFileSystem, path: str, size: int) -> str:
    """Hash by ranged reads: unlike a second open file, they share no position with the loader's
    (``memory://`` hands every reader the same file object)."""
    sha256 = hashlib.sha256()
    for start in range(0, size, _HASH_CHUNK_BYTES):
        sha256.update(fs.cat_file(path, start=start, end=min(start + _HASH_CHUNK_BYTES, size)))
    return sha256.hexdigest()


TensorCopy = tuple[torch.Tensor, torch.Tensor]
"""A copy still to be made: (destination on CPU, source)."""


def stage_to_cpu(
    value: Any, previous: Any = None, defer: Callable[[torch.Tensor], bool] | None = None
) -> tuple[Any, list[TensorCopy]]:
    """A deep copy of ``value`` on CPU that a background thread can write while training goes on.

    Training changes the live tensors in place, so the copy must own its memory. Tensors of
    ``previous`` (the copy of the last save, no longer in use) are reused when they have the
    same shape, dtype and strides: copying into memory already mapped is several times faster
    than into fresh memory. Tensors for which ``defer`` holds are not copied yet: their
    destinations are in place in the result, and the returned list holds the copies to make
    (``copy_tensors``) before the source changes. That lets a background thread copy the bulk
    of a model while the training loop runs its next forward and backward pass.
    """
    deferred: list[TensorCopy] = []
    return _copy_to_cpu(value, previous, defer or _never, deferred), deferred


def copy_tensors(copies: Iterable[TensorCopy]) -> None:
    for destination, source in copies:
        destination.copy_(source)


def _never(tensor: torch.Tensor) -> bool:
    return False


def _copy_to_cpu(value: Any, previous: Any, defer: Callable[[torch.Tensor], bool], deferred: list[TensorCopy]) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if (
            isinstance(previous, torch.Tensor)
            and value.layout == torch.strided
            and (previous.shape, previous.dtype) == (value.shape, value.dtype)
            and previous.stride() == value.stride()
        ):
            destination = previous
        elif value.layout == torch.strided:
            destination = torch.empty_like(value, device="cpu")
        else:
            return value.to("cpu", copy=True)  # Sparse or other layouts: copied now, never reused.
        if defer(value):
            deferred.append((destination, value))
            return destination
        return destination.copy_(value)
    if isinstance(value, dict):
        previous_by_key = previous if isinstance(previous, dict) else {}
        return type(value)(
            (key, _copy_to_cpu(item, previous_by_key.get(key), defer, deferred)) for key, item in value.items()
        )
    if isinstance(value, list | tuple):
        same_length = isinstance(previous, list | tuple) and len(previous) == len(value)
        previous_items = previous if same_length else [None] * len(value)
        return type(value)(_copy_to_cpu(item, earlier, defer, deferred) for item, earlier in zip(value, previous_items))
    return value  # Immutable leaves: numbers, strings, dtypes, devices, sizes.


def num_bytes(value: Any) -> int:
    """The bytes of the tensors in a state (nested mappings, lists and tuples): what writing it takes longest on."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, Mapping):
        return sum(num_bytes(item) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(num_bytes(item) for item in value)
    return 0
