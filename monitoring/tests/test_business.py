"""Business metrics: the tagged log line, the incremental log scanner (never re-reading), and the HTTP report."""

import io
import json
import os

import pytest
from django.utils import timezone

from jobs import logstore
from jobs import services as jobs
from jobs.models import Attempt
from monitoring import business, services
from monitoring.models import BusinessMetric, LogScanCursor
from monitoring.sdk import format_report, report
from monitoring.tests.conftest import T0, api_as

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("line", "step", "values"),
    [
        ('TRAINYARD_METRIC {"step": 10, "loss": 0.5}', 10, {"loss": 0.5}),
        (
            '2030-01-06 12:00:00 INFO train: TRAINYARD_METRIC {"loss": 1, "throughput": 812.5} trailing',
            None,
            {"loss": 1.0, "throughput": 812.5},
        ),
        ('TRAINYARD_METRIC {"step": 3, "loss": NaN, "ok": true, "note": "x", "progress": 0.25}', 3, {"progress": 0.25}),
        ('TRAINYARD_METRIC {"step": 7, "peak_memory_mib": 9100, "bad key!": 1}', 7, {"peak_memory_mib": 9100.0}),
    ],
)
def test_tagged_lines(line, step, values):
    parsed = business.parse_line(line)
    assert (parsed.step, parsed.values) == (step, values)


@pytest.mark.parametrize(
    "line",
    [
        "TRAINYARD_METRIC loss=0.5",
        'TRAINYARD_METRIC {"loss": ',
        "TRAINYARD_METRIC [1, 2]",
        'TRAINYARD_METRIC {"note": "no numbers"}',
    ],
)
def test_broken_tagged_lines_are_rejected(line):
    with pytest.raises(business.MetricRejected):
        business.parse_line(line)


def test_untagged_lines_carry_nothing():
    assert business.parse_line("epoch 1 loss 0.5") is None


def test_the_sdk_prints_a_line_the_platform_reads():
    out = io.StringIO()
    report(step=5, loss=0.25, throughput=100, stream=out)
    assert out.getvalue() == 'TRAINYARD_METRIC {"step":5,"loss":0.25,"throughput":100.0}\n'
    assert business.parse_line(format_report(1, loss=float("nan"), acc=0.9)).values == {"acc": 0.9}


@pytest.fixture
def running_attempt(db_platform):
    job, _ = jobs.job_submit(
        user=db_platform,
        data={
            "team": "demo",
            "queue": "train",
            "spec": "shared",
            "image": "python-3.11",
            "command": ["python", "train.py"],
        },
    )
    return Attempt.objects.create(
        job=job, number=1, backend="local", state="running", backend_ref="local:x:1", started_at=timezone.now()
    )


def writer_for(attempt, **budget):
    return logstore.LogWriter(logstore.attempt_dir(str(attempt.job_id), attempt.number), **budget)


def metric(step):
    return f'TRAINYARD_METRIC {{"step": {step}, "loss": {1 / step:.4f}}}'


def steps(attempt):
    return list(BusinessMetric.objects.filter(job_id=attempt.job_id).order_by("step").values_list("step", flat=True))


def test_the_scanner_reads_only_what_is_new(running_attempt):
    writer = writer_for(running_attempt)
    writer.write_many(["x" * 60, metric(1), "epoch done"])
    writer.flush()
    assert services.business_metrics_scan(now=T0).metrics == 1

    writer.write_many([metric(2), "noise", metric(3)])
    writer.flush()
    log_path = logstore.attempt_dir(str(running_attempt.job_id), 1) / "log"
    partial = b'TRAINYARD_METRIC {"step": 4, "lo'
    with open(log_path, "ab") as f:
        f.write(partial)  # a line still being written
    assert services.business_metrics_scan(now=T0).metrics == 2
    cursor = LogScanCursor.objects.get(attempt=running_attempt)
    assert (cursor.next_line, cursor.byte_offset) == (7, log_path.stat().st_size - len(partial))

    # Rewrite the first line in place (same file, same length): a scanner that re-read would find step 99.
    with open(log_path, "r+b") as f:
        f.write(b'TRAINYARD_METRIC {"step": 99, "loss": 1}'.ljust(60))
    with open(log_path, "ab") as f:
        f.write(b'ss": 0.25}\n')  # the cut line completes
    assert services.business_metrics_scan(now=T0).metrics == 1
    assert steps(running_attempt) == [1, 2, 3, 4]
    assert list(
        BusinessMetric.objects.filter(job_id=running_attempt.job_id).order_by("step").values_list("line", flat=True)
    ) == [2, 4, 6, 7]


def test_the_scanner_never_reads_from_the_start_again(running_attempt, monkeypatch):
    writer = writer_for(running_attempt)
    writer.write_many([metric(s) for s in range(1, 1001)])
    writer.flush()
    services.business_metrics_scan(now=T0)
    cursor = LogScanCursor.objects.get(attempt=running_attempt)
    writer.write_line(metric(1001))
    writer.flush()
    reads = []
    real_read = business._read_appended

    def spy(f, folder, position, inode, size):
        reads.append(position.byte_offset)
        return real_read(f, folder, position, inode, size)

    monkeypatch.setattr(business, "_read_appended", spy)
    services.business_metrics_scan(now=T0)
    assert reads == [cursor.byte_offset] and cursor.byte_offset > 0
    assert len(steps(running_attempt)) == 1001


def test_the_scanner_follows_the_ring_without_duplicates(running_attempt, monkeypatch):
    monkeypatch.setattr(logstore, "RING_LINES", 6)
    writer = writer_for(running_attempt, budget_lines=4)
    writer.write_many([metric(s) for s in range(1, 4)])
    writer.flush()
    services.business_metrics_scan(now=T0)
    assert steps(running_attempt) == [1, 2, 3]

    writer.write_many([metric(s) for s in range(4, 9)])  # past the budget: the store keeps the last 6 lines
    writer.flush()
    meta = logstore.LogMeta.read(logstore.attempt_dir(str(running_attempt.job_id), 1))
    assert meta.ring and meta.first_line == 3
    services.business_metrics_scan(now=T0)
    assert steps(running_attempt) == list(range(1, 9))

    writer.write_many([metric(s) for s in range(9, 20)])  # 9..13 are dropped before anyone reads them
    writer.flush()
    services.business_metrics_scan(now=T0)
    assert steps(running_attempt) == [*range(1, 9), *range(14, 20)]
    assert services.business_metrics_scan(now=T0).metrics == 0


def test_a_finished_attempt_is_scanned_to_the_end_then_left_alone(running_attempt):
    writer = writer_for(running_attempt)
    writer.write_many([metric(1), 'TRAINYARD_METRIC {"loss": oops}'])
    writer.close()
    Attempt.objects.filter(pk=running_attempt.pk).update(state="succeeded", ended_at=timezone.now())

    scan = services.business_metrics_scan()

    assert (scan.metrics, scan.malformed) == (1, 1)
    cursor = LogScanCursor.objects.get(attempt=running_attempt)
    assert cursor.done and cursor.malformed == 1
    assert services.business_metrics_scan().attempts == 0


def test_a_job_reports_over_http(running_attempt, outsider):
    url = f"/api/v1/monitoring/jobs/{running_attempt.job_id}/metrics/"
    demo = api_as("demo")
    created = demo.post(url, [{"step": 1, "loss": 0.9, "throughput": 100}, {"step": 2, "loss": 0.7}], format="json")
    assert created.status_code == 201, created.json()
    assert [r["values"] for r in created.json()] == [{"loss": 0.9, "throughput": 100.0}, {"loss": 0.7}]
    listed = demo.get(url).json()
    assert [(r["step"], r["source"], r["attempt_number"]) for r in listed] == [(1, "api", 1), (2, "api", 1)]
    assert api_as("outsider").post(url, {"loss": 1}, format="json").status_code == 404


@pytest.mark.parametrize(
    ("job_state", "attempt_state", "status", "attempt_number"),
    [
        ("running", "running", 201, 1),
        ("starting", "starting", 201, 1),
        ("cancelling", "running", 201, 1),  # the job's last moments while it stops: its process still reports
        ("succeeded", "succeeded", 409, None),
        ("failed", "failed", 409, None),
        ("cancelled", "cancelled", 409, None),
        ("retrying", "preempted", 409, None),
        ("pending", None, 409, None),  # never ran: no attempt a report could belong to
    ],
)
def test_reports_are_taken_only_while_an_attempt_of_the_job_runs(
    running_attempt, job_state, attempt_state, status, attempt_number
):
    from jobs.models import Job
    from jobs.states import TERMINAL

    job_id = running_attempt.job_id
    finished_at = timezone.now() if job_state in TERMINAL else None
    Job.objects.filter(pk=job_id).update(state=job_state, finished_at=finished_at)
    if attempt_state is None:
        running_attempt.delete()
    else:
        Attempt.objects.filter(pk=running_attempt.pk).update(
            state=attempt_state, ended_at=timezone.now() if attempt_state not in ("starting", "running") else None
        )
    response = api_as("demo").post(f"/api/v1/monitoring/jobs/{job_id}/metrics/", {"loss": 0.5}, format="json")
    assert response.status_code == status, response.json()
    if status == 409:
        assert (response.json()["code"], response.json()["state"]) == ("job_not_running", job_state)
        assert job_state in response.json()["detail"]
        assert not BusinessMetric.objects.exists()
    else:
        assert list(BusinessMetric.objects.values_list("attempt_number", flat=True)) == [attempt_number]


def test_a_report_belongs_to_the_attempt_that_runs_now(running_attempt):
    Attempt.objects.filter(pk=running_attempt.pk).update(state="failed", ended_at=timezone.now())
    Attempt.objects.create(job_id=running_attempt.job_id, number=2, backend="local", state="running")
    response = api_as("demo").post(
        f"/api/v1/monitoring/jobs/{running_attempt.job_id}/metrics/", {"step": 7, "loss": 0.5}, format="json"
    )
    assert response.status_code == 201 and response.json()[0]["attempt_number"] == 2


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"loss": "high"}, "invalid_metric_value"),
        ({"step": -1, "loss": 1}, "invalid_metric_step"),
        ({"step": 10**30, "loss": 1}, "invalid_metric_step"),
        ({"step": 1e30, "loss": 1}, "invalid_metric_step"),
        ({"ts": 1e30, "loss": 1}, "invalid_metric_ts"),
        ({}, "empty_metric_report"),
        ([], "invalid_metric_report"),
        ({"ts": "yesterday", "loss": 1}, "invalid_metric_ts"),
        ({f"m{i}": i for i in range(40)}, "too_many_metrics"),
    ],
)
def test_bad_reports_are_400_with_a_code(running_attempt, body, code):
    response = api_as("demo").post(
        f"/api/v1/monitoring/jobs/{running_attempt.job_id}/metrics/", json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 400 and response.json()["code"] == code
    assert not BusinessMetric.objects.exists()


def test_missing_log_is_not_an_error(running_attempt):
    assert services.business_metrics_scan().metrics == 0
    assert not os.path.exists(logstore.attempt_dir(str(running_attempt.job_id), 1))
