"""The trainer's policy exporter (`evokube_trainer.policies.PolicyExporter`) on its own: which
folders each evaluation writes, `keep`, when best/ is replaced, the best so far read back by a
new life, and storage errors that are logged and retried instead of raised.

`tests/runtime/test_policy_export.py` runs the same through real training runs.
"""

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evokube_trainer.agents import Actor, ParamFlattener
from evokube_trainer.policies import PolicyExporter, network_config, read_policy

NETWORK = Actor(action_dim=1, hidden_sizes=(4,))
FLATTENER = ParamFlattener.from_params(NETWORK.init(jax.random.PRNGKey(0), jnp.zeros((3,))))
METADATA = {
    "algorithm": "openes",
    "environment": {
        "name": "gymnax/Pendulum-v1",
        "episodesPerEvaluation": 1,
        "actionRepeat": 1,
        "rewardScale": 1.0,
    },
    "evaluationEpisodes": 2,
    "network": network_config(NETWORK),
    "seed": 0,
}


def exporter(root, keep=2) -> PolicyExporter:
    return PolicyExporter(
        root=str(root), keep=keep, unflatten=FLATTENER.unflatten, metadata=METADATA
    )


def policy(value: float) -> jax.Array:
    return jnp.full((FLATTENER.num_dims,), value, jnp.float32)  # [D]


def folders(root) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_each_evaluation_writes_its_generation_and_best_only_when_beaten(tmp_path):
    export = exporter(tmp_path)
    returns = {1: -900.0, 2: -700.0, 3: -800.0, 4: -700.0, 5: float("nan")}
    for generation, value in returns.items():
        result = export.export(generation, policy(generation / 10), None, value)
    assert folders(tmp_path) == ["best", "generation-4", "generation-5"]  # keep=2
    # -700 at generation 4 only ties generation 2's: best/ still holds generation 2.
    assert result == {"bestReturn": -700.0, "generation": 2, "policyURI": f"{tmp_path}/best"}
    best = read_policy(str(tmp_path / "best"))
    assert best.metadata["generation"] == 2 and best.metadata["evalReturn"] == -700.0
    assert best.metadata["algorithm"] == "openes"
    np.testing.assert_array_equal(jax.tree.leaves(best.params)[0], np.float32(0.2))
    newest = read_policy(str(tmp_path / "generation-5"))
    assert np.isnan(newest.metadata["evalReturn"])


def test_a_new_life_keeps_the_best_of_the_earlier_ones(tmp_path):
    exporter(tmp_path).export(4, policy(0.4), None, -300.0)
    resumed = exporter(tmp_path)
    assert resumed.export(5, policy(0.5), None, -400.0)["generation"] == 4
    assert read_policy(str(tmp_path / "best")).metadata["generation"] == 4
    assert resumed.export(6, policy(0.6), None, -200.0)["generation"] == 6
    assert read_policy(str(tmp_path / "best")).metadata["evalReturn"] == -200.0


def test_storage_errors_are_logged_and_retried_at_the_next_evaluation(tmp_path, caplog):
    root = tmp_path / "policies"
    root.write_text("a file where the folder should be")  # every write fails
    export = exporter(root)
    with caplog.at_level(logging.WARNING):
        assert export.export(1, policy(0.1), None, -500.0) is None
    assert "policy export: could not write generation-1" in caplog.text
    assert "could not read the best policy so far" in caplog.text

    root.unlink()  # storage is back: the pending best is written with the next generation
    result = export.export(2, policy(0.2), None, -600.0)
    assert result["generation"] == 1 and result["bestReturn"] == -500.0
    assert folders(root) == ["best", "generation-2"]
    assert json.loads((root / "best" / "policy.json").read_text())["generation"] == 1


def test_in_a_bucket(tmp_path):
    root = f"memory://export-{tmp_path.name}/run/policies"
    export = exporter(root, keep=1)
    for generation in (1, 2, 3):
        export.export(generation, policy(0.0), None, -float(generation))
    assert read_policy(f"{root}/best").metadata["generation"] == 1
    assert read_policy(f"{root}/generation-3").metadata["generation"] == 3
    with pytest.raises(Exception, match="no complete policy"):
        read_policy(f"{root}/generation-2")


def test_unflattening_on_the_host_gives_exactly_the_networks_parameters():
    """The export cuts the flat candidate with NumPy (nothing compiles on a device): the same
    leaves, shapes, dtypes and values as the network's own unflatten."""
    from evokube_trainer.agents import GaussianActor
    from evokube_trainer.policies.export import unflatten_on_host

    for network in (NETWORK, GaussianActor(action_dim=2, hidden_sizes=(5, 3))):
        flattener = ParamFlattener.from_params(network.init(jax.random.PRNGKey(1), jnp.zeros((4,))))
        flat = jax.random.normal(jax.random.PRNGKey(2), (flattener.num_dims,))
        on_host = unflatten_on_host(flattener.unflatten, np.asarray(flat))
        on_device = jax.device_get(flattener.unflatten(flat))
        assert jax.tree.structure(on_host) == jax.tree.structure(on_device)
        for host_leaf, device_leaf in zip(
            jax.tree.leaves(on_host), jax.tree.leaves(on_device), strict=True
        ):
            assert isinstance(host_leaf, np.ndarray) and host_leaf.dtype == device_leaf.dtype
            np.testing.assert_array_equal(host_leaf, device_leaf)
