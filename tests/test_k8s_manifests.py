"""The manifests in k8s/ that deploy Trainyard itself: valid for Kubernetes 1.34 (kubernetes-validate, strict,
offline) and for the real Volcano CRDs, secure by default, consistent with the seed data, and granting the
backend's service account only what `granted()` lists (no wildcards; `bind` on the team role alone).

That the grants are exactly what the platform uses is checked on the real control plane: tests/k8s/test_real_cluster.py
reads the API server's audit log, fails on any refusal, and after a whole passing run on any grant no request used.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes.utils import parse_quantity

from images import k8s_build
from jobs.backends import volcano_render as render
from tests.fake_k8s import crds

K8S = Path(__file__).resolve().parents[1] / "k8s"
K8S_VERSIONS = ("1.29", kubernetes_validate.latest_version())
TEAM_NS, SYSTEM_NS, BUILD_NS = "trainyard-demo", "trainyard", "trainyard-builds"


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


RBAC_GROUP = "rbac.authorization.k8s.io"
