"""Monitoring pages: the cluster (GPUs, health, scheduling and pool charts), alerts (with acknowledge and
resolve for admins), and a job's charts fragment for the job page. Charts are inline SVG drawn here."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from jobs.selectors import jobs_visible_to
from kernel.errors import DomainError
from kernel.sentences import said
from monitoring import selectors, services
from monitoring.charts import Series, epoch, line_chart
from monitoring.models import Alert, AlertRule, GpuSample, Notification
from quotas.models import Queue


def _visible_jobs(user, job_ids) -> set[str] | None:
    if user.is_staff:
        return None
    return {str(pk) for pk in jobs_visible_to(user).filter(pk__in=list(job_ids)).values_list("pk", flat=True)}


@login_required
def cluster(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    items = selectors.gpu_overview(now=now)
    mine = _visible_jobs(request.user, {j for i in items for j in i.jobs})
    since = now - timedelta(hours=24)
    samples = selectors.scheduling_series(since=since)
    pool = [s for s in samples if s.queue is None]
    by_queue: dict[str, list] = defaultdict(list)
    for s in samples:
        if s.queue is not None:
            by_queue[s.queue.name].append(s)
    charts = [
        line_chart(
            _("Pool: allocation and fragmentation (24 h)"),
            [
                Series(_("compute allocated"), [(epoch(s.at), 100 * (s.allocation_ratio or 0)) for s in pool]),
                Series(_("memory allocated"), [(epoch(s.at), 100 * (s.memory_allocation_ratio or 0)) for s in pool]),
                Series(_("free compute stranded"), [(epoch(s.at), 100 * (s.fragmentation or 0)) for s in pool]),
            ],
            unit="%",
            y_max=100,
        ),
        line_chart(
            _("Queue depth: pending jobs (24 h)"),
            [Series(name, [(epoch(s.at), s.pending) for s in rows]) for name, rows in sorted(by_queue.items())],
        ),
        line_chart(
            _("Admissions per minute (24 h)"),
            [Series(_("pool"), [(epoch(s.at), 60 * s.admissions / s.interval_s) for s in pool if s.interval_s])],
        ),
        line_chart(
            _("Mean wait of admitted jobs (24 h)"),
            [
                Series(name, [(epoch(s.at), s.wait_avg_s) for s in rows if s.wait_avg_s is not None])
                for name, rows in sorted(by_queue.items())
            ],
            unit=" s",
        ),
    ]
    real = [i.gpu.id for i in items if not i.gpu.node.emulated]
    recent: dict[int, list[GpuSample]] = defaultdict(list)
    for sample in GpuSample.objects.filter(gpu_id__in=real, at__gte=now - timedelta(hours=1)).order_by("at"):
        recent[sample.gpu_id].append(sample)
    rows = []
    for item in items:
        points = recent.get(item.gpu.id, [])
        chart = None
        if points:
            chart = line_chart(
                f"{item.gpu} (1 h)",
                [
                    Series(
                        _("utilization"),
                        [(epoch(p.at), p.utilization_pct) for p in points if p.utilization_pct is not None],
                    ),
                    Series(_("memory"), [(epoch(p.at), p.memory_pct) for p in points if p.memory_pct is not None]),
                    Series(
                        _("temperature °C"),
                        [(epoch(p.at), p.temperature_c) for p in points if p.temperature_c is not None],
                    ),
                ],
                unit="",
                y_max=100,
                width=420,
                height=140,
            )
        rows.append({"item": item, "chart": chart, "jobs": [(j, mine is None or j in mine) for j in item.jobs]})
    depth = selectors.jobs_by_queue_and_state()
    queues = [
        {
            "name": q.name,
            "pending": depth.get(q.name, {}).get("pending", 0),
            "running": depth.get(q.name, {}).get("running", 0),
        }
        for q in Queue.objects.all()
    ]
    return render(
        request,
        "monitoring/cluster.html",
        {
            "nav": "monitoring",
            "rows": rows,
            "pool": selectors.pool_allocation(),
            "charts": charts,
            "queues": queues,
            "open_alerts": Alert.objects.exclude(state=Alert.State.RESOLVED).select_related("gpu__node")[:20],
            "any_emulated": any(i.gpu.node.emulated for i in items),
            "no_telemetry": selectors.NO_TELEMETRY_EMULATED,
            "today": now.date(),
            "month_start": now.date().replace(day=1),
        },
    )


@login_required
def alerts(request: HttpRequest) -> HttpResponse:
    open_alerts = list(Alert.objects.exclude(state=Alert.State.RESOLVED).select_related("gpu__node", "rule"))
    resolved = list(Alert.objects.filter(state=Alert.State.RESOLVED).select_related("gpu__node")[:50])
    mine = _visible_jobs(request.user, {j for a in open_alerts + resolved for j in a.job_ids})

    def shown(alert: Alert) -> dict:
        return {
            "alert": alert,
            "jobs": [(j, mine is None or j in mine) for j in alert.job_ids],
            "actions": selectors.actions_visible(alert.actions_taken, mine),
        }

    notes = list(Notification.objects.filter(user=request.user, read_at__isnull=True).select_related("alert")[:20])
    return render(
        request,
        "monitoring/alerts.html",
        {
            "nav": "alerts",
            "open": [shown(a) for a in open_alerts],
            "resolved": [shown(a) for a in resolved],
            "rules": AlertRule.objects.all(),
            "notifications": notes,
        },
    )


@login_required
@require_POST
def alert_action(request: HttpRequest, alert_id: int, verb: str) -> HttpResponse:
    try:
        if verb == "acknowledge":
            services.alert_acknowledge(alert_id=alert_id, user=request.user)
            messages.success(request, _("Alert %(id)s acknowledged.") % {"id": alert_id})
        elif verb == "resolve":
            services.alert_resolve(alert_id=alert_id, user=request.user, note=request.POST.get("note", "")[:300])
            messages.success(request, _("Alert %(id)s resolved.") % {"id": alert_id})
        else:
            raise Http404
    except DomainError as exc:
        messages.error(request, f"{said(exc.detail)} ({exc.code})")
    return redirect("monitoring:alerts")


@login_required
@require_POST
def gpu_action(request: HttpRequest, uuid: str, verb: str) -> HttpResponse:
    if not request.user.is_staff:
        messages.error(request, _("Only an admin may probe a GPU or return it to service."))
        return redirect("monitoring:cluster")
    try:
        if verb == "probe":
            outcome = services.gpu_probe_one(gpu_uuid=uuid, actor=request.user.username)
            if outcome is None:
                messages.success(request, _("This card is not reachable from here; dcgm-exporter reports its health."))
            elif outcome.ok:
                messages.success(request, _("The probe passed."))
            else:
                messages.error(request, _("The probe failed: %(reason)s") % {"reason": said(outcome.reason)})
        elif verb == "return":
            gpu = services.gpu_return_to_service(
                gpu_uuid=uuid, actor=request.user.username, force=request.POST.get("force") == "on"
            )
            messages.success(request, _("%(gpu)s is back in service.") % {"gpu": gpu})
        else:
            raise Http404
    except DomainError as exc:
        messages.error(request, f"{said(exc.detail)} ({exc.code})")
    return redirect("monitoring:cluster")


@login_required
def job_charts(request: HttpRequest, job_id) -> HttpResponse:
    """The job's charts as an HTML fragment, for the job page to fetch (or use the `job_charts` tag)."""
    job = jobs_visible_to(request.user).filter(pk=job_id).first()
    if job is None:
        raise Http404
    return render(request, "monitoring/job_charts.html", job_charts_context(job))


def job_charts_context(job) -> dict:
    """The charts of a job's three layers; the caller has checked that the reader may see the job."""
    data = selectors.job_telemetry(job)
    devices = []
    for d in data["devices"]:
        chart = None
        if d.samples:
            chart = line_chart(
                _("%(gpu)s during attempt %(n)s") % {"gpu": d.device.gpu, "n": d.attempt_number},
                [
                    Series(
                        _("utilization %"),
                        [(epoch(s.at), s.utilization_pct) for s in d.samples if s.utilization_pct is not None],
                    ),
                    Series(_("memory %"), [(epoch(s.at), s.memory_pct) for s in d.samples if s.memory_pct is not None]),
                ],
                y_max=100,
                threshold=90,
            )
        devices.append({"d": d, "chart": chart})
    processes = (
        line_chart(
            _("GPU memory of the job's own processes"),
            [
                Series(gpu, [(epoch(p.at), p.memory_used_mib) for p in data["processes"] if str(p.gpu) == gpu])
                for gpu in sorted({str(p.gpu) for p in data["processes"]})
            ],
            unit=" MiB",
        )
        if data["processes"]
        else None
    )
    alerts_for_job = Alert.objects.filter(job_ids__contains=[str(job.id)]).order_by("-started_at")[:20]
    return {
        "job": job,
        "devices": devices,
        "processes": processes,
        **_business_context(data["business"]),
        "version": selectors.business_version(job.id),
        "scheduling": data["scheduling"],
        "peak_memory_mib": data["peak_memory_mib"],
        "alerts": alerts_for_job,
    }


def _business_context(metrics) -> dict:
    series = selectors.business_series(metrics)
    return {
        "business_charts": [
            line_chart(name, [Series(name, points)], time_axis=False, y_min=None)
            for name, points in sorted(series.items())
        ],
        "step_axis": bool(metrics) and all(m.step is not None for m in metrics),
        "reports": len(metrics),
    }


def business_charts_html(job) -> tuple[int, str]:
    """(version, the business layer's charts as HTML): what the job page's socket redraws live."""
    version = selectors.business_version(job.id)
    context = _business_context(selectors.job_business_metrics(job))
    return version, render_to_string("monitoring/_business_charts.html", {**context, "version": version})
