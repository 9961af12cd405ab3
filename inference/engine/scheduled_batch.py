"""What one step runs: the scheduler's answer, read by the runner and the speculators."""

from __future__ import annotations

from dataclasses import dataclass, field

from inference.engine.sequence import Request, Sequence


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst) blocks
    preempted: list[Request] = field(default_factory=list)
    # Requests that cannot grow even with the whole pool to themselves (many beams
    # of a long sequence): they finish with "length" instead of looping forever.
    out_of_memory: list[Request] = field(default_factory=list)
    # Some sequence scores prompt tokens this step (Sequence.score_prompt): the runner takes
    # the general path and runs the LM head on those rows too.
    scores_prompt: bool = False
    # A hybrid model's speculative verification (``inference.spec.hybrid``): how many
    # consecutive rows each recurrent span covers (empty: one span per row).
    recurrent_spans: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)
