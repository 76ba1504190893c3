"""Reading the process group and the slices from the environment, waiting out the
coordinator's DNS, and opening the devices beside the imports."""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import evokube_contract as contract
from evokube_trainer.laptop import cli, local
from evokube_trainer.laptop.local import process_env
from evokube_trainer.runtime.distributed import ProcessGroup, Slices, wait_for_dns
from tests.runtime.test_multihost import OPENES, experiment

MULTISLICE_EXAMPLE = (
    Path(__file__).resolve().parents[2] / "examples/gke/multislice/tpu-v5e-16x2.yaml"
)


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


def test_slices_come_from_the_megascale_variables():
    assert Slices.from_env({}) == Slices(1, 0)
    env = {"MEGASCALE_NUM_SLICES": "4", "MEGASCALE_SLICE_ID": "3"}
    assert Slices.from_env(env) == Slices(4, 3)


@pytest.mark.parametrize(
    ("count", "index", "message"),
    [("2", "2", "outside"), ("2", "-1", "outside"), ("two", "0", "integers")],
)
def test_inconsistent_slices_are_refused(count, index, message):
    with pytest.raises(ValueError, match=message):
        Slices.from_env({"MEGASCALE_NUM_SLICES": count, "MEGASCALE_SLICE_ID": index})


def test_one_process_cannot_be_two_slices():
    # One process's devices are one slice: the trainer exits 78 before building a mesh.
    with pytest.raises(ValueError, match="do not split into MEGASCALE_NUM_SLICES=2"):
        Slices(2, 0).check()
    Slices(1, 0).check()


def test_evokube_run_numbers_processes_slice_by_slice(tmp_path):
    # As the operator does for a JobSet's pods: the process id within the slice, and the
    # slice; the trainer's group numbers them all, slice by slice.
    doc = experiment("s", algorithm=OPENES, hosts=2, devices=1, generations=1)
    envs = [process_env(doc, tmp_path, 6, i, 1, None, slices=3) for i in range(6)]
    assert [env[contract.ENV_MEGASCALE_SLICE_ID] for env in envs] == list("001122")
    assert [env[contract.ENV_PROCESS_ID] for env in envs] == list("010101")
    assert {env[contract.ENV_MEGASCALE_NUM_SLICES] for env in envs} == {"3"}
    assert [ProcessGroup.from_env(env).process_id for env in envs] == list(range(6))
    assert contract.ENV_MEGASCALE_NUM_SLICES not in process_env(doc, tmp_path, 2, 0, 1, None)


def test_a_multislice_pods_process_id_is_within_its_slice():
    env = {
        "JAX_COORDINATOR_ADDRESS": "h:1",
        "JAX_NUM_PROCESSES": "4",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
    }
    assert ProcessGroup.from_env({**env, "JAX_PROCESS_ID": "1"}).process_id == 3
    with pytest.raises(ValueError, match=r"JAX_PROCESS_ID=2 is outside \[0, 2\) per slice"):
        ProcessGroup.from_env({**env, "JAX_PROCESS_ID": "2"})
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES=3 does not split"):
        ProcessGroup.from_env({**env, "JAX_NUM_PROCESSES": "3", "JAX_PROCESS_ID": "0"})


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


@pytest.mark.parametrize(
    ("flags", "wired"),
    [([], (8, 2)), (["--slices", "1"], (8, 1)), (["--processes", "4", "--slices", "4"], (4, 4))],
)
def test_evokube_run_starts_a_process_per_pod_of_the_manifests_slices(monkeypatch, flags, wired):
    # 2 slices of v5e-16 (topology 4x4, 4 chips per host): 8 pods, so 8 processes in 2 slices.
    started = []
    monkeypatch.setattr(
        local,
        "run_locally",
        lambda doc, processes, slices, runs_root: started.append((processes, slices)) or 0,
    )
    assert cli.main(["run", str(MULTISLICE_EXAMPLE), *flags]) == 0
    assert started == [wired]


def test_evokube_run_refuses_slices_that_do_not_divide_the_processes(capsys):
    assert cli.main(["run", str(MULTISLICE_EXAMPLE), "--slices", "3"]) == 78
    assert "--slices 3 must be at least 1 and divide --processes 8" in capsys.readouterr().err


OPEN_IN_BACKGROUND = """
import threading
from evokube_trainer.runtime import distributed
opener = distributed.open_devices_in_background()
import jax
try:
    print("devices", jax.device_count(), flush=True)
finally:
    opener.join()
    print("threads", threading.active_count())
"""


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"XLA_FLAGS": "--xla_force_host_platform_device_count=3"}, "devices 3"),
        # The thread's failure is the caller's to raise: once, with its traceback, not twice.
        ({"JAX_PLATFORMS": "nosuchplatform"}, "Unable to initialize backend 'nosuchplatform'"),
    ],
)
def test_devices_opened_in_the_background_are_the_callers(env, expected):
    environ = {**os.environ, "JAX_PLATFORMS": "cpu", **env}
    done = subprocess.run(
        [sys.executable, "-c", OPEN_IN_BACKGROUND], env=environ, capture_output=True, text=True
    )
    out = done.stdout + done.stderr
    assert expected in out and "threads 1" in out, out
    assert "Exception in thread" not in out and out.count("Unable to initialize") <= 1, out
