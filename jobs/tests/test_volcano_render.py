"""The manifests the Volcano backend writes: valid against the real Volcano CRDs and Kubernetes' own schemas,
and saying what the platform means (placement, gang, provider resources, pod security, names).

Every (spec × sharing provider × single/distributed × with/without TensorBoard and volumes) combination is
rendered and validated: the Volcano Job against the openAPIV3Schema of every Volcano release the platform supports
(`../shared/volcano-crds/v1.9.0`, `v1.12.0`, `v1.14.0` and the newest snapshot at the top of that folder; unknown
fields rejected, since a real server would drop them silently), its pod templates against the PodTemplate schema of
Kubernetes 1.29 and of the newest release kubernetes-validate knows (strict). Queues and queue Commands are
validated against every release too, rendered for that release. Tests that need the CRD files skip with a message
saying how to get them, and fail instead under `CI=true`.
"""

from __future__ import annotations

import copy
import itertools
import json

import kubernetes_validate
import pytest

from jobs.backends import volcano_render as render
from jobs.backends.base import AttemptDescription, Device
from tests.fake_k8s import crds

K8S_VERSIONS = ("1.29", kubernetes_validate.latest_version())
CARD_MIB = 81559
JOB_ID = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0"
DIGEST_IMAGE = "nvcr.io/nvidia/pytorch:24.10-py3@sha256:" + "1" * 64

needs_crds = pytest.mark.usefixtures("volcano_crds")


@pytest.fixture
def volcano_crds():
    """Every release folder of the Volcano CRDs, by name (skips, or fails under CI=true, when one is missing)."""
    folders = crds.release_dirs()
    for folder in folders.values():
        crds.require(folder)
    return {name: crds.load_catalog(str(folder)) for name, folder in folders.items()}


def validate_everywhere(obj: dict, catalogs: dict) -> None:
    """Strict validation (unknown fields rejected) against every release."""
    for name, catalog in catalogs.items():
        try:
            catalog.validate(copy.deepcopy(obj))
        except crds.CrdValidationError as exc:
            raise AssertionError(f"Volcano {name}: {exc}") from None


# name → (exclusive, gpu_count, compute milli per card, memory eighths per card)
SPECS = {
    "guaranteed": (True, 1, 1000, 8),
    "guaranteed-x4": (True, 4, 1000, 8),
    "performance": (False, 1, 750, 6),
    "shared": (False, 1, 250, 2),
}
PROVIDERS = render.SHARING_PROVIDERS


def describe(spec: str = "guaranteed", *, replicas: int = 1, extras: bool = False, **overrides) -> AttemptDescription:
    exclusive, count, milli, eighths = SPECS[spec]
    devices = []
    for replica in range(replicas):
        for card in range(count if exclusive else 1):
            devices.append(
                Device(
                    gpu_uuid=f"GPU-{replica:02d}{card:02d}aaaa-0000-0000-0000-000000000000",
                    gpu_index=card,
                    node=f"gpu-node-{replica}",
                    compute_milli=milli,
                    memory_mib=CARD_MIB * eighths // 8,
                    exclusive=exclusive,
                )
            )
    fields = dict(
        job_id=JOB_ID,
        attempt_id=41,
        attempt_number=2,
        name="resnet sweep",
        owner="alice",
        team="vision",
        namespace="team-vision",
        queue="distributed" if replicas > 1 else "train",
        volcano_queue="trainyard-distributed" if replicas > 1 else "trainyard-train",
        image=DIGEST_IMAGE,
        command=["python", "train.py"],
        args=["--epochs", "3"],
        env={"WANDB_MODE": "offline"},
        working_dir="",
        replicas=replicas,
        gpu_count=count,
        exclusive=exclusive,
        cpu_milli=8000 * count,
        memory_mib=65536 * count,
        timeout_s=7200,
        priority=0,
        min_driver_version="",
        tensorboard=False,
        tensorboard_logdir="",
        devices=devices,
        mounts=[],
        labels={},
        gang=replicas > 1,
        secondary_network="",
    )
    if extras:
        fields.update(
            tensorboard=True,
            tensorboard_logdir="/ckpt/tb",
            min_driver_version="550.54.15",
            mounts=[
                {"claim": "imagenet", "path": "/data", "read_only": True},
                {"claim": "vision-ckpt", "path": "/ckpt", "kind": "checkpoint", "sub_path": "resnet"},
            ],
            labels={"sweep": "lr-0.1", "git": "abc123"},
            secondary_network="kube-system/rdma-net",
            working_dir="src",
        )
    fields.update(overrides)
    return AttemptDescription(**fields)


def options(provider: str = "whole", **overrides) -> render.RenderOptions:
    return render.RenderOptions(
        sharing=provider,
        ttl_s=900,
        priority_class="trainyard-batch",
        grace_s=20,
        image_pull_secrets=("registry-cred",),
        **overrides,
    )


def templates(job: dict) -> dict[str, dict]:
    return {task["name"]: task["template"] for task in job["spec"]["tasks"]}


def trainer(template: dict) -> dict:
    return next(c for c in template["spec"]["containers"] if c["name"] == "trainer")


def validate_pod_template(template: dict) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template},
            version,
            strict=True,
        )


# ------------------------------------------------------------------------------------------ every manifest


@pytest.mark.parametrize("extras", [False, True], ids=["plain", "tensorboard+volumes"])
@pytest.mark.parametrize("replicas", [1, 3], ids=["single", "distributed"])
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("spec", list(SPECS))
def test_every_manifest_validates_and_keeps_the_platform_rules(spec, provider, replicas, extras, volcano_crds):
    desc = describe(spec, replicas=replicas, extras=extras)
    job = render.render_job(desc, options(provider))

    validate_everywhere(job, volcano_crds)  # the real Job CRD of every release, unknown fields rejected
    for template in templates(job).values():
        validate_pod_template(template)

    spec_ = job["spec"]
    assert job["metadata"]["namespace"] == "team-vision" and spec_["queue"] == desc.volcano_queue
    assert spec_["schedulerName"] == "volcano" and spec_["maxRetry"] == 0
    assert spec_["ttlSecondsAfterFinished"] == 900 and spec_["priorityClassName"] == "trainyard-batch"
    assert spec_["minAvailable"] == replicas == sum(t["replicas"] for t in spec_["tasks"])
    assert all(t["minAvailable"] == t["replicas"] and t["maxRetry"] == 0 for t in spec_["tasks"])
    assert {p["event"]: p["action"] for p in spec_["policies"]} == {
        "PodFailed": "TerminateJob",
        "PodEvicted": "TerminateJob",
    }
    labels = job["metadata"]["labels"]
    assert labels["trainyard.io/job-id"] == JOB_ID and labels["trainyard.io/attempt"] == "2"
    assert labels["trainyard.io/attempt-id"] == "41" and labels["app.kubernetes.io/managed-by"] == "trainyard"
    if replicas > 1:
        assert set(spec_["plugins"]) == {"env", "svc"}
        assert spec_["plugins"]["svc"] == ["--disable-network-policy"]
        # one task per replica, each pinned to its own placement, with torch.distributed's rendezvous
        assert [(t["name"], t["replicas"]) for t in spec_["tasks"]] == [("master", 1), ("worker-1", 1), ("worker-2", 1)]
        for rank, task in enumerate(spec_["tasks"]):
            env = {e["name"]: e["value"] for e in trainer(task["template"])["env"]}
            assert (env["RANK"], env["WORLD_SIZE"]) == (str(rank), "3")
            assert env["MASTER_ADDR"] == f"{job['metadata']['name']}-master-0.{job['metadata']['name']}"
            pinned = task["template"]["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]
            assert {tuple(t["matchFields"][0]["values"]) for t in pinned["nodeSelectorTerms"]} == {
                (f"gpu-node-{rank}",)
            }
    else:
        assert "plugins" not in spec_ and [t["name"] for t in spec_["tasks"]] == ["main"]

    for template in templates(job).values():
        pod = template["spec"]
        assert template["metadata"]["labels"]["trainyard.io/job-id"] == JOB_ID
        assert pod["restartPolicy"] == "Never" and pod["schedulerName"] == "volcano"
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        assert pod["imagePullSecrets"] == [{"name": "registry-cred"}]
        assert not any("hostPath" in v for v in pod["volumes"])
        assert "hostNetwork" not in pod and "hostPID" not in pod and "hostIPC" not in pod
        for container in pod["containers"] + pod.get("initContainers", []):
            security = container["securityContext"]
            assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
            assert security["capabilities"] == {"drop": ["ALL"]} and security["runAsNonRoot"] is True
        main = trainer(template)
        assert main["image"] == DIGEST_IMAGE and main["imagePullPolicy"] == "IfNotPresent"
        assert main["securityContext"]["readOnlyRootFilesystem"] is False  # no job field asks for a read-only root
        assert main["resources"]["requests"] == main["resources"]["limits"]
        fields = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert all(term["matchFields"][0]["key"] == "metadata.name" for term in fields["nodeSelectorTerms"])
        annotations = template["metadata"]["annotations"]
        if extras:
            assert annotations["k8s.v1.cni.cncf.io/networks"] == "kube-system/rdma-net"
            assert json.loads(annotations["trainyard.io/labels"]) == {"sweep": "lr-0.1", "git": "abc123"}
            mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
            assert mounts["/data"]["readOnly"] is True and mounts["/ckpt"]["subPath"] == "resnet"
            # driver >= 550.54.15 on GFD's numeric labels, in the names of GFD 0.15+ and of older releases
            assert len(fields["nodeSelectorTerms"]) == 6
        else:
            assert "k8s.v1.cni.cncf.io/networks" not in annotations and len(fields["nodeSelectorTerms"]) == 1
        # The trainer runs under ty-exec, copied into an emptyDir by an init container of the platform's image.
        assert main["command"] == ["/.trainyard-exec/ty-exec", "--", "python", "train.py"]
        assert main["args"] == ["--epochs", "3"]
        assert {"name": "ty-exec", "mountPath": "/.trainyard-exec", "readOnly": True} in main["volumeMounts"]
        [installer] = [c for c in pod["initContainers"] if c["name"] == "ty-exec"]
        assert installer["command"] == ["ty-exec", "--copy-to", "/.trainyard-exec"]
        assert installer["securityContext"] == render._container_security(read_only_root=True)
        assert installer["volumeMounts"] == [{"name": "ty-exec", "mountPath": "/.trainyard-exec"}]
        assert not any(e["name"].startswith("TRAINYARD_S3") for e in installer["env"])  # no store keys
        assert {"name": "ty-exec", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    sidecars = [
        c for t in templates(job).values() for c in t["spec"].get("initContainers", []) if c["name"] != "ty-exec"
    ]
    assert [c["name"] for c in sidecars] == (["tensorboard"] if extras else [])


# ------------------------------------------------------------------------------------------ GPU providers


@pytest.mark.parametrize(
    ("provider", "spec", "expected", "pin"),
    [
        ("whole", "guaranteed-x4", {"nvidia.com/gpu": "4"}, None),
        ("whole", "shared", {"nvidia.com/gpu.shared": "1"}, None),
        (
            "volcano-vgpu",
            "guaranteed",
            {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": str(CARD_MIB), "volcano.sh/vgpu-cores": "100"},
            "volcano.sh/vgpu-use-gpuuuid",
        ),
        (
            "volcano-vgpu",
            "shared",
            {
                "volcano.sh/vgpu-number": "1",
                "volcano.sh/vgpu-memory": str(CARD_MIB * 2 // 8),
                "volcano.sh/vgpu-cores": "25",
            },
            "volcano.sh/vgpu-use-gpuuuid",
        ),
    ],
)
def test_gpu_requests_follow_the_sharing_provider(provider, spec, expected, pin):
    desc = describe(spec)
    template = templates(render.render_job(desc, options(provider)))["main"]
    resources = trainer(template)["resources"]["limits"]
    assert {k: v for k, v in resources.items() if k not in ("cpu", "memory")} == expected
    assert resources["cpu"] == f"{desc.cpu_milli}m" and resources["memory"] == f"{desc.memory_mib}Mi"
    annotations = template["metadata"]["annotations"]
    pins = {k for k in annotations if k.endswith("use-gpuuuid")}
    if pin is None:
        assert pins == set()
    else:
        assert pins == {pin} and annotations[pin].split(",") == sorted(d.gpu_uuid for d in desc.devices)
    env = {e["name"]: e["value"] for e in trainer(template)["env"]}
    if not desc.exclusive:
        assert env["CUDA_DEVICE_SM_LIMIT"] == str(desc.devices[0].compute_milli // 10)


def test_cards_without_a_published_uuid_are_not_pinned():
    desc = describe("shared", devices=[Device("K8S-gpu-node-0-3", 3, "gpu-node-0", 250, 20389, False)])
    template = templates(render.render_job(desc, options("volcano-vgpu")))["main"]
    assert "volcano.sh/vgpu-use-gpuuuid" not in template["metadata"]["annotations"]


def test_unknown_provider_is_refused_with_the_setting_named():
    with pytest.raises(render.ManifestError, match="TRAINYARD_K8S_SHARING"):
        render.RenderOptions(sharing="mig")


def test_hami_is_refused_and_volcano_vgpu_named_instead():
    # HAMi's webhook skips pods Volcano schedules and Volcano's enqueue counts gpumem/gpucores as resources no
    # node has (real Volcano in tests/k8s/test_backend_on_the_cluster.py): such jobs would never start, so the
    # setting is refused.
    with pytest.raises(render.ManifestError, match="TRAINYARD_K8S_SHARING=volcano-vgpu"):
        render.RenderOptions(sharing="hami")


@pytest.mark.parametrize("ttl", [0, 60, render.MIN_TTL_S - 1])
def test_a_ttl_too_short_to_read_the_outcome_is_refused(ttl):
    with pytest.raises(render.ManifestError, match="TRAINYARD_K8S_TTL_S"):
        render.RenderOptions(ttl_s=ttl)
    assert render.RenderOptions(ttl_s=render.MIN_TTL_S).ttl_s == render.MIN_TTL_S


def test_pods_are_scheduled_by_volcano_and_distributed_jobs_keep_out_of_the_svc_network_policy():
    job = render.render_job(describe(replicas=3, tensorboard=True), options())
    assert job["spec"]["schedulerName"] == "volcano"
    assert {t["template"]["spec"]["schedulerName"] for t in job["spec"]["tasks"]} == {"volcano"}
    # The svc plugin's NetworkPolicy would admit only the job's own pods, shutting out TensorBoard's ingress.
    assert job["spec"]["plugins"]["svc"] == ["--disable-network-policy"]


# ------------------------------------------------------------------------------------------ placement


def _matches(term: dict, name: str, labels: dict[str, str]) -> bool:
    """Kubernetes' nodeSelectorTerm semantics for the operators the renderer uses."""
    for field in term.get("matchFields", []):
        if name not in field["values"]:
            return False
    for expr in term.get("matchExpressions", []):
        value = labels.get(expr["key"])
        if expr["operator"] == "In" and value not in expr["values"]:
            return False
        if expr["operator"] == "Gt" and (value is None or int(value) <= int(expr["values"][0])):
            return False
    return True


def _schedulable(template: dict, name: str, labels: dict[str, str]) -> bool:
    terms = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return any(_matches(term, name, labels) for term in terms["nodeSelectorTerms"])


def _driver_labels(version: str) -> dict[str, str]:
    major, minor, revision = version.split(".")
    return {
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": revision,
    }


@pytest.mark.parametrize(
    ("node_driver", "fits"),
    [
        ("550.54.15", True),
        ("550.54.14", False),
        ("550.90.07", True),
        ("550.40.99", False),
        ("560.28.03", True),
        ("535.183.01", False),
    ],
)
def test_node_affinity_pins_the_placed_node_and_the_images_minimum_driver(node_driver, fits):
    template = templates(render.render_job(describe(min_driver_version="550.54.15"), options()))["main"]
    assert _schedulable(template, "gpu-node-0", _driver_labels(node_driver)) is fits
    assert not _schedulable(template, "gpu-node-7", _driver_labels("560.28.03"))  # never off the placement


def test_a_model_pinned_job_requires_the_gpu_product_label(volcano_crds):
    desc = describe(gpu_products=["NVIDIA-A100-SXM4-80GB"], min_driver_version="550.54.15")
    job = render.render_job(desc, options())
    validate_everywhere(job, volcano_crds)
    template = templates(job)["main"]
    validate_pod_template(template)
    a100 = {**_driver_labels("560.28.03"), "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    h100 = {**_driver_labels("560.28.03"), "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert _schedulable(template, "gpu-node-0", a100)
    assert not _schedulable(template, "gpu-node-0", h100)
    unpinned = templates(render.render_job(describe(), options()))["main"]
    assert "nvidia.com/gpu.product" not in json.dumps(unpinned)


def test_distributed_workers_stay_in_the_rack_of_their_placement():
    desc = describe("guaranteed", replicas=3)
    racks = {f"gpu-node-{i}": {"trainyard.io/rack": "r12", "kubernetes.io/hostname": f"gpu-node-{i}"} for i in range(3)}
    job = render.render_job(desc, options(), node_labels=racks)
    master, worker = templates(job)["master"], templates(job)["worker-2"]
    assert _schedulable(master, "gpu-node-0", {"trainyard.io/rack": "r12"})
    assert not _schedulable(worker, "gpu-node-2", {"trainyard.io/rack": "r13"})
    assert _schedulable(worker, "gpu-node-2", {"trainyard.io/rack": "r12"})
    assert not _schedulable(worker, "gpu-node-0", {"trainyard.io/rack": "r12"})  # the master's node, not a worker's
    # each worker only on its own placed node: Volcano cannot stack two workers on one of them
    assert not _schedulable(worker, "gpu-node-1", {"trainyard.io/rack": "r12"})

    racks["gpu-node-2"] = {"trainyard.io/rack": "r13"}  # placement spans racks: no rack rule can hold
    spanning = render.render_job(desc, options(), node_labels=racks)
    assert _schedulable(templates(spanning)["worker-2"], "gpu-node-2", {"trainyard.io/rack": "r13"})
    unlabelled = render.render_job(desc, options(), node_labels={})
    assert "trainyard.io/rack" not in json.dumps(unlabelled)


# ------------------------------------------------------------------------------------------ names, volumes


def test_names_are_deterministic_and_fit_kubernetes_limits():
    desc = describe("guaranteed", replicas=64)
    first, again = render.render_job(desc, options()), render.render_job(desc, options())
    assert first == again
    name = first["metadata"]["name"]
    assert name == "ty-0f1e2d3c4b5a49688776a5b4c3d2e1f0-2"
    assert len(f"{name}-worker-62-0") <= 63 and name[0].isalpha()
    assert render.job_name(JOB_ID, 3) != name


@pytest.mark.parametrize(
    "mount",
    [
        {"host_path": "/var/run/docker.sock", "path": "/sock"},
        {"hostPath": {"path": "/"}, "path": "/host"},
        {"claim": "data", "path": "relative/path"},
        {"claim": "data", "path": "/"},
        {"claim": "Data_Set", "path": "/data"},
        {"claim": "data", "path": "/data", "sub_path": "../other-team"},
    ],
)
def test_mounts_other_than_claims_at_absolute_paths_are_refused(mount):
    with pytest.raises(render.ManifestError):
        render.render_job(describe(mounts=[mount]), options())


def test_tensorboard_dir_outside_any_mount_gets_its_own_volume_and_a_sidecar_on_the_master_only():
    job = render.render_job(describe("guaranteed", replicas=2, tensorboard=True), options())
    master, worker = templates(job)["master"], templates(job)["worker-1"]
    sidecar = master["spec"]["initContainers"][0]
    assert sidecar["restartPolicy"] == "Always" and sidecar["ports"][0]["containerPort"] == 6006
    assert master["metadata"]["labels"]["trainyard.io/tensorboard"] == "true"
    assert "trainyard.io/tensorboard" not in worker["metadata"]["labels"]
    assert [c["name"] for c in worker["spec"]["initContainers"]] == ["ty-exec"]
    env = {e["name"]: e["value"] for e in trainer(master)["env"]}
    assert env["TRAINYARD_TENSORBOARD_LOGDIR"] == render.DEFAULT_TB_DIR
    assert render.DEFAULT_TB_DIR in {m["mountPath"] for m in trainer(master)["volumeMounts"]}
    assert all(m.get("readOnly") or m["mountPath"] == "/tmp" for m in sidecar["volumeMounts"])


# ------------------------------------------------------------------------------------------ queues, routes


@pytest.mark.parametrize("provider", PROVIDERS)
def test_queues_validate_against_each_release_and_carry_the_platform_quota(provider, volcano_crds):
    vector = {"gpu_milli": 4000, "gpu_memory_mib": 98304, "cpu_milli": 64000, "memory_mib": 262144}
    for name, catalog in volcano_crds.items():
        version = crds.release_version(name) or (9, 99)
        queue = render.render_queue(
            name="trainyard-train",
            vector=vector,
            weight=3,
            priority=-5,
            fifo=True,
            sharing=provider,
            platform_queue="train",
            volcano_version=version,
        )
        catalog.validate(copy.deepcopy(queue))  # strict: a field the release lacks would be dropped by the server
        spec = queue["spec"]
        assert spec["reclaimable"] is False and spec["weight"] == 3
        assert ("priority" in spec) is (version >= (1, 10)) and ("dequeueStrategy" in spec) is (version >= (1, 14))
        if version >= (1, 14):
            assert spec["priority"] == 0 and spec["dequeueStrategy"] == "fifo"
        assert spec["capability"]["cpu"] == "64000m" and spec["capability"]["memory"] == "262144Mi"
        gpu = {k: v for k, v in spec["capability"].items() if k not in ("cpu", "memory")}
        # Every GPU resource a platform pod may ask for is capped (a resource left out is unlimited from 1.9).
        assert (
            gpu
            == {
                "whole": {"nvidia.com/gpu": "4", "nvidia.com/gpu.shared": "16"},
                "volcano-vgpu": {
                    "volcano.sh/vgpu-memory": "98304",
                    "volcano.sh/vgpu-number": "16",
                    "volcano.sh/vgpu-cores": "400",
                },
            }[provider]
        )
        # Reading the release off the installed CRD renders the same queue.
        properties = catalog.crd_schema(*render.QUEUE_API)["properties"]["spec"]["properties"]
        detected = render.queue_version_from_schema(properties)
        assert (
            render.render_queue(
                name="trainyard-train",
                vector=vector,
                weight=3,
                priority=-5,
                fifo=True,
                sharing=provider,
                platform_queue="train",
                volcano_version=detected,
            )
            == queue
        )
        command = render.render_queue_command(
            queue="trainyard-train", uid="5e1f-uid", action="CloseQueue", namespace="trainyard"
        )
        catalog.validate(copy.deepcopy(command))
        assert command["target"]["kind"] == "Queue" and command["target"]["name"] == "trainyard-train"
        assert command["target"]["uid"] == "5e1f-uid" and command["action"] == "CloseQueue"


@pytest.mark.parametrize("text", ["1.9", "v1.12.0", "1.14.2-rc.1"])
def test_volcano_versions_parse(text):
    assert render.parse_version(text) >= render.MIN_VOLCANO_VERSION


@pytest.mark.parametrize("text", ["", "latest", "1", "one.two"])
def test_a_volcano_version_that_is_not_one_is_refused_with_the_setting_named(text):
    with pytest.raises(render.ManifestError, match="TRAINYARD_VOLCANO_VERSION"):
        render.parse_version(text)
    with pytest.raises(render.ManifestError, match="TRAINYARD_VOLCANO_VERSION"):
        render.RenderOptions(volcano_version=(1, 8))


def test_tensorboard_route_objects_validate_against_kubernetes():
    host = render.tensorboard_host(JOB_ID, "tb.example.org.")
    assert host == "tb-0f1e2d3c4b5a49688776a5b4c3d2e1f0.tb.example.org"
    service = render.render_tensorboard_service(job_id=JOB_ID, namespace="team-vision")
    ingress = render.render_tensorboard_ingress(
        job_id=JOB_ID,
        namespace="team-vision",
        host=host,
        ingress_class="nginx",
        auth_url="https://ty.example.org/tb/{job_id}/",
        tls_secret="tb-wildcard",
    )
    for obj in (service, ingress):
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    assert service["spec"]["selector"] == {"trainyard.io/job-id": JOB_ID, "trainyard.io/tensorboard": "true"}
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/auth-url"].endswith(f"/tb/{JOB_ID}/")
    with pytest.raises(render.ManifestError, match="TRAINYARD_TB_BASE_DOMAIN"):
        render.tensorboard_host(JOB_ID, "")


def test_driver_alternatives_cover_each_precision():
    assert render.driver_alternatives("") == []
    major, legacy_major = render.DRIVER_LABELS[0], render.LEGACY_DRIVER_LABELS[0]
    assert render.driver_alternatives("550") == [
        [{"key": major, "operator": "Gt", "values": ["549"]}],
        [{"key": legacy_major, "operator": "Gt", "values": ["549"]}],
    ]
    two = render.driver_alternatives("520.61")
    assert [len(a) for a in two] == [1, 2, 1, 2] and two[1][-1] == {
        "key": render.DRIVER_LABELS[1],
        "operator": "Gt",
        "values": ["60"],
    }
    assert list(itertools.chain.from_iterable(render.driver_alternatives("550.54.15")))[-1]["values"] == ["14"]


@pytest.mark.parametrize(("node_driver", "fits"), [("550.54.15", True), ("550.54.14", False), ("560.28.03", True)])
def test_nodes_labelled_by_gfd_before_0_15_still_match_the_minimum_driver(node_driver, fits):
    template = templates(render.render_job(describe(min_driver_version="550.54.15"), options()))["main"]
    major, minor, revision = node_driver.split(".")
    legacy = dict(zip(render.LEGACY_DRIVER_LABELS, (major, minor, revision), strict=True))
    assert _schedulable(template, "gpu-node-0", legacy) is fits


@pytest.mark.parametrize("admission_class", ["inference", "training", "preemptible"])
def test_each_admission_class_gets_its_priority_class_and_a_borrower_its_notice(admission_class, volcano_crds):
    import yaml

    from tests.test_k8s_manifests import K8S

    notice = 45 if admission_class == "preemptible" else 0
    job = render.render_job(describe(priority_class=admission_class, preempt_notice_s=notice), options())
    validate_everywhere(job, volcano_crds)
    name = job["spec"]["priorityClassName"]
    assert name == f"trainyard-{admission_class}"
    # A borrower holds no quota: it never rides in the queue whose capability is the quota it runs beyond.
    wanted_queue = render.BORROWED_QUEUE if admission_class == "preemptible" else describe().volcano_queue
    assert job["spec"]["queue"] == wanted_queue
    shipped = {d["metadata"]["name"]: d for d in yaml.safe_load_all((K8S / "priority-classes.yaml").read_text())}
    assert name in shipped  # the object the job names is one k8s/ creates
    values = [shipped[f"trainyard-{c}"]["value"] for c in ("inference", "training", "preemptible")]
    assert values == sorted(values, reverse=True) and shipped["trainyard-preemptible"]["preemptionPolicy"] == "Never"
    pod = trainer(templates(job)["main"])
    env = {e["name"]: e.get("value") for e in pod["env"]}
    grace = templates(job)["main"]["spec"]["terminationGracePeriodSeconds"]
    if notice:
        assert env["TRAINYARD_PREEMPT_NOTICE"] == "45" and grace == 45
    else:
        assert "TRAINYARD_PREEMPT_NOTICE" not in env and grace == 20
    validate_pod_template(templates(job)["main"])


@pytest.mark.parametrize("profile", ["1g.10gb", "3g.40gb"])
def test_a_mig_job_requests_its_profile_on_kubernetes(profile, volcano_crds):
    job = render.render_job(describe("guaranteed", mig_profile=profile), options())
    validate_everywhere(job, volcano_crds)
    template = templates(job)["main"]
    resources = trainer(template)["resources"]
    assert resources["limits"][f"nvidia.com/mig-{profile}"] == "1"
    assert "nvidia.com/gpu" not in resources["limits"]
    validate_pod_template(template)


# ------------------------------------------------------------------------------------------ stderr wrapper


def test_the_stderr_wrapper_can_be_switched_off_and_is_left_out_without_a_command():
    """TRAINYARD_K8S_STDERR_WRAPPER=false, or a job that runs its image's entrypoint (no command for the pod to put
    behind ty-exec): the trainer's command is the job's, and no init container copies the wrapper."""
    for desc, opts in [
        (describe(), options(stderr_wrapper=False)),
        (describe(command=[]), options()),
    ]:
        pod = templates(render.render_job(desc, opts))["main"]["spec"]
        assert trainer({"spec": pod})["command"] == list(desc.command)
        assert "initContainers" not in pod
        assert not any(v["name"] == "ty-exec" for v in pod["volumes"])


def test_a_mount_over_the_wrappers_folder_is_refused():
    with pytest.raises(render.ManifestError, match="stderr wrapper"):
        render.render_job(describe(mounts=[{"claim": "data", "path": "/.trainyard-exec"}]), options())


def test_the_wrappers_installer_of_a_guaranteed_pod_keeps_the_pod_guaranteed():
    job = render.render_job(describe("guaranteed"), options())
    pod = templates(job)["main"]["spec"]
    [installer] = pod["initContainers"]
    assert installer["resources"]["requests"] == installer["resources"]["limits"] == render.GUARANTEED_HELPER


def test_a_queue_bound_to_a_dedicated_pool_tolerates_its_taint_and_no_other_pod_does():
    kept = templates(render.render_job(describe(dedicated_pools=["secure"]), options()))["main"]["spec"]
    assert kept["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "trainyard.io/pool", "operator": "Equal", "value": "secure", "effect": "NoSchedule"},
    ]
    plain = templates(render.render_job(describe(), options()))["main"]["spec"]
    assert not any(t["key"] == "trainyard.io/pool" for t in plain["tolerations"])
