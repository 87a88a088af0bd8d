"""Configuration from flags and TASKHUB_* variables (contract 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hub.config import Config
from hub.options import config_from_args


def test_defaults_match_the_contract() -> None:
    config = config_from_args([], env={})
    assert config == Config()
    assert (config.host, config.port, config.nats_url, config.bucket) == (
        "127.0.0.1",
        8080,
        None,
        "mcp-tasks",
    )
    assert (config.replicas, config.data_dir, config.keepalive) == (1, Path(".taskhub"), 15.0)


def test_every_option_reads_its_environment_variable() -> None:
    env = {
        "TASKHUB_HOST": "localhost",
        "TASKHUB_PORT": "9000",
        "TASKHUB_NATS_URL": "nats://127.0.0.1:4333",
        "TASKHUB_BUCKET": "other",
        "TASKHUB_REPLICAS": "3",
        "TASKHUB_DATA_DIR": "/tmp/x",
        "TASKHUB_KEEPALIVE": "2.5",
        "TASKHUB_LOG_LEVEL": "DEBUG",
    }
    config = config_from_args([], env=env)
    assert config == Config(
        host="localhost",
        port=9000,
        nats_url="nats://127.0.0.1:4333",
        bucket="other",
        replicas=3,
        data_dir=Path("/tmp/x"),
        keepalive=2.5,
        log_level="debug",
    )


def test_flags_override_the_environment() -> None:
    config = config_from_args(["--port", "9100", "--bucket", "b2"], env={"TASKHUB_PORT": "9000"})
    assert (config.port, config.bucket) == (9100, "b2")


@pytest.mark.parametrize(
    "argv",
    [
        ["--port", "70000"],
        ["--port", "x"],
        ["--replicas", "0"],
        ["--keepalive", "0"],
        ["--log-level", "loud"],
    ],
)
def test_bad_values_are_refused_with_a_message(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        config_from_args(argv, env={})
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_non_loopback_without_auth_needs_an_explicit_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        config_from_args(["--host", "0.0.0.0"], env={})
    assert "--insecure-no-auth" in capsys.readouterr().err
    config = config_from_args(["--host", "0.0.0.0", "--insecure-no-auth"], env={})
    assert config.insecure_no_auth and not config.is_loopback
    assert config_from_args(["--host", "0.0.0.0"], env={"TASKHUB_INSECURE_NO_AUTH": "1"})


def test_the_readme_documents_every_option() -> None:
    from hub.options import _OPTIONS

    readme = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    for flag, _, help in _OPTIONS:
        env = "TASKHUB_" + flag.upper().replace("-", "_")
        assert f"| `--{flag}` | `{env}` |" in readme and help in readme, flag


def test_upstreams_come_from_repeated_flags_or_the_environment() -> None:
    from hub.front_door.upstream import UpstreamSpec

    config = config_from_args(
        ["--upstream", "http://a:1/mcp", "--upstream", "b=http://b/mcp,c=https://c/mcp?x=1"],
        env={"TASKHUB_UPSTREAM": "ignored=http://z/mcp"},
    )
    assert config.upstreams == (
        UpstreamSpec(None, "http://a:1/mcp"),
        UpstreamSpec("b", "http://b/mcp"),
        UpstreamSpec("c", "https://c/mcp?x=1"),
    )
    assert [spec.path for spec in config.upstreams] == ["/mcp", "/servers/b/mcp", "/servers/c/mcp"]
    from_env = config_from_args([], env={"TASKHUB_UPSTREAM": "a=http://a/mcp, http://d/mcp"})
    assert [(s.name, s.url) for s in from_env.upstreams] == [
        ("a", "http://a/mcp"),
        (None, "http://d/mcp"),
    ]
    assert config_from_args([], env={}).upstreams == ()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--upstream", "ftp://a/mcp"], "is not an http(s) URL"),
        (["--upstream", "a.b=http://a/mcp"], "upstream name 'a.b'"),
        (["--upstream", "default=http://a/mcp"], "upstream name 'default'"),
        (["--upstream", "http://a/mcp", "--upstream", "http://b/mcp"], "served at /mcp"),
        (["--upstream", "x=http://a/mcp,x=http://b/mcp"], "served at /servers/x/mcp"),
        (["--resource-rule", "nomodule"], "expected MODULE:NAME"),
        (["--resource-rule", "hub.no_such_module:rule"], "resource rule"),
        (["--resource-rule", "hub.config:LOOPBACK_HOSTS"], "is not callable"),
    ],
)
def test_bad_upstreams_and_resource_rules_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        config_from_args(argv, env={})
    assert message in capsys.readouterr().err


def test_the_edge_limits_come_from_flags_and_the_environment() -> None:
    from hub.http.head_limits import HeadLimits

    assert Config().head_limits == HeadLimits(target=8192, field=8192, fields=100, head=32768)
    config = config_from_args(
        ["--max-head-bytes", "4096", "--max-fields", "20", "--trusted-proxy", "10.0.0.0/8"],
        env={"TASKHUB_MAX_FIELD_BYTES": "512", "TASKHUB_PUBLIC_METRICS": "1"},
    )
    assert config.head_limits == HeadLimits(target=8192, field=512, fields=20, head=4096)
    assert [str(n) for n in config.trusted_proxies] == ["10.0.0.0/8"]
    assert config.public_metrics and not Config().public_metrics
    for bad in (["--max-head-bytes", "0"], ["--trusted-proxy", "not-an-address"]):
        with pytest.raises(SystemExit):
            config_from_args(bad, env={})
