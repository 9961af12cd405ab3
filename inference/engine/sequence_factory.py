"""Builds requests and their sequences with what each sequence needs for sampling and
text: a seeded generator, an incremental detokenizer, a reasoning splitter, logprobs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from inference.engine.sequence import Request, Sequence
from inference.kv.block_manager import BlockManager
from inference.kv.salt import cache_salt as derive_cache_salt
from inference.sampling.harmony import HarmonySplitter
from inference.sampling.params import SamplingParams
from inference.sampling.reasoning_parser import ReasoningSplitter
from inference.sampling.sampler import Sampler
from inference.structured import GrammarCompiler, SequenceGrammar
from inference.tokenizer import Tokenizer


class SequenceFactory:
    def __init__(
        self,
        tokenizer: Tokenizer,
        sampler: Sampler,
        block_manager: BlockManager,
        vocab_size: int | None = None,
        grammar_options: dict[str, Any] | None = None,
    ) -> None:
        """``grammar_options``: ``GrammarCompiler``'s keyword options (its pool's bounds)."""
        self.tokenizer = tokenizer
        self.sampler = sampler
        self.block_manager = block_manager
        # Compiles requests' grammars in worker processes (started, and the xgrammar
        # tokenizer data built, on first use, so engines that never constrain pay nothing).
        self.grammars = GrammarCompiler(
            tokenizer, vocab_size or tokenizer.vocab_size, **(grammar_options or {})
        )

    def new_request(
        self,
        request_id: str,
        prompt: str | list[int],
        token_ids: list[int],
        params: SamplingParams,
        *,
        owner: str | None = None,
        cache_namespace: str | None = None,
        cache_salt: str | None = None,
        cache_salt_from: int = 0,
    ) -> Request:
        """A request with its first sequence (the prompt's; n > 1 and beams fork it later)."""
        request = Request(
            request_id, token_ids, params, prompt=prompt if isinstance(prompt, str) else None, owner=owner
        )
        salt = derive_cache_salt(cache_namespace, cache_salt)
        if salt.value:
            request.cache_salt, request.cache_namespace = salt.value, salt.namespace
            request.cache_salt_block = max(0, cache_salt_from) // self.block_manager.block_size
        if params.grammar is not None:
            request.grammar = self.grammars.submit(params.grammar)
        if params.prompt_logprobs is not None:
            request.prompt_logprobs = [None]
        request.seqs.append(self.new_seq(request, token_ids, index=0))
        return request

    def new_seq(self, request: Request, token_ids: list[int], index: int) -> Sequence:
        params = request.params
        seq = Sequence(list(token_ids), request.num_prompt_tokens, index=index, request=request)
        seq.cache_salt, seq.cache_salt_block = request.cache_salt, request.cache_salt_block
        seq.cache_namespace, seq.cache_private = request.cache_namespace, request.cache_private
        seq.adapter, seq.adapter_key = request.adapter, request.adapter_key
        if params.seed is not None and not params.use_beam_search:
            seq.generator = self.sampler.make_generator(params.seed + index)
        if not params.use_beam_search:
            seq.detokenizer = self.tokenizer.detokenizer()
            seq.reasoning = self._reasoning_splitter(params, token_ids)
        if params.logprobs is not None:
            seq.logprobs = []
        scores = request.prompt_logprobs
        seq.score_prompt = scores is not None and len(scores) < request.num_prompt_tokens
        if request.grammar is not None:
            seq.grammar = SequenceGrammar(request.grammar, stop_token_ids=self.tokenizer.eos_token_ids)
        return seq

    def fork(self, request: Request, parent: Sequence, index: int) -> Sequence:
        """A new sequence of ``request`` sharing ``parent``'s tokens and KV blocks."""
        child = self.new_seq(request, parent.token_ids, index)
        child.cumulative_logprob = parent.cumulative_logprob
        if parent.logprobs is not None:
            child.logprobs = list(parent.logprobs)
        if parent.grammar is not None:
            child.grammar = parent.grammar.fork()
        self.block_manager.fork(parent, child)
        request.seqs.append(child)
        return child

    def _reasoning_splitter(
        self, params: SamplingParams, prompt_ids: list[int]
    ) -> ReasoningSplitter | HarmonySplitter | None:
        if not params.separate_reasoning:
            return None
        if self.tokenizer.reasoning_format == "harmony":
            return HarmonySplitter()
        tags = self.tokenizer.reasoning_tags
        if tags is None:
            return None
        # R1's generation prompt opens <think> itself; the tag may be a plain added
        # token, so decode without dropping special tokens.
        tail = self.tokenizer.decode(prompt_ids[-8:], skip_special_tokens=False)
        return ReasoningSplitter(tags, in_reasoning=tail.rstrip().endswith(tags[0]))


def make_private(requests: Iterable[Request], namespace: int) -> None:
    """Requests salted in ``namespace`` publish no more blocks to the prefix cache (the
    namespace is being purged)."""
    for request in requests:
        if request.cache_namespace == namespace:
            request.cache_private = True
            for seq in request.seqs:
                seq.cache_private = True
