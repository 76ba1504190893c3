"""Overhead budget: one generation against its parts run alone (rollouts, RL updates).

    .venv/bin/python -W ignore benchmarks/overhead_bench.py                    # Pendulum
    .venv/bin/python -W ignore benchmarks/overhead_bench.py --envs halfcheetah --generations 2

For each configuration (trainer_bench.py's) the script jits and times, on the same state:

  generation  `jit_workflow(workflow).step`: the whole generation, as the trainer runs it;
  donated     the same step jitted with the state donated (`donate_argnums=0`), so XLA may
              update the replay buffer in place instead of copying it;
  rollouts    `workflow.rollout.run` of the candidates alone (population plus the learner's
              extra actors, transitions collected when there is a learner);
  updates     `workflow.learner.improve` alone, on the warmed-up buffer.

"overhead" is generation / (rollouts + updates) - 1; the budget is 15%. Each figure is the
median over `--generations` timed calls after one untimed call; the four are timed in turn
(generation, donated, rollouts, updates, generation, ...) so that the machine's changing load
falls on all of them alike. Everything else a generation
does (ask, tell, the buffer insert, the merge, metrics) is inside the overhead; "ask+tell"
times the EC optimizer's ask and tell alone, to show how much of the overhead is theirs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(__file__))
from trainer_bench import ENVS, build_config

from evokube_trainer.workflows import jit_workflow, make_workflow


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


def bench(algo: str, env_name: str, args: argparse.Namespace) -> dict:
    config = build_config(algo, env_name, args)
    workflow = make_workflow(config)
    fns = jit_workflow(workflow)
    state = jax.block_until_ready(fns.init(jax.random.PRNGKey(0)))
    learner = workflow.learner

    def same_state():
        return state

    donated = jax.jit(workflow.step, donate_argnums=0)
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
        "full": (same_state, fns.step),
        "donated": (lambda: copy(state), donated),
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
    timed = interleaved(calls, args.generations)
    full_s, donated_s, rollout_s = timed["full"], timed["donated"], timed["rollout"]
    updates_s = timed.get("updates", 0.0)
    parts = rollout_s + updates_s
    return {
        "algo": {"openes": "OpenES", "cemrl": "CEM-RL", "erl": "ERL-GA"}[algo],
        "env": ENVS[env_name],
        "full_s": full_s,
        "donated_s": donated_s,
        "rollout_s": rollout_s,
        "updates_s": updates_s,
        "ask_tell_s": timed["ask_tell"],
        "overhead": full_s / parts - 1.0,
        "overhead_donated": donated_s / parts - 1.0,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="+", default=["pendulum"], choices=list(ENVS))
    parser.add_argument("--algos", nargs="+", default=["cemrl", "erl", "openes"])
    parser.add_argument("--generations", type=int, default=5, help="timed calls per figure")
    parser.add_argument("--episode-length", type=int, default=None, help="override T")
    parser.add_argument("--es-pop-size", type=int, default=32)
    parser.add_argument("--rl-pop-size", type=int, default=10)
    parser.add_argument("--erl-agents", type=int, default=1)
    parser.add_argument("--updates", type=int, default=256, help="TD3 steps per generation")
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--replay-capacity", type=int, default=200_000)
    args = parser.parse_args(argv)
    print(
        f"# jax {jax.__version__}, {os.cpu_count()} CPUs; load average at start "
        f"{os.getloadavg()[0]:.2f}; median of {args.generations} calls; replay capacity "
        f"{args.replay_capacity:,}"
    )
    print(
        "| algorithm | env | generation s | rollouts s | updates s | overhead "
        "| donated generation s | overhead donated | ask+tell s | load |"
    )
    print("|" + "---|" * 10)
    for env_name in args.envs:
        for algo in args.algos:
            r = bench(algo, env_name, args)
            print(
                f"| {r['algo']} | {r['env']} | {r['full_s']:.3f} | {r['rollout_s']:.3f} "
                f"| {r['updates_s']:.3f} | {r['overhead']:+.0%} | {r['donated_s']:.3f} "
                f"| {r['overhead_donated']:+.0%} | {r['ask_tell_s']:.3f} "
                f"| {os.getloadavg()[0]:.2f} |",
                flush=True,
            )
    print(f"# load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
