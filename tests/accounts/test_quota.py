"""Token quotas in one process (the counters in memory, as a site without Redis keeps them):
a user's and their groups' budgets, the atomic admission, the engine's gate, the cached-token
discount, and the chat's refusal. The two-process test is ``test_quota_cluster``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Group

from conversations.accounts import quota
from conversations.chat import tree as tree_ops
from conversations.chat.queries import check_quota
from conversations.models import TokenQuota
from tests.support.quota_counters import forget_counters

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_counters():
    forget_counters()
    yield
    forget_counters()


def test_periods_reset_at_the_next_utc_day_and_month():
    now = datetime(2026, 12, 31, 15, 30, tzinfo=UTC)
    assert quota.period_bounds("day", now) == ("20261231", datetime(2027, 1, 1, tzinfo=UTC))
    assert quota.period_bounds("month", now) == ("202612", datetime(2027, 1, 1, tzinfo=UTC))


def test_a_users_and_their_groups_budgets_all_bound_them(make_user):
    user, other = make_user("ivy"), make_user("jon")
    group = Group.objects.create(name="lab")
    user.groups.add(group)
    other.groups.add(group)
    TokenQuota.objects.create(user=user, completion_tokens_per_day=100)
    TokenQuota.objects.create(group=group, completion_tokens_per_month=150, prompt_tokens_per_day=1000)
    gate = quota.admit(user.pk, 10)
    assert gate is not None and len(gate.plan.completion) == 2
    assert gate.charge(90) is True
    assert gate.charge(10) is False and gate.exhausted.subject == "you"  # the user's 100 a day
    # The group's budget is shared: jon's answers count against what is left of it.
    jon = quota.admit(other.pk, 10)
    assert jon.charge(49) is True and jon.charge(1) is False
    assert jon.exhausted.subject == "lab"
    with pytest.raises(quota.Exhausted, match="The group lab's monthly completion-token quota"):
        quota.admit(other.pk, 0)


def test_a_prompt_that_would_overrun_its_budget_is_refused_and_not_counted(make_user):
    user = make_user("kim")
    TokenQuota.objects.create(user=user, prompt_tokens_per_day=100, cached_prompt_discount=0.5)
    gate = quota.admit(user.pk, 80)
    with pytest.raises(quota.Exhausted) as refused:
        quota.admit(user.pk, 30)
    assert refused.value.retry_after > 0 and "resets at" in str(refused.value)
    quota.settle_cached(gate, 40)  # half of the 40 cached tokens given back: 60 used
    assert quota.admit(user.pk, 40) is not None
    assert [used for _, used in quota.usage_of(user.pk)] == [100]


def test_without_quotas_there_is_no_gate(make_user):
    assert quota.admit(make_user("lee").pk, 10**9) is None


def test_the_chat_refuses_before_creating_anything_with_what_ran_out(make_user):
    user = make_user("max")
    TokenQuota.objects.create(user=user, completion_tokens_per_day=5)
    check_quota(user.pk)  # under budget: nothing to say
    quota.admit(user.pk, 0).charge(5)
    with pytest.raises(
        tree_ops.QuotaExhausted, match="Your daily completion-token quota .5 tokens. has run out"
    ):
        check_quota(user.pk)
