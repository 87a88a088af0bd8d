"""deploy/ checked offline: every file parses, agrees with the code, and passes the tools.

Each tool judges its files when it is installed and needs no daemon or cluster (`docker
compose config`, `nginx -t`, `kubectl kustomize`, `nats-server -t`); without it, that one
check is skipped with the reason. This module keeps the inventory (every file has a check)
and the readers of deploy/ files; the checks live in test_deploy_*.py, one per part.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from hub.options import add_serve_options

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
ENV_EXAMPLE = DEPLOY / "env.example"
NATS_CONFIGS = sorted((DEPLOY / "nats").glob("*.conf"))
K8S_MANIFESTS = sorted(p for p in (DEPLOY / "k8s").glob("*.yaml") if p.name != "kustomization.yaml")

# Every file under deploy/ and the test that checks it: a new file needs a check.
CHECKED = {
    "README.md": "test_readme_names_every_file",
    "Dockerfile": "test_dockerfile_*",
    "Dockerfile.dockerignore": "test_dockerignore_sends_what_the_build_copies",
    "docker-compose.yml": "test_compose_*",
    "env.example": "test_env_example_defines_every_variable",
    "router/nginx.conf": "test_router_*",
    "nats/cluster.conf": "test_nats_*",
    "nats/accounts.conf": "test_nats_* and tests/e2e/test_nats_permissions.py",
    "prometheus/prometheus.yml": "test_prometheus_configs",
    "prometheus/prometheus-kubernetes.yml": "test_prometheus_configs",
    "prometheus/alerts.yml": "test_alert_rules",
    "grafana/taskhub-dashboard.json": "test_dashboard_*",
    **{f"k8s/{p.name}": "test_k8s_*" for p in K8S_MANIFESTS},
    "k8s/kustomization.yaml": "test_k8s_kustomization_*",
}


# -- readers shared by the test_deploy_*.py modules ------------------------------------


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_objects() -> list[dict[str, Any]]:
    return [doc for path in K8S_MANIFESTS for doc in load_yaml_docs(path)]


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [o for o in k8s_objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def env_example(include_commented: bool = False) -> dict[str, str]:
    """KEY=VALUE lines of deploy/env.example (and `# KEY=VALUE` ones, if asked)."""
    pattern = r"^(#\s*)?([A-Z][A-Z0-9_]*)=(.*)$"
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = re.match(pattern, line.strip())
        if match and (include_commented or not match.group(1)):
            values[match.group(2)] = match.group(3)
    return values


def nats_conf_variables(path: Path) -> set[str]:
    """Variables a NATS config takes from the environment: referenced, not defined."""
    text = re.sub(r'"[^"]*"', '""', path.read_text())  # "$JS.API..." is not a variable
    text = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    referenced = set(re.findall(r"\$([A-Za-z_][A-Za-z0-9_]*)", text))
    defined = set(re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=", text, re.MULTILINE))
    return referenced - defined


def serve_option_variables() -> set[str]:
    """Every TASKHUB_* variable `taskhub serve` reads."""
    parser = argparse.ArgumentParser()
    add_serve_options(parser, {})
    return {
        "TASKHUB_" + option[2:].upper().replace("-", "_")
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    instructions = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, args = line.partition(" ")
            instructions.append((keyword.upper(), args.strip()))
    return instructions


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def hub_services(services: dict[str, Any]) -> dict[str, Any]:
    return {
        n: s
        for n, s in services.items()
        if s.get("build", {}).get("dockerfile") == "deploy/Dockerfile" and "entrypoint" not in s
    }


# -- every file ------------------------------------------------------------------------


def test_every_deploy_file_is_checked() -> None:
    files = {str(p.relative_to(DEPLOY)) for p in DEPLOY.rglob("*") if p.is_file()}
    files = {f for f in files if "__pycache__" not in f and f != ".env"}  # a local secret
    assert files == set(CHECKED)


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(DEPLOY.rglob("*")) if p.suffix in (".yml", ".yaml")],
    ids=lambda p: str(p.relative_to(DEPLOY)),
)
def test_yaml_parses(path: Path) -> None:
    assert load_yaml_docs(path)


def test_readme_names_every_file() -> None:
    readme = (DEPLOY / "README.md").read_text()
    missing = [name for name in CHECKED if name != "README.md" and name not in readme]
    assert missing == []
