"""What the platform writes into a team's namespace (jobs/backends/team_namespace.py), checked without a cluster:
the quota follows the team's and the sharing provider, the sidecar headroom really covers the platform's sidecars,
every object validates against the Kubernetes schemas, and a team change on the Volcano backend sends the sync.
The behaviour on a real API server (quota admission, drift) is tests/k8s/test_team_namespaces.py."""

from __future__ import annotations

import kubernetes_validate
import pytest
from kubernetes.utils import parse_quantity

from jobs.backends import team_namespace as tn
from jobs.backends import volcano_render as render
from jobs.tests.test_k8s_storage import PREFIX, S3_DATASET, with_store
from jobs.tests.test_volcano_render import describe, templates

TEAM = tn.TeamSpace(slug="vision", namespace="trainyard-vision", gpu_milli=2500, gpu_memory_mib=200000,
                    cpu_milli=16000, memory_mib=131072, max_running_jobs=3)  # fmt: skip


def objects(sharing: str = "whole") -> list[dict]:
    return tn.render_team_namespace(TEAM, sharing=sharing, shared_resource="nvidia.com/gpu.shared",
                                    service_account="trainyard", system_namespace="trainyard")  # fmt: skip


@pytest.mark.parametrize("version", ["1.29", kubernetes_validate.latest_version()])
def test_every_object_validates(version):
    for obj in objects():
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", ["1.29", kubernetes_validate.latest_version()])
def test_the_teams_registry_pull_secret_validates_and_a_changed_credential_is_drift(version):
    config = '{"auths": {"registry.local": {"username": "team.vision", "password": "p"}}}'
    rendered = tn.render_team_namespace(TEAM, sharing="whole", shared_resource="nvidia.com/gpu.shared",
                                        service_account="trainyard", system_namespace="trainyard",
                                        pull_config=config)  # fmt: skip
    secret = rendered[-1]
    kubernetes_validate.validate(secret, version, strict=True)
    assert (secret["kind"], secret["metadata"]["name"], secret["type"]) == (
        "Secret", tn.PULL_SECRET, "kubernetes.io/dockerconfigjson",
    )  # fmt: skip
    assert tn.drifted(secret, secret) == []
    other = tn.render_pull_secret(TEAM, config.replace('"p"', '"q"'))
    assert tn.drifted(secret, other) == ["data"]
    assert [o["kind"] for o in objects()].count("Secret") == 0  # no token service: no Secret


def test_the_quota_follows_the_team_and_the_sharing_provider():
    whole = objects("whole")[1]["spec"]["hard"]
    assert (whole["requests.nvidia.com/gpu"], whole["requests.nvidia.com/gpu.shared"]) == ("2", "10")
    assert whole["pods"] == "13"  # 10 quarter cards + 3 jobs
    assert parse_quantity(whole["requests.cpu"]) == 16 + 13 * parse_quantity("400m")
    vgpu = objects("volcano-vgpu")[1]["spec"]["hard"]
    assert vgpu["requests.volcano.sh/vgpu-memory"] == "200000"  # GPU memory: the provider exposes it
    assert (vgpu["requests.volcano.sh/vgpu-number"], vgpu["requests.volcano.sh/vgpu-cores"]) == ("10", "250")
    assert "requests.nvidia.com/gpu" not in vgpu


def test_the_sidecar_headroom_covers_the_platforms_own_containers():
    """The quota adds SIDECAR_*_PER_POD per pod for the platform's sidecars: a pod with every one of them
    (TensorBoard, the checkpoint sync, a dataset fetcher) requests no more than that beside its trainer."""
    rendered = []
    for spec in ("guaranteed", "shared"):  # Guaranteed QoS pods (requests = limits) and the others
        desc = describe(spec, extras=True, checkpoint={"prefix": PREFIX}, datasets=[S3_DATASET])
        rendered += templates(render.render_job(desc, with_store())).values()
    for template in rendered:
        spec = template["spec"]
        sidecars = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
        others = [c for c in spec["containers"] if c["name"] != "trainer"]
        assert {c["name"] for c in sidecars} >= {"tensorboard", render.CHECKPOINT_SIDECAR}
        cpu = sum(parse_quantity(c["resources"]["requests"]["cpu"]) for c in sidecars + others)
        memory = sum(parse_quantity(c["resources"]["requests"]["memory"]) for c in sidecars + others)
        assert cpu * 1000 <= tn.SIDECAR_CPU_MILLI_PER_POD and memory <= tn.SIDECAR_MEMORY_MIB_PER_POD * 2**20


def test_drift_ignores_server_defaults_and_quantity_spelling_but_not_a_changed_limit():
    quota = objects()[1]
    stored = {**quota, "metadata": {**quota["metadata"], "labels": {**quota["metadata"]["labels"], "x": "y"}},
              "spec": {"hard": {**quota["spec"]["hard"], "requests.cpu": "21200m"}, "scopes": None}}  # fmt: skip
    stored["spec"]["hard"]["requests.memory"] = str(parse_quantity(quota["spec"]["hard"]["requests.memory"]))
    assert tn.drifted(quota, stored) == []
    stored["spec"]["hard"]["pods"] = "1"
    assert tn.drifted(quota, stored) == ["spec"]
    del stored["metadata"]["labels"][render.MANAGED_BY]
    assert tn.drifted(quota, stored) == ["labels", "spec"]


def test_a_team_change_on_the_volcano_backend_sends_its_namespace_sync(settings, db, monkeypatch,
                                                                       django_capture_on_commit_callbacks):  # fmt: skip
    from jobs import tasks
    from quotas.models import Team
    from quotas.services import team_quota_update

    sent = []
    monkeypatch.setattr(tasks.sync_team_namespace, "delay", sent.append)  # the task itself runs on the real cluster
    team = Team.objects.create(name="Vision", slug="vision", namespace="trainyard-vision")
    settings.TRAINYARD_BACKEND = "local"
    with django_capture_on_commit_callbacks(execute=True):
        team_quota_update(team=team, changes={"gpu_milli": 1000}, actor=None)
    assert sent == []  # no cluster: nothing to keep
    settings.TRAINYARD_BACKEND = "volcano"
    with django_capture_on_commit_callbacks(execute=True):
        team_quota_update(team=team, changes={"gpu_milli": 2000}, actor=None)
    assert sent == [team.id]
    settings.TRAINYARD_K8S_MANAGE_NAMESPACES = False
    with django_capture_on_commit_callbacks(execute=True):
        team_quota_update(team=team, changes={"gpu_milli": 3000}, actor=None)
    assert sent == [team.id]


def test_a_guaranteed_jobs_pods_are_guaranteed_qos_with_whole_cores_and_others_are_not():
    """What the static CPU manager needs to give a pod cores of its own: Guaranteed QoS (every container, init
    containers too, with requests equal to limits) and an integer CPU count on the trainer."""
    odd = describe("guaranteed", extras=True, checkpoint={"prefix": PREFIX}, datasets=[S3_DATASET], cpu_milli=2500)
    for template in templates(render.render_job(odd, with_store())).values():
        spec = template["spec"]
        containers = [*spec.get("initContainers", []), *spec["containers"]]
        assert len(containers) >= 4  # trainer, TensorBoard, checkpoint sync, dataset fetcher
        for c in containers:
            assert c["resources"]["requests"] == c["resources"]["limits"], c["name"]
        trainer = next(c for c in spec["containers"] if c["name"] == render.MAIN_CONTAINER)
        assert parse_quantity(trainer["resources"]["requests"]["cpu"]) == 3  # 2.5 cores asked: 3 whole ones
    shared = describe("shared", extras=True, checkpoint={"prefix": PREFIX})
    for template in templates(render.render_job(shared, with_store())).values():
        sidecars = [c for c in template["spec"]["initContainers"] if c.get("restartPolicy") == "Always"]
        assert any(c["resources"]["requests"] != c["resources"]["limits"] for c in sidecars)  # Burstable: shares
    # A job without sidecars stays Guaranteed whatever its spec: the stderr wrapper's installer asks what it limits.
    plain = describe("shared")
    for template in templates(render.render_job(plain, with_store())).values():
        containers = [*template["spec"].get("initContainers", []), *template["spec"]["containers"]]
        assert render.TY_EXEC in {c["name"] for c in containers}
        assert all(c["resources"]["requests"] == c["resources"]["limits"] for c in containers)


@pytest.mark.django_db
def test_a_guaranteed_request_is_admitted_in_whole_cores(settings):
    from jobs import services
    from ops.seed import seed
    from quotas.models import ResourceSpec

    settings.TRAINYARD_BACKEND = "local"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    ResourceSpec.objects.filter(name="guaranteed").update(cpu_milli_per_gpu=2500)
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.get(username="demo")
    data = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11", "command": ["true"]}
    job, _ = services.job_submit(user=user, data=data)
    assert job.cpu_milli == 3000
    shared, _ = services.job_submit(user=user, data={**data, "spec": "shared"})
    assert shared.cpu_milli % 1000 or shared.cpu_milli == ResourceSpec.objects.get(name="shared").cpu_milli_per_gpu


def test_job_pods_pull_with_their_teams_secret_only_where_the_platform_keeps_it(settings, tmp_path):
    from images import registry_tokens
    from jobs.backends import volcano

    key = tmp_path / "registry-token.key"
    registry_tokens.ensure_key(key)
    settings.TRAINYARD_K8S_IMAGE_PULL_SECRETS = ["site-wide"]
    settings.TRAINYARD_REGISTRY_URL = "https://registry.example"
    settings.TRAINYARD_K8S_MANAGE_NAMESPACES = True
    settings.TRAINYARD_REGISTRY_TOKEN_KEY = str(key)
    assert volcano.config_from_settings().render.image_pull_secrets == ("site-wide", tn.PULL_SECRET)
    config = volcano._team_pull_config("vision")
    assert '"username": "team.vision"' in config and "registry.example" in config
    settings.TRAINYARD_REGISTRY_TOKEN_KEY = ""  # shared mode: the site-wide secrets only, no team Secret to keep
    assert volcano.config_from_settings().render.image_pull_secrets == ("site-wide",)
    assert volcano._team_pull_config("vision") == ""
