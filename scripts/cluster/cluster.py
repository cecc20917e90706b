"""`make cluster`: a real Kubernetes control plane on loopback, for the Volcano backend's tests (docs/cluster.md).

    python scripts/cluster/cluster.py up       build what is missing, start everything, print the kubeconfigs
    python scripts/cluster/cluster.py down     stop every process this cluster started (pid files)
    python scripts/cluster/cluster.py status   what runs, on which ports
    python scripts/cluster/cluster.py build    only build (or find) the pinned binaries

Real: etcd, kube-apiserver (RBAC, PodSecurity, ResourceQuota, service-account tokens, audit log),
kube-controller-manager, kube-scheduler, Volcano's scheduler, controllers and admission webhooks.
kwok stands in for the kubelets: GPU nodes and pod lifecycles driven by Stages (scripts/cluster/kwok-stages.yaml).

Binaries are built with `go build` from their published Go modules through the wrapper modules under
scripts/cluster/go/<component>-<version>/ and cached outside the repository, keyed by version:
${TRAINYARD_CLUSTER_CACHE:-~/.cache/trainyard/cluster}/<component>-<version>/<binary>.
Everything at run time lives under var/cluster/ (TRAINYARD_CLUSTER_DIR).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

try:  # PyYAML (requirements.txt): needed to start a cluster; `down` and `status` run on any Python 3.11
    import yaml
except ImportError:  # pragma: no cover - only outside the virtualenv
    yaml = None

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
GO_DIR = HERE / "go"
VAR = Path(os.environ.get("TRAINYARD_CLUSTER_DIR") or REPO / "var" / "cluster")
CACHE = Path(os.environ.get("TRAINYARD_CLUSTER_CACHE") or Path.home() / ".cache" / "trainyard" / "cluster")

# The pinned releases. Each Go-built one has a wrapper module scripts/cluster/go/<name>-<version>/.
KUBERNETES = os.environ.get("TRAINYARD_CLUSTER_KUBERNETES", "v1.37.2")
ETCD = "v3.6.16"
KWOK = "v0.8.0"
VOLCANO = os.environ.get("TRAINYARD_CLUSTER_VOLCANO", "v1.14.1")
# The Volcano CRDs of that release: shared/volcano-crds/<folder> (the CRDs did not change from v1.14.0 to v1.14.4).
VOLCANO_CRD_FOLDERS = {"v1.14.1": "v1.14.0", "v1.14.4": "v1.14.0", "v1.12.0": "v1.12.0", "v1.9.0": "v1.9.0"}

# The CRDs the platform and Volcano's job, podgroup and queue controllers use (the stand-ins of the others are in
# scripts/cluster/manifests/volcano-extra-crds.yaml).
VOLCANO_CRD_FILES = (
    "batch.volcano.sh_jobs.yaml",
    "bus.volcano.sh_commands.yaml",
    "scheduling.volcano.sh_podgroups.yaml",
    "scheduling.volcano.sh_queues.yaml",
)
KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
VOLCANO_BINARIES = ("vc-scheduler", "vc-controller-manager", "vc-webhook-manager")

# kwok's fake GPU nodes: GPU Feature Discovery labels as the NVIDIA GPU operator writes them on an H100 node.
NODE_COUNT = int(os.environ.get("TRAINYARD_CLUSTER_NODES", "4"))
GPUS_PER_NODE = int(os.environ.get("TRAINYARD_CLUSTER_GPUS_PER_NODE", "8"))
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPU_MEMORY_MIB = 81559

SERVICE_CIDR = "10.96.0.0/16"  # virtual: nothing is routed there, the API server only allocates from it
FIELD_MANAGER = "trainyard-cluster"
# Components in start order; `down` stops them in reverse.
ORDER = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "vc-webhook-manager",
    "vc-controller-manager",
    "vc-scheduler",
)


def log(msg: str) -> None:
    print(f"cluster: {msg}", flush=True)


class ClusterError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------------------ binaries


def binary(component: str, version: str, name: str | None = None) -> Path:
    return CACHE / f"{component}-{version}" / (name or component)


def _k8s_ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return " ".join(flags)


def _kwok_ldflags(version: str) -> str:
    return f"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version={version.lstrip('v')}"


def _die_with_parent() -> None:
    """In the child before exec: a killed `cluster.py up` (a test's timeout, Ctrl-C) takes its `go build` with it,
    rather than leaving a build running at full tilt that nobody waits for."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _go_build(wrapper: Path, packages: list[str], outputs: dict[str, Path], ldflags: str) -> float:
    """`go build` the packages inside a wrapper module, at low priority, then move each binary into the cache."""
    if not wrapper.is_dir():
        raise ClusterError(f"no wrapper module {wrapper.relative_to(REPO)}: that version is not pinned here")
    if shutil.which("go") is None:
        raise ClusterError("the `go` command is not on PATH: install Go 1.26 or newer")
    with tempfile.TemporaryDirectory(prefix="trainyard-cluster-build-") as tmp:
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod -buildvcs=false")
        cmd = ["nice", "-n", "15", "go", "build", "-trimpath", "-ldflags", ldflags, "-o", tmp + "/", *packages]
        start = time.monotonic()
        log(f"building {', '.join(p.rsplit('/', 1)[-1] for p in packages)} in {wrapper.relative_to(REPO)} …")
        result = subprocess.run(cmd, cwd=wrapper, env=env, capture_output=True, text=True, preexec_fn=_die_with_parent)
        took = time.monotonic() - start
        if result.returncode != 0:
            raise ClusterError(f"go build failed in {wrapper.relative_to(REPO)}:\n{result.stderr[-4000:]}")
        for name, target in outputs.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(os.path.join(tmp, name), target.with_suffix(".partial"))
            os.replace(target.with_suffix(".partial"), target)
        log(f"built in {took:.0f}s")
        return took


def build(require_volcano: bool) -> dict:
    """Find or build every pinned binary; return {component: path}. Volcano's are never built here (see docs)."""
    paths: dict[str, Path] = {}
    timings: dict[str, float] = {}
    kube = {name: binary(name, KUBERNETES) for name in KUBE_BINARIES}
    if not all(p.exists() for p in kube.values()):
        timings["kubernetes"] = _go_build(
            GO_DIR / f"kubernetes-{KUBERNETES}",
            [f"k8s.io/kubernetes/cmd/{n}" for n in KUBE_BINARIES],
            kube,
            _k8s_ldflags(KUBERNETES),
        )
    paths.update(kube)
    etcd = binary("etcd", ETCD)
    if not etcd.exists():
        timings["etcd"] = _go_build(GO_DIR / f"etcd-{ETCD}", ["."], {"etcd": etcd}, "-s -w")
    paths["etcd"] = etcd
    kwok = binary("kwok", KWOK)
    if not kwok.exists():
        timings["kwok"] = _go_build(
            GO_DIR / f"kwok-{KWOK}", ["sigs.k8s.io/kwok/cmd/kwok"], {"kwok": kwok}, _kwok_ldflags(KWOK)
        )
    paths["kwok"] = kwok
    volcano = {name: binary("volcano", VOLCANO, name) for name in VOLCANO_BINARIES}
    wrapper = GO_DIR / f"volcano-{VOLCANO}"
    if not all(p.exists() for p in volcano.values()) and wrapper.is_dir():
        timings["volcano"] = _go_build(
            wrapper,
            [f"volcano.sh/volcano/cmd/{n.removeprefix('vc-')}" for n in VOLCANO_BINARIES],
            {n.removeprefix("vc-"): p for n, p in volcano.items()},
            f"-s -w -X volcano.sh/volcano/pkg/version.Version={VOLCANO}",
        )
    missing = [str(p) for p in volcano.values() if not p.exists()]
    if missing:
        message = (
            f"Volcano {VOLCANO} binaries not found ({', '.join(missing)}) and no wrapper module "
            f"scripts/cluster/go/volcano-{VOLCANO}/ to build them: the Go module proxy serves only some releases of "
            "volcano.sh/volcano (docs/cluster.md, 'Volcano')"
        )
        if require_volcano:
            raise ClusterError(message)
        log(f"WARNING: {message}; starting without Volcano")
    else:
        paths.update(volcano)
    if timings:
        record = _read_json(VAR / "build-times.json")
        record[datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")] = timings
        _write_json(VAR / "build-times.json", record)
    return paths


# ------------------------------------------------------------------------------------------------ PKI


def _pki():
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    return x509, hashes, serialization, ec, rsa, ExtendedKeyUsageOID, NameOID


def ensure_pki(pki: Path) -> None:
    """A CA, the API server's and the webhook's serving certificates, one client certificate per component and the
    service-account signing key pair. Made once; a restart keeps them (tokens and kubeconfigs stay valid)."""
    x509, hashes, serialization, ec, rsa, EKU, NameOID = _pki()
    pki.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    years = datetime.timedelta(days=3650)

    def write_key(path: Path, key) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        path.chmod(0o600)

    def load_key(path: Path):
        return serialization.load_pem_private_key(path.read_bytes(), None)

    if not (pki / "ca.crt").exists():
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainyard-cluster-ca")])
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + years)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .sign(key, hashes.SHA256())
        )
        write_key(pki / "ca.key", key)
        (pki / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    ca_key = load_key(pki / "ca.key")
    ca_cert = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())

    def issue(name: str, cn: str, orgs=(), dns=(), ips=(), server=False) -> None:
        if (pki / f"{name}.crt").exists():
            return
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + years)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([EKU.SERVER_AUTH] if server else [EKU.CLIENT_AUTH]), critical=False)
        )
        if dns or ips:
            sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        write_key(pki / f"{name}.key", key)
        (pki / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    service_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
    issue(
        "apiserver",
        "kube-apiserver",
        dns=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        ips=("127.0.0.1", service_ip),
        server=True,
    )
    issue("webhook", "volcano-admission", dns=("localhost",), ips=("127.0.0.1",), server=True)
    issue("kwok-serving", "kwok-kubelet", dns=("localhost",), ips=("127.0.0.1",), server=True)
    issue("admin", "trainyard-cluster-admin", orgs=("system:masters",))
    issue("kube-controller-manager", "system:kube-controller-manager")
    issue("kube-scheduler", "system:kube-scheduler")
    issue("front-proxy-client", "front-proxy-client")
    issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", orgs=("system:masters",))
    # kwok plays every kubelet (node and pod status, leases, events) and Volcano's three components run with the
    # rights the Volcano chart grants them; both as cluster admins here (docs/cluster.md says so).
    issue("kwok", "kwok-controller", orgs=("system:masters",))
    issue("volcano", "volcano", orgs=("system:masters",))
    if not (pki / "sa.key").exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        write_key(pki / "sa.key", key)
        (pki / "sa.pub").write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )


def write_kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    *,
    user: str,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
) -> None:
    credentials: dict = {}
    if token:
        credentials["token"] = token
    else:
        credentials["client-certificate-data"] = base64.b64encode(cert.read_bytes()).decode()
        credentials["client-key-data"] = base64.b64encode(key.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "trainyard-local",
                "cluster": {"server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "trainyard-local", "user": user}}],
        "current-context": user,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


# ------------------------------------------------------------------------------------------------ API client


KINDS = {  # kind: (plural, namespaced) for what this script applies
    "Namespace": ("namespaces", False),
    "ServiceAccount": ("serviceaccounts", True),
    "Secret": ("secrets", True),
    "ConfigMap": ("configmaps", True),
    "Node": ("nodes", False),
    "ClusterRole": ("clusterroles", False),
    "ClusterRoleBinding": ("clusterrolebindings", False),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
    "PriorityClass": ("priorityclasses", False),
    "CustomResourceDefinition": ("customresourcedefinitions", False),
    "MutatingWebhookConfiguration": ("mutatingwebhookconfigurations", False),
    "ValidatingWebhookConfiguration": ("validatingwebhookconfigurations", False),
    "Queue": ("queues", False),
    "NetworkPolicy": ("networkpolicies", True),
}


class Api:
    """Just enough of a Kubernetes client for bootstrapping, with the admin client certificate."""

    def __init__(self, server: str, pki: Path) -> None:
        self.server = server
        self.ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def request(self, method: str, path: str, body=None, content_type="application/json", timeout=10):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode())
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw)
            except ValueError:
                return err.code, raw.decode(errors="replace")

    @staticmethod
    def path_of(obj: dict) -> str:
        kind = obj["kind"]
        if kind not in KINDS:
            raise ClusterError(f"cannot apply kind {kind}")
        plural, namespaced = KINDS[kind]
        api = obj["apiVersion"]
        base = "/api/v1" if api == "v1" else f"/apis/{api}"
        meta = obj["metadata"]
        ns = f"/namespaces/{meta.get('namespace', 'default')}" if namespaced else ""
        return f"{base}{ns}/{plural}/{meta['name']}"

    def apply(self, obj: dict) -> None:
        """Server-side apply (the manifest's fields are owned by this script; others' changes are kept)."""
        query = urllib.parse.urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
        status, body = self.request("PATCH", f"{self.path_of(obj)}?{query}", obj, "application/apply-patch+yaml")
        if status >= 300:
            raise ClusterError(f"applying {obj['kind']} {obj['metadata']['name']}: {status} {_message(body)}")

    def create(self, obj: dict) -> bool:
        """POST unless it exists (keeps what is only settable at creation, like a node's status)."""
        path = self.path_of(obj)
        collection = path.rsplit("/", 1)[0]
        status, body = self.request("POST", collection, obj)
        if status == 409:
            return False
        if status >= 300:
            raise ClusterError(f"creating {obj['kind']} {obj['metadata']['name']}: {status} {_message(body)}")
        return True

    def get(self, path: str):
        status, body = self.request("GET", path)
        return body if status == 200 else None


def _message(body) -> str:
    return body.get("message", str(body)) if isinstance(body, dict) else str(body)[:500]


def apply_file(api: Api, path: Path) -> int:
    count = 0
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            api.apply(doc)
            count += 1
    return count


# ------------------------------------------------------------------------------------------------ processes


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _free_port(preferred: int | None = None) -> int:
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise ClusterError("no free port")


def _pid_alive(pid: int, exe: str | None) -> bool:
    """True when pid runs and (when given) is the binary we started, not a process that reused the id."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    if not cmdline or not cmdline[0]:
        return True  # still in exec (a 100 MB binary takes a moment): it is the one we started
    return exe is None or cmdline[0].decode(errors="replace") == exe


STARTED: dict[str, subprocess.Popen] = {}  # what this run started, to see one exit while waiting for it


def start(name: str, exe: Path, args: list[str]) -> int:
    """Start one component in its own session, output to logs/<name>.log. KUBECONFIG is its own kubeconfig (parts of
    Volcano read the default one, never ~/.kube/config of whoever runs this)."""
    kubeconfig = next(
        (a.split("=", 1)[1] for a in args if a.startswith("--kubeconfig=")), str(VAR / "admin.kubeconfig")
    )
    env = dict(os.environ, KUBECONFIG=kubeconfig)
    logs, pids = VAR / "logs", VAR / "pids"
    logs.mkdir(parents=True, exist_ok=True)
    pids.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as out:
        out.write(f"\n---- {datetime.datetime.now(datetime.UTC).isoformat()} {exe} {' '.join(args)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            [str(exe), *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=VAR,
            env=env,
            start_new_session=True,
        )
    STARTED[name] = proc
    (pids / f"{name}.pid").write_text(f"{proc.pid} {exe}\n")
    return proc.pid


def running() -> dict[str, int]:
    """{component: pid} of the processes whose pid file names a live process of the same binary."""
    alive = {}
    for name in ORDER:
        try:
            pid_s, exe = (VAR / "pids" / f"{name}.pid").read_text().split(maxsplit=1)
        except (OSError, ValueError):
            continue
        if _pid_alive(int(pid_s), exe.strip()):
            alive[name] = int(pid_s)
    return alive


def stop(name: str, grace: float = 15.0) -> None:
    pid_file = VAR / "pids" / f"{name}.pid"
    try:
        pid_s, exe = pid_file.read_text().split(maxsplit=1)
    except (OSError, ValueError):
        return
    pid = int(pid_s)
    if _pid_alive(pid, exe.strip()):
        os.killpg(pid, signal.SIGTERM) if _is_group_leader(pid) else os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _pid_alive(pid, exe.strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_alive(pid, exe.strip()):
            log(f"{name} (pid {pid}) did not stop in {grace:.0f}s: SIGKILL")
            os.killpg(pid, signal.SIGKILL) if _is_group_leader(pid) else os.kill(pid, signal.SIGKILL)
            while _pid_alive(pid, exe.strip()):
                time.sleep(0.1)
        log(f"stopped {name} (pid {pid})")
    pid_file.unlink(missing_ok=True)


def _is_group_leader(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def wait_for(what: str, check, timeout: float, name: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as err:  # noqa: BLE001 - any failure means "not yet"
            last = err
        if name and name in STARTED and STARTED[name].poll() is not None:
            tail = (VAR / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
            raise ClusterError(f"{name} exited while waiting for {what}; its log ends:\n{tail}")
        time.sleep(0.25)
    raise ClusterError(
        f"timed out after {timeout:.0f}s waiting for {what}" + (f" (last error: {last})" if last else "")
    )


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, context=ctx, timeout=3) as resp:
        return resp.status == 200


# ------------------------------------------------------------------------------------------------ up


def find_volcano_crds() -> Path:
    folder = VOLCANO_CRD_FOLDERS.get(VOLCANO, VOLCANO)
    override = os.environ.get("TRAINYARD_VOLCANO_CRDS")
    candidates = (
        [Path(override)]
        if override
        else [REPO / "shared" / "volcano-crds" / folder, REPO.parent / "shared" / "volcano-crds" / folder]
    )
    if not override and (GO_DIR / f"volcano-{VOLCANO}").is_dir():
        # A release built from its published module: the CRDs of that very module, in Go's module cache.
        modcache = os.environ.get("GOMODCACHE") or str(
            Path(os.environ.get("GOPATH") or Path.home() / "go") / "pkg" / "mod"
        )
        candidates.append(Path(modcache) / f"volcano.sh/volcano@{VOLCANO}" / "config" / "crd" / "volcano" / "bases")
    for c in candidates:
        if (c / "batch.volcano.sh_jobs.yaml").exists():
            return c
    raise ClusterError(
        f"Volcano {VOLCANO}'s CRDs not found (looked in {', '.join(str(c) for c in candidates)}): "
        "set TRAINYARD_VOLCANO_CRDS to a folder holding batch.volcano.sh_jobs.yaml and the other CRDs of that release"
    )


def gpu_nodes() -> list[dict]:
    nodes = []
    for i in range(NODE_COUNT):
        name = f"kwok-gpu-{i}"
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kwok.x-k8s.io/node": "fake",  # what kwok manages (a label: see the lost-node knob)
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                        "topology.kubernetes.io/rack": f"rack-{i // 2}",
                        "nvidia.com/gpu.present": "true",
                        "nvidia.com/gpu.product": GPU_PRODUCT,
                        "nvidia.com/gpu.memory": str(GPU_MEMORY_MIB),
                        "nvidia.com/gpu.count": str(GPUS_PER_NODE),
                        "nvidia.com/gpu.family": "hopper",
                        "nvidia.com/gpu.machine": "kwok",
                        "nvidia.com/cuda.driver-version.major": "550",
                        "nvidia.com/cuda.driver-version.minor": "54",
                        "nvidia.com/cuda.driver-version.revision": "15",
                        "nvidia.com/cuda.driver-version.full": "550.54.15",
                        "nvidia.com/cuda.runtime-version.major": "12",
                        "nvidia.com/cuda.runtime-version.minor": "4",
                        "nvidia.com/cuda.runtime-version.full": "12.4",
                    },
                },
                "spec": {},
                "status": {
                    "capacity": {
                        "cpu": "96",
                        "memory": "1536Gi",
                        "pods": "110",
                        "nvidia.com/gpu": str(GPUS_PER_NODE),
                        "ephemeral-storage": "2Ti",
                    },
                    "allocatable": {
                        "cpu": "94",
                        "memory": "1500Gi",
                        "pods": "110",
                        "nvidia.com/gpu": str(GPUS_PER_NODE),
                        "ephemeral-storage": "2Ti",
                    },
                },
            }
        )
    return nodes


def _volcano_minor() -> tuple[int, int]:
    major, minor = VOLCANO.lstrip("v").split(".")[:2]
    return int(major), int(minor)


def volcano_admissions() -> list[str]:
    """The webhook paths served: /podgroups/validate exists from Volcano 1.12."""
    paths = ["/jobs/mutate", "/jobs/validate", "/queues/mutate", "/queues/validate"]
    return paths + (["/podgroups/validate"] if _volcano_minor() >= (1, 12) else [])


def webhook_configurations(port: int, ca_bundle: str) -> list[dict]:
    """Volcano's admission webhooks, pointed at the webhook-manager on loopback. vc-webhook-manager only fills in the
    caBundle of configurations that exist (named volcano-admission-service-<path>), so they are made here."""
    hooks = [  # (path, kind, name, group, version, resource, operations)
        ("/jobs/mutate", "Mutating", "mutatejob.volcano.sh", "batch.volcano.sh", "v1alpha1", "jobs", ["CREATE"]),
        (
            "/jobs/validate",
            "Validating",
            "validatejob.volcano.sh",
            "batch.volcano.sh",
            "v1alpha1",
            "jobs",
            ["CREATE", "UPDATE"],
        ),
        (
            "/queues/mutate",
            "Mutating",
            "mutatequeue.volcano.sh",
            "scheduling.volcano.sh",
            "v1beta1",
            "queues",
            ["CREATE"],
        ),
        (
            "/queues/validate",
            "Validating",
            "validatequeue.volcano.sh",
            "scheduling.volcano.sh",
            "v1beta1",
            "queues",
            ["CREATE", "UPDATE", "DELETE"],
        ),
        (
            "/podgroups/validate",
            "Validating",
            "validatepodgroup.volcano.sh",
            "scheduling.volcano.sh",
            "v1beta1",
            "podgroups",
            ["CREATE"],
        ),
    ]
    out = []
    for path, kind, name, group, version, resource, ops in hooks:
        if path not in volcano_admissions():
            continue
        hook = {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle},
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
                ]
            },
            "rules": [
                {
                    "apiGroups": [group],
                    "apiVersions": [version],
                    "operations": ops,
                    "resources": [resource],
                    "scope": "*",
                }
            ],
            "sideEffects": "None",
            "timeoutSeconds": 10,
        }
        if kind == "Mutating":
            hook["reinvocationPolicy"] = "Never"
        out.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": f"{kind}WebhookConfiguration",
                "metadata": {
                    "name": "volcano-admission-service" + path.replace("/", "-"),
                    "labels": {"app.kubernetes.io/part-of": "trainyard-cluster"},
                },
                "webhooks": [hook],
            }
        )
    return out


def up() -> int:
    t0 = time.monotonic()
    if yaml is None:
        raise ClusterError("PyYAML is missing: run this with the virtualenv's Python (make cluster)")
    require_volcano = os.environ.get("CI") == "true" or os.environ.get("TRAINYARD_CLUSTER_REQUIRE_VOLCANO") == "1"
    crds = find_volcano_crds()  # before anything starts or stops: a missing input fails at once
    state = _read_json(VAR / "state.json")
    alive = running()
    versions = state.get("versions") or {}
    same = versions.get("kubernetes") == KUBERNETES and versions.get("volcano") in (VOLCANO, None)
    if state and alive and not same:
        running_now = f"Kubernetes {versions.get('kubernetes')} / Volcano {versions.get('volcano')}"
        log(f"{running_now} runs: restarting with Kubernetes {KUBERNETES} / Volcano {VOLCANO}")
    elif state and alive and set(alive) == set(state.get("components", [])):
        try:
            ready = Api(state["server"], VAR / "pki").request("GET", "/readyz", timeout=3)[0] == 200
        except OSError:
            ready = False
        if ready:
            log(f"already running ({len(alive)} processes, API server {state['server']})")
            print_summary(state)
            return 0
    if alive:
        if same:
            log("a partial cluster is running: stopping it first")
        down(quiet=True)

    binaries = build(require_volcano)
    previous = (state.get("versions") or {}).get("kubernetes")
    if previous and previous != KUBERNETES and (VAR / "etcd").exists():
        # An API server must not read what a newer one stored (and an older etcd dir is no use to a test).
        log(f"Kubernetes {previous} ran here before, now {KUBERNETES}: starting from an empty etcd")
        shutil.rmtree(VAR / "etcd")
    t_built = time.monotonic()
    VAR.mkdir(parents=True, exist_ok=True)
    pki = VAR / "pki"
    ensure_pki(pki)
    old_ports = state.get("ports", {})
    names = [
        "etcd",
        "etcd-peer",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "vc-webhook-manager",
        "vc-scheduler-metrics",
        "vc-scheduler-healthz",
        "vc-controller-manager-metrics",
        "vc-controller-manager-healthz",
        "vc-webhook-healthz",
    ]
    ports: dict[str, int] = {}
    for n in names:
        p = _free_port(old_ports.get(n))
        while p in ports.values():
            p = _free_port()
        ports[n] = p
    server = f"https://127.0.0.1:{ports['kube-apiserver']}"
    volcano = all(n in binaries for n in VOLCANO_BINARIES)
    state = {
        "server": server,
        "ports": ports,
        "versions": {"kubernetes": KUBERNETES, "etcd": ETCD, "kwok": KWOK, "volcano": VOLCANO if volcano else None},
        "binaries": {k: str(v) for k, v in binaries.items()},
        "components": [n for n in ORDER if n in binaries],
        "dir": str(VAR),
        "kubeconfig": str(VAR / "trainyard.kubeconfig"),
        "admin_kubeconfig": str(VAR / "admin.kubeconfig"),
    }
    _write_json(VAR / "state.json", state)
    kc = {}
    for user, cert in (
        ("admin", "admin"),
        ("kube-controller-manager", "kube-controller-manager"),
        ("kube-scheduler", "kube-scheduler"),
        ("kwok", "kwok"),
        ("volcano", "volcano"),
    ):
        kc[user] = VAR / f"{user}.kubeconfig"
        write_kubeconfig(kc[user], server, pki / "ca.crt", user=user, cert=pki / f"{cert}.crt", key=pki / f"{cert}.key")
    (VAR / "audit").mkdir(exist_ok=True)
    (VAR / "audit-policy.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "audit.k8s.io/v1",
                "kind": "Policy",
                "omitStages": ["RequestReceived"],
                "rules": [
                    {"level": "None", "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*", "/version"]},
                    {"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
                    {"level": "Metadata"},
                ],
            }
        )
    )

    try:
        # etcd
        start(
            "etcd",
            binaries["etcd"],
            [
                "--name=trainyard",
                f"--data-dir={VAR / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{ports['etcd']}",
                f"--advertise-client-urls=http://127.0.0.1:{ports['etcd']}",
                f"--listen-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
                f"--initial-cluster=trainyard=http://127.0.0.1:{ports['etcd-peer']}",
                "--listen-metrics-urls=",
                "--unsafe-no-fsync=true",  # a test cluster: a crash may lose the last writes, never a real workload
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )
        wait_for("etcd", lambda: _http_ok(f"http://127.0.0.1:{ports['etcd']}/health"), 30, "etcd")

        # kube-apiserver
        start(
            "kube-apiserver",
            binaries["kube-apiserver"],
            [
                f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={ports['kube-apiserver']}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                f"--requestheader-client-ca-file={pki / 'ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                # Pod logs, exec and port-forward go to the "kubelet": kwok's server on loopback, by the node's
                # InternalIP (127.0.0.1), never by resolving the node's name.
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-certificate-authority={pki / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                # On top of the default plugins (PodSecurity, ResourceQuota, ServiceAccount, Priority, the webhooks …
                # are among them): named so that a change of defaults cannot drop them silently.
                "--enable-admission-plugins=NodeRestriction,PodSecurity,ResourceQuota,LimitRanger,ServiceAccount,"
                "Priority,DefaultTolerationSeconds,MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                f"--audit-policy-file={VAR / 'audit-policy.yaml'}",
                f"--audit-log-path={VAR / 'audit' / 'audit.log'}",
                "--audit-log-maxsize=200",
                "--audit-log-maxbackup=3",
                "--endpoint-reconciler-type=none",  # endpoints may not hold loopback addresses
                "--profiling=false",
            ],
        )
        api = Api(server, pki)
        wait_for("the API server", lambda: api.request("GET", "/readyz", timeout=3)[0] == 200, 90, "kube-apiserver")
        log(f"API server ready at {server} ({time.monotonic() - t_built:.1f}s)")

        start(
            "kube-controller-manager",
            binaries["kube-controller-manager"],
            [
                f"--kubeconfig={kc['kube-controller-manager']}",
                f"--authentication-kubeconfig={kc['kube-controller-manager']}",
                f"--authorization-kubeconfig={kc['kube-controller-manager']}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['kube-controller-manager']}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                "--use-service-account-credentials=true",
                "--controllers=*",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--leader-elect=false",
                "--node-monitor-grace-period=40s",
                "--concurrent-gc-syncs=5",
            ],
        )
        start(
            "kube-scheduler",
            binaries["kube-scheduler"],
            [
                f"--kubeconfig={kc['kube-scheduler']}",
                f"--authentication-kubeconfig={kc['kube-scheduler']}",
                f"--authorization-kubeconfig={kc['kube-scheduler']}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['kube-scheduler']}",
                "--leader-elect=false",
            ],
        )

        # CRDs first: the platform's objects and Volcano both need them.
        for name in VOLCANO_CRD_FILES:
            apply_file(api, crds / name)
        apply_file(api, HERE / "manifests" / "volcano-extra-crds.yaml")
        wait_for("the Volcano CRDs", lambda: _crds_established(api), 60)

        # kwok and its GPU nodes. The node leases of a previous run are held by the previous kwok: a new one would wait
        # for them to expire (40 s) before it touches those nodes or their pods, so they go first.
        for i in range(NODE_COUNT):
            api.request("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/kwok-gpu-{i}")
        start(
            "kwok",
            binaries["kwok"],
            [
                f"--kubeconfig={kc['kwok']}",
                f"--config={HERE / 'kwok-stages.yaml'}",
                f"--config={kwok_logs_config()}",
                "--manage-all-nodes=false",
                # A label, not an annotation: a node whose label changes leaves the watch (kwok drops it, its lease
                # and heartbeats stop), while kwok ignores a node that merely stops matching an annotation selector.
                "--manage-nodes-with-label-selector=kwok.x-k8s.io/node=fake",
                f"--server-address=127.0.0.1:{ports['kwok']}",
                f"--node-port={ports['kwok']}",
                f"--tls-cert-file={pki / 'kwok-serving.crt'}",
                f"--tls-private-key-file={pki / 'kwok-serving.key'}",
                "--node-ip=127.0.0.1",
                "--cidr=10.244.0.1/16",
                "--node-lease-duration-seconds=40",
                f"--v={os.environ.get('TRAINYARD_CLUSTER_KWOK_LOG', 'WARN')}",  # INFO logs each patch and lease
            ],
        )
        for node in gpu_nodes():
            if not api.create(node):  # it exists (a restart): give it back the labels kwok and the platform read
                meta = node["metadata"]
                api.apply(
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {k: meta[k] for k in ("name", "labels", "annotations")},
                    }
                )
        for i in range(NODE_COUNT):  # where the API server finds the "kubelet" (a restart may have moved kwok's port)
            status, body = api.request(
                "PATCH",
                f"/api/v1/nodes/kwok-gpu-{i}/status",
                {"status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": ports["kwok"]}}}},
                "application/merge-patch+json",
            )
            if status >= 300:
                raise ClusterError(f"setting kwok-gpu-{i}'s kubelet port: {status} {_message(body)}")
        wait_for(f"{NODE_COUNT} Ready kwok nodes", lambda: _ready_nodes(api) >= NODE_COUNT, 60, "kwok")

        # The repo's k8s/ manifests that a control plane without the platform's own deployment takes.
        for f in ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "priority-classes.yaml", "build-network.yaml"):
            apply_file(api, REPO / "k8s" / f)

        if volcano:
            ca_bundle = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
            for obj in webhook_configurations(ports["vc-webhook-manager"], ca_bundle):
                api.apply(obj)
            vkc = kc["volcano"]
            start(
                "vc-webhook-manager",
                binaries["vc-webhook-manager"],
                [
                    f"--kubeconfig={vkc}",
                    "--listen-address=127.0.0.1",
                    f"--port={ports['vc-webhook-manager']}",
                    f"--tls-cert-file={pki / 'webhook.crt'}",
                    f"--tls-private-key-file={pki / 'webhook.key'}",
                    f"--ca-cert-file={pki / 'ca.crt'}",
                    f"--webhook-url=https://127.0.0.1:{ports['vc-webhook-manager']}",
                    f"--enabled-admission={','.join(volcano_admissions())}",
                    f"--healthz-address=127.0.0.1:{ports['vc-webhook-healthz']}",
                    "--logtostderr",
                    "-v=2",
                ],
            )
            ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
            wait_for("the Volcano webhook", lambda: _tls_up(ports["vc-webhook-manager"], ctx), 60, "vc-webhook-manager")
            start(
                "vc-controller-manager",
                binaries["vc-controller-manager"],
                [
                    f"--kubeconfig={vkc}",
                    # --controllers exists from Volcano 1.10, its --listen-address (metrics) from 1.11.
                    *(
                        ["--controllers=job-controller,pg-controller,queue-controller,gc-controller"]
                        if _volcano_minor() >= (1, 10)
                        else []
                    ),
                    *(
                        [f"--listen-address=127.0.0.1:{ports['vc-controller-manager-metrics']}"]
                        if _volcano_minor() >= (1, 11)
                        else []
                    ),
                    f"--healthz-address=127.0.0.1:{ports['vc-controller-manager-healthz']}",
                    "--leader-elect=false",
                    "--logtostderr",
                    "-v=2",
                ],
            )
            (VAR / "volcano-scheduler.conf").write_text((HERE / "volcano-scheduler.conf").read_text())
            start(
                "vc-scheduler",
                binaries["vc-scheduler"],
                [
                    f"--kubeconfig={vkc}",
                    f"--scheduler-conf={VAR / 'volcano-scheduler.conf'}",
                    f"--listen-address=127.0.0.1:{ports['vc-scheduler-metrics']}",
                    f"--healthz-address=127.0.0.1:{ports['vc-scheduler-healthz']}",
                    "--schedule-period=1s",
                    "--leader-elect=false",
                    f"--cache-dump-dir={VAR}",
                    "--logtostderr",
                    "-v=2",
                ],
            )
            wait_for(
                "Volcano's default queue",
                lambda: api.get("/apis/scheduling.volcano.sh/v1beta1/queues/default") is not None,
                60,
                "vc-scheduler",
            )
            apply_file(api, REPO / "k8s" / "volcano-queues.yaml")

        token = service_account_token(api)
        write_kubeconfig(VAR / "trainyard.kubeconfig", server, pki / "ca.crt", user="trainyard", token=token)
    except BaseException:
        log("start failed: stopping what was started (logs under var/cluster/logs/)")
        down(quiet=True)
        raise
    state["started_s"] = round(time.monotonic() - t0, 1)
    state["start_after_build_s"] = round(time.monotonic() - t_built, 1)
    _write_json(VAR / "state.json", state)
    log(f"cluster up in {state['started_s']}s ({state['start_after_build_s']}s after the build step)")
    print_summary(state)
    return 0


def kwok_logs_config() -> Path:
    """kwok answers `kubectl logs` (pods/log) of every container with one stand-in file: no container runs here."""
    log_file = VAR / "kwok-container.log"
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    # The CRI log format a kubelet reads: time, stream, P(artial)/F(ull), text.
    log_file.write_text(f"{stamp} stdout F kwok: no container runs on this fake node; this log is a stand-in\n")
    config = VAR / "kwok-logs.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "ClusterLogs",
                "metadata": {"name": "trainyard-stand-in"},
                "spec": {"logs": [{"logsFile": str(log_file), "follow": False}]},
            }
        )
    )
    return config


def _crds_established(api: Api) -> bool:
    body = api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
    names = {"jobs.batch.volcano.sh", "queues.scheduling.volcano.sh", "podgroups.scheduling.volcano.sh"}
    for crd in (body or {}).get("items", []):
        if crd["metadata"]["name"] in names and any(
            c["type"] == "Established" and c["status"] == "True" for c in crd.get("status", {}).get("conditions", [])
        ):
            names.discard(crd["metadata"]["name"])
    return not names


def _ready_nodes(api: Api) -> int:
    body = api.get("/api/v1/nodes?labelSelector=type%3Dkwok") or {}
    return sum(
        1
        for n in body.get("items", [])
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
    )


def _tls_up(port: int, ctx: ssl.SSLContext) -> bool:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=2) as sock,
        ctx.wrap_socket(sock, server_hostname="127.0.0.1"),
    ):
        return True


def service_account_token(api: Api) -> str:
    """A long-lived token of the platform's own service account (trainyard/trainyard, bound by k8s/rbac.yaml),
    from a service-account-token Secret that kube-controller-manager's token controller fills in."""
    api.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/service-account-token",
            "metadata": {
                "name": "trainyard-token",
                "namespace": "trainyard",
                "annotations": {"kubernetes.io/service-account.name": "trainyard"},
            },
        }
    )
    token: list[str] = []

    def filled() -> bool:
        secret = api.get("/api/v1/namespaces/trainyard/secrets/trainyard-token") or {}
        data = secret.get("data") or {}
        if data.get("token"):
            token.append(base64.b64decode(data["token"]).decode())
            return True
        return False

    wait_for("the service account token", filled, 60, "kube-controller-manager")
    return token[0]


def print_summary(state: dict) -> None:
    rel = os.path.relpath(state["kubeconfig"])
    versions = state["versions"]
    print(
        f"\n  Kubernetes {versions['kubernetes']} · etcd {versions['etcd']} · kwok {versions['kwok']} · "
        f"Volcano {versions['volcano'] or 'NOT RUNNING'}\n"
        f"  API server   {state['server']}\n"
        f"  platform     KUBECONFIG={rel}   (service account trainyard/trainyard, RBAC of k8s/rbac.yaml)\n"
        f"  admin        KUBECONFIG={os.path.relpath(state['admin_kubeconfig'])}   (tests only)\n"
        f"  state        {os.path.relpath(Path(state['dir']) / 'state.json')}, "
        f"logs in {os.path.relpath(Path(state['dir']) / 'logs')}/\n"
        f"  stop         make cluster-stop\n",
        flush=True,
    )


# ------------------------------------------------------------------------------------------------ down/status


def down(quiet: bool = False) -> int:
    names = [n for n in ORDER if (VAR / "pids" / f"{n}.pid").exists()]
    if not names and not quiet:
        log("not running")
    for name in reversed(ORDER):
        if name in names:
            stop(name)
    return 0


def status() -> int:
    state = _read_json(VAR / "state.json")
    alive = running()
    if not state:
        log("no cluster here (make cluster)")
        return 1
    expected = state.get("components", [])
    for name in expected:
        print(f"  {name:24} {'pid ' + str(alive[name]) if name in alive else 'NOT RUNNING'}")
    ready = False
    if alive.get("kube-apiserver"):
        try:
            ready = Api(state["server"], VAR / "pki").request("GET", "/readyz", timeout=3)[0] == 200
        except OSError:
            ready = False
    print(f"  API server {state['server']}: {'ready' if ready else 'not ready'}")
    print(f"  ports: {json.dumps(state.get('ports', {}), sort_keys=True)}")
    return 0 if ready and set(alive) == set(expected) else 1


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "up"
    try:
        if command == "up":
            return up()
        if command == "down":
            return down()
        if command == "status":
            return status()
        if command == "build":
            build(require_volcano=False)
            return 0
    except ClusterError as err:
        print(f"cluster: {err}", file=sys.stderr)
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
