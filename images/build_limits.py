"""The CPU, memory, process and time bounds of a local image build's step (`podman build` and everything it starts).

A build's RUN steps are a team's code, like a job's command, and get the same treatment (kernel/limits.py): the
step's whole process tree goes into a control group of its own before podman starts (`build-<id>`, beside the
attempts' ones), with TRAINYARD_BUILD_MEMORY_MIB as its memory (swap included), TRAINYARD_BUILD_CPU_MILLI as a
CPU quota and TRAINYARD_BUILD_PIDS_MAX processes. Rootless podman on cgroup v1 cannot make or limit groups itself
(no delegation to an unprivileged user), so its `--memory`/`--cpus` flags would not hold; a group the platform
makes around the whole tree does, whatever podman does inside it.

The step also has a wall-clock limit (TRAINYARD_BUILD_TIMEOUT_S): past it every process of the group is killed,
not only the first one, so nothing of a stuck build lingers. When no group can be made (not root, no delegation)
the step is bounded in time only, by its process group, and the build's log says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass

from django.conf import settings

from kernel import limits
from kernel.host import platform_scope


@dataclass
class Bounded:
    """What a bounded step ended with: its exit status and output, and which bound stopped it ("" for none)."""

    returncode: int
    output: str
    stopped_by: str  # "", "time", "memory"
    reason: str  # one line for the build's log when a bound stopped it
    held: str  # what held the step (`limits: ...`)


def _plan() -> dict | None:
    setting = str(settings.TRAINYARD_BUILD_LIMITS)
    if setting == "off":
        return None
    plan = limits.plan(
        memory_mib=settings.TRAINYARD_BUILD_MEMORY_MIB,
        cpu_milli=settings.TRAINYARD_BUILD_CPU_MILLI,
        pids_max=settings.TRAINYARD_BUILD_PIDS_MAX,
        setting=setting,
        v2_parent_setting=settings.TRAINYARD_CGROUP_PARENT,
        scope=platform_scope(),
    )
    if plan is None or plan["mode"] == "rlimit":
        return None  # per-process rlimits would break podman itself (a Go program's address space), not bound it
    return plan


class BuildStep:
    """Start `argv` in the build's group (`start()`), then `wait()` for it within the time limit."""

    def __init__(self, argv: list[str], *, build_id: int):
        self.argv = argv
        self.build_id = build_id
        plan = _plan()
        self.limits = limits.AttemptLimits(plan, name=f"build-{build_id}") if plan else None
        self.proc: subprocess.Popen | None = None

    def start(self) -> subprocess.Popen:
        if self.limits is not None:
            self.limits.apply()
            if self.limits.mode == "rlimit":  # the group could not be made after all: time only
                self.limits = None
        group = self.limits

        def enter() -> None:
            if group is not None:
                group.join()

        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                start_new_session=True,
                preexec_fn=enter,
            )
        except OSError:
            if group is not None:
                group.remove()
            raise
        return self.proc

    def held(self) -> str:
        if self.limits is None:
            return "limits: time only (no control group can be made here; memory and CPU not bounded)"
        return self.limits.describe()

    def _kill_tree(self, *, group_too: bool) -> None:
        """Kill the step's control group; `group_too` also its process group (only while its leader is unreaped,
        so the id cannot belong to anyone else yet)."""
        assert self.proc is not None
        if self.limits is not None:
            self.limits.kill_all()
        if group_too:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout_s: float) -> Bounded:
        assert self.proc is not None
        stopped_by = reason = ""
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill_tree(group_too=True)
            out, _ = self.proc.communicate()
            stopped_by = "time"
            reason = f"the build ran past its time limit of {timeout_s:g} s (TRAINYARD_BUILD_TIMEOUT_S) and was stopped"
        held = self.held()
        if self.limits is not None:
            self._kill_tree(group_too=False)  # whatever a RUN step left running ends with the build
            seen = self.limits.outcome()
            self.limits.remove()
            if not stopped_by and seen.get("oom_kills"):
                stopped_by = "memory"
                peak = seen.get("memory_peak_bytes")
                reason = (
                    f"the build ran out of memory: killed at its limit of {settings.TRAINYARD_BUILD_MEMORY_MIB} MiB "
                    "(TRAINYARD_BUILD_MEMORY_MIB)" + (f", peak {peak >> 20} MiB" if peak else "")
                )
        returncode = self.proc.returncode if not stopped_by or self.proc.returncode else 137
        return Bounded(returncode=returncode, output=out or "", stopped_by=stopped_by, reason=reason, held=held)


def run(argv: list[str], *, build_id: int, timeout_s: float) -> Bounded:
    step = BuildStep(argv, build_id=build_id)
    step.start()
    return step.wait(timeout_s)
