"""Portal page views: they call the same selectors and services as the API, and render templates.

Reads go through `jobs.selectors` / `quotas.selectors` (so a user sees exactly what the API shows them),
writes through `jobs.services` inside one durable transaction, like the API's actions.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.handlers.asgi import ASGIRequest
from django.db import transaction
from django.db.models import Count, Max, Prefetch, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from cluster.inventory import node_pool
from cluster.models import GPU, LogicalDevice, Node
from cluster.services import driver_satisfies
from frontend import wording
from frontend.forms import CUSTOM_IMAGE, SubmitForm, initial_from_submission
from frontend.templatetags import portal
from images import selectors as image_selectors
from images import services as image_services
from images.models import BaseImage, ProjectImage
from jobs import logstore, selectors, services
from jobs.api import JobFilter, submission_check
from jobs.backends import sandbox
from jobs.lifecycle import backend_runtime
from jobs.models import FailureRule, Job, JobTemplate
from jobs.states import JobState
from monitoring.charts import PALETTE, Series, line_chart
from monitoring.models import Alert
from monitoring.selectors import compare_metrics
from quotas import selectors as quota
from quotas import tokens
from quotas.models import TOKEN_SCOPES, ApiToken, Queue, ResourceSpec
from trainyard.errors import Conflict, DomainError, NotFound, ValidationFailed
from trainyard.sentences import said

JOBS_PER_PAGE = 50
LOG_TAIL = 1000
LOG_DOWNLOAD_PAGE = 5000
MAX_POLLED_JOBS = 100


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return redirect("frontend:job-list")


# ------------------------------------------------------------------------------------------------ job list


def _cursor(job: Job) -> str:
    return f"{job.submitted_at.isoformat()}~{job.id}"


def _parse_cursor(raw: str | None) -> tuple[datetime, uuid.UUID] | None:
    if not raw:
        return None
    stamp, _sep, ident = raw.partition("~")
    try:
        return datetime.fromisoformat(stamp), uuid.UUID(ident)
    except ValueError:
        return None


def _keyset_page(qs: QuerySet[Job], *, before: str | None, after: str | None, size: int):
    """One page, newest first, by (submitted_at, id) keys: never OFFSET, so deep pages cost the same."""
    older_than = _parse_cursor(before)
    newer_than = _parse_cursor(after) if older_than is None else None
    if newer_than is not None:
        stamp, ident = newer_than
        rows = list(
            qs.filter(Q(submitted_at__gt=stamp) | Q(submitted_at=stamp, id__gt=ident)).order_by("submitted_at", "id")[
                : size + 1
            ]
        )
        has_newer = len(rows) > size
        rows = list(reversed(rows[:size]))
        has_older = True
    else:
        if older_than is not None:
            stamp, ident = older_than
            qs = qs.filter(Q(submitted_at__lt=stamp) | Q(submitted_at=stamp, id__lt=ident))
        rows = list(qs.order_by("-submitted_at", "-id")[: size + 1])
        has_older = len(rows) > size
        rows = rows[:size]
        has_newer = older_than is not None
    older = _cursor(rows[-1]) if rows and has_older else None
    newer = _cursor(rows[0]) if rows and has_newer else None
    return rows, newer, older


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    params = request.GET.copy()
    mine = params.get("mine") == "1"
    if mine:
        params["owner"] = request.user.username
    # The API's FilterSet, so the page filters exactly like GET /api/v1/jobs/.
    filterset = JobFilter(params, queryset=selectors.jobs_visible_to(request.user))
    error = ""
    try:
        qs = filterset.qs if filterset.is_valid() else Job.objects.none()
        if not filterset.is_valid():
            error = _("Some filters are not valid: %(fields)s") % {"fields": ", ".join(filterset.errors)}
    except ValidationFailed as exc:
        qs, error = Job.objects.none(), exc.detail
    jobs, newer, older = _keyset_page(
        qs, before=request.GET.get("before"), after=request.GET.get("after"), size=JOBS_PER_PAGE
    )
    base = {k: v for k, v in request.GET.items() if k not in {"before", "after"} and v}
    return render(
        request,
        "frontend/job_list.html",
        {
            "nav": "jobs",
            "jobs": jobs,
            "error": error,
            "mine": mine,
            "filters": {
                "state": request.GET.get("state", ""),
                "queue": request.GET.get("queue", ""),
                "team": request.GET.get("team", ""),
            },
            "states": [(s, wording.state_label(s)) for s in JobState.values],
            "teams": quota.visible_teams(request.user).order_by("name"),
            "queues": Queue.objects.order_by("name"),
            "newer_url": "?" + urlencode({**base, "after": newer}) if newer else "",
            "older_url": "?" + urlencode({**base, "before": older}) if older else "",
            "first_url": "?" + urlencode(base) if newer else "",
            "states_url": reverse("frontend:job-states"),
            # Here, not in the template: {% translate %} would look the text up with its % doubled.
            "bulk_confirm": _(
                "Cancel the %(count)s selected jobs? Their processes are stopped and their GPUs freed; "
                "this cannot be undone."
            ),
        },
    )


@login_required
def job_states(request: HttpRequest) -> JsonResponse:
    """The live part of the job list: state, reason and position of up to 100 jobs the user may see."""
    ids = []
    for raw in request.GET.getlist("id")[:MAX_POLLED_JOBS]:
        try:
            ids.append(uuid.UUID(raw))
        except ValueError:
            continue
    rows = selectors.jobs_visible_to(request.user).filter(id__in=ids).values("id", "state", "reason", "queue_position")
    return JsonResponse(
        {
            "jobs": {
                str(r["id"]): {
                    "state": r["state"],
                    "label": wording.state_label(r["state"]),
                    "reason": wording.reason_sentence(r["reason"]) if r["state"] == JobState.PENDING else "",
                    "position": r["queue_position"],
                    "terminal": wording.is_terminal(r["state"]),
                }
                for r in rows
            }
        }
    )


# ------------------------------------------------------------------------------------------------ submit


def _card_mib() -> int:
    return services._reference_card_mib()


def _backend_runtime() -> dict[str, Any]:
    """What the configured backend runs a command with (the local backend: the host's Python and PATH)."""
    return backend_runtime(settings.TRAINYARD_BACKEND)


def _submit_choices(user) -> dict[str, Any]:
    """Everything the pickers show: queues with their waits, specs with what they guarantee and cost, images
    with the nodes whose drivers can run them."""
    teams = list(quota.visible_teams(user).order_by("name"))
    queues = list(Queue.objects.prefetch_related("specs", "teams").order_by("-priority", "name"))
    queue_rows = []
    for queue in queues:
        waiting = selectors.waiting_line(queue)
        waits = selectors.estimated_waits(queue, waiting)
        queue_rows.append(
            {
                "queue": queue,
                "waiting": len(waiting),
                "line_clears": selectors.line_clears(waiting, waits),
                "specs": " ".join(s.name for s in queue.specs.all()),
                "teams": " ".join(t.slug for t in queue.teams.all()),
            }
        )
    card_mib = _card_mib()
    spec_rows = []
    for spec in ResourceSpec.objects.filter(enabled=True):
        spec_rows.append(
            {
                "spec": spec,
                "card_mib": card_mib,
                "gpu_memory_mib": card_mib * spec.gpu_memory_eighths // 8,
                "share_pct": spec.gpu_milli // 10,
                "queues": " ".join(q.name for q in queues if spec in q.specs.all()),
            }
        )
    nodes = list(Node.objects.exclude(state=Node.State.UNHEALTHY).values_list("name", "driver_version"))
    images = []
    team_ids = [t.id for t in teams]
    catalog: list[BaseImage | ProjectImage] = [
        *BaseImage.objects.all(),
        *ProjectImage.objects.filter(team_id__in=team_ids).select_related("base", "team"),
    ]
    for image in catalog:
        minimum = image.min_driver_version or (image.base.min_driver_version if isinstance(image, ProjectImage) else "")
        runs_on = [name for name, driver in nodes if driver_satisfies(driver, minimum)]
        images.append(
            {
                "image": image,
                "value": image.name,
                "min_driver": minimum,
                "runs_on": runs_on,
                "usable": bool(runs_on) or not nodes,
                "team": image.team.slug if isinstance(image, ProjectImage) else "",
            }
        )
    gpu_models = [
        {"model": r["model"], "cards": r["cards"], "memory_gib": r["memory"] // 1024}
        for r in GPU.objects.filter(node__state=Node.State.READY)
        .values("model")
        .annotate(cards=Count("id"), memory=Max("memory_mib"))
        .order_by("model")
    ]
    return {
        "runtime": _backend_runtime(),
        "teams": teams,
        "gpu_models": gpu_models,
        "queue_rows": queue_rows,
        "spec_rows": spec_rows,
        "images": images,
        "node_count": len(nodes),
        "custom_image": CUSTOM_IMAGE,
    }


def _serializer_errors(form: SubmitForm, errors: dict) -> None:
    for field, problems in errors.items():
        for problem in problems if isinstance(problems, list) else [problems]:
            form.add_service_error(field, str(problem), getattr(problem, "code", "invalid"))


def _prefill(request: HttpRequest, choices: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """`?from=<job>` (run again with changes) or `?template=<id>`: the form filled from it, and what it came from."""
    catalog = {row["value"] for row in choices["images"]}
    if request.GET.get("from"):
        try:
            job = _visible_job(request, uuid.UUID(request.GET["from"]))
        except ValueError:
            raise Http404("no such job")
        return initial_from_submission(services.job_submission_data(job), catalog=catalog), {"job": job}
    if request.GET.get("template"):
        template = _visible_template(request, request.GET["template"])
        # The label the API's template submit adds, here in the labels field where the user sees it.
        labels = {services.TEMPLATE_LABEL: template.name, **(template.body.get("labels") or {})}
        body = {**template.body, "team": template.team.slug, "labels": labels}
        return initial_from_submission(body, catalog=catalog), {"template": template}
    return None, {}


def _visible_template(request: HttpRequest, template_id) -> JobTemplate:
    if not str(template_id).isdigit() or len(str(template_id)) > 9:
        raise Http404("no such template")
    teams = quota.visible_teams(request.user)
    return get_object_or_404(JobTemplate.objects.select_related("team", "created_by"), pk=template_id, team__in=teams)


def _render_form(request: HttpRequest, form: SubmitForm, choices: dict[str, Any], **extra) -> HttpResponse:
    return render(
        request,
        "frontend/job_submit.html",
        {
            "nav": "submit",
            "form": form,
            "errors": form.errors_with_codes() if form.is_bound else {},
            **choices,
            **extra,
        },
        status=400 if form.is_bound else 200,
    )


@login_required
def job_submit(request: HttpRequest) -> HttpResponse:
    choices = _submit_choices(request.user)
    models = [r["model"] for r in choices["gpu_models"]]
    source: dict[str, Any] = {}
    if request.method == "POST":
        form = SubmitForm(request.POST, gpu_models=models)
        valid = form.is_valid()
        if "save_template" in request.POST:
            template = _save_template(request, form) if valid else None
            if template is not None:
                messages.success(request, _("Saved template %(name)s.") % {"name": template.name})
                return redirect(reverse("frontend:template-list") + f"#template-{template.pk}")
        else:
            # Every problem at once: the service judges what the form could read even when another field failed.
            job = _submit(request, form, form_valid=valid)
            if job is not None:
                messages.success(request, _("Job submitted."))
                advice = _recommendation_message(job)
                if advice:
                    messages.info(request, advice)
                return redirect("frontend:job-detail", job_id=job.id)
    else:
        initial, source = _prefill(request, choices)
        if initial is None:
            initial = _submit_defaults(request, choices)
        initial["idempotency_key"] = uuid.uuid4().hex
        form = SubmitForm(initial=initial, gpu_models=models)
    return _render_form(request, form, choices, source=source, mode="submit")


def _template_error(form: SubmitForm, exc: DomainError) -> None:
    if exc.code in ("invalid_template_name", "template_exists"):
        form.add_error("template_name", ValidationError(said(exc.detail), code=exc.code))
    else:
        form.add_service_error(exc.field, exc.detail, exc.code)


def _save_template(request: HttpRequest, form: SubmitForm) -> JobTemplate | None:
    body = form.submission()
    team = body.pop("team")
    try:
        with transaction.atomic(durable=True):
            return services.template_create(
                user=request.user,
                team_slug=team,
                name=form.cleaned_data["template_name"],
                body=body,
                description=form.cleaned_data["template_description"],
            )
    except DomainError as exc:
        _template_error(form, exc)
        return None


@login_required
def template_list(request: HttpRequest) -> HttpResponse:
    teams = list(quota.visible_teams(request.user).order_by("name"))
    templates = list(
        JobTemplate.objects.filter(team__in=teams).select_related("team", "created_by").order_by("team__name", "name")
    )
    for template in templates:
        template.editable = services.may_edit_template(request.user, template)
        body = template.body
        command = body.get("command") or []
        template.command_line = shlex.join(map(str, command)) if isinstance(command, list) else str(command)
    return render(request, "frontend/template_list.html", {"nav": "templates", "templates": templates, "teams": teams})


@login_required
def template_edit(request: HttpRequest, template_id: int) -> HttpResponse:
    template = _visible_template(request, template_id)
    if not services.may_edit_template(request.user, template):
        raise Http404("only the template's author and the team's maintainers may edit it")
    choices = _submit_choices(request.user)
    choices["teams"] = [template.team]  # a template stays in its team
    models = [r["model"] for r in choices["gpu_models"]]
    if request.method == "POST":
        form = SubmitForm(request.POST, gpu_models=models)
        if form.is_valid():
            body = form.submission()
            body.pop("team")
            try:
                with transaction.atomic(durable=True):
                    services.template_update(
                        user=request.user,
                        template_id=template.pk,
                        name=form.cleaned_data["template_name"],
                        body=body,
                        description=form.cleaned_data["template_description"],
                    )
            except DomainError as exc:
                _template_error(form, exc)
            else:
                messages.success(request, _("Saved template %(name)s.") % {"name": form.cleaned_data["template_name"]})
                return redirect(reverse("frontend:template-list") + f"#template-{template.pk}")
    else:
        catalog = {row["value"] for row in choices["images"]}
        initial = initial_from_submission({**template.body, "team": template.team.slug}, catalog=catalog)
        initial.update(template_name=template.name, template_description=template.description)
        form = SubmitForm(initial=initial, gpu_models=models)
    return _render_form(request, form, choices, mode="edit_template", template=template, source={}, nav="templates")


@login_required
def template_delete(request: HttpRequest, template_id: int) -> HttpResponse:
    """GET asks for confirmation, POST deletes."""
    template = _visible_template(request, template_id)
    if not services.may_edit_template(request.user, template):
        raise Http404("only the template's author and the team's maintainers may delete it")
    if request.method == "POST":
        with transaction.atomic(durable=True):
            services.template_delete(user=request.user, template_id=template.pk)
        messages.success(request, _("Deleted template %(name)s.") % {"name": template.name})
        return redirect("frontend:template-list")
    return render(request, "frontend/template_delete.html", {"nav": "templates", "template": template})


def _submit(request: HttpRequest, form: SubmitForm, *, form_valid: bool) -> Job | None:
    """Validate as the API does (input serializer, then the service), reporting every problem at once; errors
    land on the form's fields. A field the form itself could not read is judged only by the form."""
    data = form.submission()
    try:
        submission_check(user=request.user, data=data)
        if not form_valid:
            services.job_validate(user=request.user, data=data)
    except NotFound as exc:
        form.add_service_error(exc.field or "team", exc.detail, exc.code)
        return None
    except DomainError as exc:  # a 400 of any field, or a registry that cannot pin the image now
        form.add_service_errors(getattr(exc, "errors", None) or [exc])
        return None
    if not form_valid:
        return None
    key = form.cleaned_data.get("idempotency_key") or None
    try:
        try:
            with transaction.atomic(durable=True):
                job, _created = services.job_submit(user=request.user, data=data, idempotency_key=key)
        except Conflict as exc:
            if exc.code != "idempotency_key_reused":
                raise
            # The same form sent again with changes (back button): a new request, with its own key for double clicks.
            key = f"{key}:{services.request_fingerprint(data)[:16]}"
            with transaction.atomic(durable=True):
                job, _created = services.job_submit(user=request.user, data=data, idempotency_key=key)
    except NotFound as exc:
        form.add_service_error(exc.field or "team", exc.detail, exc.code)
        return None
    except DomainError as exc:
        form.add_service_errors(getattr(exc, "errors", None) or [exc])
        return None
    return job


def _submit_defaults(request: HttpRequest, choices: dict[str, Any]) -> dict[str, Any]:
    team = request.GET.get("team") or (choices["teams"][0].slug if choices["teams"] else "")
    queues = [row["queue"] for row in choices["queue_rows"] if team in row["teams"].split()]
    queue = request.GET.get("queue") or (queues[0].name if queues else "")
    specs = next((row["specs"].split() for row in choices["queue_rows"] if row["queue"].name == queue), [])
    image = next((row["value"] for row in choices["images"] if row["usable"]), "")
    return {
        "team": team,
        "queue": queue,
        "spec": specs[-1] if specs else "",
        "image": image,
        "max_retries": "2",
    }


# ------------------------------------------------------------------------------------------------ job page


def _visible_job(request: HttpRequest, job_id) -> Job:
    return get_object_or_404(selectors.jobs_visible_to(request.user), pk=job_id)


def _live_context(job: Job) -> dict[str, Any]:
    attempts = list(job.attempts.select_related("node").order_by("number"))
    events = list(job.events.select_related("attempt").order_by("at", "id"))
    rules = {a.rule for a in attempts if a.rule}
    suggestions = dict(FailureRule.objects.filter(name__in=rules).values_list("name", "suggestion")) if rules else {}
    wait = None
    if job.state == JobState.PENDING:
        wait = selectors.estimated_start(job)
    recorded = (job.reproduce or {}).get("runtime")
    return {
        "job": job,
        # What ran (from the reproduce record), or what will run for a job that has not started.
        "runtime": recorded or _backend_runtime(),
        "runtime_recorded": bool(recorded),
        "attempts": attempts,
        "events": events,
        "suggestions": suggestions,
        "wait": wait,
        "terminal": job.is_terminal,
        "reason_text": wording.reason_sentence(job.reason),
        # Each fact once: the suggestion has its own line, so the message does not repeat it.
        "message_text": _without(job.message, job.suggestion),
        "reproduce_rows": _reproduce_rows(job),
        "env_rows": sorted(job.env.items()),
        "command_line": shlex.join([*job.command, *job.args]),
    }


def _without(message: str, repeated: str) -> str:
    if not repeated or repeated not in message:
        return message
    return message.replace(repeated, "").strip().rstrip(".").strip()


def _reproduce_rows(job: Job) -> list[tuple[str, Any]]:
    record = job.reproduce or {}
    if not record:
        return []
    devices = (record.get("placement") or {}).get("devices", [])
    placement = "; ".join(
        f"{d.get('node')}/gpu{d.get('gpu_index')} {d.get('model', '')} "
        f"{d.get('compute_milli')}m {d.get('memory_mib')} MiB{' exclusive' if d.get('exclusive') else ''}"
        for d in devices
    )
    request = record.get("request") or {}
    runtime = record.get("runtime") or {}
    requested = record.get("image_requested") or {}
    if record.get("image_used", True):
        image_rows: list[tuple[str, Any]] = [
            (_("Image"), record.get("image_reference")),
            (_("Image digest"), record.get("image_digest") or _("not pinned")),
        ]
    else:
        image_rows = [
            (_("Image"), _("not used: the local backend ran the command on the host")),
            (
                _("Image requested"),
                " ".join([requested.get("reference") or "", requested.get("digest") or str(_("(digest unresolved)"))]),
            ),
            (_("Python"), f"{runtime.get('python_version', '')} {runtime.get('python', '')}".strip()),
            ("PATH", runtime.get("path")),
            (_("Sandbox"), _("on") if runtime.get("sandbox") else _("off")),
        ]
    rows: list[tuple[str, Any]] = [
        *image_rows,
        (_("Spec"), record.get("spec") or _("explicit request")),
        (_("Request"), ", ".join(f"{k}={v}" for k, v in request.items())),
        (_("Node"), record.get("node")),
        (_("NVIDIA driver"), record.get("driver_version")),
        (_("CUDA"), record.get("cuda_version")),
        (_("GPUs emulated"), _("yes") if record.get("emulated_gpus") else _("no")),
        (_("Placement"), placement),
        (_("Working directory"), record.get("working_dir")),
        (_("Backend"), record.get("backend")),
        (_("Platform version"), record.get("platform_version")),
        (_("Attempt"), record.get("attempt")),
    ]
    for key, value in sorted((record.get("ci") or {}).items()):
        rows.append((f"CI {key}", value))
    return rows


def _log_strings() -> dict[str, str]:
    """What the log panel script says, translated here so the script holds no text of its own."""
    return {
        "connecting": _("Connecting…"),
        "live": _("Live"),
        "reconnecting": _("Connection lost; reconnecting…"),
        "paused": _("Paused"),
        "ended": _("This attempt's log is complete."),
        "forbidden": _("You may not follow this job's log."),
        "dropped": _("%(count)s earlier lines were dropped by the log budget; kept lines start at %(first)s."),
        "trimmed": _("Older lines left the panel (it keeps the last %(max)s); use Download for the whole log."),
        "new_attempt": _("Attempt %(attempt)s started."),
        "hits": _("%(count)s hits"),
        "no_hits": _("No hits."),
        "search_failed": _("Search failed: %(detail)s"),
        "tb_active": _("Open TensorBoard"),
        "tb_inactive": _("TensorBoard is not running (it starts with the job and stops after it ends)."),
        "tb_missing": _("TensorBoard routes are not available on this platform yet."),
        "tb_signed": _("Shareable link (expires %(expires)s)"),
        "pause": _("Pause"),
        "resume": _("Resume"),
    }


@login_required
def job_detail(request: HttpRequest, job_id) -> HttpResponse:
    job = _visible_job(request, job_id)
    context = _live_context(job)
    attempts = context["attempts"]
    latest = attempts[-1].number if attempts else 1
    return render(
        request,
        "frontend/job_detail.html",
        {
            **context,
            "nav": "jobs",
            "latest_attempt": latest,
            "log_tail": LOG_TAIL,
            "log_strings": _log_strings(),
            "reproduces": job.reproduced_from_id
            and selectors.jobs_visible_to(request.user).filter(pk=job.reproduced_from_id).exists(),
            "unsandboxed": settings.TRAINYARD_BACKEND == "local" and not sandbox.enabled(),
            **_checkpoint_context(job),
            **_usage_context(job),
        },
    )


def _recommendation_message(job: Job) -> str:
    """The submission's right-sizing advice as a one-line notice (the request itself is never changed)."""
    from monitoring.selectors import recommendation_for

    rec = recommendation_for(job)
    if not rec or rec["fits_request"]:
        return ""
    return _(
        "Earlier runs like this one (%(evidence)s) suggest spec %(spec)s with %(gpus)s GPU(s), freeing "
        "%(milli)s GPU milli of quota. Your request was submitted as asked; see Resource use below."
    ) % {
        "evidence": portal.evidence(rec),
        "spec": rec["spec"] or "explicit",
        "gpus": rec["gpu_count"],
        "milli": rec["saves"]["gpu_milli"],
    }


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


def _usage_context(job: Job) -> dict[str, Any]:
    """The job page's usage section: the latest attempt's profile as bars against the request and charts over
    time, the idle notice, and what earlier runs like it recommend (docs/rightsizing.md)."""
    from frontend.templatetags.portal import usage_bar
    from monitoring.selectors import recommendation_for, usage_of

    profiles = usage_of(job)
    profile = profiles[-1] if profiles else None
    bars, charts = [], []
    if profile is not None and profile.samples:
        if profile.gpu_memory_peak_mib is not None:
            bars.append(
                usage_bar(
                    round(profile.gpu_memory_peak_mib),
                    job.gpu_memory_mib,
                    _("GPU memory (peak, per card)"),
                    _gib(profile.gpu_memory_peak_mib),
                    _gib(job.gpu_memory_mib),
                )
            )
        if profile.gpu_util_p95_pct is not None:
            share = job.gpu_milli / 10
            bars.append(
                usage_bar(
                    round(profile.gpu_util_p95_pct),
                    round(share),
                    _("GPU utilization (p95, per card)"),
                    f"{profile.gpu_util_p95_pct:.0f}%",
                    f"{share:.0f}%",
                )
            )
        if profile.cpu_peak_milli is not None:
            bars.append(
                usage_bar(
                    round(profile.cpu_peak_milli),
                    job.cpu_milli,
                    _("CPU (peak)"),
                    f"{profile.cpu_peak_milli / 1000:.2f}",
                    f"{job.cpu_milli / 1000:g}",
                )
            )
        if profile.host_memory_peak_mib is not None:
            bars.append(
                usage_bar(
                    round(profile.host_memory_peak_mib),
                    job.memory_mib,
                    _("Host memory (peak)"),
                    _gib(profile.host_memory_peak_mib),
                    _gib(job.memory_mib),
                )
            )
        series = profile.series
        memory = [(p[0], p[1]) for p in series if p[1] is not None]
        util = [(p[0], p[2]) for p in series if p[2] is not None]
        rss = [(p[0], p[4]) for p in series if p[4] is not None]
        if memory:
            charts.append(
                line_chart(
                    _("GPU memory, MiB (line: requested)"),
                    [Series(_("GPU memory"), memory)],
                    unit="MiB",
                    threshold=job.gpu_memory_mib,
                )
            )
        if util:
            charts.append(
                line_chart(
                    _("GPU utilization, % (line: idle threshold)"),
                    [Series(_("GPU utilization"), util)],
                    unit="%",
                    y_max=100,
                    threshold=job.queue.idle_threshold_pct or None,
                )
            )
        if rss:
            charts.append(
                line_chart(
                    _("Host memory, MiB (line: requested)"),
                    [Series(_("Host memory"), rss)],
                    unit="MiB",
                    threshold=job.memory_mib,
                )
            )
    idle = profile if profile is not None and profile.idle_flagged_at and not profile.final else None
    recommendation = recommendation_for(job)
    waits = []
    if recommendation and not recommendation["fits_request"]:
        from jobs.eta import Estimate

        for w in recommendation["expected_waits"]:
            estimate = Estimate(low=w["low_s"], mid=w["mid_s"], high=w["high_s"], known=w["known"])
            waits.append((w["queue"], estimate))
    return {
        "usage_profile": profile,
        "usage_bars": bars,
        "usage_charts": charts,
        "usage_idle": idle,
        "recommendation": recommendation,
        "recommendation_waits": waits,
    }


CHECKPOINT_WARNINGS = ("checkpoint_unsaved", "checkpoint_sync_failing", "checkpoint_upload_waiting")


def _checkpoint_context(job: Job) -> dict[str, Any]:
    """The job page's checkpoint section: what is saved, and what could not be (or waits to be)."""
    from django.db.models import F

    rows = list(
        job.checkpoints.filter(deleted_at__isnull=True)
        .select_related("attempt")
        .order_by(F("step").desc(nulls_last=True), "-saved_at", "-id")
    )
    warnings = list(job.events.filter(kind__in=CHECKPOINT_WARNINGS).select_related("attempt").order_by("at", "id"))
    return {"checkpoints": rows, "checkpoint_warnings": warnings}


@login_required
def job_live(request: HttpRequest, job_id) -> HttpResponse:
    """The parts of the job page that change with its state (header, timeline, attempts, reproduce record)."""
    job = _visible_job(request, job_id)
    return render(request, "frontend/_job_live.html", _live_context(job))


@login_required
def job_cancel(request: HttpRequest, job_id) -> HttpResponse:
    """POST with `confirmed` cancels; anything else asks first, on a page of its own (the page's script asks in a
    dialog and sends `confirmed` itself, so this page is what a browser without JavaScript shows)."""
    job = _visible_job(request, job_id)
    if request.method == "POST" and request.POST.get("confirmed"):
        try:
            with transaction.atomic(durable=True):
                job = services.job_cancel(job_id=job.id, actor=request.user.username)
        except DomainError as exc:
            messages.error(request, _("Cannot cancel: %(detail)s") % {"detail": said(exc.detail)})
        else:
            messages.success(request, _("Cancel requested.") if job.state == JobState.CANCELLING else _("Cancelled."))
        return redirect("frontend:job-detail", job_id=job.id)
    if job.is_terminal or job.state == JobState.CANCELLING:
        messages.error(
            request, _("Cannot cancel: the job is already %(state)s.") % {"state": wording.state_label(job.state)}
        )
        return redirect("frontend:job-detail", job_id=job.id)
    return render(request, "frontend/job_cancel.html", {"nav": "jobs", "jobs": [job], "single": job})


@require_POST
@login_required
def job_bulk_cancel(request: HttpRequest) -> HttpResponse:
    """Cancel the jobs ticked on the job list once `confirmed` (else ask first, as job_cancel does): each in its
    own transaction, so one that just finished does not keep the others running."""
    ids = []
    for value in request.POST.getlist("job")[:JOBS_PER_PAGE]:
        try:
            ids.append(uuid.UUID(value))
        except ValueError:
            continue
    jobs = list(
        selectors.jobs_visible_to(request.user).filter(pk__in=ids).select_related("owner").order_by("submitted_at")
    )
    if not jobs:
        messages.error(request, _("Select the jobs to cancel first."))
        return redirect("frontend:job-list")
    if not request.POST.get("confirmed"):
        return render(request, "frontend/job_cancel.html", {"nav": "jobs", "jobs": jobs, "single": None})
    done, refused = [], []
    for job in jobs:
        if job.is_terminal:
            refused.append(
                _("%(name)s: already %(state)s") % {"name": job.name, "state": wording.state_label(job.state)}
            )
            continue
        try:
            with transaction.atomic(durable=True):
                services.job_cancel(job_id=job.id, actor=request.user.username)
        except DomainError as exc:
            refused.append(f"{job.name}: {said(exc.detail)}")
        else:
            done.append(job.name)
    if done:
        names = ", ".join(done)
        messages.success(
            request, _("Cancel requested for %(count)s jobs: %(names)s") % {"count": len(done), "names": names}
        )
    if refused:
        messages.error(request, _("Not cancelled: %(list)s") % {"list": "; ".join(refused)})
    return redirect("frontend:job-list")


def _again(request: HttpRequest, job_id, make, *, refused: str, done: str) -> HttpResponse:
    """Submit a new job made from a visible one (`make(job)`); the new job's page, or this one's with the error."""
    job = _visible_job(request, job_id)
    try:
        with transaction.atomic(durable=True):
            new = make(job)
    except DomainError as exc:
        messages.error(request, refused % {"detail": said(exc.detail)})
        return redirect("frontend:job-detail", job_id=job.id)
    messages.success(request, done % {"name": job.name})
    return redirect("frontend:job-detail", job_id=new.id)


@require_POST
@login_required
def job_reproduce(request: HttpRequest, job_id) -> HttpResponse:
    resume = request.POST.get("resume") == "1"
    return _again(
        request,
        job_id,
        lambda job: services.job_reproduce(job_id=job.id, user=request.user, resume=resume),
        refused=_("Cannot reproduce: %(detail)s"),
        done=_("Submitted a reproduction of job %(name)s."),
    )


@login_required
@require_POST
def job_retry(request: HttpRequest, job_id) -> HttpResponse:
    """The API's retry: a new job with the same request, resuming from the latest checkpoint when there is one."""
    return _again(
        request,
        job_id,
        lambda job: services.job_resubmit(job_id=job.id, user=request.user, resume=True),
        refused=_("Cannot retry: %(detail)s"),
        done=_("Submitted a retry of job %(name)s."),
    )


def _log_pages(folder, first_line: int) -> Iterator[bytes]:
    # Read page by page from a byte offset: a multi-GB log streams in bounded memory and linear time.
    follower = logstore.Follower.after(folder, first_line - 1)
    while lines := follower.poll(LOG_DOWNLOAD_PAGE):
        yield "".join(f"{line.text}\n" for line in lines).encode()


async def _in_threads(pages: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Under ASGI a synchronous iterator would be read whole before sending; hand it out page by page."""
    while (page := await asyncio.to_thread(next, pages, None)) is not None:
        yield page


@login_required
def job_log_download(request: HttpRequest, job_id) -> StreamingHttpResponse:
    """An attempt's kept log as a text file, streamed in pages (never read into memory at once)."""
    job = _visible_job(request, job_id)
    try:
        number = int(request.GET.get("attempt") or job.attempts.count() or 1)
    except ValueError:
        raise Http404("no such attempt")
    folder = logstore.attempt_dir(str(job.id), number)
    meta = logstore.LogMeta.read(folder)
    pages = _log_pages(folder, meta.first_line)
    content = _in_threads(pages) if isinstance(request, ASGIRequest) else pages
    response = StreamingHttpResponse(content, content_type="text/plain; charset=utf-8")
    safe_name = re.sub(r"[^\w.-]+", "_", job.name, flags=re.ASCII)[:60] or "job"
    response["Content-Disposition"] = f'attachment; filename="{safe_name}-{job.id}-attempt-{number}.log"'
    response["X-Trainyard-First-Line"] = str(meta.first_line)
    response["X-Trainyard-Dropped-Lines"] = str(meta.dropped_lines)
    return response


# ------------------------------------------------------------------------------------------------ compare


def _parameter_label(name: str) -> str:
    labels = {
        "command": _("Command"),
        "image": _("Image"),
        "queue": _("Queue"),
        "spec": _("Spec"),
        "gpus": _("GPUs"),
        "replicas": _("Replicas"),
        "gpu_models": _("GPU models"),
        "timeout_s": _("Time limit (seconds)"),
        "max_retries": _("Retries on platform failures"),
        "working_dir": _("Working directory"),
    }
    return labels.get(name, name)


@login_required
def job_compare(request: HttpRequest) -> HttpResponse:
    """Compare runs: the jobs ticked on the job list (`?job=`), or every job with a label (`?label=key=value`):
    their TRAINYARD_METRIC series on one chart per metric, parameters side by side, final metrics sortable."""
    if "csrfmiddlewaretoken" in request.GET:
        # The job list's "Compare selected" shares the bulk-cancel form (and its CSRF field): drop the token from
        # the address at once, so it is neither bookmarked, shared nor kept in the history.
        query = request.GET.copy()
        del query["csrfmiddlewaretoken"]
        return redirect(f"{request.path}?{query.urlencode()}" if query else request.path)
    ids = request.GET.getlist("job")
    label = request.GET.get("label", "").strip()
    only_diff = request.GET.get("diff") == "1"
    jobs: list[Job] = []
    error = ""
    if ids or label:
        try:
            jobs = selectors.jobs_to_compare(request.user, ids=ids, label=label)
        except ValidationFailed as exc:
            error = exc.detail
        if not jobs and not error:
            error = _("No job you can see has the label %(label)s.") % {"label": label}
    context: dict[str, Any] = {
        "nav": "jobs",
        "jobs": jobs,
        "error": error,
        "label": label,
        "only_diff": only_diff,
        "ids": ids,
        "max_jobs": selectors.MAX_COMPARED,
    }
    if jobs:
        colours = {str(job.id): PALETTE[i % len(PALETTE)] for i, job in enumerate(jobs)}
        names = {str(job.id): f"{str(job.id)[:8]} {job.name}" for job in jobs}
        metrics = compare_metrics(jobs)
        charts = [
            line_chart(
                name,
                [Series(names[job_id], points, colour=colours[job_id]) for job_id, points in by_job.items()],
                time_axis=False,
                y_min=None,
                width=760,
                height=240,
            )
            for name, by_job in sorted(metrics.series.items())
        ]
        rows = selectors.parameter_rows(jobs)
        for row in rows:
            row["label"] = _parameter_label(row["name"])
            first = row["values"][0]
            row["cells"] = [{"value": v, "changed": row["differs"] and v != first} for v in row["values"]]
        now = timezone.now()
        final_rows = []
        for job in jobs:
            ran = None
            if job.started_at:
                ran = ((job.finished_at or now) - job.started_at).total_seconds()
            final_rows.append(
                {
                    "job": job,
                    "colour": colours[str(job.id)],
                    "ran_s": ran,
                    "reports": metrics.reports[str(job.id)],
                    "values": [metrics.final[str(job.id)].get(name) for name in metrics.names],
                }
            )
        keep = {k: v for k, v in request.GET.lists() if k != "diff"}
        context.update(
            charts=charts,
            step_axis=metrics.step_axis,
            metric_names=metrics.names,
            param_rows=[r for r in rows if r["differs"]] if only_diff else rows,
            differing=sum(1 for r in rows if r["differs"]),
            final_rows=final_rows,
            colours=[colours[str(job.id)] for job in jobs],
            diff_url="?" + urlencode({**keep, "diff": "1"}, doseq=True),
            all_url="?" + urlencode(keep, doseq=True),
        )
    return render(request, "frontend/job_compare.html", context)


# ------------------------------------------------------------------------------------------------ tokens


def _token_rows(user) -> list[dict[str, Any]]:
    now = timezone.now()
    rows = []
    for token in ApiToken.objects.filter(user=user).order_by("-created_at"):
        if token.revoked_at is not None:
            status = "revoked"
        elif token.expires_at is not None and token.expires_at <= now:
            status = "expired"
        else:
            status = "active"
        rows.append({"token": token, "status": status})
    return rows


@never_cache
@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    """The user's API tokens; POST makes one, whose secret this response shows once (never stored, never again)."""
    created = None
    errors: dict[str, str] = {}
    values = {"name": "", "expires_in_days": "", "scopes": ["read", "submit"]}
    status = 200
    if request.method == "POST":
        values = {
            "name": request.POST.get("name", "").strip(),
            "expires_in_days": request.POST.get("expires_in_days", "").strip(),
            "scopes": request.POST.getlist("scopes"),
        }
        days: int | None = None
        if not values["name"]:
            errors["name"] = _("Give the token a name, e.g. the pipeline that will use it.")
        elif len(values["name"]) > 100:
            errors["name"] = _("At most 100 characters.")
        if values["expires_in_days"]:
            try:
                days = int(values["expires_in_days"])
                if not 1 <= days <= 3650:
                    raise ValueError
            except ValueError:
                errors["expires_in_days"] = _("A whole number of days between 1 and 3650, or empty for no expiry.")
        if not values["scopes"] or set(values["scopes"]) - set(TOKEN_SCOPES):
            errors["scopes"] = _("Pick at least one of read, submit and admin.")
        if not errors:
            with transaction.atomic(durable=True):
                token, raw = tokens.token_create(
                    user=request.user, name=values["name"], expires_in_days=days, scopes=values["scopes"]
                )
            created = {"token": token, "raw": raw}
            values = {"name": "", "expires_in_days": "", "scopes": ["read", "submit"]}
        else:
            status = 400
    return render(
        request,
        "frontend/token_list.html",
        {
            "nav": "tokens",
            "rows": _token_rows(request.user),
            "created": created,
            "errors": errors,
            "values": values,
            "scopes": TOKEN_SCOPES,
            "api_url": request.build_absolute_uri("/").rstrip("/"),
        },
        status=status,
    )


@login_required
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    """GET asks for confirmation, POST revokes (the token stops working at once)."""
    if token_id > 2**31 - 1:
        raise Http404("no such token")
    token = get_object_or_404(ApiToken, pk=token_id, user=request.user)
    if request.method == "POST":
        with transaction.atomic(durable=True):
            tokens.token_revoke(token=token)
        messages.success(
            request, _("Revoked token %(name)s (%(prefix)s).") % {"name": token.name, "prefix": token.prefix}
        )
        return redirect("frontend:token-list")
    return render(request, "frontend/token_revoke.html", {"nav": "tokens", "token": token})


# ------------------------------------------------------------------------------------------------ queues


@login_required
def queue_list(request: HttpRequest) -> HttpResponse:
    rows = []
    for queue in Queue.objects.prefetch_related("specs").order_by("-priority", "name"):
        waiting = selectors.waiting_line(queue)
        waits = selectors.estimated_waits(queue, waiting)
        rows.append(
            {
                "queue": queue,
                "usage": quota.queue_usage(queue),
                "waiting": len(waiting),
                "line_clears": selectors.line_clears(waiting, waits),
            }
        )
    return render(request, "frontend/queue_list.html", {"nav": "queues", "rows": rows})


LINE_SHOWN = 200  # jobs of a waiting line listed on its queue's page (the rest are counted)
MINE_SHOWN = 50  # the user's own jobs of that line listed above it, wherever they wait


@login_required
def queue_detail(request: HttpRequest, name: str) -> HttpResponse:
    """Why a job waits: the ordered line with positions, reasons in plain words and estimated waits;
    jobs of teams the user is not in show only their place in the line."""
    queue = get_object_or_404(Queue.objects.prefetch_related("specs", "teams"), name=name)
    visible = set(quota.visible_teams(request.user).values_list("id", flat=True))
    # The whole line is estimated; its first LINE_SHOWN jobs are listed, and the user's own wherever they are.
    light = selectors.waiting_line(queue)
    own = [j.id for j in light if j.owner_id == request.user.id]
    own_more = max(0, len(own) - MINE_SHOWN)
    own = own[:MINE_SHOWN]
    waits, rows = selectors.line_rows(queue, light, first=LINE_SHOWN, also=own)
    by_id = {job.id: job for job in rows}
    own_set = set(own)
    now = timezone.now()
    line, mine = [], []
    for i, entry in enumerate(light, start=1):
        job = by_id.get(entry.id)
        if job is None:
            continue
        row = {
            "job": job,
            "visible": job.team_id in visible,
            "position": job.queue_position or i,
            "ahead": i - 1,
            "mine": job.owner_id == request.user.id,
            "waited_s": (now - job.submitted_at).total_seconds(),
            "wait": waits.get(job.id),
            "reason_text": wording.reason_sentence(job.reason),
        }
        if i <= LINE_SHOWN:
            line.append(row)
        if row["mine"] and job.id in own_set:
            mine.append(row)
    # The head of the holders, as of the line: on a full fleet a queue holds thousands of jobs.
    holders = Job.objects.filter(queue=queue, reserved=True)
    holding = list(
        holders.select_related("team", "owner", "spec").order_by("started_at", "admitted_at", "id")[:LINE_SHOWN]
    )
    holding_more = max(0, holders.count() - len(holding)) if len(holding) == LINE_SHOWN else 0
    usage = quota.queue_usage(queue)
    return render(
        request,
        "frontend/queue_detail.html",
        {
            "nav": "queues",
            "queue": queue,
            "line": line,
            "holding": holding,
            "holding_more": holding_more,
            "visible": visible,
            "usage": usage,
            "capability": queue.vector(),
            "mine": mine,
            "line_more": max(0, len(light) - LINE_SHOWN),
            "mine_more": own_more,
        },
    )


# ------------------------------------------------------------------------------------------------ teams


@login_required
def team_list(request: HttpRequest) -> HttpResponse:
    teams = list(quota.visible_teams(request.user).order_by("name"))
    if len(teams) == 1:
        return redirect("frontend:team-detail", slug=teams[0].slug)
    rows = [{"team": t, "usage": quota.team_usage(t)} for t in teams]
    return render(request, "frontend/team_list.html", {"nav": "teams", "rows": rows})


@login_required
def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    from jobs.checkpoints import team_storage_used

    team = get_object_or_404(quota.visible_teams(request.user).prefetch_related("memberships__user"), slug=slug)
    usage = quota.team_usage(team)
    return render(
        request,
        "frontend/team_detail.html",
        {
            "nav": "teams",
            "team": team,
            "usage": usage,
            "quota_vector": team.vector(),
            "storage_used": team_storage_used([team.id]).get(team.id, 0),
            "by_spec": quota.team_usage_by_spec(team),
            "members": sorted(team.memberships.all(), key=lambda m: (m.role != "maintainer", m.user.username)),
            "queues": team.queues.order_by("-priority", "name"),
            "rightsizing": _team_rightsizing(team),
        },
    )


def _team_rightsizing(team):
    """The team page's right-sizing section: the last 30 days (UTC days, today included)."""
    from datetime import timedelta

    from monitoring.selectors import team_rightsizing

    today = timezone.now().date()
    return team_rightsizing(team, start=today - timedelta(days=29), end=today)


# ------------------------------------------------------------------------------------------------ catalog


@login_required
def image_list(request: HttpRequest) -> HttpResponse:
    nodes = list(Node.objects.order_by("name"))
    team_ids = list(quota.visible_teams(request.user).values_list("id", flat=True))
    catalog: list[BaseImage | ProjectImage] = [
        *BaseImage.objects.prefetch_related(image_selectors.RECENT_BUILDS),
        *ProjectImage.objects.filter(team_id__in=team_ids)
        .select_related("base", "team")
        .prefetch_related(image_selectors.RECENT_BUILDS),
    ]
    builds = [b for image in catalog if (b := image_selectors.last_build(image)) is not None]
    image_selectors.load_severity_counts(builds)
    now = timezone.now()
    rows = []
    for image in catalog:
        project = isinstance(image, ProjectImage)
        minimum = image.min_driver_version or (image.base.min_driver_version if project else "")
        cells = [
            {
                "node": node,
                "runs": node.state != Node.State.UNHEALTHY and driver_satisfies(node.driver_version, minimum),
            }
            for node in nodes
        ]
        build = image_selectors.last_build(image)
        rows.append(
            {
                "image": image,
                "project": project,
                "min_driver": minimum,
                "cells": cells,
                "usable": any(c["runs"] for c in cells) or not nodes,
                "build": build,
                "findings": [(s, n) for s, n in image_selectors.severity_counts(build).items() if n] if build else [],
                "age_days": (now - image.last_rebuilt).days if image.last_rebuilt else None,
                "can_build": project or (request.user.is_staff and bool(image.containerfile)),
            }
        )
    from images.services import feed_state

    feed = feed_state()
    return render(request, "frontend/image_list.html", {"nav": "images", "rows": rows, "nodes": nodes, "feed": feed})


@login_required
@require_POST
def image_build(request: HttpRequest, kind: str, pk: int) -> HttpResponse:
    """Rebuild a project image (a member of its team) or a platform base (staff)."""
    if kind not in ("base", "project"):
        raise Http404
    if kind == "project":
        image = get_object_or_404(ProjectImage.objects.select_related("team"), pk=pk)
        allowed = quota.is_member(request.user, image.team)
    else:
        image = get_object_or_404(BaseImage, pk=pk)
        allowed = request.user.is_staff
    if not allowed:
        raise Http404
    try:
        build = image_services.build_request(image=image, user=request.user)
    except DomainError as exc:
        messages.error(request, exc.detail)
        return redirect("frontend:image-list")
    messages.success(request, _("Build %(id)s of %(image)s is queued.") % {"id": build.pk, "image": image})
    return redirect("frontend:image-build-detail", pk=build.pk)


@login_required
def image_build_detail(request: HttpRequest, pk: int) -> HttpResponse:
    build = get_object_or_404(image_selectors.builds_visible_to(request.user).prefetch_related("findings"), pk=pk)
    return render(
        request,
        "frontend/image_build.html",
        {"nav": "images", "build": build, "findings": list(build.findings.all())},
    )


@login_required
def dataset_list(request: HttpRequest) -> HttpResponse:
    """The registered datasets the user's teams may read, with their size and file count."""
    from jobs.datasets import visible_to

    datasets = list(visible_to(request.user).order_by("team__slug", "name", "-version"))
    return render(request, "frontend/dataset_list.html", {"nav": "datasets", "datasets": datasets})


@login_required
def gpu_list(request: HttpRequest) -> HttpResponse:
    visible = set(quota.visible_teams(request.user).values_list("id", flat=True))
    live = (
        LogicalDevice.objects.filter(released_at__isnull=True)
        .select_related("attempt__job__team", "attempt__job__owner")
        .order_by("created_at")
    )
    nodes = list(
        Node.objects.prefetch_related(
            Prefetch(
                "gpus",
                queryset=GPU.objects.order_by("index").prefetch_related(
                    Prefetch("slices", queryset=live, to_attr="live_slices")
                ),
            )
        ).order_by("name")
    )
    pools: dict[str, dict] = {}
    for node in nodes:
        node.pool = node_pool(node.labels)
        row = pools.setdefault(node.pool, {"name": node.pool, "nodes": 0, "gpus": 0, "used_milli": 0, "queues": []})
        row["nodes"] += 1
        for gpu in node.gpus.all():
            gpu.free_milli = 1000 - sum(s.compute_milli for s in gpu.live_slices)
            gpu.used_milli = 1000 - gpu.free_milli
            row["gpus"] += 1
            row["used_milli"] += gpu.used_milli
    for name, bound in Queue.objects.order_by("name").values_list("name", "pools"):
        for row in pools.values():
            if not bound or row["name"] in bound:
                row["queues"].append(name)
    for row in pools.values():
        row["use_percent"] = round(100 * row["used_milli"] / (1000 * row["gpus"])) if row["gpus"] else 0
    return render(
        request,
        "frontend/gpu_list.html",
        {
            "nav": "gpus",
            "nodes": nodes,
            "pools": sorted(pools.values(), key=lambda r: r["name"]),
            "visible": visible,
            "any_emulated": any(n.emulated for n in nodes),
            "mig_proposals": list(Alert.objects.filter(rule_name="mig-rebalance").exclude(state=Alert.State.RESOLVED))
            if request.user.is_staff
            else [],
        },
    )
