"""Overhead budget: one generation against its parts run alone (rollouts, RL updates).

    .venv/bin/python -W ignore -m benchmarks.overhead_bench                    # Pendulum
    .venv/bin/python -W ignore -m benchmarks.overhead_bench --envs halfcheetah --generations 2
    .venv/bin/python -W ignore -m benchmarks.overhead_bench --rows cemrl-halfcheetah  # chip_bench's

For each configuration (trainer_bench.py's) the script jits and times, on the same state:

  generation  `jit_workflow(workflow, donate=True).step`: the whole generation as the trainer
              runs it (state donated; each call gets its own copy of the state, made untimed);
  rollouts    `workflow.rollout.run` of the candidates alone (population plus the learner's
              extra actors, transitions collected when there is a learner);
  updates     `workflow.learner.improve` alone, on the warmed-up buffer;
  ask+tell    the EC optimizer's `ask` and `tell` alone: sampling the population and the
              search-distribution update (for OpenES, its whole "update" part);
  evaluation  `workflow.evaluate` alone: the deployable policy's evaluation episodes;
  gen + eval  one generation and its evaluation as the trainer runs them, one call of
              `steps` with an evaluation every generation (a default manifest's schedule).

"overhead" is generation / (rollouts + updates) - 1, the issue's definition; the budget is
15%. "overhead incl. EC" also counts ask+tell as a part: what remains is the glue (buffer
insert, merge, fitness reduction, metrics, layout changes); "overhead incl. eval" is gen + eval
against rollouts, updates, ask+tell and evaluation. `--rows` takes chip_bench's rows (issue 23's
and versus_evorl's workloads, on `--backend`, Brax's default pipeline unless named) instead of
`--envs` x `--algos`. Each figure is the median over
`--generations` timed calls after one untimed call, timed in turn (generation, rollouts,
updates, ask+tell, generation, ...) so that the machine's changing load falls on all alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp

from benchmarks._common import load, print_header, print_row
from benchmarks.chip_bench import ROWS, workflow_config
from benchmarks.config_flags import add_config_arguments
from benchmarks.trainer_bench import ENVS, build_config
from evokube_trainer.workflows import StopAt, jit_workflow, make_workflow


def interleaved(calls: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each call, timed in turn (A, B, C, A, B, C, ...) so that a change of
    the machine's load hits all of them alike. `calls` maps a name to (setup, run): `setup()`
    runs untimed and its result is passed to `run`."""
    for setup, run in calls.values():
        jax.block_until_ready(run(setup()))  # compile and warm up
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, (setup, run) in calls.items():
            arg = jax.block_until_ready(setup())
            start = time.perf_counter()
            jax.block_until_ready(run(arg))
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def bench(config, args: argparse.Namespace) -> dict:
    workflow = make_workflow(config)
    fns = jit_workflow(workflow, donate=True)
    state = jax.block_until_ready(fns.init(jax.random.PRNGKey(0)))
    learner = workflow.learner

    def same_state():
        return state

    # A donated state is consumed: every call gets its own copy, made untimed.
    copy = jax.jit(lambda s: jax.tree.map(jnp.copy, s))

    population, _ = workflow.optimizer.ask(state.ec, jax.random.PRNGKey(1))
    if learner is not None:
        extra, extra_noise = learner.actors(state.learner)
    else:
        extra = jnp.zeros((0, population.shape[1]), population.dtype)
        extra_noise = jnp.zeros((0,), jnp.float32)
    candidates = jnp.concatenate([population, extra])
    noise = jnp.concatenate([jnp.zeros((population.shape[0],), jnp.float32), extra_noise])
    rollout = jax.jit(
        lambda c, n, k: workflow.rollout.run(c, n, k, collect_transitions=learner is not None)
    )
    calls = {
        "full": (lambda: copy(state), fns.step),
        "rollout": (same_state, lambda _: rollout(candidates, noise, jax.random.PRNGKey(2))),
    }
    if learner is not None:
        improve = jax.jit(learner.improve)
        calls["updates"] = (
            same_state,
            lambda s: improve(s.learner, s.replay, population, jax.random.PRNGKey(3)),
        )

    def ask_tell(ec_state):  # the EC side alone, a diagnostic: it is part of the overhead
        pop, ec_state = workflow.optimizer.ask(ec_state, jax.random.PRNGKey(4))
        return workflow.optimizer.tell(ec_state, pop, -jnp.sum(pop * pop, axis=1))

    ask_tell = jax.jit(ask_tell)
    calls["ask_tell"] = (same_state, lambda s: ask_tell(s.ec))
    calls["evaluate"] = (same_state, fns.evaluate)
    with_eval = workflow.chunk_arguments(1, StopAt.of(), 1)
    calls["with_eval"] = (lambda: copy(state), lambda s: fns.steps(s, *with_eval))
    timed = interleaved(calls, args.generations)
    full_s, rollout_s, ask_tell_s = timed["full"], timed["rollout"], timed["ask_tell"]
    updates_s = timed.get("updates", 0.0)
    parts = rollout_s + updates_s
    return {
        "full_s": full_s,
        "rollout_s": rollout_s,
        "updates_s": updates_s,
        "ask_tell_s": ask_tell_s,
        "evaluate_s": timed["evaluate"],
        "with_eval_s": timed["with_eval"],
        "overhead": full_s / parts - 1.0,
        "overhead_ec": full_s / (parts + ask_tell_s) - 1.0,
        "overhead_eval": timed["with_eval"] / (parts + ask_tell_s + timed["evaluate"]) - 1.0,
    }


def workloads(args: argparse.Namespace):
    """(label, env label, config) of each row to measure."""
    if args.rows:
        for row in args.rows:
            pipeline = (args.backend or "generalized") if "halfcheetah" in row else "-"
            yield ROWS[row], pipeline, workflow_config(row, args.backend)
        return
    names = {"openes": "OpenES", "cemrl": "CEM-RL", "erl": "ERL-GA"}
    for env_name in args.envs:
        for algo in args.algos:
            yield names[algo], ENVS[env_name], build_config(algo, env_name, args)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="+", default=["pendulum"], choices=list(ENVS))
    parser.add_argument("--algos", nargs="+", default=["cemrl", "erl", "openes"])
    parser.add_argument("--generations", type=int, default=5, help="timed calls per figure")
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), help="chip_bench's rows instead")
    parser.add_argument("--backend", help="the rows' Brax pipeline (default: Brax's own)")
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    print(
        f"# jax {jax.__version__}, {os.cpu_count()} CPUs; load average at start "
        f"{load():.2f}; median of {args.generations} calls; replay capacity "
        f"{args.replay_capacity:,}"
    )
    print_header(
        "algorithm",
        "env (rows: Brax pipeline)",
        "generation s",
        "rollouts s",
        "updates s",
        "ask+tell s",
        "evaluation s",
        "gen + eval s",
        "overhead",
        "overhead incl. EC",
        "overhead incl. eval",
        "load",
    )
    for label, env_label, config in workloads(args):
        r = bench(config, args)
        print_row(
            label,
            env_label,
            f"{r['full_s']:.4g}",
            f"{r['rollout_s']:.4g}",
            f"{r['updates_s']:.4g}",
            f"{r['ask_tell_s']:.4g}",
            f"{r['evaluate_s']:.4g}",
            f"{r['with_eval_s']:.4g}",
            f"{r['overhead']:+.0%}",
            f"{r['overhead_ec']:+.0%}",
            f"{r['overhead_eval']:+.0%}",
            f"{load():.2f}",
        )
    print(f"# load average at end {load():.2f}")


if __name__ == "__main__":
    main()
