"""Reading the process group from the environment, and waiting out the coordinator's DNS."""

import socket
import threading
import time

import pytest

from evokube_trainer.runtime.distributed import ProcessGroup, wait_for_dns


def test_no_coordinator_means_a_single_process():
    assert ProcessGroup.from_env({}) is None


def test_the_group_comes_from_the_operators_variables():
    env = {
        "JAX_COORDINATOR_ADDRESS": "exp-0-0.exp:8476",
        "JAX_NUM_PROCESSES": "4",
        "JAX_PROCESS_ID": "3",
    }
    assert ProcessGroup.from_env(env) == ProcessGroup("exp-0-0.exp:8476", 4, 3)


@pytest.mark.parametrize(
    ("count", "index", "message"),
    [("4", "4", "outside"), ("two", "0", "integers"), ("2", "-1", "outside")],
)
def test_inconsistent_variables_are_refused(count, index, message):
    env = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": count, "JAX_PROCESS_ID": index}
    with pytest.raises(ValueError, match=message):
        ProcessGroup.from_env(env)


def test_waits_until_the_coordinator_name_resolves(monkeypatch):
    real = socket.getaddrinfo
    resolvable = threading.Event()

    def late_dns(host, *args, **kwargs):
        if host == "exp-0-0.exp" and not resolvable.is_set():
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real("127.0.0.1", *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", late_dns)
    threading.Timer(0.5, resolvable.set).start()
    started = time.monotonic()
    wait_for_dns("exp-0-0.exp:8476", timeout_s=10, interval_s=0.05)
    assert time.monotonic() - started >= 0.4


def test_gives_up_with_the_host_named():
    with pytest.raises(TimeoutError, match=r"no-such-host\.invalid"):
        wait_for_dns("no-such-host.invalid:8476", timeout_s=0.3, interval_s=0.1)
