"""The failure classifier's defaults: who failed (user, platform, resource) and whether a retry is worth it."""

import pytest

from jobs import classifier
from jobs.classifier import Observation
from jobs.models import FailureRule

pytestmark = pytest.mark.django_db


@pytest.fixture
def rules():
    classifier.seed_default_rules()


@pytest.mark.parametrize(
    ("obs", "expected"),
    [
        # The user's own process ended with a code nobody listed: the user's, no retry.
        (Observation(exit_code=3, reason="Error"), ("user", "no_retry", "user-exit")),
        (Observation(exit_code=3), ("user", "no_retry", "user-exit")),
        (Observation(exit_code=127, reason="Error"), ("user", "no_retry", "user-exit")),  # command not found
        (Observation(exit_code=1, reason="Error"), ("user", "no_retry", "user-exit-1-2")),
        # A platform signal says otherwise.
        (Observation(exit_code=3, reason="Error", node_unhealthy=True), ("platform", "retry_elsewhere", None)),
        (Observation(exit_code=3, reason="Error", log_tail="NVRM: Xid 79"), ("platform", "retry_elsewhere", None)),
        (Observation(exit_code=3, reason="Evicted"), ("platform", "retry_elsewhere", "evicted-or-lost")),
        (Observation(exit_code=3, reason="GpuShareExceeded"), ("user", "no_retry", "gpu-share-exceeded")),
        # Not an exit of the user's own making: unknown, retried up to the limit.
        (Observation(signal=15, reason="SIGTERM"), ("platform", "retry", "unknown")),
        (Observation(exit_code=143, reason="Error"), ("platform", "retry", "unknown")),  # 128+15 from a shell
        (Observation(reason="Lost"), ("platform", "retry_elsewhere", "evicted-or-lost")),
        (Observation(reason="Unknown"), ("platform", "retry", "unknown")),
        (Observation(exit_code=127, reason="StartError"), ("platform", "retry", "unknown")),
        (Observation(exit_code=128, reason="ContainerCannotRun"), ("platform", "retry", "unknown")),
    ],
)
def test_default_table(rules, obs, expected):
    verdict = classifier.classify(obs)
    failure_class, reaction, rule = expected
    assert (verdict.failure_class, verdict.reaction) == (failure_class, reaction)
    if rule:
        assert verdict.rule == rule


def test_an_admin_rule_for_a_code_wins_over_the_user_default(rules):
    FailureRule.objects.create(
        name="flaky-storage", order=85, exit_codes=[3], failure_class="platform", reaction="retry", suggestion="x"
    )
    verdict = classifier.classify(Observation(exit_code=3, reason="Error"))
    assert (verdict.failure_class, verdict.reaction, verdict.rule) == ("platform", "retry", "flaky-storage")
