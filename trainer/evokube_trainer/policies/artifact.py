"""Policy artifacts: a trained actor as a small folder, loadable without the training state.

One folder per policy (format `evokube.policy/v1`):

* `params.npz` -- numpy only: the actor's parameter pytree flattened to '/'-joined paths
  (`params/MLP_0/Dense_0/kernel`, ...), plus `obs_mean`, `obs_var` and `obs_count` when the
  policy normalizes its observations.
* `policy.json` -- the metadata (human-readable): `format`, `algorithm`, `environment` (the
  experiment's `spec.environment`), `evaluationEpisodes`, `normalizeObservations`, `network`
  (type, sizes), `generation`, `evalReturn`, `seed`, `evokubeVersion`, and `paramsFile`: the
  size and SHA-256 of the `params.npz` it describes.

Nothing in it depends on the device layout or the number of hosts that trained it: the arrays
are whole numpy arrays, so a policy exported by a 4-host TPU run loads on a laptop.

Consistency: `write_policy` writes `params.npz` first and `policy.json` last, each in one
write (a local file goes to a temporary name, then is renamed; an object in a bucket appears
whole). `read_policy` reads `policy.json`, then `params.npz`, and accepts the pair only when
the checksum matches; a mismatch means a writer replaced the folder between the two reads, so
it reads again. A folder being overwritten (`policies/best/`) is thus never seen half-written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import time
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import fsspec
import jax
import jax.numpy as jnp
import numpy as np

from evokube_trainer.agents import Actor, GaussianActor, deterministic_policy
from evokube_trainer.envs import RunningStats, normalize_obs
from evokube_trainer.workflows import EnvConfig, to_env_config

__all__ = [
    "FORMAT",
    "METADATA_FILE",
    "PARAMS_FILE",
    "PolicyArtifact",
    "PolicyReadError",
    "network_config",
    "network_from_config",
    "read_policy",
    "write_policy",
]

Array = jax.Array
Params = Any

FORMAT = "evokube.policy/v1"
METADATA_FILE = "policy.json"
PARAMS_FILE = "params.npz"
_OBS_KEYS = ("obs_mean", "obs_var", "obs_count")
_NETWORKS: Mapping[str, type[Actor] | type[GaussianActor]] = {
    "Actor": Actor,
    "GaussianActor": GaussianActor,
}


class PolicyReadError(Exception):
    """The folder holds no complete policy of a format this version reads."""


@dataclasses.dataclass(frozen=True, eq=False)
class PolicyArtifact:
    """One exported policy: metadata, actor parameters and observation statistics.

    `eq=False`: compared and hashed by identity, so `jax.jit(artifact.act)` works (the fields
    hold arrays and dicts, which do not hash).
    """

    metadata: Mapping[str, Any]  # the content of policy.json
    params: Params  # the actor network's parameter pytree (numpy arrays)
    obs_stats: RunningStats | None  # observation-normalization statistics, or None

    @property
    def network(self) -> Actor | GaussianActor:
        return network_from_config(self.metadata["network"])

    @property
    def env_config(self) -> EnvConfig:
        """The environment as trained (`spec.environment`, mapped as the trainer maps it)."""
        return to_env_config(
            self.metadata["environment"],
            eval_episodes=self.metadata["evaluationEpisodes"],
            normalize_observations=self.metadata["normalizeObservations"],
        )

    def act(self, obs: Array) -> Array:
        """Deterministic action `[..., action_dim]` for obs `[..., obs_dim]` (raw, as the env
        gives them): the action training's evaluation took, normalization included. Jittable.
        Discrete envs take the argmax of the scores it returns, as in training."""
        obs = jnp.asarray(obs, jnp.float32)
        if self.obs_stats is not None:
            obs = normalize_obs(self.obs_stats, obs)
        return deterministic_policy(self.network, self.params, obs)


def network_config(network: nn.Module) -> dict[str, Any]:
    """The JSON description of an actor network that `network_from_config` rebuilds."""
    if type(network).__name__ not in _NETWORKS or network.activation is not nn.relu:
        raise ValueError(f"cannot export {network!r}: only relu Actor and GaussianActor are")
    config: dict[str, Any] = {
        "type": type(network).__name__,
        "actionDim": network.action_dim,
        "hiddenSizes": list(network.hidden_sizes),
        "activation": "relu",
    }
    if isinstance(network, GaussianActor):
        config.update(logStdMin=network.log_std_min, logStdMax=network.log_std_max)
    return config


def network_from_config(config: Mapping[str, Any]) -> Actor | GaussianActor:
    network_type = _NETWORKS.get(config["type"])
    if network_type is None or config.get("activation", "relu") != "relu":
        raise PolicyReadError(f"unknown network {dict(config)}")
    options = {}
    if network_type is GaussianActor:
        options = dict(log_std_min=config["logStdMin"], log_std_max=config["logStdMax"])
    return network_type(
        action_dim=config["actionDim"], hidden_sizes=tuple(config["hiddenSizes"]), **options
    )


def write_policy(url: str, artifact: PolicyArtifact) -> None:
    """Writes the artifact's folder at `url` (a local folder, gs://, s3://, memory://, ...),
    replacing a policy already there; see the module docstring for the order of writes."""
    fs, root = fsspec.core.url_to_fs(url)
    arrays = _flatten_params(artifact.params)
    if artifact.obs_stats is not None:
        stats = jax.device_get(artifact.obs_stats)
        arrays.update(
            obs_mean=np.asarray(stats.mean, np.float32),
            obs_var=np.asarray(stats.var, np.float32),
            obs_count=np.asarray(stats.count, np.float32),
        )
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **arrays)
    params_bytes = buffer.getvalue()
    metadata = {
        **artifact.metadata,
        "format": FORMAT,
        "normalizeObservations": artifact.obs_stats is not None,
        "paramsFile": {
            "name": PARAMS_FILE,
            "bytes": len(params_bytes),
            "sha256": hashlib.sha256(params_bytes).hexdigest(),
        },
    }
    fs.makedirs(root, exist_ok=True)
    _write_whole(fs, f"{root}/{PARAMS_FILE}", params_bytes)
    _write_whole(fs, f"{root}/{METADATA_FILE}", json.dumps(metadata, indent=2).encode())


def read_policy(url: str, *, attempts: int = 5, retry_s: float = 0.2) -> PolicyArtifact:
    """The policy in folder `url`: numpy parameters, no training state, no device layout.

    Raises `PolicyReadError` when the folder holds no complete policy, or when its files still
    disagree after `attempts` reads (a writer replacing it each time)."""
    fs, root = fsspec.core.url_to_fs(url)
    for attempt in range(attempts):
        try:
            metadata = json.loads(fs.cat_file(f"{root}/{METADATA_FILE}"))
            params_bytes = fs.cat_file(f"{root}/{PARAMS_FILE}")
        except FileNotFoundError as err:
            raise PolicyReadError(f"{url} holds no complete policy: {err}") from None
        if metadata.get("format") != FORMAT:
            raise PolicyReadError(f"{url}: format {metadata.get('format')!r}, expected {FORMAT}")
        if hashlib.sha256(params_bytes).hexdigest() == metadata["paramsFile"]["sha256"]:
            return _from_files(metadata, params_bytes)
        if attempt + 1 < attempts:
            time.sleep(retry_s)
    raise PolicyReadError(f"{url}: {PARAMS_FILE} does not match {METADATA_FILE} (being written?)")


def _from_files(metadata: dict[str, Any], params_bytes: bytes) -> PolicyArtifact:
    with np.load(io.BytesIO(params_bytes)) as npz:
        arrays = {name: npz[name] for name in npz.files}
    obs_stats = None
    if metadata["normalizeObservations"]:
        mean, var, count = (arrays.pop(name) for name in _OBS_KEYS)
        # RunningStats keeps m2 = var * count; `var` then reads back (within float32 rounding).
        obs_stats = RunningStats(count=count, mean=mean, m2=var * count)
    return PolicyArtifact(metadata=metadata, params=_unflatten_params(arrays), obs_stats=obs_stats)


def _flatten_params(params: Params) -> dict[str, np.ndarray]:
    """Nested dicts of arrays -> {'a/b/c': array} (host numpy arrays)."""
    flat: dict[str, np.ndarray] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0]:
        if not all(isinstance(entry, jax.tree_util.DictKey) for entry in path):
            raise ValueError(f"parameters must be nested dicts of arrays; got the path {path}")
        names = [str(entry.key) for entry in path]
        if any("/" in name for name in names) or "/".join(names) in _OBS_KEYS:
            raise ValueError(f"cannot store the parameter {names}: its name is reserved")
        flat["/".join(names)] = np.asarray(leaf)
    return flat


def _unflatten_params(flat: Mapping[str, np.ndarray]) -> Params:
    params: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, name = path.split("/")
        node = params
        for parent in parents:
            node = node.setdefault(parent, {})
        node[name] = value
    return params


def _write_whole(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Writes `path` so that a reader sees the old content or the new one, never a part."""
    if "file" not in fs.protocol:  # an object store (or memory): an object appears whole
        fs.pipe_file(path, data)
        return
    temporary = f"{path}.tmp-{time.time_ns()}"
    fs.pipe_file(temporary, data)
    fs.mv(temporary, path)
