"""CUDA graphs for decode-only steps: captured once per batch size, replayed every step.

A decode step of a small model is launch-bound on a GPU: SmolLM2-135M's 30 layers
are several hundred kernels of a few microseconds of work each, so the Python and
driver overhead of launching them, not the GPU, sets the step time. A CUDA graph
records the launches of one forward pass and replays them all with one call.

A graph replays fixed kernels on fixed addresses with fixed launch shapes, so (as in
vLLM and nano-vllm):

- Inputs live in static buffers sized for the largest captured batch. A step copies
  its tensors into their first rows and replays the graph of the smallest captured
  batch size that holds it.
- Rows past the step's batch are padding and must do no harm: slot -1 (``store_kv``
  writes nothing) and context length 0 (the decode kernel reads no key and writes a
  zero row). Their outputs are computed and thrown away.
- Block tables are as wide as the longest sequence can need
  (``cdiv(max_model_len, block_size)``). The decode launcher sizes its split-K from
  that width (a shape, the same at every replay) because it is called without
  ``max_context_len``; nothing read from a step's values is baked into the graph.
  The context's host ints are constant for decode graphs too: ``max_query_len`` is 1
  and ``max_context_len`` is the table's full span, a valid bound for every replay.

Only the model's forward is captured. ``compute_logits`` stays eager on the rows
that are sampled: it is one GEMM (one launch), and capturing it would keep a
``[batch, vocab]`` fp32 buffer per graph alive in the graph pool.

Invariants the graphs rely on: the KV pool tensor and the weights are never
replaced after capture (copy-on-write and the engine write into the pool in place),
and the forward on CUDA makes no host sync (the Triton attention path, plain
PyTorch elsewhere: embedding, linear, RMSNorm, rotary by indexing the cos/sin cache).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from inference.layers.attention_context import AttentionContext
from inference.models.contract import CausalLM
from inference.runner.packed_batch import PackedBatch

# Captured batch sizes: 1, 2, 4, 8, then every multiple of 8 (vLLM's and nano-vllm's
# scheme: a batch pads by at most 7 rows), up to this bound. Larger decode batches run
# eagerly; by then the launches are amortised over enough work.
MAX_GRAPH_BATCH = 512
_SMALL_SIZES = (1, 2, 4, 8)
_SIZE_STEP = 8


def graph_batch_sizes(max_batch: int, limit: int = MAX_GRAPH_BATCH) -> list[int]:
    """Ascending batch sizes to capture for decode batches of up to ``max_batch``
    sequences: ``[1, 2, 4, 8, 16, 24, ...]``, plus ``min(max_batch, limit)`` itself
    so that the largest batch the scheduler can form has a graph too."""
    top = min(max_batch, limit)
    if top < 1:
        return []
    sizes = [s for s in _SMALL_SIZES if s <= top]
    sizes += range(2 * _SIZE_STEP, top + 1, _SIZE_STEP)
    if sizes[-1] != top:
        sizes.append(top)
    return sizes


def pick_graph_size(sizes: Sequence[int], batch: int) -> int | None:
    """The smallest of ``sizes`` (ascending) that holds ``batch`` rows; None if none does."""
    if batch < 1:
        return None
    i = bisect_left(sizes, batch)
    return sizes[i] if i < len(sizes) else None


@dataclass
class StaticDecodeInputs:
    """The buffers every decode graph reads: a graph of batch size ``s`` reads the first
    ``s`` rows. Allocated once; their addresses are what the graphs remember. A model
    with several KV groups (sliding windows) has a slot mapping and block table per
    group after the first (``AttentionContext.group_contexts``)."""

    input_ids: torch.Tensor  # [S] int64
    positions: torch.Tensor  # [S] int64
    slot_mapping: torch.Tensor  # [S] int64, -1 on padding rows
    context_lens: torch.Tensor  # [S] int32, 0 on padding rows
    block_tables: torch.Tensor  # [S, W] int32
    query_start_loc: torch.Tensor  # [S + 1] int32: 0, 1, 2, ... (one token per sequence), constant
    group_slot_mappings: list[torch.Tensor] = dataclasses.field(default_factory=list)  # KV groups 1..
    group_block_tables: list[torch.Tensor] = dataclasses.field(default_factory=list)

    @classmethod
    def allocate(
        cls, max_batch: int, max_blocks: int, device: torch.device | str, num_groups: int = 1
    ) -> StaticDecodeInputs:
        def slots() -> torch.Tensor:
            return torch.full((max_batch,), -1, dtype=torch.int64, device=device)

        def tables() -> torch.Tensor:
            return torch.zeros(max_batch, max_blocks, dtype=torch.int32, device=device)

        return cls(
            input_ids=torch.zeros(max_batch, dtype=torch.int64, device=device),
            positions=torch.zeros(max_batch, dtype=torch.int64, device=device),
            slot_mapping=slots(),
            context_lens=torch.zeros(max_batch, dtype=torch.int32, device=device),
            block_tables=tables(),
            query_start_loc=torch.arange(max_batch + 1, dtype=torch.int32, device=device),
            group_slot_mappings=[slots() for _ in range(num_groups - 1)],
            group_block_tables=[tables() for _ in range(num_groups - 1)],
        )

    @property
    def max_batch(self) -> int:
        return self.input_ids.shape[0]

    @property
    def max_blocks(self) -> int:
        return self.block_tables.shape[1]

    def context(self, size: int, block_size: int) -> AttentionContext:
        """The attention context of a graph of batch ``size``: views of the first rows,
        so every replay sees what ``load`` last wrote there."""

        def group(slots: torch.Tensor, tables: torch.Tensor) -> AttentionContext:
            return AttentionContext(
                slot_mapping=slots[:size],
                query_start_loc=self.query_start_loc[: size + 1],
                context_lens=self.context_lens[:size],
                block_tables=tables[:size],
                max_query_len=1,
                # Unused by the CUDA attention path; if a launcher ever reads it, the full
                # table span bounds every replay's lengths.
                max_context_len=self.max_blocks * block_size,
            )

        ctx = group(self.slot_mapping, self.block_tables)
        ctx.group_contexts = [
            group(slots, tables)
            for slots, tables in zip(self.group_slot_mappings, self.group_block_tables, strict=True)
        ]
        return ctx

    def fits(self, packed: PackedBatch) -> bool:
        """Whether a step can replay a graph: decode-only, at most ``max_batch``
        sequences, block tables (of every KV group) no wider than the buffer."""
        ctx = packed.ctx
        batch = packed.input_ids.shape[0]
        return (
            ctx.is_decode_only
            and 1 <= batch <= self.max_batch
            and ctx.context_lens.shape[0] == batch
            and ctx.block_tables.shape[1] <= self.max_blocks
            and len(ctx.group_contexts) == len(self.group_block_tables)
            and all(g.block_tables.shape[1] <= self.max_blocks for g in ctx.group_contexts)
        )

    def load(self, packed: PackedBatch, size: int) -> None:
        """Copy a decode-only step's ``batch`` rows into the first rows of the buffers
        and make rows ``batch .. size-1`` padding (device-side copies, no host sync).

        Padding must be rewritten every step: rows left over from an earlier, larger
        batch hold real slots, and replaying them would overwrite live sequences' K/V.
        Their ids, positions and block tables may stay stale: they are valid values,
        and a row of length 0 reads no block. Likewise the columns of a real row past
        this step's table width are never read (its length fits inside the width)."""
        ctx = packed.ctx
        batch = packed.input_ids.shape[0]
        self.input_ids[:batch].copy_(packed.input_ids)
        self.positions[:batch].copy_(packed.positions)
        self.context_lens[:batch].copy_(ctx.context_lens)
        self.context_lens[batch:size].fill_(0)
        groups = [ctx, *ctx.group_contexts]
        all_slots = [self.slot_mapping, *self.group_slot_mappings]
        all_tables = [self.block_tables, *self.group_block_tables]
        for group, slots, tables in zip(groups, all_slots, all_tables, strict=True):
            slots[:batch].copy_(group.slot_mapping)
            slots[batch:size].fill_(-1)
            tables[:batch, : group.block_tables.shape[1]].copy_(group.block_tables)

    def clear(self) -> None:
        """Every row padding (capture time: the warm-up and captured passes then neither
        write the KV pool nor read it)."""
        for slots in (self.slot_mapping, *self.group_slot_mappings):
            slots.fill_(-1)
        self.context_lens.fill_(0)


class CUDAGraphRunner:
    """Decode-only forward passes of ``model`` over ``kv_cache``, one graph per batch size.

    ``capture()`` records them (CUDA only). ``run(packed)`` loads a step into the static
    inputs, replays the graph of the smallest size that holds it and returns the
    step's hidden states ``[batch, hidden]`` (a view of a static buffer: valid until
    the next ``run``). ``can_run(packed)`` says whether a step qualifies; the caller
    runs the others eagerly.
    """

    def __init__(
        self,
        model: CausalLM,
        kv_cache: torch.Tensor,
        block_size: int,
        max_batch: int,
        max_blocks: int,
        num_groups: int = 1,
    ) -> None:
        """``num_groups``: the KV pool's groups (``KVSpec.num_groups``)."""
        self.model = model
        self.kv_cache = kv_cache
        self.sizes = graph_batch_sizes(max_batch)
        if not self.sizes:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        device = kv_cache.device
        self.inputs = StaticDecodeInputs.allocate(self.sizes[-1], max_blocks, device, num_groups)
        param = next(model.parameters())
        self.output = torch.zeros(self.sizes[-1], model.config.hidden_size, dtype=param.dtype, device=device)
        self._contexts = {s: self.inputs.context(s, block_size) for s in self.sizes}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._replay: dict[int, Callable[[], None]] = {}
        self.num_replays = 0
        self.capture_s = 0.0  # how long capture() took

    def _forward(self, size: int) -> None:
        """What the graph of batch ``size`` records: the model over the first ``size``
        static rows, its output copied into the static output buffer."""
        inputs = self.inputs
        # A fresh context object over the same static views: per-step caches on it
        # (AttentionContext.store_index) must not outlive a load() of new inputs; the
        # same for every KV group's context.
        ctx = dataclasses.replace(self._contexts[size])
        ctx.group_contexts = [dataclasses.replace(g) for g in ctx.group_contexts]
        hidden = self.model(inputs.input_ids[:size], inputs.positions[:size], ctx, self.kv_cache)
        self.output[:size].copy_(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, into one shared memory pool (the graphs
        never run concurrently, so the smaller ones reuse the largest one's memory).

        Each size is first run once on the capture stream outside the capture: that
        JIT-compiles and loads the Triton kernels for its launch shapes and sets up
        cuBLAS for the stream, none of which may happen while capturing."""
        if self.kv_cache.device.type != "cuda":
            raise RuntimeError("CUDA graphs need the model on a CUDA device")
        started = time.perf_counter()
        self.inputs.clear()
        stream = torch.cuda.Stream(self.kv_cache.device)
        pool = torch.cuda.graph_pool_handle()
        stream.wait_stream(torch.cuda.current_stream())  # the buffers were written on it
        graphs: dict[int, torch.cuda.CUDAGraph] = {}
        for size in reversed(self.sizes):
            with torch.cuda.stream(stream):
                self._forward(size)  # warm-up
            graph = torch.cuda.CUDAGraph()
            # torch.cuda.graph synchronises the device first, so the warm-up is done; the
            # same explicit stream for every capture, as sharing a pool requires.
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self._forward(size)
            graphs[size] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self._graphs = graphs
        self._replay = {size: graph.replay for size, graph in graphs.items()}
        self.capture_s = time.perf_counter() - started

    def use_static_eager(self) -> None:
        """Replay without graphs: run the recorded forward eagerly on the same static,
        padded inputs. Exercises the buffer handling and padding on any device (the
        tests use it on CPU, where there are no graphs)."""
        self._graphs = {}
        self._replay = {size: functools.partial(self._forward, size) for size in self.sizes}

    @property
    def ready(self) -> bool:
        return bool(self._replay)

    def can_run(self, packed: PackedBatch) -> bool:
        return self.ready and self.inputs.fits(packed)

    def run(self, packed: PackedBatch) -> torch.Tensor:
        batch = packed.input_ids.shape[0]
        size = pick_graph_size(self.sizes, batch)
        if size is None or not self.can_run(packed):
            raise ValueError(f"no decode graph for this step ({batch} sequences)")
        self.inputs.load(packed, size)
        self._replay[size]()
        self.num_replays += 1
        return self.output[:batch]
