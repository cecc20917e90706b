"""Templates: part of `jobs.services` (see its package docstring)."""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.db import IntegrityError, transaction

from jobs.models import Job, JobTemplate
from jobs.services.common import log
from jobs.services.submission import job_submit, job_validate
from jobs.services.transitions import event_record
from kernel.errors import Conflict, Forbidden, NotFound, ValidationFailed
from kernel.sentences import stored
from quotas import selectors as quota
from quotas.models import Team

TEMPLATE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,79}\Z")

TEMPLATE_LABEL = "template"


def _check_fields(data: dict[str, Any]) -> None:
    """The API's input serializer over a submission built here (a template, overrides): its first error as a 400."""
    from jobs.api import JobSubmitSerializer  # late: the API module imports this one

    payload = JobSubmitSerializer(data=data)
    if payload.is_valid():
        return
    field, problems = next(iter(payload.errors.items()))
    problem = problems[0] if isinstance(problems, list) else problems
    if isinstance(problem, dict):  # nested (env.NAME): the first leaf
        key, inner = next(iter(problem.items()))
        field, problem = f"{field}.{key}", inner[0] if isinstance(inner, list) else inner
    raise ValidationFailed(str(problem), code=getattr(problem, "code", "invalid"), field=field)


def _template_body(*, user, team: Team, body: Any) -> dict[str, Any]:
    """A template's body is checked as the submission it makes, so a broken template is refused when saved."""
    if not isinstance(body, dict):
        raise ValidationFailed("the template's job must be an object of submission fields", code="invalid", field="job")
    body = {k: v for k, v in body.items() if k not in ("team", "ci")}
    _check_fields({**body, "team": team.slug})
    job_validate(user=user, data={**body, "team": team.slug})
    return body


def _template_name(name: Any) -> str:
    name = str(name or "").strip()
    if not TEMPLATE_NAME.match(name):
        raise ValidationFailed(
            "a template name is 1-80 lower-case letters, digits, - or _, starting with a letter or digit",
            code="invalid_template_name",
            field="name",
        )
    return name


def _template_name_free(team: Team, name: str, *, exclude: int | None = None) -> None:
    taken = JobTemplate.objects.filter(team=team, name=name)
    if exclude is not None:
        taken = taken.exclude(pk=exclude)
    if taken.exists():
        raise Conflict(f"team {team.slug} already has a template named {name}", code="template_exists", field="name")


def template_create(*, user, team_slug: str, name: str, body: Any, description: str = "") -> JobTemplate:
    team = Team.objects.filter(slug=team_slug).first()
    if team is None or not quota.is_member(user, team):
        raise NotFound("team not found (or you are not a member)", code="unknown_team", field="team")
    name = _template_name(name)
    _template_name_free(team, name)
    body = _template_body(user=user, team=team, body=body)
    try:
        with transaction.atomic():
            template = JobTemplate.objects.create(
                team=team,
                name=name,
                description=(description or "")[:300],
                body=body,
                created_by=user,
                updated_by=user.username,
            )
    except IntegrityError:
        raise Conflict(f"team {team.slug} already has a template named {name}", code="template_exists", field="name")
    log.info("template_created", team=team.slug, template=name)
    return template


def may_edit_template(user, template: JobTemplate) -> bool:
    return template.created_by_id == user.id or quota.is_maintainer(user, template.team)


def _editable(user, template_id: int) -> JobTemplate:
    template = JobTemplate.objects.select_for_update().select_related("team").filter(pk=template_id).first()
    if template is None or not quota.is_member(user, template.team):
        raise NotFound("template not found", code="not_found")
    if not may_edit_template(user, template):
        raise Forbidden(
            "only the template's author and the team's maintainers may change it", code="template_not_yours"
        )
    return template


def template_update(
    *, user, template_id: int, name: str | None = None, body: Any = None, description: str | None = None
) -> JobTemplate:
    template = _editable(user, template_id)
    if name is not None:
        template.name = _template_name(name)
        _template_name_free(template.team, template.name, exclude=template.pk)
    if body is not None:
        template.body = _template_body(user=user, team=template.team, body=body)
    if description is not None:
        template.description = description[:300]
    template.updated_by = user.username
    template.save()
    log.info("template_updated", team=template.team.slug, template=template.name)
    return template


def template_delete(*, user, template_id: int) -> None:
    template = _editable(user, template_id)
    log.info("template_deleted", team=template.team.slug, template=template.name)
    template.delete()


def template_submit(
    *,
    user,
    template_id: int,
    overrides: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
    job_id: uuid.UUID | None = None,
) -> tuple[Job, bool]:
    """A job from a template: the template's fields, then `overrides` (env and labels merge key by key; anything
    else replaces); the job gets the label template=<name> so a template's runs can be found and compared."""
    template = JobTemplate.objects.select_related("team").filter(pk=template_id).first()
    if template is None or not quota.is_member(user, template.team):
        raise NotFound("template not found", code="not_found")
    overrides = dict(overrides or {})
    if "team" in overrides and overrides["team"] != template.team.slug:
        raise ValidationFailed(
            f"template {template.name} belongs to team {template.team.slug}",
            code="template_team_mismatch",
            field="team",
        )
    data = {**template.body}
    for key, value in overrides.items():
        if key in ("env", "labels") and isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    data["team"] = template.team.slug
    data["labels"] = {TEMPLATE_LABEL: template.name, **(data.get("labels") or {})}
    _check_fields(data)
    job, created = job_submit(user=user, data=data, idempotency_key=idempotency_key, job_id=job_id)
    if created:
        event_record(
            job,
            "submitted_from_template",
            actor=user.username,
            message=stored("submitted from template %(template)s", template=template.name),
            data={"template": template.name, "template_id": template.pk},
        )
    return job, created
