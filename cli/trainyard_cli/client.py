"""The CLI's HTTP client for the REST API (`/api/v1/`): bearer-token auth, the platform's JSON errors turned
into one-line `CliError`s, and a bounded number of retries after 429 that honour `Retry-After`.

It speaks plain HTTP through httpx and imports nothing from Django, so it runs on any CI machine; the same
modules are packaged alone as `trainyard-cli` (cli/pyproject.toml), so imports between them are relative.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import httpx

from .errors import EXIT_AUTH, EXIT_UNAVAILABLE, EXIT_USAGE, CliError

API = "/api/v1"


def cli_version() -> str:
    # The package ships alone (`trainyard-cli`) and inside the platform's distribution (`trainyard`).
    for distribution in ("trainyard-cli", "trainyard"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "dev"


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str
    code: str

    def line(self) -> str:
        return f"{self.path}: {self.message} ({self.code})" if self.path else f"{self.message} ({self.code})"


class ApiError(CliError):
    """An HTTP error answer from the platform, kept structured so a command can say more (e.g. YAML lines)."""

    def __init__(
        self,
        message: str,
        exit_code: int,
        *,
        status: int,
        code: str = "",
        detail: str = "",
        fields: list[FieldError] | None = None,
        body: dict | None = None,
    ):
        self.status = status
        self.code = code
        self.detail = detail
        self.fields = fields or []
        self.body = body or {}  # the whole error answer (a 503 of a submission names its job here)
        super().__init__(message, exit_code, [f.line() for f in self.fields])


def flatten_fields(fields: Any, prefix: str = "") -> list[FieldError]:
    """`{"env": {"A": [{"message": m, "code": c}]}}` → [FieldError("env.A", m, c)], in the server's order."""
    if isinstance(fields, dict):
        if isinstance(fields.get("message"), str) and "code" in fields:
            return [FieldError(prefix, fields["message"], str(fields["code"]))]
        out: list[FieldError] = []
        for key, value in fields.items():
            out += flatten_fields(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(fields, list):
        return [err for item in fields for err in flatten_fields(item, prefix)]
    return [FieldError(prefix, str(fields), "invalid")]


class ApiClient:
    """One connection pool per CLI run; every call returns decoded JSON or raises a CliError."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        max_rate_retries: int = 5,
        max_retry_after_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.url = url
        self.max_rate_retries = max_rate_retries
        self.max_retry_after_s = max_retry_after_s
        self.timeout_s = timeout_s
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=url,
            timeout=timeout_s,
            follow_redirects=False,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "User-Agent": f"trainyard-cli/{cli_version()}",
            },
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(
        self,
        path: str,
        *,
        params: Iterable[tuple[str, Any]] | dict[str, Any] | None = None,
        not_found: str | None = None,
    ) -> Any:
        return self.request("GET", path, params=params, not_found=not_found)[1]

    def post(
        self, path: str, *, json: Any = None, headers: dict[str, str] | None = None, not_found: str | None = None
    ) -> tuple[int, Any]:
        return self.request("POST", path, json=json, headers=headers, not_found=not_found)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
        not_found: str | None = None,
        content: bytes | None = None,
    ) -> tuple[int, Any]:
        target = path if path.startswith(("http://", "https://")) else API + path
        for attempt in range(self.max_rate_retries + 1):
            try:
                response = self._http.request(
                    method, target, params=params, json=json, headers=headers, content=content
                )
            except httpx.TimeoutException:
                raise CliError(
                    f"the Trainyard server at {self.url} did not answer within {self.timeout_s:g} s", EXIT_UNAVAILABLE
                )
            except httpx.TransportError as exc:
                raise CliError(
                    f"cannot reach the Trainyard server at {self.url}: {str(exc) or type(exc).__name__}",
                    EXIT_UNAVAILABLE,
                )
            if response.status_code != 429:
                return response.status_code, self._decode(method, target, response, not_found)
            wait = self._retry_after(response)
            if attempt >= self.max_rate_retries or wait > self.max_retry_after_s:
                raise ApiError(
                    f"rate limited by the server: try again in {wait:.0f} s",
                    EXIT_UNAVAILABLE,
                    status=429,
                    code="throttled",
                )
            print(
                f"trainyard: rate limited; retrying in {wait:.0f} s ({attempt + 1}/{self.max_rate_retries})",
                file=sys.stderr,
            )
            self._sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def download(self, path: str, *, params: dict[str, Any] | None, dest, not_found: str | None = None) -> int:
        """Stream a file answer into `dest` (a binary file); returns the bytes written. Errors as `request`."""
        target = API + path
        try:
            with self._http.stream("GET", target, params=params, timeout=None) as response:
                if response.status_code != 200:
                    response.read()
                    self._decode("GET", target, response, not_found)
                    raise CliError(f"unexpected answer (HTTP {response.status_code}) to GET {target}", EXIT_UNAVAILABLE)
                written = 0
                for chunk in response.iter_bytes(1024 * 1024):
                    dest.write(chunk)
                    written += len(chunk)
                return written
        except httpx.TransportError as exc:
            raise CliError(
                f"cannot reach the Trainyard server at {self.url}: {str(exc) or type(exc).__name__}", EXIT_UNAVAILABLE
            )

    def _retry_after(self, response: httpx.Response) -> float:
        raw = response.headers.get("Retry-After", "")
        try:
            wait = float(raw)
        except ValueError:
            body = _json_or_none(response)
            wait = float(body.get("retry_after", 1)) if isinstance(body, dict) else 1.0
        # DRF rounds the wait down, so "0" means "within the second".
        return max(wait, 1.0)

    def _decode(self, method: str, target: str, response: httpx.Response, not_found: str | None) -> Any:
        status = response.status_code
        if status == 204:
            return None
        if 300 <= status < 400:
            where = response.headers.get("Location", "elsewhere")
            raise CliError(
                f"the server at {self.url} redirected {method} {target} to {where}: set TRAINYARD_URL "
                "to the platform's own address",
                EXIT_UNAVAILABLE,
            )
        body = _json_or_none(response)
        if body is None and status >= 500:
            raise ApiError(f"server error (HTTP {status}) on {method} {target}", EXIT_UNAVAILABLE, status=status)
        if body is None:
            kind = response.headers.get("Content-Type", "no content type").split(";")[0]
            raise CliError(
                f"unexpected answer from {self.url} to {method} {target} (HTTP {status}, {kind}): "
                "is this the address of a Trainyard server?",
                EXIT_UNAVAILABLE,
            )
        if status < 400:
            return body
        code = str(body.get("code", "error")) if isinstance(body, dict) else "error"
        detail = str(body.get("detail", "")) if isinstance(body, dict) else ""
        fields = flatten_fields(body.get("fields", {})) if isinstance(body, dict) else []
        if status == 401:
            raise ApiError(
                f"the server rejected the API token: {detail or 'not authenticated'} — create a new "
                "token and run `trainyard login` (or set TRAINYARD_TOKEN)",
                EXIT_AUTH,
                status=status,
                code=code,
                detail=detail,
            )
        if status == 403:
            raise ApiError(f"permission denied: {detail} ({code})", EXIT_AUTH, status=status, code=code, detail=detail)
        if status == 404:
            text = not_found if not_found and code == "not_found" else f"{detail or 'not found'} ({code})"
            raise ApiError(text, EXIT_USAGE, status=status, code=code, detail=detail)
        if status >= 500:
            raise ApiError(
                f"server error (HTTP {status}) on {method} {target}: {detail or 'no detail'}",
                EXIT_UNAVAILABLE,
                status=status,
                code=code,
                detail=detail,
                body=body if isinstance(body, dict) else None,
            )
        text = detail if not fields or detail not in ("", "The request is invalid.") else "the server rejected it"
        raise ApiError(f"{text} ({code})", EXIT_USAGE, status=status, code=code, detail=detail, fields=fields)


def _json_or_none(response: httpx.Response) -> Any:
    if "json" not in response.headers.get("Content-Type", ""):
        return None
    try:
        return response.json()
    except ValueError:
        return None
