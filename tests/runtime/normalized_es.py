"""One process of a small OpenES run with observation normalization, for test_multihost.

    python -m tests.runtime.normalized_es OUT_DIR

Joins the process group the environment describes (the variables the operator sets on a pod),
spreads the generation over every device of every process, runs three generations and writes
OUT_DIR/process-<i>.json: per generation, the fitness, the evaluation return and this process's
copy of the observation statistics, and whether all of its devices hold the same copy.
"""

import json
import sys
from pathlib import Path

GENERATIONS = 3


def main(out: Path) -> None:
    from evokube_trainer.runtime import distributed

    distributed.initialize(distributed.ProcessGroup.from_env())

    import jax
    import numpy as np

    from evokube_trainer.workflows import (
        DeviceLayout,
        ECConfig,
        EnvConfig,
        jit_workflow,
        make_workflow,
    )

    config = ECConfig(
        env=EnvConfig(
            "gymnax/Pendulum-v1", episode_length=50, eval_episodes=2, normalize_observations=True
        ),
        pop_size=8,
        optimizer="open_es",
        optimizer_options={"sigma": 0.1, "learning_rate": 0.05},
        actor_hidden_sizes=(16, 16),
    )
    workflow = make_workflow(config, DeviceLayout.over_all_devices())
    fns = jit_workflow(workflow)
    state = fns.init(jax.random.PRNGKey(7))
    rows = []
    for _ in range(GENERATIONS):
        state, metrics = fns.step(state)
        metrics = {**jax.device_get(metrics), **jax.device_get(fns.evaluate(state)[0])}
        stats = state.obs_stats
        shards = [
            [np.asarray(shard.data) for shard in leaf.addressable_shards]
            for leaf in jax.tree.leaves(stats)
        ]
        rows.append(
            {
                "generation": int(metrics["generation"]),
                "fitness_max": float(metrics["ec/fitness_max"]),
                "fitness_mean": float(metrics["ec/fitness_mean"]),
                "eval_return": float(metrics["eval/return_mean"]),
                "count": float(stats.count.addressable_data(0)),
                "mean": np.asarray(stats.mean.addressable_data(0)).tolist(),
                "m2": np.asarray(stats.m2.addressable_data(0)).tolist(),
                "devices_agree": all(
                    np.array_equal(copy, copies[0]) for copies in shards for copy in copies
                ),
                "local_devices": len(shards[0]),
            }
        )
    path = out / f"process-{jax.process_index()}.json"
    path.write_text(json.dumps(rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
