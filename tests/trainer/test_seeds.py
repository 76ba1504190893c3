"""Seeds in one program (`Workflow.seeds`): N replicas vmapped over a leading axis of the whole
state, one computation. Replica i is the one-seed run of root seed `seed + i`; the replicas
differ; a checkpoint holds and restores all of them; the host reports their aggregate and each
one's values.
"""

import jax
import numpy as np
import pytest

from evokube_trainer.agents import TD3Config
from evokube_trainer.recorders import MemoryRecorder
from evokube_trainer.runtime.checkpoints import Checkpointer
from evokube_trainer.workflows import (
    CEMRLConfig,
    ECConfig,
    EnvConfig,
    ReplayConfig,
    StopAt,
    jit_workflow,
    make_workflow,
    replica_seed,
    seed_metrics,
)
from evokube_trainer.workflows._layout import DeviceLayout

SHORT_PENDULUM = EnvConfig(
    "gymnax/Pendulum-v1", episode_length=20, episodes_per_member=2, eval_episodes=2
)
CEMRL = CEMRLConfig(
    env=SHORT_PENDULUM,
    pop_size=4,
    agent=TD3Config(actor_hidden_sizes=(16, 16), critic_hidden_sizes=(32, 32)),
    updates_per_generation=4,
    replay=ReplayConfig(capacity=2048, batch_size=32, warmup_steps=128, warmup_envs=4),
)
OPENES = ECConfig(env=SHORT_PENDULUM, optimizer="open_es", pop_size=8, actor_hidden_sizes=(8,))


def _run(config, seeds: int, generations: int = 3, seed: int = 5):
    workflow = make_workflow(config, seeds=seeds)
    fns = jit_workflow(workflow)
    recorder = MemoryRecorder()
    state = workflow.learn(
        fns.init(workflow.root_key(seed)),
        stop=lambda m: m["generation"] >= generations,
        recorders=[recorder],
        eval_every=1,
        jitted=fns,
    )
    return workflow, fns, state, recorder


@pytest.fixture(scope="module", params=[CEMRL, OPENES], ids=["cem-rl", "open-es"])
def runs(request):
    return _run(request.param, seeds=1), _run(request.param, seeds=3)


def test_replica_zero_is_the_one_seed_run_and_the_replicas_differ(runs):
    (_, _, single, one), (_, _, state, three) = runs
    first = jax.tree.map(lambda leaf: leaf[0], state)
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(single), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    assert np.asarray(state.key).shape == (3, 2)
    final = [three.last(f"seed/{i}/ec/fitness_max") for i in range(3)]
    assert len(set(final)) == 3  # three different replicas
    assert final[0] == pytest.approx(one.last("ec/fitness_max"), rel=1e-4)
    # The aggregate is the replicas' mean; every SEED_METRICS value is given per replica.
    assert three.last("ec/fitness_max") == pytest.approx(np.mean(final))
    assert three.last("eval/return_mean") == pytest.approx(
        np.mean([three.last(f"seed/{i}/eval/return_mean") for i in range(3)])
    )
    assert three.last("generation") == 3
    assert not any(name.startswith("seed/") for name in one.records[-1][1])


def test_a_checkpoint_restores_every_replica(runs, tmp_path):
    _, (workflow, fns, state, _) = runs
    checkpointer = Checkpointer(tmp_path, interval=1, keep=1)
    checkpointer.save(3, state)
    restored, generation = checkpointer.restore_latest(workflow.state_shapes())
    checkpointer.close()
    assert generation == 3
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    continued, metrics = fns.step(state)
    resumed, resumed_metrics = fns.step(restored)
    assert np.asarray(metrics["ec/fitness_max"]).shape == (3,)
    for a, b in zip(jax.tree.leaves(continued), jax.tree.leaves(resumed), strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert np.array_equal(metrics["ec/fitness_max"], resumed_metrics["ec/fitness_max"])


def test_steps_stop_on_the_mean_best_fitness_of_the_replicas(runs):
    _, (workflow, fns, state, _) = runs
    _, rows, done, _ = fns.steps(state, *workflow.chunk_arguments(4, StopAt.of()))
    best = np.asarray(rows["ec/fitness_max"])[: int(done)]  # [generations, seeds]
    assert int(done) == 4 and best.shape == (4, 3)
    # A threshold between the replicas' mean and their best of the first generation: the
    # mean decides, so one replica reaching it does not stop the chunk.
    threshold = (best[0].mean() + best[0].max()) / 2
    reached = np.flatnonzero(best.mean(axis=1) >= threshold)
    _, _, done, _ = fns.steps(state, *workflow.chunk_arguments(4, StopAt.of(fitness=threshold)))
    assert int(done) == (reached[0] + 1 if reached.size else 4)
    assert int(done) >= 2  # the first generation's best replica reached it: no stop


def test_seed_metrics_are_the_mean_the_most_steps_and_each_replica():
    values = {
        "generation": np.array([4, 4], np.int32),
        "env_steps": np.array([100, 120], np.int32),
        "ec/fitness_max": np.array([-1.0, -3.0], np.float32),
        "replay/size": np.array([10, 20], np.int32),
    }
    metrics = seed_metrics(values, 2)
    assert metrics["generation"] == 4 and metrics["env_steps"] == 120
    assert metrics["ec/fitness_max"] == -2.0 and metrics["replay/size"] == 15.0
    assert metrics["seed/0/env_steps"] == 100 and metrics["seed/1/ec/fitness_max"] == -3.0
    assert "seed/0/replay/size" not in metrics
    one = seed_metrics({"generation": np.int32(4), "ec/fitness_max": np.float32(-1.5)}, 1)
    assert one == {"generation": 4, "ec/fitness_max": -1.5}


def test_the_replicas_root_seeds_wrap_into_32_bits():
    workflow = make_workflow(OPENES, seeds=3)
    keys = np.asarray(workflow.root_key(2**32 - 2))
    expected = [jax.random.PRNGKey(s) for s in (2**32 - 2, 2**32 - 1, 0)]
    assert np.array_equal(keys, np.stack(expected))
    assert replica_seed(2**32 - 1, 1) == 0 and replica_seed(7, 2) == 9


@pytest.mark.parametrize("member_major", [False, True])
def test_a_vmapped_members_call_folds_the_seeds_into_the_population(member_major):
    """`members_call` under the seeds' vmap runs its members as one `[S * N]` batch (what a
    TPU needs: a `[S, N]` batch of per-member matmuls ran 50x slower), with the values of
    the nested vmap, for batched and unbatched arguments alike; seed-major by a reshape alone,
    member-major (a sharded population) with a transpose."""
    from evokube_trainer.workflows._rollout import members_call

    def dense(params, obs, scale):  # one member: weights [i, o], obs [K, i], scale []
        return obs @ params["w"] * scale

    members = jax.vmap(dense)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w": jax.random.normal(keys[0], (3, 5, 8, 4))}  # [S, N, i, o]
    obs = jax.random.normal(keys[1], (3, 5, 2, 8))  # [S, N, K, i]
    scale = jax.random.uniform(keys[2], (5,))  # [N], the same for every seed
    nested = jax.vmap(members, in_axes=(0, 0, None))(params, obs, scale)
    folded = jax.vmap(members_call(members, member_major), in_axes=(0, 0, None))
    np.testing.assert_allclose(folded(params, obs, scale), nested, rtol=1e-6)
    unbatched = members_call(members, member_major)({"w": params["w"][1]}, obs[1], scale)
    np.testing.assert_allclose(unbatched, nested[1], rtol=1e-6)
    hlo = jax.jit(folded).lower(params, obs, scale).as_text()
    assert "tensor<15x2x8xf32>, tensor<15x8x4xf32>" in hlo  # one batch of S * N = 15
    assert ("stablehlo.transpose" in hlo) == member_major, hlo


def test_replicas_batches_are_gathered_in_turn_on_one_tpu_only(monkeypatch):
    from evokube_trainer.workflows import _build

    assert jax.default_backend() == "cpu"  # batched on the CPU, where in turn was slower
    assert not make_workflow(CEMRL, seeds=3).buffer.replicas_in_turn
    monkeypatch.setattr(_build, "REPLICAS_IN_TURN_PLATFORMS", ("cpu",))
    one_device = make_workflow(CEMRL, seeds=3)
    assert one_device.buffer.replicas_in_turn
    laid_out = make_workflow(CEMRL, DeviceLayout.over_all_devices(), seeds=3)
    assert not laid_out.buffer.replicas_in_turn
    # The generation of 3 replicas has no replay gather batched over the replicas' buffers (the
    # in-turn loop's are per replica).
    fns = jit_workflow(one_device)
    state = jax.eval_shape(fns.init, one_device.root_key(0))
    text = fns.steps.lower(state, *one_device.chunk_arguments(1, StopAt.of())).as_text()
    replay = [line for line in text.splitlines() if "stablehlo.gather" in line and "2048" in line]
    assert replay and not any("batching_dims = [0]" in line for line in replay)
