"""The per-step ``RecurrentContext`` of a hybrid model: each sequence's state slot, and
the recurrent layers' spans when a verification joins several rows into one."""

from __future__ import annotations

from collections.abc import Callable

import torch

from inference.engine.scheduler import ScheduledBatch
from inference.layers.recurrent_context import RecurrentContext, RecurrentStates

Tensorize = Callable[[list[int], torch.dtype], torch.Tensor]


def recurrent_context(
    batch: ScheduledBatch, query_start_loc: list[int], states: RecurrentStates, tensor: Tensorize
) -> RecurrentContext:
    """One span per row, or ``batch.recurrent_spans``'s: a span of ``m`` rows reads the
    state slot of its first row (``VerifyRow.state_slot``, the verified sequence's) and
    leaves there the state after its last row."""
    seqs = batch.seqs
    if not batch.recurrent_spans:
        return RecurrentContext(
            state_slots=tensor([s.state_slot for s in seqs], torch.int64),
            has_initial_state=tensor([s.num_computed_tokens > 0 for s in seqs], torch.int64).bool(),
            states=states,
        )
    assert sum(batch.recurrent_spans) == len(seqs), "recurrent spans must cover the batch's rows"
    slots: list[int] = []
    initial: list[int] = []
    starts = [0]
    row = 0
    for span in batch.recurrent_spans:
        head = seqs[row]
        slots.append(head.state_slot)
        initial.append(head.num_computed_tokens > 0)
        row += span
        starts.append(query_start_loc[row])
    return RecurrentContext(
        state_slots=tensor(slots, torch.int64),
        has_initial_state=tensor(initial, torch.int64).bool(),
        states=states,
        query_start_loc=tensor(starts, torch.int32),
    )
