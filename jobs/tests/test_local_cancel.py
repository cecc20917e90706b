"""The local backend's cancel when the supervisor's pid no longer names a process of ours."""

from __future__ import annotations

import os

from jobs.backends import local


def test_a_cancel_whose_supervisor_pid_was_reused_by_another_user_does_not_raise(tmp_path, monkeypatch):
    backend = local.LocalBackend(root=tmp_path / "work", state_root=tmp_path / "state")
    folder = tmp_path / "state" / "job-1" / "attempt-1"
    folder.mkdir(parents=True)
    (folder / "runner.pid").write_text("4242")
    monkeypatch.setattr(backend, "_runner_alive", lambda _folder: True)
    sent = []

    def kill(pid, sig):
        sent.append((pid, sig))
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", kill)
    backend.cancel("local:job-1:1", grace_s=1.0, reason="cancelled_by_user")
    assert sent and sent[0][0] == 4242
    assert (folder / "cancel").read_text() == "cancelled_by_user"
