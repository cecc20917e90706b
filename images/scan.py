"""SBOM from an image's layers, the vulnerability feed (OSV format; Trivy JSON reports), and matching the two.

The SBOM is read from the layer tarballs in the registry (no container runtime): Debian packages from
`var/lib/dpkg/status`, Python packages from `*.dist-info/METADATA`, with later layers' files and whiteouts winning.
The same walk measures data files (weights, datasets) for the hygiene warning.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from email.parser import HeaderParser
from typing import Any

from packaging.version import InvalidVersion, Version

DATA_SUFFIXES = (
    ".pt", ".pth", ".ckpt", ".safetensors", ".bin", ".h5", ".hdf5", ".npy", ".npz", ".parquet", ".csv",
    ".tfrecord", ".onnx", ".arrow", ".pkl", ".tar", ".zip", ".gz", ".jsonl",
)  # fmt: skip
DIST_INFO = re.compile(r"(^|/)[^/]+\.dist-info/METADATA$")
DPKG_STATUS = "var/lib/dpkg/status"


@dataclass
class LayerWalk:
    packages: list[dict[str, str]]
    data_files: list[tuple[str, int]]  # (path, bytes) of files that look like data or weights


class _ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (a registry blob as it downloads)."""

    def __init__(self, chunks: Iterator[bytes]):
        self.chunks = iter(chunks)
        self.buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target) -> int:
        while not self.buffer:
            chunk = next(self.chunks, None)
            if chunk is None:
                return 0
            self.buffer = chunk
        n = min(len(target), len(self.buffer))
        target[:n] = self.buffer[:n]
        self.buffer = self.buffer[n:]
        return n


def _norm(name: str) -> str:
    return name.lstrip("./")


def walk_layers(blobs: Iterable[Iterator[bytes]]) -> LayerWalk:
    """Read each layer (a gzip or plain tar stream) in order; later layers replace and white out earlier files."""
    files: dict[str, bytes | int] = {}  # interesting path -> content (metadata) or size (data file)
    for chunks in blobs:
        # Streamed: a CUDA layer is gigabytes, never held in memory; only metadata files are read.
        with tarfile.open(fileobj=_ChunkReader(chunks), mode="r|*") as tar:
            for member in tar:
                path = _norm(member.name)
                head, _, base = path.rpartition("/")
                if base.startswith(".wh."):
                    gone = f"{head}/{base[4:]}" if head else base[4:]
                    if base == ".wh..wh..opq":
                        gone = head
                    for key in [k for k in files if k == gone or k.startswith(gone + "/")]:
                        del files[key]
                    continue
                if not member.isfile():
                    continue
                if path == DPKG_STATUS or DIST_INFO.search(path):
                    extracted = tar.extractfile(member)
                    files[path] = extracted.read() if extracted else b""
                elif path.lower().endswith(DATA_SUFFIXES):
                    files[path] = member.size
    packages: list[dict[str, str]] = []
    data: list[tuple[str, int]] = []
    for path, value in sorted(files.items()):
        if isinstance(value, int):
            data.append((path, value))
        elif path == DPKG_STATUS:
            packages.extend(_dpkg_packages(value.decode("utf-8", "replace")))
        else:
            headers = HeaderParser().parsestr(value.decode("utf-8", "replace"))
            if headers.get("Name") and headers.get("Version"):
                packages.append({"type": "pypi", "name": headers["Name"], "version": headers["Version"]})
    return LayerWalk(packages=packages, data_files=data)


def _dpkg_packages(text: str) -> Iterator[dict[str, str]]:
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, flags=re.M))
        state = fields.get("Status", "install ok installed").split()[-1:]  # want/flag/state: the state is last
        if fields.get("Package") and fields.get("Version") and state == ["installed"]:
            yield {"type": "deb", "name": fields["Package"], "version": fields["Version"]}


def config_user(config: dict[str, Any]) -> str:
    """The `USER` an image's config names ("" when it names none: the runtime then starts it as root)."""
    return str((config.get("config") or {}).get("User") or "").strip()


def runs_as_root(user: str) -> bool:
    """Whether a config's `User` (name, uid, `user:group` or `uid:gid`) starts the process as root."""
    who = user.partition(":")[0].strip()
    return who in ("", "root", "0")


# --------------------------------------------------------------------------------------------- versions


def _deb_order(c: str) -> int:
    if c == "~":
        return -1
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _deb_part(a: str, b: str) -> int:
    """dpkg's comparison of an upstream version or revision: alternating non-digit and digit runs."""
    while a or b:
        na = re.match(r"\D*", a).group()  # type: ignore[union-attr]
        nb = re.match(r"\D*", b).group()  # type: ignore[union-attr]
        a, b = a[len(na) :], b[len(nb) :]
        for i in range(max(len(na), len(nb))):
            ca = _deb_order(na[i]) if i < len(na) else 0
            cb = _deb_order(nb[i]) if i < len(nb) else 0
            if ca != cb:
                return -1 if ca < cb else 1
        da = re.match(r"\d*", a).group()  # type: ignore[union-attr]
        db = re.match(r"\d*", b).group()  # type: ignore[union-attr]
        a, b = a[len(da) :], b[len(db) :]
        if int(da or 0) != int(db or 0):
            return -1 if int(da or 0) < int(db or 0) else 1
    return 0


def deb_compare(a: str, b: str) -> int:
    def split(v: str) -> tuple[int, str, str]:
        epoch, _, rest = v.rpartition(":") if ":" in v else ("0", "", v)
        upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "0")
        return int(epoch or 0), upstream, revision

    ea, ua, ra = split(a)
    eb, ub, rb = split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _deb_part(ua, ub) or _deb_part(ra, rb)


def compare(ecosystem: str, a: str, b: str) -> int:
    if ecosystem.lower().startswith("debian"):
        return deb_compare(a, b)
    try:
        va, vb = Version(a), Version(b)
        return (va > vb) - (va < vb)
    except InvalidVersion:
        return deb_compare(a, b)  # a sane fallback for dotted versions


def affected(ecosystem: str, version: str, ranges: list[list[str]], versions: list[str]) -> bool:
    if version in versions:
        return True
    for r in ranges:
        introduced, fixed, last_affected = (list(r) + ["", ""])[:3]
        if introduced not in ("", "0") and compare(ecosystem, version, introduced) < 0:
            continue
        if fixed and compare(ecosystem, version, fixed) >= 0:
            continue
        if last_affected and compare(ecosystem, version, last_affected) > 0:
            continue
        return True
    return False


# ------------------------------------------------------------------------------------------------- feeds

SEVERITY_WORDS = {"low": "low", "moderate": "medium", "medium": "medium", "high": "high", "critical": "critical"}


def _cvss_severity(score: float) -> str:
    return "critical" if score >= 9 else "high" if score >= 7 else "medium" if score >= 4 else "low"


def osv_severity(entry: dict[str, Any], affected_entry: dict[str, Any]) -> str:
    for source in (
        affected_entry.get("ecosystem_specific") or {},
        affected_entry.get("database_specific") or {},
        entry.get("database_specific") or {},
    ):
        word = str(source.get("severity", "")).lower()
        if word in SEVERITY_WORDS:
            return SEVERITY_WORDS[word]
    for item in entry.get("severity") or []:
        try:
            return _cvss_severity(float(item.get("score")))
        except (TypeError, ValueError):
            continue
    return "unknown"


def ecosystem_of(name: str) -> str:
    """OSV ecosystems ("PyPI", "Debian:12") folded to what SBOM entries say ("pypi", "deb")."""
    lowered = name.lower()
    if lowered == "pypi":
        return "pypi"
    if lowered.startswith("debian") or lowered.startswith("ubuntu"):
        return "deb"
    return lowered


def parse_osv(document: Any) -> Iterator[dict[str, Any]]:
    """Advisory rows from an OSV entry, a list of them, or `{"vulns": [...]}` (an OSV query answer)."""
    if isinstance(document, dict) and "vulns" in document:
        document = document["vulns"]
    entries = document if isinstance(document, list) else [document]
    for entry in entries:
        if not isinstance(entry, dict) or not entry.get("id"):
            raise ValueError("not an OSV feed: every entry needs an id")
        for item in entry.get("affected") or []:
            package = item.get("package") or {}
            if not package.get("name") or not package.get("ecosystem"):
                continue
            ranges = []
            for r in item.get("ranges") or []:
                if r.get("type") not in ("ECOSYSTEM", "SEMVER"):
                    continue
                introduced: str | None = None
                for event in r.get("events") or []:
                    if "introduced" in event:
                        introduced = event["introduced"]
                    elif "fixed" in event or "last_affected" in event:
                        ranges.append([introduced or "0", event.get("fixed", ""), event.get("last_affected", "")])
                        introduced = None
                if introduced is not None:
                    ranges.append([introduced, "", ""])
            yield {
                "vuln_id": entry["id"],
                "ecosystem": ecosystem_of(package["ecosystem"]),
                "package": package["name"],
                "severity": osv_severity(entry, item),
                "ranges": ranges,
                "versions": list(item.get("versions") or []),
                "summary": entry.get("summary", "")[:2000],
            }


def parse_trivy(document: Any) -> Iterator[dict[str, Any]]:
    """Findings from a Trivy JSON report (`trivy image -f json`): Results[].Vulnerabilities[]."""
    if not isinstance(document, dict) or "Results" not in document:
        raise ValueError("not a Trivy JSON report: no Results")
    for result in document.get("Results") or []:
        kind = "pypi" if result.get("Type") in ("python-pkg", "pip", "pipenv", "poetry") else "deb"
        for vuln in result.get("Vulnerabilities") or []:
            yield {
                "vuln_id": vuln["VulnerabilityID"],
                "ecosystem": kind,
                "package": vuln["PkgName"],
                "version": vuln.get("InstalledVersion", ""),
                "fixed_version": vuln.get("FixedVersion", ""),
                "severity": SEVERITY_WORDS.get(str(vuln.get("Severity", "")).lower(), "unknown"),
            }


def load_json(raw: bytes | str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
