"""Submit: part of `frontend.views` (see its package docstring)."""

from __future__ import annotations

import json
import shlex
import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Max
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from cluster.models import GPU, Node
from cluster.selectors import driver_satisfies
from frontend.forms import CUSTOM_IMAGE, SubmitForm, initial_from_submission
from frontend.views.common import code_from_form, portal_runtime, recommendation_message, visible_job
from images.models import BaseImage, ProjectImage
from jobs import selectors, services
from jobs.api import JobSubmitSerializer, submission_check
from jobs.jobfile import read_job_yaml
from jobs.models import Job, JobTemplate
from kernel.errors import OUTAGE_RETRY_AFTER_S, Conflict, DomainError, NotFound, OutageAfterWrite, outage_code
from kernel.sentences import said
from quotas import selectors as quota
from quotas.models import Queue, ResourceSpec


def _card_mib() -> int:
    return services._reference_card_mib()


def _submit_choices(user) -> dict[str, Any]:
    """Everything the pickers show: queues with their waits, specs with what they guarantee and cost, images
    with the nodes whose drivers can run them."""
    teams = list(quota.visible_teams(user).order_by("name"))
    queues = list(Queue.objects.prefetch_related("specs", "teams").order_by("-priority", "name"))
    mine = {t.id for t in teams}
    queue_rows = []
    fleet = selectors.estimate_fleet()
    for queue in queues:
        waiting, last = selectors.line_ends(queue)
        waits = selectors.estimated_waits(queue, fleet=fleet) if waiting else {}
        queue_rows.append(
            {
                "queue": queue,
                "waiting": waiting,
                "line_clears": selectors.line_clears(last, waits),
                "specs": " ".join(s.name for s in queue.specs.all()),
                # Only the user's own teams (staff: all): the page must not tell who else uses a queue.
                "teams": " ".join(t.slug for t in queue.teams.all() if t.id in mine),
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
        "runtime": portal_runtime(),
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
            job = visible_job(request, uuid.UUID(request.GET["from"]))
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
        form = SubmitForm(request.POST, request.FILES, gpu_models=models)
        valid = form.is_valid()
        if "save_template" in request.POST:
            template = _save_template(request, form) if valid else None
            if template is not None:
                messages.success(request, _("Saved template %(name)s.") % {"name": template.name})
                return redirect(reverse("frontend:template-list") + f"#template-{template.pk}")
        else:
            # Every problem at once: the service judges what the form could read even when another field failed.
            try:
                job = _submit(request, form, form_valid=valid)
            except OutageAfterWrite as exc:
                return _outage_page(request, exc)
            if job is not None:
                try:
                    advice = recommendation_message(job)
                except Exception as exc:
                    code = outage_code(exc)
                    if code is None:
                        raise
                    return _outage_page(request, OutageAfterWrite(code, "", job_id=str(job.id), job_exists=True))
                messages.success(request, _("Job submitted."))
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
    if not _bring_code(request, form, data):
        return None
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
    job_id = uuid.uuid4()  # the page can name the job if the database goes away while it is saved
    try:
        try:
            job = _save_job(request, data, key, job_id)
        except Conflict as exc:
            if exc.code != "idempotency_key_reused":
                raise
            # The same form sent again with changes (back button): a new request, with its own key for double clicks.
            key = f"{key}:{services.request_fingerprint(data)[:16]}"
            job = _save_job(request, data, key, job_id)
    except NotFound as exc:
        form.add_service_error(exc.field or "team", exc.detail, exc.code)
        return None
    except DomainError as exc:
        form.add_service_errors(getattr(exc, "errors", None) or [exc])
        return None
    return job


def _save_job(request: HttpRequest, data: dict[str, Any], key: str | None, job_id: uuid.UUID) -> Job:
    """The job saved; an outage while it commits raises OutageAfterWrite naming the job (it may exist), and one
    after it (the job page's reads) OutageAfterWrite saying it exists; before, nothing was made: the plain error."""
    committing, job, created = False, None, True
    try:
        with transaction.atomic(durable=True):
            job, created = services.job_submit(user=request.user, data=data, idempotency_key=key, job_id=job_id)
            committing = True
    except Exception as exc:
        code = outage_code(exc)
        if code is None or not committing:
            raise
        raise OutageAfterWrite(code, "", job_id=str(job.id), job_exists=True if not created else None) from exc
    return job


def _outage_page(request: HttpRequest, exc: OutageAfterWrite) -> HttpResponse:
    """503 that names the job the form made (or may have made), on a page that reads nothing from the database."""
    job_id = exc.extra["job_id"]
    if exc.extra.get("job_exists"):
        text = _("Job %(job)s was submitted, but the platform became unavailable before the page was ready. Do "
                 "not submit it again: open it once the platform is back.") % {"job": job_id}  # fmt: skip
    else:
        text = _("The platform became unavailable while job %(job)s was being saved, so it is not known whether "
                 "it was kept. Open it once the platform is back; if it is not found, send the form again: the same "
                 "form never makes a second job.") % {"job": job_id}  # fmt: skip
    response = render(
        request,
        "frontend/submit_outage.html",
        {"text": text, "job_url": reverse("frontend:job-detail", kwargs={"job_id": job_id})},
        status=503,
    )
    response["Retry-After"] = str(OUTAGE_RETRY_AFTER_S)
    return response


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


@login_required
@require_POST
def job_import(request: HttpRequest) -> HttpResponse:
    """A job file (`job.yaml`, e.g. one exported from a job page) uploaded on the submit page: the form comes back
    filled from it, to check and submit; a file that cannot be read comes back as an error, the form unchanged."""
    choices = _submit_choices(request.user)
    models = [r["model"] for r in choices["gpu_models"]]
    upload = request.FILES.get("jobfile")
    problem = None
    body: dict[str, Any] = {}
    if upload is None:
        problem = {"message": _("Choose a job file (job.yaml) to import."), "code": "jobfile_missing"}
    else:
        try:
            body = read_job_yaml(upload.read(), known=set(JobSubmitSerializer().fields))
        except DomainError as exc:
            problem = {"message": said(exc.detail), "code": exc.code}
        else:
            code = body.get("code")
            if code is not None and not (isinstance(code, str) and code.startswith("sha256:")):
                problem = {
                    "message": _(
                        "code: names a folder (%(value)s) on your machine, which the portal cannot read: submit the "
                        "file with `trainyard submit`, which uploads the folder, or give the snapshot's sha256 digest."
                    )
                    % {"value": code},
                    "code": "jobfile_code_folder",
                }
    if problem is not None:
        initial = _submit_defaults(request, choices)
        initial["idempotency_key"] = uuid.uuid4().hex
        form = SubmitForm(initial=initial, gpu_models=models)
        response = _render_form(request, form, choices, source={}, mode="submit", import_errors=[problem])
        response.status_code = 400
        return response
    catalog = {row["value"] for row in choices["images"]}
    initial = initial_from_submission(body, catalog=catalog)
    initial["idempotency_key"] = uuid.uuid4().hex
    form = SubmitForm(initial=initial, gpu_models=models)
    return _render_form(request, form, choices, source={"file": upload.name}, mode="submit")


def _bring_code(request: HttpRequest, form: SubmitForm, data: dict[str, Any]) -> bool:
    """An archive or a git repository + commit given on the form (`code_from_form`): the submission names the
    snapshot's digest. The digest is carried in the form from then on, so a form sent back for another field's
    error does not ask for the upload again. False (with the error on the form) when it failed."""
    try:
        brought = code_from_form(request, team_slug=data.get("team") or "")
    except DomainError as exc:
        form.add_service_error(exc.field or "code", exc.detail, exc.code)
        return False
    if brought is None:
        return True
    data["code"], ci = brought
    if ci and not data.get("ci"):
        data["ci"] = ci
    carried = {**(form.cleaned_data.get("carried") or {}), "code": data["code"]}
    if data.get("ci"):
        carried["ci"] = data["ci"]
    form.data = form.data.copy()
    form.data["carried"] = json.dumps(carried)
    form.data["code_git_url"] = form.data["code_git_commit"] = ""
    return True
