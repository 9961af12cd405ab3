"""The block manager under speculation: the Hypothesis state machine of
test_block_manager, plus a rule that allocates slots for a proposal, writes them, accepts
a prefix and truncates the rest away, as the speculator does. Its invariants (no leak,
counts equal holders, tables cover exactly the computed tokens) hold after every rule."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from inference.engine.sequence import Sequence
from inference.kv.block_manager import BlockManager
from tests.engine.test_block_manager import BS, BlockManagerMachine


class SpeculatingMachine(BlockManagerMachine):
    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), proposal=st.lists(st.integers(0, 2), min_size=1, max_size=9))
    def speculate(self, data: st.DataObject, proposal: list[int]) -> None:
        bm: BlockManager = self.bm
        seq: Sequence = data.draw(st.sampled_from(self.seqs))
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(data.draw(st.integers(0, 2)))  # a sampled token
        self._grow(seq, seq.num_tokens - 1 - seq.num_computed_tokens)  # the prefill's rest
        if seq.num_computed_tokens != seq.num_tokens - 1 or not bm.allocate_slots(seq, 1 + len(proposal)):
            return  # the speculator proposes less when the pool is short
        bm.take_copies()
        start = seq.num_computed_tokens
        for p in range(start, start + 1 + len(proposal)):
            block = bm.blocks[seq.block_table[p // BS]]
            assert block.ref_count == 1 and block.hash is None, "a proposal wrote into a shared block"
        accepted = data.draw(st.integers(0, len(proposal)))
        # The last token and the accepted prefix are computed; the target's next token is new.
        seq.token_ids += proposal[:accepted] + [data.draw(st.integers(0, 2))]
        seq.num_computed_tokens = start + 1 + accepted
        bm.register_full_blocks(seq)
        bm.truncate(seq, seq.num_computed_tokens)
        assert len(seq.block_table) == bm.blocks_for(seq.num_computed_tokens)


TestSpeculatingBlockManager = SpeculatingMachine.TestCase
TestSpeculatingBlockManager.settings = settings(max_examples=120, stateful_step_count=50, deadline=None)
