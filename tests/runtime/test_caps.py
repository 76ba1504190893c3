"""Every numeric cap of the ERLExperiment and ERLSweep CRDs says why it is there, and the caps
the trainer's int32 arithmetic relies on are the ones it was written for (issue 42)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import yaml

from evokube_trainer.runtime.config import GENERATION_LIMIT

ROOT = Path(__file__).resolve().parents[2]
CRDS = ("crds/erlexperiments.evokube.io.yaml", "crds/erlsweeps.evokube.io.yaml")
# "at most <cap>" then its reason, after a colon or in parentheses, in the same sentence.
REASON = re.compile(r"at most [^.;:()]*[:(] *\w", re.IGNORECASE)


def _spec_schema(path: str) -> dict:
    crd = yaml.safe_load((ROOT / path).read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def capped_fields(schema: dict, path: str = "spec") -> Iterator[tuple[str, dict]]:
    """(path, schema) of every integer with a maximum, and every number whose maximum is
    more than a share's 1, under `schema`."""
    kind, most = schema.get("type"), schema.get("maximum")
    if most is not None and (kind == "integer" or (kind == "number" and most > 1)):
        yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from capped_fields(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from capped_fields(schema["items"], f"{path}[]")


def _field(schema: dict, dotted: str) -> dict:
    for name in dotted.split("."):
        schema = schema["properties"][name]
    return schema


def test_every_numeric_cap_keeps_its_reason_in_its_description():
    missing = [
        f"{crd}: {path} (maximum {schema['maximum']}): {schema.get('description')!r}"
        for crd in CRDS
        for path, schema in capped_fields(_spec_schema(crd))
        if not REASON.search(" ".join((schema.get("description") or "").split()))
    ]
    assert not missing, "caps without a reason:\n" + "\n".join(missing)


def test_the_checker_finds_a_cap_without_a_reason():
    schema = {"properties": {"n": {"type": "integer", "maximum": 9, "description": "At most 9."}}}
    [(path, field)] = capped_fields(schema)
    assert path == "spec.n" and not REASON.search(field["description"])
    assert REASON.search("Count, at most 9 (memory: one row each).")


def test_the_caps_the_trainers_int32_arithmetic_was_written_for():
    spec = _spec_schema(CRDS[0])
    # The device's generation counter: maxGenerations and every interval stay below it.
    assert _field(spec, "stopping.maxGenerations")["maximum"] == GENERATION_LIMIT < 2**31 - 64
    for interval in (
        "checkpoint.intervalGenerations",
        "evaluation.intervalGenerations",
        "algorithm.rl.injectionInterval",
        "algorithm.pbt.interval",
    ):
        assert _field(spec, interval)["maximum"] <= GENERATION_LIMIT, interval
    # `add_member_steps`: each member's steps below 2**30, at most 2**21 members and agents.
    episode = _field(spec, "environment.episodeLength")["maximum"]
    episodes = _field(spec, "environment.episodesPerEvaluation")["maximum"]
    assert episode * episodes < 2**30
    members = _field(spec, "population.size")["maximum"]
    agents = _field(spec, "algorithm.rl.numAgents")["maximum"]
    assert members + agents <= 2**21
    # JSON carries integers exactly up to 2**53; the two-word step threshold holds 2**61.
    assert _field(spec, "stopping.maxEnvSteps")["maximum"] == 2**53
