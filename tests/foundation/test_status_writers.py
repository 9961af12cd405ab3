"""One writer of a message's status: ``conversations.chat.lifecycle``.

Every status a tab can see was set by one of the lifecycle's moves (an answer created
``streaming``, finished, interrupted, failed, fenced; orphans swept), so the rules of an
answer's life are read in one module. This test reads every module of ``conversations/``
and fails on a write of ``Message.status`` anywhere else:

- a ``status=`` keyword in a write (``update``, ``create``, ``Message(...)``, the fenced
  ``update_message``...) or with a ``Message.Status`` value in any call but a read
  (``filter``, ``exclude``...);
- a ``"status"`` key in a dict literal with a ``Message.Status`` value or the name of one
  (fields to write later);
- an assignment to an object's ``status`` attribute.

Allowed exceptions, each the creation of a row that copies an ended message rather than a
move of a live one:

- ``conversations/transfer/importing.py``: a conversation imported from a file keeps each
  message's stored status (a ``streaming`` one becomes ``interrupted``: nothing generates it
  here);
- ``conversations/transfer/chatgpt.py``: a ChatGPT export's messages are all ``complete``.

Forks (``conversations/chat/fork.py``) and shared copies (``conversations/workspace/sharing.py``)
copy a path's fields, status among them, by name: they refuse a path with a ``streaming``
message, so they copy ended statuses only, and write none of their own (no rule above matches).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
THE_WRITER = "conversations/chat/lifecycle.py"
EXCEPTIONS = {
    "conversations/transfer/importing.py": "imported rows keep their stored status",
    "conversations/transfer/chatgpt.py": "imported ChatGPT messages are complete",
}
READS = {"filter", "exclude", "get", "aget", "values", "values_list", "Q", "count", "acount", "exists"}
WRITES = {
    "update",
    "aupdate",
    "create",
    "acreate",
    "update_or_create",
    "get_or_create",
    "bulk_update",
    "update_message",
    "Message",
}
STATUS_NAMES = {"complete", "streaming", "interrupted", "error"}
OTHER_MODELS = ("DataJob", "Document")  # models with a status of their own


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _other_model(value: ast.expr) -> bool:
    return any(model in ast.unparse(value) for model in OTHER_MODELS)


def _is_message_status(value: ast.expr) -> bool:
    source = ast.unparse(value)
    if _other_model(value):
        return False
    if isinstance(value, ast.Constant):
        return value.value in STATUS_NAMES
    return "Status." in source


def status_writes(source: str) -> list[str]:
    """Where ``source`` writes a message's status, as ``line: code``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _called(node) not in READS:
            for keyword in node.keywords:
                if keyword.arg != "status" or _other_model(keyword.value):
                    continue
                if _called(node) in WRITES or _is_message_status(keyword.value):
                    found.append(f"{node.lineno}: {ast.unparse(node)[:100]}")
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "status" and _is_message_status(value):
                    found.append(f"{node.lineno}: {ast.unparse(node)[:100]}")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is None or _other_model(node.value):
                continue
            for target in targets:
                for part in ast.walk(target):
                    # ``self.status``: an object's own (an HTTP error's), not a message's.
                    if (
                        isinstance(part, ast.Attribute)
                        and part.attr == "status"
                        and ast.unparse(part) != "self.status"
                    ):
                        found.append(f"{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def test_the_rules_see_each_kind_of_write() -> None:
    source = (
        "Message.objects.filter(pk=1).update(status=Message.Status.INTERRUPTED)\n"
        "update_message(7, status=status)\n"
        "fields = {'status': Message.Status.ERROR}\n"
        "message.status, message.finish_reason = Message.Status.COMPLETE, 'stop'\n"
        "Message.objects.filter(status=Message.Status.STREAMING).count()\n"
        "DataJob.objects.filter(pk=1).update(status=DataJob.Status.DONE)\n"
        "JsonResponse({'status': 'ok'}, status=400)\n"
        "row = {'status': message.status}\n"
    )
    assert sorted(int(line.split(":")[0]) for line in status_writes(source)) == [1, 2, 3, 4]


def test_only_the_lifecycle_writes_a_message_status() -> None:
    offenders = {}
    for path in sorted((ROOT / "conversations").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if "/migrations/" in name or name == THE_WRITER or name in EXCEPTIONS:
            continue
        writes = status_writes(path.read_text(encoding="utf-8"))
        if writes:
            offenders[name] = writes
    assert offenders == {}


def test_the_lifecycle_is_a_writer_and_the_exceptions_still_need_their_place() -> None:
    assert status_writes((ROOT / THE_WRITER).read_text(encoding="utf-8"))
    for name in EXCEPTIONS:
        assert '"status"' in (ROOT / name).read_text(encoding="utf-8"), f"{name} writes no status any more"
