"""Job page: part of `frontend.views` (see its package docstring)."""

from __future__ import annotations

import asyncio
import re
import shlex
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.handlers.asgi import ASGIRequest
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from frontend import wording
from frontend.templatetags.portal import short_digest
from frontend.views.common import JOBS_PER_PAGE, LOG_DOWNLOAD_PAGE, LOG_TAIL, portal_runtime, visible_job
from jobs import lifecycle, logstore, selectors, services
from jobs.backends import sandbox
from jobs.models import FailureRule, Job
from jobs.states import JobState
from kernel.errors import DomainError
from kernel.sentences import said
from monitoring.charts import Series, line_chart


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
        "runtime": recorded or portal_runtime(),
        "runtime_recorded": bool(recorded),
        "attempts": attempts,
        "events": events,
        "suggestions": suggestions,
        "wait": wait,
        "store_wait": selectors.store_wait(job),
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


def _digest_cell(digest: str | None) -> dict[str, str] | None:
    """A digest as a table cell shows it: short, the whole of it on hover (and for a copy)."""
    return {"short": short_digest(digest), "full": digest} if digest else None


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
        if runtime.get("limits"):
            held = runtime["limits"] + (" + seccomp" if runtime.get("seccomp") else "")
            image_rows.append((_("Resource limits"), held))
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
        (_("Code snapshot"), _digest_cell(record.get("code_digest")) or _("none")),
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
    job = visible_job(request, job_id)
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
    job = visible_job(request, job_id)
    return render(request, "frontend/_job_live.html", _live_context(job))


@login_required
def job_cancel(request: HttpRequest, job_id) -> HttpResponse:
    """POST with `confirmed` cancels; anything else asks first, on a page of its own (the page's script asks in a
    dialog and sends `confirmed` itself, so this page is what a browser without JavaScript shows)."""
    job = visible_job(request, job_id)
    if request.method == "POST" and request.POST.get("confirmed"):
        try:
            with transaction.atomic(durable=True):
                job = lifecycle.job_cancel(job_id=job.id, actor=request.user.username)
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
                lifecycle.job_cancel(job_id=job.id, actor=request.user.username)
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
    job = visible_job(request, job_id)
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
    job = visible_job(request, job_id)
    try:
        number = int(request.GET.get("attempt") or job.attempts.count() or 1)
    except ValueError:
        raise Http404("no such attempt")
    folder = logstore.attempt_dir(str(job.id), number)
    meta = logstore.LogMeta.read(folder)
    if request.GET.get("stream") == "stderr":
        # stderr alone, shown in the browser: each line with its number in the merged log.
        lines = logstore.stderr_lines(folder, limit=logstore.RING_LINES)
        text = "".join(f"{x.number}\t{x.text}\n" for x in lines)
        if meta.stderr_dropped:
            text += f"[trainyard] {meta.stderr_dropped} more stderr line(s) are in the merged log only\n"
        response = HttpResponse(text, content_type="text/plain; charset=utf-8")
        response["X-Trainyard-Stderr-Lines"] = str(meta.stderr_lines)
        return response
    pages = _log_pages(folder, meta.first_line)
    content = _in_threads(pages) if isinstance(request, ASGIRequest) else pages
    response = StreamingHttpResponse(content, content_type="text/plain; charset=utf-8")
    safe_name = re.sub(r"[^\w.-]+", "_", job.name, flags=re.ASCII)[:60] or "job"
    response["Content-Disposition"] = f'attachment; filename="{safe_name}-{job.id}-attempt-{number}.log"'
    response["X-Trainyard-First-Line"] = str(meta.first_line)
    response["X-Trainyard-Dropped-Lines"] = str(meta.dropped_lines)
    return response


@login_required
def job_yaml(request: HttpRequest, job_id) -> HttpResponse:
    """The job's reproduce request as a job file: `trainyard submit` or the submit page's import takes it."""
    from jobs.jobfile import job_yaml as render_yaml

    job = visible_job(request, job_id)
    text = render_yaml(job, platform_url=request.build_absolute_uri("/"))
    response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", job.name).strip("-") or "job"
    response["Content-Disposition"] = f'attachment; filename="{safe}.job.yaml"'
    return response
