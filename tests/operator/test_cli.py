"""The evokube-operator command line."""

import pytest

from evokube_operator.cli import parse_args


def test_defaults_watch_every_namespace_with_metrics_on_8080():
    options, _ = parse_args([])
    assert options.kubeconfig is None
    assert options.namespaces == ()
    assert options.metrics_port == 8080
    assert options.workers == 8


def test_kubeconfig_namespaces_and_ports():
    options, _ = parse_args(
        [
            "--kubeconfig",
            "/k",
            "-n",
            "a",
            "--namespace",
            "b",
            "--metrics-port",
            "0",
            "--workers",
            "2",
        ]
    )
    assert (options.kubeconfig, options.namespaces) == ("/k", ("a", "b"))
    assert (options.metrics_port, options.workers) == (0, 2)


@pytest.mark.parametrize("argv", [["--workers", "0"], ["--metrics-port", "70000"], ["--bogus"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
