"""The order in which a step's prompt chunks take the step's prompt allowance.

Under the step time budget a step carries a limited number of prompt tokens. With many
chats, the requests that want prompt tokens are both first turns (a system prompt and a
document: 1,000+ uncached tokens each) and later turns (a few dozen new tokens after a
long history that the prefix cache already holds). Served in admission order, a later
turn waits until every first turn admitted before it has finished its prefill: seconds
on a CPU. Served fewest uncached tokens first (shortest job first), a later turn runs in
the next step or two, and the first turns lose only those few tokens of the allowance.
"""

from __future__ import annotations

from inference.engine.sequence import Request
from inference.kv.block_manager import BlockManager


def uncached_tokens(request: Request) -> int:
    """Prompt (or recomputed) tokens ``request`` still has to run before it samples."""
    return max(s.num_tokens - s.num_computed_tokens for s in request.seqs)


def wants_prompt_chunk(request: Request) -> bool:
    """Does some sequence of ``request`` want more than one token (a prompt chunk)?"""
    return any(s.num_tokens - s.num_computed_tokens > 1 for s in request.seqs)


def fewest_uncached_first(requests: list[Request]) -> list[Request]:
    """``requests`` by uncached tokens, fewest first; equals keep their order (oldest first)."""
    return sorted(requests, key=uncached_tokens)


def room_for_prompt(block_manager: BlockManager, request: Request) -> bool:
    """Could the pool take the rest of ``request``'s prompt (its cached prefix admitted)?
    Only then is it admitted in a step whose prompt allowance is spent."""
    need = sum(block_manager.blocks_needed(s, s.num_tokens - s.num_computed_tokens) for s in request.seqs)
    return need <= block_manager.num_free_blocks
