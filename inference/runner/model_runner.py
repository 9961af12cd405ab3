"""Runs one scheduled step on the model: pack, forward, logits of the sampled rows.

Every step is one flat, unpadded batch: the new tokens of all scheduled
sequences back to back (decodes contribute one each, prefill chunks many), with
their positions and the pool slot each token's K/V goes to. Attention finds each
sequence's context through its block table (``AttentionContext``). Only the last
position of a sequence that reaches its end this step goes through the LM head
(for SmolLM2's 49k vocabulary the head is a fifth of a token's FLOPs, wasted on
every prompt token but the last).

On CUDA, decode-only steps replay a CUDA graph captured at start for their batch
size (``inference.runner.cuda_graphs``) unless ``enforce_eager``; every other step, and
every step on CPU, runs the model eagerly.
"""

from __future__ import annotations

import array
import logging
from typing import TYPE_CHECKING

import torch

from inference.engine.scheduler import ScheduledBatch
from inference.kv.spec import KVSpec
from inference.layers import bf16_weights
from inference.layers.attention_context import AttentionContext
from inference.layers.cpu_matmul import CpuMatmul
from inference.layers.recurrent_context import RecurrentStates
from inference.model_config import ModelConfig
from inference.models.contract import CausalLM
from inference.runner.cuda_graphs import CUDAGraphRunner
from inference.runner.packed_batch import PackedBatch
from inference.runner.prompt_scores import rows_to_score, score_prompt_rows
from inference.runner.recurrent_rows import recurrent_context

if TYPE_CHECKING:
    from inference.lora import LoraManager

logger = logging.getLogger(__name__)

_TYPECODES = {torch.int64: "q", torch.int32: "i"}


def captures_cuda_graphs(model: CausalLM, device: torch.device, enforce_eager: bool) -> bool:
    """Whether decode steps replay CUDA graphs: on CUDA, unless ``enforce_eager`` or the
    model cannot be captured. Sliding-window models are captured too: each KV group's
    slot mapping and block table has its own static buffer, and the Triton kernels take
    the window, soft-cap and sinks without reading the host."""
    return device.type == "cuda" and not enforce_eager and model.supports_cuda_graphs


class ModelRunner:
    lora: LoraManager | None = None  # the engine's LoRA adapters, when it serves any

    def __init__(
        self,
        model: CausalLM,
        model_config: ModelConfig,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        *,
        max_num_seqs: int = 1,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        recurrent_states: RecurrentStates | None = None,
        cpu_matmul: CpuMatmul | None = None,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        """``max_num_seqs``: the largest decode batch a step can hold (the engine passes
        ``min(max_num_seqs, max_num_batched_tokens)``); ``max_model_len`` bounds a block
        table's width (None = the whole pool). Both size the CUDA graphs' static inputs.
        ``recurrent_states``: a hybrid model's state pool (``inference.kv.state_pool``);
        each step then tells the recurrent layers every sequence's slot. Such a model
        runs eagerly (its recurrent layers read per-step host metadata).
        ``cpu_matmul``: the precision of the CPU's many-row products (fp32 when None).
        ``kv_dtype``: the pool's element type (``inference.kv.kv_dtype``; None = ``dtype``)."""
        self.model = model
        self.cpu_matmul = cpu_matmul or CpuMatmul()
        # Bytes of the bf16 weight copies the policy asked for (``inference.layers.bf16_weights``).
        self.bf16_weight_bytes = 0
        if device.type == "cpu":
            model.prepare_cpu_kernels()
            self.bf16_weight_bytes = bf16_weights.attach(model, self.cpu_matmul)
        self.block_size = block_size
        self.device = device
        # The pool, laid out by the model's KV spec: block-major so that one block of
        # every layer is one contiguous slab (copy-on-write and CPU offload move it as a unit).
        self.kv_spec: KVSpec = model.kv_spec
        self.kv_cache = self.kv_spec.allocate(num_blocks, block_size, kv_dtype or dtype, device)
        self._sliding = self.kv_spec.is_hybrid
        self._pin = device.type == "cuda"
        self.recurrent_states = recurrent_states
        self.cuda_graphs: CUDAGraphRunner | None = None
        if recurrent_states is None and captures_cuda_graphs(model, device, enforce_eager):
            max_len = max_model_len if max_model_len is not None else num_blocks * block_size
            self.cuda_graphs = self._capture_cuda_graphs(max_num_seqs, -(-max_len // block_size))

    def _capture_cuda_graphs(self, max_batch: int, max_blocks: int) -> CUDAGraphRunner | None:
        """Capture the decode graphs once, now that the pool exists. A failure is logged
        and leaves the engine eager (slower, still correct) rather than unusable."""
        try:
            import chatsite_kernels.triton.ops  # noqa: F401, PLC0415 - the only attention path free of host syncs
        except ImportError as exc:
            logger.warning("no CUDA graphs: the Triton kernels cannot be imported (%s)", exc)
            return None
        try:
            graphs = CUDAGraphRunner(
                self.model, self.kv_cache, self.block_size, max_batch, max_blocks, self.kv_spec.num_groups
            )
            graphs.capture()
        except Exception:
            logger.exception("CUDA graph capture failed; decode steps run eagerly (enforce_eager skips it)")
            return None
        logger.info(
            "captured CUDA graphs for decode batch sizes %s (block tables of %d blocks) in %.1fs",
            graphs.sizes,
            max_blocks,
            graphs.capture_s,
        )
        return graphs

    def _tensor(self, data: list[int], dtype: torch.dtype) -> torch.Tensor:
        """Host list -> device tensor; on CUDA through pinned memory without blocking.
        Through ``array``: ``torch.tensor`` reads a list element by element, several times
        slower for the thousands of ids, slots and block-table entries of a large batch."""
        if not data:
            t = torch.empty(0, dtype=dtype)
        else:
            t = torch.frombuffer(array.array(_TYPECODES[dtype], data), dtype=dtype)
        if self._pin:
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def pack(self, batch: ScheduledBatch) -> PackedBatch:
        if max(batch.num_new_tokens) == 1 and not batch.scores_prompt:
            return self._packed(batch, *self._decode_lists(batch))
        return self._packed(batch, *self._general_lists(batch))

    def _decode_lists(self, batch: ScheduledBatch) -> tuple[list[int], ...]:
        """``_general_lists`` for a step of decodes only (one token per sequence), a busy
        server's usual step, in list comprehensions rather than a loop of appends."""
        bs = self.block_size
        seqs = batch.seqs
        positions = [s.num_computed_tokens for s in seqs]
        input_ids = [s.token_ids[p] for s, p in zip(seqs, positions, strict=True)]
        slots = [s.block_table[p // bs] * bs + p % bs for s, p in zip(seqs, positions, strict=True)]
        context_lens = [p + 1 for p in positions]
        sampled = [
            i for i, (s, end) in enumerate(zip(seqs, context_lens, strict=True)) if end == s.num_tokens
        ]
        query_start_loc = list(range(len(seqs) + 1))
        return input_ids, positions, slots, query_start_loc, context_lens, list(sampled), sampled

    def _general_lists(self, batch: ScheduledBatch) -> tuple[list[int], ...]:
        """Token ids, positions, pool slots, query starts, context lengths, the rows whose
        logits are sampled and the indices of their sequences."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start_loc = [0]
        context_lens: list[int] = []
        sample_rows: list[int] = []
        sampled: list[int] = []
        row = 0
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
            start = seq.num_computed_tokens
            end = start + n
            table = seq.block_table
            if n == 1:  # a decode: most rows of a busy batch
                input_ids.append(seq.token_ids[start])
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
            else:
                input_ids.extend(seq.token_ids[start:end])
                positions.extend(range(start, end))
                # Slots block by block: a run of positions inside one block is contiguous.
                pos = start
                while pos < end:
                    block_end = min(end, (pos // bs + 1) * bs)
                    base = table[pos // bs] * bs - (pos // bs) * bs
                    slots.extend(range(base + pos, base + block_end))
                    pos = block_end
            row += n
            query_start_loc.append(row)
            context_lens.append(end)
            if end == seq.num_tokens:
                sample_rows.append(row - 1)
                sampled.append(i)
        return input_ids, positions, slots, query_start_loc, context_lens, sample_rows, sampled

    def _packed(
        self,
        batch: ScheduledBatch,
        input_ids: list[int],
        positions: list[int],
        slots: list[int],
        query_start_loc: list[int],
        context_lens: list[int],
        sample_rows: list[int],
        sampled: list[int],
    ) -> PackedBatch:
        seq_tables = [s.block_table for s in batch.seqs]
        ctx = AttentionContext(
            slot_mapping=self._tensor(slots, torch.int64),
            query_start_loc=self._tensor(query_start_loc, torch.int32),
            context_lens=self._tensor(context_lens, torch.int32),
            block_tables=self._block_tables(seq_tables),
            max_query_len=max(batch.num_new_tokens),
            max_context_len=max(context_lens),
            cpu_bf16=self.cpu_matmul.bf16,
        )
        if self.recurrent_states is not None:
            ctx.recurrent = recurrent_context(batch, query_start_loc, self.recurrent_states, self._tensor)
        for g in range(1, self.kv_spec.num_groups):
            group_tables = [s.group_tables[g - 1] for s in batch.seqs]
            ctx.group_contexts.append(
                AttentionContext(
                    slot_mapping=self._tensor(self._group_slots(batch, group_tables), torch.int64),
                    query_start_loc=ctx.query_start_loc,
                    context_lens=ctx.context_lens,
                    block_tables=self._block_tables(group_tables),
                    max_query_len=ctx.max_query_len,
                    max_context_len=ctx.max_context_len,
                )
            )
        return PackedBatch(
            input_ids=self._tensor(input_ids, torch.int64),
            positions=self._tensor(positions, torch.int64),
            ctx=ctx,
            sample_rows=self._tensor(sample_rows, torch.int64),
            sampled=sampled,
        )

    def _block_tables(self, seq_tables: list[list[int]]) -> torch.Tensor:
        """``[B, width]`` int32, padded with 0; a sliding group's dropped entries
        (``NO_BLOCK``) read as block 0 too (its attention never reaches them)."""
        width = max(len(t) for t in seq_tables)
        tables: list[int] = []
        for table in seq_tables:
            tables += table
            if len(table) < width:
                tables += [0] * (width - len(table))
        if self._sliding:
            tables = [max(b, 0) for b in tables]
        return self._tensor(tables, torch.int32).view(len(seq_tables), width)

    def _group_slots(self, batch: ScheduledBatch, tables: list[list[int]]) -> list[int]:
        """The pool slot of each new token in another KV group's blocks."""
        bs = self.block_size
        slots: list[int] = []
        for seq, n, table in zip(batch.seqs, batch.num_new_tokens, tables, strict=True):
            start = seq.num_computed_tokens
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
        return slots

    @torch.inference_mode()
    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: give each new block its source's cache (all layers at once,
        whatever the spec's per-token shape)."""
        if copies:
            src = torch.tensor([s for s, _ in copies], device=self.device)
            dst = torch.tensor([d for _, d in copies], device=self.device)
            self.kv_cache[dst] = self.kv_cache[src]

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> tuple[torch.Tensor | None, list[int]]:
        """Run the step. Returns (fp32 logits ``[N, vocab]`` or None, the indices into
        ``batch.seqs`` of the N sequences that get a new token)."""
        self.copy_blocks(batch.copies)
        packed = self.pack(batch)
        slots = None
        if self.lora is not None:
            slots = self.lora.row_slots([s.adapter for s in batch.seqs], batch.num_new_tokens)
        if slots is None:
            hidden = self.run_model(packed)
        else:  # rows of LoRA adapters: eager, the layers adding the adapters' products
            with self.lora.step(slots):
                hidden = self.model(packed.input_ids, packed.positions, packed.ctx, self.kv_cache)
        if batch.scores_prompt:
            scored = rows_to_score(batch.seqs, batch.num_new_tokens)
            if scored.rows:
                score_prompt_rows(hidden, scored, self.model.compute_logits)
        if not packed.sampled:
            return None, []
        return self.model.compute_logits(hidden[packed.sample_rows]), packed.sampled

    def run_model(self, packed: PackedBatch) -> torch.Tensor:
        """The forward pass: a captured CUDA graph for a decode-only step that fits one
        (the result is then a view of a static buffer, valid until the next step),
        eager otherwise."""
        graphs = self.cuda_graphs
        if graphs is not None and graphs.can_run(packed):
            return graphs.run(packed)
        return self.model(packed.input_ids, packed.positions, packed.ctx, self.kv_cache)
