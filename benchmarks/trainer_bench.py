"""Throughput of the trainer's workflows: JIT compile time, generations/s and env steps/s.

    .venv/bin/python -m benchmarks.trainer_bench                       # the defaults below
    .venv/bin/python -m benchmarks.trainer_bench --envs pendulum --algos cemrl \
        --rl-pop-size 50 --updates 2000 --generations 5               # enlarge

Every configuration is built with `make_workflow`, its `step` jitted and compiled ahead of time
(`lower(state).compile()`, timed as the compile time), run once untimed, then timed over
`--generations` generations. Env steps are agent steps (one per policy action), counted by the
workflow itself; for ERL they include the RL agents' exploratory episodes. PBT exploits and
explores every generation (`interval=1`, its most expensive setting) over both learning rates.
The RL algorithms use the TD3 paper's networks (256, 256) unless `--hidden` says otherwise.

Prints one markdown table row per configuration, ready to paste into benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax

from benchmarks._common import load, print_header, print_row
from benchmarks.config_flags import add_config_arguments
from evokube_trainer.agents import TD3Config
from evokube_trainer.workflows import (
    CEMRLConfig,
    ECConfig,
    EnvConfig,
    ERLConfig,
    PBTConfig,
    ReplayConfig,
    env_steps_count,
    make_workflow,
)

ENVS = {
    "pendulum": "gymnax/Pendulum-v1",
    "halfcheetah": "brax/halfcheetah",
}
DEFAULT_EPISODE_LENGTH = {"pendulum": 200, "halfcheetah": 1000}
# --algos name -> (label, EC optimizer); "erl*" run ERL's workflow, "cemrl*" CEM-RL's, "pbt"
# PBT's (no optimizer).
ALGOS = {
    "openes": ("OpenES", "open_es"),
    "cemrl": ("CEM-RL", "sep_cem"),
    "cemrl-openes": ("CEM-RL (OpenES)", "open_es"),
    "erl": ("ERL-GA", "ga"),
    "erl-es": ("ERL-ES", "open_es"),
    "erl-eda": ("ERL-EDA", "sep_cem"),
    "pbt": ("PBT", None),
}


def build_config(algo: str, env_name: str, args: argparse.Namespace):
    env = EnvConfig(
        ENVS[env_name],
        episode_length=args.episode_length or DEFAULT_EPISODE_LENGTH[env_name],
        episodes_per_member=1,
        eval_episodes=1,
    )
    hidden = tuple(args.hidden)
    td3 = TD3Config(actor_hidden_sizes=hidden, critic_hidden_sizes=hidden)
    replay = ReplayConfig(capacity=args.replay_capacity, batch_size=256, warmup_steps=1000)
    if algo == "openes":
        return ECConfig(
            env=env, pop_size=args.es_pop_size, optimizer="open_es", actor_hidden_sizes=hidden
        )
    if algo == "pbt":
        return PBTConfig(
            env=env,
            pop_size=args.pbt_members,
            agent=td3,
            updates_per_generation=args.updates,
            replay=replay,
            interval=1,
            ranges={"actor_lr": (1e-4, 1e-3), "critic_lr": (1e-4, 1e-3)},
        )
    optimizer = ALGOS[algo][1]
    if algo.startswith("cemrl"):
        return CEMRLConfig(
            env=env,
            pop_size=args.rl_pop_size,
            optimizer=optimizer,
            agent=td3,
            updates_per_generation=args.updates,
            replay=replay,
        )
    if algo.startswith("erl"):
        ga = {"num_elites": max(1, args.rl_pop_size // 5)}
        return ERLConfig(
            env=env,
            pop_size=args.rl_pop_size,
            optimizer=optimizer,
            optimizer_options=ga if optimizer == "ga" else {},
            num_agents=args.erl_agents,
            agent=td3,
            updates_per_generation=args.updates,
            replay=replay,
        )
    raise ValueError(algo)


def population_label(algo: str, config) -> str:
    if algo.startswith("cemrl"):
        return f"{config.pop_size} ({config.pop_size // 2} TD3 actors)"
    if algo.startswith("erl"):
        return f"{config.pop_size} + {config.num_agents} TD3 agent(s)"
    if algo == "pbt":
        return f"{config.pop_size} TD3 members"
    return str(config.pop_size)


def bench(algo: str, env_name: str, args: argparse.Namespace) -> dict:
    config = build_config(algo, env_name, args)
    workflow = make_workflow(config)
    start = time.perf_counter()
    state = jax.block_until_ready(jax.jit(workflow.init)(jax.random.PRNGKey(0)))
    init_s = time.perf_counter() - start

    start = time.perf_counter()
    step = jax.jit(workflow.step).lower(state).compile()
    compile_s = time.perf_counter() - start

    state, _ = jax.block_until_ready(step(state))  # one untimed generation
    steps_before = int(env_steps_count(state))
    start = time.perf_counter()
    for _ in range(args.generations):
        state, metrics = step(state)
    jax.block_until_ready(metrics)
    elapsed = time.perf_counter() - start
    env_steps = int(env_steps_count(state)) - steps_before
    learner = getattr(workflow.learner, "members", workflow.learner)  # PBT's: its agents'
    updates = getattr(learner, "num_updates", 0)
    return {
        "algo": ALGOS[algo][0],
        "env": f"{ENVS[env_name]} (T={workflow.rollout.episode_length})",
        "pop": population_label(algo, config),
        "updates": str(updates) if updates else "-",
        "init_s": init_s,
        "compile_s": compile_s,
        "gen_per_s": args.generations / elapsed,
        "steps_per_s": env_steps / elapsed,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=list(ALGOS))
    parser.add_argument("--generations", type=int, default=3, help="timed generations")
    add_config_arguments(parser)
    args = parser.parse_args(argv)

    print(
        f"# jax {jax.__version__} on {jax.devices()[0].platform} ({len(jax.devices())} device), "
        f"{os.cpu_count()} CPUs, {platform.machine()}; load average at start "
        f"{load():.1f}; {args.generations} timed generations per row"
    )
    print_header(
        "algorithm",
        "env",
        "population",
        "TD3 steps/gen",
        "init+warm-up s",
        "compile s",
        "generations/s",
        "env steps/s",
    )
    for env_name in args.envs:
        for algo in args.algos:
            row = bench(algo, env_name, args)
            print_row(
                row["algo"],
                row["env"],
                row["pop"],
                row["updates"],
                f"{row['init_s']:.1f}",
                f"{row['compile_s']:.1f}",
                f"{row['gen_per_s']:.3g}",
                f"{row['steps_per_s']:,.0f}",
            )
    print(f"# load average at end {load():.1f}")


if __name__ == "__main__":
    main()
