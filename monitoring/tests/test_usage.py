"""The chargeback report: GPU-hours from the pool's ledger, split by UTC day, team, user, spec; JSON and CSV."""

import csv
import io
from datetime import UTC, date, datetime

import pytest

from cluster.models import LogicalDevice
from jobs import services as jobs
from jobs.models import Attempt, Job
from monitoring import selectors
from monitoring.tests.conftest import api_as, emulated_gpus
from quotas.models import Queue

pytestmark = pytest.mark.django_db


def at(day, hour):
    return datetime(2024, 1, day, hour, tzinfo=UTC)


def held(user, spec, team, slices, *, gpus=None):
    """A job whose attempt held `slices` [(compute_milli, from, until)] in the ledger."""
    data = {"team": team, "queue": "train", "spec": spec, "image": "python-3.11", "command": ["true"]}
    if spec == "guaranteed":
        data["gpus"] = len(slices)
    job, _ = jobs.job_submit(user=user, data=data)
    attempt = Attempt.objects.create(job=job, number=1, backend="local", state="running")
    cards = gpus or emulated_gpus()
    for i, (milli, start, end) in enumerate(slices):
        device = LogicalDevice.objects.create(
            gpu=cards[i], attempt=attempt, compute_milli=milli, memory_mib=1024, exclusive=milli == 1000
        )
        LogicalDevice.objects.filter(pk=device.pk).update(created_at=start, released_at=end)
    return job


@pytest.fixture
def ledger(db_platform, outsider):
    other = outsider.teams.get()
    for queue in Queue.objects.all():
        queue.teams.add(other)
    held(db_platform, "shared", "demo", [(250, at(5, 22), at(6, 2))])  # 4 h x 1/4 across midnight
    held(db_platform, "guaranteed", "demo", [(1000, at(6, 10), at(6, 13)), (1000, at(6, 10), at(6, 13))])
    held(outsider, "performance", "other", [(750, at(6, 0), None)])  # still held
    held(outsider, "shared", "other", [(250, at(1, 0), at(2, 0))])  # before the range
    return db_platform


def test_sums_per_day_team_user_and_spec(ledger):
    rows = selectors.usage_report(
        user=ledger.__class__.objects.get(username="admin"), start=date(2024, 1, 5), end=date(2024, 1, 6), now=at(6, 4)
    )
    got = {(r.day.isoformat(), r.team, r.user, r.spec): (r.gpu_hours, r.jobs) for r in rows}
    assert got == {
        ("2024-01-05", "demo", "demo", "shared"): (0.5, 1),
        ("2024-01-06", "demo", "demo", "shared"): (0.5, 1),
        ("2024-01-06", "other", "outsider", "performance"): (3.0, 1),  # 00:00 to "now", 04:00, x 3/4
        # the guaranteed job starts at 10:00, after "now": nothing yet
    }
    later = selectors.usage_report(
        user=ledger.__class__.objects.get(username="admin"), start=date(2024, 1, 6), end=date(2024, 1, 6), now=at(8, 0)
    )
    assert {(r.team, r.spec): r.gpu_hours for r in later} == {
        ("demo", "shared"): 0.5,
        ("demo", "guaranteed"): 6.0,
        ("other", "performance"): 18.0,
    }


def test_the_api_report_and_its_csv(ledger):
    admin = api_as("admin")
    body = admin.get("/api/v1/monitoring/usage/?from=2024-01-05&to=2024-01-06&team=demo").json()
    assert body["totals"] == {
        "gpu_hours": 7.0,
        "gpu_hours_used": 0.0,
        "gpu_hours_unmeasured": 7.0,  # nothing measured these jobs
        "by_team": {"demo": 7.0},
        "by_spec": {"guaranteed": 6.0, "shared": 1.0},
    }

    response = admin.get("/api/v1/monitoring/usage/?from=2024-01-05&to=2024-01-06&user=demo&format=csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "trainyard-usage-2024-01-05-2024-01-06.csv" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(r["day"], r["spec"], float(r["gpu_hours"]), int(r["jobs"])) for r in rows] == [
        ("2024-01-05", "shared", 0.5, 1),
        ("2024-01-06", "guaranteed", 6.0, 1),
        ("2024-01-06", "shared", 0.5, 1),
    ]
    assert set(rows[0]) == {
        "day",
        "team",
        "user",
        "spec",
        "gpu_model",
        "gpu_hours",
        "gpu_hours_used",
        "gpu_hours_unmeasured",
        "jobs",
    }


def test_requested_vs_used_and_what_right_sizing_would_have_freed(ledger):
    from monitoring.models import UsageProfile

    job = Job.objects.get(spec__name="guaranteed")
    Job.objects.filter(pk=job.pk).update(state="succeeded", finished_at=at(6, 13))
    UsageProfile.objects.create(
        attempt=job.attempts.get(),
        job=job,
        final=True,
        samples=100,
        gpu_samples=100,
        gpu_source="emulated",
        gpu_memory_peak_mib=4000,
        gpu_memory_p95_mib=3500,
        gpu_util_mean_pct=15,
        gpu_util_p95_pct=20,
    )
    admin = api_as("admin")
    body = admin.get("/api/v1/monitoring/usage/?from=2024-01-06&to=2024-01-06&team=demo").json()
    guaranteed = next(r for r in body["rows"] if r["spec"] == "guaranteed")
    # 2 cards x 3 h held; 15% of each card used.
    assert (guaranteed["gpu_hours"], guaranteed["gpu_hours_used"], guaranteed["gpu_hours_unmeasured"]) == (6.0, 0.9, 0)

    report = selectors.team_rightsizing(job.team, start=date(2024, 1, 1), end=date(2024, 1, 31), now=at(8, 0))
    assert report.requested_gpu_hours == pytest.approx(7.0) and report.used_gpu_hours == pytest.approx(0.9)
    top = report.top[0]
    assert top.job == job and top.recommendation["spec"] == "shared" and top.recommendation["gpu_count"] == 1
    # The shared spec asks 250 of the 2,000 milli requested: 7/8 of the 6 held GPU-hours were not needed.
    assert report.freed_gpu_hours == pytest.approx(6.0 * 1750 / 2000)


def test_members_see_only_their_teams(ledger):
    body = api_as("demo").get("/api/v1/monitoring/usage/?from=2024-01-01&to=2024-01-31").json()
    assert {r["team"] for r in body["rows"]} == {"demo"} and body["teams"] == ["demo"]
    theirs = api_as("demo").get("/api/v1/monitoring/usage/?from=2024-01-01&to=2024-01-31&team=other").json()
    assert theirs["rows"] == []


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("from=yesterday", "invalid_date"),
        ("from=2024-02-01&to=2024-01-01", "invalid_range"),
        ("from=2022-01-01&to=2024-01-01", "range_too_long"),
    ],
)
def test_bad_ranges_are_400(db_platform, query, code):
    response = api_as("demo").get(f"/api/v1/monitoring/usage/?{query}")
    assert response.status_code == 400 and response.json()["code"] == code
    as_csv = api_as("demo").get(f"/api/v1/monitoring/usage/?{query}&format=csv")
    assert as_csv.status_code == 400 and code in as_csv.content.decode()
