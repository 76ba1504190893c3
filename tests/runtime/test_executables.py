"""Compiled programs kept beside the checkpoints: a restart loads them instead of tracing and
compiling; anything that changes the program, or a file that does not load, compiles anew."""

import json
import logging
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from jax.experimental.compilation_cache import compilation_cache

from evokube_trainer.runtime.executables import ExecutableStore, build_time, fingerprint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def no_shared_compilation_cache():
    """These tests compile and keep programs themselves: the suite's shared XLA cache
    (tests/conftest.py) would serve them instead, and a served program is not kept."""
    shared = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    compilation_cache.reset_cache()
    yield
    jax.config.update("jax_compilation_cache_dir", shared)
    compilation_cache.reset_cache()


def _traced_twice():
    """A jitted function and the list its tracing appends to."""
    traces = []

    def double(x):
        traces.append(1)
        return 2 * x

    return jax.jit(double), traces


def test_a_second_store_loads_the_program_without_tracing(tmp_path):
    x = jnp.arange(4.0)
    first, traces = _traced_twice()
    np.testing.assert_array_equal(ExecutableStore(tmp_path, "a").compiled("f", first, x)(x), 2 * x)
    assert len(traces) == 1 and len(list(tmp_path.iterdir())) == 1

    again, traces = _traced_twice()
    loaded = ExecutableStore(tmp_path, "a").compiled("f", again, x)
    np.testing.assert_array_equal(loaded(x), 2 * x)
    assert traces == []  # loaded: nothing traced, lowered or compiled


def test_another_fingerprint_or_argument_shape_compiles_anew(tmp_path):
    x = jnp.arange(4.0)
    fn, traces = _traced_twice()
    ExecutableStore(tmp_path, "a").compiled("f", fn, x)
    fn, traces = _traced_twice()
    ExecutableStore(tmp_path, "b").compiled("f", fn, x)  # another configuration or code
    ExecutableStore(tmp_path, "a").compiled("f", fn, jnp.arange(5.0))  # another shape
    assert len(traces) == 2 and len(list(tmp_path.iterdir())) == 3


def test_a_program_read_from_the_xla_cache_is_not_written_since_it_would_not_run(tmp_path, caplog):
    """Another fingerprint (a new image, the same program) compiles through JAX's persistent
    cache; such an executable serializes without its object code on CPU (it loads, then fails
    when called), so it is not kept, and the next life reads the cache again."""
    x = jnp.arange(4.0)
    compilation_cache.set_cache_dir(str(tmp_path / "xla"))
    compilation_cache.reset_cache()
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    try:
        fn, _ = _traced_twice()
        ExecutableStore(tmp_path / "a", "a").compiled("f", fn, x)  # compiled: kept
        fn, _ = _traced_twice()
        with caplog.at_level(logging.INFO):
            compiled = ExecutableStore(tmp_path / "b", "b").compiled("f", fn, x)
        np.testing.assert_array_equal(compiled(x), 2 * x)
    finally:
        jax.config.update("jax_compilation_cache_dir", None)
    assert len(list((tmp_path / "a").iterdir())) == 1
    assert not (tmp_path / "b").exists() and "came from the XLA cache" in caplog.text


def test_a_preloaded_program_is_used_only_for_arguments_of_its_signature(tmp_path, caplog):
    x = jnp.arange(4.0)
    fn, _ = _traced_twice()
    ExecutableStore(tmp_path, "a").compiled("f", fn, x)

    store = ExecutableStore(tmp_path, "a")
    store.preload("f", "g")  # "g" has no file: nothing to load
    assert list(store._loading) == [path.name for path in tmp_path.iterdir()]
    again, traces = _traced_twice()
    with caplog.at_level(logging.INFO):
        np.testing.assert_array_equal(store.compiled("f", again, x)(x), 2 * x)
    assert traces == [] and "preloaded" in caplog.text and store._loading == {}

    store = ExecutableStore(tmp_path, "a")
    store.preload("f")
    other, traces = _traced_twice()
    y = jnp.arange(5.0)  # another signature than the preloaded file's
    np.testing.assert_array_equal(store.compiled("f", other, y)(y), 2 * y)
    assert len(traces) == 1 and len(list(tmp_path.iterdir())) == 2
    store = ExecutableStore(tmp_path, "a")
    store.preload("f")  # two files of "f": which one the arguments need is not known yet
    assert store._loading == {}


def test_a_torn_file_is_compiled_over_with_a_warning(tmp_path, caplog):
    x = jnp.arange(4.0)
    fn, _ = _traced_twice()
    ExecutableStore(tmp_path, "a").compiled("f", fn, x)
    (path,) = tmp_path.iterdir()
    path.write_bytes(b"half a program")
    fn, traces = _traced_twice()
    with caplog.at_level(logging.WARNING):
        result = ExecutableStore(tmp_path, "a").compiled("f", fn, x)
    np.testing.assert_array_equal(result(x), 2 * x)
    assert len(traces) == 1 and "could not load the compiled program" in caplog.text
    fn, traces = _traced_twice()
    ExecutableStore(tmp_path, "a").compiled("f", fn, x)
    assert traces == []  # the compiled-over file is whole again


def test_build_time_counts_what_the_block_traced_and_compiled():
    def double(x):
        return x * 2

    jitted = jax.jit(double)
    with build_time() as first:
        jax.block_until_ready(jitted(jnp.ones(7)))
    with build_time() as again:  # the same shapes: neither traced nor compiled again
        jax.block_until_ready(jitted(jnp.ones(7)))
    assert first["traced"] > 0 and first["compiled"] > 0, first
    assert again == {"traced": 0.0, "compiled": 0.0}


def test_the_fingerprint_names_the_configuration():
    assert fingerprint({"pop": 8}) == fingerprint({"pop": 8})
    assert fingerprint({"pop": 8}) != fingerprint({"pop": 16})


def test_a_resumed_run_loads_its_programs_and_trains_as_one_run(tmp_path):
    """`evokube run` stopped after 3 generations and resumed to 6 loads `steps` (the
    evaluation inside it), and its history equals that of one run of 6 generations."""
    manifest = {
        "apiVersion": "evokube.io/v1alpha1",
        "kind": "ERLExperiment",
        "metadata": {"name": "stored"},
        "spec": {
            "image": "ghcr.io/evokube/trainer-cpu:0.1.0",
            "algorithm": {"name": "openes"},
            "environment": {"name": "gymnax/Pendulum-v1", "episodeLength": 20},
            "policy": {"hiddenLayers": [8]},
            "population": {"size": 8},
            "stopping": {"maxGenerations": 3},
            "evaluation": {"episodes": 2, "intervalGenerations": 2},
            "checkpoint": {"intervalGenerations": 3},
        },
    }

    def run(runs_dir, generations):
        manifest["spec"]["stopping"]["maxGenerations"] = generations
        path = tmp_path / "experiment.yaml"
        path.write_text(yaml.safe_dump(manifest))
        command = [sys.executable, "-m", "evokube_trainer.laptop.cli", "run", str(path)]
        subprocess.run(
            [*command, "--runs-dir", str(runs_dir)],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        return runs_dir / "stored"

    def history(run_dir):
        lines = (run_dir / "history.jsonl").read_text().splitlines()
        keep = ("generation", "ec/fitness_mean", "ec/fitness_max", "eval/return_mean")
        return [
            {k: v for k, v in json.loads(line)["metrics"].items() if k in keep} for line in lines
        ]

    resumed = run(tmp_path / "resumed", 3)
    # One program: the evaluation runs inside the generations' chunks.
    assert sorted(p.name.split("-")[0] for p in (resumed / "executables").iterdir()) == ["steps"]
    run(tmp_path / "resumed", 6)
    log = (resumed / "logs" / "process-0.log").read_text()
    assert "loaded the compiled steps" in log
    assert log.count("preloaded; waited") == 1, log  # loaded while the state was built
    # A warm start says where its seconds went before the programs (issue 23's restarts).
    assert re.search(r"open [\d.]+ s after the process started", log), log
    assert re.search(r"started in [\d.]+ s: .* checkpoint restored [\d.]+ s", log), log
    assert history(resumed) == history(run(tmp_path / "whole", 6))
    # A first start says how much of its state's init was building the init program.
    first = (tmp_path / "whole" / "stored" / "logs" / "process-0.log").read_text()
    assert re.search(
        r"state initialized [\d.]+ s \(its program traced in [\d.]+ s, compiled in [\d.]+ s\)",
        first,
    ), first
