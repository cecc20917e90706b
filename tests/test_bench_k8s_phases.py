"""bench-k8s's end of a phase and its comparison: a floor that stopped before it had as many pods Running as the
platform's phase is never compared with it (at 8487949 a 20-s pause of Volcano's ended the floor at 1,626 of 5,923
pods, and the benchmark reported +164%)."""

import time
from types import SimpleNamespace

from bench.k8s import overhead_of, wait_quiet


def _phase(bound: int, last_bound_s: float, *, completed: bool = True) -> dict:
    return {"pods_bound": bound, "first_to_last_bound_s": last_bound_s, "bound_per_s": 1.0, "completed": completed}


def test_a_pause_does_not_end_a_phase_that_has_a_count_to_reach():
    now = time.time()
    watch = SimpleNamespace(running={f"pod-{k}": now - 60 for k in range(3)})  # quiet for a minute, 3 Running
    assert wait_quiet(watch, since=now - 60, quiet_s=20, until=time.time() + 5) is True  # no count: quiet ends it
    began = time.monotonic()
    assert wait_quiet(watch, since=now - 60, quiet_s=20, until=time.time() + 1.5, at_least=4) is False
    assert time.monotonic() - began >= 1.0  # it waited for the fourth pod until its time ran out
    watch.running["pod-3"] = now - 30
    assert wait_quiet(watch, since=now - 60, quiet_s=20, until=time.time() + 5, at_least=4) is True


def test_a_floor_with_fewer_pods_is_not_compared():
    overhead, method = overhead_of(_phase(5923, 1719.8), _phase(1626, 651.5))
    assert overhead is None and method.startswith("not comparable"), method
    overhead, method = overhead_of(_phase(5923, 1719.8), _phase(5923, 1433.2))
    assert overhead == 20.0 and method.startswith("time from the first submission"), (overhead, method)
