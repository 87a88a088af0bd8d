"""deploy/prometheus/ and deploy/grafana/: the alert rules, scrape configs and dashboard name
only metrics hub/metrics.py exports, and scrape the hubs compose and Kubernetes run."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from hub.metrics import Counter, Gauge, Metrics
from tests.test_deploy import DEPLOY, compose, hub_services, k8s_object

ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS_CONFIGS = sorted((DEPLOY / "prometheus").glob("prometheus*.yml"))
DASHBOARD = DEPLOY / "grafana" / "taskhub-dashboard.json"


def metric_names() -> set[str]:
    return {m.name for m in vars(Metrics()).values() if isinstance(m, Counter | Gauge)}


def metrics_in(expr: str) -> set[str]:
    return set(re.findall(r"\btaskhub_[a-z0-9_]+\b", expr))


def balanced(expr: str) -> bool:
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for char in re.sub(r'"[^"]*"', '""', expr):
        if char in "([{":
            stack.append(char)
        elif char in pairs and (not stack or stack.pop() != pairs[char]):
            return False
    return not stack


def test_alert_rules() -> None:
    known = metric_names()
    rules = [
        rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    ]
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert {"alert", "expr", "for", "labels", "annotations"} <= set(rule), rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"])
        assert rule["labels"]["severity"] in ("page", "warning")
        assert rule["annotations"]["summary"]
        assert balanced(rule["expr"]), rule["alert"]
        assert metrics_in(rule["expr"]) <= known, rule["alert"]
        assert metrics_in(rule["expr"]) or rule["expr"].startswith("up{")
    exprs = " ".join(rule["expr"] for rule in rules)
    for watched in ("taskhub_ready", "taskhub_kv_rejected_total", "taskhub_open_streams"):
        assert watched in exprs
    assert re.search(r'taskhub_requests_total\{outcome!~?"', exprs)


def test_prometheus_configs() -> None:
    services = compose()["services"]
    for path in PROMETHEUS_CONFIGS:
        config = yaml.safe_load(path.read_text())
        assert all((path.parent / rules).is_file() for rules in config["rule_files"])
        (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "taskhub"]
        if "static_configs" in job:  # compose
            targets = {t for group in job["static_configs"] for t in group["targets"]}
            assert targets == {f"{name}:8080" for name in hub_services(services)}
        else:  # kubernetes: the pod annotations of the hub deployment
            annotations = k8s_object("Deployment", "taskhub")["spec"]["template"]["metadata"]
            assert annotations["annotations"]["prometheus.io/scrape"] == "true"
            assert job["kubernetes_sd_configs"][0]["role"] == "pod"
    assert "./prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]


def dashboard_targets() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target for panel in dashboard["panels"] for target in panel["targets"]]


def test_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 36
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels) > 0
    for panel in panels:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])
        assert panel["type"] in ("stat", "timeseries", "gauge", "table", "bargauge")
        assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}"
    (variable,) = dashboard["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"


def test_dashboard_uses_only_real_metrics() -> None:
    known = metric_names()
    for target in dashboard_targets():
        used = metrics_in(target["expr"])
        assert used and used <= known, target["expr"]
        assert balanced(target["expr"]), target["expr"]
