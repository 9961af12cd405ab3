"""Documents in the prompt: whole at the start of the system message (a stable prefix,
salted from token 0), or searched passages in the question's turn, with citations."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import sync_to_async

from conversations.chat.prompt_history import plan_prompt, thread_prompt
from conversations.documents import in_prompt
from conversations.documents.jobs import run_extraction, start_upload
from conversations.documents.views import _sources
from conversations.models import Conversation, ConversationDocument, Document, Message, MessageSources
from conversations.ops.engine_handle import aget_engine

RIVERS = "# Rivers\n\nThe Nile flows north into the Mediterranean.\n\n## Deltas\n\nA delta forms where a river slows."
MANUAL = (
    "\n\n".join(
        f"## Section {i}\n\nThe valve number {i} is tightened with a {i}-millimetre spanner."
        for i in range(60)
    )
    + "\n\n## Boilers\n\nThe boiler pressure must never exceed nine bar."
)


def finish_extraction(document_id: int, timeout: float = 30.0) -> None:
    """Run the job here; if the upload's own thread (eager Celery, after the commit) took it
    first, wait for that one to finish."""
    run_extraction(document_id)
    deadline = time.monotonic() + timeout
    while Document.objects.get(pk=document_id).status not in ("ready", "failed"):
        assert time.monotonic() < deadline, "extraction did not finish"
        time.sleep(0.05)


def setup(user, files: dict[str, str], system_prompt: str = "") -> Conversation:
    conversation = Conversation.objects.create(owner=user, system_prompt=system_prompt)
    for name, text in files.items():
        document = start_upload(user, name, text.encode())
        finish_extraction(document.pk)
        ConversationDocument.objects.create(conversation=conversation, document=document)
    return conversation


def ask(conversation, question: str) -> Message:
    return Message.objects.create(conversation=conversation, role="user", content=question)


@pytest.mark.django_db(transaction=True)
async def test_a_small_document_leads_every_prompt_of_the_users_conversations(make_user, tiny_engine):
    engine = await aget_engine()
    user = await sync_to_async(make_user)()
    first = await sync_to_async(setup)(user, {"rivers.md": RIVERS})
    second = await sync_to_async(setup)(user, {"rivers.md": RIVERS}, system_prompt="Be brief.")
    q1 = await sync_to_async(ask)(first, "Which way does the Nile flow?")
    q2 = await sync_to_async(ask)(second, "What is a delta?")
    plan1 = (await plan_prompt(first, q1.pk, engine)).plan
    plan2 = (await plan_prompt(second, q2.pk, engine)).plan
    text = engine.tokenizer.decode(plan1.token_ids, skip_special_tokens=False)
    assert "The Nile flows north" in text, text[:600]
    assert text.index("The Nile flows north") < text.index("Which way does the Nile flow?")
    assert plan1.shared_prefix_tokens == plan2.shared_prefix_tokens == 0  # never shared with other users
    doc_tokens = len(engine.tokenizer.encode(RIVERS))
    common = next(i for i, (a, b) in enumerate(zip(plan1.token_ids, plan2.token_ids, strict=False)) if a != b)
    assert common >= doc_tokens  # the same leading blocks: shared through the prefix cache
    # The retention's mark for the open conversation starts with the same document tokens.
    mark = (await thread_prompt(first.pk, engine)).plan.token_ids
    assert mark[:common] == plan1.token_ids[:common]
    sources = await MessageSources.objects.aget(message_id=q1.pk)
    assert sources.whole[0]["filename"] == "rivers.md"
    assert sources.passages and all(p["filename"] == "rivers.md" for p in sources.passages)


@pytest.mark.django_db(transaction=True)
async def test_a_large_document_is_searched_and_its_passages_cited(make_user, tiny_engine, monkeypatch):
    monkeypatch.setattr(in_prompt, "WHOLE_SHARE", 0.01)  # nothing fits whole
    engine = await aget_engine()
    user = await sync_to_async(make_user)()
    conversation = await sync_to_async(setup)(user, {"manual.md": MANUAL})
    question = await sync_to_async(ask)(conversation, "What is the maximum boiler pressure?")
    plan = (await plan_prompt(conversation, question.pk, engine)).plan
    text = engine.tokenizer.decode(plan.token_ids, skip_special_tokens=False)
    assert "never exceed nine bar" in text and "[1] (manual.md" in text
    assert text.index("never exceed nine bar") < text.index("Question: What is the maximum boiler pressure?")
    assert len(plan.token_ids) < len(engine.tokenizer.encode(MANUAL)) // 2  # passages, not the whole
    sources = await MessageSources.objects.aget(message_id=question.pk)
    assert sources.whole == []
    top = sources.passages[0]
    assert top["n"] == 1 and top["filename"] == "manual.md" and "nine bar" in top["excerpt"]
    document_text = MANUAL.strip()
    assert "nine bar" in document_text[top["start"] : top["end"]]
    # Built again (a retry, or a longer read of the history): the same passages, not searched again.
    again = (await plan_prompt(conversation, question.pk, engine)).plan
    assert again.token_ids == plan.token_ids
    answer = await Message.objects.acreate(conversation=conversation, role="assistant", parent=question)
    cited = await sync_to_async(_sources)(conversation.pk)
    assert cited[str(answer.pk)]["passages"][0]["chunk_id"] == top["chunk_id"]


@pytest.mark.django_db(transaction=True)
async def test_another_users_attachment_row_brings_nothing(make_user, tiny_engine):
    engine = await aget_engine()
    alice, bob = await sync_to_async(make_user)("alice"), await sync_to_async(make_user)("bob")
    theirs = await sync_to_async(setup)(alice, {"secret.md": "The vault code is 4471."})
    mine = await Conversation.objects.acreate(owner=bob)
    doc = await ConversationDocument.objects.filter(conversation=theirs).afirst()
    await ConversationDocument.objects.acreate(conversation=mine, document_id=doc.document_id)  # forged row
    question = await sync_to_async(ask)(mine, "What is the vault code?")
    plan = (await plan_prompt(mine, question.pk, engine)).plan
    assert "4471" not in engine.tokenizer.decode(plan.token_ids)
