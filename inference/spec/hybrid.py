"""Speculative decoding on a hybrid model: the recurrent state follows the accepted tokens.

A verification's rows run the attention layers as ``k + 1`` decode rows, like any
model's, and the recurrent layers as one span of ``k + 1`` tokens
(``expand(joined=True)``, ``RecurrentContext.query_start_loc``), so each position
continues from the state after the one before it and every row's logits are exact. The
span leaves the state after the whole proposal, which is right only when every proposed
token is accepted. So before the step the block manager keeps a copy of the state
(``HybridBlockManager.begin_verify``: one spare slot per verified sequence, reserved in
the state pool); after the walk (``end_verify``) a fully accepted proposal keeps the new
state, and any rejection restores the copy and rewinds the sequence to the step's first
position, so the next step recomputes the accepted tokens and the target's own token as
one chunk. Emitted tokens are never taken back: only their state is recomputed.
"""

from __future__ import annotations

from inference.engine.sequence import Sequence
from inference.kv.block_manager import BlockManager
from inference.kv.hybrid_blocks import HybridBlockManager
from inference.spec.speculator import Speculator
from inference.spec.verify import Verification


class HybridSpeculator(Speculator):
    joins_rows = True
    block_manager: HybridBlockManager

    def _hold(self, seq: Sequence) -> bool:
        return self.block_manager.begin_verify(seq)

    def _unhold(self, seq: Sequence) -> None:
        self.block_manager.cancel_verify(seq)

    def _settle(self, v: Verification) -> None:
        seq = v.seq
        # The scheduler counted the step's first row as computed.
        start = seq.num_computed_tokens - 1
        if self.block_manager.end_verify(seq, start, v.accepted, len(v.draft)):
            self.stats.rollbacks += 1


def speculator_class(block_manager: BlockManager) -> type[Speculator]:
    """The speculator for ``block_manager``'s model: a hybrid one rolls its states back."""
    return HybridSpeculator if isinstance(block_manager, HybridBlockManager) else Speculator
