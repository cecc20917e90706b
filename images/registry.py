"""A small client of the OCI distribution API over plain HTTP(S): resolve a tag to a digest, read manifests and
layer blobs, delete a manifest. No container daemon is involved.

The platform's own registry (TRAINYARD_REGISTRY_URL, embedded by `make run` when unset) is spoken to at that URL,
with its user and password (TRAINYARD_REGISTRY_USERNAME / _PASSWORD), sent to the token service its challenge
names (images/registry_tokens.py) or, for a registry with basic auth, to the registry; any other registry at
https://<host>, with the anonymous bearer-token handshake public registries ask for, and never with the platform's
credentials. Teams and builds get credentials of their own (team_credential, build_credential).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlparse

import httpx
from django.conf import settings

from images import registry_tokens

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
ACCEPT = ", ".join(MANIFEST_TYPES)
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}\Z")
DOCKER_HUB = "docker.io"


class RegistryError(Exception):
    """Base of what talking to a registry can go wrong with."""


class RegistryUnavailable(RegistryError):
    """The registry cannot be reached or answered with a server error."""


class ManifestUnknown(RegistryError):
    """The repository or tag does not exist there."""


@dataclass(frozen=True)
class Reference:
    host: str  # as written, with the port: 127.0.0.1:5000, docker.io
    repository: str
    tag: str
    digest: str

    @property
    def name(self) -> str:
        return f"{self.host}/{self.repository}"

    def pinned(self, digest: str | None = None) -> str:
        return f"{self.name}@{digest or self.digest}"


def parse(reference: str) -> Reference:
    """`host[:port]/repo[:tag][@sha256:…]`; a first part without a dot, colon or `localhost` is Docker Hub's."""
    rest, _, digest = reference.partition("@")
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        host, path = first, remainder
    else:
        host, path = DOCKER_HUB, rest
    if host == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    last = path.rsplit("/", 1)[-1]
    tag = ""
    if ":" in last:
        path, _, tag = path.rpartition(":")
    if not tag and not digest:
        tag = "latest"
    return Reference(host=host, repository=path, tag=tag, digest=digest)


def platform_registry() -> str:
    """The host:port of the platform's own registry, or "" when none is configured."""
    return urlparse(settings.TRAINYARD_REGISTRY_URL).netloc if settings.TRAINYARD_REGISTRY_URL else ""


def credentials_for(endpoint: str) -> tuple[str, str] | None:
    """The platform's user and password when `endpoint` is its own registry (at that host and port), else None:
    they are never sent anywhere else."""
    if not settings.TRAINYARD_REGISTRY_USERNAME or not settings.TRAINYARD_REGISTRY_URL:
        return None
    if urlparse(endpoint).netloc != platform_registry():
        return None
    return settings.TRAINYARD_REGISTRY_USERNAME, settings.TRAINYARD_REGISTRY_PASSWORD


def team_credential(slug: str) -> tuple[str, str] | None:
    """What a team's jobs pull with: `team.<slug>` (its images and the shared bases only) when the platform runs
    the registry's token service, else the platform's shared user (an external registry: no isolation there)."""
    if settings.TRAINYARD_REGISTRY_TOKEN_KEY:
        return registry_tokens.team_credential(settings.TRAINYARD_REGISTRY_TOKEN_KEY, slug)
    return credentials_for(settings.TRAINYARD_REGISTRY_URL)


def build_credential(*, build_id: int, repository: str, team: str | None) -> tuple[str, str] | None:
    """What one build pulls and pushes with: `build.<id>`, which may push to `repository` alone and pull what its
    team may, for TRAINYARD_REGISTRY_PUSH_CREDENTIAL_S; the shared user where no token service is configured."""
    if settings.TRAINYARD_REGISTRY_TOKEN_KEY:
        return registry_tokens.build_credential(
            settings.TRAINYARD_REGISTRY_TOKEN_KEY,
            build_id=build_id,
            repository=repository,
            team=team,
            ttl_s=settings.TRAINYARD_REGISTRY_PUSH_CREDENTIAL_S,
        )
    return credentials_for(settings.TRAINYARD_REGISTRY_URL)


def docker_config(host: str, credential: tuple[str, str]) -> str:
    """A containers/Docker auth file's JSON (`auths`) holding one credential for `host`."""
    import base64

    token = base64.b64encode(f"{credential[0]}:{credential[1]}".encode()).decode()
    return json.dumps({"auths": {host: {"username": credential[0], "password": credential[1], "auth": token}}})


def write_authfile(path, host: str, credential: tuple[str, str] | None = None) -> bool:
    """A podman/containers auth file (0600) holding `credential` (by default the platform's own) for `host`; False
    (and no file) when there is none to give."""
    import os

    credential = credential or credentials_for(f"http://{host}")
    if credential is None:
        return False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(docker_config(host, credential))
    return True


def endpoint_for(host: str) -> str:
    if settings.TRAINYARD_REGISTRY_URL and host == platform_registry():
        return settings.TRAINYARD_REGISTRY_URL.rstrip("/")
    if host == DOCKER_HUB:
        return "https://registry-1.docker.io"
    return f"https://{host}"


class Client:
    def __init__(self, endpoint: str, *, timeout: float | None = None):
        self.endpoint = endpoint.rstrip("/")
        self.http = httpx.Client(
            timeout=timeout or settings.TRAINYARD_REGISTRY_TIMEOUT_S,
            follow_redirects=True,
        )
        self.credentials = credentials_for(self.endpoint)
        self.basic = False  # a registry that takes the credentials itself (basic auth) rather than tokens
        self.token: str | None = None

    @classmethod
    def for_host(cls, host: str) -> Client:
        return cls(endpoint_for(host))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _request(self, method: str, path: str, *, headers: dict | None = None, stream: bool = False) -> httpx.Response:
        headers = dict(headers or {})
        url = f"{self.endpoint}/v2/{path}"
        for attempt in range(2):
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            try:
                request = self.http.build_request(method, url, headers=headers)
                response = self.http.send(request, stream=stream, auth=self.credentials if self.basic else None)
            except httpx.HTTPError as exc:
                raise RegistryUnavailable(f"cannot reach the registry at {self.endpoint}: {exc}") from None
            # A token is for the scope it was asked with: another repository (or an expired token) asks again.
            if response.status_code == 401 and attempt == 0 and self._login(response):
                response.close()
                continue
            break
        if response.status_code >= 500 or response.status_code == 429:
            response.close()
            raise RegistryUnavailable(f"the registry at {self.endpoint} answered {response.status_code}")
        return response

    def _login(self, challenge: httpx.Response) -> bool:
        """A token for a `Bearer realm=…,service=…,scope=…` challenge: with the platform's credentials from its own
        registry's token service, anonymous from a public registry's."""
        header = challenge.headers.get("WWW-Authenticate", "")
        if header.lower().startswith("basic ") and self.credentials and not self.basic:
            self.basic = True
            return True
        if not header.lower().startswith("bearer "):
            return False
        params = dict(re.findall(r'(\w+)="([^"]*)"', header))
        realm = params.pop("realm", "")
        if not realm:
            return False
        try:
            answer = self.http.get(realm, params=params, auth=self.credentials)
        except httpx.HTTPError as exc:
            raise RegistryUnavailable(f"cannot reach the registry's token service: {exc}") from None
        if answer.status_code != 200:
            return False
        body = answer.json()
        self.token = body.get("token") or body.get("access_token")
        return bool(self.token)

    def ping(self) -> None:
        response = self._request("GET", "")
        response.close()

    def resolve(self, repository: str, tag: str) -> str:
        """The digest `repository:tag` points to now (HEAD, so nothing is downloaded)."""
        response = self._request("HEAD", f"{repository}/manifests/{tag}", headers={"Accept": ACCEPT})
        if response.status_code in (400, 401, 403, 404):  # 400: a name or tag the registry refuses outright
            raise ManifestUnknown(f"{repository}:{tag} is not in the registry")
        if response.status_code != 200:
            raise RegistryError(f"the registry answered {response.status_code} for {repository}:{tag}")
        digest = response.headers.get("Docker-Content-Digest", "")
        if not DIGEST.match(digest):  # a registry that leaves the header out: hash the manifest it sends
            import hashlib

            body = self._request("GET", f"{repository}/manifests/{tag}", headers={"Accept": ACCEPT})
            digest = "sha256:" + hashlib.sha256(body.content).hexdigest()
        return digest

    def manifest(self, repository: str, reference: str) -> tuple[str, dict]:
        response = self._request("GET", f"{repository}/manifests/{reference}", headers={"Accept": ACCEPT})
        if response.status_code in (401, 403, 404):
            raise ManifestUnknown(f"{repository}@{reference} is not in the registry")
        if response.status_code != 200:
            raise RegistryError(f"the registry answered {response.status_code} for {repository}@{reference}")
        return response.headers.get("Content-Type", "").split(";")[0], response.json()

    def image_manifest(self, repository: str, reference: str) -> dict:
        """The single-platform manifest (an index's linux/amd64 entry, else its first)."""
        media_type, body = self.manifest(repository, reference)
        if "index" in media_type or "list" in media_type or "manifests" in body:
            entries = body.get("manifests") or []
            chosen = next(
                (m for m in entries if (m.get("platform") or {}).get("architecture") == "amd64"),
                entries[0] if entries else None,
            )
            if chosen is None:
                raise ManifestUnknown(f"{repository}@{reference} is an empty index")
            _, body = self.manifest(repository, chosen["digest"])
        return body

    def image_config(self, repository: str, reference: str) -> dict:
        """The image's config (the JSON blob its manifest names): what it runs as, its env, entrypoint, history."""
        config = self.image_manifest(repository, reference).get("config") or {}
        if not config.get("digest"):
            raise ManifestUnknown(f"{repository}@{reference} has no image config")
        body = b"".join(self.blob(repository, config["digest"]))
        try:
            return json.loads(body)
        except ValueError:
            raise RegistryError(f"the config of {repository}@{reference} is not JSON") from None

    def blob(self, repository: str, digest: str) -> Iterator[bytes]:
        response = self._request("GET", f"{repository}/blobs/{digest}", stream=True)
        try:
            if response.status_code != 200:
                raise ManifestUnknown(f"blob {digest} of {repository} is not in the registry")
            yield from response.iter_bytes()
        finally:
            response.close()

    def delete(self, repository: str, digest: str) -> bool:
        response = self._request("DELETE", f"{repository}/manifests/{digest}")
        response.close()
        return response.status_code in (200, 202)


def resolve(reference: str, *, endpoint: str | None = None) -> str:
    """The digest a `host/repo:tag` reference points to at this moment (asked of `endpoint` when given)."""
    ref = parse(reference)
    if ref.digest:
        return ref.digest
    with Client(endpoint) if endpoint else Client.for_host(ref.host) as client:
        return client.resolve(ref.repository, ref.tag)


# The distribution spec's grammar: lowercase path components joined by '/', a tag of word characters.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?)"
REFERENCE = re.compile(
    rf"^(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$"
)


def is_valid(reference: str) -> bool:
    return bool(REFERENCE.match(reference)) and len(reference) <= 255
