"""What the trainer's entrypoint leaves for the operator when training raises: the exit code
and, in the pod's termination message, the error itself."""

from __future__ import annotations

import pytest

from evokube_contract import ENV_TERMINATION_LOG
from evokube_trainer.runtime import entrypoint, exitcodes


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (
            exitcodes.PermanentError("spec.x is wrong"),
            exitcodes.PERMANENT,
            "permanent failure: spec.x is wrong",
        ),
        (
            exitcodes.RetriableError("disk full"),
            exitcodes.RETRIABLE,
            "retriable failure: disk full",
        ),
        (
            RuntimeError("gloo: connection closed by peer\nat rank 1"),
            exitcodes.RETRIABLE,
            "unexpected failure: RuntimeError: gloo: connection closed by peer\nat rank 1",
        ),
    ],
)
def test_a_failure_exits_with_its_code_and_names_the_error_for_the_operator(
    tmp_path, monkeypatch, error, code, message
):
    reason = tmp_path / "termination-log"
    reason.write_text("")  # the kubelet's file exists in a pod
    monkeypatch.setenv(ENV_TERMINATION_LOG, str(reason))

    def fail(_log):
        raise error

    monkeypatch.setattr(entrypoint, "_run", fail)
    assert entrypoint.main() == code
    assert reason.read_text() == message


def test_outside_a_pod_no_termination_file_is_created(tmp_path, monkeypatch):
    reason = tmp_path / "termination-log"
    monkeypatch.setenv(ENV_TERMINATION_LOG, str(reason))

    def fail(_log):
        raise RuntimeError("boom")

    monkeypatch.setattr(entrypoint, "_run", fail)
    assert entrypoint.main() == exitcodes.RETRIABLE
    assert not reason.exists()
