"""The API as its OpenAPI schema describes it: every operation, a world to call it in, and response checks.

Shared by the authorization matrix and the fuzzing tests, so an endpoint added to the schema is covered by both
without editing either.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from datetime import timedelta
from functools import cache

import jsonschema
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

SECRET_ENV_VALUE = "team-demo-secret-value"


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # templated, /api/v1/jobs/{id}/
    spec: dict

    @property
    def unsafe(self) -> bool:
        return self.method not in {"get", "head", "options"}

    def __str__(self) -> str:
        return f"{self.method.upper()} {self.path}"


@cache
def schema() -> dict:
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


def operations() -> list[Operation]:
    order = {"get": 0, "post": 1, "patch": 1, "put": 1, "delete": 2}
    ops = [
        Operation(method, path, spec)
        for path, methods in schema()["paths"].items()
        for method, spec in methods.items()
        if method in order
    ]
    return sorted(ops, key=lambda op: (order[op.method], op.path))


@dataclass
class World:
    job_id: str
    other_job_id: str
    values: dict[str, str]


def make_world(registry_url: str | None = None) -> World:
    """Seeded platform; team demo (maintainer demo, member mia) with a job holding a secret; team other (olga);
    a project image of team demo with a failed build; a scan policy on queue train. Tags of the allow-listed
    registries are resolved against `registry_url` (the session's real registry, as a mirror), never the internet."""
    from cluster.models import GPU, Node
    from jobs import services
    from monitoring.models import Alert, AlertRule
    from ops.seed import seed
    from quotas.models import Membership, Queue, Team
    from quotas.tests.factories import MembershipFactory, TeamFactory, UserFactory
    from quotas.tokens import token_create

    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    demo_team = Team.objects.get(slug="demo")
    mia = UserFactory(username="mia")
    MembershipFactory(team=demo_team, user=mia, role=Membership.Role.MEMBER)
    other = TeamFactory(slug="other", name="Other team")
    for queue in Queue.objects.all():
        queue.teams.add(other)
    olga = UserFactory(username="olga")
    MembershipFactory(team=other, user=olga)
    base = {"queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]}
    job, _ = services.job_submit(user=mia, data={**base, "team": "demo", "env": {"API_KEY": SECRET_ENV_VALUE}})
    other_job, _ = services.job_submit(user=olga, data={**base, "team": "other"})
    gpu = GPU.objects.select_related("node").first()
    from monitoring.defaults import seed_rules

    seed_rules(AlertRule)  # a test that flushed the database (transactional) took the migration's rules with it
    rule = AlertRule.objects.first()
    now = timezone.now()
    alert = Alert.objects.create(
        rule=rule,
        rule_name=rule.name,
        level=rule.level,
        fingerprint="matrix",
        subject=gpu.uuid,
        gpu=gpu,
        job_ids=[str(job.id)],
        summary="matrix alert",
        started_at=now,
        last_seen_at=now,
        actions_taken=[{"action": "restart_job", "detail": f"stopped {job.id}#1", "attempts": [f"{job.id}#1"]}],
    )
    template = services.template_create(user=mia, team_slug="demo", name="matrix", body={**base})
    from images.models import BaseImage, ImageBuild, ProjectImage, Registry, ScanPolicy

    if registry_url:
        Registry.objects.update(endpoint=registry_url)
    project_image = ProjectImage.objects.create(
        team=demo_team,
        name="matrix",
        base=BaseImage.objects.get(name="python-3.11"),
        containerfile="FROM python-3.11\n",
    )
    build = ImageBuild.objects.create(project_image=project_image, status="failed", log="matrix build log")
    ScanPolicy.objects.create(queue=Queue.objects.get(name="train"), max_severity="critical")

    from jobs.models import Dataset

    dataset = Dataset.objects.create(team=demo_team, name="matrix", claim="matrix-data")
    from experiments.services import experiment_create

    experiment = experiment_create(
        user=mia,
        data={
            "name": "matrix",
            "team": "demo",
            "template": {**base, "command": ["echo", "{{lr}}"]},
            "space": {"lr": {"type": "log_uniform", "min": 0.001, "max": 0.1}},
            "metric": "loss",
        },
    )
    token, _ = token_create(user=get_user_model().objects.get(username="demo"), name="someone's")
    values = {
        "/jobs/{id}": str(job.id),
        "/monitoring/jobs/{id}": str(job.id),
        "/monitoring/alerts/{id}": str(alert.id),
        "/monitoring/rules/{id}": str(rule.id),
        "/monitoring/notifications/{id}": "999999",
        "/tokens/{id}": str(token.id),
        "/templates/{id}": str(template.id),
        "/datasets/{id}": str(dataset.id),
        "/experiments/{id}": str(experiment.id),
        "{uuid}": gpu.uuid,
        "/images/{name}": "python-3.11",
        "/project-images/{id}": str(project_image.id),
        "/image-builds/{id}": str(build.id),
        "/scan-policies/{queue}": "train",
        "/nodes/{name}": Node.objects.first().name,
        "/queues/{name}": "train",
        "/specs/{name}": "shared",
        "{slug}": "demo",
        "{username}": "mia",
        "{checkpoint_id}": "999999",
        "/code/{digest}": "sha256:" + "a" * 64,
    }
    return World(job_id=str(job.id), other_job_id=str(other_job.id), values=values)


def url_for(op: Operation, world: World) -> str:
    def value(match: re.Match) -> str:
        name = match.group(0)
        prefix = op.path[: match.start()].removeprefix("/api/v1").rstrip("/")
        for key, found in world.values.items():
            if key == name or (key.endswith(name) and prefix.endswith(key[: -len(name) - 1])):
                return found
        raise AssertionError(f"no value for {name} in {op}: add one to tests/api_matrix.py")

    return re.sub(r"\{\w+\}", value, op.path)


# ------------------------------------------------------------------------------------------------ principals

PRINCIPALS = ["anonymous", "member", "maintainer", "other_team", "staff", "revoked", "expired", "read_token"]


def client_for(principal: str) -> APIClient:
    from quotas.models import ApiToken
    from quotas.tokens import token_create

    users = get_user_model().objects
    client = APIClient()
    if principal in {"member", "maintainer", "other_team", "staff"}:
        name = {"member": "mia", "maintainer": "demo", "other_team": "olga", "staff": "admin"}[principal]
        client.force_login(users.get(username=name))
    elif principal in {"revoked", "expired", "read_token"}:
        scopes = ["read"] if principal == "read_token" else ["read", "submit", "admin"]
        token, raw = token_create(user=users.get(username="demo"), name=principal, scopes=scopes)
        if principal == "revoked":
            ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
        if principal == "expired":
            ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def call(client: APIClient, op: Operation, url: str, body=None, query=None):
    kwargs = {"format": "json"} if op.unsafe else {}
    if op.unsafe:
        kwargs["data"] = {} if body is None else body
    elif query:
        kwargs["data"] = query
    return getattr(client, op.method)(url, **kwargs)


# ----------------------------------------------------------------------------------------- schema checks


def _jsonschema(node):
    """OpenAPI 3.0 schema objects as JSON Schema: `nullable` becomes a null alternative; `oneOf` is read as
    `anyOf`, since drf-spectacular writes a blank-or-URL field as oneOf(maxLength 0, format uri) and JSON Schema
    does not check formats, so '' would match both."""
    if isinstance(node, list):
        return [_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    drop = {"nullable", "example", "readOnly", "writeOnly"}
    out = {("anyOf" if k == "oneOf" else k): _jsonschema(v) for k, v in node.items() if k not in drop}
    if node.get("nullable"):
        return {"anyOf": [out, {"type": "null"}]}
    return out


@cache
def _document() -> dict:
    return {"components": _jsonschema(copy.deepcopy(schema().get("components", {})))}


def check_against_schema(op: Operation, response) -> None:
    """A 2xx JSON body matches the schema's response for that status."""
    declared = op.spec.get("responses", {}).get(str(response.status_code))
    assert declared is not None, f"{op} answered {response.status_code}, which its schema does not list"
    content = (declared.get("content") or {}).get("application/json")
    if content is None or not response.content:
        return
    body_schema = {**_jsonschema(content["schema"]), **_document()}
    jsonschema.validate(response.json(), body_schema)
