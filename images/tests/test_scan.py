"""The SBOM walk over layer streams (whiteouts, chunked downloads), version order, and OSV/Trivy parsing."""

import io
import tarfile

import pytest

from images import scan


def layer(files: dict[str, bytes], *, gz: bool = True) -> list[bytes]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    raw = buf.getvalue()
    return [raw[i : i + 4096] for i in range(0, len(raw), 4096)]  # as a download arrives


def test_later_layers_and_whiteouts_win_and_data_files_are_measured():
    status = (
        b"Package: libssl3\nStatus: install ok installed\nVersion: 3.0.11-1\n\n"
        b"Package: gone\nStatus: deinstall ok config-files\nVersion: 1\n\n"
        b"Package: never\nStatus: purge ok not-installed\nVersion: 2\n"
    )
    first = layer({
        "var/lib/dpkg/status": status,
        "usr/lib/python3/dist-packages/numpy-1.26.0.dist-info/METADATA": b"Name: numpy\nVersion: 1.26.0\n",
        "opt/old-0.1.dist-info/METADATA": b"Name: old\nVersion: 0.1\n",
        "models/w.safetensors": b"x" * 300_000,
    })  # fmt: skip
    second = layer({
        "usr/lib/python3/dist-packages/numpy-1.26.0.dist-info/METADATA": b"Name: numpy\nVersion: 2.1.0\n",
        "opt/.wh.old-0.1.dist-info": b"",
        "models/.wh..wh..opq": b"",
    }, gz=False)  # fmt: skip
    walk = scan.walk_layers([iter(first), iter(second)])
    assert walk.packages == [
        {"type": "pypi", "name": "numpy", "version": "2.1.0"},
        {"type": "deb", "name": "libssl3", "version": "3.0.11-1"},
    ]
    assert walk.data_files == []
    assert scan.walk_layers([iter(first)]).data_files == [("models/w.safetensors", 300_000)]


@pytest.mark.parametrize(
    "a, b, order",
    [
        ("1.2.3-1", "1.2.3-2", -1),
        ("1:1.0", "2.0", 1),
        ("1.0~rc1-1", "1.0-1", -1),
        ("3.0.11-1~deb12u2", "3.0.11-1", -1),
        ("2.36-9+deb12u4", "2.36-9+deb12u10", -1),
        ("1.0", "1.0", 0),
    ],
)
def test_debian_versions_order_as_dpkg_orders_them(a, b, order):
    assert scan.deb_compare(a, b) == order and scan.deb_compare(b, a) == -order


def test_osv_ranges_versions_and_severities():
    rows = list(scan.parse_osv({"vulns": [{
        "id": "X-1",
        "affected": [
            {"package": {"ecosystem": "PyPI", "name": "Pkg"},
             "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "1.0"}, {"fixed": "1.5"},
                                                          {"introduced": "2.0"}, {"last_affected": "2.2"}]}],
             "versions": ["0.9"]},
            {"package": {"ecosystem": "npm", "name": "left-pad"}, "ranges": [{"type": "GIT", "events": []}]},
        ],
        "severity": [{"type": "CVSS_V3", "score": "9.8"}],
    }]}))  # fmt: skip
    pypi = rows[0]
    assert pypi["ecosystem"] == "pypi" and pypi["severity"] == "critical" and len(rows) == 2
    hits = {v: scan.affected("pypi", v, pypi["ranges"], pypi["versions"]) for v in
            ["0.9", "0.95", "1.0", "1.4.9", "1.5", "2.0", "2.2", "2.2.1"]}  # fmt: skip
    assert hits == {"0.9": True, "0.95": False, "1.0": True, "1.4.9": True, "1.5": False, "2.0": True, "2.2": True,
                    "2.2.1": False}  # fmt: skip
    with pytest.raises(ValueError):
        list(scan.parse_osv([{"summary": "no id"}]))
    with pytest.raises(ValueError):
        list(scan.parse_trivy({"no": "Results"}))
