"""Audit entries from Django's signals: sign-in, sign-out and failed sign-in; MCP servers,
groups, group membership and users' roles changed by any path (the admin, a shell, the
sign-in that syncs groups from the identity provider).

Model signals are sent inside the transaction of the save or delete that sends them, so
each entry commits with its change. Connected in ``ConversationsConfig.ready``.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save

from conversations.audit.log import Action, record
from conversations.models import GroupAccess, McpServer, TokenQuota

ROLE_FIELDS = ("is_staff", "is_superuser", "is_active")
USERNAME_LENGTH = 150


def _signed_in(sender, request, user, **kwargs) -> None:
    record(Action.SIGN_IN, actor=user, request=request, target=user, detail=_sign_in_detail(request))


def _sign_in_detail(request) -> dict:
    backend = getattr(getattr(request, "user", None), "backend", "") if request is not None else ""
    return {"backend": backend} if backend else {}


def _signed_out(sender, request, user, **kwargs) -> None:
    if user is not None:
        reason = getattr(request, "audit_sign_out_reason", "")
        record(
            Action.SIGN_OUT,
            actor=user,
            request=request,
            target=user,
            detail={"reason": reason} if reason else {},
        )


def _sign_in_failed(sender, credentials: dict, request=None, **kwargs) -> None:
    # Django has already replaced the password in ``credentials`` with asterisks; only the
    # name typed is kept.
    username = str(credentials.get("username", ""))[:USERNAME_LENGTH]
    record(Action.SIGN_IN_FAILED, request=request, detail={"username": username})


def _mcp_saved(sender, instance: McpServer, created: bool, raw: bool = False, **kwargs) -> None:
    if raw:
        return
    fields = {"transport": instance.transport, "enabled": instance.enabled, "all_users": instance.all_users}
    record(Action.MCP_SERVER_CREATE if created else Action.MCP_SERVER_CHANGE, target=instance, detail=fields)


def _mcp_deleted(sender, instance: McpServer, **kwargs) -> None:
    record(Action.MCP_SERVER_DELETE, target=instance)


def _mcp_access_changed(sender, instance, action: str, model, pk_set, reverse: bool, **kwargs) -> None:
    if action not in ("post_add", "post_remove", "post_clear") or reverse:
        return
    if action != "post_clear" and not pk_set:
        return
    who = model._meta.label_lower
    record(
        Action.MCP_SERVER_CHANGE,
        target=instance,
        detail={"access": action.removeprefix("post_"), "of": who, "ids": sorted(pk_set or [])},
    )


def _group_saved(sender, instance: Group, created: bool, raw: bool = False, **kwargs) -> None:
    if not raw:
        record(Action.GROUP_CREATE if created else Action.GROUP_CHANGE, target=instance)


def _group_access_saved(sender, instance: GroupAccess, raw: bool = False, **kwargs) -> None:
    if raw:
        return
    fields = {f.name: getattr(instance, f.attname) for f in GroupAccess._meta.concrete_fields}
    for name in ("id", "group", "updated_at"):
        fields.pop(name, None)
    record(Action.GROUP_CHANGE, target=instance.group, detail={"access": fields})


def _group_access_deleted(sender, instance: GroupAccess, **kwargs) -> None:
    record(Action.GROUP_CHANGE, target=instance.group, detail={"access": "removed"})


def _quota_saved(sender, instance: TokenQuota, created: bool, raw: bool = False, **kwargs) -> None:
    if raw:
        return
    fields = {f.attname: getattr(instance, f.attname) for f in TokenQuota._meta.concrete_fields}
    for name in ("id", "updated_at"):
        fields.pop(name, None)
    record(Action.QUOTA_CHANGE, target=instance, detail={"created" if created else "changed": fields})


def _quota_deleted(sender, instance: TokenQuota, **kwargs) -> None:
    record(Action.QUOTA_CHANGE, target=instance, detail={"removed": True})


def _group_deleted(sender, instance: Group, **kwargs) -> None:
    record(Action.GROUP_DELETE, target=instance)


def _membership_changed(sender, instance, action: str, model, pk_set, reverse: bool, **kwargs) -> None:
    """``user.groups`` (or ``group.user_set``) changed: one entry per user."""
    if action not in ("post_add", "post_remove", "pre_clear"):
        return
    change = {"post_add": "added", "post_remove": "removed", "pre_clear": "removed"}[action]
    if reverse:  # from the group's side: pk_set holds users
        users = get_user_model().objects.filter(pk__in=pk_set or [])
        groups = [instance]
        if action == "pre_clear":
            users = instance.user_set.all()
    else:
        users = [instance]
        groups = (
            instance.groups.all()
            if action == "pre_clear"
            else list(Group.objects.filter(pk__in=pk_set or []))
        )
    for user in users:
        names = sorted(g.name for g in groups)
        if names:
            record(Action.GROUP_MEMBERSHIP, target=user, detail={change: names})


def _role_before(sender, instance, raw: bool = False, update_fields=None, **kwargs) -> None:
    """Keep the stored role flags, for ``_role_after`` to compare with (not read for saves
    that name their fields and none of these, such as each sign-in's ``last_login``)."""
    if update_fields is not None and not set(update_fields) & set(ROLE_FIELDS):
        instance._audit_roles = "untouched"
        return
    if raw or instance.pk is None:
        instance._audit_roles = None
        return
    stored = sender._default_manager.filter(pk=instance.pk).values(*ROLE_FIELDS).first()
    instance._audit_roles = stored


def _role_after(sender, instance, created: bool, raw: bool = False, **kwargs) -> None:
    if raw:
        return
    before = getattr(instance, "_audit_roles", None)
    if before == "untouched":
        return
    now = {name: getattr(instance, name) for name in ROLE_FIELDS}
    if created or before is None:
        changed = {k: v for k, v in now.items() if k != "is_active" and v}
    else:
        changed = {k: v for k, v in now.items() if before.get(k) != v}
    if changed:
        record(Action.ROLE_CHANGE, target=instance, detail=changed)


def connect() -> None:
    user_model = get_user_model()
    user_logged_in.connect(_signed_in, dispatch_uid="audit.sign_in")
    user_logged_out.connect(_signed_out, dispatch_uid="audit.sign_out")
    user_login_failed.connect(_sign_in_failed, dispatch_uid="audit.sign_in_failed")
    post_save.connect(_mcp_saved, sender=McpServer, dispatch_uid="audit.mcp_saved")
    post_delete.connect(_mcp_deleted, sender=McpServer, dispatch_uid="audit.mcp_deleted")
    m2m_changed.connect(_mcp_access_changed, sender=McpServer.users.through, dispatch_uid="audit.mcp_users")
    m2m_changed.connect(_mcp_access_changed, sender=McpServer.groups.through, dispatch_uid="audit.mcp_groups")
    post_save.connect(_group_saved, sender=Group, dispatch_uid="audit.group_saved")
    post_delete.connect(_group_deleted, sender=Group, dispatch_uid="audit.group_deleted")
    post_save.connect(_group_access_saved, sender=GroupAccess, dispatch_uid="audit.group_access_saved")
    post_save.connect(_quota_saved, sender=TokenQuota, dispatch_uid="audit.quota_saved")
    post_delete.connect(_quota_deleted, sender=TokenQuota, dispatch_uid="audit.quota_deleted")
    post_delete.connect(_group_access_deleted, sender=GroupAccess, dispatch_uid="audit.group_access_deleted")
    m2m_changed.connect(
        _membership_changed, sender=user_model.groups.through, dispatch_uid="audit.membership"
    )
    pre_save.connect(_role_before, sender=user_model, dispatch_uid="audit.role_before")
    post_save.connect(_role_after, sender=user_model, dispatch_uid="audit.role_after")
