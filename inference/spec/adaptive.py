"""When speculation pays: per sequence by its recent acceptance, per step by batch size.

How many tokens to propose follows each sequence's last verification: all accepted
doubles the length (up to k), a rejection cuts it to one more than were accepted. A
verify row is not free (on the 2-core CPU each adds the fp32 multiply-adds of every
weight, about a fifth of a decode step: 5 proposed tokens took 1.9-2.1 decode steps, 8
took 2.6; ``benchmarks/bench_spec.py`` measures it), so a sequence copying a long
passage proposes long runs and one that only sometimes matches proposes short ones.

A sequence whose proposals keep being rejected (open-ended chat, after the quoted text
ends) spends verify rows for nothing, so it pauses speculating for a while and then
tries again (the conversation may start quoting); each pause in a row doubles, up to a
limit. A large decode batch is compute bound, where extra verify rows cost their full
share, so above ``max_batch`` decoding sequences no sequence speculates
(``benchmarks/bench_spec.py --crossover`` measures where that is).
"""

from __future__ import annotations

from dataclasses import dataclass
from weakref import WeakKeyDictionary

from inference.engine.sequence import Sequence

EMA_WEIGHT = 0.3  # weight of the newest verification in the acceptance average
MIN_VERIFICATIONS = 4  # verifications before a sequence can be paused
FIRST_PAUSE = 16  # steps
MAX_PAUSE = 512


@dataclass
class _State:
    rate: float = 1.0  # moving average of accepted / proposed
    verifications: int = 0
    paused_until: int = 0  # a step number
    pause: int = FIRST_PAUSE
    length: int = 2  # tokens to propose next


class AdaptivePolicy:
    def __init__(self, min_acceptance: float, max_batch: int, k: int = 8) -> None:
        self.k = k
        self.min_acceptance = min_acceptance
        self.max_batch = max_batch
        self.step = 0
        self.num_paused = 0  # pauses started, for the stats
        self._states: WeakKeyDictionary[Sequence, _State] = WeakKeyDictionary()

    def batch_allows(self, num_decoding: int) -> bool:
        return num_decoding <= self.max_batch

    def allows(self, seq: Sequence) -> bool:
        state = self._states.get(seq)
        return state is None or state.paused_until <= self.step

    def draft_length(self, seq: Sequence) -> int:
        state = self._states.get(seq)
        return min(self.k, state.length if state is not None else 2)

    def observe(self, seq: Sequence, proposed: int, accepted: int) -> None:
        state = self._states.get(seq)
        if state is None:
            state = self._states[seq] = _State()
        if accepted == proposed:  # (a proposal may be shorter than asked: n-gram ran out)
            state.length = min(self.k, max(state.length, 2 * proposed))
        else:
            state.length = accepted + 1
        state.rate = (1 - EMA_WEIGHT) * state.rate + EMA_WEIGHT * accepted / proposed
        state.verifications += 1
        if state.verifications >= MIN_VERIFICATIONS and state.rate < self.min_acceptance:
            state.paused_until = self.step + state.pause
            state.pause = min(2 * state.pause, MAX_PAUSE)
            state.rate, state.verifications = 1.0, 0  # judged afresh after the pause
            self.num_paused += 1
        elif state.rate >= 2 * self.min_acceptance:
            state.pause = FIRST_PAUSE
