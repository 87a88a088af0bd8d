"""deploy/Dockerfile and docker-compose.yml: a multi-stage image built from the hash-checked
lock that runs unprivileged with a live healthcheck, and a compose cluster whose every
variable env.example documents. The lock itself is checked against pyproject.toml offline."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from typing import Any
from urllib.parse import urlsplit

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers import HubHarness, free_port
from tests.test_deploy import (
    COMPOSE,
    DEPLOY,
    ENV_EXAMPLE,
    ROOT,
    compose,
    dockerfile_instructions,
    env_example,
    final_stage,
    hub_services,
    nats_conf_variables,
    serve_option_variables,
)

# -- the image -------------------------------------------------------------------------


LOCK = ROOT / "requirements.lock"


def test_dockerfile_is_multi_stage() -> None:
    instructions = dockerfile_instructions()
    froms = [args for keyword, args in instructions if keyword == "FROM"]
    assert len(froms) >= 2 and froms[0].endswith("AS builder")
    assert ("ARG", "PYTHON_IMAGE=python:3.11-slim") in instructions
    assert froms[-1] == "${PYTHON_IMAGE}"
    assert any(k == "COPY" and a.startswith("--from=builder") for k, a in final_stage())


def builder_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    froms = [i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM"]
    return instructions[froms[0] : froms[1]]


def test_dockerfile_installs_the_lock_then_the_project_alone() -> None:
    """Every dependency comes from requirements.lock, hash-checked; the project adds none."""
    stage = builder_stage()
    commands = [
        command.strip()
        for keyword, args in stage
        if keyword == "RUN"
        for command in args.split("&&")
    ]
    assert "python -m venv /opt/taskhub" in commands
    lock = commands.index("/opt/taskhub/bin/pip install --require-hashes -r requirements.lock")
    project = commands.index("/opt/taskhub/bin/pip install --no-deps .")
    assert commands.index("python -m venv /opt/taskhub") < lock < project
    assert commands[project + 1] == "/opt/taskhub/bin/pip check"  # the lock covers the project
    # No other install could slip an unlocked package in.
    installs = [c for c in commands if " install " in f"{c} "]
    assert len(installs) == 2, installs
    # The lock is copied before the sources, so its layer survives code changes.
    copies = [args.split()[0] for keyword, args in stage if keyword == "COPY"]
    assert copies[0] == "requirements.lock" and "hub" in copies and "bridge" in copies


def locked() -> dict[str, Requirement]:
    """requirements.lock's pins by canonical name (continuation and hash lines skipped)."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            requirement = Requirement(line.removesuffix("\\").strip())
            pins[canonicalize_name(requirement.name)] = requirement
    return pins


def runtime_dependencies() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in project["dependencies"]]


def test_the_lock_pins_every_runtime_dependency_within_its_range() -> None:
    """pyproject.toml and requirements.lock agree: re-lock after changing a dependency."""
    pins = locked()
    for dependency in runtime_dependencies():
        pin = pins.get(canonicalize_name(dependency.name))
        assert pin is not None, f"{dependency.name} is not in requirements.lock"
        (specifier,) = pin.specifier
        assert specifier.operator == "==", pin
        assert dependency.specifier.contains(specifier.version, prereleases=True), (
            f"{pin} is outside pyproject.toml's {dependency}"
        )


def test_the_lock_is_hashed_and_says_how_to_refresh_it() -> None:
    text = LOCK.read_text()
    pins = locked()
    entries = re.split(r"\n(?=\S)", text.split("\n", 2)[2].strip())  # one per pin
    assert len(entries) == len(pins) and all("--hash=sha256:" in entry for entry in entries)
    # uv writes the command that made the file; the README gives the same one.
    command = text.splitlines()[1].removeprefix("#").strip()
    assert command.startswith("uv pip compile pyproject.toml ") and "--generate-hashes" in command
    assert "--universal" in command  # one lock for amd64 and arm64 images
    assert command.endswith("-o requirements.lock")
    assert command in (ROOT / "README.md").read_text()


def test_dockerfile_runs_unprivileged_with_a_healthcheck() -> None:
    stage = dict(final_stage())
    user = stage["USER"].split(":")[0]
    assert user not in ("", "root", "0")
    assert stage["EXPOSE"] == "8080"
    assert json.loads(stage["ENTRYPOINT"]) == ["taskhub", "serve"]
    interval, _, command = stage["HEALTHCHECK"].partition("CMD ")
    assert "--interval" in interval
    argv = json.loads(command)
    assert argv[:2] == ["python", "-c"] and "/healthz" in argv[2]
    compile(argv[2], "HEALTHCHECK", "exec")
    env = dict(
        pair.split("=", 1)
        for keyword, args in final_stage()
        if keyword == "ENV"
        for pair in args.split()
    )
    assert env["TASKHUB_HOST"] == "0.0.0.0"
    assert {k for k in env if k.startswith("TASKHUB_")} <= serve_option_variables()


async def test_dockerfile_healthcheck_probes_a_live_hub(hub: HubHarness) -> None:
    argv = json.loads(dict(final_stage())["HEALTHCHECK"].partition("CMD ")[2])
    port = urlsplit(hub.url).port

    async def exit_code(target_port: int | None) -> int:
        env = {**os.environ, "TASKHUB_PORT": str(target_port)}
        process = await asyncio.create_subprocess_exec(sys.executable, *argv[1:], env=env)
        return await asyncio.wait_for(process.wait(), timeout=10)

    assert await exit_code(port) == 0
    assert await exit_code(free_port()) != 0  # nobody listens there


def test_dockerignore_sends_what_the_build_copies() -> None:
    patterns = [
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"  # an allow-list: nothing else reaches the builder
    included = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = {
        source.rstrip("/")
        for keyword, args in dockerfile_instructions()
        if keyword == "COPY" and not args.startswith("--from")
        for source in args.split()[:-1]
    }
    assert copied and copied <= included
    assert all((ROOT / path).exists() for path in copied)


# -- docker compose --------------------------------------------------------------------


def nats_nodes(services: dict[str, Any]) -> dict[str, Any]:
    return {n: s for n, s in services.items() if str(s.get("image", "")).startswith("nats:")}


def test_compose_runs_three_jetstream_nodes() -> None:
    nodes = nats_nodes(compose()["services"])
    assert sorted(nodes) == ["nats-1", "nats-2", "nats-3"]
    for name, node in nodes.items():
        major, minor = (int(x) for x in node["image"].split(":")[1].split("-")[0].split(".")[:2])
        assert (major, minor) >= (2, 11), node["image"]
        assert "--jetstream" in node["command"] or "-js" in node["command"]
        assert any(v.endswith(":/data") for v in node["volumes"]), name
        assert node["environment"]["SERVER_NAME"] == name
        assert nats_conf_variables(DEPLOY / "nats" / "cluster.conf") | nats_conf_variables(
            DEPLOY / "nats" / "accounts.conf"
        ) <= set(node["environment"])
        routes = [node["environment"][f"NATS_ROUTE_{i}"] for i in (1, 2, 3)]
        assert sorted(urlsplit(r).hostname for r in routes) == sorted(nodes)


def test_compose_hubs_use_every_nats_node() -> None:
    services = compose()["services"]
    hubs = hub_services(services)
    assert sorted(hubs) == ["hub-1", "hub-2"]
    assert (ROOT / "deploy" / "Dockerfile").is_file()
    for hub in hubs.values():
        assert (DEPLOY / hub["build"]["context"]).resolve() == ROOT
        env = hub["environment"]
        assert set(env) <= serve_option_variables()
        # nats-py takes a list; the hub splits TASKHUB_NATS_URL on commas (nats_source.py)
        urls = [urlsplit(u.strip()) for u in env["TASKHUB_NATS_URL"].split(",")]
        assert sorted(u.hostname for u in urls) == sorted(nats_nodes(services))
        assert {(u.scheme, u.username, u.port) for u in urls} == {("nats", None, 4222)}
        assert env["TASKHUB_NATS_USER"] == "hub"
        assert env["TASKHUB_NATS_PASSWORD"] == "${NATS_HUB_PASSWORD}"
        # auth is passed through only when set, so an unset secret is never ""
        assert env["TASKHUB_JWT_SECRET"] is None and env["TASKHUB_INSECURE_NO_AUTH"] is None
        assert hub["read_only"] is True


def test_compose_mounts_existing_files() -> None:
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {volume}"


def test_env_example_defines_every_variable() -> None:
    text = COMPOSE.read_text()
    interpolated = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", text))
    passed_through = {
        key
        for service in hub_services(compose()["services"]).values()
        for key, value in service["environment"].items()
        if value is None
    }
    documented = env_example(include_commented=True)
    assert interpolated | passed_through <= set(documented)
    assert set(documented) <= interpolated | passed_through


def compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is None:
        return None
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
    return [docker, "compose"] if probe.returncode == 0 else None


MONITORING = ("--profile", "monitoring")  # validate the opt-in services too


def test_compose_config_is_valid() -> None:
    command = compose_command()
    if command is None:
        pytest.skip("no `docker compose` client here (the check needs no daemon)")
    result = subprocess.run(
        [*command, "--env-file", str(ENV_EXAMPLE), "-f", str(COMPOSE), *MONITORING, "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
