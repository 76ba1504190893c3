"""One valid ERLSweep and the invalid variants of it that must be refused, as tests/bad_manifests.py
has for ERLExperiments.

Both gates check the same list: the real API server (tests/operator/test_sweep_crd.py) and the
offline validation of `evokube validate` (tests/test_sweep_model.py). Each case names the field
its refusal must be reported on (`with_changes` sets dotted paths; a parameter is replaced whole).
"""

from __future__ import annotations

from typing import Any

from tests.bad_manifests import BASE, DELETE, BadManifest

SWEEP: dict[str, Any] = {
    "apiVersion": "evokube.io/v1alpha1",
    "kind": "ERLSweep",
    "metadata": {"name": "ok"},
    "spec": {
        "template": {"metadata": {"labels": {"team": "a"}}, "spec": BASE["spec"]},
        "parameters": [
            {"path": "spec.algorithm.rl.actorLearningRate", "values": [0.001, 0.0003]},
            {
                "path": "spec.algorithm.rl.tau",
                "distribution": {"type": "logUniform", "low": 0.001, "high": 0.1},
            },
        ],
        "samples": 2,
    },
}
FIRST, SECOND = "spec.parameters[0]", "spec.parameters[1]"
LR = {"path": "spec.algorithm.rl.actorLearningRate", "values": [0.001]}


def _drawn(**distribution: Any) -> dict[str, Any]:
    """spec.parameters with a second parameter drawn from `distribution`."""
    return {
        "spec.parameters": [LR, {"path": "spec.algorithm.rl.tau", "distribution": distribution}]
    }


def _path(path: str) -> dict[str, Any]:
    return {"spec.parameters": [LR, {"path": path, "values": [1]}]}


BAD_SWEEPS = [
    BadManifest("name too long for its children", {"metadata.name": "s" * 40}, "metadata.name"),
    BadManifest("no template", {"spec.template": DELETE}, "spec.template"),
    BadManifest("template without spec", {"spec.template": {}}, "spec.template.spec"),
    BadManifest("no parameters", {"spec.parameters": DELETE}, "spec.parameters"),
    BadManifest("empty parameters", {"spec.parameters": []}, "spec.parameters"),
    BadManifest("17 parameters", {"spec.parameters": [LR] * 17}, "spec.parameters"),
    BadManifest("path not a field", _path("spec.algorithm.rl.learningRate"), f"{SECOND}.path"),
    BadManifest("path into status", _path("status.phase"), f"{SECOND}.path"),
    BadManifest("path into metadata", _path("metadata.name"), f"{SECOND}.path"),
    BadManifest("path into a list", _path("spec.tolerations.key"), f"{SECOND}.path"),
    BadManifest("path set twice", _path(LR["path"]), "spec.parameters"),
    BadManifest(
        "path inside another", _path("spec.algorithm.rl.actorLearningRate.x"), f"{SECOND}.path"
    ),
    BadManifest("object and its field", _path("spec.algorithm.rl"), "spec.parameters"),
    BadManifest(
        "values and distribution",
        {"spec.parameters": [{**LR, "distribution": {"type": "choice", "choices": [1]}}]},
        "spec.parameters[0]",
    ),
    BadManifest(
        "neither values nor distribution",
        {"spec.parameters": [{"path": LR["path"]}]},
        "spec.parameters[0]",
    ),
    BadManifest("no values", {"spec.parameters": [{**LR, "values": []}]}, f"{FIRST}.values"),
    BadManifest(
        "unknown distribution", _drawn(type="normal", low=0, high=1), f"{SECOND}.distribution.type"
    ),
    BadManifest(
        "low above high", _drawn(type="uniform", low=2, high=1), f"{SECOND}.distribution.high"
    ),
    BadManifest(
        "low equal to high", _drawn(type="uniform", low=1, high=1), f"{SECOND}.distribution.high"
    ),
    BadManifest(
        "logUniform from 0", _drawn(type="logUniform", low=0, high=1), f"{SECOND}.distribution.low"
    ),
    BadManifest(
        "intUniform of fractions",
        _drawn(type="intUniform", low=0.5, high=4),
        f"{SECOND}.distribution.low",
    ),
    BadManifest(
        "uniform without low", _drawn(type="uniform", high=1), f"{SECOND}.distribution.low"
    ),
    BadManifest("choice without choices", _drawn(type="choice"), f"{SECOND}.distribution"),
    BadManifest(
        "empty choices", _drawn(type="choice", choices=[]), f"{SECOND}.distribution.choices"
    ),
    BadManifest(
        "choices of a uniform",
        _drawn(type="uniform", low=0, high=1, choices=[1]),
        f"{SECOND}.distribution",
    ),
    BadManifest(
        "low of a choice", _drawn(type="choice", choices=[1], low=0), f"{SECOND}.distribution.low"
    ),
    BadManifest("no samples", {"spec.samples": 0}, "spec.samples"),
    BadManifest("negative seed", {"spec.seed": -1}, "spec.seed"),
    BadManifest("maxParallel 0", {"spec.maxParallel": 0}, "spec.maxParallel"),
    BadManifest("queue not a name", {"spec.queueName": "Team_A"}, "spec.queueName"),
    BadManifest("unknown field", {"spec.parallelism": 2}, "spec.parallelism"),
    # The template is an experiment spec by the ERLExperiment CRD's schema (issue 37): no
    # unknown field, no type an experiment refuses, nothing larger than an experiment admits.
    BadManifest(
        "template field unknown", {"spec.template.spec.extra": "x"}, "spec.template.spec.extra"
    ),
    BadManifest(
        "template algorithm a string",
        {"spec.template.spec.algorithm": "openes"},
        "spec.template.spec.algorithm",
    ),
    BadManifest(
        "template env value too long",
        {"spec.template.spec.env": [{"name": "A", "value": "x" * 1025}]},
        "spec.template.spec.env[0].value",
    ),
    BadManifest(
        "template population size 0",
        {"spec.template.spec.population": {"size": 0}},
        "spec.template.spec.population.size",
    ),
]
