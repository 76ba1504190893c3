"""Join the multi-host jax.distributed group described by the environment.

The operator sets JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
JAX_PROCESS_ID on every pod (`evokube run` does the same for local
processes). In a multislice gang JAX_PROCESS_ID is the host's index within
its slice (a pod's downward API gives no sum); the group's id adds the slice's
offset (`global_process_id`). jax reads only the address itself, so the count and id are passed
explicitly. On Cloud TPU without these variables, JAX auto-detects the slice.
A multislice gang also has MEGASCALE_NUM_SLICES and MEGASCALE_SLICE_ID
(`Slices`): the slices are the outer axis of the device mesh.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from evokube_contract import (
    ENV_COORDINATOR,
    ENV_MEGASCALE_NUM_SLICES,
    ENV_MEGASCALE_SLICE_ID,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    ENV_TPU_WORKER_HOSTNAMES,
    global_process_id,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessGroup:
    coordinator_address: str  # host:port of process 0
    num_processes: int
    process_id: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> ProcessGroup | None:
        """The group the environment describes, or None for a single process."""
        address = env.get(ENV_COORDINATOR)
        if not address:
            return None
        try:
            count = int(env.get(ENV_NUM_PROCESSES, "1"))
            index = int(env.get(ENV_PROCESS_ID, "0"))
        except ValueError as err:
            names = f"{ENV_NUM_PROCESSES}/{ENV_PROCESS_ID}"
            raise ValueError(f"{names} must be integers: {err}") from None
        slices = Slices.from_env(env)
        if count % slices.count:
            raise ValueError(
                f"{ENV_NUM_PROCESSES}={count} does not split into "
                f"{ENV_MEGASCALE_NUM_SLICES}={slices.count} equal slices"
            )
        per_slice = count // slices.count
        if not 0 <= index < per_slice:
            within = " per slice" if slices.count > 1 else ""
            raise ValueError(f"{ENV_PROCESS_ID}={index} is outside [0, {per_slice}){within}")
        return cls(address, count, global_process_id(index, slices.index, count, slices.count))


@dataclass(frozen=True)
class Slices:
    count: int  # slices of the gang; 1 without MEGASCALE_NUM_SLICES
    index: int  # this process's slice

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Slices:
        try:
            count = int(env.get(ENV_MEGASCALE_NUM_SLICES) or "1")
            index = int(env.get(ENV_MEGASCALE_SLICE_ID) or "0")
        except ValueError as err:
            names = f"{ENV_MEGASCALE_NUM_SLICES}/{ENV_MEGASCALE_SLICE_ID}"
            raise ValueError(f"{names} must be integers: {err}") from None
        if not 0 <= index < count:
            raise ValueError(
                f"{ENV_MEGASCALE_SLICE_ID}={index} is outside "
                f"[0, {ENV_MEGASCALE_NUM_SLICES}={count})"
            )
        return cls(count, index)

    def check(self) -> None:
        """ValueError unless this process's devices are in slice `index`: a gang numbered
        otherwise would put members on the wrong side of the slow link, or hang."""
        import jax

        from evokube_trainer.workflows import slice_index

        if jax.process_count() % self.count:
            raise ValueError(
                f"{jax.process_count()} processes do not split into "
                f"{ENV_MEGASCALE_NUM_SLICES}={self.count} equal slices"
            )
        found = {slice_index(d, self.count) for d in jax.local_devices()}
        if found != {self.index}:
            raise ValueError(
                f"{ENV_MEGASCALE_SLICE_ID}={self.index}, but process {jax.process_index()}'s "
                f"devices are in slice(s) {sorted(found)}"
            )
        log.info("process %d is in slice %d of %d", jax.process_index(), self.index, self.count)


def wait_for_dns(address: str, timeout_s: float, interval_s: float = 1.0) -> None:
    """Wait until the coordinator's host name resolves.

    Pod 0's name under the headless Service appears in DNS only once that pod
    is running, and workers often start first; a failed lookup would otherwise
    end the whole gang.
    """
    host = address.rsplit(":", 1)[0]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.getaddrinfo(host, None)
            return
        except socket.gaierror as err:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"coordinator host {host!r} did not resolve within {timeout_s:.0f}s: {err}"
                ) from None
            log.info("waiting for coordinator %s to resolve (%s)", host, err)
            time.sleep(interval_s)


def initialize(
    group: ProcessGroup | None,
    *,
    initialization_timeout_s: int = 300,
    heartbeat_timeout_s: int = 100,
) -> None:
    """Join the group; without one, auto-detect a multi-host TPU slice, else do nothing."""
    import jax

    if group is None:
        if os.environ.get(ENV_TPU_WORKER_HOSTNAMES, "").count(",") > 0:
            # A multi-host Cloud TPU slice without our variables: JAX finds its peers.
            jax.distributed.initialize(
                initialization_timeout=initialization_timeout_s,
                heartbeat_timeout_seconds=heartbeat_timeout_s,
            )
        return
    wait_for_dns(group.coordinator_address, initialization_timeout_s)
    jax.distributed.initialize(
        coordinator_address=group.coordinator_address,
        num_processes=group.num_processes,
        process_id=group.process_id,
        initialization_timeout=initialization_timeout_s,
        heartbeat_timeout_seconds=heartbeat_timeout_s,
    )
    # No device count here: that would open the devices now (see `open_devices_in_background`).
    log.info("process %d/%d joined", group.process_id, group.num_processes)


def open_devices_in_background() -> threading.Thread:
    """Open this process's JAX devices in a thread while the caller goes on importing the
    trainer (JAX's libraries, Brax, MuJoCo, Flax, Orbax). A TPU's start-up (libtpu) takes
    seconds, and so do those imports: side by side, a restart reaches its first generation
    sooner. The first use of JAX in another thread waits for this one (JAX opens its backends
    under a lock); a failure is left for that use to raise again, where it is handled. Call
    after `initialize`, and join the thread before the process exits: a thread still inside
    the TPU's start-up when the interpreter shuts down can abort the process."""
    import jax

    def open_devices() -> None:
        try:
            jax.devices()
        except Exception as err:  # raised again by the caller's own first use of JAX
            log.debug("opening the devices in the background failed: %s", err)

    opener = threading.Thread(target=open_devices, name="open-devices", daemon=True)
    opener.start()
    return opener
