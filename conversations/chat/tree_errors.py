"""The errors of the message tree's operations; each one's ``code`` is the websocket error code."""

from __future__ import annotations


class TreeError(ValueError):
    """An operation that does not fit the tree (a wrong role, an empty message)."""

    code = "invalid"


class NotAllowed(TreeError):
    """The user's groups do not give them what the operation needs (a model)."""

    code = "not_allowed"


class QuotaExhausted(TreeError):
    """A token budget of the user (or of a group of theirs) is spent."""

    code = "quota_exhausted"


class NotInConversation(TreeError):
    """The message (or conversation) named is not in this user's open conversation."""

    code = "not_found"


class Busy(TreeError):
    """A site-wide limit on live answers would be exceeded."""

    code = "busy"


class TemporaryChat(TreeError):
    """What a temporary chat never allows (a permanent copy of it)."""

    code = "temporary"
