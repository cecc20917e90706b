"""Tenant isolation at the platform's registry, against the real registry (Debian's docker-registry) and the
platform's token service (images/registry_tokens.py): a team's credential pulls its own images and the shared bases
and is refused another team's by the registry itself; a build's credential pushes to its own repository only; a
wrong password gets no token; an expired or foreign token is refused."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from django.conf import settings

from images import registry, registry_tokens
from images.tests.conftest import podman

CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture
def token_registry(registry_url):
    if not settings.TRAINYARD_REGISTRY_TOKEN_KEY:
        pytest.skip("the session's registry is an external one without the platform's token service")
    return registry_url.rstrip("/")


def _challenge(url: str, path: str) -> dict[str, str]:
    response = httpx.get(f"{url}/v2/{path}", timeout=10)
    assert response.status_code == 401
    return dict(re.findall(r'(\w+)="([^"]*)"', response.headers["WWW-Authenticate"]))


def token_for(url: str, credential: tuple[str, str], scope: str) -> httpx.Response:
    """Ask the realm the registry names in its challenge, as a registry client does."""
    params = _challenge(url, "")
    return httpx.get(params["realm"], params={"service": params["service"], "scope": scope}, auth=credential,
                     timeout=10)  # fmt: skip


def bearer(url: str, credential: tuple[str, str], scope: str) -> dict[str, str]:
    answer = token_for(url, credential, scope)
    assert answer.status_code == 200, answer.text
    return {"Authorization": f"Bearer {answer.json()['token']}"}


def push_image(url: str, headers: dict[str, str], repository: str, tag: str) -> httpx.Response:
    """A one-config image pushed through the distribution API (blob upload, then the manifest)."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []},
                         "config": {"Labels": {"repo": repository}}}).encode()  # fmt: skip
    digest = "sha256:" + hashlib.sha256(config).hexdigest()
    started = httpx.post(f"{url}/v2/{repository}/blobs/uploads/", headers=headers, timeout=10)
    if started.status_code != 202:
        return started
    location = started.headers["Location"]
    location = location if location.startswith("http") else url + location
    location += ("&" if "?" in location else "?") + f"digest={digest}"  # beside the upload's own _state
    put = httpx.put(location, content=config,
                    headers={**headers, "Content-Type": "application/octet-stream"}, timeout=10)  # fmt: skip
    if put.status_code != 201:
        return put
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
                "config": {"mediaType": CONFIG_TYPE, "digest": digest, "size": len(config)}, "layers": []}  # fmt: skip
    return httpx.put(f"{url}/v2/{repository}/manifests/{tag}", content=json.dumps(manifest).encode(),
                     headers={**headers, "Content-Type": MANIFEST_TYPE}, timeout=10)  # fmt: skip


def service() -> tuple[str, str]:
    return settings.TRAINYARD_REGISTRY_USERNAME, settings.TRAINYARD_REGISTRY_PASSWORD


@pytest.fixture
def images(token_registry):
    """trainyard/amber/app:1, trainyard/cobalt/secret:1 and the shared trainyard/base/shared:1, pushed by the
    platform's own credential."""
    url = token_registry
    for repository in ("trainyard/amber/app", "trainyard/cobalt/secret", "trainyard/base/shared"):
        pushed = push_image(url, bearer(url, service(), f"repository:{repository}:pull,push"), repository, "1")
        assert pushed.status_code == 201, pushed.text
    return url


def manifest_status(url: str, credential: tuple[str, str], repository: str) -> int:
    headers = bearer(url, credential, f"repository:{repository}:pull")
    return httpx.get(f"{url}/v2/{repository}/manifests/1", headers={**headers, "Accept": MANIFEST_TYPE},
                     timeout=10).status_code  # fmt: skip


def test_a_teams_credential_pulls_its_own_images_and_the_shared_bases_and_the_registry_refuses_another_teams(images):
    amber, cobalt = registry.team_credential("amber"), registry.team_credential("cobalt")
    assert amber[0] == "team.amber" and cobalt[0] == "team.cobalt"
    assert manifest_status(images, amber, "trainyard/amber/app") == 200
    assert manifest_status(images, amber, "trainyard/base/shared") == 200
    assert manifest_status(images, cobalt, "trainyard/base/shared") == 200
    assert manifest_status(images, cobalt, "trainyard/cobalt/secret") == 200
    # The token is issued (with no action on that repository); the registry itself says no.
    assert manifest_status(images, cobalt, "trainyard/amber/app") == 401
    assert manifest_status(images, amber, "trainyard/cobalt/secret") == 401
    # Nor by a name that merely starts like it, nor the catalog (the platform's alone).
    assert manifest_status(images, registry.team_credential("ambe"), "trainyard/amber/app") == 401
    catalog = httpx.get(f"{images}/v2/_catalog", headers=bearer(images, amber, "registry:catalog:*"), timeout=10)
    assert catalog.status_code == 401
    # A team's credential never pushes, not even to its own repository.
    pushed = push_image(images, bearer(images, amber, "repository:trainyard/amber/app:pull,push"),
                        "trainyard/amber/app", "2")  # fmt: skip
    assert pushed.status_code == 401


def test_podman_pulls_with_a_teams_credential_only_what_that_team_may(images, build_root, tmp_path):
    host = urlparse(images).netloc

    def pull(team: str, repository: str):
        authfile = tmp_path / f"{team}.json"
        assert registry.write_authfile(authfile, host, registry.team_credential(team))
        assert authfile.stat().st_mode & 0o077 == 0
        return podman(build_root, "pull", "--tls-verify=false", "--authfile", str(authfile), "--quiet",
                      f"{host}/{repository}:1")  # fmt: skip

    for team, repository in (("amber", "trainyard/amber/app"), ("cobalt", "trainyard/base/shared")):
        pulled = pull(team, repository)
        assert pulled.returncode == 0, pulled.stderr
    refused = pull("cobalt", "trainyard/amber/app")
    assert refused.returncode != 0 and "unauthorized" in refused.stderr.lower(), refused.stderr


def test_a_builds_credential_pushes_to_its_own_repository_only(images):
    credential = registry.build_credential(build_id=7, repository="trainyard/amber/model", team="amber")
    assert credential[0] == "build.7"
    own = push_image(images, bearer(images, credential, "repository:trainyard/amber/model:pull,push"),
                     "trainyard/amber/model", "b7")  # fmt: skip
    assert own.status_code == 201, own.text
    for other in ("trainyard/cobalt/secret", "trainyard/amber/app", "trainyard/base/shared", "upstream/tiny"):
        refused = push_image(images, bearer(images, credential, f"repository:{other}:pull,push"), other, "evil")
        assert refused.status_code == 401, (other, refused.status_code)
    # A team whose slug is the shared folder's name does not get to overwrite a shared base.
    base_team = registry.build_credential(build_id=8, repository="trainyard/base/shared", team="base")
    refused = push_image(images, bearer(images, base_team, "repository:trainyard/base/shared:pull,push"),
                         "trainyard/base/shared", "evil")  # fmt: skip
    assert refused.status_code == 401
    # What it builds on: its team's images and the shared bases, never another team's.
    assert manifest_status(images, credential, "trainyard/amber/app") == 200
    assert manifest_status(images, credential, "trainyard/base/shared") == 200
    assert manifest_status(images, credential, "trainyard/cobalt/secret") == 401


def test_a_wrong_password_an_expired_build_credential_or_no_credential_gets_no_token(token_registry):
    url = token_registry
    scope = "repository:trainyard/amber/app:pull"
    user, password = registry.team_credential("amber")
    for credential in [(user, password + "x"), ("team.cobalt", password), (service()[0], "wrong"), ("build.1", "a.b")]:
        answer = token_for(url, credential, scope)
        assert answer.status_code == 401 and answer.json()["code"] == "registry_credentials_invalid", credential
        assert "token" not in answer.json()
    params = _challenge(url, "")
    anonymous = httpx.get(params["realm"], params={"service": params["service"], "scope": scope}, timeout=10)
    assert anonymous.status_code == 401 and anonymous.json()["code"] == "registry_credentials_missing"
    expired = registry_tokens.build_credential(settings.TRAINYARD_REGISTRY_TOKEN_KEY, build_id=3,
                                               repository="trainyard/amber/app", team="amber", ttl_s=-1)  # fmt: skip
    answer = token_for(url, expired, scope)
    assert answer.status_code == 401 and answer.json()["code"] == "registry_credentials_expired"
    # The build's repository is signed into its password: changing it breaks the signature.
    user, password = registry.build_credential(build_id=3, repository="trainyard/amber/app", team="amber")
    body, _, mac = password.rpartition(".")
    forged = registry_tokens._b64(json.dumps({"r": "trainyard/cobalt/secret", "t": "cobalt", "e": 2**40}).encode())
    assert token_for(url, (user, f"{forged}.{mac}"), scope).status_code == 401


def test_the_registry_refuses_an_expired_token_and_one_signed_by_another_key(images, tmp_path):
    key = settings.TRAINYARD_REGISTRY_TOKEN_KEY
    holder = registry_tokens.Holder(subject="team.amber", team="amber")
    scope = ["repository:trainyard/amber/app:pull"]
    path = f"{images}/v2/trainyard/amber/app/manifests/1"

    def status(token: str) -> int:
        return httpx.get(path, headers={"Authorization": f"Bearer {token}", "Accept": MANIFEST_TYPE},
                         timeout=10).status_code  # fmt: skip

    assert status(registry_tokens.issue(key, holder, scope)["token"]) == 200
    # Issued ten minutes ago with the usual five-minute life: past the registry's one-minute leeway.
    assert status(registry_tokens.issue(key, holder, scope, now=time.time() - 600)["token"]) == 401
    other = tmp_path / "other.key"
    registry_tokens.ensure_key(other)
    assert status(registry_tokens.issue(other, holder, scope)["token"]) == 401
    assert status(registry_tokens.issue(key, holder, scope, service="another-registry")["token"]) == 401


def test_the_signing_key_is_private_and_the_registry_config_names_its_certificate(token_registry):
    key = Path(settings.TRAINYARD_REGISTRY_TOKEN_KEY)
    assert key.stat().st_mode & 0o077 == 0
    assert registry_tokens.cert_path(key).read_text().startswith("-----BEGIN CERTIFICATE-----")


def test_the_web_route_issues_the_same_tokens_for_a_registry_pointed_at_the_platform(images, client):
    """/registry/token on the platform's web server (for a registry an operator runs with `auth: token`)."""
    amber = registry.team_credential("amber")
    scope = {"service": registry_tokens.SERVICE, "scope": "repository:trainyard/amber/app:pull"}
    basic = "Basic " + base64.b64encode(f"{amber[0]}:{amber[1]}".encode()).decode()
    answer = client.get("/registry/token", scope, HTTP_AUTHORIZATION=basic)
    assert answer.status_code == 200
    headers = {"Authorization": f"Bearer {answer.json()['token']}", "Accept": MANIFEST_TYPE}
    assert httpx.get(f"{images}/v2/trainyard/amber/app/manifests/1", headers=headers, timeout=10).status_code == 200
    wrong = client.get("/registry/token", scope, HTTP_AUTHORIZATION=basic[:-4] + "AAA=")
    assert wrong.status_code == 401 and wrong.json()["code"] == "registry_credentials_invalid"
    assert wrong["WWW-Authenticate"].startswith("Basic ")
    other = client.get("/registry/token", {**scope, "service": "elsewhere"}, HTTP_AUTHORIZATION=basic)
    assert other.status_code == 400 and other.json()["code"] == "registry_service_unknown"
