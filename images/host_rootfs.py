"""The catalog's offline base: a root filesystem assembled from this machine's own files, so a fresh install without
internet has one base image its registry really holds.

What goes in: Debian's Python 3 (`/usr/bin/python3` and its standard library, less tests, IDLE, Tk, 2to3, the
static library and byte-code caches), numpy from the platform's own environment when it was built for that same
interpreter (a cp3XX wheel: its `.so` suffix must match the interpreter's), `dash` as `/bin/sh` and a handful of
coreutils (what a RUN step of a project image needs), the shared libraries `ldd` names for every program and
extension module copied, `/etc/passwd` / `/etc/group`, and a `var/lib/dpkg/status` naming the Debian packages (with
this machine's versions) that own the copied files, so the SBOM and the scan see what the image really holds.

`plan()` is cheap (one `ldd` for every ELF file at once, stats): it names every file and a key over the recipe and
each file's path, size and modification time, so a second start with the same inputs finds the image the first one
pushed instead of building it again. `assemble()` copies the files into a build context.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

RECIPE_VERSION = "1"  # bump when what goes into the rootfs changes in a way the file list does not show
PYTHON = Path("/usr/bin/python3")
SHELL = Path("/bin/dash")
COREUTILS = ("cat", "chmod", "cp", "env", "head", "id", "ln", "ls", "mkdir", "mv", "rm", "sleep", "tail", "touch")
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__pycache__", "EXTERNALLY-MANAGED"}
NUMPY_SKIP = {"tests", "__pycache__"}
SYSTEM_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")
DPKG_STATUS = Path("/var/lib/dpkg/status")
DPKG_INFO = Path("/var/lib/dpkg/info")
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"
CONTAINERFILE = (
    "# Assembled by the platform from this machine's Debian Python, numpy and a shell: no network needed.\n"
    "FROM scratch\n"
    "COPY rootfs/ /\n"
    "ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1\n"
    'CMD ["python3"]\n'
)


class RootfsUnavailable(Exception):
    """This machine lacks what the offline base is made of; the message names what to install."""


@dataclass
class Plan:
    files: dict[str, Path] = field(default_factory=dict)  # path inside the rootfs -> file on this machine
    links: dict[str, str] = field(default_factory=dict)  # path inside the rootfs -> symlink target
    python_version: str = ""
    numpy_version: str = ""  # "" when the platform's numpy does not fit the interpreter
    key: str = ""

    @property
    def size_bytes(self) -> int:
        return sum(source.stat().st_size for source in self.files.values())


def _inside(path: Path) -> str:
    """Where a file of this machine goes in the rootfs: its folder with links resolved (so /lib/x86_64-linux-gnu/
    and /usr/lib/x86_64-linux-gnu/ of a merged-/usr system meet), its own name kept (a soname is often a link)."""
    return str(Path(os.path.realpath(path.parent)) / path.name).lstrip("/")


def _interpreter_facts(python: Path) -> dict:
    probe = (
        "import json, sys, sysconfig; print(json.dumps({'stdlib': sysconfig.get_paths()['stdlib'], "
        "'ext': sysconfig.get_config_var('EXT_SUFFIX'), 'version': '%d.%d.%d' % sys.version_info[:3], "
        "'short': '%d.%d' % sys.version_info[:2]}))"
    )
    out = subprocess.run([str(python), "-E", "-s", "-c", probe], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RootfsUnavailable(f"{python} does not run: {out.stderr.strip()[-200:]}")
    return json.loads(out.stdout)


def _tree(top: Path, skip: set[str]) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.startswith("config-"))
        found += [Path(dirpath) / n for n in sorted(filenames) if n not in skip]
    return found


def _is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(4) == b"\x7fELF"
    except OSError:
        return False


def _libraries(elves: list[Path]) -> set[Path]:
    """The system libraries (and the loader) the given programs and extension modules load, from one `ldd` call."""
    if not elves:
        return set()
    out = subprocess.run(["ldd", *map(str, elves)], capture_output=True, text=True, timeout=120).stdout
    libs: set[Path] = set()
    for line in out.splitlines():
        for word in line.split():
            if word.startswith("/") and not word.endswith(":") and word.startswith(SYSTEM_DIRS):
                libs.add(Path(word))
    return libs


def _numpy(ext_suffix: str) -> tuple[list[Path], Path | None, str]:
    """numpy of the platform's environment (its package, bundled libraries and dist-info), if it fits."""
    try:
        import numpy
    except ImportError:
        return [], None, ""
    package = Path(numpy.__file__).parent
    site = package.parent
    if not any(p.name.endswith(ext_suffix) for p in package.rglob("*.so")):
        return [], None, ""  # built for another Python than the image's
    dist = sorted(site.glob(f"numpy-{numpy.__version__}.dist-info"))
    files = _tree(package, NUMPY_SKIP) + [f for d in dist for f in _tree(d, set())]
    if (site / "numpy.libs").is_dir():
        files += _tree(site / "numpy.libs", set())
    return files, site, numpy.__version__


def plan() -> Plan:
    """Every file of the offline base and the key of its inputs; RootfsUnavailable names what is missing."""
    if not PYTHON.exists():
        raise RootfsUnavailable(f"the offline base image is made of Debian's Python: {PYTHON} is missing "
                                "(apt-get install python3)")  # fmt: skip
    if shutil.which("ldd") is None or not SHELL.exists():
        raise RootfsUnavailable("the offline base image needs ldd and dash (Debian's libc-bin and dash)")
    facts = _interpreter_facts(PYTHON)
    result = Plan(python_version=facts["version"])
    python = PYTHON.resolve()
    result.files[f"usr/bin/{python.name}"] = python
    result.links["usr/bin/python3"] = python.name
    result.links["usr/bin/python"] = python.name
    result.files["usr/bin/dash"] = SHELL.resolve()
    result.links["usr/bin/sh"] = "dash"
    for tool in COREUTILS:
        found = shutil.which(tool, path="/usr/bin:/bin")
        if found:
            result.files[f"usr/bin/{tool}"] = Path(found).resolve()
    stdlib = Path(facts["stdlib"])
    for path in _tree(stdlib, STDLIB_SKIP):
        if path.exists():  # a dangling link (Debian links sitecustomize.py into /etc) is left out
            result.files[_inside(path)] = path.resolve()
    numpy_files, site, result.numpy_version = _numpy(facts["ext"])
    target = Path(f"usr/local/lib/python{facts['short']}/dist-packages")
    for path in numpy_files:
        result.files[str(target / path.relative_to(site))] = path.resolve()
    elves = [p for p in result.files.values() if p.suffix == ".so" or p.parent.name == "bin" or ".so." in p.name]
    for lib in _libraries([p for p in elves if _is_elf(p)]):
        result.files.setdefault(_inside(lib), lib.resolve())
    digest = hashlib.sha256(f"{RECIPE_VERSION}\n{CONTAINERFILE}\n".encode())
    for inside, source in sorted(result.files.items()):
        stat = source.stat()
        digest.update(f"{inside}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    for inside, link in sorted(result.links.items()):
        digest.update(f"{inside}\0->{link}\n".encode())
    result.key = digest.hexdigest()
    return result


def _owners(paths: set[str]) -> set[str]:
    """The Debian packages (as dpkg's status names them) that own the given rootfs paths."""
    owners: set[str] = set()
    resolved: dict[str, str] = {}
    for listing in DPKG_INFO.glob("*.list"):
        package = listing.name[: -len(".list")]
        try:
            lines = listing.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            head, _, name = line.rpartition("/")
            if not head or not name:
                continue
            if head not in resolved:
                resolved[head] = os.path.realpath(head).lstrip("/")
            if f"{resolved[head]}/{name}" in paths:
                owners.add(package.split(":", 1)[0])
                break
    return owners


def _status(owners: set[str]) -> str:
    """The stanzas of dpkg's status for `owners`, reduced to what identifies a package and its version."""
    if not DPKG_STATUS.exists():
        return ""
    keep = ("Package", "Status", "Architecture", "Source", "Version")
    stanzas = []
    for stanza in DPKG_STATUS.read_text(errors="replace").split("\n\n"):
        fields = {}
        for line in stanza.splitlines():
            name, sep, value = line.partition(":")
            if sep and not line.startswith((" ", "\t")) and name in keep:
                fields[name] = value.strip()
        if fields.get("Package") in owners and fields.get("Status", "").endswith(" installed"):
            stanzas.append("".join(f"{k}: {fields[k]}\n" for k in keep if k in fields))
    return "\n".join(sorted(stanzas))


def assemble(layout: Plan, rootfs: Path) -> None:
    """Copy the planned files into `rootfs` (a fresh folder in a build context), with the links, the few /etc files
    and the dpkg status of the packages they came from."""
    rootfs.mkdir(parents=True, exist_ok=False)
    for inside, source in sorted(layout.files.items()):
        target = rootfs / inside
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    for inside, link in sorted(layout.links.items()):
        (rootfs / inside).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(link, rootfs / inside)
    for name in ("bin", "sbin", "lib", "lib64"):  # a merged /usr, as Debian's own
        if (rootfs / "usr" / name).is_dir() and not (rootfs / name).exists():
            os.symlink(f"usr/{name}", rootfs / name)
    (rootfs / "etc").mkdir(exist_ok=True)
    (rootfs / "etc/passwd").write_text(PASSWD)
    (rootfs / "etc/group").write_text(GROUP)
    for folder, mode in (("tmp", 0o1777), ("root", 0o700), ("var/tmp", 0o1777), ("workspace", 0o755)):
        (rootfs / folder).mkdir(parents=True, exist_ok=True)
        (rootfs / folder).chmod(mode)
    status = rootfs / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text(_status(_owners(set(layout.files))))


if __name__ == "__main__":  # a look at what the base would hold: python -m images.host_rootfs
    try:
        made = plan()
    except RootfsUnavailable as exc:
        sys.exit(str(exc))
    print(f"python {made.python_version}, numpy {made.numpy_version or '-'}: {len(made.files)} files, "
          f"{made.size_bytes / 2**20:.1f} MiB, key {made.key[:16]}")  # fmt: skip
