"""The environment catalog: every env the trainer accepts, with what its own spaces say.

``catalog.json`` beside this module lists every env of the installed gymnax registry
(``gymnax/<id>``) and Brax registry (``brax/<name>``) that the trainer can run, with its action
type (discrete or continuous, from the env's own action space), sizes and time limit, and the
registered envs it cannot run, each with the reason. The trainer reads the file at run time
(``load``, ``env_spec``), so that no process builds thirty envs to learn their names.

The file, the CRD's ``spec.environment.name`` enum and the CRD rule's list of discrete-action
envs are all written by ``python -m evokube_trainer.generate`` from ``survey.survey()``, and a
test fails when they differ from what the installed libraries give.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CATALOG_FILE = Path(__file__).with_name("catalog.json")
FAMILIES = ("gymnax", "brax")
REGENERATE = "python -m evokube_trainer.generate"


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What the catalog knows of one env, as the trainer's adapters see it."""

    name: str  # "gymnax/<id>" or "brax/<name>"
    actions: str  # "discrete" or "continuous": the type of the env's own action space
    action_dim: int  # scores a policy emits: n for Discrete(n), the flat size for a Box
    obs_dim: int  # the flattened observation size
    obs_shape: tuple[int, ...]  # the observation's own shape (e.g. (10, 10, 4) for MinAtar)
    episode_length: int  # the env's own time limit in agent steps (gymnax's; 1000 for Brax)

    @property
    def discrete(self) -> bool:
        return self.actions == "discrete"

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["name"]
        out["obs_shape"] = list(self.obs_shape)
        return out


@dataclasses.dataclass(frozen=True)
class Catalog:
    """The accepted envs by name, the excluded ones with their reasons, and the library versions
    they were read from."""

    envs: Mapping[str, EnvSpec]
    excluded: Mapping[str, str]
    libraries: Mapping[str, str]

    def discrete_names(self) -> list[str]:
        return [name for name, spec in self.envs.items() if spec.discrete]

    def to_json(self) -> dict[str, Any]:
        return {
            "generated_by": REGENERATE,
            "libraries": dict(sorted(self.libraries.items())),
            "envs": {name: self.envs[name].to_json() for name in sorted(self.envs)},
            "excluded": dict(sorted(self.excluded.items())),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Catalog:
        envs = {
            name: EnvSpec(name=name, **{**entry, "obs_shape": tuple(entry["obs_shape"])})
            for name, entry in data["envs"].items()
        }
        return cls(envs=envs, excluded=dict(data["excluded"]), libraries=dict(data["libraries"]))


def dumps(catalog: Catalog) -> str:
    """The catalog file's text: sorted, one env per line, stable across runs."""
    data = catalog.to_json()
    lines = ["{"]
    lines.append(f'  "generated_by": {json.dumps(data["generated_by"])},')
    lines.append(f'  "libraries": {json.dumps(data["libraries"])},')
    lines.append('  "envs": {')
    entries = [f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in data["envs"].items()]
    lines.append(",\n".join(entries))
    lines.append("  },")
    lines.append('  "excluded": {')
    reasons = [f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in data["excluded"].items()]
    lines.append(",\n".join(reasons))
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


@functools.cache
def load() -> Catalog:
    """The committed catalog (``catalog.json``), read once per process."""
    return Catalog.from_json(json.loads(CATALOG_FILE.read_text()))


def env_names() -> list[str]:
    """Every accepted env name, sorted."""
    return sorted(load().envs)


def env_spec(name: str) -> EnvSpec:
    """The catalog entry for ``name``; ValueError naming the reason for an excluded env, or the
    closest accepted names for an unknown one."""
    catalog = load()
    if name in catalog.envs:
        return catalog.envs[name]
    if name in catalog.excluded:
        raise ValueError(f"environment {name!r} is not supported: {catalog.excluded[name]}")
    family = name.partition("/")[0]
    if "/" not in name or family not in FAMILIES:
        raise ValueError(f"env name must look like 'gymnax/<id>' or 'brax/<name>', got {name!r}")
    close = difflib.get_close_matches(name, catalog.envs, n=3)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise ValueError(
        f"unknown environment {name!r}: not in the trainer's catalog of {len(catalog.envs)} "
        f"gymnax and Brax environments{hint}"
    )
