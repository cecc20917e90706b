"""The S3-compatible object store that holds checkpoints (any endpoint; embedded SeaweedFS by default).

Plain functions with no Django import, so the local supervisor (a process without settings) uses the same code:
`S3Config` says where the store is and how to sign in, `client()` makes a botocore client for it, and
`ensure_bucket()` creates the bucket on first use.

Configuration comes from the environment: `TRAINYARD_S3_URL` (e.g. `http://127.0.0.1:8333`), the credentials
`TRAINYARD_S3_ACCESS_KEY_ID` / `TRAINYARD_S3_SECRET_ACCESS_KEY` (else boto3's own chain: `AWS_ACCESS_KEY_ID`,
`~/.aws`, instance roles), `TRAINYARD_S3_REGION` and `TRAINYARD_S3_BUCKET`.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass
from urllib.parse import urlparse

DEFAULT_BUCKET = "trainyard"


class StoreError(RuntimeError):
    """The object store could not be reached or refused a request; the message says which and why."""


@dataclass(frozen=True)
class S3Config:
    url: str
    bucket: str = DEFAULT_BUCKET
    region: str = "us-east-1"
    access_key_id: str = ""
    secret_access_key: str = ""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> S3Config | None:
        """The store named by the environment, or None when `TRAINYARD_S3_URL` is unset."""
        env = os.environ if env is None else env
        url = (env.get("TRAINYARD_S3_URL") or "").strip()
        if not url:
            return None
        check_url(url)
        return cls(
            url=url.rstrip("/"),
            bucket=(env.get("TRAINYARD_S3_BUCKET") or DEFAULT_BUCKET).strip(),
            region=(env.get("TRAINYARD_S3_REGION") or "us-east-1").strip(),
            access_key_id=env.get("TRAINYARD_S3_ACCESS_KEY_ID", ""),
            secret_access_key=env.get("TRAINYARD_S3_SECRET_ACCESS_KEY", ""),
        )

    def to_dict(self) -> dict:
        return asdict(self)


def check_url(url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in {"http", "https"} or not parsed.hostname:
        raise StoreError(f"TRAINYARD_S3_URL must be an http(s):// URL of an S3 endpoint, got '{url}'")


_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()


def client(config: S3Config, *, timeout_s: float = 30.0, attempts: int = 3, sign_payload: bool = True):
    """A botocore S3 client for the store (path-style addressing: most self-hosted stores need it), one per process
    for each store and options: botocore clients are thread-safe, and making one costs tens of milliseconds and
    memory a process does not give back (a worker making a few an hour grew by about 12 MiB an hour). Keyed by the
    process id too, so a forked child never shares its parent's connections.

    `sign_payload=False`: request bodies are not hashed into the signature (botocore otherwise reads every byte
    once more for SHA-256 on plain http). Only for callers whose every upload carries a Content-MD5 the store
    checks and whose result is verified against the store's ETag (the checkpoint uploader): that is the choice
    botocore itself makes over https when a Content-MD5 is present."""
    key = (os.getpid(), config, float(timeout_s), int(attempts), bool(sign_payload))
    made = _clients.get(key)
    if made is None:
        with _clients_lock:
            made = _clients.get(key)
            if made is None:
                made = _clients[key] = _new_client(config, timeout_s, attempts, sign_payload)
    return made


def _new_client(config: S3Config, timeout_s: float, attempts: int, sign_payload: bool):
    import boto3
    from botocore.config import Config

    session = boto3.session.Session()
    keys = {}
    if config.access_key_id:
        keys = {"aws_access_key_id": config.access_key_id, "aws_secret_access_key": config.secret_access_key}
    return session.client(
        "s3",
        endpoint_url=config.url,
        region_name=config.region,
        config=Config(
            s3={"addressing_style": "path", **({} if sign_payload else {"payload_signing_enabled": False})},
            signature_version="s3v4",
            connect_timeout=min(timeout_s, 10.0),
            read_timeout=timeout_s,
            retries={"max_attempts": attempts, "mode": "standard"},
            # Self-hosted stores differ in the newer flexible checksums; MD5 and our own SHA-256 are checked instead.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
        **keys,
    )


def describe_error(exc: BaseException) -> str:
    """One line for an event or a CLI message."""
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        return f"{err.get('Code', 'error')}: {err.get('Message', '') or exc}"[:300]
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def ensure_bucket(config: S3Config, s3=None) -> None:
    """Create the bucket when the store lacks it; StoreError when the store cannot be used."""
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = s3 or client(config, timeout_s=10.0, attempts=2)
    try:
        s3.head_bucket(Bucket=config.bucket)
        return
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code not in {"404", "NoSuchBucket", "NotFound"}:
            raise StoreError(f"cannot use bucket '{config.bucket}' at {config.url}: {describe_error(exc)}") from None
    except BotoCoreError as exc:
        raise StoreError(f"cannot reach the object store at {config.url}: {describe_error(exc)}") from None
    try:
        s3.create_bucket(Bucket=config.bucket)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
            raise StoreError(f"cannot create bucket '{config.bucket}' at {config.url}: {describe_error(exc)}") from None
    except BotoCoreError as exc:
        raise StoreError(f"cannot reach the object store at {config.url}: {describe_error(exc)}") from None
