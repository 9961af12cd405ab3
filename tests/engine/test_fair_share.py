"""Fair share: one owner flooding the waiting queue does not push another owner's
request behind the whole flood (round-robin admission across owners)."""

from __future__ import annotations

from inference.engine.sequence import RequestStatus
from tests.engine.engine_fixtures import TinyModel, greedy, random_prompts, run_to_completion

SEATS = 2
FLOOD = 10


def flood_then_chat(tiny: TinyModel, flood_owner: str | None, chat_owner: str | None) -> int:
    """Fill the engine with FLOOD requests of one owner, then add one of another; return how
    many flood requests were admitted in steps after the other request arrived and before
    the step that admitted it."""
    engine = tiny.engine(max_num_seqs=SEATS)
    prompts = random_prompts(tiny.tokenizer, FLOOD + 1, seed=11, min_len=8, max_len=16)
    flood = [engine.add_request(p, greedy(3), owner=flood_owner) for p in prompts[:FLOOD]]
    engine.step()
    chat = engine.add_request(prompts[FLOOD], greedy(3), owner=chat_owner)
    admitted_before = admitted = sum(r.status is not RequestStatus.WAITING for r in flood)
    while chat.status is RequestStatus.WAITING:
        admitted = sum(r.status is not RequestStatus.WAITING for r in flood)
        engine.step()
    while engine.has_unfinished():
        engine.step()
    return admitted - admitted_before


def test_a_flooding_owner_does_not_push_another_owners_request_behind_its_queue(tiny: TinyModel) -> None:
    # Without owners: arrival order, the chat request waits for every queued flood request.
    assert flood_then_chat(tiny, None, None) == FLOOD - SEATS
    # With owners: it takes one of the first seats that free up.
    assert flood_then_chat(tiny, "api-key:1", "user:1") == 0


def test_fair_share_changes_admission_order_only_not_outputs(tiny: TinyModel) -> None:
    prompts = random_prompts(tiny.tokenizer, 9, seed=3)
    engine = tiny.engine(max_num_seqs=3)
    fifo = run_to_completion(engine, prompts, greedy(8))
    engine = tiny.engine(max_num_seqs=3)
    owners = ["a"] * 6 + ["b", "c", "b"]
    requests = [engine.add_request(p, greedy(8), owner=o) for p, o in zip(prompts, owners, strict=True)]
    while engine.has_unfinished():
        engine.step()
    assert [r.outputs_in_order()[0].output_token_ids for r in requests] == [o.token_ids for o in fifo]
