"""Right-sizing with real processes on the emulated inventory: usage profiles (CPU and host memory measured from
/proc, GPU numbers stated by the job on emulated cards), recommendations on the next submission, idle GPUs flagged
and stopped after notice, and leaks raising a warning alert."""

import uuid

import pytest
from django.test import Client

from jobs import lifecycle
from jobs import services as jobs
from jobs.models import Job
from monitoring import rightsizing, services
from monitoring.models import Alert, Notification, UsageProfile
from monitoring.tests.conftest import api_as, wait_for
from quotas.models import Queue

pytestmark = [pytest.mark.django_db(transaction=True)]

# A job that states its (emulated) GPU use, holds real host memory and burns real CPU for a while.
PROFILED = (
    "import json, time\n"
    "hold = bytearray(200 * 1024 * 1024)\n"
    "for i in range(0, len(hold), 4096): hold[i] = 1\n"
    "print('TRAINYARD_METRIC ' + json.dumps({'step': 1, 'batch_size': 32}), flush=True)\n"
    "print('TRAINYARD_EMULATED_GPU ' + json.dumps({'memory_mib': 3000, 'util_pct': 60}), flush=True)\n"
    "end = time.time() + 1.2\n"
    "while time.time() < end: pass\n"
    "print('TRAINYARD_EMULATED_GPU ' + json.dumps({'memory_mib': 4096, 'util_pct': 80}), flush=True)\n"
    "time.sleep(0.8)\n"
)


@pytest.fixture
def fast_sampling(settings):
    settings.TRAINYARD_USAGE_INTERVAL_S = 0.2
    return settings


def submit(user, command, **extra):
    data = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11", "command": command}
    job, _ = jobs.job_submit(user=user, data={**data, **extra})
    return job


def ended(job):
    fresh = Job.objects.get(pk=job.pk)
    return fresh if fresh.is_terminal else None


def final_profile(job):
    services.usage_collect()
    return UsageProfile.objects.filter(job=job, final=True).first()


@pytest.mark.slow
def test_a_job_is_profiled_and_the_next_submission_gets_a_recommendation(live_platform, fast_sampling):
    job = submit(live_platform, ["python3", "-c", PROFILED])
    assert wait_for(lambda: ended(job), timeout=60).state == "succeeded"
    services.business_metrics_scan()
    profile = wait_for(lambda: final_profile(job))

    assert profile.gpu_source == "emulated"
    assert abs(profile.gpu_memory_peak_mib - 4096) <= 0.05 * 4096
    assert 70 <= profile.gpu_util_p95_pct <= 80
    assert 60 <= profile.gpu_util_mean_pct <= 80
    # Real host numbers: 200 MiB touched (plus the interpreter), and a busy loop worth most of a core.
    assert 200 <= profile.host_memory_peak_mib < 400
    # The busy loop shows as CPU (on a shared 2-core machine it may get well under a core), the sleep after it not.
    assert profile.cpu_peak_milli >= 150
    assert min(p[3] for p in profile.series if p[2] == 80 and p[3] is not None) < 100
    usage = api_as("demo").get(f"/api/v1/jobs/{job.id}/usage/").json()
    assert usage["requested"]["gpu_memory_mib"] == 24576
    assert usage["attempts"][0]["gpu_memory_peak_mib"] == pytest.approx(4096, rel=0.05)
    assert usage["attempts"][0]["series"]

    # The same command again, through the API: the answer carries a recommendation; the request is untouched.
    body = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11"}
    response = api_as("demo").post("/api/v1/jobs/", {**body, "command": ["python3", "-c", PROFILED]}, format="json")
    assert response.status_code == 201, response.json()
    data = response.json()
    rec = data["recommendation"]
    assert data["spec"] == "guaranteed" and data["gpu_memory_mib"] == 24576
    # 4 GiB peak, 80% of a card: the shared (6 GiB, 250 milli) spec cannot compute it; performance (18 GiB,
    # 750 milli) cannot either at 80% + margin; guaranteed stays. The evidence says why.
    assert rec["runs"] == 1 and rec["scope"] == "user"
    assert "1 run, peak 4.0 GiB of 24.0 GiB" in rec["evidence"]
    assert rec["batch_size"] is not None and rec["batch_size"] > 32
    lifecycle.job_cancel(job_id=data["id"], actor="demo")


def test_recommendation_picks_the_smallest_spec_covering_p95_with_margin():
    options = [
        rightsizing.SpecOption("guaranteed", 1, 1000, 24576),
        rightsizing.SpecOption("guaranteed", 2, 1000, 24576),
        rightsizing.SpecOption("performance", 1, 750, 18432),
        rightsizing.SpecOption("shared", 1, 250, 6144),
    ]
    runs = [
        rightsizing.Run("a", 2, 24576, 4100, 3900, 20.0, batch_size=64),
        rightsizing.Run("b", 2, 24576, 4300, 4000, 18.0, batch_size=64),
    ]
    rec = rightsizing.recommend(runs, request=options[1], options=options, margin=0.25, scope="user")
    assert (rec.spec, rec.gpu_count, rec.fits_request) == ("shared", 1, False)
    assert rec.saves_gpu_milli == 2000 - 250 and rec.saves_gpu_memory_mib == 2 * 24576 - 6144
    assert rec.evidence.startswith("2 runs, peak 4.2 GiB of 24.0 GiB")
    # A peak above p95 + margin is still covered: never below what a run actually used.
    spiky = [rightsizing.Run("c", 1, 24576, 6500, 3000, 10.0)]
    rec = rightsizing.recommend(spiky, request=options[0], options=options, margin=0.1, scope="team")
    assert rec.spec == "performance" and rec.need_memory_mib == 6500
    assert rightsizing.recommend([], request=options[0], options=options, margin=0.1, scope="user") is None


def test_few_runs_of_evidence_get_a_wider_memory_margin():
    """One run says little about the next: the uncertainty allowance goes to a single run whole and shrinks as runs
    accumulate, so a model whose next run is larger is not sized down on one lucky sample."""
    options = [
        rightsizing.SpecOption("guaranteed", 1, 1000, 24576),
        rightsizing.SpecOption("performance", 1, 750, 18432),
    ]
    one = [rightsizing.Run("a", 1, 24576, 15000, 14500, 60.0)]
    # 14500 x (1 + 0.15 + 0.3) = 21025 MiB: more than the performance spec's 18432, so the request stands.
    rec = rightsizing.recommend(one, request=options[0], options=options, margin=0.15, uncertainty=0.3, scope="user")
    assert rec.fits_request and rec.memory_margin == pytest.approx(0.45) and "memory margin 45%" in rec.evidence
    # Without the allowance the same single run would have been sized down (14500 x 1.15 = 16675).
    assert not rightsizing.recommend(one, request=options[0], options=options, margin=0.15, scope="user").fits_request
    # Six consistent runs: 0.15 + 0.3 / 6 = 0.2 -> 17400 MiB, which the performance spec covers.
    six = [rightsizing.Run(str(i), 1, 24576, 15000, 14500, 60.0) for i in range(6)]
    rec = rightsizing.recommend(six, request=options[0], options=options, margin=0.15, uncertainty=0.3, scope="user")
    assert rec.spec == "performance" and rec.need_memory_mib == pytest.approx(14500 * 1.2)
    assert rec.as_dict()["memory_margin"] == 0.2


def test_batch_size_fills_the_recommended_memory():
    runs = [rightsizing.Run("a", 1, 24576, 2000 + 100 * b, 2000 + 100 * b, 50.0, batch_size=b) for b in (16, 32)]
    size, how = rightsizing.suggest_batch(runs, memory_mib=12000, margin=0.2)
    assert size == (12000 / 1.2 - 2000) // 100 and "fit over batch sizes 16, 32" in how


def test_leaks_are_told_from_a_ramp_that_levels_off():
    leak = [1000 + 50 * i for i in range(40)]
    ramp = [min(3000, 1000 + 200 * i) for i in range(40)]
    assert rightsizing.leak_suspected(leak, min_samples=12, min_growth=0.5)
    assert not rightsizing.leak_suspected(ramp, min_samples=12, min_growth=0.5)
    assert not rightsizing.leak_suspected(leak[:8], min_samples=12, min_growth=0.5)


def test_thinning_keeps_peaks_and_bounds_the_series():
    series = [[i, float(i % 97), 50.0, 100.0, 10.0] for i in range(5000)]
    thinned = rightsizing.thin(series, 700)
    assert len(thinned) <= 700 and max(p[1] for p in thinned) == 96.0


IDLE = (
    "import json, time\n"
    "print('TRAINYARD_EMULATED_GPU ' + json.dumps({'memory_mib': 1000, 'util_pct': 1}), flush=True)\n"
    "time.sleep(60)\n"
)


IDLE_WITH_CHECKPOINT = (
    "import json, os, time\n"
    "open(os.path.join(os.environ['TRAINYARD_CHECKPOINT_DIR'], 'ckpt-42.pt'), 'w').write('w42')\n"
    "print('TRAINYARD_EMULATED_GPU ' + json.dumps({'memory_mib': 1000, 'util_pct': 1}), flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.slow
def test_an_idle_job_is_flagged_then_stopped_after_its_notice(live_platform, fast_sampling, checkpoint_store):
    from jobs.models import Checkpoint

    fast_sampling.TRAINYARD_CHECKPOINT_SYNC_S = 120.0  # no periodic pass: only the final sync can save it
    Queue.objects.filter(name="train").update(
        idle_threshold_pct=5, idle_after_s=1, idle_action="stop", idle_stop_after_s=2
    )
    job = submit(live_platform, ["python3", "-c", IDLE_WITH_CHECKPOINT], spec="shared")
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "running", timeout=60)

    flagged = wait_for(lambda: services.usage_collect().idle_flagged, timeout=20, every=0.3)
    assert flagged == [f"{job.id}#1"]
    event = job.events.get(kind="gpu_idle")
    assert "stops it at" in event.message and event.data["action"] == "stop"
    alert = Alert.objects.get(rule_name="job-gpu-idle")
    assert alert.job_ids == [str(job.id)] and alert.level == "warning"
    assert Notification.objects.filter(alert=alert, user=live_platform).exists()
    assert Job.objects.get(pk=job.pk).state == "running"  # noticed, not stopped

    stopped = wait_for(lambda: services.usage_collect().idle_stopped, timeout=20, every=0.3)
    assert stopped == [f"{job.id}#1"]
    job = wait_for(lambda: ended(job), timeout=30)
    assert job.state == "cancelled" and job.reason == "idle_gpu"
    notice = job.events.get(kind="gpu_idle")
    stop = job.events.get(to_state="cancelling")
    assert stop.actor == "monitoring" and stop.at > notice.at and "stopped by queue train" in stop.message
    # Stopped through the ordinary cancel path: the final checkpoint sync saved what the job had written.
    assert Checkpoint.objects.get(job=job).name == "ckpt-42.pt"
    wait_for(lambda: final_profile(job))
    assert Alert.objects.get(rule_name="job-gpu-idle").state == "resolved"


@pytest.mark.slow
def test_an_idle_job_under_the_notify_action_is_only_flagged(live_platform, fast_sampling):
    Queue.objects.filter(name="train").update(idle_threshold_pct=5, idle_after_s=1, idle_action="notify")
    job = submit(live_platform, ["python3", "-c", IDLE], spec="shared")
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "running", timeout=60)
    wait_for(lambda: services.usage_collect().idle_flagged, timeout=20, every=0.3)
    for _ in range(5):
        assert not services.usage_collect().idle_stopped
    page = Client()
    page.force_login(live_platform)
    html = page.get(f"/jobs/{job.id}/").content.decode()
    assert "GPU idle" in html
    lifecycle.job_cancel(job_id=job.id, actor="demo")


LEAK = (
    "import json, time\n"
    "for step in range(300):\n"
    "    print('TRAINYARD_EMULATED_GPU ' + json.dumps({'memory_mib': 1000 + 100 * step, 'util_pct': 70}), flush=True)\n"
    "    time.sleep(0.1)\n"
    "time.sleep(60)\n"
)


@pytest.mark.slow
def test_memory_growing_across_steps_raises_a_warning_alert(live_platform, fast_sampling):
    fast_sampling.TRAINYARD_USAGE_INTERVAL_S = 0.1
    fast_sampling.TRAINYARD_LEAK_MIN_SAMPLES = 12
    job = submit(live_platform, ["python3", "-c", LEAK], spec="shared")
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "running", timeout=60)
    leaks = wait_for(lambda: services.usage_collect().leaks, timeout=20, every=0.5)
    assert leaks == [f"{job.id}#1"]
    alert = Alert.objects.get(rule_name="job-memory-leak")
    assert alert.level == "warning" and alert.job_ids == [str(job.id)] and "GPU memory grew" in alert.summary
    assert job.events.filter(kind="memory_leak").exists()
    lifecycle.job_cancel(job_id=job.id, actor="demo")


def finished_run(user, *, peak, p95, util, spec="guaranteed", command=("python3", "train.py"), batch=None):
    """An earlier run, as the telemetry loop leaves it: a succeeded job with a final usage profile."""
    from django.utils import timezone

    from jobs.models import Attempt
    from monitoring.models import BusinessMetric

    job = submit(user, list(command), spec=spec)
    Job.objects.filter(pk=job.pk).update(state="succeeded", finished_at=timezone.now())
    attempt = Attempt.objects.create(job=job, number=1, backend="local", state="succeeded", ended_at=timezone.now())
    UsageProfile.objects.create(
        attempt=attempt,
        job=job,
        final=True,
        samples=50,
        gpu_samples=50,
        gpu_source="emulated",
        gpu_memory_peak_mib=peak,
        gpu_memory_p95_mib=p95,
        gpu_util_mean_pct=util - 5,
        gpu_util_p95_pct=util,
    )
    if batch:
        BusinessMetric.objects.create(job=job, at=timezone.now(), values={"batch_size": batch}, source="api")
    return job


def test_the_form_the_page_the_cli_line_and_the_team_report_show_the_advice(db_platform):
    for peak in (3900, 4100, 4200):
        finished_run(db_platform, peak=peak, p95=peak - 300, util=18, batch=16)
    browser = Client()
    browser.force_login(db_platform)
    form = {
        "team": "demo",
        "queue": "train",
        "spec": "guaranteed",
        "image": "python-3.11",
        "command": "python3 train.py",
    }
    response = browser.post("/jobs/new/", form, follow=True)
    html = response.content.decode()
    job = Job.objects.order_by("-submitted_at").first()
    assert job.spec.name == "guaranteed" and job.gpu_memory_mib == 24576  # the request stands as asked
    assert "suggest spec shared with 1 GPU(s)" in html and "3 runs, peak 4.1 GiB of 24.0 GiB" in html
    assert 'id="recommendation"' in html and "freeing 750 GPU milli" in html
    assert 'id="recommendation-waits"' in html

    from trainyard_cli.main import recommendation_line

    body = api_as("demo").post("/api/v1/jobs/", {**form, "command": ["python3", "train.py"]}, format="json").json()
    line = recommendation_line(body["recommendation"])
    assert line.startswith("recommendation: spec shared with 1 GPU(s) would do (3 runs, peak 4.1 GiB of 24.0 GiB")
    assert "frees 750 GPU milli and 18432 MiB" in line and "batch size" in line
    # When the smaller request might start, in each of the team's queues offering the shared spec.
    waits = {w["queue"]: w for w in body["recommendation"]["expected_waits"]}
    assert "train" in waits
    assert set(waits["train"]) == {"queue", "low_s", "mid_s", "high_s", "known", "holders", "outlived"}
    # Another command has no history: no advice at all, rather than a guess.
    other = api_as("demo").post("/api/v1/jobs/", {**form, "command": ["python3", "other.py"]}, format="json").json()
    assert other["recommendation"] is None

    queue_page = browser.get("/queues/train/").content.decode()
    assert "stay below 5% utilization for 30 min is flagged" in queue_page
    team_page = browser.get("/teams/demo/").content.decode()
    assert 'id="rightsizing"' in team_page and "GPU-hours requested" in team_page


def test_the_evidence_reads_in_the_readers_language(db_platform):
    """The evidence is figures said in a sentence: the API keeps the English one, a page says it in Chinese."""
    from frontend.templatetags.portal import evidence

    for peak in (3900, 4100, 4200):
        finished_run(db_platform, peak=peak, p95=peak - 300, util=18, batch=16)
    job = submit(db_platform, ["python3", "train.py"])
    from monitoring.selectors import recommendation_for

    rec = recommendation_for(job)
    assert evidence(rec) == rec["evidence"]  # English: the same sentence the API returns, from the figures
    browser = Client()
    browser.force_login(db_platform)
    browser.post("/i18n/setlang/", {"language": "zh-hans", "next": "/jobs/"})
    page = browser.get(f"/jobs/{job.id}/").content.decode()
    assert "3 次运行，峰值 4.1 GiB（申请 24.0 GiB），GPU 利用率 p95 为 18%；显存余量 17%" in page
    assert "3 runs, peak" not in page


def test_a_teammates_runs_are_used_when_the_user_has_none(db_platform):
    from django.contrib.auth import get_user_model

    from quotas.models import Membership, Team

    mate = get_user_model().objects.create_user(username="mate", password="x-pass-123456")
    Membership.objects.create(user=mate, team=Team.objects.get(slug="demo"), role="member")
    finished_run(mate, peak=5000, p95=4800, util=90)
    body = (
        api_as("demo")
        .post(
            "/api/v1/jobs/",
            {
                "team": "demo",
                "queue": "train",
                "spec": "guaranteed",
                "image": "python-3.11",
                "command": ["python3", "train.py"],
            },
            format="json",
        )
        .json()
    )
    rec = body["recommendation"]
    # 90% of a card: no smaller spec computes it; the request fits, said so with the team's evidence.
    assert rec["scope"] == "team" and rec["fits_request"] and rec["evidence"].startswith("1 run, peak 4.9 GiB")


def test_a_repeated_submission_reuses_the_expected_waits_aged(db_platform, monkeypatch):
    """The expected waits replay the queue's whole line; a CI pipeline resubmitting the same command within the
    reuse period gets the answer already computed, less the time since, instead of another replay."""
    from jobs import eta
    from monitoring import selectors

    command = ["python3", f"train-{uuid.uuid4().hex[:8]}.py"]  # a key no earlier test left in the shared cache
    for peak in (3900, 4100):
        finished_run(db_platform, peak=peak, p95=peak - 300, util=18, batch=16, command=command)
    replays = []
    real = eta.estimate_starts
    monkeypatch.setattr(eta, "estimate_starts", lambda *a, **k: replays.append(1) or real(*a, **k))
    body = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11"}
    first = api_as("demo").post("/api/v1/jobs/", {**body, "command": command}, format="json").json()
    replayed = len(replays)
    assert replayed >= 1 and first["recommendation"]["expected_waits"]
    second = api_as("demo").post("/api/v1/jobs/", {**body, "command": command}, format="json").json()
    assert len(replays) == replayed  # served from the first answer
    assert [w["queue"] for w in second["recommendation"]["expected_waits"]] == [
        w["queue"] for w in first["recommendation"]["expected_waits"]
    ]
    assert selectors._aged({"low_s": 100, "mid_s": None, "high_s": 7, "known": True}, 10) == {
        "low_s": 90,
        "mid_s": None,
        "high_s": 0,
        "known": True,
    }
