"""The manifests in k8s/ that deploy Trainyard itself: valid for Kubernetes 1.34 (kubernetes-validate, strict,
offline) and for the real Volcano CRDs, secure by default, consistent with the seed data, and granting the
backend's service account exactly the API verbs the Volcano backend and the Kubernetes image builder use — no more,
no less.

The RBAC check replays every backend operation against the fake API server, turns each request into the
(API group, resource, verb, scope) an authorizer would check, and compares that set with the rules.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes.utils import parse_quantity

from images import k8s_build
from jobs.backends import volcano_render as render
from jobs.backends.base import AttemptDescription, Device
from jobs.backends.volcano import VolcanoBackend, VolcanoConfig
from tests.fake_k8s import FakeKubernetes, crds

K8S = Path(__file__).resolve().parents[1] / "k8s"
K8S_VERSIONS = ("1.29", kubernetes_validate.latest_version())
TEAM_NS, SYSTEM_NS, BUILD_NS = "trainyard-demo", "trainyard", "trainyard-builds"
DATASET = {"id": 7, "team": "demo", "name": "imagenet", "version": 3, "path": "/data", "kind": "s3",
           "prefix": "datasets/imagenet/3/", "claim": "", "size_bytes": 1000, "file_count": 10}  # fmt: skip


def documents() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):  # k8s/*/ (e.g. prometheus/) belongs to other deployments
        if path.name == "kustomization.yaml":
            continue
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def kind(name: str) -> list[dict]:
    return [doc for _, doc in documents() if doc["kind"] == name]


def deployment(component: str) -> dict:
    return next(d for d in kind("Deployment") if d["metadata"]["labels"]["app.kubernetes.io/component"] == component)


def pod_specs() -> Iterator[tuple[str, dict]]:
    for doc in kind("Deployment") + kind("Job"):
        yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


# ------------------------------------------------------------------------------------------ validity


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)


@pytest.mark.parametrize(
    ("filename", "doc"), [pytest.param(f, d, id=f"{f}:{d['kind']}/{d['metadata']['name']}") for f, d in documents()]
)
def test_each_object_validates_against_its_schema(filename, doc):
    if doc["apiVersion"].startswith(("scheduling.volcano.sh/", "batch.volcano.sh/", "bus.volcano.sh/")):
        # `kubectl apply -k k8s/` must work on every release the README promises, the oldest (1.9) first: strict,
        # since a field an older release lacks would be dropped, or refused by kubectl.
        for name, folder in crds.release_dirs().items():
            crds.require(folder)
            try:
                crds.load_catalog(str(folder)).validate(copy.deepcopy(doc))
            except crds.CrdValidationError as exc:
                raise AssertionError(f"Volcano {name}: {exc}") from None
    else:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_four_processes_are_deployed_with_probes_and_resources():
    web, worker, beat = deployment("web"), deployment("worker"), deployment("beat")
    dispatcher = deployment("dispatcher")
    container = web["spec"]["template"]["spec"]["containers"][0]
    allowed = kind("ConfigMap")[0]["data"]["TRAINYARD_ALLOWED_HOSTS"].split(",")
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        host = next(h["value"] for h in container[probe]["httpGet"]["httpHeaders"] if h["name"] == "Host")
        assert host in allowed  # else Django answers the kubelet 400 and the pod never becomes ready
    assert "inspect ping" in " ".join(
        worker["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["command"]
    )
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    # One dispatcher, a solo-pool worker on the dispatch queue (ops.processes "dispatcher").
    assert dispatcher["spec"]["replicas"] == 1 and dispatcher["spec"]["strategy"]["type"] == "Recreate"
    command = " ".join(dispatcher["spec"]["template"]["spec"]["containers"][0]["command"])
    assert "--pool solo" in command
    assert "-Q ${TRAINYARD_DISPATCH_QUEUE:-${TRAINYARD_CELERY_QUEUE:-trainyard}.dispatch}" in command
    for name, spec in pod_specs():
        for c in spec["containers"]:
            requests, limits = c["resources"]["requests"], c["resources"]["limits"]
            assert set(requests) == set(limits) == {"cpu", "memory"}, name
            assert parse_quantity(requests["memory"]) <= parse_quantity(limits["memory"]), name
            assert {"name": "trainyard-config"} in [e.get("configMapRef") for e in c["envFrom"]], name


def test_pods_are_locked_down():
    for name, spec in pod_specs():
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert not any("hostPath" in v for v in spec.get("volumes", [])), name
        assert not (spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC")), name
        for c in spec["containers"]:
            security = c["securityContext"]
            assert security["allowPrivilegeEscalation"] is False and security["privileged"] is False, name
            assert security["readOnlyRootFilesystem"] is True and security["capabilities"] == {"drop": ["ALL"]}, name
    automount = {name: spec.get("automountServiceAccountToken", True) for name, spec in pod_specs()}
    assert automount == {
        "trainyard-web": True,
        "trainyard-worker": True,
        "trainyard-dispatcher": True,
        "trainyard-beat": False,
        "trainyard-migrate": False,
        "trainyard-build-proxy": False,
    }
    enforced = {
        n["metadata"]["name"]: n["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] for n in kind("Namespace")
    }
    # Only image builds (rootless BuildKit: seccomp and AppArmor unconfined) run outside "restricted".
    assert enforced == {"trainyard": "restricted", TEAM_NS: "restricted", BUILD_NS: "privileged"}
    assert kind("ConfigMap")[0]["data"]["TRAINYARD_K8S_BUILD_NAMESPACE"] == BUILD_NS


def test_the_web_has_a_writable_code_root_of_its_own():
    """Uploads of code snapshots are checked on the replica's disk before they go to the object store: with a
    read-only root, TRAINYARD_CODE_ROOT (under the image's TRAINYARD_VAR_DIR) must be a volume, one per replica."""
    var = re.search(r"TRAINYARD_VAR_DIR=(\S+)", (K8S.parent / "Dockerfile").read_text()).group(1)
    code_root = kind("ConfigMap")[0]["data"].get("TRAINYARD_CODE_ROOT", f"{var}/code")
    spec = deployment("web")["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    assert code_root in mounts, mounts
    volume = next(v for v in spec["volumes"] if v["name"] == mounts[code_root])
    assert "emptyDir" in volume and "persistentVolumeClaim" not in volume
    assert deployment("web")["spec"]["replicas"] >= 2  # why it must not be the only copy: the store is


def test_configmap_sets_only_documented_settings():
    documented = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", (K8S.parent / ".env.example").read_text(), re.M))
    data = kind("ConfigMap")[0]["data"]
    assert set(data) <= documented, set(data) - documented
    assert data["TRAINYARD_BACKEND"] == "volcano" and data["TRAINYARD_NVML_PROBE"] == "false"
    assert data["TRAINYARD_K8S_NAMESPACE"] == SYSTEM_NS


def test_the_web_tier_believes_x_forwarded_for_only_from_the_configured_ingress(settings):
    """Behind the ingress every connection comes from the ingress controller's pods: without trusted proxies every
    client would share their address, and 20 failed logins anywhere would lock the login for everyone."""
    from kernel.guards import trusted_proxies_check

    command = deployment("web")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--forwarded-allow-ips") + 1] == "$(TRAINYARD_TRUSTED_PROXIES)"
    assert "--proxy-headers" in command and "--no-proxy-headers" not in command
    placeholder = kind("ConfigMap")[0]["data"]["TRAINYARD_TRUSTED_PROXIES"]
    assert placeholder.startswith("SET-ME")  # the operator must put the ingress controller's pod CIDR there
    assert trusted_proxies_check(placeholder) == [placeholder]  # left as is, the web pods say so at start
    assert trusted_proxies_check("10.244.0.0/16, 10.0.0.7") == []


def test_volcano_queues_match_the_seeded_platform_queues():
    from ops.seed import QUEUES

    queues = {q["metadata"]["name"]: q for q in kind("Queue")}
    assert set(queues) == {f"trainyard-{q['name']}" for q in QUEUES} | {render.BORROWED_QUEUE}
    assert queues.pop(render.BORROWED_QUEUE) == render.render_borrowed_queue()  # what every queue sync keeps
    for data in QUEUES:
        vector = {k: data[k] for k in ("gpu_milli", "gpu_memory_mib", "cpu_milli", "memory_mib")}
        expected = render.render_queue(
            name=f"trainyard-{data['name']}",
            vector=vector,
            weight=1,
            priority=data["priority"],
            fifo=data["ordering"] == "fifo",
            sharing="whole",
            platform_queue=data["name"],
        )
        actual = queues[expected["metadata"]["name"]]
        assert actual["metadata"]["labels"] == expected["metadata"]["labels"]
        spec, want = dict(actual["spec"]), dict(expected["spec"])
        assert {k: parse_quantity(v) for k, v in spec.pop("capability").items()} == {
            k: parse_quantity(v) for k, v in want.pop("capability").items()
        }
        assert spec == want


# ------------------------------------------------------------------------------------------ build network


def selects(selector: dict, labels: dict) -> bool:
    """Whether a LabelSelector (matchLabels, matchExpressions) picks an object with `labels`; {} picks every one."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        held = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}[op]  # fmt: skip
        if not held:
            return False
    return True


def egress_of(pod_labels: dict, namespace: str) -> dict[str, list]:
    """The egress rules of every NetworkPolicy in k8s/ that selects a pod with these labels, by policy name."""
    return {
        p["metadata"]["name"]: p["spec"].get("egress", [])
        for p in kind("NetworkPolicy")
        if p["metadata"]["namespace"] == namespace
        and "Egress" in p["spec"]["policyTypes"]
        and selects(p["spec"]["podSelector"], pod_labels)
    }


def peers(rules: list) -> list[dict]:
    return [peer for rule in rules for peer in rule.get("to", [])]


@pytest.mark.parametrize("network", ["none", "allowlist", "outbound"])
def test_a_build_pod_reaches_dns_the_registry_and_what_its_network_adds(network):
    """k8s/build-network.yaml, as a CNI plugin would read it for the pod the platform renders: nothing may connect
    to a build pod; it reaches kube-dns on 53 and the registry placeholder on 443; with allowlist also the build
    proxy's pods (and only on 3128), with outbound the public internet; never the platform's namespace otherwise."""
    *_, job = k8s_build.render_build_job(
        build_id=7, containerfile="FROM scratch\n", files={}, destination="registry.local/x:b7", namespace=BUILD_NS,
        insecure_registry=False, timeout_s=60, network=network, proxy_url="http://p:3128",
    )  # fmt: skip
    labels = job["spec"]["template"]["metadata"]["labels"]
    policies = egress_of(labels, BUILD_NS)
    extra = {"none": set(), "allowlist": {"trainyard-builds-proxy"}, "outbound": {"trainyard-builds-outbound"}}
    base = {"trainyard-builds-default-deny", "trainyard-builds-dns", "trainyard-builds-registry"}
    assert set(policies) == base | extra[network]
    ingress = [p for p in kind("NetworkPolicy") if p["metadata"]["namespace"] == BUILD_NS
               and "Ingress" in p["spec"]["policyTypes"] and selects(p["spec"]["podSelector"], labels)]  # fmt: skip
    assert [p["metadata"]["name"] for p in ingress] == ["trainyard-builds-default-deny"]
    assert all(not p["spec"].get("ingress") for p in ingress)
    assert policies["trainyard-builds-default-deny"] == []
    dns = policies["trainyard-builds-dns"][0]
    assert peers([dns]) == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                             "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]  # fmt: skip
    assert sorted((p["protocol"], p["port"]) for p in dns["ports"]) == [("TCP", 53), ("UDP", 53)]
    assert [p["port"] for r in policies["trainyard-builds-registry"] for p in r["ports"]] == [443]
    proxy_pods = deployment("build-proxy")["spec"]["template"]["metadata"]["labels"]
    platform_ns = {"kubernetes.io/metadata.name": SYSTEM_NS}
    to_platform = [
        peer for peer in peers([r for rules in policies.values() for r in rules])
        if "namespaceSelector" in peer and selects(peer["namespaceSelector"], platform_ns)
    ]  # fmt: skip
    if network == "allowlist":  # the proxy's pods alone, on its port alone
        assert [selects(peer["podSelector"], proxy_pods) for peer in to_platform] == [True]
        assert not selects(to_platform[0]["podSelector"], deployment("web")["spec"]["template"]["metadata"]["labels"])
        assert policies["trainyard-builds-proxy"][0]["ports"] == [{"protocol": "TCP", "port": 3128}]
    else:
        assert to_platform == []
    if network == "outbound":  # the internet, not the private ranges a cluster's pods and Services live in
        blocks = [peer["ipBlock"] for peer in peers(policies["trainyard-builds-outbound"])]
        assert [b["cidr"] for b in blocks] == ["0.0.0.0/0", "::/0"]
        for private in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10"):
            assert private in blocks[0]["except"]
        assert "fc00::/7" in blocks[1]["except"] and "fe80::/10" in blocks[1]["except"]


def test_the_build_proxy_takes_allowlist_build_pods_only_and_serves_where_the_platform_points_them(settings):
    from urllib.parse import urlsplit

    service = next(s for s in kind("Service") if s["metadata"]["name"] == "trainyard-build-proxy")
    proxy = deployment("build-proxy")
    pod_labels = proxy["spec"]["template"]["metadata"]["labels"]
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels)
    url = urlsplit(settings.TRAINYARD_K8S_BUILD_PROXY_URL)
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.port == service["spec"]["ports"][0]["port"] == 3128
    command = proxy["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:4] == ["python", "-m", "images.build_proxy", "serve"]
    assert command[command.index("--port") + 1] == "3128" and "--allow" not in command  # the ConfigMap's list
    assert "$(TRAINYARD_S3_URL)" in command and "TRAINYARD_S3_URL" in kind("ConfigMap")[0]["data"]
    assert "secretRef" not in str(proxy)  # it holds no secret
    policy = next(p for p in kind("NetworkPolicy") if p["metadata"]["name"] == "trainyard-build-proxy")
    assert selects(policy["spec"]["podSelector"], pod_labels) and policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": BUILD_NS})
    assert not selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": TEAM_NS})
    for network, admitted in (("allowlist", True), ("none", False), ("outbound", False)):
        assert selects(peer["podSelector"], {k8s_build.NETWORK_LABEL: network}) is admitted
    assert rule["ports"] == [{"protocol": "TCP", "port": 3128}]
    # The proxy's own way out: DNS, and the internet but the private ranges (the platform's database and pods).
    blocks = [peer["ipBlock"] for peer in peers(policy["spec"]["egress"]) if "ipBlock" in peer]
    assert [b["cidr"] for b in blocks] == ["0.0.0.0/0", "::/0"] and "10.0.0.0/8" in blocks[0]["except"]


# ------------------------------------------------------------------------------------------ RBAC


def granted() -> set[tuple[str, str, str, str]]:
    """(scope, apiGroup, resource, verb) the service account holds; scope = 'cluster' or a namespace."""
    roles = {
        (r["kind"], r["metadata"].get("namespace", ""), r["metadata"]["name"]): r["rules"]
        for r in kind("ClusterRole") + kind("Role")
    }
    grants = set()
    for binding in kind("ClusterRoleBinding") + kind("RoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainyard", "namespace": SYSTEM_NS}]
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace", "")
        rules = roles[(ref["kind"], namespace if ref["kind"] == "Role" else "", ref["name"])]
        scope = namespace or "cluster"
        for rule in rules:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert "*" not in (group, resource, verb)
                        if verb in ("bind", "escalate", "impersonate"):
                            assert rule.get("resourceNames") == ["trainyard-team"], rule  # that role, no other
                        grants.add((scope, group, resource, verb))
    return grants


_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)
PUBLIC_PATHS = frozenset({"/version", "/healthz", "/readyz", "/livez"})
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


RBAC_GROUP = "rbac.authorization.k8s.io"


def needed(records, grants: set[tuple[str, str, str, str]] = frozenset()) -> set[tuple[str, str, str, str]]:
    """What an authorizer checks for each request the backend made. A namespaced request that a cluster-wide grant
    covers counts as that grant (team namespaces the platform makes cannot be named in advance); creating or
    replacing a RoleBinding also needs `bind` on the ClusterRole it names (RBAC's escalation check)."""
    wanted = set()
    for record in records:
        if record.method == "GET" and record.path.rstrip("/") in PUBLIC_PATHS:
            continue  # every authenticated client may read these (the default system:public-info-viewer role)
        match = _PATH.match(record.path)
        assert match, record.path
        group = "" if match["core"] else match["group"]
        resource = match["resource"] + (f"/{match['sub']}" if match["sub"] else "")
        if record.method == "GET":
            verb = "get" if match["name"] else ("watch" if record.watch else "list")
        else:
            verb = _VERBS[record.method]
        scope = match["ns"] or "cluster"
        if (scope, group, resource, verb) not in grants and ("cluster", group, resource, verb) in grants:
            scope = "cluster"
        wanted.add((scope, group, resource, verb))
        if group == RBAC_GROUP and resource == "rolebindings" and verb in ("create", "update"):
            wanted.add(("cluster", RBAC_GROUP, "clusterroles", "bind"))
    return wanted


@dataclass
class PlatformQueue:
    name: str = "train"
    state: str = "open"
    weight: int = 1
    priority: int = 10
    ordering: str = "fifo"
    quota: dict = field(
        default_factory=lambda: {"gpu_milli": 4000, "gpu_memory_mib": 98304, "cpu_milli": 64000, "memory_mib": 262144}
    )

    @property
    def volcano_name(self) -> str:
        return f"trainyard-{self.name}"

    def vector(self) -> dict:
        return dict(self.quota)


NEW_TEAM_NS = "trainyard-vision"


@dataclass
class TeamQuota:
    slug: str = "vision"
    namespace: str = NEW_TEAM_NS
    gpu_milli: int = 2000
    gpu_memory_mib: int = 163118
    cpu_milli: int = 16000
    memory_mib: int = 131072
    max_running_jobs: int = 3


def describe(replicas: int) -> AttemptDescription:
    return AttemptDescription(
        job_id=str(uuid.uuid4()),
        attempt_id=replicas,
        attempt_number=1,
        name="rbac",
        owner="demo",
        team="demo",
        namespace=TEAM_NS,
        queue="train",
        volcano_queue="trainyard-train",
        image="registry.local/t@sha256:" + "5" * 64,
        command=["python", "train.py"],
        args=[],
        env={},
        working_dir="",
        replicas=replicas,
        gpu_count=1,
        exclusive=True,
        cpu_milli=1000,
        memory_mib=1024,
        timeout_s=600,
        priority=0,
        min_driver_version="",
        tensorboard=False,
        tensorboard_logdir="",
        devices=[Device(f"GPU-{i}", 0, f"gpu-node-{i}", 1000, 81559, True) for i in range(replicas)],
    )


def test_rbac_grants_exactly_what_the_backend_uses(settings, tmp_path):
    crds.require()
    settings.TRAINYARD_LOG_ROOT = tmp_path
    # The registry's token service: the team namespace holds the team's pull Secret, a build its push Secret.
    from images import registry_tokens

    registry_tokens.ensure_key(tmp_path / "registry-token.key")
    settings.TRAINYARD_REGISTRY_TOKEN_KEY = str(tmp_path / "registry-token.key")
    settings.TRAINYARD_REGISTRY_URL = "https://registry.example"
    settings.TRAINYARD_K8S_MANAGE_NAMESPACES = True
    with FakeKubernetes(nodes=2) as kube:
        for namespace in (TEAM_NS, SYSTEM_NS, BUILD_NS):
            kube.create("namespaces", {"metadata": {"name": namespace}})
        backend = VolcanoBackend(
            kube.api_client(),
            VolcanoConfig(
                render=render.RenderOptions(),
                request_timeout_s=2,
                retries=2,
                backoff_s=0.01,
                start_timeout_s=0,
                system_namespace=SYSTEM_NS,
                tb_base_domain="tb.example.org",
            ),
        )
        queue = PlatformQueue()
        backend.queue_sync(queue)  # create
        queue.quota["gpu_milli"], queue.state = 8000, "closed"
        backend.queue_sync(queue)  # update, close
        queue.state = "open"
        kube.controller.tick()
        backend.queue_sync(queue)  # reopen
        kube.controller.tick()
        backend.inventory()
        assert backend.runtime_classes() == set()  # a queue's runtime_class is checked against these
        # Team namespaces (jobs/backends/team_namespace.py): made, read back unchanged, then repaired after drift.
        team = TeamQuota()
        assert backend.team_namespace_sync(team)  # creates the namespace and everything in it
        assert backend.team_namespace_sync(team) == []  # reads only
        kube.patch("namespaces", NEW_TEAM_NS, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": None}}})
        kube.delete("resourcequotas", "trainyard-quota", namespace=NEW_TEAM_NS)
        kube.mutate("limitranges", "trainyard-limits", NEW_TEAM_NS,
                    lambda o: o["spec"]["limits"][0].update(max={"cpu": "1"}))  # fmt: skip
        kube.mutate("networkpolicies.networking.k8s.io", "trainyard-default-deny", NEW_TEAM_NS,
                    lambda o: o["spec"].update(podSelector={"matchLabels": {"x": "y"}}))  # fmt: skip
        kube.mutate(
            "rolebindings.rbac.authorization.k8s.io", "trainyard-team", NEW_TEAM_NS, lambda o: o.update(subjects=[])
        )
        assert len(backend.team_namespace_sync(team)) == 5  # labels patched; quota made; three replaced
        kube.mutate(
            "rolebindings.rbac.authorization.k8s.io",
            "trainyard-team",
            NEW_TEAM_NS,
            lambda o: o["roleRef"].update(name="edit"),
        )
        assert backend.team_namespace_sync(team) == ["repaired RoleBinding trainyard-team (roleRef)"]  # made again
        kube.mutate(
            "secrets", "trainyard-registry-pull", NEW_TEAM_NS, lambda o: o.update(data={".dockerconfigjson": "e30="})
        )
        assert backend.team_namespace_sync(team) == ["repaired Secret trainyard-registry-pull (data)"]
        kube.mutate("secrets", "trainyard-registry-pull", NEW_TEAM_NS, lambda o: o.update(type="Opaque"))
        assert backend.team_namespace_sync(team) == ["repaired Secret trainyard-registry-pull (type)"]  # made again
        team.cpu_milli = 8000  # the team's quota changed: its ResourceQuota and LimitRange follow
        assert backend.team_namespace_sync(team) == [
            "repaired ResourceQuota trainyard-quota (spec)",
            "repaired LimitRange trainyard-limits (spec)",
        ]
        # Image builds (TRAINYARD_IMAGE_BUILDER=kubernetes) in their own namespace: images/k8s_build.py.
        builds = k8s_build.BuildJobs(kube.api_client(), BUILD_NS, timeout_s=2)
        objects = k8s_build.render_build_job(
            build_id=1, containerfile="FROM registry.local/b@sha256:" + "1" * 64 + "\n", files={},
            destination="registry.local/t:b1", namespace=BUILD_NS, insecure_registry=False, timeout_s=600,
            push_auth='{"auths": {}}',
        )  # fmt: skip
        builds.create(1, objects)
        assert builds.create(1, objects) is False  # 409s: reads what exists
        kube.controller.script("trainyard-image-build-", logs="pushed")
        assert builds.observe(1).state == "pending"
        kube.controller.tick(3)
        assert builds.observe(1).log == "pushed\n"  # finished: its pod and log
        builds.delete(1)
        kube.controller.script("ty-", run_ticks=None, logs="hi")
        single, gang = describe(1), describe(2)
        refs = [backend.submit(single), backend.submit(gang)]
        backend.submit(single)  # 409: reads the existing job
        backend.observe(refs)  # pending: PodGroups and events
        kube.controller.tick(3)
        backend.observe(refs)  # running: pods and logs
        backend.usage_sample(refs)  # running: the pods' CPU and memory (metrics.k8s.io)
        backend.live_refs()
        host = backend.tensorboard_expose(job_id=single.job_id, namespace=TEAM_NS)
        assert host.endswith(".tb.example.org")
        backend.tensorboard_remove(job_id=single.job_id, namespace=TEAM_NS)
        backend.cancel(refs[0], grace_s=1)
        backend.cleanup(refs[1])
        # Shared dataset caches (TRAINYARD_DATASET_CACHE_STORAGE_CLASS): a claim and a fill Job per dataset version,
        # made once; the trainers wait; a failed fill fails the attempt, and is replaced by the next submit.
        cached = VolcanoBackend(
            kube.api_client(),
            dataclasses.replace(
                backend.config,
                render=render.RenderOptions(s3_url="http://s3.storage:8333", dataset_cache_storage_class="cephfs"),
            ),
        )
        kube.controller.script("ty-", run_ticks=None, running_init="dataset-0")
        kube.controller.script("ty-dataset-", exit_code=1, message="DatasetFetchError: the store is down")
        waiting = dataclasses.replace(describe(1), datasets=[DATASET])
        ref = cached.submit(waiting)
        cached.submit(waiting)  # 409s: the claim, and the fill Job read
        kube.controller.tick(12)
        assert cached.observe([ref])[ref].reason == "DatasetFetchError"  # the failed fill Job is deleted
        kube.controller.script("ty-", run_ticks=None, logs="hi")
        kube.controller.script("ty-", waiting_reason="ImagePullBackOff")
        stuck = describe(1)
        ref = backend.submit(stuck)
        kube.controller.tick(3)
        assert backend.observe([ref])[ref].reason == "ImagePullBackOff"  # stuck: the backend deletes it itself
        kube.controller.script("ty-", run_ticks=None)
        lost = describe(1)
        ref = backend.submit(lost)
        kube.controller.tick(3)
        kube.controller.lose_node("gpu-node-0")
        kube.delete("nodes", "gpu-node-0")
        assert backend.observe([ref])[ref].reason == "NodeLost"  # its pods are force-deleted
        used = needed(kube.requests, granted())
    assert used == granted()
