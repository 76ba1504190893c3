"""The one generation loop shared by every algorithm.

`Workflow` is static logic (a frozen dataclass built by `make_workflow` from a config);
`WorkflowState` is the pytree it threads through. One generation is

    population   = optimizer.ask                          # [pop, D]
    (RL learners) learner.improve: gradient steps on the shared replay buffer, may rewrite
                  members of the population (CEM-RL)
    rollouts     = the population plus the learner's extra actors, K episodes each, one vmapped
                  computation; transitions go to the replay buffer
    (RL learners) learner.merge: e.g. RL actors replace the worst members (ERL)
    optimizer.tell(population, fitness)

Pure EC has no learner and no buffer; ERL and CEM-RL differ only in the learner they plug in
(see `_learners.py`) and in the optimizer. PBT has a learner and no optimizer: the population is
empty, the learner's actors are all that is rolled out, and the `ec/fitness_*` metrics
describe them. `step` is pure and jittable as one computation;
`jit_workflow` jits it (callers own the jitted functions, nothing is cached on the object) and
`learn` is the host loop: timing, evaluation, recorders and a per-generation hook for
checkpoints all stay on the host.

Observation normalization (`normalize_observations`): the state carries running statistics of
raw observations (`obs_stats`). Within a generation they are frozen: every policy call (the
population's fitness episodes, the RL actors' episodes, evaluation) sees
`normalize_obs(obs_stats, obs)`, and the learner normalizes its replay batches with them (the
buffer keeps raw observations). At the end of the generation they absorb the raw observations
the population's fitness rollouts acted on, pooled exactly over members, devices and processes:
per-member stats are reduced over the population axis, which a `DeviceLayout` splits over the
devices, so XLA all-reduces them and the result is replicated like the rest of the state. With
a learner, the random warm-up's observations seed them (as in EvoRL's ERL).

Seeds in one program (`seeds` > 1): `init`, `step`, `steps` and `evaluate` are `jax.vmap`s of
one replica's functions over a leading seeds axis of the whole state (`# [seeds, ...]`), so
each replica has its own population, replay buffer, optimizer states and key, and they all run
as one computation. Replica i starts from `root_key(seed)[i]` = `PRNGKey(seed + i)` (the sum
wrapped into 32 bits: `replica_seed`). With one
seed nothing is vmapped and the state has no such axis: the program is the one-replica program.
`steps` stops on the replicas' aggregate (the mean best fitness, the most env steps, any
replica not finite) and `learn` reports the aggregate with each replica's values beside it
(`seed_metrics`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evokube_trainer import metric_names as names
from evokube_trainer.ec import EvoOptimizer
from evokube_trainer.envs import (
    Env,
    RunningStats,
    init_running_stats,
    merge_running_stats,
    reduce_running_stats,
    update_running_stats,
)
from evokube_trainer.recorders import Recorder
from evokube_trainer.replay import ReplayBuffer, ReplayState, Transition
from evokube_trainer.utils import episode_returns_to_fitness
from evokube_trainer.workflows._env_steps import (
    ENV_STEPS_WORD,
    add_member_steps,
    counted_env_steps,
    env_steps_count,
    env_steps_reached,
)
from evokube_trainer.workflows._layout import DeviceLayout
from evokube_trainer.workflows._learners import Learner
from evokube_trainer.workflows._replicas import replica_seed, seed_metrics
from evokube_trainer.workflows._rollout import (
    PopulationRollout,
    flatten_leading,
    random_transitions,
)

Array = jax.Array
Params = Any
Metrics = dict[str, Array]

# The named scopes (`jax.named_scope`) of a generation's parts, in the order `step` runs them
# (and `steps` its evaluation after them);
# a profile's device time is attributed to them by its ops' names (benchmarks/chip_bench.py).
PARTS = ("ask", "rl_update", "rollout", "replay_add", "merge", "tell", "evaluate")
# The most generations one call of `Workflow.steps` runs (`jit_workflow` compiles for it; its
# metrics rows are this long).
CHUNK_CAPACITY = 64
# The row of `Workflow.steps`' metrics that says whether the generation was evaluated.
EVALUATED = "evaluated"


@struct.dataclass
class WorkflowState:
    generation: Array  # [] int32 generations completed
    # Agent steps sampled so far, warm-up included, in two words (ENV_STEPS_WORD): the count
    # is `env_steps_high * ENV_STEPS_WORD + env_steps`; read it with `env_steps_count`.
    env_steps: Array  # [] int32 the count below ENV_STEPS_WORD
    env_steps_high: Array  # [] int32 the count's whole ENV_STEPS_WORDs
    key: Array  # [2] uint32 PRNG key, split once per generation
    ec: Any  # the EC optimizer's state (search distribution or population); None without one
    learner: Any = None  # the RL learner's state; None for pure EC
    replay: ReplayState | None = None  # the shared replay buffer; None for pure EC
    # running stats of raw observations (count [], mean and m2 [obs_dim]); None when off
    obs_stats: RunningStats | None = None


@struct.dataclass
class StopAt:
    """Where `Workflow.steps` ends a run of generations early, on the device: once the env
    steps (warm-up included) reach a threshold, or the best fitness reaches `fitness`. The
    threshold is in two words as the count is (`ENV_STEPS_WORD`), so budgets past 2**31 stop
    where they say: up to 2**61 steps, past the 2**53 the CRD allows."""

    env_steps_high: Array  # [] int32 the threshold's whole ENV_STEPS_WORDs; negative: never
    env_steps: Array  # [] int32 the threshold below ENV_STEPS_WORD
    fitness: Array  # [] float32

    @classmethod
    def of(cls, env_steps: int | None = None, fitness: float | None = None) -> StopAt:
        """Thresholds from optional limits (None: never)."""
        high, low = (-1, 0) if env_steps is None else divmod(int(env_steps), ENV_STEPS_WORD)
        return cls(
            env_steps_high=np.int32(high),
            env_steps=np.int32(low),
            fitness=np.float32(np.inf if fitness is None else fitness),
        )


@struct.dataclass
class Evaluation:
    """One evaluation a chunk of generations ran (`Workflow.steps`): what a policy export
    needs. With several seeds every field leads with `[seeds]`."""

    generation: Array  # [] int32 the generation evaluated; -1: none in the chunk
    eval_return: Array  # [] float32 its mean return
    policy: Array  # [D] the evaluated candidate
    obs_stats: RunningStats | None  # the statistics it was evaluated with; None when off


@dataclasses.dataclass(frozen=True)
class Workflow:
    """One evolutionary (and optionally RL) training loop; see the module docstring.

    Fields:
      optimizer: EC optimizer over flat actor parameters `[D]`; None: the learner's actors
        are the population (PBT).
      rollout: plays the K fitness episodes of each candidate.
      evaluator: plays the evaluation episodes of the candidate policies (`candidates`).
      init_params: key -> actor parameters (one network initialization).
      flatten: actor parameters -> `[D]` (the inverse lives in the rollouts).
      learner: the RL side (`IndependentAgents`, `SharedCritic`), or None for pure EC.
      buffer: the replay buffer the learner samples from (required with a learner).
      warmup_env: batched self-resetting env for the random-policy warm-up.
      warmup_steps_per_env: warm-up scan length; the buffer starts with
        `warmup_steps_per_env * warmup_env.num_envs` random transitions.
      fitness_reduction: how the K episode returns of a member become one fitness.
      layout: how the generation spreads over devices (`DeviceLayout`); None: one device.
      normalize_observations: policies and learners see observations normalized with the
        running statistics in `WorkflowState.obs_stats` (see the module docstring).
      seeds: independent replicas trained as one computation (see the module docstring).
    """

    optimizer: EvoOptimizer | None
    rollout: PopulationRollout
    evaluator: PopulationRollout
    init_params: Callable[[Array], Params]
    flatten: Callable[[Params], Array]
    learner: Learner | None = None
    buffer: ReplayBuffer | None = None
    warmup_env: Env | None = None
    warmup_steps_per_env: int = 0
    fitness_reduction: str = "mean"
    layout: DeviceLayout | None = None
    normalize_observations: bool = False
    seeds: int = 1

    def __post_init__(self):
        if (self.learner is None) != (self.buffer is None):
            raise ValueError("a learner needs a replay buffer and a buffer needs a learner")
        if self.optimizer is None and self.learner is None:
            raise ValueError("a workflow without an EC optimizer needs a learner")

    @property
    def env(self) -> Env:
        return self.rollout.env

    @property
    def num_dims(self) -> int:
        """D, the length of a flat actor."""
        key = jax.ShapeDtypeStruct((2,), jnp.uint32)
        return jax.eval_shape(lambda k: self.flatten(self.init_params(k)), key).shape[0]

    def _replicas(self, fn: Callable) -> Callable:
        """`fn` of one replica, over the seeds axis when there are several."""
        return fn if self.seeds == 1 else jax.vmap(fn)

    # ---- state ---------------------------------------------------------------------------------

    def root_key(self, seed: int) -> Array:
        """`init`'s key for root seed `seed`: `PRNGKey(seed)` `[2]`, or with several seeds each
        replica's `PRNGKey(replica_seed(seed, i))` `[seeds, 2]` (so replica 0 is the one-seed
        run)."""
        if self.seeds == 1:
            return jax.random.PRNGKey(seed)
        keys = [jax.random.PRNGKey(replica_seed(seed, i)) for i in range(self.seeds)]
        return jnp.stack(keys)

    def init(self, key: Array, warm_up: bool = True) -> WorkflowState:
        """The first state of every replica from `root_key(seed)`; see `_init`."""
        return self._replicas(functools.partial(self._init, warm_up=warm_up))(key)

    def _init(self, key: Array, warm_up: bool = True) -> WorkflowState:
        """One replica's first state; with a learner, also fills the buffer with random
        transitions (unless `warm_up` is False: the state is then shaped alike, the buffer
        empty)."""
        key, mean_key, ec_key, pop_key, learner_key, warmup_key = jax.random.split(key, 6)
        ec_state = None
        if self.optimizer is not None:
            mean = self.flatten(self.init_params(mean_key))  # [D]
            ec_state = self.optimizer.init(ec_key, mean)
            # Independent network initializations, for an optimizer keeping a population (GA).
            ec_state = self.optimizer.seed_population(
                ec_state, pop_key, lambda k: self.flatten(self.init_params(k))
            )
        obs_stats = init_running_stats(self.env.obs_dim) if self.normalize_observations else None
        state = WorkflowState(
            generation=jnp.zeros((), jnp.int32),
            env_steps=jnp.zeros((), jnp.int32),
            env_steps_high=jnp.zeros((), jnp.int32),
            key=key,
            ec=ec_state,
            obs_stats=obs_stats,
        )
        if self.learner is None:
            return state
        replay = self.buffer.init(Transition.zeros(self.env.obs_dim, self.env.action_dim))
        if warm_up and self.warmup_env is not None and self.warmup_steps_per_env > 0:
            transitions = random_transitions(self.warmup_env, self.warmup_steps_per_env, warmup_key)
            replay = self.buffer.add(replay, transitions)
            num_random = self.warmup_steps_per_env * self.warmup_env.num_envs
            high, low = divmod(num_random, ENV_STEPS_WORD)
            state = state.replace(
                env_steps_high=jnp.asarray(high, jnp.int32), env_steps=jnp.asarray(low, jnp.int32)
            )
            if obs_stats is not None:  # as EvoRL's ERL: the warm-up seeds the statistics
                state = state.replace(obs_stats=update_running_stats(obs_stats, transitions.obs))
        return state.replace(learner=self.learner.init(learner_key), replay=replay)

    def state_shapes(self) -> WorkflowState:
        """The state's structure, shapes and dtypes (what a checkpoint restore needs), without
        tracing the warm-up's env steps, which fill values only: with Brax that trace took
        seconds of every restart."""
        key = jax.ShapeDtypeStruct(self.root_key(0).shape, jnp.uint32)
        return jax.eval_shape(functools.partial(self.init, warm_up=False), key)

    def state_shardings(self, abstract_state: Any = None) -> Any:
        """The state's shardings on the layout (`DeviceLayout.state_shardings`), for
        `abstract_state` when the caller has traced `state_shapes` already."""
        if abstract_state is None:
            abstract_state = self.state_shapes()
        return self.layout.state_shardings(abstract_state, replicas=self.seeds > 1)

    # ---- one generation ------------------------------------------------------------------------

    def step(self, state: WorkflowState) -> tuple[WorkflowState, Metrics]:
        """One generation of every replica; pure, so `jax.jit(workflow.step)` runs it as one
        computation. Metrics are `[seeds]` with several seeds."""
        return self._replicas(self._step)(state)

    def _step(self, state: WorkflowState) -> tuple[WorkflowState, Metrics]:
        """One replica's generation. Its parts run under the named scopes of `PARTS` (profiles
        attribute device time by them)."""
        key, ask_key, learn_key, rollout_key = jax.random.split(state.key, 4)
        with jax.named_scope("ask"):
            if self.optimizer is not None:
                population, ec_state = self.optimizer.ask(state.ec, ask_key)  # [pop, D]
            else:
                population, ec_state = jnp.zeros((0, self.num_dims), jnp.float32), None
        pop_size = population.shape[0]
        learner_state, replay, metrics = state.learner, state.replay, {}

        noise_std = None  # pure EC: every candidate acts deterministically
        candidates = population
        if self.learner is not None:
            with jax.named_scope("rl_update"):
                learner_state, population, learn_metrics = self.learner.improve(
                    learner_state, replay, population, learn_key, obs_stats=state.obs_stats
                )
            metrics.update(learn_metrics)
            extra, extra_noise = self.learner.actors(learner_state)  # [k, D], [k]
            candidates = jnp.concatenate([population, extra])  # [pop + k, D]
            noise_std = jnp.concatenate([jnp.zeros((pop_size,), jnp.float32), extra_noise])
        if self.layout is not None:
            candidates = self.layout.population(candidates)  # rollouts split over devices
        with jax.named_scope("rollout"):
            result = self.rollout.run(
                candidates,
                noise_std,
                rollout_key,
                collect_transitions=self.learner is not None,
                obs_stats=state.obs_stats,
                collect_obs_stats=state.obs_stats is not None,
            )
        all_fitness = episode_returns_to_fitness(
            result.episode_returns, reduction=self.fitness_reduction
        )  # [pop + k]
        fitness, actor_fitness = all_fitness[:pop_size], all_fitness[pop_size:]

        if self.learner is not None:
            with jax.named_scope("replay_add"):
                transitions = flatten_leading(result.transitions, 3)  # [T * (pop + k) * K, ...]
                replay = self.buffer.add(replay, transitions, result.valid.reshape(-1) > 0)
            merge_key = jax.random.fold_in(learn_key, 1)
            with jax.named_scope("merge"):
                learner_state, population, fitness, merge_metrics = self.learner.merge(
                    learner_state, state.generation, population, fitness, actor_fitness, merge_key
                )
            metrics.update(merge_metrics)
            metrics["replay/size"] = replay.size

        obs_stats = state.obs_stats
        if obs_stats is not None:
            # The population's fitness rollouts only (not the RL actors' unless they are the
            # population, as in PBT), pooled over members.
            pooled = pop_size if self.optimizer is not None else None
            members = jax.tree.map(lambda x: x[:pooled], result.obs_stats)  # [pop]
            obs_stats = merge_running_stats(obs_stats, reduce_running_stats(members))
            metrics.update(_obs_stats_metrics(obs_stats))

        with jax.named_scope("tell"):
            if self.optimizer is not None:
                ec_state, ec_metrics = self.optimizer.tell(ec_state, population, fitness)
            else:  # the learner's actors are the population
                ec_metrics = {
                    "fitness_max": jnp.max(actor_fitness),
                    "fitness_mean": jnp.mean(actor_fitness),
                }
        env_steps_high, env_steps = add_member_steps(
            state.env_steps_high, state.env_steps, result.env_steps
        )
        state = WorkflowState(
            generation=state.generation + 1,
            env_steps=env_steps,
            env_steps_high=env_steps_high,
            key=key,
            ec=ec_state,
            learner=learner_state,
            replay=replay,
            obs_stats=obs_stats,
        )
        metrics.update({"ec/" + name: value for name, value in ec_metrics.items()})
        metrics["rollout/episode_length_mean"] = jnp.mean(
            result.episode_lengths.astype(jnp.float32)
        )
        metrics["generation"] = state.generation
        metrics[names.ENV_STEPS] = state.env_steps  # the low word: `learn` reads both
        metrics["env_steps_high"] = state.env_steps_high
        return state, metrics

    def steps(
        self,
        state: WorkflowState,
        count: Array,
        stop_at: StopAt,
        eval_every: Array,
        *,
        capacity: int,
    ) -> tuple[WorkflowState, Metrics, Array, tuple[Evaluation, Evaluation]]:
        """Up to `count` generations (`count <= capacity`, both counted from here) as one
        computation, so the host dispatches and syncs once for all of them, evaluating the
        deployable policy (`evaluate`) after every generation that `eval_every` divides (0:
        never) inside the same computation. It ends early after a generation that reaches
        `stop_at` or whose mean fitness is not finite, exactly where a host checking every
        generation would stop.

        Returns the last state; each generation's metrics stacked `[capacity]` (`[capacity,
        seeds]` with several seeds; rows past the executed ones are zero), the evaluation's
        among them where `EVALUATED` is true; how many ran `[]`; and two `Evaluation`s, the
        chunk's last and each replica's best by return (generation -1 where none ran), for the
        policy export. With several seeds it stops on their aggregate: the mean best fitness,
        the most env steps of any replica, or any replica's mean fitness not finite. Every
        generation runs through the same loop body whatever `count` is, so how a run is cut
        into calls never changes its numbers."""
        _, shapes = jax.eval_shape(self.step, state)
        eval_shapes, evaluation_shapes = jax.eval_shape(self._evaluations, state)
        shapes = {**shapes, **eval_shapes, EVALUATED: jax.ShapeDtypeStruct((), jnp.bool_)}
        rows = jax.tree.map(lambda s: jnp.zeros((capacity, *s.shape), s.dtype), shapes)
        none = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), evaluation_shapes)
        none = none.replace(generation=none.generation - 1, eval_return=none.eval_return - jnp.inf)
        skipped = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), eval_shapes)

        def more(carry) -> Array:
            done, _, _, stopped, _ = carry
            return (done < count) & ~stopped

        def generation(carry):
            done, state, rows, _, (last, best) = carry
            state, metrics = self.step(state)
            due = (eval_every > 0) & (jnp.max(state.generation) % jnp.maximum(eval_every, 1) == 0)
            with jax.named_scope("evaluate"):
                eval_metrics, evaluation = jax.lax.cond(
                    due,
                    lambda s: self._evaluations(s),
                    lambda s: (skipped, none),
                    state,
                )
            last = jax.tree.map(lambda new, old: _where(due, new, old), evaluation, last)
            better = due & (evaluation.eval_return > best.eval_return)  # [] or [seeds]
            best = jax.tree.map(lambda new, old: _where(better, new, old), evaluation, best)
            row = {**metrics, **eval_metrics, EVALUATED: due}
            rows = jax.tree.map(lambda column, value: column.at[done].set(value), rows, row)
            reached = env_steps_reached(
                metrics["env_steps_high"],
                metrics[names.ENV_STEPS],
                stop_at.env_steps_high,
                stop_at.env_steps,
            )
            stopped = (
                jnp.any(reached)
                | (jnp.mean(metrics[names.BEST_FITNESS]) >= stop_at.fitness)
                | ~jnp.all(jnp.isfinite(metrics[names.MEAN_FITNESS]))
            )
            return done + 1, state, rows, stopped, (last, best)

        start = (jnp.zeros((), jnp.int32), state, rows, jnp.zeros((), jnp.bool_), (none, none))
        done, state, rows, _, evaluations = jax.lax.while_loop(more, generation, start)
        return state, rows, done, evaluations

    def chunk_arguments(
        self, count: int, stop_at: StopAt, eval_every: int = 0
    ) -> tuple[Array, StopAt, Array]:
        """`steps`' host arguments as it is called (and compiled): on a layout, global arrays
        replicated over every device of every process."""
        arguments = (np.int32(count), stop_at, np.int32(eval_every))
        if self.layout is None:
            return arguments
        place = self.layout.put_replicated
        return jax.tree.map(lambda value: place(np.asarray(value)), arguments)

    # ---- evaluation ----------------------------------------------------------------------------

    def candidates(self, state: WorkflowState) -> Array:
        """Every replica's candidates (`_candidates`): `[C, D]`, with several seeds
        `[seeds, C, D]`."""
        return self._replicas(self._candidates)(state)

    def _candidates(self, state: WorkflowState) -> Array:
        """One replica's policies worth deploying `[C, D]`: the optimizer's `best` (mean or
        elite) first, then the learner's own actors (ERL's K agents; CEM-RL's trained actors
        are members already). An ERL distribution's mean blends the injected agents with
        members of other lineages, so its agents may well be the better policy: evaluation
        decides. Without an optimizer (PBT), the learner's actors alone (`eval/candidate` k:
        member k)."""
        best = [] if self.optimizer is None else [self.optimizer.best(state.ec)[None]]  # [1, D]
        if self.learner is None:
            return best[0]
        actors, _ = self.learner.actors(state.learner)  # [K, D]
        return jnp.concatenate([*best, actors])

    def evaluate(self, state: WorkflowState) -> tuple[Metrics, Array]:
        """Every replica's `_evaluate`: metrics `[seeds]` and policies `[seeds, D]` with
        several seeds."""
        return self._replicas(self._evaluate)(state)

    def _evaluations(self, state: WorkflowState) -> tuple[Metrics, Evaluation]:
        """Every replica's evaluation metrics and `Evaluation` (what `steps` keeps)."""
        return self._replicas(self._evaluation_of)(state)

    def _evaluation_of(self, state: WorkflowState) -> tuple[Metrics, Evaluation]:
        metrics, policy = self._evaluate(state)
        evaluation = Evaluation(
            generation=state.generation,
            eval_return=metrics[names.EVAL_RETURN],
            policy=policy,
            obs_stats=state.obs_stats,
        )
        return metrics, evaluation

    def _evaluate(self, state: WorkflowState) -> tuple[Metrics, Array]:
        """Returns of one replica's best candidate policy (`_candidates`), acting
        deterministically, over the evaluator's episodes, and that candidate `[D]` (what a
        policy export holds); `eval/candidate` says which (0: the optimizer's best, k: the
        learner's k-th actor). The key is derived from the state's, which is left unchanged."""
        params = self._candidates(state)  # [C, D]
        key = jax.random.fold_in(state.key, 0x5EED)
        result = self.evaluator.run(params, None, key, obs_stats=state.obs_stats)
        pick = jnp.argmax(jnp.mean(result.episode_returns, axis=1))
        returns = result.episode_returns[pick]  # [E]
        metrics = {
            names.EVAL_RETURN: jnp.mean(returns),
            "eval/return_std": jnp.std(returns),
            "eval/return_min": jnp.min(returns),
            "eval/return_max": jnp.max(returns),
            "eval/episode_length_mean": jnp.mean(result.episode_lengths[pick].astype(jnp.float32)),
            "eval/candidate": pick.astype(jnp.float32),
        }
        return metrics, params[pick]

    # ---- host loop -----------------------------------------------------------------------------

    def learn(
        self,
        state: WorkflowState,
        *,
        stop: Callable[[Mapping[str, float]], bool],
        recorders: Iterable[Recorder] = (),
        on_generation: Callable[[WorkflowState, Mapping[str, float]], None] | None = None,
        on_evaluation: Callable[[Evaluation, Evaluation], None] | None = None,
        eval_every: int = 1,
        jitted: JittedWorkflow | None = None,
        chunk: Callable[[int], int] | None = None,
        stop_at: StopAt | None = None,
    ) -> WorkflowState:
        """Runs generations until `stop(metrics)` is true; returns the last state.

        Generations run in chunks, each one call of `steps` (one dispatch, one sync), with
        the deployable policy evaluated inside them every `eval_every` generations (0: never):
        `chunk(generation)` says how many may run from `generation` on before the host next
        needs the state (None: one at a time); chunks also end early where `stop_at` says
        (pass the thresholds `stop` checks, so that a chunk never runs past them). The first
        chunk of a call is one generation (it compiles).

        Host side, per chunk: fetch every generation's metrics (an evaluated generation's with
        its `eval/*`), add timing metrics (the chunk's time shared out) and write every
        recorder; then, if the chunk evaluated, pass its last evaluation and each replica's
        best (host `Evaluation`s: `steps`) to `on_evaluation` (the policy export hook), call
        `on_generation(state, metrics)` (the checkpoint hook) and `stop(metrics)` with the last
        generation's metrics. Pass `jitted` to reuse compiled functions across calls;
        recorders are not closed here. Timing metrics of the first generation include
        compilation unless `jitted` has already run this workflow. With several seeds the
        metrics are `seed_metrics`' and `time/env_steps_per_s` counts every replica's steps.
        """
        fns = jitted if jitted is not None else jit_workflow(self)
        recorders = tuple(recorders)
        stop_at = stop_at if stop_at is not None else StopAt.of()
        env_steps = int(np.sum(env_steps_count(state)))  # every replica's
        count = 1
        while True:
            start = time.perf_counter()
            arguments = self.chunk_arguments(count, stop_at, eval_every)
            state, rows, done, evaluations = fns.steps(state, *arguments)
            # Waits for the chunk to finish.
            rows, done, (last, best) = jax.device_get((rows, done, evaluations))
            rows = counted_env_steps(rows)
            step_seconds = (time.perf_counter() - start) / int(done)
            for row in range(int(done)):
                values = {name: column[row] for name, column in rows.items()}
                if not values.pop(EVALUATED):
                    values = {k: v for k, v in values.items() if not k.startswith("eval/")}
                metrics = seed_metrics(values, self.seeds)
                generation = int(metrics["generation"])
                metrics[names.STEP_SECONDS] = step_seconds
                metrics[names.GENERATIONS_PER_S] = 1.0 / max(step_seconds, 1e-9)
                total = int(np.sum(values[names.ENV_STEPS]))  # the whole program's throughput
                metrics[names.ENV_STEPS_PER_S] = (total - env_steps) / max(step_seconds, 1e-9)
                env_steps = total
                for recorder in recorders:
                    recorder.write(generation, metrics)
            if on_evaluation is not None and np.max(last.generation) >= 0:
                on_evaluation(last, best)
            if on_generation is not None:
                on_generation(state, metrics)
            if stop(metrics):
                return state
            count = max(1, min(chunk(generation), CHUNK_CAPACITY)) if chunk else 1


@dataclasses.dataclass(frozen=True)
class JittedWorkflow:
    """Jitted `init`, `step` and `evaluate` of one workflow; build with `jit_workflow`."""

    init: Callable[[Array], WorkflowState]
    step: Callable[[WorkflowState], tuple[WorkflowState, Metrics]]
    evaluate: Callable[[WorkflowState], tuple[Metrics, Array]]
    # (state, count, stop_at, eval_every) -> (state, metrics [CHUNK_CAPACITY], generations
    # run, (last, best) evaluations): `steps`
    steps: Callable[
        [WorkflowState, Array, StopAt, Array],
        tuple[WorkflowState, Metrics, Array, tuple[Evaluation, Evaluation]],
    ]


def jit_workflow(workflow: Workflow, *, donate: bool = False) -> JittedWorkflow:
    """`jax.jit` of the workflow's pure functions. Keep the result to reuse compilations.

    With a layout, states are placed by `layout.state_shardings` (also across processes) and
    metrics come back replicated, so every process can read them.

    `donate=True` lets `step` write the new state into the old one's buffers, so a generation
    holds one replay buffer instead of two (the bulk of host memory with a large buffer). The
    state passed to `step` is then invalid afterwards: only a loop that keeps just the newest
    state (as `Workflow.learn` does, checkpointing synchronously) may donate.
    """
    layout = workflow.layout
    donated = (0,) if donate else ()
    steps = functools.partial(workflow.steps, capacity=CHUNK_CAPACITY)
    if layout is None:
        # A committed init state, like one restored from a checkpoint: both then compile to the
        # same `step`, so a restart finds the first run's program in the compilation cache.
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return JittedWorkflow(
            init=jax.jit(workflow.init, out_shardings=device),
            step=jax.jit(workflow.step, donate_argnums=donated),
            evaluate=jax.jit(workflow.evaluate),
            steps=jax.jit(steps, donate_argnums=donated),
        )
    states = workflow.state_shardings()
    init = jax.jit(workflow.init, in_shardings=layout.replicated, out_shardings=states)
    return JittedWorkflow(
        init=lambda key: init(layout.put_replicated(np.asarray(key))),
        step=jax.jit(
            workflow.step,
            in_shardings=(states,),
            out_shardings=(states, layout.replicated),
            donate_argnums=donated,
        ),
        evaluate=jax.jit(
            workflow.evaluate, in_shardings=(states,), out_shardings=layout.replicated
        ),
        steps=jax.jit(
            steps,
            in_shardings=(states, layout.replicated, layout.replicated, layout.replicated),
            out_shardings=(states, layout.replicated, layout.replicated, layout.replicated),
            donate_argnums=donated,
        ),
    )


def _where(pick: Array, new: Array, old: Array) -> Array:
    """`new` where `pick` (`[]`, or `[seeds]` against leaves `[seeds, ...]`), else `old`."""
    return jnp.where(pick.reshape(pick.shape + (1,) * (new.ndim - pick.ndim)), new, old)


def _obs_stats_metrics(stats: RunningStats) -> Metrics:
    std = jnp.sqrt(stats.var)
    return {
        "obs_norm/count": stats.count,
        "obs_norm/mean_abs_max": jnp.max(jnp.abs(stats.mean)),
        "obs_norm/std_min": jnp.min(std),
        "obs_norm/std_max": jnp.max(std),
    }
