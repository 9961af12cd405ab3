"""The audit log: an append-only record of sign-ins, keys, shares, access changes, data moves
and admin deletions (``conversations.models.audit``). ``log.record`` writes one entry in the
caller's transaction; ``receivers`` turns Django's signals into entries; ``admin`` is the
read-only view with its JSONL export; ``retention`` drops entries past their age."""
