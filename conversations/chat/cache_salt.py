"""Which prefix-cache namespace and salt each of the site's engine requests uses.

The contract (docs/interfaces.md, "Prefix-cache namespaces"): every user has one
namespace, ``user:<id>``, and the engine derives every salt from the namespace
(``inference.kv.salt``), so no string a client sends can reproduce another user's salt.

- Chat answers, their KV retention marks, title prompts, and API calls without
  ``cache_salt``: the user's namespace itself. One user's chat and API calls share a
  cache; two users never do.
- API calls with ``cache_salt``: that salt nested inside the key owner's namespace (as
  vLLM's ``cache_salt`` works within one tenant), salted from the first token.
- The blocks made wholly of a leading system prompt's tokens stay unsalted, shared by
  every user (a common system prompt, e.g. the title instruction, is computed once).
- ``PREFIX_CACHE_SALT=false`` (single-user sites): nothing is salted except API calls
  that ask for a ``cache_salt``, which stay nested in their user's namespace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.conf import settings

if TYPE_CHECKING:  # a worker imports this module, and never the engine
    from inference.prompt import ChatTokenizer


def user_namespace(user_id: int) -> str:
    return f"user:{user_id}"


def cache_options(
    owner_id: int, shared_prefix_tokens: int = 0, client_salt: str | None = None
) -> dict[str, Any]:
    """The engine's cache options for a request of user ``owner_id`` whose first
    ``shared_prefix_tokens`` ids are the system prompt's (shared when unsalted)."""
    namespace = user_namespace(owner_id)
    if client_salt:
        return {"cache_namespace": namespace, "cache_salt": client_salt, "cache_salt_from": 0}
    if not settings.PREFIX_CACHE_SALT:
        return {}
    return {"cache_namespace": namespace, "cache_salt_from": max(0, shared_prefix_tokens)}


def system_prompt_tokens(
    tokenizer: ChatTokenizer, messages: Sequence[Mapping[str, Any]], prompt: list[int]
) -> int:
    """How many leading ids of ``prompt`` (rendered from ``messages``) are the first
    message's segment, if that is a system message; 0 otherwise, or when the prompt does
    not start with that segment (a template that renders the system prompt differently
    once more messages follow)."""
    from inference.prompt import encode_segments

    if not messages or messages[0].get("role") != "system":
        return 0
    segment = encode_segments(tokenizer, messages[:1], add_generation_prompt=False).segments[0]
    return len(segment) if prompt[: len(segment)] == segment else 0
