"""The admin console as a staff user sees it: every page loads, quota edits are audited and take effect,
jobs are view-only but cancellable, rules with broken regexes are refused, pool actions go through services."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse

from cluster.models import GPU, Node, PoolRepair
from cluster.services import gpu_mark_suspect
from images.models import BaseImage, ProjectImage
from jobs import services as job_services
from jobs import store
from jobs.models import FailureRule, Job
from jobs.states import JobState, PendingReason
from ops.seed import seed
from quotas.models import ApiToken, Queue, QuotaChange, ResourceSpec, Team
from quotas.services import team_quota_update
from quotas.tokens import token_create

ADMIN_PASSWORD = "admin-pass-123"


@pytest.fixture
def world(settings, tmp_path, db):
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    settings.TRAINYARD_EMULATED_FAULTS_FILE = str(tmp_path / "faults.json")
    settings.TRAINYARD_WORK_ROOT = tmp_path / "work"
    settings.TRAINYARD_LOG_ROOT = tmp_path / "logs"
    seed(admin_password=ADMIN_PASSWORD, demo_password="demo-pass-123")
    users = get_user_model().objects
    return {
        "admin": users.get(username="admin"),
        "demo": users.get(username="demo"),
        "team": Team.objects.get(slug="demo"),
    }


@pytest.fixture
def staff(world) -> Client:
    client = Client()
    assert client.login(username="admin", password=ADMIN_PASSWORD)
    return client


def submit(user, **overrides) -> Job:
    data = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]}
    data.update(overrides)
    job, created = job_services.job_submit(user=user, data=data)
    assert created
    return job


def change_url(obj) -> str:
    return reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])


def changelist_url(model) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def form_data(response) -> dict:
    """The POST body a browser would send back unchanged from an admin change page (main form + inlines)."""
    data: dict = {}

    def put(form, name: str) -> None:
        value = form[name].value()
        if value is None or value is False:
            return
        data[form.add_prefix(name)] = "on" if value is True else value

    main = response.context["adminform"].form
    for name in main.fields:
        put(main, name)
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        for name in formset.management_form.fields:
            data[f"{formset.prefix}-{name}"] = formset.management_form[name].value()
        for form in formset.initial_forms:
            for name in form.fields:
                put(form, name)
    return data


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# ---------------------------------------------------------------------------------------------- access


def test_non_staff_user_is_sent_to_the_admin_login(world):
    client = Client()
    assert client.login(username="demo", password="demo-pass-123")
    for url in ("/admin/", changelist_url(Team), changelist_url(Job)):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/admin/login/"), response["Location"]


def test_every_registered_model_has_a_working_changelist_and_change_page(world, staff, transactional_db):
    team, admin_user = world["team"], world["admin"]
    job = submit(world["demo"])
    assert store.dispatch(queue_ids=[job.queue_id]).admitted == 1
    failed = submit(world["demo"], command=["false"])
    job_services.job_transition(job_id=failed.pk, to=JobState.FAILED, actor="test", reason="test")
    team_quota_update(team=team, changes={"max_running_jobs": 30}, actor=admin_user)
    token_create(user=world["demo"], name="ci")
    gpu_mark_suspect(gpu=GPU.objects.order_by("index").last(), reason="probe failed in a test")
    ProjectImage.objects.create(
        team=team, name="ours", base=BaseImage.objects.get(name="python-3.11"), reference="registry.local/demo/ours:1"
    )
    Group.objects.create(name="operators")

    expected = {
        "quotas.team",
        "quotas.queue",
        "quotas.resourcespec",
        "quotas.apitoken",
        "quotas.quotachange",
        "images.registry",
        "images.baseimage",
        "images.projectimage",
        "cluster.node",
        "cluster.gpu",
        "cluster.logicaldevice",
        "cluster.poolrepair",
        "jobs.job",
        "jobs.failurerule",
    }
    registered = {model._meta.label_lower for model in admin.site._registry}
    assert expected <= registered, expected - registered

    broken = []
    for model in admin.site._registry:
        response = staff.get(changelist_url(model))
        if response.status_code != 200:
            broken.append(f"{changelist_url(model)} -> {response.status_code}")
        obj = model._default_manager.order_by("pk").first()
        if obj is None:
            # Models other apps register may have no rows in this world; the console's own must.
            if model._meta.label_lower in expected:
                broken.append(f"{model._meta.label}: no row to open")
            continue
        response = staff.get(change_url(obj))
        if response.status_code != 200:
            broken.append(f"{change_url(obj)} -> {response.status_code}")
    assert not broken, broken

    gpu_page = staff.get(changelist_url(GPU)).content.decode()
    assert f"{job.name} ({job.pk}) attempt #1, team demo, demo" in gpu_page
    assert PoolRepair.objects.exists()


# ---------------------------------------------------------------------------------------------- quotas


def test_team_quota_change_in_the_admin_is_audited_and_admits_a_waiting_job(world, staff, transactional_db):
    team, admin_user = world["team"], world["admin"]
    team_quota_update(team=team, changes={"gpu_milli": 250}, actor=None)
    first = submit(world["demo"])
    assert store.dispatch(queue_ids=[first.queue_id]).admitted == 1
    job = submit(world["demo"])
    assert store.dispatch(queue_ids=[job.queue_id]).admitted == 0
    job.refresh_from_db()
    assert (job.state, job.reason) == (JobState.PENDING, PendingReason.TEAM_QUOTA_EXHAUSTED)

    page = staff.get(change_url(team))
    data = form_data(page)
    # Quota is typed in GPUs and GiB (stored in milli and MiB).
    assert str(data["gpu_milli"]) == "0.25" and data["memberships-TOTAL_FORMS"] == 1
    assert str(data["gpu_memory_mib"]) == str(Decimal(team.gpu_memory_mib) / 1024)
    data.update(gpu_milli="1", max_jobs_per_user="12")
    response = staff.post(change_url(team), data)
    assert response.status_code == 302, response.context["adminform"].form.errors

    changes = {(c.field, c.old_value, c.new_value): c.actor for c in QuotaChange.objects.filter(team=team)}
    assert changes == {
        ("gpu_milli", "4000", "250"): None,
        ("gpu_milli", "250", "1000"): admin_user,
        ("max_jobs_per_user", "10", "12"): admin_user,
    }
    team.refresh_from_db()
    assert (team.gpu_milli, team.max_jobs_per_user, team.memberships.count()) == (1000, 12, 1)

    assert store.dispatch(queue_ids=[job.queue_id]).admitted == 1
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED

    listing = staff.get(changelist_url(Team)).content.decode()
    assert "0.5 of 1 GPU (50%)" in listing and 'class="quota-usage"' in listing
    page = staff.get(change_url(team)).content.decode()
    assert "GPU memory (GiB)" in page and "0.5 of 1 GPU (50%)" in page
    audit = staff.get(change_url(team)).content.decode()
    assert "quota changes (audit trail)" in audit.lower() and "admin" in audit


def test_quota_audit_rows_cannot_be_edited_or_deleted(world, staff):
    team_quota_update(team=world["team"], changes={"cpu_milli": 1}, actor=world["admin"])
    row = QuotaChange.objects.get()
    page = staff.get(change_url(row))
    assert page.status_code == 200 and 'name="new_value"' not in page.content.decode()
    assert staff.post(change_url(row), {"new_value": "999"}).status_code == 403
    delete = reverse("admin:quotas_quotachange_delete", args=[row.pk])
    assert staff.post(delete, {"post": "yes"}).status_code == 403
    row.refresh_from_db()
    assert row.new_value == "1"


def test_queue_edits_and_close_action_go_through_the_audited_service(world, staff):
    queue = Queue.objects.get(name="debug")
    data = form_data(staff.get(change_url(queue)))
    data.update(gpu_milli="3", description="quick runs")
    response = staff.post(change_url(queue), data)
    assert response.status_code == 302, response.context["adminform"].form.errors

    response = staff.post(
        changelist_url(Queue), {"action": "close_queues", "_selected_action": [queue.pk]}, follow=True
    )
    assert any("Closed 1 queue(s): debug" in m for m in messages_of(response))
    queue.refresh_from_db()
    assert (queue.state, queue.gpu_milli, queue.description) == ("closed", 3000, "quick runs")
    audited = set(
        QuotaChange.objects.filter(queue=queue, actor=world["admin"]).values_list("field", "old_value", "new_value")
    )
    assert audited == {("gpu_milli", "2000", "3000"), ("state", "open", "closed")}


def test_queue_default_timeout_above_maximum_is_a_form_error(world, staff):
    queue = Queue.objects.get(name="debug")
    data = form_data(staff.get(change_url(queue)))
    data.update(default_timeout_s=str(queue.max_timeout_s + 1))
    response = staff.post(change_url(queue), data)
    assert response.status_code == 200
    assert "exceeds the maximum" in str(response.context["adminform"].form.errors["default_timeout_s"])
    assert not QuotaChange.objects.exists()


def test_a_team_slug_that_names_the_shared_bases_is_a_form_error(world, staff):
    """`trainyard/base/` in the registry is the shared catalog: a team slugged `base` would own it."""
    from images.services import SHARED_NAMESPACE
    from quotas.models import RESERVED_TEAM_SLUGS

    assert SHARED_NAMESPACE in RESERVED_TEAM_SLUGS
    team = world["team"]
    data = form_data(staff.get(change_url(team)))
    data.update(slug="base")
    response = staff.post(change_url(team), data)
    assert response.status_code == 200
    assert "is reserved" in str(response.context["adminform"].form.errors["slug"])
    team.refresh_from_db()
    assert team.slug == "demo"


def test_queue_and_spec_time_limits_read_and_type_in_hours_and_minutes(world, staff):
    queue = Queue.objects.get(name="debug")
    page = staff.get(change_url(queue)).content.decode()
    assert 'name="max_timeout_s" value="4h"' in page and 'name="default_timeout_s" value="1h"' in page
    assert "1h / 4h" in staff.get(changelist_url(Queue)).content.decode()
    data = form_data(staff.get(change_url(queue)))
    data.update(default_timeout_s="30m", max_timeout_s="2h 30m")
    response = staff.post(change_url(queue), data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    queue.refresh_from_db()
    assert (queue.default_timeout_s, queue.max_timeout_s) == (1800, 9000)
    data.update(default_timeout_s="soon")
    refused = staff.post(change_url(queue), data)
    assert "is not a duration" in str(refused.context["adminform"].form.errors["default_timeout_s"])
    data.update(default_timeout_s="3h")
    refused = staff.post(change_url(queue), data)
    assert "the default time limit (3h) exceeds the maximum (2h 30m)" in str(
        refused.context["adminform"].form.errors["default_timeout_s"]
    )

    spec = ResourceSpec.objects.get(name="shared")
    assert 'name="default_timeout_s" value="2h"' in staff.get(change_url(spec)).content.decode()
    listing = staff.get(changelist_url(ResourceSpec)).content.decode()
    assert "0.25 GPU" in listing and ">2h<" in listing
    data = form_data(staff.get(change_url(spec)))
    data.update(default_timeout_s="90m")
    assert staff.post(change_url(spec), data).status_code == 302
    spec.refresh_from_db()
    assert spec.default_timeout_s == 5400


def test_token_list_never_shows_digests_and_revoke_action_revokes(world, staff):
    token, raw = token_create(user=world["demo"], name="ci")
    listing = staff.get(changelist_url(ApiToken)).content.decode()
    detail = staff.get(change_url(token)).content.decode()
    assert token.prefix in listing
    for page in (listing, detail):
        assert token.digest not in page and raw not in page
    response = staff.post(
        changelist_url(ApiToken), {"action": "revoke_tokens", "_selected_action": [token.pk]}, follow=True
    )
    assert "Revoked 1 token(s)." in messages_of(response)
    token.refresh_from_db()
    assert token.revoked_at is not None


# ---------------------------------------------------------------------------------------------- jobs


def test_cancel_action_cancels_a_pending_job_and_names_the_finished_one(world, staff):
    pending = submit(world["demo"])
    finished = submit(world["demo"], command=["false"])
    job_services.job_transition(job_id=finished.pk, to=JobState.FAILED, actor="test", reason="test")

    response = staff.post(
        changelist_url(Job), {"action": "cancel_jobs", "_selected_action": [pending.pk, finished.pk]}, follow=True
    )
    assert response.status_code == 200
    shown = messages_of(response)
    assert f"Cancelled 1 job(s): {pending.name} ({pending.pk})." in shown
    assert f"Could not cancel 1 job(s): {finished.name} ({finished.pk}): the job already failed." in shown
    pending.refresh_from_db()
    finished.refresh_from_db()
    assert (pending.state, finished.state) == (JobState.CANCELLED, JobState.FAILED)
    assert pending.events.filter(to_state=JobState.CANCELLED, actor="admin").exists()


def test_a_job_state_cannot_be_edited(world, staff):
    job = submit(world["demo"])
    name = job.name
    page = staff.get(change_url(job))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="state"' not in html and "pending" in html
    response = staff.post(change_url(job), {"state": JobState.SUCCEEDED, "name": "renamed"})
    assert response.status_code == 403
    job.refresh_from_db()
    assert (job.state, job.name) == (JobState.PENDING, name)
    assert staff.get(reverse("admin:jobs_job_add")).status_code == 403


def test_jobs_can_be_found_by_id_owner_and_filtered_by_state(world, staff):
    job = submit(world["demo"])
    other = submit(world["demo"], command=["false"])
    job_services.job_transition(job_id=other.pk, to=JobState.FAILED, actor="test", reason="test")
    by_id = staff.get(changelist_url(Job), {"q": str(job.pk)[:13]})
    assert [j.pk for j in by_id.context["cl"].result_list] == [job.pk]
    by_owner = staff.get(changelist_url(Job), {"q": "demo"})
    assert {j.pk for j in by_owner.context["cl"].result_list} == {job.pk, other.pk}
    failed = staff.get(changelist_url(Job), {"state__exact": "failed"})
    assert [j.pk for j in failed.context["cl"].result_list] == [other.pk]


# ---------------------------------------------------------------------------------------------- rules


def rule_post(**overrides) -> dict:
    data = {
        "name": "custom-segfault",
        "order": "5",
        "enabled": "on",
        "exit_codes": "[]",
        "signals": "[11]",
        "reason_pattern": "",
        "log_pattern": "",
        "failure_class": "user",
        "reaction": "no_retry",
        "suggestion": "The program crashed.",
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize("field", ["log_pattern", "reason_pattern"])
def test_a_rule_with_a_broken_regex_is_a_form_error(world, staff, field):
    response = staff.post(reverse("admin:jobs_failurerule_add"), rule_post(**{field: "Segfault (unclosed"}))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "Not a valid regular expression" in str(errors[field])
    assert not FailureRule.objects.filter(name="custom-segfault").exists()


def test_a_valid_rule_saves_and_order_is_editable_from_the_list(world, staff):
    response = staff.post(reverse("admin:jobs_failurerule_add"), rule_post(log_pattern=r"Segmentation fault"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    rule = FailureRule.objects.get(name="custom-segfault")
    assert (rule.signals, rule.log_pattern) == ([11], "Segmentation fault")

    response = staff.post(reverse("admin:jobs_failurerule_add"), rule_post(name="nothing", signals="[]"))
    assert "at least one condition" in str(response.context["adminform"].form.non_field_errors())

    listing = staff.get(changelist_url(FailureRule))
    formset = listing.context["cl"].formset
    data = {
        f"form-{k}": v
        for k, v in {"TOTAL_FORMS": formset.total_form_count(), "INITIAL_FORMS": formset.initial_form_count()}.items()
    }
    for i, form in enumerate(formset.forms):
        data[f"form-{i}-id"] = form.instance.pk
        data[f"form-{i}-order"] = 500 if form.instance.pk == rule.pk else form.instance.order
        if form.instance.enabled and form.instance.pk != rule.pk:
            data[f"form-{i}-enabled"] = "on"
    data["_save"] = "Save"
    response = staff.post(changelist_url(FailureRule), data)
    assert response.status_code == 302
    rule.refresh_from_db()
    assert (rule.order, rule.enabled) == (500, False)


# ---------------------------------------------------------------------------------------------- pool and images


def test_cordon_and_quarantine_actions(world, staff):
    node = Node.objects.get()
    gpu = node.gpus.order_by("index").first()
    response = staff.post(changelist_url(Node), {"action": "cordon_nodes", "_selected_action": [node.pk]}, follow=True)
    assert f"Cordoned 1 node(s): {node.name}." in messages_of(response)
    node.refresh_from_db()
    assert node.state == Node.State.CORDONED
    staff.post(changelist_url(Node), {"action": "uncordon_nodes", "_selected_action": [node.pk]})
    node.refresh_from_db()
    assert node.state == Node.State.READY

    staff.post(changelist_url(GPU), {"action": "quarantine_gpus", "_selected_action": [gpu.pk]})
    gpu.refresh_from_db()
    assert gpu.quarantined and gpu.health == GPU.Health.UNHEALTHY and "admin" in gpu.quarantine_reason
    staff.post(changelist_url(GPU), {"action": "return_gpus_to_service", "_selected_action": [gpu.pk]})
    gpu.refresh_from_db()
    assert (gpu.quarantined, gpu.health) == (False, GPU.Health.HEALTHY)


def test_image_pages_list_compatible_and_incompatible_nodes(world, staff):
    node = Node.objects.get()
    image = ProjectImage.objects.create(
        team=world["team"],
        name="needs-new-driver",
        min_driver_version="999.1",
        base=BaseImage.objects.get(name="python-3.11"),
        reference="registry.local/demo/new:1",
    )
    detail = staff.get(change_url(image)).content.decode()
    assert f"<td>{node.name}</td><td>{node.driver_version}</td>" in detail
    assert "no: needs driver ≥ 999.1" in detail
    listing = staff.get(changelist_url(ProjectImage)).content.decode()
    assert f"0 of 1 nodes. Compatible: none. Incompatible: {node.name} (driver {node.driver_version})" in listing
    base_listing = staff.get(changelist_url(BaseImage)).content.decode()
    assert f"1 of 1 nodes. Compatible: {node.name} (driver {node.driver_version})" in base_listing


def test_staff_cordon_and_uncordon_nodes_over_the_api(world):
    from rest_framework.test import APIClient

    from quotas.tests.factories import UserFactory

    node = Node.objects.get()
    api = APIClient()
    api.force_authenticate(UserFactory(username="ops", is_staff=True))
    member = APIClient()
    member.force_authenticate(UserFactory(username="plain"))
    url = f"/api/v1/nodes/{node.name}/"
    assert member.post(url + "cordon/").status_code == 403
    response = api.post(url + "cordon/")
    assert response.status_code == 200 and response.json()["state"] == "cordoned"
    assert api.post(url + "cordon/").json()["state"] == "cordoned"  # again: nothing to do, same answer
    response = api.post(url + "uncordon/")
    assert response.status_code == 200 and response.json()["state"] == "ready"
    Node.objects.filter(pk=node.pk).update(state=Node.State.UNHEALTHY)
    refused = api.post(url + "cordon/")
    assert refused.status_code == 409 and refused.json()["code"] == "node_not_ready"
    assert api.post(url + "uncordon/").json()["code"] == "node_not_cordoned"
    assert api.post("/api/v1/nodes/no-such-node/cordon/").status_code == 404
