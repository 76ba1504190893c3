"""evokube and EvoRL side by side, in the same run, on the same work: a Markdown table.

    .venv/bin/python -W ignore -m benchmarks.versus_evorl                    # every row
    .venv/bin/python -W ignore -m benchmarks.versus_evorl --rows openes-64 cemrl-halfcheetah \
        --generations 5 --pairs 1
    .venv/bin/python -W ignore -m benchmarks.versus_evorl --rows openes-halfcheetah --pop 64
    .venv/bin/python -W ignore -m benchmarks.versus_evorl --rows openes-64 --seeds 4

Runs on whatever JAX sees (a TPU chip, a GPU, or the CPU). The rows are chip_bench's (issue
23's workloads); evokube's side of each is `chip_bench.workflow_config`, and EvoRL's is built
from it, field by field, as the OmegaConf config its workflow reads (`evorl_config`): the same
env and episode length, population, networks, TD3 settings, updates per generation, batch,
replay capacity, random warm-up, 10 evaluation episodes every generation, no observation
normalization, and the Brax pipeline passed explicitly on both sides (`--backend`).

EvoRL is its PyPI release (`EVORL_VERSION`), installed by this script once into a virtual
environment of its own outside the repository (`evorl_python`), with the packages both sides
share pinned to constraints.txt, so both run the same JAX and the same Brax physics (the
table's preamble prints each side's versions).

Per row, `--pairs` times: a new evokube process, a new EvoRL process, and a new evokube
process of the chunked trainer without evaluation or checkpoints (what the default manifest
costs is the difference). Each runs its own normal training loop for 1 + `--generations`
generations:

  evokube   `runtime.trainer.train` with chip_bench's `run_config`, evaluation every
            generation, a checkpoint every 10 in a temporary folder; a recorder notes the wall
            time of each generation (after its evaluation);
  EvoRL     its workflow's `learn` (its step, a host fetch of the metrics, its evaluate, its
            checkpoint manager, on evokube's schedule: `_CheckpointSchedule`), as its
            scripts/train.py runs it; a recorder notes the wall time of each iteration's last
            write (after the evaluation);
  chunked   `train` again with eval_interval=0 and no checkpoint folder (generations run in
            chunks of about a second, one dispatch each).

"spawn -> first gen s": the parent's clock at the spawn to the child's at the end of its first
generation (imports, device start-up, init and the replay warm-up, compilation, the generation
and its evaluation). "gen/s": the further generations over the time they took (median over the
pairs). "env steps/s" counts agent steps alike on both sides: population x T per generation,
plus T per extra RL actor that plays an episode of its own (ERL-GA's TD3 agent; CEM-RL's actors
are population members); evaluation episodes and the warm-up's random steps are not counted.
Each child also reports its own framework's step counter (the log lines), as a check.

`--seeds N` (N > 1) adds a seeds row: evokube with `seeds=N` in one process against N EvoRL
processes one after another (seeds 0..N-1), each side's total agent steps of 1 + generations
generations over its wall time from spawn to the last generation (EvoRL: the sum of its
processes').

The children: `python -m benchmarks.versus_evorl --child ...` (this venv), and the EvoRL venv's
python running this same module with `--child-evorl`; this module therefore imports nothing
from evokube_trainer at its top.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import REPO, load, print_header, print_row

# EvoRL (github.com/EMI-Group/evorl) as published on PyPI: the `evorl-jax` release, whose
# metadata names that repository as its home page. Its code is installed, never vendored.
EVORL_VERSION = "0.1.1"
EVORL_REQUIREMENT = f"evorl-jax[gymnax]=={EVORL_VERSION}"
# What to pin when the whole of constraints.txt cannot be installed beside EvoRL: first the
# scientific stack both sides import, then JAX and the physics alone.
SHARED_PINS = (
    ("jax", "jaxlib", "ml_dtypes", "numpy", "scipy", "brax", "mujoco", "mujoco-core",
     "mujoco-mjx", "flax", "optax", "gymnax", "orbax-checkpoint", "chex", "etils",
     "typing_extensions"),
    ("jax", "jaxlib", "brax", "mujoco", "mujoco-core", "mujoco-mjx"),
)  # fmt: skip
# The accelerator plugins of this venv's JAX, installed at the same versions beside EvoRL.
JAX_PLUGINS = (
    "libtpu",
    "jax-cuda12-plugin",
    "jax-cuda12-pjrt",
    "jax-cuda13-plugin",
    "jax-cuda13-pjrt",
)
VERSIONS = (
    "jax", "jaxlib", "brax", "mujoco", "mujoco-mjx", "flax", "optax", "gymnax", "numpy",
    "chex", "orbax-checkpoint", "evorl-jax", "libtpu",
)  # fmt: skip
CHECKPOINT_INTERVAL = 10


def package_versions() -> dict[str, str | None]:
    """The installed versions of `VERSIONS` (None: not installed) in this interpreter."""
    from importlib import metadata

    found = {}
    for name in VERSIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


# -- EvoRL's virtual environment ---------------------------------------------------------------


def evorl_home() -> Path:
    cache = Path(os.environ.get("EVOKUBE_CACHE", Path.home() / ".cache" / "evokube"))
    return cache / f"evorl-jax-{EVORL_VERSION}"


def _pins(names: tuple[str, ...] | None) -> list[str]:
    """constraints.txt's lines (all of them, or those naming `names`)."""
    lines = (REPO / "constraints.txt").read_text().splitlines()
    pins = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    if names is None:
        return pins
    wanted = {n.lower().replace("_", "-") for n in names}
    return [p for p in pins if p.split("==")[0].lower().replace("_", "-") in wanted]


def _plugins() -> list[str]:
    """This venv's JAX accelerator plugins, as requirements at their installed versions."""
    from importlib import metadata

    found = []
    for name in JAX_PLUGINS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found.append(f"{name}=={metadata.version(name)}")
    return found


def evorl_python() -> tuple[str, dict]:
    """The EvoRL venv's interpreter, installing the venv first where its stamp is missing or
    names other requirements or constraints; returns it and the stamp ({"requirements",
    "constraints", "pinned", "install_s", "installed_now"})."""
    home = evorl_home()
    python = home / "venv" / "bin" / "python"
    stamp_path = home / "installed.json"
    requirements = [EVORL_REQUIREMENT, *_plugins()]
    pins = hashlib.sha256("\n".join(_pins(None)).encode()).hexdigest()[:16]
    if stamp_path.exists() and python.exists():
        stamp = json.loads(stamp_path.read_text())
        if (stamp.get("requirements"), stamp.get("constraints")) == (requirements, pins):
            return str(python), {**stamp, "installed_now": False}
    home.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"# installing {' '.join(requirements)} into {home / 'venv'}", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True)
    log = home / "pip.log"
    pinned = None
    attempts = [(None, "all of constraints.txt")]
    attempts += [(names, f"constraints.txt's {', '.join(names)}") for names in SHARED_PINS]
    for names, what in attempts:
        constraints = home / "constraints.txt"
        constraints.write_text("\n".join(_pins(names)) + "\n")
        with open(log, "a") as output:
            done = subprocess.run(
                [str(python), "-m", "pip", "install", "-c", str(constraints), *requirements],
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        if done.returncode == 0:
            pinned = what
            break
        print(f"# pinning {what} did not install (see {log}); pinning less", flush=True)
    if pinned is None:
        raise RuntimeError(f"could not install {EVORL_REQUIREMENT}; see {log}")
    stamp = {
        "requirements": requirements,
        "constraints": pins,  # constraints.txt's pins when installed (a change reinstalls)
        "pinned": pinned,
        "install_s": round(time.monotonic() - started, 1),
    }
    stamp_path.write_text(json.dumps(stamp, indent=1) + "\n")
    return str(python), {**stamp, "installed_now": True}


# -- the work: one row's facts, read from evokube's configuration -------------------------------


def row_spec(row: str, backend: str, pop: int | None) -> dict:
    """The row's workload as plain facts (JSON for the EvoRL child), read from
    `chip_bench.workflow_config` (with `pop` for the OpenES halfcheetah row's population)."""
    from evokube_trainer.workflows import CEMRLConfig, ERLConfig

    config = workflow_config(row, backend, pop)
    env = config.env
    env_type, env_name = env.name.split("/", 1)
    spec = {
        "row": row,
        "algorithm": type(config).__name__,
        "env_type": env_type,
        "env_name": env_name,
        "episode_length": env.episode_length,
        "episodes_per_member": env.episodes_per_member,
        "eval_episodes": env.eval_episodes,
        "normalize_obs": env.normalize_observations,
        "backend": env.backend,
        "pop_size": config.pop_size,
        "options": dict(config.optimizer_options),
        "rl_rollouts": 0,  # RL actors playing episodes of their own, per generation
    }
    if not isinstance(config, (CEMRLConfig, ERLConfig)):
        optimizer = _optimizer(config)
        spec["actor_hidden"] = list(config.actor_hidden_sizes)
        spec["es"] = {
            "sigma": float(optimizer.sigma),
            "learning_rate": float(optimizer.learning_rate),
            "weight_decay": float(optimizer.weight_decay),
            "mirrored": bool(optimizer.mirrored),
        }
        return spec
    agent, replay = config.agent, config.replay
    spec.update(
        actor_hidden=list(agent.actor_hidden_sizes),
        critic_hidden=list(agent.critic_hidden_sizes),
        td3={
            "num_critics": agent.num_critics,
            "layer_norm": agent.critic_layer_norm,
            "lr": agent.actor_lr,
            "critic_lr": agent.critic_lr,
            "max_grad_norm": agent.max_grad_norm,
            "discount": agent.discount,
            "tau": agent.tau,
            "policy_noise": agent.policy_noise,
            "noise_clip": agent.noise_clip,
            "actor_update_interval": agent.actor_update_interval,
            "exploration_noise": agent.exploration_noise,
            "actor_loss_q": agent.actor_loss_q,
        },
        critic_updates=config.updates_per_generation,
        batch_size=replay.batch_size,
        replay_capacity=replay.capacity,
        warmup_steps=replay.warmup_steps,
        warmup_envs=replay.warmup_envs,
    )
    if isinstance(config, CEMRLConfig):
        cem = _optimizer(config)
        spec["num_actors"] = config.num_actors
        spec["cem"] = {
            "num_elites": cem.num_elites or config.pop_size // 2,
            "init_cov": cem.init_cov,
            "damp_limit": cem.damp_limit,
            "tau": cem.tau,
            "mirrored": cem.mirrored,
        }
    else:
        ga = _optimizer(config)
        spec["num_agents"] = config.num_agents
        spec["rl_rollouts"] = config.num_agents
        spec["injection_interval"] = config.injection_interval
        spec["ga"] = {
            "num_elites": ga.num_elites,
            "tournament_size": ga.tournament_size,
            "mutation_frac": ga.mutation_frac,
            "mutation_std": ga.mutation_std,
            "super_mutation_prob": ga.super_mutation_prob,
            "super_mutation_std": ga.super_mutation_std,
            "reset_prob": ga.reset_prob,
            "crossover_prob": ga.crossover_prob,
            "weight_clip": ga.weight_clip,
        }
    return spec


def workflow_config(row: str, backend: str, pop: int | None):
    """chip_bench's configuration of the row, its population replaced by `pop` where given
    (the OpenES halfcheetah row only)."""
    from benchmarks import chip_bench

    config = chip_bench.workflow_config(row, backend)
    if pop and row == "openes-halfcheetah":
        config = dataclasses.replace(config, pop_size=pop)
    return config


def _optimizer(config):
    """The EC optimizer evokube builds for `config` (its defaults, where the row sets none)."""
    from evokube_trainer.workflows import make_optimizer

    return make_optimizer(config.optimizer, config.pop_size, 1, config.optimizer_options)


def steps_per_generation(spec: dict) -> int:
    """Agent steps of one generation (module docstring): evaluation episodes not counted."""
    episodes = spec["pop_size"] * spec["episodes_per_member"] + spec["rl_rollouts"]
    return episodes * spec["episode_length"]


# -- EvoRL's side --------------------------------------------------------------------------------


def evorl_config(spec: dict, generations: int, seed: int, output_dir: str):
    """EvoRL's config (an OmegaConf dict, the fields its workflow reads; cf. its
    configs/agent/ec/openes.yaml, configs/agent/erl/cemrl.yaml, configs/agent/erl/erl-ga.yaml
    and configs/config.yaml) for the work `spec` describes, run for `generations`."""
    from omegaconf import OmegaConf

    pop = spec["pop_size"]
    episodes = spec["episodes_per_member"]
    config = {
        "seed": seed,
        "enable_jit": True,
        "output_dir": output_dir,
        "checkpoint": {
            "enable": True,
            "save_interval_steps": CHECKPOINT_INTERVAL,
            "max_to_keep": 2,  # chip_bench.run_config's checkpoint_keep
        },
        "env": {
            "env_type": spec["env_type"],
            "env_name": spec["env_name"],
            "max_episode_steps": spec["episode_length"],
        },
        "pop_size": pop,
        "normalize_obs": spec["normalize_obs"],
        "num_envs": episodes,  # a member's fitness episodes side by side, as evokube plays them
        "episodes_for_fitness": episodes,
        "num_eval_envs": spec["eval_episodes"],
        "eval_episodes": spec["eval_episodes"],
        "eval_interval": 1,
    }
    if spec["algorithm"] == "ECConfig":
        es = spec["es"]
        fixed = {"decay": 1.0}  # 1.0: the initial value throughout, as evokube's constants
        config.update(
            workflow_cls="evorl.algorithms.ec.so.openes.OpenESWorkflow",
            num_iters=generations,
            random_timesteps=0,  # only read with normalize_obs
            optimizer_name="adam",
            weight_decay=es["weight_decay"],
            ec_noise_std={"init": es["sigma"], "final": es["sigma"], **fixed},
            ec_lr={"init": es["learning_rate"], "final": es["learning_rate"], **fixed},
            mirror_sampling=es["mirrored"],
            explore=False,
            discount=1.0,
            agent_network={
                "actor_hidden_layer_sizes": spec["actor_hidden"],
                "use_bias": True,
                "norm_layer_type": "none",
                "policy_obs_key": "",
            },
        )
        return OmegaConf.create(config)

    td3 = spec["td3"]
    if td3["lr"] != td3["critic_lr"]:
        raise ValueError("EvoRL's TD3 has one learning rate for the actor and the critic")
    interval = td3["actor_update_interval"]
    # EvoRL's RL step: `actor_update_interval` critic steps, then one actor step.
    if spec["critic_updates"] % interval:
        raise ValueError("critic updates must be a multiple of the actor update interval")
    config.update(
        discount=td3["discount"],
        random_timesteps=spec["warmup_steps"],
        num_envs=spec["warmup_envs"],  # EvoRL's warm-up plays num_envs envs, as fitness does
        batch_size=spec["batch_size"],
        replay_buffer_capacity=spec["replay_capacity"],
        tau=td3["tau"],
        exploration_epsilon=td3["exploration_noise"],
        policy_noise=td3["policy_noise"],
        clip_policy_noise=td3["noise_clip"],
        actor_update_interval=interval,
        critics_in_actor_loss=td3["actor_loss_q"],
        warmup_iters=0,  # evokube trains from the first generation (the buffer is filled)
        num_rl_updates_per_iter=spec["critic_updates"] // interval,
        fitness_with_exploration=False,
        optimizer={"lr": td3["lr"], "grad_clip_norm": td3["max_grad_norm"] or 0},
        agent_network={
            "norm_layer_type": "layer_norm" if td3["layer_norm"] else "none",
            "num_critics": td3["num_critics"],
            "critic_hidden_layer_sizes": spec["critic_hidden"],
            "actor_hidden_layer_sizes": spec["actor_hidden"],
        },
        save_replay_buffer=True,  # its configs' choice; evokube's checkpoints keep the buffer
    )
    if episodes != spec["warmup_envs"]:
        raise ValueError("EvoRL plays the warm-up with as many envs as a member's episodes")
    if spec["algorithm"] == "CEMRLConfig":
        cem = spec["cem"]
        config.update(
            workflow_cls="evorl.algorithms.erl.cemrl_td3.cemrl.CEMRLWorkflow",
            total_episodes=generations * pop * episodes,
            num_learning_offspring=spec["num_actors"],
            num_elites=cem["num_elites"],
            # EvoRL's cov_eps decays as x <- (1 - decay) * x + decay * final; evokube's damp
            # as x <- tau * x + (1 - tau) * limit.
            cov_eps={"init": cem["init_cov"], "final": cem["damp_limit"], "decay": 1 - cem["tau"]},
            weighted_update=True,
            rank_weight_shift=1.0,
            mirror_sampling=cem["mirrored"],
        )
    else:
        ga = spec["ga"]
        rollouts = spec["num_agents"]
        config.update(
            workflow_cls="evorl.algorithms.erl.erl_td3.erl_ga.ERLGAWorkflow",
            total_episodes=generations * (pop * episodes + rollouts),
            num_rl_agents=spec["num_agents"],
            rollout_episodes=1,
            rl_exploration=True,
            rl_injection_interval=spec["injection_interval"],
            num_elites=ga["num_elites"],
            tournament_size=ga["tournament_size"],
            weight_max_magnitude=ga["weight_clip"],
            mut_strength=ga["mutation_std"],
            num_mutation_frac=ga["mutation_frac"],
            super_mut_strength=ga["super_mutation_std"],
            super_mut_prob=ga["super_mutation_prob"],
            reset_prob=ga["reset_prob"],
            vec_relative_prob=0.0,
            enable_crossover=ga["crossover_prob"] > 0,
            num_crossover_frac=0.1,
        )
    return OmegaConf.create(config)


def evorl_child(args: argparse.Namespace) -> dict:
    """One EvoRL training run, as its scripts/train.py runs one: `build_from_config` of a fresh
    subclass of the workflow class, `init`, `learn`, `close`; a recorder notes the wall time
    of each iteration's last write and the step counter."""
    import functools

    import evorl.envs.brax as evorl_brax
    import jax
    from evorl.recorders import Recorder
    from omegaconf import OmegaConf

    spec = json.loads(args.spec)
    generations = 1 + args.generations
    if spec["backend"]:
        # EvoRL's env creation passes Brax no pipeline (Brax's default then); pass ours.
        evorl_brax.get_environment = functools.partial(
            evorl_brax.get_environment, backend=spec["backend"]
        )
    ends: dict[int, float] = {}
    counted: dict[int, int] = {}

    class Clock(Recorder):
        def init(self) -> None:
            pass

        def write(self, data, step: int) -> None:
            ends[int(step)] = time.time()
            if "sampled_timesteps" in data:
                counted[int(step)] = int(data["sampled_timesteps"])
            elif "sampled_timesteps_m" in data:  # EC workflows count in millions
                counted[int(step)] = round(float(data["sampled_timesteps_m"]) * 1e6)

        def close(self) -> None:
            pass

    with tempfile.TemporaryDirectory(prefix="evorl-") as output_dir:
        config = evorl_config(spec, generations, args.seed, output_dir)
        OmegaConf.set_struct(config, True)  # a field it reads that is missing fails loudly
        module, name = config.workflow_cls.rsplit(".", 1)
        base = getattr(__import__(module, fromlist=[name]), name)
        workflow_cls = type(base.__name__, (base,), {})
        workflow = workflow_cls.build_from_config(config, enable_jit=config.enable_jit)
        workflow.add_recorders([Clock()])
        workflow.checkpoint_manager = _CheckpointSchedule(workflow.checkpoint_manager)
        try:
            state = workflow.init(jax.random.PRNGKey(config.seed))
            workflow.learn(state)
        finally:
            workflow.close()
    return _child_report(ends, counted, generations)


class _CheckpointSchedule:
    """EvoRL's checkpoint manager on evokube's schedule, `save(step, items, force)`:

    - EvoRL's CEM-RL `learn` passes `force` by position, which its own managers'
      `save(step, items, **kwargs)` refuses (a TypeError at the end of the first iteration,
      in 0.1.1 and in upstream's main): passed on by name;
    - Orbax's default policy also saves the first step it sees (iteration 1, in the timed
      window), which evokube does not: saves go on at multiples of `CHECKPOINT_INTERVAL` and
      when forced (the last iteration), as evokube's (every 10th generation and the last).
    """

    def __init__(self, manager):
        self.manager = manager

    def save(self, step, items, force: bool = False, **kwargs):
        if not force and int(step) % CHECKPOINT_INTERVAL:
            return False
        return self.manager.save(step, items, force=force, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.manager, name)


# -- evokube's side ------------------------------------------------------------------------------


def evokube_child(args: argparse.Namespace) -> dict:
    """One trainer run (`runtime.trainer.train`): chip_bench's run_config for 1 +
    `--generations` generations, evaluation every generation and a checkpoint every
    `CHECKPOINT_INTERVAL` in a temporary folder, or (`--chunked`) neither."""
    from evokube_trainer.runtime import distributed

    opener = distributed.open_devices_in_background()  # as the pod's entrypoint does
    import logging

    from benchmarks import chip_bench
    from evokube_trainer.runtime.trainer import train

    # The trainer's phases in the child's log (Orbax logs its every step at INFO: left out).
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)
    for handler in logging.getLogger().handlers:
        handler.addFilter(lambda r: r.name.startswith("evokube") or r.levelno >= logging.WARNING)

    generations = 1 + args.generations
    config = chip_bench.run_config(args.rows[0], args.backend, generations)
    config = dataclasses.replace(
        config,
        workflow=workflow_config(args.rows[0], args.backend, args.pop),
        eval_interval=0 if args.chunked else 1,
        checkpoint_interval=CHECKPOINT_INTERVAL,
        seeds=args.seeds,
        seed=args.seed,
    )
    ends: dict[int, float] = {}
    counted: dict[int, int] = {}

    class Clock:
        def write(self, generation: int, metrics) -> None:
            ends[int(generation)] = time.time()
            counted[int(generation)] = int(metrics["env_steps"])  # one replica's, with seeds

        def close(self) -> None:
            pass

    with tempfile.TemporaryDirectory(prefix="versus-evorl-") as folder:
        train(config, checkpoint_dir=None if args.chunked else folder, recorders=[Clock()])
    opener.join()
    return _child_report(ends, counted, generations)


def _child_report(ends: dict[int, float], counted: dict[int, int], generations: int) -> dict:
    import jax

    if sorted(ends) != list(range(1, generations + 1)):
        raise RuntimeError(f"generations recorded: {sorted(ends)}, expected 1..{generations}")
    device = jax.devices()[0]
    return {
        "first_generation_at": ends[1],
        "last_generation_at": ends[generations],
        "timed_generations": generations - 1,
        "generation_s": [round(ends[g + 1] - ends[g], 3) for g in range(1, generations)],
        # the framework's own counter: agent steps per timed generation (a check)
        "own_steps_per_generation": (counted[generations] - counted[1]) / (generations - 1)
        if generations > 1 and counted
        else None,
        "platform": device.platform,
        "device_kind": device.device_kind,
        "versions": package_versions(),
    }


# -- the parent ----------------------------------------------------------------------------------


def spawn(python: str, kind: str, row: str, args, extra: list[str], label: str) -> dict:
    """A child process (`kind`: "--child" or "--child-evorl"); its report, with
    `spawn_to_first_s` and `spawn_to_last_s` on the parent's clock and `gen_per_s`."""
    command = [python, "-W", "ignore", "-m", __spec__.name, kind, "--rows", row]
    command += ["--generations", str(args.generations), "--backend", args.backend, *extra]
    log = Path(args.logs or tempfile.gettempdir()) / f"versus-evorl-{row}-{label}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    spawned = time.time()
    with open(log, "w") as stderr:  # kept: a child that fails still shows where it was
        done = subprocess.run(
            command, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True,
            timeout=args.timeout,
        )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"{row} {label} exited {done.returncode}; its log: {log}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["spawn_to_first_s"] = report["first_generation_at"] - spawned
    report["spawn_to_last_s"] = report["last_generation_at"] - spawned
    timed = report["last_generation_at"] - report["first_generation_at"]
    report["gen_per_s"] = report["timed_generations"] / timed
    brief = {k: v for k, v in report.items() if k != "versions"}
    print(f"# {row} {label}: {json.dumps(brief)}", flush=True)
    return report


def _median(reports: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in reports)


def _describe(row: str, spec: dict) -> str:
    from benchmarks import chip_bench

    text = chip_bench.ROWS[row]
    if row == "openes-halfcheetah":
        text = text.replace("pop 1024", f"pop {spec['pop_size']}")
    return text


def _versions_line(side: str, report: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v)
    return f"# {side}: {report['platform']} ({report['device_kind']}); {versions}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    rows = (
        "openes-64",
        "openes-4096",
        "openes-halfcheetah",
        "cemrl-halfcheetah",
        "erlga-halfcheetah",
    )  # chip_bench.ROWS (not imported here: the EvoRL child has no evokube_trainer)
    parser.add_argument("--rows", nargs="+", default=list(rows), choices=rows)
    parser.add_argument("--generations", type=int, default=20, help="timed generations")
    parser.add_argument("--pairs", type=int, default=2, help="evokube/EvoRL process pairs a row")
    parser.add_argument(
        "--pop", type=int, help="population of the OpenES halfcheetah row (default: 1024)"
    )
    parser.add_argument(
        "--backend",
        default="generalized",
        help="Brax pipeline, passed to both sides (default: generalized, Brax's own default)",
    )
    parser.add_argument(
        "--seeds", type=int, default=1, help="with N > 1, a seeds row (the first of --rows)"
    )
    parser.add_argument(
        "--evorl-python",
        help="an interpreter that imports evorl already (a machine with no package index, "
        "such as a lent TPU, where its wheels were carried): no venv is made",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per process")
    parser.add_argument("--logs", help="folder for the children's logs (default: the temp folder)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-evorl", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--chunked", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_evorl:
        print(json.dumps(evorl_child(args)), flush=True)
        return
    if args.child:
        print(json.dumps(evokube_child(args)), flush=True)
        return

    started = load()
    if args.evorl_python:
        evorl = args.evorl_python
        stamp = {"installed_now": False, "install_s": "-", "pinned": "as given"}
    else:
        evorl, stamp = evorl_python()
    print(
        f"# {os.cpu_count()} CPUs; load average at start {started:.2f}; "
        f"{args.generations} timed generations a process, {args.pairs} pair(s) a row; "
        f"Brax pipeline {args.backend} on both sides",
        flush=True,
    )
    installed = "installed now" if stamp["installed_now"] else "installed earlier"
    print(
        f"# EvoRL: {EVORL_REQUIREMENT} {installed} in {stamp['install_s']} s "
        f"({evorl if args.evorl_python else evorl_home() / 'venv'}), pinned: {stamp['pinned']}",
        flush=True,
    )
    results = {}
    sides: dict[str, dict] = {}
    python = sys.executable
    for row in args.rows:
        spec = row_spec(row, args.backend, args.pop)
        common = ["--pop", str(spec["pop_size"])]
        runs: dict[str, list[dict]] = {"evokube": [], "evorl": [], "chunked": []}
        for pair in range(args.pairs):
            runs["evokube"].append(spawn(python, "--child", row, args, common, f"evokube-{pair}"))
            runs["evorl"].append(
                spawn(evorl, "--child-evorl", row, args, ["--spec", json.dumps(spec)],
                      f"evorl-{pair}")
            )  # fmt: skip
            runs["chunked"].append(
                spawn(python, "--child", row, args, [*common, "--chunked"], f"chunked-{pair}")
            )
        results[row] = (spec, runs)
        sides.setdefault("evokube", runs["evokube"][0])
        sides.setdefault("EvoRL", runs["evorl"][0])

    print()
    for side, report in sides.items():
        print(_versions_line(side, report))
    print(
        "# env steps: agent steps of population x T per generation, plus T per RL actor "
        "playing its own episode (ERL-GA's TD3 agent); evaluation and warm-up not counted"
    )
    print_header(
        "workload",
        "pop",
        "evokube gen/s",
        "EvoRL gen/s",
        "evokube / EvoRL",
        "evokube env steps/s",
        "EvoRL env steps/s",
        "evokube spawn -> first gen s",
        "EvoRL spawn -> first gen s",
        "evokube chunked gen/s (no eval, no ckpt)",
        "chunked / EvoRL",
    )
    for row, (spec, runs) in results.items():
        steps = steps_per_generation(spec)
        ours, theirs = _median(runs["evokube"], "gen_per_s"), _median(runs["evorl"], "gen_per_s")
        chunked = _median(runs["chunked"], "gen_per_s")
        print_row(
            _describe(row, spec),
            spec["pop_size"],
            f"{ours:.3g}",
            f"{theirs:.3g}",
            f"{ours / theirs:.2f}",
            f"{ours * steps:,.0f}",
            f"{theirs * steps:,.0f}",
            f"{_median(runs['evokube'], 'spawn_to_first_s'):.1f}",
            f"{_median(runs['evorl'], 'spawn_to_first_s'):.1f}",
            f"{chunked:.3g}",
            f"{chunked / theirs:.2f}",
        )

    if args.seeds > 1:
        seeds_row(args, evorl)
    print(f"# load average at end {load():.2f}")


def seeds_row(args: argparse.Namespace, evorl: str) -> None:
    """evokube with `seeds=N` in one process against N EvoRL processes in turn."""
    row, n = args.rows[0], args.seeds
    spec = row_spec(row, args.backend, args.pop)
    steps = steps_per_generation(spec) * (1 + args.generations)  # one replica's, spawn on
    common = ["--pop", str(spec["pop_size"])]
    ours = spawn(sys.executable, "--child", row, args, [*common, "--seeds", str(n)], f"seeds{n}")
    ours_s = ours["spawn_to_last_s"]
    theirs_s = 0.0
    for seed in range(n):
        extra = ["--spec", json.dumps(spec), "--seed", str(seed)]
        theirs_s += spawn(evorl, "--child-evorl", row, args, extra, f"evorl-seed{seed}")[
            "spawn_to_last_s"
        ]
    print()
    print(
        f"Seeds: {n} replicas of {1 + args.generations} generations each, wall time from "
        "spawn to the last generation (EvoRL: the sum over its processes)"
    )
    print_header(
        "workload",
        "seeds",
        "evokube processes",
        "evokube wall s",
        "EvoRL processes",
        "EvoRL wall s",
        "evokube env steps/s",
        "EvoRL env steps/s",
        "evokube / EvoRL",
    )
    print_row(
        _describe(row, spec),
        n,
        1,
        f"{ours_s:.1f}",
        n,
        f"{theirs_s:.1f}",
        f"{n * steps / ours_s:,.0f}",
        f"{n * steps / theirs_s:,.0f}",
        f"{theirs_s / ours_s:.2f}",
    )


if __name__ == "__main__":
    main()
