"""Grammar-constrained decoding with xgrammar.

A request's ``SamplingParams.grammar`` (a ``GrammarSpec``) is compiled in a worker process
when the request arrives (``GrammarCompiler``, cached by the spec's hash; a compile past its
time limit is killed with its process: ``compile_pool``); the scheduler skips the request
until that is done. Each of its sequences then has a
``SequenceGrammar`` (an xgrammar matcher), whose token bitmask is applied to the row's
logits before penalties, temperature, top-k and top-p (``apply_grammar_masks``), so the
sampled distribution is renormalised over the allowed tokens and EOS is allowed only
where the grammar accepts. The matcher forks with its sequence (n > 1, beams), keeps its
state across preemption (the sequence keeps its tokens) and can roll back tokens.
"""

from inference.structured.compiler import GrammarBusyError, GrammarCompiler, GrammarError, PoolClosedError
from inference.structured.masking import apply_grammar_masks
from inference.structured.matcher import SequenceGrammar
from inference.structured.spec import GrammarSpec

__all__ = [
    "GrammarBusyError",
    "GrammarCompiler",
    "GrammarError",
    "PoolClosedError",
    "GrammarSpec",
    "SequenceGrammar",
    "apply_grammar_masks",
]
