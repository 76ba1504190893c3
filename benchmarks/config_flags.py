"""The workflow-configuration flags every benchmark takes (read by trainer_bench.build_config).

Kept free of jax imports: multi-process benchmarks parse them before jax.distributed starts.
"""

from __future__ import annotations

import argparse

CONFIG_FLAGS = {  # flag -> (type, default, help): what build_config reads from its args
    "--episode-length": (int, None, "override T"),
    "--es-pop-size": (int, 32, "OpenES population"),
    "--rl-pop-size": (int, 10, "CEM-RL and ERL-GA population"),
    "--erl-agents": (int, 1, "ERL-GA's TD3 agents"),
    "--pbt-members": (int, 4, "PBT's TD3 members"),
    "--updates": (int, 256, "TD3 steps per generation"),
    "--hidden": (int, [256, 256], "hidden layer sizes of actor and critic"),
    "--replay-capacity": (int, 200_000, "replay buffer capacity"),
}


def add_config_arguments(parser: argparse.ArgumentParser, **defaults) -> None:
    """The flags build_config reads; every benchmark takes the same ones (`defaults` by dest)."""
    for flag, (kind, default, text) in CONFIG_FLAGS.items():
        dest = flag[2:].replace("-", "_")
        nargs = "+" if isinstance(default, list) else None
        parser.add_argument(
            flag, type=kind, nargs=nargs, default=defaults.get(dest, default), help=text
        )


def config_arguments(args: argparse.Namespace) -> list[str]:
    """`args`' configuration as command-line flags, for a child process."""
    out: list[str] = []
    for flag in CONFIG_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            out += [flag, *map(str, value if isinstance(value, list) else [value])]
    return out
