"""A simulated Volcano installation for the fake API server, plus the scheduler and kubelet parts tests need.

It plays, in one deterministic `tick()`:

- the Volcano admission webhooks (job defaults and validation, queue validation);
- the bus Command consumer (AbortJob, ResumeJob, RestartJob, TerminateJob, CompleteJob, OpenQueue,
  CloseQueue);
- the queue controller (new queues become Open; Closing becomes Closed once empty; status counts);
- the job controller: PodGroup `<job>-<uid>`, pods `<job>-<task>-<index>` with Volcano's labels and
  annotations, lifecycle policies, and the job phases Pending, Running, Restarting, Aborting, Aborted,
  Completing, Completed, Terminating, Terminated, Failed;
- the scheduler: enqueue gated by queue state, queue `capability` and cluster overcommit (PodGroup stays
  Pending with an `Unschedulable` condition and the real events), then gang allocation of pods to nodes
  (resources, nodeSelector, required node affinity, taints, cordons); pods of `default-scheduler` are
  placed one by one; pods naming any other scheduler stay Pending, as they would with no such scheduler;
- the svc plugin's headless Service, ConfigMap and NetworkPolicy (none with `--disable-network-policy`);
- Volcano's preemption (`preempt_pod`: an `Evict` event and a graceful delete), and its vGPU card choice
  (`volcano.sh/vgpu-ids-new`, ignoring the requested UUIDs as released versions do);
- the kubelet: containers start, write their scripted logs, and end with the scripted outcome; graceful
  deletions complete on the next tick.

What a real control plane does here (`make cluster`: lost and deleted nodes, batch/v1 Jobs, claims) is tested
there (tests/k8s), not simulated. Tests decide what each pod does with `script()`, and break things with
`fail_pod()`. Call `tick()` (or `run_until()`).
"""

from __future__ import annotations

import copy
import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from .server import (
    ApiError,
    ResourceType,
    WatchEvent,
    format_quantity,
    label_value_problems,
    name_problems,
    parse_time,
    pod_spec_causes,
    quantity_value,
    resource_list,
    rfc3339,
)

if TYPE_CHECKING:
    from .server import FakeKubernetes

JSON = dict[str, Any]
Resources = dict[str, Fraction]

JOB = "jobs.batch.volcano.sh"
PODGROUP = "podgroups.scheduling.volcano.sh"
QUEUE = "queues.scheduling.volcano.sh"
COMMAND = "commands.bus.volcano.sh"

JOB_NAME = "volcano.sh/job-name"
JOB_NAMESPACE = "volcano.sh/job-namespace"
QUEUE_NAME = "volcano.sh/queue-name"
TASK_SPEC = "volcano.sh/task-spec"
TASK_INDEX = "volcano.sh/task-index"
JOB_VERSION = "volcano.sh/job-version"
JOB_RETRY_COUNT = "volcano.sh/job-retry-count"
TEMPLATE_UID = "volcano.sh/template-uid"
GROUP_NAME = "scheduling.k8s.io/group-name"

SCHEDULER = "volcano"
# Volcano's vGPU device sharing: pod resources, the node's card registry, the scheduler's choice on the pod.
VGPU_NUMBER, VGPU_MEMORY, VGPU_CORES = "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores"
VGPU_REGISTER = "volcano.sh/node-vgpu-register"
VGPU_ASSIGNED = "volcano.sh/vgpu-ids-new"
CONTROLLER_COMPONENT = "vc-controller-manager"
FINISHED_PHASES = frozenset({"Completed", "Failed", "Terminated"})
USER_POLICY_EVENTS = frozenset(
    {"*", "PodFailed", "PodEvicted", "PodPending", "Unknown", "TaskCompleted", "TaskFailed", "JobUpdated"}
)
USER_POLICY_ACTIONS = frozenset(
    {
        "AbortJob",
        "RestartJob",
        "RestartTask",
        "RestartPod",
        "RestartPartition",
        "TerminateJob",
        "CompleteJob",
        "ResumeJob",
    }
)
KNOWN_PLUGINS = frozenset({"ssh", "env", "svc", "tensorflow", "mpi", "pytorch", "hcclrank", "ray"})
# Pod-level failure reasons; anything else in a script is the container's terminated reason.
POD_LEVEL_REASONS = frozenset(
    {
        "Evicted",
        "NodeLost",
        "DeadlineExceeded",
        "Shutdown",
        "Terminated",  # graceful node shutdown
        "UnexpectedAdmissionError",
        "OutOfcpu",
        "OutOfmemory",
        "Preempting",
    }
)
OVERCOMMIT_FACTOR = Fraction(12, 10)


# --- scripts --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodScript:
    """What a pod's containers do once started.

    `exit_code`/`reason`/`message` describe how the main (first) container ends; other containers end with 0.
    `reason` is either a container reason (`OOMKilled`, `Error`, `ContainerCannotRun`, ...) or a pod-level one
    (`Evicted`, `DeadlineExceeded`, ...). `logs` is the main container's output, written progressively over
    `run_ticks` ticks. `run_ticks=None` runs until something stops it.
    """

    exit_code: int = 0
    reason: str | None = None
    message: str | None = None
    logs: str | Sequence[str] = ""
    run_ticks: int | None = 1
    start_ticks: int = 0

    def log_lines(self, container: str, main: str) -> list[str]:
        if container != main:
            return []
        text = self.logs
        return text.splitlines() if isinstance(text, str) else [str(line) for line in text]


@dataclass
class ScriptRule:
    """A PodScript and the pods it applies to (latest matching rule wins; `times` bounds its use)."""

    script: PodScript
    job: str | None = None
    labels: Mapping[str, str] | None = None
    predicate: Callable[[JSON], bool] | None = None
    task: str | None = None
    index: int | None = None
    namespace: str | None = None
    times: int | None = None
    used: int = 0

    def matches(self, pod: JSON) -> bool:
        if self.times is not None and self.used >= self.times:
            return False
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        if self.job is not None and not str(labels.get(JOB_NAME, meta["name"])).startswith(self.job):
            return False
        if self.labels is not None and any(labels.get(k) != v for k, v in self.labels.items()):
            return False
        if self.task is not None and labels.get(TASK_SPEC) != self.task:
            return False
        if self.index is not None and labels.get(TASK_INDEX) != str(self.index):
            return False
        return self.predicate is None or self.predicate(pod)


@dataclass
class _PodRun:
    script: PodScript
    stage: str = "creating"  # creating | waiting | running | done
    ticks: int = 0
    pending_logs: dict[str, list[str]] = field(default_factory=dict)
    restarts: int = 0
    started_at: str = ""


@dataclass(frozen=True)
class _BusEvent:
    kind: str  # PodFailed | PodEvicted | TaskCompleted
    task: str
    pod: str = ""
    exit_code: int = 0


# --- the controller -------------------------------------------------------------------------------


class VolcanoController:
    """Volcano's controllers and scheduler, plus a kube-scheduler and kubelet, simulated in ticks."""

    def __init__(self, kube: FakeKubernetes, *, seed_queues: bool = True) -> None:
        self.kube = kube
        self.ticks = 0
        self._rules: list[ScriptRule] = []
        self._runs: dict[str, _PodRun] = {}
        self._seen_pods: dict[str, dict[str, tuple[str, str, bool]]] = {}
        self._killed: set[str] = set()
        self._completed_tasks: set[tuple[str, str, int]] = set()
        self._partial_restart: set[str] = set()  # jobs restarting only some pods (RestartTask/RestartPod)
        kube.add_admission(VolcanoAdmission(kube))
        kube.add_listener(self._on_change)
        kube.graceful_pod_deletion = True
        if seed_queues:
            for name in ("root", "default"):
                kube.create(
                    QUEUE,
                    {
                        "apiVersion": "scheduling.volcano.sh/v1beta1",
                        "kind": "Queue",
                        "metadata": {"name": name},
                        "spec": {"reclaimable": True, "weight": 1},
                    },
                )

    # -- public API --------------------------------------------------------------------------------

    def script(
        self,
        match: str | Mapping[str, str] | Callable[[JSON], bool] | None = None,
        /,
        *,
        task: str | None = None,
        index: int | None = None,
        namespace: str | None = None,
        times: int | None = None,
        exit_code: int = 0,
        reason: str | None = None,
        message: str | None = None,
        logs: str | Sequence[str] = "",
        run_ticks: int | None = 1,
        start_ticks: int = 0,
    ) -> ScriptRule:
        """Script the pods that start from now on.

        `match` selects pods: a string is a prefix of the Volcano job name (label `volcano.sh/job-name`, or
        the pod name for pods outside a vcjob), a mapping is a set of label equalities, a callable is a
        predicate on the pod. `task`/`index`/`namespace` narrow it further; `times` limits how many pods the
        rule scripts (e.g. only the first attempt fails). The latest matching rule wins.
        """
        rule = ScriptRule(
            PodScript(
                exit_code,
                reason,
                message,
                logs,
                run_ticks,
                start_ticks,
            ),
            job=match if isinstance(match, str) else None,
            labels=match if isinstance(match, Mapping) else None,
            predicate=match if callable(match) else None,
            task=task,
            index=index,
            namespace=namespace,
            times=times,
        )
        with self.kube.lock:
            self._rules.append(rule)
        return rule

    def tick(self, count: int = 1) -> None:
        """Advance the simulated cluster by `count` steps."""
        for _ in range(count):
            with self.kube.lock:
                self.ticks += 1
                self._process_commands()
                self._sync_queues()
                for job in sorted(self.kube.list(JOB), key=self.kube.creation_order):
                    self._sync_job(job)
                self._schedule()
                self._run_kubelet()
                self._sync_queues()

    def run_until(self, done: Callable[[], bool], *, max_ticks: int = 100) -> int:
        """Tick until `done()` holds; return the ticks used. Raises AssertionError after `max_ticks`."""
        for used in range(max_ticks + 1):
            if done():
                return used
            self.tick()
        raise AssertionError(f"condition not reached within {max_ticks} ticks")

    def wait_for_job_phase(
        self, namespace: str, name: str, phases: str | Iterable[str], *, max_ticks: int = 100
    ) -> JSON:
        """Tick until the vcjob's `status.state.phase` is one of `phases`; return the job."""
        wanted = {phases} if isinstance(phases, str) else set(phases)
        self.run_until(lambda: self.job_phase(namespace, name) in wanted, max_ticks=max_ticks)
        return self.kube.get(JOB, name, namespace)

    def job_phase(self, namespace: str, name: str) -> str | None:
        job = self.kube.try_get(JOB, name, namespace)
        if job is None:
            return None
        return ((job.get("status") or {}).get("state") or {}).get("phase", "")

    def job_pods(self, namespace: str, job: str) -> list[JSON]:
        return self.kube.list("pods", namespace, label_selector=f"{JOB_NAME}={job}")

    # -- faults ------------------------------------------------------------------------------------

    def fail_pod(
        self,
        namespace: str,
        name: str,
        *,
        exit_code: int = 1,
        reason: str | None = None,
        message: str | None = None,
    ) -> JSON:
        """End a pod's main container now with `exit_code` (and a container or pod-level `reason`)."""
        with self.kube.lock:
            pod = self.kube.get("pods", name, namespace)
            pod_reason = reason if reason in POD_LEVEL_REASONS else None
            container_reason = None if pod_reason else reason
            return self._terminate_pod(
                pod,
                exit_code=exit_code,
                container_reason=container_reason,
                pod_reason=pod_reason,
                message=message,
            )

    def preempt_pod(self, namespace: str, name: str, *, action: str = "preempt") -> JSON:
        """Volcano's scheduler evicts a pod to make room (`preempt` or `reclaim`): a DisruptionTarget condition,
        an `Evict` event on the pod, and a graceful delete. The job controller sees the pod go (PodEvicted)."""
        with self.kube.lock:
            pod = self.kube.get("pods", name, namespace)
            now = rfc3339(self.kube.now())
            message = f"Pod is evicted, because of {action}"

            def disrupted(p: JSON) -> None:
                _set_condition(p["status"], "DisruptionTarget", "True", now, "PreemptionByScheduler", message)

            self.kube.mutate("pods", name, namespace, disrupted, subresource="status")
            self._event(pod, "Evict", message, "Warning", SCHEDULER)
            self.kube.delete("pods", name, namespace)
            return self.kube.get("pods", name, namespace) if self.kube.try_get("pods", name, namespace) else pod

    def set_queue_state(self, name: str, state: str) -> JSON:
        """Set a queue's `status.state` (Open, Closed, ...) as its controller would."""
        with self.kube.lock:
            return self.kube.mutate(
                QUEUE,
                name,
                None,
                # `allocated` is a required status field in older releases (1.9).
                lambda q: q.setdefault("status", {}).update(
                    state=state, allocated=q["status"].get("allocated") or {"cpu": "0", "memory": "0"}
                ),
                subresource="status",
            )

    # -- reactions between ticks -------------------------------------------------------------------

    def _on_change(self, event: WatchEvent) -> None:
        # The queue controller opens a new queue as soon as it sees it (milliseconds in a real cluster).
        new_queue = event.type == "ADDED" and event.key == ("scheduling.volcano.sh", "queues")
        if new_queue and not (event.obj.get("status") or {}).get("state"):
            self.set_queue_state(event.obj["metadata"]["name"], "Open")

    # -- commands ----------------------------------------------------------------------------------

    def _process_commands(self) -> None:
        for command in self.kube.list(COMMAND):
            meta = command["metadata"]
            target = command.get("target") or {}
            action = str(command.get("action", ""))
            if target.get("kind") == "Job":
                job = self.kube.try_get(JOB, target.get("name", ""), meta.get("namespace"))
                if job is not None and (not target.get("uid") or target["uid"] == job["metadata"]["uid"]):
                    self._event(job, "CommandIssued", f"Start to execute action {action} ", "Normal")
                    self._execute(job, action)
            elif target.get("kind") == "Queue" and action in ("OpenQueue", "CloseQueue"):
                queue = self.kube.try_get(QUEUE, target.get("name", ""))
                if queue is not None:
                    if action == "OpenQueue":
                        self.set_queue_state(queue["metadata"]["name"], "Open")
                    else:
                        busy = self._queue_podgroups(queue["metadata"]["name"])
                        self.set_queue_state(queue["metadata"]["name"], "Closing" if busy else "Closed")
            self.kube.delete(COMMAND, meta["name"], meta.get("namespace"))

    # -- queues ------------------------------------------------------------------------------------

    def _queue_podgroups(self, queue: str) -> list[JSON]:
        return [
            pg
            for pg in self.kube.list(PODGROUP)
            if (pg.get("spec") or {}).get("queue", "default") == queue
            and (pg.get("status") or {}).get("phase") != "Completed"
        ]

    def _sync_queues(self) -> None:
        podgroups = self.kube.list(PODGROUP)
        pods = self.kube.list("pods")
        for queue in self.kube.list(QUEUE):
            name = queue["metadata"]["name"]
            mine = [pg for pg in podgroups if (pg.get("spec") or {}).get("queue", "default") == name]
            counts: dict[str, int] = defaultdict(int)
            for pg in mine:
                counts[((pg.get("status") or {}).get("phase") or "Pending").lower()] += 1
            allocated = _sum(_pod_request(pod) for pod in pods if self._counts_against_queue(pod, mine))
            state = (queue.get("status") or {}).get("state") or "Open"
            if state == "Closing" and not [pg for pg in mine if (pg.get("status") or {}).get("phase") != "Completed"]:
                state = "Closed"
            status = {
                "state": state,
                "allocated": {
                    k: format_quantity(v)
                    for k, v in sorted({"cpu": Fraction(0), "memory": Fraction(0), **allocated}.items())
                    if k != "pods"
                },
                **{
                    key: counts[key] for key in ("pending", "inqueue", "running", "unknown", "completed") if counts[key]
                },
                "reservation": {},
            }

            def apply(q: JSON, status: JSON = status) -> None:
                q["status"] = status

            self.kube.mutate(QUEUE, name, None, apply, subresource="status")

    def _counts_against_queue(self, pod: JSON, podgroups: list[JSON]) -> bool:
        group = (pod["metadata"].get("annotations") or {}).get(GROUP_NAME)
        if not group or not (pod.get("spec") or {}).get("nodeName"):
            return False
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return False
        return any(
            pg["metadata"]["name"] == group and pg["metadata"].get("namespace") == pod["metadata"].get("namespace")
            for pg in podgroups
        )

    # -- the job controller ------------------------------------------------------------------------

    def _sync_job(self, job: JSON) -> None:
        meta = job["metadata"]
        if meta.get("deletionTimestamp"):
            return
        phase = _phase(job)
        if not phase:
            self._ensure_podgroup(job)
            self._ensure_plugin_objects(job)
            self._write_status(job, "Pending", reason="", message="")
            return
        if phase in FINISHED_PHASES and self._expired(job):
            self.kube.delete(JOB, meta["name"], meta["namespace"])  # Volcano's garbage collector
            return
        if phase not in FINISHED_PHASES and phase != "Aborted":
            self._ensure_podgroup(job)
        acted = False
        for event in self._observe(job):
            job = self.kube.get(JOB, meta["name"], meta["namespace"])
            action = _policy_action(job, event)
            if action != "SyncJob":
                self._execute(job, action, event)
                acted = True
        # After an action the follow-up sync waits for the next tick, so each phase it passes is observable.
        if not acted:
            self._execute(self.kube.get(JOB, meta["name"], meta["namespace"]), "SyncJob")

    def _expired(self, job: JSON) -> bool:
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        finished = ((job.get("status") or {}).get("state") or {}).get("lastTransitionTime")
        if ttl is None or not finished:
            return False
        return self.kube.now() >= parse_time(finished) + timedelta(seconds=_int(ttl))

    def _execute(self, job: JSON, action: str, event: _BusEvent | None = None) -> None:
        """Run `action` in the job's current state, following Volcano's state machine."""
        phase = _phase(job) or "Pending"
        if action != "SyncJob":
            self._event(job, "ExecuteAction", f"Start to execute action {action} ", "Normal")
        if phase in ("Pending", "Running"):
            if action == "RestartJob":
                self._kill(job, retain=False)
                self._write_status(job, "Restarting", retry=1, version=1)
            elif action in ("RestartTask", "RestartPod", "RestartPartition") and event is not None:
                if action == "RestartPod":
                    targets = {event.pod}
                else:
                    targets = {
                        p["metadata"]["name"]
                        for p in self._pods(job)
                        if (p["metadata"].get("labels") or {}).get(TASK_SPEC) == event.task
                    }
                self._kill(job, retain=False, only=targets)
                self._partial_restart.add(job["metadata"]["uid"])
                self._write_status(job, "Restarting", retry=1)
            elif action == "AbortJob":
                self._kill(job, retain=True)
                self._write_status(job, "Aborting")
            elif action == "TerminateJob":
                self._kill(job, retain=True)
                self._write_status(job, "Terminating")
            elif action == "CompleteJob":
                self._kill(job, retain=True)
                self._write_status(job, "Completing")
            else:
                self._sync_pods(job)
                self._advance(job)
        elif phase == "Restarting":
            if job["metadata"]["uid"] not in self._partial_restart:
                self._kill(job, retain=False)
            job = self.kube.get(JOB, job["metadata"]["name"], job["metadata"]["namespace"])
            status = job.get("status") or {}
            if int(status.get("retryCount", 0)) >= int(job["spec"].get("maxRetry", 3)):
                self._write_status(job, "Failed", reason="", message="the job has reached its maximum retries")
            elif _total_replicas(job) - int(status.get("terminating", 0)) >= _min_available(job) and not [
                p for p in self._pods(job) if p["metadata"].get("deletionTimestamp")
            ]:
                self._partial_restart.discard(job["metadata"]["uid"])
                self._write_status(job, "Pending")
        elif phase in ("Aborting", "Aborted"):
            if action == "ResumeJob":
                self._kill(job, retain=True)
                self._write_status(job, "Restarting", retry=1, version=1)
            else:
                self._kill(job, retain=True)
                if phase == "Aborting" and not self._active_pods(job):
                    self._write_status(job, "Aborted")
        elif phase in ("Completing", "Terminating"):
            self._kill(job, retain=True)
            if not self._active_pods(job):
                self._write_status(job, "Completed" if phase == "Completing" else "Terminated")
        else:
            self._kill(job, retain=True)
            self._write_status(job, phase)
        self._refresh_podgroup(job)

    def _advance(self, job: JSON) -> None:
        """SyncJob in Pending/Running: the phase follows the pod counts."""
        job = self.kube.get(JOB, job["metadata"]["name"], job["metadata"]["namespace"])
        counts = self._counts(job)
        phase = _phase(job) or "Pending"
        if phase == "Pending" and counts["running"] + counts["succeeded"] + counts["failed"] >= _min_available(job):
            phase = "Running"
        if phase == "Running":
            phase = _finished_phase(job, counts) or "Running"
        self._write_status(job, phase)
        if phase in FINISHED_PHASES:
            self._kill(job, retain=True)

    def _write_status(
        self,
        job: JSON,
        phase: str,
        *,
        reason: str | None = None,
        message: str | None = None,
        retry: int = 0,
        version: int = 0,
    ) -> None:
        meta = job["metadata"]
        counts = self._counts(job)
        now = rfc3339(self.kube.now())

        def apply(current: JSON) -> None:
            status = current.setdefault("status", {})
            state = status.setdefault("state", {})
            if state.get("phase") != phase:
                state.update(phase=phase, lastTransitionTime=now)
                state.pop("reason", None)
                state.pop("message", None)
                status.setdefault("conditions", []).append({"status": phase, "lastTransitionTime": now})
            if reason:
                state["reason"] = reason
            if message:
                state["message"] = message
            status["minAvailable"] = _min_available(current)
            for key in ("pending", "running", "succeeded", "failed", "terminating", "unknown"):
                status[key] = counts[key]
            status["taskStatusCount"] = {
                task: {"phase": dict(phases)} for task, phases in sorted(counts["tasks"].items())
            }
            status["retryCount"] = int(status.get("retryCount", 0)) + retry
            status["version"] = int(status.get("version", 0)) + version
            plugins = current["spec"].get("plugins") or {}
            if plugins:
                status["controlledResources"] = {f"plugin-{name}": name for name in sorted(plugins)}

        self.kube.mutate(JOB, meta["name"], meta["namespace"], apply, subresource="status")

    def _counts(self, job: JSON) -> dict[str, Any]:
        counts: dict[str, Any] = {k: 0 for k in ("pending", "running", "succeeded", "failed", "terminating", "unknown")}
        tasks: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for pod in self._pods(job):
            task = (pod["metadata"].get("labels") or {}).get(TASK_SPEC, "")
            if pod["metadata"].get("deletionTimestamp"):
                counts["terminating"] += 1
                continue
            pod_phase = (pod.get("status") or {}).get("phase", "Pending")
            counts[pod_phase.lower()] = counts.get(pod_phase.lower(), 0) + 1
            tasks[task][pod_phase] += 1
        counts["tasks"] = {task: dict(phases) for task, phases in tasks.items()}
        return counts

    def _pods(self, job: JSON) -> list[JSON]:
        meta = job["metadata"]
        return [
            pod
            for pod in self.kube.list("pods", meta["namespace"], label_selector=f"{JOB_NAME}={meta['name']}")
            if any(ref.get("uid") == meta["uid"] for ref in pod["metadata"].get("ownerReferences") or [])
        ]

    def _active_pods(self, job: JSON) -> list[JSON]:
        return [
            pod
            for pod in self._pods(job)
            if pod["metadata"].get("deletionTimestamp")
            or (pod.get("status") or {}).get("phase") in ("Pending", "Running", "Unknown")
        ]

    def _observe(self, job: JSON) -> list[_BusEvent]:
        """What changed among the job's pods since the last tick, as Volcano's bus events."""
        uid = job["metadata"]["uid"]
        pods = self._pods(job)
        before = self._seen_pods.get(uid, {})
        now: dict[str, tuple[str, str, bool]] = {}
        events: list[_BusEvent] = []
        for pod in pods:
            meta = pod["metadata"]
            task = (meta.get("labels") or {}).get(TASK_SPEC, "")
            phase = (pod.get("status") or {}).get("phase", "Pending")
            deleting = bool(meta.get("deletionTimestamp"))
            now[meta["name"]] = (meta["uid"], phase, deleting)
            previous = before.get(meta["name"])
            same = previous is not None and previous[0] == meta["uid"]
            if phase == "Failed" and not (same and previous[1] == "Failed"):
                events.append(_BusEvent("PodFailed", task, meta["name"], _exit_code(pod)))
            if deleting and not (same and previous[2]) and meta["uid"] not in self._killed:
                events.append(_BusEvent("PodEvicted", task, meta["name"]))
        for name, (pod_uid, _, deleting) in before.items():
            if name not in now or now[name][0] != pod_uid:
                if not deleting and pod_uid not in self._killed:
                    events.append(_BusEvent("PodEvicted", "", name))
                self._killed.discard(pod_uid)
        self._seen_pods[uid] = now
        version = int((job.get("status") or {}).get("version", 0))
        for task in job["spec"].get("tasks") or []:
            name = task.get("name", "")
            replicas = int(task.get("replicas", 0))
            done = [
                p
                for p in pods
                if (p["metadata"].get("labels") or {}).get(TASK_SPEC) == name
                and (p.get("status") or {}).get("phase") == "Succeeded"
            ]
            key = (uid, name, version)
            if replicas and len(done) >= replicas and key not in self._completed_tasks:
                self._completed_tasks.add(key)
                events.append(_BusEvent("TaskCompleted", name))
        return events

    def _kill(self, job: JSON, *, retain: bool, only: set[str] | None = None) -> None:
        """Delete the job's pods; `retain` keeps Succeeded/Failed ones (Volcano's PodRetainPhaseSoft)."""
        for pod in self._pods(job):
            meta = pod["metadata"]
            if only is not None and meta["name"] not in only:
                continue
            if meta.get("deletionTimestamp"):
                continue
            if retain and (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            self._killed.add(meta["uid"])
            self._event(pod, "Killing", f"Stopping container {_main_container(pod)}", "Normal", "kubelet")
            self.kube.delete("pods", meta["name"], meta["namespace"])

    # -- pods of a job -----------------------------------------------------------------------------

    def _sync_pods(self, job: JSON) -> None:
        pg = self._podgroup(job)
        if pg is None or (pg.get("status") or {}).get("phase") in (None, "", "Pending"):
            return  # Volcano creates pods only once the PodGroup is admitted
        existing = {pod["metadata"]["name"]: pod for pod in self._pods(job)}
        wanted: set[str] = set()
        for task in job["spec"].get("tasks") or []:
            for index in range(int(task.get("replicas", 0))):
                name = f"{job['metadata']['name']}-{task.get('name', '')}-{index}"
                wanted.add(name)
                if name not in existing:
                    self._create_pod(job, task, index, pg)
        for name, pod in existing.items():
            if name not in wanted and not pod["metadata"].get("deletionTimestamp"):
                self._killed.add(pod["metadata"]["uid"])
                self.kube.delete("pods", name, pod["metadata"]["namespace"])

    def _create_pod(self, job: JSON, task: JSON, index: int, pg: JSON) -> None:
        meta, spec = job["metadata"], job["spec"]
        status = job.get("status") or {}
        template = copy.deepcopy(task.get("template") or {})
        tmeta = template.get("metadata") or {}
        pod_spec = template.get("spec") or {}
        task_name = task.get("name", "")
        name = f"{meta['name']}-{task_name}-{index}"
        queue = spec.get("queue", "default")
        labels = dict(tmeta.get("labels") or {})
        for key in ("volcano.sh/preemptable", "volcano.sh/cooldown-time"):
            if key in (meta.get("labels") or {}):
                labels[key] = meta["labels"][key]
        labels.update(
            {
                JOB_NAME: meta["name"],
                JOB_NAMESPACE: meta["namespace"],
                QUEUE_NAME: queue,
                TASK_SPEC: task_name,
                TASK_INDEX: str(index),
            }
        )
        annotations = dict(tmeta.get("annotations") or {})
        annotations.update(
            {
                JOB_NAME: meta["name"],
                TASK_SPEC: task_name,
                TASK_INDEX: str(index),
                QUEUE_NAME: queue,
                JOB_VERSION: str(status.get("version", 0)),
                JOB_RETRY_COUNT: str(status.get("retryCount", 0)),
                TEMPLATE_UID: f"{meta['name']}-{task_name}",
                GROUP_NAME: pg["metadata"]["name"],
            }
        )
        if not pod_spec.get("schedulerName"):
            pod_spec["schedulerName"] = spec.get("schedulerName") or SCHEDULER
        if spec.get("priorityClassName") and not pod_spec.get("priorityClassName"):
            pod_spec["priorityClassName"] = spec["priorityClassName"]
        _apply_plugins(job, task, index, pod_spec, name)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [_owner_reference(job)],
            },
            "spec": pod_spec,
        }
        try:
            created = self.kube.create("pods", pod)
        except ApiError as error:
            self._event(job, "FailedCreate", f"Error creating pods: {error.message}", "Warning")
            return
        self._seen_pods.setdefault(meta["uid"], {})[name] = (created["metadata"]["uid"], "Pending", False)

    # -- podgroups ---------------------------------------------------------------------------------

    def _podgroup(self, job: JSON) -> JSON | None:
        meta = job["metadata"]
        return self.kube.try_get(PODGROUP, f"{meta['name']}-{meta['uid']}", meta["namespace"])

    def _ensure_podgroup(self, job: JSON) -> JSON:
        existing = self._podgroup(job)
        if existing is not None:
            if (existing.get("spec") or {}).get("minMember") != _min_available(job):  # the job was scaled

                def scale(pg: JSON) -> None:
                    pg["spec"]["minMember"] = _min_available(job)
                    pg["spec"]["minResources"] = {k: format_quantity(v) for k, v in sorted(_min_resources(job).items())}

                return self.kube.mutate(PODGROUP, existing["metadata"]["name"], job["metadata"]["namespace"], scale)
            return existing
        meta, spec = job["metadata"], job["spec"]
        min_available = _min_available(job)
        task_members = {
            task.get("name", ""): int(task.get("minAvailable", task.get("replicas", 0)))
            for task in spec.get("tasks") or []
        }
        pg_spec: JSON = {
            "minMember": min_available,
            "minTaskMember": task_members,
            "queue": spec.get("queue", "default"),
            "minResources": {k: format_quantity(v) for k, v in sorted(_min_resources(job).items())},
        }
        if spec.get("priorityClassName"):
            pg_spec["priorityClassName"] = spec["priorityClassName"]
        pg = {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {
                "name": f"{meta['name']}-{meta['uid']}",
                "namespace": meta["namespace"],
                "annotations": dict(meta.get("annotations") or {}),
                "labels": dict(meta.get("labels") or {}),
                "ownerReferences": [_owner_reference(job)],
            },
            "spec": pg_spec,
            "status": {"phase": "Pending"},
        }
        return self.kube.create(PODGROUP, pg)

    def _refresh_podgroup(self, job: JSON) -> None:
        job = self.kube.try_get(JOB, job["metadata"]["name"], job["metadata"]["namespace"]) or job
        pg = self._podgroup(job)
        if pg is None:
            return
        counts = self._counts(job)
        phase = (pg.get("status") or {}).get("phase", "Pending")
        if _phase(job) in FINISHED_PHASES:
            phase = "Completed"

        def apply(current: JSON) -> None:
            status = current.setdefault("status", {})
            status["phase"] = phase
            for key in ("running", "succeeded", "failed"):
                if counts[key]:
                    status[key] = counts[key]
                else:
                    status.pop(key, None)

        self.kube.mutate(PODGROUP, pg["metadata"]["name"], pg["metadata"]["namespace"], apply)

    def _ensure_plugin_objects(self, job: JSON) -> None:
        meta = job["metadata"]
        plugins = job["spec"].get("plugins") or {}
        owner = [_owner_reference(job)]
        if "svc" in plugins:
            hosts = {
                f"{task.get('name', '')}.host": "\n".join(
                    f"{meta['name']}-{task.get('name', '')}-{i}.{meta['name']}"
                    for i in range(int(task.get("replicas", 0)))
                )
                for task in job["spec"].get("tasks") or []
            }
            self._create_quietly(
                "services",
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {
                        "name": meta["name"],
                        "namespace": meta["namespace"],
                        "ownerReferences": owner,
                    },
                    "spec": {
                        "clusterIP": "None",
                        "selector": {JOB_NAME: meta["name"], JOB_NAMESPACE: meta["namespace"]},
                        "publishNotReadyAddresses": True,
                        "ports": [{"name": "placeholder-volcano", "port": 1, "protocol": "TCP", "targetPort": 1}],
                    },
                },
            )
            self._create_quietly(
                "configmaps",
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": f"{meta['name']}-svc",
                        "namespace": meta["namespace"],
                        "ownerReferences": owner,
                    },
                    "data": hosts,
                },
            )
            if "--disable-network-policy" not in (plugins.get("svc") or []):
                # Volcano's svc plugin: only the job's own pods may reach them.
                selector = {"matchLabels": {JOB_NAME: meta["name"], JOB_NAMESPACE: meta["namespace"]}}
                self._create_quietly(
                    "networkpolicies.networking.k8s.io",
                    {
                        "apiVersion": "networking.k8s.io/v1",
                        "kind": "NetworkPolicy",
                        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "ownerReferences": owner},
                        "spec": {
                            "podSelector": selector,
                            "ingress": [{"from": [{"podSelector": selector}]}],
                            "policyTypes": ["Ingress"],
                        },
                    },
                )
        if "ssh" in plugins:
            self._create_quietly(
                "secrets",
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": f"{meta['name']}-ssh",
                        "namespace": meta["namespace"],
                        "ownerReferences": owner,
                    },
                    "type": "Opaque",
                    "data": {
                        "authorized_keys": "ZmFrZQ==",
                        "id_rsa": "ZmFrZQ==",
                        "id_rsa.pub": "ZmFrZQ==",
                        "config": "",
                    },
                },
            )

    def _create_quietly(self, resource: str, obj: JSON) -> None:
        try:
            self.kube.create(resource, obj)
        except ApiError as error:
            if error.code != 409:
                raise

    # -- the scheduler -----------------------------------------------------------------------------

    def _schedule(self) -> None:
        nodes = self.kube.list("nodes")
        pods = self.kube.list("pods")
        usage = _node_usage(pods)
        podgroups = sorted(self.kube.list(PODGROUP), key=self.kube.creation_order)
        for pg in podgroups:
            if (pg.get("status") or {}).get("phase", "Pending") == "Pending":
                self._enqueue(pg, podgroups, pods, nodes)
        for pg in sorted(self.kube.list(PODGROUP), key=self.kube.creation_order):
            if (pg.get("status") or {}).get("phase") in ("Inqueue", "Running", "Unknown"):
                self._allocate(pg, nodes, usage)
        for pod in self.kube.list("pods"):
            spec = pod.get("spec") or {}
            if spec.get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            scheduler = spec.get("schedulerName", "default-scheduler")
            if scheduler == "default-scheduler":
                self._schedule_single(pod, nodes, usage)

    def _enqueue(self, pg: JSON, podgroups: list[JSON], pods: list[JSON], nodes: list[JSON]) -> None:
        meta, spec = pg["metadata"], pg.get("spec") or {}
        queue = self.kube.try_get(QUEUE, spec.get("queue", "default"))
        min_resources = resource_list(spec.get("minResources"))
        refusal = None
        if queue is None or (queue.get("status") or {}).get("state") != "Open":
            refusal = ""  # the scheduler skips jobs of a missing or non-Open queue without an event
        else:
            capability = resource_list((queue.get("spec") or {}).get("capability"))
            used = self._queue_usage(queue["metadata"]["name"], podgroups, pods)
            if not _fits(_add(min_resources, used), capability, unlimited_missing=True):
                refusal = "queue resource quota insufficient"
            else:
                total = _sum(resource_list((n.get("status") or {}).get("allocatable")) for n in nodes if _ready(n))
                cluster_used = _sum(_pod_request(p) for p in pods if _holds_resources(p))
                inqueue = _sum(
                    resource_list((other.get("spec") or {}).get("minResources"))
                    for other in podgroups
                    if (other.get("status") or {}).get("phase") == "Inqueue"
                )
                idle = {k: v * OVERCOMMIT_FACTOR - cluster_used.get(k, Fraction(0)) for k, v in total.items()}
                if not _fits(_add(min_resources, inqueue), idle, unlimited_missing=False):
                    refusal = "resource in cluster is overused"
        if refusal is None:
            self.kube.mutate(
                PODGROUP,
                meta["name"],
                meta["namespace"],
                lambda current: current.setdefault("status", {}).update(phase="Inqueue"),
            )
            pg["status"] = {**(pg.get("status") or {}), "phase": "Inqueue"}
            return
        if refusal:
            self._event(pg, "Unschedulable", refusal, "Normal", SCHEDULER)
        min_member = int(spec.get("minMember", 1))
        gang = (
            f"{min_member}/{len(self._group_pods(pg))} tasks in gang unschedulable: pod group is not ready, "
            f"{min_member} minAvailable"
        )
        self._mark_unschedulable(pg, gang)

    def _mark_unschedulable(self, pg: JSON, message: str) -> None:
        meta = pg["metadata"]
        now = rfc3339(self.kube.now())
        self._event(pg, "Unschedulable", message, "Warning", SCHEDULER)

        def apply(current: JSON) -> None:
            status = current.setdefault("status", {})
            conditions = [c for c in status.get("conditions") or [] if c.get("type") != "Unschedulable"]
            previous = next((c for c in status.get("conditions") or [] if c.get("type") == "Unschedulable"), {})
            conditions.append(
                {
                    "type": "Unschedulable",
                    "status": "True",
                    "reason": "NotEnoughResources",
                    "message": message,
                    "transitionID": previous.get("transitionID") or _stable_id(meta["uid"], str(self.ticks)),
                    "lastTransitionTime": previous.get("lastTransitionTime") or now,
                }
            )
            status["conditions"] = conditions

        self.kube.mutate(PODGROUP, meta["name"], meta["namespace"], apply)
        owner = next((ref for ref in meta.get("ownerReferences") or [] if ref.get("kind") == "Job"), None)
        if owner is not None:
            job = self.kube.try_get(JOB, owner["name"], meta["namespace"])
            if job is not None:
                self._event(
                    job,
                    "PodGroupPending",
                    f"PodGroup {meta['namespace']}:{owner['name']} unschedule,reason: {message}",
                    "Warning",
                )

    def _queue_usage(self, queue: str, podgroups: list[JSON], pods: list[JSON]) -> dict[str, Fraction]:
        mine = [pg for pg in podgroups if (pg.get("spec") or {}).get("queue", "default") == queue]
        used = _sum(
            resource_list((pg.get("spec") or {}).get("minResources"))
            for pg in mine
            if (pg.get("status") or {}).get("phase") == "Inqueue"
        )
        running = [pg for pg in mine if (pg.get("status") or {}).get("phase") in ("Running", "Unknown")]
        return _add(used, _sum(_pod_request(p) for p in pods if self._counts_against_queue(p, running)))

    def _group_pods(self, pg: JSON) -> list[JSON]:
        meta = pg["metadata"]
        return [
            pod
            for pod in self.kube.list("pods", meta["namespace"])
            if (pod["metadata"].get("annotations") or {}).get(GROUP_NAME) == meta["name"]
        ]

    def _allocate(self, pg: JSON, nodes: list[JSON], usage: dict[str, Resources]) -> None:
        meta = pg["metadata"]
        queue = self.kube.try_get(QUEUE, (pg.get("spec") or {}).get("queue", "default"))
        if queue is None or (queue.get("status") or {}).get("state") != "Open":
            return  # the scheduler allocates nothing in a queue that is not Open
        members = self._group_pods(pg)
        waiting = [
            p
            for p in members
            if not (p.get("spec") or {}).get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase", "Pending") == "Pending"
            and (p.get("spec") or {}).get("schedulerName") == SCHEDULER
        ]
        placed_before = [
            p
            for p in members
            if (p.get("spec") or {}).get("nodeName")
            and (p.get("status") or {}).get("phase") in ("Pending", "Running", "Succeeded")
        ]
        min_member = int((pg.get("spec") or {}).get("minMember", 1))
        trial = {name: dict(used) for name, used in usage.items()}
        plan: list[tuple[JSON, str]] = []
        failures: dict[str, list[str]] = {}
        for pod in sorted(waiting, key=_pod_order):
            node, why = _pick_node(pod, nodes, trial)
            if node is None:
                failures[pod["metadata"]["name"]] = why
                continue
            plan.append((pod, node))
            trial[node] = _add(trial.get(node, {}), _pod_request(pod))
        phase = (pg.get("status") or {}).get("phase")
        if plan and (len(placed_before) + len(plan) >= min_member or phase in ("Running", "Unknown")):
            for pod, node in plan:
                self._bind(pod, node, SCHEDULER)
                usage[node] = _add(usage.get(node, {}), _pod_request(pod))
            placed = len(placed_before) + len(plan)
        else:
            placed = len(placed_before)
            for pod, _ in plan:
                failures.setdefault(pod["metadata"]["name"], ["gang"])
        now = rfc3339(self.kube.now())
        if placed >= min_member:

            def ready(current: JSON) -> None:
                status = current.setdefault("status", {})
                if status.get("phase") in ("Inqueue", "Unknown"):
                    status["phase"] = "Running"
                conditions = [c for c in status.get("conditions") or [] if c.get("type") != "Unschedulable"]
                if not any(c.get("type") == "Scheduled" for c in conditions):
                    conditions.append(
                        {
                            "type": "Scheduled",
                            "status": "True",
                            "reason": "tasks in gang are ready to be scheduled",
                            "message": "",
                            "transitionID": _stable_id(current["metadata"]["uid"], "scheduled"),
                            "lastTransitionTime": now,
                        }
                    )
                status["conditions"] = conditions

            self.kube.mutate(PODGROUP, meta["name"], meta["namespace"], ready)
        if failures:
            unscheduled = len(failures)
            reasons = sorted({reason for why in failures.values() for reason in why if reason != "gang"})
            detail = ", ".join(reasons) if reasons else "gang unschedulable"
            self._mark_unschedulable(
                pg,
                (
                    f"{unscheduled}/{len(members)} tasks in gang unschedulable: pod group is not ready, "
                    f"{unscheduled} Pending, {min_member} minAvailable; Pending: {unscheduled} Unschedulable"
                ),
            )
            for pod in waiting:
                if pod["metadata"]["name"] in failures:
                    self._unschedulable_pod(pod, f"0/{len(nodes)} nodes are available: {detail}.", SCHEDULER)

    def _schedule_single(self, pod: JSON, nodes: list[JSON], usage: dict[str, Resources]) -> None:
        node, why = _pick_node(pod, nodes, usage)
        if node is None:
            detail = ", ".join(why) if why else "no nodes available to schedule pods"
            self._unschedulable_pod(pod, f"0/{len(nodes)} nodes are available: {detail}.", "default-scheduler")
            return
        self._bind(pod, node, "default-scheduler")
        usage[node] = _add(usage.get(node, {}), _pod_request(pod))

    def _assign_vgpus(self, pod: JSON, node_name: str) -> None:
        """Volcano's vGPU scheduling (deviceshare): the cards it gives a pod asking for `volcano.sh/vgpu-number`
        go into `volcano.sh/vgpu-ids-new`. Released Volcano versions ignore `volcano.sh/vgpu-use-gpuuuid`; so
        does this one, which takes the node's registered cards from the last, so that a test sees the drift."""
        count = int(_pod_request(pod).get(VGPU_NUMBER, 0))
        if count <= 0:
            return
        node = self.kube.try_get("nodes", node_name) or {}
        raw = (node.get("metadata", {}).get("annotations") or {}).get(VGPU_REGISTER, "")
        cards = [part.split(",", 1)[0] for part in raw.split(":") if part.startswith("GPU-")]
        chosen = list(reversed(cards))[:count] or [f"GPU-{node_name}-{i}" for i in range(count)]
        request = _pod_request(pod)
        memory, cores = int(request.get(VGPU_MEMORY, 0)), int(request.get(VGPU_CORES, 0))
        value = ":".join(f"{uuid},NVIDIA,{memory},{cores}" for uuid in chosen) + ":;"
        meta = pod["metadata"]
        self.kube.mutate(
            "pods",
            meta["name"],
            meta["namespace"],
            lambda p: p["metadata"].setdefault("annotations", {}).update({VGPU_ASSIGNED: value}),
        )

    def _bind(self, pod: JSON, node: str, scheduler: str) -> None:
        meta = pod["metadata"]
        now = rfc3339(self.kube.now())
        if scheduler == SCHEDULER:
            self._assign_vgpus(pod, node)
        self.kube.mutate("pods", meta["name"], meta["namespace"], lambda p: p["spec"].__setitem__("nodeName", node))

        def scheduled(p: JSON) -> None:
            _set_condition(p["status"], "PodScheduled", "True", now)

        self.kube.mutate("pods", meta["name"], meta["namespace"], scheduled, subresource="status")
        self._event(
            pod,
            "Scheduled",
            f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}",
            "Normal",
            scheduler,
        )

    def _unschedulable_pod(self, pod: JSON, message: str, scheduler: str) -> None:
        meta = pod["metadata"]
        now = rfc3339(self.kube.now())

        def apply(p: JSON) -> None:
            _set_condition(p["status"], "PodScheduled", "False", now, "Unschedulable", message)

        self.kube.mutate("pods", meta["name"], meta["namespace"], apply, subresource="status")
        self._event(pod, "FailedScheduling", message, "Warning", scheduler)

    # -- the kubelet -------------------------------------------------------------------------------

    def _run_kubelet(self) -> None:
        pods = self.kube.list("pods")
        alive = {pod["metadata"]["uid"] for pod in pods}
        self._runs = {uid: run for uid, run in self._runs.items() if uid in alive}
        for pod in pods:
            meta, spec = pod["metadata"], pod.get("spec") or {}
            if meta.get("deletionTimestamp"):
                self._runs.pop(meta["uid"], None)
                self.kube.remove_terminating_pod(meta["namespace"], meta["name"])
                continue
            if not spec.get("nodeName") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            run = self._runs.get(meta["uid"])
            if run is None:
                run = self._runs[meta["uid"]] = _PodRun(self._script_for(pod))
                self._container_creating(pod)
                pod = self.kube.get("pods", meta["name"], meta["namespace"])
            self._step_pod(pod, run)

    def _script_for(self, pod: JSON) -> PodScript:
        for rule in reversed(self._rules):
            if rule.matches(pod):
                rule.used += 1
                return rule.script
        return PodScript()

    def _container_creating(self, pod: JSON) -> None:
        meta = pod["metadata"]
        now = rfc3339(self.kube.now())
        node = self.kube.try_get("nodes", pod["spec"]["nodeName"]) or {}
        host_ip = next(
            (a["address"] for a in (node.get("status") or {}).get("addresses") or [] if a.get("type") == "InternalIP"),
            "192.168.0.2",
        )

        def apply(p: JSON) -> None:
            status = p["status"]
            status.update(hostIP=host_ip, hostIPs=[{"ip": host_ip}], startTime=now)
            for ctype in ("PodReadyToStartContainers", "Initialized"):
                _set_condition(status, ctype, "True", now)
            for ctype in ("Ready", "ContainersReady"):
                _set_condition(
                    status,
                    ctype,
                    "False",
                    now,
                    "ContainersNotReady",
                    f"containers with unready status: [{' '.join(_container_names(p))}]",
                )
            status["containerStatuses"] = [
                _container_status(c, {"waiting": {"reason": "ContainerCreating"}}) for c in p["spec"]["containers"]
            ]

        self.kube.mutate("pods", meta["name"], meta["namespace"], apply, subresource="status")

    def _step_pod(self, pod: JSON, run: _PodRun) -> None:
        script = run.script
        meta = pod["metadata"]
        if run.stage == "creating":
            if run.ticks < script.start_ticks:
                run.ticks += 1
                return
            self._start_containers(pod, run)
            run.stage, run.ticks = "running", 0
            pod = self.kube.get("pods", meta["name"], meta["namespace"])
            if script.run_ticks is None:
                self._write_logs(pod, run, everything=True)
                return
            if script.run_ticks > 0:
                return
        if run.stage != "running":
            return
        deadline = pod["spec"].get("activeDeadlineSeconds")
        started = (pod.get("status") or {}).get("startTime")
        if deadline is not None and started and self.kube.now() >= parse_time(started) + timedelta(seconds=deadline):
            text = f"Pod was active on the node longer than the specified deadline ({deadline}s)"
            self._event(pod, "DeadlineExceeded", text, "Normal", "kubelet")
            self._terminate_pod(
                pod, exit_code=137, container_reason="Error", pod_reason="DeadlineExceeded", message=text
            )
            return
        run.ticks += 1
        finished = script.run_ticks is not None and run.ticks >= script.run_ticks
        self._write_logs(pod, run, everything=finished)
        if finished:
            self._finish(pod, run)

    def _start_containers(self, pod: JSON, run: _PodRun) -> None:
        meta = pod["metadata"]
        now = rfc3339(self.kube.now())
        run.started_at = now
        main = _main_container(pod)
        run.pending_logs = {c["name"]: run.script.log_lines(c["name"], main) for c in pod["spec"]["containers"]}
        for container in pod["spec"]["containers"]:
            image = container.get("image", "")
            self._event(pod, "Pulled", f'Container image "{image}" already present on machine', "Normal", "kubelet")
            self._event(pod, "Created", f"Created container: {container['name']}", "Normal", "kubelet")
            self._event(pod, "Started", f"Started container {container['name']}", "Normal", "kubelet")
        pod_ip = self.kube.next_ip("10.244.0")

        def apply(p: JSON) -> None:
            status = p["status"]
            status.update(phase="Running", podIP=pod_ip, podIPs=[{"ip": pod_ip}])
            for ctype in ("Ready", "ContainersReady"):
                _set_condition(status, ctype, "True", now)
            status["containerStatuses"] = [
                _container_status(
                    c,
                    {"running": {"startedAt": now}},
                    ready=True,
                    started=True,
                    restarts=run.restarts,
                    uid=meta["uid"],
                )
                for c in p["spec"]["containers"]
            ]

        self.kube.mutate("pods", meta["name"], meta["namespace"], apply, subresource="status")

    def _write_logs(self, pod: JSON, run: _PodRun, *, everything: bool) -> None:
        meta = pod["metadata"]
        for container, pending in run.pending_logs.items():
            if not pending:
                continue
            if everything or not run.script.run_ticks:
                share = len(pending)
            else:
                remaining_ticks = max(run.script.run_ticks - run.ticks + 1, 1)
                share = -(-len(pending) // remaining_ticks)
            chunk, run.pending_logs[container] = pending[:share], pending[share:]
            self.kube.append_log(meta["namespace"], meta["name"], "\n".join(chunk), container=container)

    def _finish(self, pod: JSON, run: _PodRun) -> None:
        script = run.script
        policy = pod["spec"].get("restartPolicy", "Always")
        pod_reason = script.reason if script.reason in POD_LEVEL_REASONS else None
        exit_code = script.exit_code
        container_reason = None if pod_reason else script.reason
        if container_reason == "OOMKilled" and exit_code == 0:
            exit_code = 137
        if pod_reason is None and (policy == "Always" or (policy == "OnFailure" and exit_code != 0)):
            self._restart(pod, run, exit_code, container_reason or ("Completed" if exit_code == 0 else "Error"))
            return
        run.stage = "done"
        self._terminate_pod(
            pod,
            exit_code=exit_code,
            container_reason=container_reason,
            pod_reason=pod_reason,
            message=script.message,
        )

    def _restart(self, pod: JSON, run: _PodRun, exit_code: int, reason: str) -> None:
        """restartPolicy Always/OnFailure: the container restarts in place, the pod never ends."""
        meta = pod["metadata"]
        now = rfc3339(self.kube.now())
        run.restarts += 1
        run.ticks = 0
        main = _main_container(pod)
        run.pending_logs = {c["name"]: run.script.log_lines(c["name"], main) for c in pod["spec"]["containers"]}
        for container in pod["spec"]["containers"]:
            self.kube.rotate_log(meta["namespace"], meta["name"], container["name"])

        def apply(p: JSON) -> None:
            for status in p["status"].get("containerStatuses") or []:
                if status["name"] != main:
                    continue
                status["lastState"] = {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": reason,
                        "startedAt": run.started_at,
                        "finishedAt": now,
                    }
                }
                status["restartCount"] = run.restarts
                status["state"] = {"running": {"startedAt": now}}
            run.started_at = now

        self.kube.mutate("pods", meta["name"], meta["namespace"], apply, subresource="status")
        self._event(
            pod,
            "BackOff",
            f"Back-off restarting failed container {main} in pod {meta['name']}",
            "Warning",
            "kubelet",
        )

    def _terminate_pod(
        self,
        pod: JSON,
        *,
        exit_code: int,
        container_reason: str | None,
        pod_reason: str | None,
        message: str | None,
        disruption: str | None = None,
        container_message: str | None = None,
    ) -> JSON:
        meta = pod["metadata"]
        now = rfc3339(self.kube.now())
        run = self._runs.get(meta["uid"])
        if run is not None:
            run.stage = "done"
            self._write_logs(pod, run, everything=True)
        started = run.started_at if run is not None and run.started_at else now
        main = _main_container(pod)
        failed = pod_reason is not None or exit_code != 0
        phase = "Failed" if failed else "Succeeded"

        def apply(p: JSON) -> None:
            status = p["status"]
            status["phase"] = phase
            if pod_reason:
                status["reason"] = pod_reason
                status["message"] = message or pod_reason
            for ctype in ("Ready", "ContainersReady"):
                _set_condition(status, ctype, "False", now, "PodFailed" if failed else "PodCompleted")
            if disruption:
                _set_condition(status, "DisruptionTarget", "True", now, disruption, message or "")
            statuses = []
            for container in p["spec"]["containers"]:
                is_main = container["name"] == main
                code = exit_code if is_main else 0
                reason = container_reason if is_main and container_reason else ("Completed" if code == 0 else "Error")
                terminated: JSON = {
                    "exitCode": code,
                    "reason": reason,
                    "startedAt": started,
                    "finishedAt": now,
                    "containerID": _container_id(meta["uid"], container["name"]),
                }
                text = container_message if is_main and container_message else (message if is_main else None)
                if text and not pod_reason:
                    terminated["message"] = text
                elif container_message and is_main:
                    terminated["message"] = container_message
                previous = next(
                    (s for s in status.get("containerStatuses") or [] if s["name"] == container["name"]), None
                )
                restarts = int((previous or {}).get("restartCount", 0))
                statuses.append(
                    _container_status(
                        container,
                        {"terminated": terminated},
                        ready=False,
                        started=False,
                        restarts=restarts,
                        uid=meta["uid"],
                    )
                )
            status["containerStatuses"] = statuses

        result = self.kube.mutate("pods", meta["name"], meta["namespace"], apply, subresource="status")
        return result

    # -- events ------------------------------------------------------------------------------------

    def _event(self, obj: JSON, reason: str, message: str, kind: str, component: str = CONTROLLER_COMPONENT) -> None:
        self.kube.record_event(obj, reason=reason, message=message, type=kind, component=component)


# --- admission webhooks ---------------------------------------------------------------------------


class VolcanoAdmission:
    """Volcano's mutating and validating webhooks (jobs, podgroups) and the queue validation policy."""

    def __init__(self, kube: FakeKubernetes) -> None:
        self.kube = kube

    def admit(self, op: str, rt: ResourceType, obj: JSON, old: JSON | None) -> None:
        if rt.key == ("batch.volcano.sh", "jobs") and op == "CREATE":
            _default_job(obj)
        elif rt.key == ("scheduling.volcano.sh", "podgroups") and isinstance(obj.get("spec"), dict):
            obj["spec"].setdefault("queue", "default")

    def validate(self, op: str, rt: ResourceType, obj: JSON, old: JSON | None) -> None:
        if rt.key == ("batch.volcano.sh", "jobs") and op in ("CREATE", "UPDATE"):
            problems = self._job_problems(obj) if op == "CREATE" else _job_update_problems(obj, old or {})
            if problems:
                raise ApiError(
                    400,
                    'admission webhook "validatejob.volcano.sh" denied the request: ' + "; ".join(problems),
                    reason="",
                )
        elif rt.key == ("scheduling.volcano.sh", "queues"):
            problems = _queue_problems(op, obj)
            if problems:
                name = obj["metadata"]["name"]
                raise ApiError(
                    422 if op != "DELETE" else 403,
                    f'queues.scheduling.volcano.sh "{name}" is forbidden: ValidatingAdmissionPolicy '
                    f"'validate-queue' with binding 'validate-queue-binding' denied request: " + "; ".join(problems),
                    reason="Invalid" if op != "DELETE" else "Forbidden",
                )

    def _job_problems(self, job: JSON) -> list[str]:
        spec = job.get("spec") or {}
        name = job["metadata"].get("name", "")
        problems: list[str] = []
        if _int(spec.get("minAvailable")) < 0:
            problems.append("job 'minAvailable' must be >= 0.")
        if _int(spec.get("maxRetry")) < 0:
            problems.append("'maxRetry' cannot be less than zero.")
        if spec.get("ttlSecondsAfterFinished") is not None and _int(spec.get("ttlSecondsAfterFinished")) < 0:
            problems.append("'ttlSecondsAfterFinished' cannot be less than zero.")
        tasks = spec.get("tasks") or []
        if not tasks:
            problems.append("No task specified in job spec")
        total = 0
        seen: set[str] = set()
        for index, task in enumerate(tasks):
            task_name = str(task.get("name", ""))
            replicas = _int(task.get("replicas"))
            if replicas < 0:
                problems.append(f"'replicas' < 0 in task: {task_name}, job: {name}")
            task_min = task.get("minAvailable")
            if task_min is not None and _int(task_min) < 0:
                problems.append(f"'minAvailable' < 0 in task: {task_name}, job: {name}")
            elif task_min is not None and _int(task_min) > replicas:
                problems.append(f"'minAvailable' is greater than 'replicas' in task: {task_name}, job: {name}")
            if task_name in seen:
                problems.append(f"duplicated task name {task_name}")
            seen.add(task_name)
            problems += [f"task name {task_name!r}: {p}" for p in name_problems(task_name, "label")]
            pod_name = f"{name}-{task_name}-{max(replicas - 1, 0)}"
            problems += [
                f"create pod with name {pod_name} validate failed {p}" for p in name_problems(pod_name, "label")
            ]
            total += replicas
            problems += _policy_problems(task.get("policies") or [])
            template = task.get("template") or {}
            problems += [
                c.message for c in pod_spec_causes(template.get("spec") or {}, f"spec.task[{index}].template.spec")
            ]
            for value in ((template.get("metadata") or {}).get("labels") or {}).values():
                problems += [
                    f"spec.task[{index}].template.metadata.labels: Invalid value: {value!r}: {p}"
                    for p in label_value_problems(str(value))
                ]
        if total < _int(spec.get("minAvailable")):
            problems.append("job 'minAvailable' should not be greater than total replicas in tasks")
        problems += _policy_problems(spec.get("policies") or [])
        for plugin in spec.get("plugins") or {}:
            if plugin not in KNOWN_PLUGINS:
                problems.append(f"unable to find job plugin: {plugin}")
        mounts: set[str] = set()
        for volume in spec.get("volumes") or []:
            path = volume.get("mountPath", "")
            if not path:
                problems.append(" mountPath is required;")
            elif path in mounts:
                problems.append(f" duplicated mountPath: {path};")
            mounts.add(path)
        queue_name = spec.get("queue") or "default"
        queue = self.kube.try_get(QUEUE, queue_name)
        if queue is None:
            problems.append(f'unable to find job queue: queues.scheduling.volcano.sh "{queue_name}" not found')
        else:
            state = (queue.get("status") or {}).get("state", "")
            if state != "Open":
                problems.append(
                    f"can only submit job to queue with state `Open`, queue `{queue_name}` status is `{state}`"
                )
            children = [q for q in self.kube.list(QUEUE) if (q.get("spec") or {}).get("parent") == queue_name]
            if queue_name == "root" or children:
                problems.append(f"can only submit job to leaf queue, queue `{queue_name}` is not a leaf queue")
        return problems


def _default_job(job: JSON) -> None:
    """The mutating webhook's defaults (note: it also turns an explicit maxRetry 0 into 3)."""
    spec = job.get("spec")
    if not isinstance(spec, dict):
        return
    spec["queue"] = spec.get("queue") or "default"
    spec["schedulerName"] = spec.get("schedulerName") or SCHEDULER
    if not _int(spec.get("maxRetry")):
        spec["maxRetry"] = 3
    tasks = spec.get("tasks") if isinstance(spec.get("tasks"), list) else []
    for index, task in enumerate(tasks):
        if not isinstance(task, dict):
            continue
        task["name"] = task.get("name") or f"default{index}"
        if task.get("minAvailable") is None:
            task["minAvailable"] = _int(task.get("replicas"))
        if not _int(task.get("maxRetry")):
            task["maxRetry"] = 3
    if not _int(spec.get("minAvailable")):
        spec["minAvailable"] = sum(_int(t.get("minAvailable", t.get("replicas"))) for t in tasks if isinstance(t, dict))
    plugins = spec.get("plugins")
    if isinstance(plugins, dict):
        if any(name in plugins for name in ("pytorch", "tensorflow", "mpi", "ray")):
            plugins.setdefault("svc", [])
        if "mpi" in plugins:
            plugins.setdefault("ssh", [])


def _policy_problems(policies: list[JSON]) -> list[str]:
    problems: list[str] = []
    seen_events: set[str] = set()
    seen_codes: set[int] = set()
    wildcard = False
    for policy in policies:
        events = list(policy.get("events") or [])
        if policy.get("event"):
            events.append(policy["event"])
        code = policy.get("exitCode")
        if events and code is not None:
            problems.append("must not specify event and exitCode simultaneously")
            continue
        if not events and code is None:
            problems.append("either event and exitCode should be specified")
            continue
        for event in events:
            if event not in USER_POLICY_EVENTS:
                problems.append(f"invalid policy event {event}")
            elif event in seen_events:
                problems.append(f"duplicate event {event} across different policy")
            seen_events.add(event)
            wildcard = wildcard or event == "*"
        if code is not None:
            if _int(code) == 0:
                problems.append("0 is not a valid error code")
            elif _int(code) in seen_codes:
                problems.append(f"duplicate exitCode {code}")
            seen_codes.add(_int(code))
        if policy.get("action") not in USER_POLICY_ACTIONS:
            problems.append(f"invalid policy action {policy.get('action')}")
    if wildcard and (len(seen_events) > 1 or seen_codes):
        problems.append("if there's * here, no other policy should be here")
    return problems


def _job_update_problems(new: JSON, old: JSON) -> list[str]:
    def frozen(spec: JSON) -> JSON:
        copied = copy.deepcopy(spec)
        copied.pop("minAvailable", None)
        copied.pop("priorityClassName", None)
        for task in copied.get("tasks") or []:
            task.pop("replicas", None)
            task.pop("minAvailable", None)
        return copied

    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    problems: list[str] = []
    if len(new_spec.get("tasks") or []) != len(old_spec.get("tasks") or []):
        problems.append("job updates may not add or remove tasks")
    elif frozen(new_spec) != frozen(old_spec):
        problems.append("job updates may not change fields other than `minAvailable`, `tasks[*].replicas under spec`")
    if _int(new_spec.get("minAvailable")) > sum(_int(t.get("replicas")) for t in new_spec.get("tasks") or []):
        problems.append("job 'minAvailable' must not be greater than total replicas")
    return problems


def _queue_problems(op: str, queue: JSON) -> list[str]:
    name = queue["metadata"].get("name", "")
    if op == "DELETE":
        return [f"`{name}` queue can not be deleted"] if name in ("default", "root") else []
    spec = queue.get("spec") or {}
    problems: list[str] = []
    try:
        capability = resource_list(spec.get("capability"))
        deserved = resource_list(spec.get("deserved"))
        guarantee = resource_list((spec.get("guarantee") or {}).get("resource"))
    except ValueError as exc:
        return [f"resource quantity is invalid: {exc}"]
    for key, value in deserved.items():
        if key in capability and value > capability[key]:
            problems.append(f"deserved should less equal than capability ({key})")
    if guarantee and not deserved and spec.get("capability") is None:
        return problems
    for key, value in guarantee.items():
        if key in deserved and value > deserved[key]:
            problems.append(f"guarantee should less equal than deserved ({key})")
    return problems


# --- helpers --------------------------------------------------------------------------------------


def _int(value: Any, default: int = 0) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return default


def _phase(job: JSON) -> str:
    return str(((job.get("status") or {}).get("state") or {}).get("phase") or "")


def _min_available(job: JSON) -> int:
    spec = job.get("spec") or {}
    explicit = _int(spec.get("minAvailable"))
    if explicit:
        return explicit
    return sum(_int(t.get("minAvailable", t.get("replicas"))) for t in spec.get("tasks") or [])


def _total_replicas(job: JSON) -> int:
    return sum(_int(task.get("replicas")) for task in (job.get("spec") or {}).get("tasks") or [])


def _finished_phase(job: JSON, counts: Mapping[str, Any]) -> str | None:
    """Volcano's running state: once every pod has ended, Completed if enough succeeded, else Failed."""
    spec = job["spec"]
    min_success = spec.get("minSuccess")
    if min_success is not None and counts["succeeded"] >= _int(min_success):
        return "Completed"
    total = _total_replicas(job)
    if total == 0 or counts["succeeded"] + counts["failed"] != total:
        return None
    tasks = spec.get("tasks") or []
    if _min_available(job) >= sum(_int(task.get("minAvailable")) for task in tasks):
        for task in tasks:
            succeeded = counts["tasks"].get(task.get("name", ""), {}).get("Succeeded", 0)
            if task.get("minAvailable") is not None and succeeded < _int(task["minAvailable"]):
                return "Failed"
    if min_success is not None:
        return "Failed"
    return "Completed" if counts["succeeded"] >= _min_available(job) else "Failed"


def _policy_action(job: JSON, event: _BusEvent) -> str:
    """Volcano's applyPolicies: task policies first, then job policies, else SyncJob."""
    task = next((t for t in job["spec"].get("tasks") or [] if t.get("name") == event.task), None)
    for policies in ((task or {}).get("policies") or [], job["spec"].get("policies") or []):
        for policy in policies:
            events = list(policy.get("events") or []) + ([policy["event"]] if policy.get("event") else [])
            if events and (event.kind in events or "*" in events):
                return str(policy.get("action", "SyncJob"))
            if (
                policy.get("exitCode") is not None
                and event.kind == "PodFailed"
                and _int(policy["exitCode"]) == event.exit_code
            ):
                return str(policy.get("action", "SyncJob"))
    return "SyncJob"


def _owner_reference(job: JSON) -> JSON:
    meta = job["metadata"]
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _main_container(pod: JSON) -> str:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return str(containers[0].get("name", ""))


def _container_names(pod: JSON) -> list[str]:
    return [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]


def _exit_code(pod: JSON) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    if statuses:
        terminated = (statuses[0].get("state") or {}).get("terminated") or {}
        return int(terminated.get("exitCode", 0))
    return 0


def _stable_id(*parts: str) -> str:
    digest = hashlib.sha1("/".join(parts).encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _container_id(uid: str, name: str) -> str:
    return "containerd://" + hashlib.sha256(f"{uid}/{name}".encode()).hexdigest()


def _container_status(
    container: JSON,
    state: JSON,
    *,
    ready: bool = False,
    started: bool = False,
    restarts: int = 0,
    uid: str = "",
) -> JSON:
    image = str(container.get("image", ""))
    status: JSON = {
        "name": container["name"],
        "image": image,
        "imageID": "",
        "ready": ready,
        "restartCount": restarts,
        "started": started,
        "state": state,
    }
    if "running" in state or "terminated" in state:
        status["imageID"] = f"{image.split('@')[0]}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"
        status["containerID"] = _container_id(uid, container["name"])
    return status


def _set_condition(
    status: JSON, ctype: str, value: str, now: str, reason: str | None = None, message: str | None = None
) -> None:
    conditions = status.setdefault("conditions", [])
    current = next((c for c in conditions if c.get("type") == ctype), None)
    if current is None:
        current = {"type": ctype}
        conditions.append(current)
    if current.get("status") != value:
        current["lastTransitionTime"] = now
    current["status"] = value
    for key, item in (("reason", reason), ("message", message)):
        if item:
            current[key] = item
        else:
            current.pop(key, None)


def _sum(lists: Iterable[Resources]) -> Resources:
    total: Resources = defaultdict(Fraction)
    for resources in lists:
        for key, value in resources.items():
            total[key] += value
    return dict(total)


def _add(a: Mapping[str, Fraction], b: Mapping[str, Fraction]) -> Resources:
    return _sum([dict(a), dict(b)])


def _fits(request: Mapping[str, Fraction], limit: Mapping[str, Fraction], *, unlimited_missing: bool) -> bool:
    for key, value in request.items():
        if value <= 0:
            continue
        if key not in limit:
            if unlimited_missing:
                continue
            return False
        if value > limit[key]:
            return False
    return True


def _pod_request(pod: JSON) -> Resources:
    """Effective request: max(sum of containers, largest init container) plus overhead, plus one pod."""
    spec = pod.get("spec") or {}
    regular = _sum(_container_request(c) for c in spec.get("containers") or [])
    for init in spec.get("initContainers") or []:
        for key, value in _container_request(init).items():
            regular[key] = max(regular.get(key, Fraction(0)), value)
    total = _add(regular, resource_list(spec.get("overhead")))
    total["pods"] = Fraction(1)
    return total


def _container_request(container: JSON) -> Resources:
    resources = container.get("resources") or {}
    merged = dict(resources.get("limits") or {})
    merged.update(resources.get("requests") or {})
    return {key: quantity_value(value) for key, value in merged.items()}


def _min_resources(job: JSON) -> Resources:
    """Summed requests of the first minAvailable pods, tasks in order (Volcano's calcPGMinResources)."""
    remaining = _min_available(job)
    total: Resources = {}
    for task in job["spec"].get("tasks") or []:
        if remaining <= 0:
            break
        count = min(_int(task.get("replicas")), remaining)
        pod = {"spec": (task.get("template") or {}).get("spec") or {}}
        request = _pod_request(pod)
        request.pop("pods", None)
        for _ in range(count):
            total = _add(total, request)
        remaining -= count
    return total


def _holds_resources(pod: JSON) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get("phase") not in (
        "Succeeded",
        "Failed",
    )


def _node_usage(pods: list[JSON]) -> dict[str, Resources]:
    usage: dict[str, Resources] = {}
    for pod in pods:
        if _holds_resources(pod):
            node = pod["spec"]["nodeName"]
            usage[node] = _add(usage.get(node, {}), _pod_request(pod))
    return usage


def _ready(node: JSON) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def _pod_order(pod: JSON) -> tuple[str, int, str]:
    labels = pod["metadata"].get("labels") or {}
    return (labels.get(TASK_SPEC, ""), int(labels.get(TASK_INDEX, "0") or 0), pod["metadata"]["name"])


def _pick_node(pod: JSON, nodes: list[JSON], usage: dict[str, Resources]) -> tuple[str | None, list[str]]:
    """The first node (by name) the pod fits on, or None and the kube-scheduler style reasons."""
    reasons: dict[str, int] = defaultdict(int)
    request = _pod_request(pod)
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        why = _node_rejects(pod, node, request, usage.get(node["metadata"]["name"], {}))
        if not why:
            return node["metadata"]["name"], []
        for reason in why:
            reasons[reason] += 1
    return None, [f"{count} {reason}" for reason, count in sorted(reasons.items())]


def _node_rejects(pod: JSON, node: JSON, request: Resources, used: Resources) -> list[str]:
    spec = pod.get("spec") or {}
    node_spec = node.get("spec") or {}
    if node_spec.get("unschedulable") and not _tolerates(
        spec, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    ):
        return ["node(s) were unschedulable"]
    for taint in node_spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(spec, taint):
            return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"]
    if not _ready(node):
        return ["node(s) were not ready"]
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return ["node(s) didn't match Pod's node affinity/selector"]
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if terms and not any(_term_matches(term, node) for term in terms):
        return ["node(s) didn't match Pod's node affinity/selector"]
    allocatable = resource_list((node.get("status") or {}).get("allocatable"))
    short = [
        f"Insufficient {key}" if key != "pods" else "Too many pods"
        for key, value in sorted(request.items())
        if value > 0 and used.get(key, Fraction(0)) + value > allocatable.get(key, Fraction(0))
    ]
    return short


def _tolerates(spec: JSON, taint: JSON) -> bool:
    for toleration in spec.get("tolerations") or []:
        if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
            continue
        operator = toleration.get("operator", "Equal")
        if operator == "Exists" and (not toleration.get("key") or toleration.get("key") == taint.get("key")):
            return True
        if (
            operator == "Equal"
            and toleration.get("key") == taint.get("key")
            and toleration.get("value", "") == taint.get("value", "")
        ):
            return True
    return False


def _term_matches(term: JSON, node: JSON) -> bool:
    labels = node["metadata"].get("labels") or {}
    for expression in term.get("matchExpressions") or []:
        if not _expression_matches(
            expression, labels.get(expression.get("key", "")), expression.get("key", "") in labels
        ):
            return False
    for expression in term.get("matchFields") or []:
        value = node["metadata"]["name"] if expression.get("key") == "metadata.name" else None
        if not _expression_matches(expression, value, value is not None):
            return False
    return bool(term.get("matchExpressions") or term.get("matchFields"))


def _expression_matches(expression: JSON, value: str | None, present: bool) -> bool:
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and values:
        try:
            actual, bound = int(str(value)), int(values[0])
        except ValueError:
            return False
        return actual > bound if operator == "Gt" else actual < bound
    return False


def _apply_plugins(job: JSON, task: JSON, index: int, pod_spec: JSON, pod_name: str) -> None:
    """The env, svc and pytorch plugins' changes to a pod (the subset a backend can observe)."""
    plugins = job["spec"].get("plugins") or {}
    job_name = job["metadata"]["name"]
    env: list[JSON] = []
    if "env" in plugins:
        env += [
            {"name": "VK_TASK_INDEX", "value": str(index)},
            {"name": "VC_TASK_INDEX", "value": str(index)},
        ]
    if "svc" in plugins:
        pod_spec.setdefault("hostname", pod_name)
        pod_spec.setdefault("subdomain", job_name)
        for other in job["spec"].get("tasks") or []:
            other_name = str(other.get("name", ""))
            hosts = ",".join(f"{job_name}-{other_name}-{i}.{job_name}" for i in range(_int(other.get("replicas"))))
            key = other_name.upper().replace("-", "_")
            env += [
                {"name": f"VC_{key}_HOSTS", "value": hosts},
                {"name": f"VC_{key}_NUM", "value": str(_int(other.get("replicas")))},
            ]
    if "pytorch" in plugins:
        args = dict(arg.lstrip("-").split("=", 1) for arg in plugins["pytorch"] if "=" in arg)
        master, worker, port = (
            args.get("master", "master"),
            args.get("worker", "worker"),
            args.get("port", "23456"),
        )
        world = sum(
            _int(t.get("replicas")) for t in job["spec"].get("tasks") or [] if t.get("name") in (master, worker)
        )
        rank = 0 if task.get("name") == master else index + 1
        env += [
            {"name": "MASTER_ADDR", "value": f"{job_name}-{master}-0.{job_name}"},
            {"name": "MASTER_PORT", "value": port},
            {"name": "WORLD_SIZE", "value": str(world)},
            {"name": "RANK", "value": str(rank)},
        ]
    if not env:
        return
    for container in pod_spec.get("containers") or []:
        existing = {item.get("name") for item in container.get("env") or []}
        container.setdefault("env", []).extend(item for item in env if item["name"] not in existing)
