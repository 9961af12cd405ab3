"""Token budgets the engine enforces where the tokens are made.

A request may carry a ``TokenGate`` (the caller's: a site charges a user's and their groups'
quotas). After every step that gave the request new output tokens the engine charges them
to the gate; when the gate answers that the budget is spent, the request's live sequences
finish there, with ``finish_reason="length"`` and ``stop_reason="quota"``: the step that
crossed the budget is served whole, nothing after it. Many requests sharing one budget thus
overshoot it by at most their tokens of one step.
"""

from __future__ import annotations

from inference.engine.sequence import Request
from inference.engine.token_budget import QUOTA_STOP, TokenGate

__all__ = ["QUOTA_STOP", "TokenGate", "charge_step"]


def charge_step(request: Request) -> bool:
    """Charge ``request``'s output tokens since its last charge to its gate; when the budget
    is spent, finish its live sequences for the quota. True when it was stopped here."""
    gate = request.token_gate
    if gate is None:
        return False
    produced = sum(len(s.token_ids) - s.num_prompt_tokens for s in (*request.seqs, *request.finished_seqs))
    new = produced - request.charged_tokens
    if new <= 0:
        return False
    request.charged_tokens = produced
    if gate.charge(new):
        return False
    stopped = False
    for seq in request.seqs:
        if seq.finish_reason is None:
            seq.finish_reason, seq.stop_reason = "length", QUOTA_STOP
            if seq.detokenizer is not None:
                seq.output_text += seq.detokenizer.flush()
            stopped = True
    return stopped
