"""Where the CLI finds the server and the API token: `TRAINYARD_URL` / `TRAINYARD_TOKEN` in the environment
first, else the config file (`TRAINYARD_CONFIG`, or `$XDG_CONFIG_HOME/trainyard/config.yaml`, or
`~/.config/trainyard/config.yaml`) that `trainyard login` writes with mode 0600."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from .errors import EXIT_AUTH, CliError

DEFAULT_URL = "http://127.0.0.1:8000"
CONFIG_KEYS = ("url", "token")


@dataclass(frozen=True)
class Config:
    url: str
    token: str | None
    path: Path
    warnings: tuple[str, ...] = ()


def config_path(env: Mapping[str, str]) -> Path:
    if env.get("TRAINYARD_CONFIG"):
        return Path(env["TRAINYARD_CONFIG"]).expanduser()
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "trainyard" / "config.yaml"


def normalize_url(raw: str, *, origin: str) -> str:
    """`http://host:8000/`, `http://host:8000/api/v1` and `http://host:8000` all name the same server."""
    url = raw.strip().rstrip("/")
    if url.endswith("/api/v1"):
        url = url[: -len("/api/v1")]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CliError(f"{origin}: {raw!r} is not a server address like https://trainyard.example.com", EXIT_AUTH)
    return url


def check_token(raw: str, *, origin: str) -> str:
    token = raw.strip()
    if not token.startswith("ty_") or any(ch.isspace() for ch in token):
        raise CliError(f"{origin}: this is not a Trainyard API token (they look like ty_<prefix>_<secret>)", EXIT_AUTH)
    return token


def read_config_file(path: Path) -> tuple[dict[str, str], list[str]]:
    """The file's url/token (either may be missing) and warnings; no file at all reads as empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, []
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read the config file {path}: {exc}", EXIT_AUTH)
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise CliError(f"config file {where}: invalid YAML: {exc.problem}", EXIT_AUTH)
    except yaml.YAMLError as exc:
        raise CliError(f"config file {path}: invalid YAML: {exc}", EXIT_AUTH)
    if data is None:
        return {}, []
    if not isinstance(data, dict):
        raise CliError(
            f"config file {path}: expected `url:` and `token:` keys, found a {type(data).__name__}", EXIT_AUTH
        )
    unknown = sorted(str(k) for k in data if k not in CONFIG_KEYS)
    if unknown:
        raise CliError(f"config file {path}: unknown key {', '.join(unknown)} (expected url and token)", EXIT_AUTH)
    for key, value in data.items():
        if value is not None and not isinstance(value, str):
            raise CliError(f"config file {path}: {key} must be text", EXIT_AUTH)
    warnings = []
    mode = stat.S_IMODE(path.stat().st_mode)
    if data.get("token") and mode & 0o077:
        warnings.append(
            f"the config file {path} holds a token and is readable by others (mode {mode:04o}); run: chmod 600 {path}"
        )
    return {k: v for k, v in data.items() if v}, warnings


def load_config(env: Mapping[str, str]) -> Config:
    path = config_path(env)
    stored, warnings = read_config_file(path)
    if env.get("TRAINYARD_URL"):
        url = normalize_url(env["TRAINYARD_URL"], origin="TRAINYARD_URL")
    elif stored.get("url"):
        url = normalize_url(stored["url"], origin=f"url in {path}")
    else:
        url = DEFAULT_URL
    if env.get("TRAINYARD_TOKEN"):
        token: str | None = check_token(env["TRAINYARD_TOKEN"], origin="TRAINYARD_TOKEN")
    elif stored.get("token"):
        token = check_token(stored["token"], origin=f"token in {path}")
    else:
        token = None
    return Config(url=url, token=token, path=path, warnings=tuple(warnings))


def require_token(config: Config) -> str:
    if not config.token:
        raise CliError(
            "no API token configured: set TRAINYARD_TOKEN, or run `trainyard login --url URL --token TOKEN` "
            "(create a token with POST /api/v1/tokens/ while signed in to the portal)",
            EXIT_AUTH,
        )
    return config.token


def save_config(path: Path, *, url: str, token: str) -> None:
    """Write url and token readable by the owner only; the file never exists with wider permissions."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    body = yaml.safe_dump({"url": url, "token": token}, sort_keys=False)
    fd, tmp = tempfile.mkstemp(prefix=".config-", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
