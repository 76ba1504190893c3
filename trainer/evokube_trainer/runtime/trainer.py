"""One trainer process: join the group, resume, run generations, checkpoint, report, exit.

Every process of a multi-host run executes this same loop on its share of the
devices; the jitted generations are one global computation, run in chunks of
about a second (`Workflow.steps`). Decisions that must agree across processes
(stop now, checkpoint now, the next chunk's length) go through one tiny
all-reduce per chunk, so a SIGTERM seen by a single pod still makes the whole
gang save the same checkpoint and exit together.

A SIGTERM is acted on after the running generation, which may not fit the grace
period. So once generations grow long against it (`long_generations`), every
generation is checkpointed as it completes, and a SIGTERM arriving during the
next one ends the process at once: the checkpoint of the last completed
generation is already on disk (docs/trainer-design.md, "SIGTERM during a long
generation").
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import jax
import numpy as np

from evokube_contract import (
    CHECKPOINTS_SUBDIR,
    EXECUTABLES_SUBDIR,
    POLICIES_SUBDIR,
    XLA_CACHE_SUBDIR,
)
from evokube_trainer import __version__
from evokube_trainer import metric_names as names
from evokube_trainer.policies import PolicyExporter, network_config
from evokube_trainer.recorders import Recorder, RecorderBase
from evokube_trainer.runtime import exitcodes, objectstore
from evokube_trainer.runtime.checkpoints import Checkpointer, enable_compilation_cache
from evokube_trainer.runtime.config import RunConfig
from evokube_trainer.runtime.executables import ExecutableStore, build_time, fingerprint
from evokube_trainer.runtime.metrics import TrainerMetrics
from evokube_trainer.runtime.status import SeedProgress, StatusReporter
from evokube_trainer.workflows import (
    ADDED_STATE_LEAVES,
    PBT_HYPERPARAMETERS,
    Evaluation,
    actor_network,
    env_steps_count,
    replica_seed,
    to_environment_spec,
    upgraded,
)

log = logging.getLogger(__name__)

# Why a run stops; the agreed reason is the largest code any process raised.
CONTINUE, STOP_DONE, STOP_PREEMPTED = 0, 1, 2
# Why a process stops when the agreed code is not the one it raised itself.
PEER_REASONS = {
    STOP_PREEMPTED: "a peer was preempted",
    STOP_DONE: "a peer met a stopping criterion",
}
# Signals that checkpoint and exit: SIGTERM from the kubelet, SIGINT from a terminal's Ctrl-C
# (it reaches every process of `evokube run`'s process group, its trainers too).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Generations run in chunks of one dispatch each (`Workflow.learn`), sized so that a chunk takes
# about this long (and at most an eighth of the grace period): short generations (ms on a TPU)
# then cost one host round trip per chunk, not per generation, while a SIGTERM, a stop and
# progress reports still wait at most this long.
CHUNK_SECONDS = 1.0


@dataclass
class StopFlags:
    """Set from signal handlers; read once per generation.

    Python runs a signal handler only between bytecodes of the main thread, which waits
    inside XLA for the whole generation; `during_generation`, when set, is called at once
    from a watcher thread woken through the wakeup fd the C-level handler writes to.
    """

    preempted: bool = False
    signal_name: str = ""  # the stop signal received: SIGTERM (the kubelet), SIGINT (a terminal)
    during_generation: Callable[[], None] | None = None

    def install(self) -> None:
        def on_term(signum, _frame):
            self.signal_name = signal.Signals(signum).name
            log.warning("received %s: checkpointing and exiting", self.signal_name)
            self.preempted = True

        for signum in STOP_SIGNALS:
            signal.signal(signum, on_term)
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._wakeup = (reader, writer)  # keep both ends open for the process's life
        threading.Thread(target=self._watch, args=(reader,), daemon=True, name="sigterm").start()

    def settle(self) -> None:
        """The run's outcome is decided and on disk: a SIGTERM from now on (the pod deleted
        while the process ends, as a peer's preemption stopped it) is ignored. Python's
        shutdown puts a handled SIGTERM back to its default, which would turn the exit code
        into 143; an ignored one stays ignored."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)

    def _watch(self, reader: socket.socket) -> None:
        while True:
            signals = reader.recv(64)
            if set(signals) & set(STOP_SIGNALS) and self.during_generation is not None:
                self.during_generation()


@dataclass
class Outcome:
    exit_code: int
    generation: int
    reason: str


def agree(*local: int) -> tuple[int, ...]:
    """The largest of each value over all processes (one small all-reduce)."""
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils

    values = multihost_utils.process_allgather(np.asarray(local, np.int32))
    return tuple(int(v) for v in np.max(values.reshape(-1, len(local)), axis=0))


def local_stop_code(
    config: RunConfig, metrics: Mapping[str, float], started: float, flags: StopFlags
) -> tuple[int, str]:
    if flags.preempted:
        return STOP_PREEMPTED, f"preempted ({flags.signal_name or 'SIGTERM'})"
    if metrics[names.GENERATION] >= config.generation_limit:
        if config.max_generations:
            return STOP_DONE, f"reached maxGenerations={config.max_generations}"
        return STOP_DONE, f"reached {config.generation_limit} generations, the most a run counts"
    if config.max_env_steps and metrics[names.ENV_STEPS] >= config.max_env_steps:
        return STOP_DONE, f"reached maxEnvSteps={config.max_env_steps}"
    best = metrics.get(names.BEST_FITNESS)
    if config.target_fitness is not None and best is not None and best >= config.target_fitness:
        return STOP_DONE, f"best fitness {best:.4g} reached targetFitness={config.target_fitness}"
    if config.max_wall_clock_s and time.monotonic() - started >= config.max_wall_clock_s:
        return STOP_DONE, f"reached maxWallClockSeconds={config.max_wall_clock_s}"
    return CONTINUE, ""


@dataclass
class _Generations:
    """The per-generation host work `Workflow.learn` calls back into: agree on stopping,
    checkpoint, record metrics, report progress."""

    config: RunConfig
    metrics: TrainerMetrics
    checkpointer: Checkpointer | None
    reporter: StatusReporter | None
    flags: StopFlags
    env_steps: int
    replicas: SeedProgress
    # process 0 with a checkpoint location: one per replica (spec.seeds), in order
    exporters: Sequence[PolicyExporter] = ()
    layout: Mapping[str, object] = field(default_factory=dict)
    pipeline: str | None = None  # the physics pipeline run (status.result names it)
    started: float = field(default_factory=time.monotonic)
    code: int = CONTINUE
    reason: str = ""
    generation: int = 0
    saved: int | None = None  # the newest generation on disk, once this run saved one
    writing: int | None = None  # a save written in the background, until waited for
    save_started: float = 0.0
    save_s: float = 0.0  # how long the last complete save took
    # Generations too long to finish after a SIGTERM: each one is checkpointed, and a
    # SIGTERM during the next ends the process at once.
    long_generations: bool = False
    last_generation_at: float | None = None  # when the previous chunk ended, this life
    next_chunk: int = 1  # generations the next chunk may run, agreed by every process
    lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, generation: int, host: Mapping[str, float]) -> None:
        """A recorder of `Workflow.learn` (the first): every generation's metrics, also those
        inside a chunk, go to Prometheus. A save started after the previous chunk, written in
        the background while this chunk ran, is complete before any of this chunk's
        generations is reported anywhere: no history, progress or status shows a generation
        more than one checkpoint interval past the newest checkpoint on disk."""
        del generation
        if self.writing is not None:
            with self.lock:
                self.checkpointer.wait()
                self._note_finished_save()
        new_steps = host[names.ENV_STEPS] - self.env_steps
        self.env_steps = int(host[names.ENV_STEPS])
        self.metrics.record_generation(host, host[names.STEP_SECONDS], new_steps)
        self.replicas.update(host)
        self.metrics.record_seeds(self.replicas.entries())

    def close(self) -> None:
        pass

    def chunk(self, generation: int) -> int:
        """How many generations may run from `generation` on before the host needs the
        state: never past maxGenerations or a checkpoint that is due; one at a time while
        generations are long; otherwise as many as the agreed `next_chunk`."""
        count = self.next_chunk
        count = min(count, self.config.generation_limit - generation)
        if self.checkpointer is not None:
            interval = self.checkpointer.interval
            count = min(count, interval - generation % interval)
        return max(count, 1)

    def on_evaluation(self, last: Evaluation, best: Evaluation) -> None:
        """Exports each replica's evaluated policies of the chunk (process 0; every process
        ran the evaluations): its best, then its last, in generation order. Host
        `Evaluation`s, with several seeds leading with `[seeds]`."""
        if not self.exporters:
            return
        seeds = len(self.exporters)
        with self.lock:  # a SIGTERM now waits for this export
            for i, exporter in enumerate(self.exporters):
                replica = (lambda x: x) if seeds == 1 else (lambda x, i=i: x[i])
                chosen = {int(replica(e.generation)): e for e in (best, last)}  # one if the same
                for generation, evaluation in sorted(chosen.items()):
                    if generation < 0:  # a replica whose evaluations all returned NaN
                        continue
                    exporter.export(
                        generation,
                        replica(evaluation.policy),
                        jax.tree.map(replica, evaluation.obs_stats),
                        float(replica(evaluation.eval_return)),
                    )

    def on_generation(self, state, host: Mapping[str, float]) -> None:
        with self.lock:  # a SIGTERM now waits for this generation's checkpoint
            self._on_generation(state, host)

    def _note_finished_save(self) -> None:
        """The save this loop started is complete (the caller waited for it): it counts as
        saved, with how long it took (for a background one, up to the end of the chunk it was
        written beside: an overestimate)."""
        self.saved, self.writing = self.writing, None
        self.save_s = time.monotonic() - self.save_started
        self.metrics.record_checkpoint(time.time())

    def _on_generation(self, state, host: Mapping[str, float]) -> None:
        generation = int(host["generation"])
        if not math.isfinite(host.get(names.MEAN_FITNESS, 0.0)):
            raise exitcodes.PermanentError(f"training diverged at generation {generation}")
        code, reason = local_stop_code(self.config, host, self.started, self.flags)
        # Finishing a chunk of generations (with its evaluation) and saving it after a SIGTERM
        # must fit the grace period twice. The first generation of a life includes compilation.
        now = time.monotonic()
        took = now - self.last_generation_at if self.last_generation_at else 0.0
        self.last_generation_at = now
        too_long = 2 * (took + self.save_s) > self.config.grace_s
        per_generation = max(host[names.STEP_SECONDS], 1e-6)
        fits = int(min(CHUNK_SECONDS, self.config.grace_s / 8) / per_generation)
        # One all-reduce agrees on all three; the chunk size as its negation (agree takes the
        # largest), since every process must run the same chunks of the one computation.
        self.code, long_generations, fewest = agree(code, int(too_long), -max(fits, 1))
        self.next_chunk = -fewest
        if long_generations and not self.long_generations:
            log.warning(
                "a generation takes %.1fs and a save %.1fs against a %.1fs grace period: "
                "checkpointing every generation while they stay this long",
                took,
                self.save_s,
                self.config.grace_s,
            )
        self.long_generations = bool(long_generations) and self.checkpointer is not None
        if self.long_generations:
            self.next_chunk = 1
        # The agreed code decides the exit, so the reason is its own: a process that met a
        # stopping criterion in the chunk where a peer was preempted exits as preempted too.
        self.reason = reason if code == self.code else PEER_REASONS.get(self.code, "")
        self.generation = generation
        if self.checkpointer and (
            self.code != CONTINUE or self.long_generations or self.checkpointer.due(generation)
        ):
            # A life's last save, and each one while generations are long (a SIGTERM may end
            # the process right after it), is complete before the loop goes on; the others
            # are written in the background while the next chunk runs.
            complete = self.code != CONTINUE or self.long_generations
            self.save_started = time.monotonic()
            self.checkpointer.save(generation, state, self.layout, wait=complete)
            self.writing = generation
            if complete:
                self._note_finished_save()
        if self.reporter is not None and jax.process_index() == 0:
            self.reporter.report(
                **_progress(host, self.checkpointer), seeds=self.replicas.entries()
            )
            result = self.exporters[0].result() if self.exporters else None
            if result is not None:
                self.reporter.report_result(**result, pipeline=self.pipeline)

    def stop(self, _host: Mapping[str, float]) -> bool:
        return self.code != CONTINUE

    def exit_now_if_saved(self) -> None:
        """From the SIGTERM watcher: with long generations, the last completed one is on
        disk, so end the process now rather than after the running generation (which may
        outlast the grace period). Otherwise the loop saves once this generation ends."""
        with self.lock:
            if not self.long_generations or self.saved != self.generation:
                return
            log.warning(
                "SIGTERM during generation %d: generation %d is checkpointed; exiting now",
                self.generation + 1,
                self.generation,
            )
            for handler in logging.getLogger().handlers:
                handler.flush()
            os._exit(exitcodes.RETRIABLE)


def train(
    config: RunConfig,
    *,
    checkpoint_dir: str | None,
    metrics_port: int | None = None,
    metrics_fd: int | None = None,
    slices: int = 1,
    status_reporter: StatusReporter | None = None,
    recorders: Sequence[Recorder] = (),
    flags: StopFlags | None = None,
) -> Outcome:
    """Run (or resume) the experiment until a stopping criterion or a preemption.

    In a multi-host run, `distributed.initialize` must have been called first (before
    anything touches a JAX backend); every process then calls `train` alike. `slices`: the
    outer axis of the device mesh (`DeviceLayout.over_all_devices`).
    """
    from evokube_trainer.workflows import DeviceLayout, StopAt, jit_workflow, make_workflow

    started = time.perf_counter()
    checkpointer = None
    if checkpoint_dir:
        objectstore.prepare(checkpoint_dir)  # a bucket: its libraries, endpoint and access
        enable_compilation_cache(os.path.join(checkpoint_dir, XLA_CACHE_SUBDIR))
        checkpointer = Checkpointer(
            os.path.join(checkpoint_dir, CHECKPOINTS_SUBDIR),
            interval=config.checkpoint_interval,
            keep=config.checkpoint_keep,
        )
    pipeline, why = choose_pipeline(
        config, checkpointer.newest_record() if checkpointer else None, checkpoint_dir
    )
    config = with_pipeline(config, pipeline)
    log.info(
        "%s/%s: %s on %s%s",
        config.namespace,
        config.name,
        config.spec.get("algorithm", {}).get("name", type(config.workflow).__name__),
        config.workflow.env.name,
        f", physics pipeline {pipeline} ({why})" if pipeline else "",
    )
    for recorder in recorders:
        if isinstance(recorder, RecorderBase):
            recorder.describe_run({"pipeline": pipeline} if pipeline else {})
    metrics = TrainerMetrics(config.name, config.namespace, jax.process_index())
    metrics.describe_run(
        algorithm=type(config.workflow).__name__,
        environment=config.workflow.env.name,
        pipeline=pipeline or "",
        processes=jax.process_count(),
        devices=jax.device_count(),
        slices=slices,
    )
    if metrics_fd is not None:
        metrics.serve_on(metrics_fd)
    elif metrics_port:
        metrics.serve(metrics_port)

    layout = DeviceLayout.over_all_devices(slices) if jax.device_count() > 1 else None
    store = None
    if checkpoint_dir:  # a restart's compiled programs load while the state is built
        store = ExecutableStore(
            os.path.join(checkpoint_dir, EXECUTABLES_SUBDIR), fingerprint(config.workflow)
        )
        store.preload("steps")
    # Set up: the bucket, the metrics, the programs' preload, and the devices where nothing
    # opened them before (the entrypoint logs when it did).
    set_up = time.perf_counter()
    workflow = make_workflow(config.workflow, layout, config.seeds)
    workflow_built = time.perf_counter()
    fns = jit_workflow(workflow, donate=True)  # learn keeps only the newest state
    key = workflow.root_key(config.seed)
    state = restored = None
    record = _layout_record(config, pipeline)
    if checkpointer is not None:
        restored = checkpointer.restore_latest(
            _restore_template(workflow, layout), record, added=ADDED_STATE_LEAVES
        )
        if restored is not None:
            state, generation = upgraded(restored[0]), restored[1]
            log.info("resumed from checkpoint at generation %d", generation)
    building: dict[str, float] = {}
    if state is None:
        with build_time() as building:  # not waited on: its run overlaps what follows
            state = fns.init(key)
    # Where a (warm) start goes before its programs are loaded or compiled (logged apart).
    state_ready = time.perf_counter()
    log.info(
        "started in %.1f s: set-up %.1f s, workflow (envs) %.1f s, %s %.1f s%s",
        state_ready - started,
        set_up - started,
        workflow_built - set_up,
        "checkpoint restored" if restored is not None else "state initialized",
        state_ready - workflow_built,
        " (its program traced in {traced:.1f} s, compiled in {compiled:.1f} s)".format(**building)
        if building
        else "",
    )
    stop_at = StopAt.of(config.max_env_steps, config.target_fitness)
    if store is not None:
        fns = _stored_programs(workflow, fns, state, stop_at, store)

    # With several seeds these are [seeds]: the generation is every replica's, the env steps
    # (as the stopping rules read them) the most any replica took.
    generation, env_steps = int(np.max(state.generation)), int(np.max(env_steps_count(state)))
    if generation >= config.generation_limit or (
        config.max_env_steps and env_steps >= config.max_env_steps
    ):
        return Outcome(exitcodes.SUCCESS, generation, "the checkpoint already met the criteria")
    flags = flags or StopFlags()
    exporters = []
    if checkpoint_dir and jax.process_index() == 0:
        exporters = [
            _policy_exporter(config, workflow, checkpoint_dir, i) for i in range(config.seeds)
        ]
    loop = _Generations(
        config,
        metrics,
        checkpointer,
        status_reporter,
        flags,
        env_steps,
        SeedProgress(config.seed, config.seeds),
        exporters,
        record,
        pipeline,
    )
    flags.during_generation = loop.exit_now_if_saved
    try:
        workflow.learn(
            state,
            stop=loop.stop,
            recorders=(loop, *recorders),
            on_generation=loop.on_generation,
            on_evaluation=loop.on_evaluation,
            eval_every=config.eval_interval,
            jitted=fns,
            chunk=loop.chunk,
            stop_at=stop_at,
        )
    finally:
        if checkpointer:
            checkpointer.close()
        if status_reporter is not None:
            status_reporter.close()
    code = exitcodes.RETRIABLE if loop.code == STOP_PREEMPTED else exitcodes.SUCCESS
    return Outcome(code, loop.generation, loop.reason)


def _stored_programs(workflow, fns, state, stop_at, store: ExecutableStore):
    """`fns` with `steps` compiled ahead of time and kept in the checkpoint location's
    executables/ (runtime/executables.py): a restart loads it instead of tracing, lowering and
    compiling (the cache key alone costs a trace)."""
    arguments = (state, *workflow.chunk_arguments(1, stop_at, 1))
    return dataclasses.replace(fns, steps=store.compiled("steps", fns.steps, *arguments))


def _policy_exporter(
    config: RunConfig, workflow, checkpoint_dir: str, replica: int
) -> PolicyExporter:
    """Process 0's exporter of replica `replica`'s evaluated policies: to `<checkpoint
    dir>/policies` for replica 0 (the one-seed run's place), `policies/seed-<i>` for the
    others."""
    env = workflow.env
    run = config.workflow
    # The Brax pipeline the env really runs, so that a replay anywhere plays the same physics.
    played = dataclasses.replace(run.env, backend=getattr(env.unwrapped, "backend", None))
    metadata = {
        "experiment": {"name": config.name, "namespace": config.namespace},
        "algorithm": config.spec.get("algorithm", {}).get("name", type(run).__name__),
        "environment": to_environment_spec(played),
        "evaluationEpisodes": run.env.eval_episodes,
        "network": network_config(actor_network(run, env.obs_dim, env.action_dim)),
        "seed": replica_seed(config.seed, replica),
        "evokubeVersion": __version__,
    }
    folder = "" if replica == 0 else f"/seed-{replica}"
    return PolicyExporter(
        root=checkpoint_dir.rstrip("/") + "/" + POLICIES_SUBDIR + folder,
        keep=config.checkpoint_keep,
        unflatten=workflow.rollout.unflatten,
        metadata=metadata,
    )


def _layout_record(config: RunConfig, pipeline: str | None) -> dict:
    """What each checkpoint records about the run that wrote it (see `Checkpointer.save`); a
    resumed run keeps its `pipeline` (`choose_pipeline`)."""
    return {
        "spec": dict(config.spec),
        "pipeline": pipeline,
        "processes": jax.process_count(),
        "devices": jax.device_count(),
    }


# What a trainer from before checkpoints recorded their pipeline ran a Brax env on when the spec
# named none, by JAX platform (the fastest pipeline measured there; elsewhere Brax's default).
LEGACY_DEFAULT_PIPELINES = {"tpu": "spring", "cpu": "spring"}


def choose_pipeline(
    config: RunConfig, record: Mapping | None, checkpoint_dir: str | None
) -> tuple[str | None, str]:
    """The physics pipeline this life runs, and why (None and "" for an env without one).

    A spec that names `environment.backend` gets it. Otherwise a resumed run keeps the
    pipeline its checkpoints were trained on (`record`: the newest checkpoint's; None without
    one), whatever today's default says: a checkpoint written before records named it keeps
    what its run exported with its policies, or the default that trainer had on this platform.
    A new run gets Brax's own default for the env, on every platform."""
    from evokube_trainer.envs import default_pipeline

    env = config.workflow.env
    default = default_pipeline(env.name)
    if default is None:
        return None, ""
    if env.backend is not None:
        kept = (record or {}).get("pipeline")
        if kept is not None and kept != env.backend:
            log.warning(
                "the checkpoints were trained on the %s pipeline; spec.environment.backend now "
                "runs %s, different physics: returns before and after do not compare",
                kept,
                env.backend,
            )
        return env.backend, "spec.environment.backend"
    if record is None:
        return default, "Brax's default for this env; spec.environment.backend picks another"
    if record.get("pipeline"):
        return record["pipeline"], "kept from the checkpoints"
    exported = _exported_pipeline(checkpoint_dir)
    if exported is not None:
        return exported, "kept from the policies of a checkpoint that names none"
    legacy = LEGACY_DEFAULT_PIPELINES.get(jax.default_backend(), default)
    return legacy, "an older trainer's default here, for a checkpoint that names none"


def _exported_pipeline(checkpoint_dir: str | None) -> str | None:
    """The pipeline the run's best exported policy was played on, if there is one."""
    from evokube_trainer.policies import read_policy

    if not checkpoint_dir:
        return None
    try:
        artifact = read_policy(checkpoint_dir.rstrip("/") + "/" + POLICIES_SUBDIR + "/best")
    except Exception:  # none exported, or unreadable: the caller falls back
        return None
    return artifact.metadata.get("environment", {}).get("backend")


def with_pipeline(config: RunConfig, pipeline: str | None) -> RunConfig:
    """`config` with its env's pipeline named (so every later reader, the exported policies
    and the compiled programs' fingerprint included, sees the physics that runs)."""
    env = dataclasses.replace(config.workflow.env, backend=pipeline)
    return dataclasses.replace(config, workflow=dataclasses.replace(config.workflow, env=env))


def _restore_template(workflow, layout):
    abstract = workflow.state_shapes()
    if layout is None:
        return abstract
    return jax.tree.map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        abstract,
        workflow.state_shardings(abstract),
    )


def _progress(metrics: Mapping[str, float], checkpointer: Checkpointer | None) -> dict:
    steps = checkpointer.steps() if checkpointer else []
    # pbt: the best member's current hyperparameters, named as in spec.algorithm.pbt
    hyperparameters = {
        field: metrics[f"pbt/best/{name}"]
        for field, name in PBT_HYPERPARAMETERS.items()
        if f"pbt/best/{name}" in metrics
    }
    return {
        "generation": int(metrics[names.GENERATION]),
        "envSteps": int(metrics[names.ENV_STEPS]),
        "bestFitness": _finite(metrics.get(names.BEST_FITNESS)),
        "meanFitness": _finite(metrics.get(names.MEAN_FITNESS)),
        "evalReturn": _finite(metrics.get(names.EVAL_RETURN)),
        "lastCheckpoint": steps[-1] if steps else None,
        "hyperparameters": hyperparameters or None,
    }


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
