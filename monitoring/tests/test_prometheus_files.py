"""The sample Prometheus files in k8s/prometheus/ parse, and name only metrics that really exist."""

import re

import pytest
import yaml
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from kernel.paths import BASE_DIR
from monitoring.collectors import DCGM_FIELDS

FOLDER = BASE_DIR / "k8s" / "prometheus"


def load(name: str):
    return yaml.safe_load((FOLDER / name).read_text())


def test_scrape_config_has_the_platform_and_dcgm_exporter():
    config = load("prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["trainyard"]["metrics_path"] == "/metrics"
    assert "dcgm-exporter" in jobs
    assert config["rule_files"] == ["/etc/prometheus/trainyard-alerts.yml"]
    generator = load("kustomization.yaml")["configMapGenerator"][0]
    assert set(generator["files"]) == {"prometheus.yml", "trainyard-alerts.yml"}


@pytest.mark.django_db
def test_alert_rules_use_real_metric_names(db_platform):
    rules = [rule for group in load("trainyard-alerts.yml")["groups"] for rule in group["rules"]]
    assert {r["labels"]["severity"] for r in rules} == {"warning", "critical", "fatal"}
    exported = {f.name for f in text_string_to_metric_families(Client().get("/metrics").content.decode())}
    names = {name for r in rules for name in re.findall(r"\b(trainyard_\w+|DCGM_\w+)", r["expr"])}
    for name in names:
        if name.startswith("DCGM_"):
            assert name in DCGM_FIELDS, name
        else:
            assert re.sub(r"_(bucket|count|sum)$", "", name) in exported, name
    assert {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "trainyard_jobs"} <= names
