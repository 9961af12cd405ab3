"""A draft model: a smaller model with the target's tokenizer proposes k tokens, one
decode step each, over its own paged KV.

Its KV lives in its own pool, handed out by its own ``BlockManager`` (prefix caching off:
its blocks are private to one target sequence). Each target sequence has a *shadow*
sequence here that shares the target's ``token_ids`` list, so it always sees the
accepted tokens; ``num_computed_tokens`` counts the positions whose draft K/V are valid.

A proposal first catches the shadow up on the tokens the target accepted since (the whole
prompt the first time, as one prefill chunk), then feeds its own proposals back one at a
time. The draft proposes its most likely token at each position, so its distribution is a
point mass and the verifier's walk is exact rejection sampling (``inference.spec.verify``).
The draft K/V of proposed tokens the target rejected is found at the next proposal, by
comparing the proposal with the tokens the sequence actually got, and released.
"""

from __future__ import annotations

from typing import Any

from inference.config import EngineConfig
from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import Sequence
from inference.kv.block_manager import BlockManager
from inference.kv.kv_dtype import resolve_kv_dtype
from inference.layers.cpu_matmul import resolve_cpu_matmul
from inference.runner.model_loader import load_model
from inference.runner.model_runner import ModelRunner
from inference.sampling.sampler import greedy_tokens
from inference.spec.verify import VerifyRow


class _Shadow:
    __slots__ = ("base", "draft", "seq", "target")

    def __init__(self, target: Sequence) -> None:
        self.target = target
        self.seq = Sequence(target.token_ids, target.num_prompt_tokens)  # the same list
        self.base = 0  # target length when the last proposal was made
        self.draft: list[int] = []  # that proposal


class DraftProposer:
    def __init__(self, runner: ModelRunner, block_manager: BlockManager, k: int) -> None:
        self.runner = runner
        self.block_manager = block_manager
        self.k = k
        self._shadows: dict[int, _Shadow] = {}  # target seq_id ->

    @classmethod
    def load(cls, config: EngineConfig, engine: Any) -> DraftProposer:
        """Load ``config.speculative``'s model (``draft:<path>``) beside ``engine``'s target:
        same device and dtype, a pool of as many blocks as the target's."""
        path = str(config.speculative)[len("draft:") :]
        model, _tokenizer, model_config = load_model(
            path, engine.device, engine.dtype, config.weights_cache_dir
        )
        if type(model).recurrent_spec_for(model_config) is not None:
            raise ValueError(f"draft model {path} has recurrent layers: a draft must attend over KV only")
        if model_config.vocab_size != engine.model_config.vocab_size:
            raise ValueError(
                f"draft model {path} has a vocabulary of {model_config.vocab_size} tokens, "
                f"the target {engine.model_config.vocab_size}: they must share the tokenizer"
            )
        num_blocks = engine.block_manager.num_blocks
        runner = ModelRunner(
            model,
            model_config,
            num_blocks,
            config.block_size,
            engine.device,
            engine.dtype,
            max_num_seqs=config.max_decode_batch,
            max_model_len=engine.max_model_len,
            enforce_eager=config.enforce_eager,
            cpu_matmul=resolve_cpu_matmul(config.cpu_matmul, engine.device),
            kv_dtype=resolve_kv_dtype(config.kv_cache_dtype, engine.device, engine.dtype),
        )
        bm = BlockManager(
            num_blocks, config.block_size, enable_prefix_caching=False, groups=model.kv_spec.groups
        )
        return cls(runner, bm, config.num_speculative_tokens)

    def verified(self, seq: Sequence, draft: list[int], accepted: int) -> None:
        pass  # reconciled at the next proposal, from the tokens the sequence got

    def propose_batch(self, seqs: list[Sequence], limits: list[int]) -> list[list[int]]:
        self._sweep()
        shadows = [self._reconcile(seq) for seq in seqs]
        limits = [min(self.k, limit) for limit in limits]
        drafts: list[list[int]] = [[] for _ in seqs]
        live = [i for i, s in enumerate(shadows) if self._reserve(s, limits[i])]
        if not live:
            return drafts
        # Catch up: the tokens not yet in the draft's KV, ending with the target's last.
        batch = ScheduledBatch()
        for i in live:
            shadow = shadows[i].seq
            batch.seqs.append(shadow)
            batch.num_new_tokens.append(shadow.num_tokens - shadow.num_computed_tokens)
        self._step(batch, [drafts[i] for i in live])
        for i in live:
            shadows[i].seq.num_computed_tokens = shadows[i].seq.num_tokens
        # Then one decode step per further proposed token, for those that want more.
        while True:
            live = [i for i in live if len(drafts[i]) < limits[i]]
            if not live:
                break
            batch = ScheduledBatch()
            for i in live:
                shadow = shadows[i].seq
                tokens = shadow.token_ids + drafts[i]
                batch.seqs.append(VerifyRow(tokens, len(tokens) - 1, shadow.block_table, shadow.group_tables))  # type: ignore[arg-type]
                batch.num_new_tokens.append(1)
            self._step(batch, [drafts[i] for i in live])
            for i in live:
                shadows[i].seq.num_computed_tokens += 1
        for shadow, draft in zip(shadows, drafts, strict=True):
            shadow.base, shadow.draft = shadow.seq.num_tokens, draft
        return drafts

    def _step(self, batch: ScheduledBatch, outputs: list[list[int]]) -> None:
        logits, sampled = self.runner.execute(batch)
        assert logits is not None and len(sampled) == len(outputs)
        for out, token in zip(outputs, greedy_tokens(logits).tolist(), strict=True):
            out.append(int(token))

    def _reconcile(self, target: Sequence) -> _Shadow:
        """The target's shadow, its KV cut back to the positions that match the target's
        tokens (the last proposal's accepted prefix stays)."""
        shadow = self._shadows.get(target.seq_id)
        if shadow is None:
            shadow = self._shadows[target.seq_id] = _Shadow(target)
            return shadow
        seq, tokens = shadow.seq, target.token_ids
        valid = min(seq.num_computed_tokens, shadow.base)
        for j, token in enumerate(shadow.draft[:-1]):  # the last proposal was never fed
            if shadow.base + j >= len(tokens) or tokens[shadow.base + j] != token:
                break
            valid = shadow.base + j + 1
        # The last token is fed again even if its K/V is there: its logits are wanted.
        seq.num_computed_tokens = min(seq.num_computed_tokens, valid, len(tokens) - 1)
        self.block_manager.truncate(seq, seq.num_computed_tokens)
        shadow.draft = []
        return shadow

    def _reserve(self, shadow: _Shadow, limit: int) -> bool:
        """Slots for the catch-up and ``limit - 1`` fed-back proposals; a shadow the pool
        cannot hold is dropped (its sequence is not speculated this step)."""
        seq = shadow.seq
        need = seq.num_tokens - seq.num_computed_tokens + limit - 1
        if limit > 0 and self.block_manager.allocate_slots(seq, need):
            return True
        self._drop(shadow)
        return False

    def _drop(self, shadow: _Shadow) -> None:
        self.block_manager.free(shadow.seq)
        shadow.seq.num_computed_tokens = 0
        self._shadows.pop(shadow.target.seq_id, None)

    def _sweep(self) -> None:
        """Free the shadows of finished target sequences."""
        for shadow in [s for s in self._shadows.values() if s.target.is_finished]:
            self._drop(shadow)

    def close(self) -> None:
        for shadow in list(self._shadows.values()):
            self._drop(shadow)
