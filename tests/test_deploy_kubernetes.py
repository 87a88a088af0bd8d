"""deploy/k8s/: the manifests fit the schemas bundled in `kubernetes-validate`, render with
kustomize, and agree with the image, the hub's options and the NATS configs."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from hub.config import Config
from tests.test_deploy import (
    DEPLOY,
    K8S_MANIFESTS,
    NATS_CONFIGS,
    final_stage,
    k8s_object,
    k8s_objects,
    nats_conf_variables,
    serve_option_variables,
)

# Kubernetes versions the manifests must fit: the oldest supported here, and the newest
# the validator knows.
K8S_VERSIONS = ("1.29", "latest")


def validate_k8s(objects: list[dict[str, Any]]) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="add kubernetes-validate to the [dev] extra"
    )
    for version in K8S_VERSIONS:
        if version == "latest":
            version = kubernetes_validate.latest_version()
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)


def test_k8s_manifests_match_the_schemas() -> None:
    validate_k8s(k8s_objects())


def test_k8s_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in K8S_MANIFESTS]
    files = kustomization["configMapGenerator"][0]["files"]
    assert sorted((DEPLOY / "k8s" / f).resolve() for f in files) == NATS_CONFIGS


def test_k8s_kustomization_renders() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here (`kubectl kustomize` renders offline)")
    result = subprocess.run(
        [kubectl, "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(DEPLOY / "k8s")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    config = next(o for o in rendered if o["kind"] == "ConfigMap")
    assert config["data"] == {p.name: p.read_text() for p in NATS_CONFIGS}
    assert all(
        o["metadata"].get("namespace") == "taskhub" for o in rendered if o["kind"] != "Namespace"
    )
    if importlib.util.find_spec("kubernetes_validate") is not None:  # else the test above skips
        validate_k8s(rendered)


def container(obj: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = obj["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_k8s_hub_deployment() -> None:
    deployment = k8s_object("Deployment", "taskhub")
    pod = deployment["spec"]["template"]["spec"]
    hub = container(deployment)
    assert deployment["spec"]["replicas"] == 2
    assert hub["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert hub["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"cpu", "memory"} <= set(hub["resources"]["requests"])
    assert "memory" in hub["resources"]["limits"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert str(pod["securityContext"]["runAsUser"]) == dict(final_stage())["USER"].split(":")[0]
    assert hub["securityContext"]["readOnlyRootFilesystem"] is True
    assert hub["securityContext"]["allowPrivilegeEscalation"] is False
    env = {e["name"]: e for e in hub["env"]}
    assert set(env) <= serve_option_variables()
    for secret in ("TASKHUB_JWT_SECRET", "TASKHUB_NATS_PASSWORD"):
        assert "secretKeyRef" in env[secret]["valueFrom"]
    assert env["TASKHUB_NATS_USER"]["value"] == "hub"
    nats_host = urlsplit(env["TASKHUB_NATS_URL"]["value"]).hostname
    assert k8s_object("Service", str(nats_host))["spec"]["selector"] == {
        "app.kubernetes.io/name": "nats"
    }
    # listen streams' goodbye, then uvicorn's graceful stop, then the NATS drain
    shutdown = Config().shutdown_grace + int(Config().shutdown_grace) + 1
    assert pod["terminationGracePeriodSeconds"] > shutdown


def test_k8s_hub_service_pdb_and_autoscaler() -> None:
    deployment = k8s_object("Deployment", "taskhub")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = k8s_object("Service", "taskhub")
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"] for p in container(deployment)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    pdb = k8s_object("PodDisruptionBudget", "taskhub")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = k8s_object("HorizontalPodAutoscaler", "taskhub")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "taskhub",
    }
    assert hpa["spec"]["minReplicas"] >= 2
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]


def test_k8s_nats_statefulset() -> None:
    statefulset = k8s_object("StatefulSet", "nats")
    headless = k8s_object("Service", statefulset["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert statefulset["spec"]["replicas"] == 3
    node = container(statefulset)
    env = {e["name"]: e for e in node["env"]}
    required = set().union(*(nats_conf_variables(p) for p in NATS_CONFIGS))
    assert required <= set(env)
    for ordinal in range(3):
        route = urlsplit(env[f"NATS_ROUTE_{ordinal + 1}"]["value"])
        assert route.hostname == f"nats-{ordinal}.{headless['metadata']['name']}"
    volumes = statefulset["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": "nats-config"}} in volumes
    assert statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    pdb = k8s_object("PodDisruptionBudget", "nats")
    assert pdb["spec"]["maxUnavailable"] == 1
