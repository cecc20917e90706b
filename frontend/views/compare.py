"""Compare: part of `frontend.views` (see its package docstring)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.translation import gettext as _

from frontend.templatetags.portal import short_digest
from jobs import selectors
from jobs.models import Job
from kernel.errors import ValidationFailed
from monitoring.charts import PALETTE, Series, line_chart
from monitoring.selectors import compare_metrics


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
        "code": _("Code snapshot"),
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
            row["cells"] = [
                {
                    "value": v,
                    "changed": row["differs"] and v != first,
                    # A digest is shown short, the whole of it on hover.
                    "short": short_digest(v) if v and v.startswith("sha256:") else "",
                }
                for v in row["values"]
            ]
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
