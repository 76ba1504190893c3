"""Compiled generation programs kept beside the checkpoints, so a restart neither traces nor
compiles them.

JAX's persistent compilation cache (`xla-cache/`) spares a restart XLA's compilation, but its
key is a hash of the lowered program: every restart still traces and lowers each jitted
function to find it, which for a Brax env is most of a warm restart (benchmarks/README.md).
Here the compiled executable itself is serialized (`jax.experimental.serialize_executable`)
under a key computed without tracing anything: a fingerprint of everything that decides the
program (the trainer's source files, the versions of the libraries that build it, the run's
workflow configuration, the devices and processes, the jax flags and the XLA/libtpu
environment) and of the arguments' shapes, dtypes and shardings. A restart whose fingerprint
matches loads the executable and calls it at once; anything else (no file, another
fingerprint, a file that does not load) compiles as before and writes the new executable.

One file per program and process (`executables/<name>-<fingerprint>-<signature>-<process>.bin`),
written whole; a process only ever reads the file it wrote itself. A restart starts loading its
files (`ExecutableStore.preload`) before its state exists, beside the environment's build and
the checkpoint's restore; the arguments' signature still decides whether a loaded one is used.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import hashlib
import importlib.metadata
import logging
import os
import pickle
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
from etils import epath
from jax.experimental import serialize_executable

from evokube_contract import ENV_XLA_FLAGS

log = logging.getLogger(__name__)

# Distributions whose code ends up in the compiled programs (those installed are hashed).
LIBRARIES = (
    "jax",
    "jaxlib",
    "libtpu",
    "jax-cuda12-plugin",
    "flax",
    "optax",
    "gymnax",
    "brax",
    "mujoco",
    "mujoco-mjx",
)
# JAX's monitoring events of building a program, by the part of a start-up they measure.
BUILD_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "traced",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "traced",  # lowering
    "/jax/core/compile/backend_compile_duration": "compiled",
}
# Environment variables that change how XLA compiles.
COMPILER_ENVIRONMENT = (ENV_XLA_FLAGS, "LIBTPU_INIT_ARGS", "JAX_ENABLE_X64", "JAX_PLATFORMS")


@functools.cache
def _code_digest() -> str:
    """A digest of every Python file of the trainer package (the code that traces)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def fingerprint(configuration: Any) -> str:
    """What decides the compiled programs besides their arguments: `configuration` (the run's
    workflow config: its repr names every field), the code, library versions, devices,
    processes, jax flags and compiler environment."""
    devices = jax.devices()
    parts = {
        "configuration": repr(configuration),
        "code": _code_digest(),
        "versions": _versions(),
        "devices": [(d.platform, d.device_kind, d.id, d.process_index) for d in devices],
        "platform_version": devices[0].client.platform_version,
        "process": (jax.process_index(), jax.process_count()),
        "flags": {name: repr(jax.config.values[name]) for name in sorted(jax.config.values)},
        "environment": {name: os.environ.get(name) for name in COMPILER_ENVIRONMENT},
    }
    return hashlib.sha256(repr(sorted(parts.items())).encode()).hexdigest()[:24]


def _signature(args: tuple) -> str:
    """The arguments' tree, shapes, dtypes and shardings (what an executable is compiled for)."""

    def describe(leaf):
        sharding = getattr(leaf, "sharding", None)
        return (getattr(leaf, "shape", ()), str(getattr(leaf, "dtype", type(leaf))), repr(sharding))

    leaves, tree = jax.tree.flatten(args)
    return hashlib.sha256(repr((str(tree), [describe(x) for x in leaves])).encode()).hexdigest()[
        :16
    ]


class ExecutableStore:
    """Serialized executables under `directory` (a path or a bucket URL) for one run's
    `fingerprint` (see the module docstring)."""

    def __init__(self, directory: str, fingerprint: str):
        self.directory = epath.Path(directory)
        self.fingerprint = fingerprint
        self._loading: dict[str, concurrent.futures.Future] = {}  # by file name

    def _path(self, name: str, args: tuple) -> epath.Path:
        process = jax.process_index()
        return self.directory / f"{name}-{self.fingerprint}-{_signature(args)}-{process}.bin"

    def preload(self, *names: str) -> None:
        """Start loading each named program's file of this fingerprint in its own thread, for
        `compiled` to take up when its arguments' signature names the same file. A name with
        no file, or with several (arguments of other shapes), is left to `compiled`."""
        process = jax.process_index()
        try:
            found = {
                name: list(self.directory.glob(f"{name}-{self.fingerprint}-*-{process}.bin"))
                for name in names
            }
        except Exception as err:  # an unreadable folder: `compiled` meets it again
            log.warning("could not list the compiled programs in %s: %s", self.directory, err)
            return
        files = [paths[0] for paths in found.values() if len(paths) == 1]
        if not files:
            return
        # Not a `with`: that would wait for the loads here. Its threads end before the
        # interpreter does (concurrent.futures joins them at exit).
        pool = concurrent.futures.ThreadPoolExecutor(len(files), "load-executable")
        for path in files:
            self._loading[path.name] = pool.submit(self._load, path)
        pool.shutdown(wait=False)

    def compiled(self, name: str, jitted: Any, *args: Any) -> Callable:
        """`jitted` compiled for `args` (arrays or ShapeDtypeStructs): loaded when this
        fingerprint's executable is on disk, else traced, compiled and written."""
        path = self._path(name, args)
        started = time.perf_counter()
        loading = self._loading.pop(path.name, None)
        loaded = loading.result() if loading is not None else self._load(path)
        if loaded is not None:
            log.info(
                "loaded the compiled %s from %s (%s %.1f s)",
                name,
                path,
                "preloaded; waited" if loading is not None else "took",
                time.perf_counter() - started,
            )
            return loaded
        started = time.perf_counter()
        lowered = jitted.lower(*args)
        traced = time.perf_counter()
        _listen_to_builds()
        hits = _cache_hits[0]
        compiled = lowered.compile()
        log.info(
            "compiled the %s program: traced and lowered in %.1f s, compiled in %.1f s",
            name,
            traced - started,
            time.perf_counter() - traced,
        )
        if _cache_hits[0] != hits:
            # An executable read from JAX's persistent cache serializes without its object code
            # on CPU (it loads, then fails when called: "Function ... not found"): not kept;
            # the next life reads the persistent cache again.
            log.info("the %s program came from the XLA cache: not written to %s", name, path)
        else:
            self._save(path, compiled)
        return compiled

    def _load(self, path: epath.Path) -> Callable | None:
        try:
            if not path.exists():
                return None
            payload, in_tree, out_tree = pickle.loads(path.read_bytes())
            return serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
        except Exception as err:  # a stale or torn file: compile instead
            log.warning("could not load the compiled program %s (%s); compiling it", path, err)
            return None

    def _save(self, path: epath.Path, compiled: Any) -> None:
        try:
            data = pickle.dumps(serialize_executable.serialize(compiled))
            self.directory.mkdir(parents=True, exist_ok=True)
            partial = path.parent / f".{path.name}.partial"
            partial.write_bytes(data)
            partial.replace(path)  # over a torn file too
        except Exception as err:  # never fail a run for a cache
            log.warning("could not keep the compiled program %s: %s", path, err)


_build_seconds: collections.Counter[str] = collections.Counter()


def _count_build(event: str, duration: float, **_: Any) -> None:
    part = BUILD_EVENTS.get(event)
    if part is not None:
        _build_seconds[part] += duration


_cache_hits = [0]  # executables JAX read from its persistent compilation cache, this process


def _count_cache_hit(event: str, **_: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _cache_hits[0] += 1


@functools.cache
def _listen_to_builds() -> None:
    jax.monitoring.register_event_duration_secs_listener(_count_build)
    jax.monitoring.register_event_listener(_count_cache_hit)


@contextlib.contextmanager
def build_time() -> Iterator[dict[str, float]]:
    """The seconds JAX spent inside the block (in any thread) tracing and lowering programs
    ("traced") and compiling them ("compiled"), filled in when the block ends: how much of a
    call that builds its own program, such as the state's init, was building it."""
    _listen_to_builds()
    before = dict(_build_seconds)
    spent: dict[str, float] = {}
    try:
        yield spent
    finally:
        spent.update(
            {part: _build_seconds[part] - before.get(part, 0.0) for part in ("traced", "compiled")}
        )
