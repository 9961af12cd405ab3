"""The disk tier: whole KV blocks in files, one per block, found again after a restart.

- **Key.** A block is stored under the same chained hash as the prefix cache; its
  file also holds the parent hash and the block's token ids, compared on every read
  (a 64-bit collision can never serve another prefix's K/V).
- **Format.** ``<hash:016x>.kv`` = header (magic, hash, parent, fingerprint, token
  count, payload length, xxh64 checksum of tokens + payload), the token ids, the payload
  (the raw bytes of ``pool[b]``, whatever its trailing shape). A file that is truncated,
  does not match its header or fails the checksum is deleted and reported as a miss:
  the block is recomputed, never served.
- **Privacy.** The directory is 0700 and every file 0600 (they hold token ids in the
  clear); a directory another user owns or may write to is refused (``chatsite_kernels.private_paths``).
- **Writes** happen on one background thread fed by a bounded queue. The engine
  thread never waits on it: a full queue drops the write (counted) unless the write is
  *forced* (a retained or swapped-out block leaving the pool: there is no other copy),
  which bypasses the bound. Files are written to a temporary name and renamed, so a
  crash leaves no half block under a real name.
- **Reads** run on their own thread, so a read never queues behind writes; the
  caller gets a future and polls it (the request is "loading KV" meanwhile).
- **Size bound and LRU.** The index (hash → entry, oldest first) lives in memory and is
  rebuilt from the files at start. Past ``capacity_bytes`` the least recently used
  entries go, unretained ones before retained ones.
- **Namespaces.** A salted block's file lives in a directory named for its salt
  namespace (``<namespace:016x>/<hash:016x>.kv``; unsalted blocks at the top), so a
  lookup serves a block only for its own namespace, and ``purge_namespace`` deletes a
  namespace's files, also ones from an earlier run, and cancels its queued writes.
- **Warm restart.** ``FINGERPRINT.json`` records what the K/V depend on (the served
  weights, the tokenizer, the KV layout, dtype, block size; ``inference.kv.fingerprint``).
  A new process with another fingerprint empties the tier (one log line) instead of
  reading blocks it cannot interpret. Its digest is also in every block file's header and
  compared on every read, so a process of another model sharing the directory (writing
  blocks under the same hashes) is never served: such a file is a miss, and removed.
- **Failure.** An unwritable directory, a size of 0 or a full disk turn the tier off
  with one warning; the engine then behaves as with one tier.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import logging
import os
import queue
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import xxhash

from chatsite_kernels.private_paths import ensure_private_dir, open_private_file
from inference.kv.disk_files import (
    SUFFIX,
    block_files,
    block_path,
    namespace_dir,
    namespace_of_dir,
    remove_namespace_files,
)
from inference.kv.identity import is_block

logger = logging.getLogger(__name__)

MAGIC = b"KVBLK002"
# magic, hash, parent, fingerprint digest, num_tokens, payload_len, checksum
_HEADER = struct.Struct("<8sQQ16sIQQ")
FORMAT = 3  # 3: salted blocks in a directory per namespace
FINGERPRINT_FILE = "FINGERPRINT.json"
DEFAULT_QUEUE_BLOCKS = 64


@dataclass(slots=True)
class DiskEntry:
    parent: int
    tokens: tuple[int, ...]
    size: int  # bytes on disk
    namespace: int = 0  # the block's salt namespace (its directory)


@dataclass(slots=True)
class _Write:
    block_hash: int
    parent: int
    tokens: tuple[int, ...]
    data: torch.Tensor  # a private CPU copy of pool[b]
    namespace: int = 0
    ticket: int = 0  # queue order, against purges of its namespace


def _checksum(tokens_bytes: bytes, payload: memoryview | bytes) -> int:
    h = xxhash.xxh64(tokens_bytes)
    h.update(payload)
    return h.intdigest()


class DiskTier:
    name = "disk"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        capacity_bytes: int,
        block_shape: tuple[int, ...],
        dtype: torch.dtype,
        fingerprint: dict,
        *,
        is_retained: Callable[[int], bool] = lambda h: False,
        queue_blocks: int = DEFAULT_QUEUE_BLOCKS,
    ) -> None:
        self.dir = Path(directory)
        self.capacity_bytes = int(capacity_bytes)
        self.block_shape = tuple(block_shape)
        self.dtype = dtype
        self.block_bytes = int(np.prod(block_shape)) * torch.empty((), dtype=dtype).element_size()
        self.is_retained = is_retained
        self.enabled = False
        self._lock = threading.RLock()  # the index is shared by the engine and I/O threads
        self._index: OrderedDict[int, DiskEntry] = OrderedDict()  # least recently used first
        self.used_bytes = 0
        # Counters (read by stats; written under the lock or by one thread).
        self.bytes_written = self.bytes_read = 0
        self.writes_dropped = self.corrupt_blocks = self.evicted_blocks = 0
        self.foreign_blocks = 0  # files of another fingerprint, never served
        self.fingerprint = b""  # the digest in every block file's header (set by _open)
        self.write_s = self.read_s = 0.0  # time spent, for the measured bandwidths
        self._queue: queue.Queue[_Write | None] = queue.Queue(maxsize=queue_blocks)
        self._forced: list[_Write] = []  # unbounded: writes that must not be dropped
        self._pending: set[int] = set()  # hashes queued but not yet on disk
        self._tickets = itertools.count(1)
        self._purged_before: dict[int, int] = {}  # namespace -> first ticket after its last purge
        self._writer: threading.Thread | None = None
        self._stopping = False
        self._reader: ThreadPoolExecutor | None = None
        if self.capacity_bytes < self.block_bytes:
            logger.warning(
                "KV disk tier off: %s holds no block of %d bytes; serving from the pool alone",
                f"kv_disk_gb={capacity_bytes / 2**30:g}",
                self.block_bytes,
            )
            return
        try:
            self._open(fingerprint)
        except OSError as exc:
            logger.warning(
                "KV disk tier off: %s is not usable (%s); serving from the pool alone", self.dir, exc
            )
            return
        self.enabled = True
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
        self._writer.start()
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-disk-reader")

    # ---- start: fingerprint and index ----------------------------------------------------
    def _open(self, fingerprint: dict) -> None:
        ensure_private_dir(self.dir)
        fp_path = self.dir / FINGERPRINT_FILE
        wanted = {
            **fingerprint,
            "block_shape": list(self.block_shape),
            "dtype": str(self.dtype),
            "format": FORMAT,
        }
        text = json.dumps(wanted, sort_keys=True)
        self.fingerprint = hashlib.sha256(text.encode()).digest()[:16]
        try:
            found = json.loads(fp_path.read_text())
        except (OSError, ValueError):
            found = None
        if found != wanted:
            removed = self._remove_all_blocks()
            if found is not None or removed:
                logger.warning(
                    "KV disk tier %s: fingerprint changed (model, dtype, block size or layout); "
                    "emptied %d blocks",
                    self.dir,
                    removed,
                )
            tmp = fp_path.with_suffix(".tmp")
            with os.fdopen(open_private_file(tmp), "w") as f:
                f.write(text)
            os.replace(tmp, fp_path)
            return
        self._scan()

    def _remove_all_blocks(self) -> int:
        removed = 0
        for path in self.dir.iterdir():
            if namespace_of_dir(path) is not None:
                removed += remove_namespace_files(path)
            elif path.suffix in (SUFFIX, ".tmp") and path.name != FINGERPRINT_FILE:
                path.unlink(missing_ok=True)
                removed += path.suffix == SUFFIX
        return removed

    def _path(self, block_hash: int, namespace: int = 0) -> Path:
        return block_path(self.dir, block_hash, namespace)

    def _scan(self) -> None:
        """Rebuild the index from the files' headers, oldest modification first (LRU)."""
        found = []
        for namespace, path in list(block_files(self.dir)):
            try:
                with open(path, "rb") as f:
                    head = f.read(_HEADER.size)
                    magic, block_hash, parent, fingerprint, n, payload_len, _ = _HEADER.unpack(head)
                    tokens = tuple(np.frombuffer(f.read(8 * n), dtype=np.int64).tolist())
                stat = path.stat()
            except (OSError, struct.error, ValueError):
                path.unlink(missing_ok=True)
                continue
            if magic != MAGIC or path.stem != f"{block_hash:016x}" or len(tokens) != n:
                path.unlink(missing_ok=True)
                continue
            if fingerprint != self.fingerprint:  # written by a process of another model
                self.foreign_blocks += 1
                path.unlink(missing_ok=True)
                continue
            # A truncated payload is caught by the read's length check and checksum.
            entry = DiskEntry(parent, tokens, stat.st_size, namespace)
            found.append((stat.st_mtime, block_hash, entry))
        found.sort(key=lambda item: item[0])
        for _, block_hash, entry in found:
            self._index[block_hash] = entry
            self.used_bytes += entry.size
        self._evict_over_capacity()
        if found:
            logger.info("KV disk tier %s: %d blocks from an earlier run", self.dir, len(self._index))

    # ---- lookups -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._index)

    def contains(self, block_hash: int) -> bool:
        return block_hash in self._index or block_hash in self._pending

    def lookup(self, block_hash: int, parent: int, tokens: tuple[int, ...], namespace: int = 0) -> bool:
        """Is this exact block (hash, parent, tokens and namespace all equal) on disk?"""
        if not self.enabled:
            return False
        with self._lock:
            return is_block(self._index.get(block_hash), parent, tokens, namespace)

    # ---- purge ---------------------------------------------------------------------------
    def purge_namespace(self, namespace: int) -> int:
        """Delete every block of ``namespace`` (never the unsalted 0): its index entries,
        its files (also ones no index lists), and its writes still queued, which the writer
        then skips. Returns the indexed blocks dropped."""
        if not namespace:
            return 0
        with self._lock:
            self._purged_before[namespace] = next(self._tickets)
            victims = [h for h, e in self._index.items() if e.namespace == namespace]
            for block_hash in victims:
                self.used_bytes -= self._index.pop(block_hash).size
            dropped = [job for job in self._forced if self._purged(job)]
            self._forced = [job for job in self._forced if not self._purged(job)]
        for job in dropped:  # the writer never sees these: they are no longer pending
            self._pending.discard(job.block_hash)
        folder = namespace_dir(self.dir, namespace)
        if folder.is_dir():
            remove_namespace_files(folder)
        return len(victims)

    def _purged(self, job: _Write) -> bool:
        """Was ``job`` queued before a purge of its namespace? (caller holds the lock)"""
        return job.ticket < self._purged_before.get(job.namespace, 0)

    # ---- writes (engine thread enqueues, the writer thread writes) -----------------------
    def write(
        self,
        block_hash: int,
        parent: int,
        tokens: tuple[int, ...],
        block: torch.Tensor,
        *,
        force: bool = False,
        namespace: int = 0,
    ) -> bool:
        """Queue ``block`` (``pool[b]``) for writing; never blocks. Returns False when the
        write was dropped (queue full) or is unnecessary (already there or queued)."""
        if not self.enabled or self.contains(block_hash):
            return False
        if not force and self._queue.full():
            self.writes_dropped += 1
            return False
        data = block.detach().to("cpu", copy=True)
        job = _Write(block_hash, parent, tokens, data, namespace, next(self._tickets))
        self._pending.add(block_hash)
        if force:
            with self._lock:
                self._forced.append(job)
            try:
                self._queue.put_nowait(None)  # a wake-up; the forced list is drained first
            except queue.Full:
                pass  # the writer is busy with a full queue and will see the forced list
        else:
            self._queue.put_nowait(job)
        return True

    def _next_job(self) -> _Write | None:
        with self._lock:
            if self._forced:
                return self._forced.pop(0)
        job = self._queue.get()
        if job is None:
            with self._lock:
                return self._forced.pop(0) if self._forced else None
        return job

    def _write_loop(self) -> None:
        while True:
            job = self._next_job()
            if job is None:
                if self._stopping:
                    return
                continue
            try:
                self._write_file(job)
            except OSError as exc:
                with self._lock:
                    purged = self._purged(job)  # its directory went while it was written
                if not purged:
                    self._disable_on_write_error(exc)
            finally:
                self._pending.discard(job.block_hash)

    def _write_file(self, job: _Write) -> None:
        if not self.enabled:
            return
        started = time.perf_counter()
        tokens_bytes = np.asarray(job.tokens, dtype=np.int64).tobytes()
        payload = job.data.contiguous().view(torch.uint8).numpy()
        header = _HEADER.pack(
            MAGIC,
            job.block_hash,
            job.parent,
            self.fingerprint,
            len(job.tokens),
            payload.nbytes,
            _checksum(tokens_bytes, payload),
        )
        path = self._path(job.block_hash, job.namespace)
        tmp = path.with_suffix(".tmp")
        with self._lock:
            if self._purged(job):
                return
        if job.namespace:
            ensure_private_dir(path.parent)
        with os.fdopen(open_private_file(tmp), "wb") as f:
            f.write(header)
            f.write(tokens_bytes)
            f.write(payload)
        os.replace(tmp, path)
        size = len(header) + len(tokens_bytes) + payload.nbytes
        with self._lock:
            if self._purged(job):  # purged while it was written: never indexed, never served
                path.unlink(missing_ok=True)
                return
            old = self._index.pop(job.block_hash, None)
            self.used_bytes -= old.size if old else 0
            self._index[job.block_hash] = DiskEntry(job.parent, job.tokens, size, job.namespace)
            self.used_bytes += size
            self.bytes_written += size
            self.write_s += time.perf_counter() - started
            self._evict_over_capacity()

    def _disable_on_write_error(self, exc: OSError) -> None:
        if not self.enabled:
            return
        self.enabled = False
        reason = "the disk is full" if exc.errno == errno.ENOSPC else str(exc)
        logger.warning(
            "KV disk tier off: writing to %s failed (%s); serving from the pool alone", self.dir, reason
        )

    def _evict_over_capacity(self) -> None:
        """Drop least recently used entries past the size bound, unretained ones first
        (caller holds the lock)."""
        while self.used_bytes > self.capacity_bytes and self._index:
            victim = next((h for h in self._index if not self.is_retained(h)), None)
            if victim is None:
                victim = next(iter(self._index))
            entry = self._index.pop(victim)
            self.used_bytes -= entry.size
            self.evicted_blocks += 1
            self._path(victim, entry.namespace).unlink(missing_ok=True)

    # ---- reads ---------------------------------------------------------------------------
    def read_async(
        self, block_hash: int, parent: int, tokens: tuple[int, ...], namespace: int = 0
    ) -> Future[torch.Tensor | None]:
        """The block's data as a CPU tensor of ``block_shape``, or None (missing, corrupt)."""
        assert self._reader is not None
        with self._lock:
            if block_hash in self._index:
                self._index.move_to_end(block_hash)  # recently used
        return self._reader.submit(self.read, block_hash, parent, tokens, namespace)

    def read(
        self, block_hash: int, parent: int, tokens: tuple[int, ...], namespace: int = 0
    ) -> torch.Tensor | None:
        """Only the namespace's own directory is read, so no other namespace's file is served."""
        started = time.perf_counter()
        path = self._path(block_hash, namespace)
        try:
            raw = path.read_bytes()
        except OSError:
            self._forget(block_hash, corrupt=False, namespace=namespace)
            return None
        tokens_bytes = np.asarray(tokens, dtype=np.int64).tobytes()
        start = _HEADER.size + len(tokens_bytes)
        try:
            magic, h, p, fingerprint, n, payload_len, checksum = _HEADER.unpack_from(raw)
        except struct.error:
            h = fingerprint = None
        if h == block_hash and magic == MAGIC and fingerprint != self.fingerprint:
            # Another model's K/V under the same hash (a process sharing the directory):
            # a miss, and the file goes, so the next write puts this model's block there.
            logger.info("KV disk tier: block file %s holds another model's K/V; recomputing it", path.name)
            with self._lock:
                self.foreign_blocks += 1
            self._forget(block_hash, corrupt=False, namespace=namespace)
            return None
        ok = (
            h == block_hash
            and magic == MAGIC
            and p == parent
            and n == len(tokens)
            and payload_len == self.block_bytes
            and len(raw) == start + payload_len
            and raw[_HEADER.size : start] == tokens_bytes
            and _checksum(tokens_bytes, memoryview(raw)[start:]) == checksum
        )
        if not ok:
            logger.warning("KV disk tier: block file %s is corrupt or truncated; recomputing it", path.name)
            self._forget(block_hash, corrupt=True, namespace=namespace)
            return None
        data = torch.frombuffer(bytearray(memoryview(raw)[start:]), dtype=torch.uint8)
        with self._lock:
            self.bytes_read += len(raw)
            self.read_s += time.perf_counter() - started
        return data.view(self.dtype).view(self.block_shape)

    def _forget(self, block_hash: int, *, corrupt: bool, namespace: int = 0) -> None:
        with self._lock:
            entry = self._index.get(block_hash)
            if entry is not None and entry.namespace == namespace:
                del self._index[block_hash]
                self.used_bytes -= entry.size
            self.corrupt_blocks += corrupt
        self._path(block_hash, namespace).unlink(missing_ok=True)

    # ---- life cycle ----------------------------------------------------------------------
    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued write is on disk (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while (self._pending or not self._queue.empty()) and time.monotonic() < deadline:
            time.sleep(0.005)

    def close(self) -> None:
        if self._writer is not None:
            self.flush()
            self._stopping = True
            try:
                self._queue.put(None, timeout=1.0)
            except queue.Full:
                pass
            self._writer.join(timeout=5.0)
            self._writer = None
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None

    def stats(self) -> dict[str, float]:
        return {
            "blocks": len(self._index),
            "capacity_blocks": self.capacity_bytes // max(1, self.block_bytes) if self.enabled else 0,
            "bytes_used": self.used_bytes,
            "bytes_written": self.bytes_written,
            "bytes_read": self.bytes_read,
            "writes_dropped": self.writes_dropped,
            "corrupt_blocks": self.corrupt_blocks,
            "evicted_blocks": self.evicted_blocks,
            "foreign_blocks": self.foreign_blocks,
        }
