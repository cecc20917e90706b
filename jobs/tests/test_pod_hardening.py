"""Job pods ask for the runtime's default AppArmor profile as the cluster's release spells it, and run under the
queue's RuntimeClass; both validate against the Kubernetes schemas of the releases the platform supports. On the real
control plane: tests/k8s/test_hardening.py."""

from __future__ import annotations

import dataclasses

import kubernetes_validate
import pytest

from jobs.backends import volcano_render as render
from jobs.tests.test_k8s_storage import PREFIX, with_store
from jobs.tests.test_volcano_render import describe, templates


def pod(template: dict, version: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **template.get("metadata", {})},
            "spec": template["spec"]}  # fmt: skip


@pytest.mark.parametrize(
    ("cluster", "volcano", "schema", "field"),
    [
        ((1, 29), (1, 14), "1.29", False),
        ((1, 30), (1, 9), kubernetes_validate.latest_version(), False),  # Volcano 1.9's Job CRD would drop the field
        ((1, 30), (1, 12), kubernetes_validate.latest_version(), True),
    ],
)
def test_apparmor_runtime_default_on_every_container_as_the_releases_take_it(cluster, volcano, schema, field):
    desc = dataclasses.replace(describe("guaranteed", extras=True, checkpoint={"prefix": PREFIX}),
                               runtime_class="kata")  # fmt: skip
    options = dataclasses.replace(with_store(), kubernetes_version=cluster, volcano_version=volcano)
    job = render.render_job(desc, options)
    for template in templates(job).values():
        kubernetes_validate.validate(pod(template, schema), schema, strict=True)
        spec, annotations = template["spec"], template["metadata"].get("annotations", {})
        assert spec["runtimeClassName"] == "kata"
        names = [c["name"] for c in [*spec.get("initContainers", []), *spec["containers"]]]
        if field:
            assert spec["securityContext"]["appArmorProfile"] == {"type": "RuntimeDefault"}
            assert not any(k.startswith(render.APPARMOR_ANNOTATION) for k in annotations)
        else:
            assert "appArmorProfile" not in spec["securityContext"]  # it would be dropped
            assert {n: annotations[render.APPARMOR_ANNOTATION + n] for n in names} == dict.fromkeys(
                names, "runtime/default"
            )


def test_apparmor_off_and_no_runtime_class_leave_the_pod_as_before():
    job = render.render_job(describe("shared"), dataclasses.replace(with_store(), apparmor=False))
    for template in templates(job).values():
        assert "appArmorProfile" not in template["spec"]["securityContext"]
        assert "runtimeClassName" not in template["spec"]
