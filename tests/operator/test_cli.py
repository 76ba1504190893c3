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


def test_leader_election_is_on_by_default_in_the_pods_namespace(monkeypatch):
    monkeypatch.setenv("POD_NAMESPACE", "ops")
    options, _ = parse_args([])
    election = options.leader_election
    assert (election.namespace, election.name) == ("ops", "evokube-operator")
    assert (election.lease_duration, election.renew_deadline, election.retry_period) == (15, 10, 2)


def test_leader_election_flags(monkeypatch):
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    options, _ = parse_args(
        [
            "--leader-election-namespace=evokube",
            "--leader-election-lease-name=team-a",
            "--leader-election-lease-duration=3",
            "--leader-election-renew-deadline=2",
            "--leader-election-retry-period=0.5",
        ]
    )
    election = options.leader_election
    assert (election.namespace, election.name) == ("evokube", "team-a")
    assert (election.lease_duration, election.renew_deadline, election.retry_period) == (3, 2, 0.5)
    assert parse_args(["--no-leader-elect"])[0].leader_election is None


def test_a_renew_deadline_past_the_lease_duration_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--leader-election-lease-duration=5", "--leader-election-renew-deadline=6"])
    assert exit_.value.code == 2
    assert "renew deadline" in capsys.readouterr().err


def test_timeouts_of_pods_that_cannot_start(capsys):
    options, _ = parse_args([])
    assert (options.start_timeouts.image_pull, options.start_timeouts.unschedulable) == (600, 300)
    options, _ = parse_args(
        ["--image-pull-timeout-seconds", "30", "--unschedulable-timeout-seconds", "0"]
    )
    assert (options.start_timeouts.image_pull, options.start_timeouts.unschedulable) == (30, 0)
    with pytest.raises(SystemExit):
        parse_args(["--unschedulable-timeout-seconds", "-1"])


@pytest.mark.parametrize("url", ["gs://team-bucket/evokube", "s3://team.bucket", "gs://b_1/a/b"])
def test_a_default_checkpoint_location_in_a_bucket(url):
    options, _ = parse_args(["--default-checkpoint-location", url])
    assert options.default_checkpoint_location == url
    assert parse_args([])[0].default_checkpoint_location is None


@pytest.mark.parametrize(
    "url",
    ["/checkpoints", "gs://b", "s3://bucket_x/y", "gs://bucket/../x", "gs://bucket/x/", "az://c/x"],
)
def test_a_default_checkpoint_location_the_crd_would_refuse_is_refused(url, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--default-checkpoint-location", url])
    assert exit_.value.code == 2
    assert "--default-checkpoint-location" in capsys.readouterr().err
