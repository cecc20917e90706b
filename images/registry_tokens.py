"""The platform registry's token service: the registry (distribution, `auth: token`) answers an unauthenticated
request with 401 and a `Bearer realm=…,service=…,scope=…` challenge; the client asks the realm (this service) for a
token with Basic credentials; the service checks them and signs a short-lived JWT granting only the actions the
holder may have on each repository asked for. The registry trusts the certificate of the signing key
(`rootcertbundle`) and refuses a token that is expired, signed by another key or missing the action asked for.

Who may do what (docs/security.md, "Registry"):

- the platform itself (TRAINYARD_REGISTRY_USERNAME / _PASSWORD): everything, the catalog included;
- `team.<slug>`: pull `trainyard/<slug>/…`, the shared bases `trainyard/base/…` and the mirrors outside
  `trainyard/`; never another team's `trainyard/<other>/…`, never a push;
- `build.<id>`: what its team may pull, and push to the one repository of that build; the password carries its own
  expiry, so it stops working by itself.

Passwords are not stored: a team's is an HMAC of its name, a build's of its name, repository and expiry, both keyed
by a secret derived from the signing key (var/registry-token.key, 0600). Replacing the key changes every password.
Nothing here needs the database, so the same code serves `python -m images.registry_tokens` (started beside the
embedded registry) and the web route /registry/token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from kernel.host import private_file

ISSUER = "trainyard"
SERVICE = "trainyard-registry"
SHARED_PREFIX = "trainyard/base/"  # the catalog's bases (images.services.SHARED_NAMESPACE): every team's
PLATFORM_PREFIX = "trainyard/"  # below it, one folder per team; outside it, mirrors of public images
TOKEN_TTL_S = 300
ACTIONS = ("pull", "push", "delete", "*")


class TokenError(Exception):
    """A request the token service refuses: `status` and a stable `code` for the JSON answer."""

    def __init__(self, status: int, code: str, detail: str):
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


def cert_path(key_path: Path) -> Path:
    return Path(key_path).with_suffix(".crt")


def ensure_key(key_path: Path) -> Path:
    """The signing key (RSA 2048, PEM, 0600) and its self-signed certificate beside it (what the registry's
    `rootcertbundle` names), made once; returns the certificate's path."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key_path = Path(key_path)
    crt = cert_path(key_path)
    if key_path.exists() and crt.exists():
        key_path.chmod(0o600)
        return crt
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainyard registry token signer")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    private_file(key_path, pem.decode())
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))  # public: the registry reads it
    _signer.cache_clear()
    return crt


@dataclass(frozen=True)
class Signer:
    key: object  # an RSA private key (cryptography)
    x5c: str  # the certificate, base64 DER: the registry checks it against its rootcertbundle
    secret: bytes  # keys the password HMACs


@lru_cache(maxsize=4)
def _signer(key_path: str, mtime_ns: int) -> Signer:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    pem = Path(key_path).read_bytes()
    key = serialization.load_pem_private_key(pem, password=None)
    cert = x509.load_pem_x509_certificate(cert_path(Path(key_path)).read_bytes())
    der = cert.public_bytes(serialization.Encoding.DER)
    secret = hashlib.sha256(b"trainyard registry credentials\0" + pem).digest()
    return Signer(key=key, x5c=base64.b64encode(der).decode(), secret=secret)


def signer(key_path: Path | str) -> Signer:
    return _signer(str(key_path), os.stat(key_path).st_mtime_ns)


def _mac(secret: bytes, text: str) -> str:
    return base64.urlsafe_b64encode(hmac.new(secret, text.encode(), hashlib.sha256).digest()).decode().rstrip("=")


def team_credential(key_path: Path | str, slug: str) -> tuple[str, str]:
    """The pull credential of a team's jobs: `team.<slug>` and its password."""
    user = f"team.{slug}"
    return user, _mac(signer(key_path).secret, f"pull|{user}")


def build_credential(
    key_path: Path | str, *, build_id: int, repository: str, team: str | None, ttl_s: float, now: float | None = None
) -> tuple[str, str]:
    """A build's push credential: `build.<id>`, and a password that names the repository it may push to, the team
    whose images it may pull and when it stops working, signed."""
    user = f"build.{build_id}"
    expires = int((now if now is not None else time.time()) + ttl_s)
    body = _b64(json.dumps({"r": repository, "t": team, "e": expires}).encode())
    return user, f"{body}.{_mac(signer(key_path).secret, f'push|{user}|{body}')}"


@dataclass(frozen=True)
class Holder:
    """Who a credential belongs to and what it may reach."""

    subject: str
    everything: bool = False  # the platform's own credential
    team: str | None = None  # whose `trainyard/<team>/…` it may pull (None: the shared ones only)
    push: str = ""  # the one repository it may push to


def authenticate(
    key_path: Path | str, user: str, password: str, *, service_user: str = "", service_password: str = "",
    now: float | None = None,
) -> Holder:  # fmt: skip
    """The holder of a credential; TokenError (401) when the password is wrong or a build's has expired."""
    if service_user and user == service_user and hmac.compare_digest(password.encode(), service_password.encode()):
        return Holder(subject=user, everything=True)
    kind, _, name = user.partition(".")
    secret = signer(key_path).secret
    if kind == "team" and name and hmac.compare_digest(password, _mac(secret, f"pull|{user}")):
        return Holder(subject=user, team=name)
    if kind == "build" and name.isdigit() and "." in password:
        body, _, mac = password.rpartition(".")
        if hmac.compare_digest(mac, _mac(secret, f"push|{user}|{body}")):
            try:
                claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            except (ValueError, binascii.Error):
                claims = None
            if isinstance(claims, dict) and isinstance(claims.get("r"), str):
                if int(claims.get("e", 0)) < (now if now is not None else time.time()):
                    raise TokenError(401, "registry_credentials_expired", f"the credential of {user} has expired")
                return Holder(subject=user, team=claims.get("t") or None, push=claims["r"])
    raise TokenError(401, "registry_credentials_invalid", "wrong user or password for the platform's registry")


def may_pull(holder: Holder, repository: str) -> bool:
    if holder.everything or repository == holder.push:
        return True
    if not repository.startswith(PLATFORM_PREFIX):
        return True  # mirrors of public images (upstream bases)
    if repository.startswith(SHARED_PREFIX):
        return True
    return holder.team is not None and repository.startswith(f"{PLATFORM_PREFIX}{holder.team}/")


def allowed(holder: Holder, kind: str, name: str, actions: list[str]) -> list[str]:
    """The subset of `actions` on the resource `kind:name` the holder is granted."""
    if holder.everything:
        return list(actions)
    if kind != "repository":
        return []  # the catalog (`registry:catalog:*`) is the platform's alone
    out = []
    for action in actions:
        pull = action == "pull" and may_pull(holder, name)
        # A team's build never writes the shared bases, even a team whose slug is the shared folder's name.
        shared = holder.team is not None and name.startswith(SHARED_PREFIX)
        if pull or (action == "push" and holder.push and name == holder.push and not shared):
            out.append(action)
    return out


def parse_scope(scope: str) -> tuple[str, str, list[str]]:
    """`repository:trainyard/a/app:pull,push` -> ("repository", "trainyard/a/app", ["pull", "push"])."""
    kind, sep, rest = scope.partition(":")
    name, sep2, actions = rest.rpartition(":")
    kind = kind.split("(", 1)[0]  # `repository(plugin)` is a repository
    if not (sep and sep2 and kind and name) or not actions:
        raise TokenError(400, "registry_scope_invalid", f"not a scope: {scope!r}")
    return kind, name, [a for a in actions.split(",") if a]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def sign(key_path: Path | str, claims: dict) -> str:
    """A JWT (RS256) whose header carries the signing certificate (x5c), which the registry checks against the
    certificate bundle it was given."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    s = signer(key_path)
    header = {"typ": "JWT", "alg": "RS256", "x5c": [s.x5c]}
    head = _b64(json.dumps(header, separators=(",", ":")).encode())
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signature = s.key.sign(f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{head}.{body}.{_b64(signature)}"


def issue(
    key_path: Path | str, holder: Holder, scopes: list[str], *, service: str = SERVICE, issuer: str = ISSUER,
    ttl_s: int = TOKEN_TTL_S, now: float | None = None,
) -> dict:  # fmt: skip
    """The token answer for these scopes: each granted only the actions the holder may have (possibly none, and
    the registry then refuses the request with its own 401)."""
    now = int(now if now is not None else time.time())
    access: list[dict] = []
    for scope in scopes:
        kind, name, actions = parse_scope(scope)
        granted = allowed(holder, kind, name, actions)
        access.append({"type": kind, "name": name, "actions": granted})
    claims = {
        "iss": issuer,
        "sub": holder.subject,
        "aud": service,
        "exp": now + ttl_s,
        "nbf": now - 1,
        "iat": now,
        "jti": secrets.token_urlsafe(16),
        "access": access,
    }
    token = sign(key_path, claims)
    issued = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"token": token, "access_token": token, "expires_in": ttl_s, "issued_at": issued}


def basic_credentials(header: str) -> tuple[str, str]:
    if not header.lower().startswith("basic "):
        raise TokenError(401, "registry_credentials_missing", "the token service wants Basic credentials")
    try:
        user, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise TokenError(401, "registry_credentials_invalid", "malformed Basic credentials") from None
    if not sep:
        raise TokenError(401, "registry_credentials_invalid", "malformed Basic credentials")
    return user, password


@dataclass(frozen=True)
class Config:
    key_path: str
    service_user: str = ""
    service_password: str = ""
    service: str = SERVICE
    issuer: str = ISSUER
    ttl_s: int = TOKEN_TTL_S


def answer(config: Config, *, authorization: str, query: dict[str, list[str]]) -> tuple[int, dict]:
    """One token request (GET realm?service=…&scope=…, Basic credentials) -> (HTTP status, JSON body)."""
    try:
        services = query.get("service") or [config.service]
        if services[0] != config.service:
            raise TokenError(400, "registry_service_unknown", f"this service issues tokens for {config.service}")
        user, password = basic_credentials(authorization)
        holder = authenticate(
            config.key_path, user, password,
            service_user=config.service_user, service_password=config.service_password,
        )  # fmt: skip
        scopes = [s for value in query.get("scope", []) for s in value.split(" ") if s]
        return 200, issue(config.key_path, holder, scopes, service=config.service, issuer=config.issuer,
                          ttl_s=config.ttl_s)  # fmt: skip
    except TokenError as exc:
        return exc.status, {"code": exc.code, "detail": exc.detail}


def serve(config: Config, host: str, port: int) -> None:
    """The token service alone on host:port (path /registry/token), for the embedded registry."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            url = urlparse(self.path)
            if url.path.rstrip("/") != "/registry/token":
                status, body = 404, {"code": "not_found", "detail": "the token service is at /registry/token"}
            else:
                status, body = answer(config, authorization=self.headers.get("Authorization", ""),
                                      query=parse_qs(url.query))  # fmt: skip
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 401:
                self.send_header("WWW-Authenticate", f'Basic realm="{config.service}"')
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *args) -> None:
            pass  # the registry logs the requests that matter; tokens never go to a log

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    server.serve_forever()


def main(argv: list[str]) -> int:
    """`python -m images.registry_tokens HOST PORT KEY SERVICE_CREDENTIALS_FILE` (the file holds `user:password`)."""
    if len(argv) != 4:
        print("usage: python -m images.registry_tokens HOST PORT KEY SERVICE_CREDENTIALS_FILE", file=sys.stderr)
        return 2
    host, port, key, creds = argv
    user, _, password = Path(creds).read_text().strip().partition(":")
    signer(key)  # fail now, not at the first request, when the key is unreadable
    serve(Config(key_path=key, service_user=user, service_password=password), host, int(port))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
