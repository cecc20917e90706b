"""Writes for teams and queues: quota changes (audited), membership management."""

from django.contrib.auth import get_user_model
from django.db import transaction

from kernel.errors import NotFound, ValidationFailed
from kernel.watch import watch_validate
from quotas import signals
from quotas.models import Membership, Queue, QuotaChange, Team
from quotas.selectors import VECTOR_FIELDS

TEAM_QUOTA_FIELDS = (
    *VECTOR_FIELDS,
    "max_running_jobs",
    "max_jobs_per_user",
    "storage_quota_bytes",
    "checkpoint_keep_last",
    "checkpoint_retention_days",
)
QUEUE_FIELDS = (*VECTOR_FIELDS, "state", "priority", "weight", "ordering", "max_timeout_s", "default_timeout_s")


def _apply(obj, changes: dict, allowed: tuple[str, ...], actor, **owner) -> list[str]:
    changed = []
    for name, value in changes.items():
        if name not in allowed:
            raise ValidationFailed(f"'{name}' cannot be changed here", code="unknown_field", field=name)
        old = getattr(obj, name)
        if old != value:
            setattr(obj, name, value)
            QuotaChange.objects.create(actor=actor, field=name, old_value=str(old), new_value=str(value), **owner)
            changed.append(name)
    return changed


def team_quota_update(*, team: Team, changes: dict, actor) -> Team:
    """Change a team's quota; takes effect at the next dispatch (no restart), audited field by field."""
    with transaction.atomic():
        team = Team.objects.select_for_update().get(pk=team.pk)
        if _apply(team, changes, TEAM_QUOTA_FIELDS, actor, team=team):
            team.save()
            _redispatch_all()
            team_announce(team=team)
    return team


def team_watch_set(*, team: Team, watch, actor) -> Team:
    """Replace the texts watched in every job of the team (running jobs' next log lines included); audited."""
    value = watch_validate(watch)
    with transaction.atomic():
        team = Team.objects.select_for_update().get(pk=team.pk)
        if _apply(team, {"watch": value}, ("watch",), actor, team=team):
            team.save(update_fields=["watch"])
    return team


def team_announce(*, team: Team) -> None:
    """Tell the apps above that a team was created or changed (its namespace, its quota): on the Volcano backend
    its Kubernetes namespace is created or updated once the transaction commits."""
    signals.team_changed.send(sender=Team, team=team)


def queue_update(*, queue: Queue, changes: dict, actor) -> Queue:
    with transaction.atomic():
        queue = Queue.objects.select_for_update().get(pk=queue.pk)
        if _apply(queue, changes, QUEUE_FIELDS, actor, queue=queue):
            if queue.default_timeout_s > queue.max_timeout_s:
                raise ValidationFailed(
                    "default timeout exceeds the maximum", code="invalid_timeout", field="default_timeout_s"
                )
            queue.save()
            _redispatch_all()
            signals.queue_changed.send(sender=Queue, queue=queue)
    return queue


def _redispatch_all() -> None:
    def send() -> None:
        from kernel.wake import dispatch_soon

        dispatch_soon()

    transaction.on_commit(send)


def membership_set(*, team: Team, username: str, role: str) -> Membership:
    if role not in Membership.Role.values:
        raise ValidationFailed("role must be member or maintainer", code="invalid_role", field="role")
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise ValidationFailed(f"no user '{username}'", code="unknown_user", field="username")
    membership, _ = Membership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    return membership


def membership_remove(*, team: Team, username: str) -> None:
    deleted, _ = Membership.objects.filter(team=team, user__username=username).delete()
    if not deleted:
        raise NotFound(f"{username} is not a member", code="unknown_member")
