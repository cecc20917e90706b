"""A folder that is not a git work tree packs what git would keep of it: its `.gitignore` files are read by the CLI
in git's own syntax (globs, `dir/`, `!`, anchored `/x`, `**`, nested files), checked against git itself on a copy
of the same folder; `.trainyardignore` (same syntax) leaves out more in both cases."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from trainyard_cli.code import files_of, pack

GITIGNORE = """\
# outputs
*.log
!keep.log
/build
dist/
**/cache/**
docs/**/*.tmp
checkpoints/
!checkpoints/
data/*
!data/README.md
/anchored.txt
spaced\\ name
\\#hash.txt
file[0-9].bin
**/deep_only
"""

FILES = [
    "train.py",
    "pkg/__init__.py",
    "pkg/model.py",
    "pkg/run.log",
    "keep.log",
    "pkg/keep.log",
    "build/out.o",
    "src/build/kept.py",  # `/build` is anchored at the top
    "dist/wheel.whl",
    "pkg/dist/also.whl",  # `dist/` matches at any depth
    "a/cache/x.bin",
    "cache/y.bin",
    "docs/a/b/note.tmp",
    "docs/note.tmp",
    "docs/guide.md",
    "data/big.bin",
    "data/README.md",
    "anchored.txt",
    "sub/anchored.txt",
    "spaced name",
    "#hash.txt",
    "file1.bin",
    "fileA.bin",
    "x/y/deep_only",
    "checkpoints/step1.pt",
    "nested/.gitignore",
    "nested/secret.key",
    "nested/public.key",
    "nested/inner/secret.key",
    "config.json",
]


def _folder(root):
    for rel in FILES:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)
    (root / ".gitignore").write_text(GITIGNORE)
    (root / "nested" / ".gitignore").write_text("*.key\n!public.key\n")
    return root


def _git_keeps(folder) -> list[str]:
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    listed = subprocess.run(
        ["git", "-C", str(folder), "ls-files", "-z", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(folder), "GIT_CONFIG_NOSYSTEM": "1"},
    )
    return sorted(p for p in listed.stdout.decode().split("\0") if p)


def test_a_folder_outside_git_sends_exactly_what_git_would_keep(tmp_path):
    plain = _folder(tmp_path / "plain")
    names = files_of(plain)
    assert not (plain / ".git").exists()
    as_git = shutil.copytree(plain, tmp_path / "repo")
    assert names == _git_keeps(as_git)
    # What that means, spelled out for the cases that differ between the simple readings of the syntax:
    kept = ["train.py", "keep.log", "pkg/keep.log", "src/build/kept.py", "data/README.md", "docs/guide.md"]
    kept += ["sub/anchored.txt", "fileA.bin", "nested/public.key", "checkpoints/step1.pt", "config.json"]
    left = ["pkg/run.log", "build/out.o", "dist/wheel.whl", "pkg/dist/also.whl", "a/cache/x.bin", "cache/y.bin"]
    left += ["docs/a/b/note.tmp", "docs/note.tmp", "data/big.bin", "anchored.txt", "spaced name", "file1.bin"]
    left += ["#hash.txt", "x/y/deep_only", "nested/secret.key", "nested/inner/secret.key"]
    assert [n for n in kept if n not in names] == [] and [n for n in left if n in names] == []


def test_trainyardignore_leaves_out_more_in_the_same_syntax_with_or_without_git(tmp_path):
    plain = _folder(tmp_path / "plain")
    (plain / ".trainyardignore").write_text("# not for the job\n/pkg/*.py\n!pkg/__init__.py\ndocs/\n")
    as_git = shutil.copytree(plain, tmp_path / "repo")
    subprocess.run(["git", "init", "-q", str(as_git)], check=True)
    for folder in (plain, as_git):
        names = files_of(folder)
        assert "pkg/__init__.py" in names and "train.py" in names, folder
        assert "pkg/model.py" not in names and not any(n.startswith("docs/") for n in names), folder
        assert "pkg/run.log" not in names  # .gitignore still holds
    assert files_of(plain) == files_of(as_git)
    assert pack(plain)[1] == pack(plain)[1]


@pytest.mark.parametrize(
    ("pattern", "path", "ignored"),
    [
        ("*.py", "a/b/c.py", True),
        ("a/*.py", "a/b/c.py", False),  # a `*` never crosses a `/`
        ("a/**/c.py", "a/c.py", True),
        ("a/**/c.py", "a/x/y/c.py", True),
        ("/c.py", "a/c.py", False),
        ("c?.py", "cd.py", True),
        ("c?.py", "c/.py", False),
        ("[!a]b", "cb", True),
        ("[!a]b", "ab", False),
        ("out/", "out", False),  # a file named like a folder pattern stays
    ],
)
def test_each_rule_matches_as_git_does(tmp_path, pattern, path, ignored):
    plain = tmp_path / "plain"
    (plain / path).parent.mkdir(parents=True, exist_ok=True)
    (plain / path).write_text("x")
    (plain / "keep.txt").write_text("x")
    (plain / ".gitignore").write_text(pattern + "\n")
    assert (path not in files_of(plain)) is ignored
    assert files_of(plain) == _git_keeps(shutil.copytree(plain, tmp_path / "repo"))
