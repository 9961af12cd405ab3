"""The tiers below the KV pool, as one stack the block manager talks to.

    pool (device) -> host (pinned RAM; CUDA only) -> disk (files; any device)

Every tier holds whole blocks (``pool[b]``, whatever its trailing shape) keyed by the
prefix cache's chained hash, with the parent hash, tokens and salt namespace kept for the
collision check (a block is served only to a lookup naming all four). The block manager
calls in at three moments (and ``purge_namespace`` drops one namespace's blocks from
every tier):

- **A block becomes cached** (full, computed, registered): it is written through to
  disk now. Its K/V never change after this point, so one write is final, and a block
  that stays in the pool until a restart is still found by the next process (a tier
  written only on eviction would lose every block still in the pool at shutdown or
  crash). The write is queued for the disk thread and dropped if the queue is full:
  the step never waits.
- **A cached block is evicted** from the pool: it goes to the host tier (CUDA), whose
  own evictions go to disk. A block whose write-through was dropped and that is
  retained (an open conversation) is written now with ``force`` (bypassing the queue
  bound): retained blocks are never dropped on the way down.
- **A prefix lookup** continues down the hash chain after the pool's last hit; the blocks
  found are copied into fresh pool blocks (``start_load``) before the request's prefill.

Cost model (``worth_loading``, ``prefer_swap``): moving a block costs its bytes over the
tier's measured bandwidth; recomputing costs its tokens times the measured prefill time
per token (an average over recent steps). Loading or swapping happens only when moving
is cheaper. The policy is the stack's own: ``swap_out`` decides and writes for a
preempted sequence, and the block manager offers a prefix for loading only when
``worth_loading`` says so; the scheduler just acts on the answers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from inference.kv.block_stats import BlockStats
from inference.kv.blocks import CachedBlock
from inference.kv.disk import DiskTier
from inference.kv.host import HostTier

logger = logging.getLogger(__name__)

# Bandwidth guesses (bytes/s) until a tier has moved enough to measure its own.
DEFAULT_BANDWIDTH = {"host": 10e9, "disk": 0.5e9}
MIN_MEASURED_BYTES = 8 * 2**20
EWMA = 0.2  # weight of a new step in the prefill-time average


@dataclass
class Load:
    """One block on its way from a lower tier into ``pool[block_id]``."""

    tier: str
    block_id: int
    future: Future[torch.Tensor | None] | None = None  # disk reads; host loads are already issued

    def done(self) -> bool:
        return self.future is None or self.future.done()


@dataclass
class TierCounters:
    hit_tokens: dict[str, int] = field(default_factory=lambda: {"pool": 0, "host": 0, "disk": 0})
    loaded_blocks: int = 0
    failed_loads: int = 0  # a block a lookup promised but the read could not deliver


class TierStack:
    def __init__(
        self,
        pool: torch.Tensor,
        block_size: int,
        *,
        host: HostTier | None = None,
        disk: DiskTier | None = None,
    ) -> None:
        self.pool = pool
        self.block_size = block_size
        self.block_bytes = pool[0].numel() * pool.element_size()
        self.host = host if host is not None and host.enabled else None
        self.disk = disk if disk is not None and disk.enabled else None
        if self.host is not None and self.disk is not None:
            self.host.on_evict = self._host_evicted
        self.counters = TierCounters()
        self.prefill_s_per_token: float | None = None  # measured; None until a prefill ran
        self.closers: list[Callable[[], None]] = []  # companions' I/O (a hybrid model's state tiers)

    @property
    def enabled(self) -> bool:
        return self.host is not None or (self.disk is not None and self.disk.enabled)

    def _disk(self) -> DiskTier | None:
        return self.disk if self.disk is not None and self.disk.enabled else None

    # ---- writes ----------------------------------------------------------------------------
    def block_cached(
        self, block_hash: int, parent: int, tokens: tuple[int, ...], block_id: int, namespace: int = 0
    ) -> None:
        disk = self._disk()
        if disk is not None and not disk.contains(block_hash):
            disk.write(block_hash, parent, tokens, self.pool[block_id], namespace=namespace)

    def block_evicted(
        self,
        block_hash: int,
        parent: int,
        tokens: tuple[int, ...],
        block_id: int,
        namespace: int = 0,
        *,
        retained: bool,
    ) -> None:
        if self.host is not None:
            self.host.store(block_hash, parent, tokens, block_id, namespace)
            return
        disk = self._disk()
        if disk is not None and not disk.contains(block_hash):
            disk.write(block_hash, parent, tokens, self.pool[block_id], force=retained, namespace=namespace)

    def swap_out(self, blocks: list[CachedBlock], num_tokens: int) -> bool:
        """A preempted sequence holding ``blocks`` (its cached blocks, ``num_tokens`` computed):
        swap it (True) or leave it to be recomputed (False), by the cost model. Swapping
        writes down the blocks no tier holds yet, forced (they are about to lose their only
        copy when the pool reuses them); a lookup finds them again at re-admission."""
        if not self.enabled:
            return False
        missing = [b for b in blocks if not self.holds(b)]
        if not self.prefer_swap(len(blocks), len(missing), num_tokens):
            return False
        for block in missing:
            if self.host is not None:
                self.host.store(
                    block.block_hash, block.parent_hash, block.token_ids, block.block_id, block.namespace
                )
            elif (disk := self._disk()) is not None:
                data = self.pool[block.block_id]
                disk.write(
                    block.block_hash,
                    block.parent_hash,
                    block.token_ids,
                    data,
                    force=True,
                    namespace=block.namespace,
                )
        return True

    def _host_evicted(
        self, block_hash: int, parent: int, tokens: tuple[int, ...], data: torch.Tensor, namespace: int
    ) -> None:
        disk = self._disk()
        if disk is not None and not disk.contains(block_hash):
            force = self._is_retained(block_hash)
            disk.write(block_hash, parent, tokens, data, force=force, namespace=namespace)

    def _is_retained(self, block_hash: int) -> bool:
        return self.host.is_retained(block_hash) if self.host is not None else False

    # ---- reads -----------------------------------------------------------------------------
    def find(self, block_hash: int, parent: int, tokens: tuple[int, ...], namespace: int = 0) -> str | None:
        if self.host is not None and self.host.lookup(block_hash, parent, tokens, namespace):
            return "host"
        disk = self._disk()
        if disk is not None and disk.lookup(block_hash, parent, tokens, namespace):
            return "disk"
        return None

    def holds(self, block: CachedBlock) -> bool:
        return self.find(block.block_hash, block.parent_hash, block.token_ids, block.namespace) is not None

    def purge_namespace(self, namespace: int) -> None:
        """Drop ``namespace``'s blocks from the host tier and the disk (files deleted)."""
        if self.host is not None:
            self.host.purge_namespace(namespace)
        if self.disk is not None:
            self.disk.purge_namespace(namespace)

    def start_load(
        self,
        tier: str,
        block_hash: int,
        parent: int,
        tokens: tuple[int, ...],
        block_id: int,
        namespace: int = 0,
    ) -> Load:
        if tier == "host":
            assert self.host is not None
            ok = self.host.load(block_hash, block_id)
            future: Future[torch.Tensor | None] | None = None
            if not ok:  # gone since the lookup (same thread, so only by a bug): a miss
                future = Future()
                future.set_result(None)
            return Load(tier, block_id, future)
        assert self.disk is not None
        return Load(tier, block_id, self.disk.read_async(block_hash, parent, tokens, namespace))

    def finish_load(self, load: Load) -> bool:
        """Copy a finished disk read into its pool block. False = not served (recompute)."""
        if load.future is None:
            return True
        try:
            data = load.future.result()
        except Exception:  # a failed read is a miss, never a failed step
            logger.exception("KV tier read failed; recomputing the block")
            data = None
        if data is None:
            self.counters.failed_loads += 1
            return False
        self.pool[load.block_id].copy_(data)
        return True

    def before_forward(self) -> None:
        if self.host is not None:
            self.host.before_forward()

    # ---- cost model ------------------------------------------------------------------------
    def observe_prefill(self, seconds: float, num_tokens: int) -> None:
        """A step's time over its tokens: the recompute price of one token."""
        if num_tokens < self.block_size:
            return  # decode-only steps say little about prefill speed
        rate = seconds / num_tokens
        prev = self.prefill_s_per_token
        self.prefill_s_per_token = rate if prev is None else (1 - EWMA) * prev + EWMA * rate

    def bandwidth(self, tier: str, reading: bool) -> float:
        disk = self.disk
        if tier == "disk" and disk is not None:
            moved, secs = (disk.bytes_read, disk.read_s) if reading else (disk.bytes_written, disk.write_s)
            if moved >= MIN_MEASURED_BYTES and secs > 0:
                return moved / secs
        return DEFAULT_BANDWIDTH[tier]

    def recompute_seconds(self, num_tokens: int) -> float:
        per_token = self.prefill_s_per_token
        return float("inf") if per_token is None else num_tokens * per_token

    def worth_loading(self, tiers: list[str], num_tokens: int | None = None) -> bool:
        """Is reading these blocks faster than recomputing their ``num_tokens`` tokens (by
        default a block's worth each; fewer when several KV groups hold each block)?"""
        move = sum(self.block_bytes / self.bandwidth(t, reading=True) for t in tiers)
        tokens = len(tiers) * self.block_size if num_tokens is None else num_tokens
        return move < self.recompute_seconds(tokens)

    def prefer_swap(self, num_blocks: int, num_to_write: int, num_tokens: int) -> bool:
        """Swap a preempted request's blocks out and back in, or recompute its tokens?"""
        tier = "host" if self.host is not None else "disk"
        move = num_to_write * self.block_bytes / self.bandwidth(tier, reading=False)
        move += num_blocks * self.block_bytes / self.bandwidth(tier, reading=True)
        return num_blocks > 0 and move < self.recompute_seconds(num_tokens)

    # ---- life cycle and stats --------------------------------------------------------------
    def close(self) -> None:
        for close in self.closers:
            close()
        if self.disk is not None:
            self.disk.close()

    def stats(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        if self.host is not None:
            out["host"] = self.host.stats()
        if self.disk is not None:
            out["disk"] = {**self.disk.stats(), "enabled": int(self.disk.enabled)}
        for tier, tier_stats in out.items():
            tier_stats["hit_tokens"] = self.counters.hit_tokens[tier]
        return out


def build_tiers(
    pool: torch.Tensor,
    block_size: int,
    *,
    fingerprint: dict | None,
    kv_cpu_gb: float,
    kv_disk_dir: str | None,
    kv_disk_gb: float,
    is_retained: Callable[[int], bool],
) -> TierStack | None:
    """The tiers a configuration asks for (None = the pool alone): host memory under a
    CUDA pool, disk under either. ``fingerprint`` (``inference.kv.fingerprint``; needed
    with a disk directory) names what the blocks' contents depend on."""
    host = None
    if pool.device.type == "cuda" and kv_cpu_gb > 0:
        host = HostTier(pool, int(kv_cpu_gb * 2**30), is_retained=is_retained)
    disk = None
    if kv_disk_dir:
        disk = DiskTier(
            kv_disk_dir,
            int(kv_disk_gb * 2**30),
            tuple(pool.shape[1:]),
            pool.dtype,
            fingerprint or {},
            is_retained=is_retained,
        )
    stack = TierStack(pool, block_size, host=host, disk=disk)
    return stack if stack.enabled else None


def tier_stats(blocks: BlockStats, tiers: TierStack | None) -> dict[str, dict[str, float]]:
    """Per tier: blocks held and capacity, prefix-hit tokens, bytes moved (``EngineStats.kv_tiers``)."""
    pool_hits = blocks.hit_tokens if tiers is None else tiers.counters.hit_tokens["pool"]
    out: dict[str, dict[str, float]] = {
        "pool": {
            "blocks": blocks.used + blocks.cached,
            "capacity_blocks": blocks.total,
            "used_blocks": blocks.used,
            "cached_blocks": blocks.cached,
            "free_blocks": blocks.free,
            "hit_tokens": pool_hits,
        }
    }
    if tiers is not None:
        out.update(tiers.stats())
    return out
