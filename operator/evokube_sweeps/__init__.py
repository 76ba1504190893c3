"""What an ERLSweep does: many ERLExperiments from one template, and what their outcomes say
(docs/sweeps.md).

The operator's sweep controller and the laptop's `evokube sweep` both expand a sweep with
`expand`, build each child with `child_manifest` and report with `summarize`, so a sweep gives
the same children, names and summary on a cluster and on a laptop. Its names and bounds are the
contract's (`evokube_contract.sweep`).

Expansion: the grid of every `values` parameter (the first parameter varies slowest), crossed
with `samples` draws of every `distribution` parameter, drawn in order from
`random.Random(seed)`; every grid point gets the same draws, so a sweep compares settings on
equal terms. Drawn floats keep 6 significant digits, so that they read back unchanged from YAML.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import random
import statistics
from collections.abc import Mapping
from typing import Any, Final

from evokube_contract import API_VERSION, KIND
from evokube_contract.sweep import (
    DISTRIBUTIONS,
    EXPERIMENT_PATHS,
    MAX_CHILDREN,
    SIGNIFICANT_DIGITS,
    SWEEP_ASSIGNMENT_ANNOTATION,
    SWEEP_INDEX_LABEL,
    SWEEP_LABEL,
)

# Student's t: the 0.975 quantile by degrees of freedom, 1..30 (a 95% two-sided interval).
_T975: Final = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
_Z975: Final = 1.959963984540054


class SweepError(ValueError):
    """A sweep that cannot expand; `field` is the path of the field at fault."""

    def __init__(self, field: str, reason: str):
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


def t975(df: int) -> float:
    """Student's t 0.975 quantile: the table up to 30 degrees of freedom, then the
    Cornish-Fisher expansion around the normal's (within 1e-4)."""
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


# -- expansion ----------------------------------------------------------------------------------
def _check_path(path: Any, field: str, earlier: list[str]) -> None:
    if path not in EXPERIMENT_PATHS:
        raise SweepError(
            field, f"{path!r} is not a field of an ERLExperiment's spec (EXPERIMENT_PATHS)"
        )
    for other in earlier:
        if path == other or path.startswith(f"{other}.") or other.startswith(f"{path}."):
            raise SweepError(field, f"{path} overlaps the parameter {other}")


def _check_template_crossing(template: Mapping[str, Any], path: str, field: str) -> None:
    """A parameter's path may only pass through objects of the template: `spec.algorithm.ec.x`
    cannot be set where the template says `algorithm: openes`."""
    node: Any = template
    crossed = "spec"
    for part in path.split(".")[1:-1]:
        crossed = f"{crossed}.{part}"
        node = node.get(part)  # a Mapping: anything else was refused one part earlier
        if node is None:
            return  # unset below here: the child gets the objects it needs
        if not isinstance(node, Mapping):
            raise SweepError(
                field,
                f"{path} crosses spec.template.{crossed}, which the template sets to "
                f"{json.dumps(node)[:60]} (not an object)",
            )


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SweepError(field, f"{value!r} is not a number")
    return value


def _drawer(distribution: Any, field: str):
    """A function of a random.Random drawing one value of `distribution`."""
    kind = distribution.get("type") if isinstance(distribution, Mapping) else None
    if kind not in DISTRIBUTIONS:
        raise SweepError(f"{field}.type", f"{kind!r} is not one of {', '.join(DISTRIBUTIONS)}")
    if kind == "choice":
        choices = distribution.get("choices")
        if not isinstance(choices, list) or not choices:
            raise SweepError(f"{field}.choices", "a choice needs at least one choice")
        return lambda rng: copy.deepcopy(rng.choice(choices))
    low = _number(distribution.get("low"), f"{field}.low")
    high = _number(distribution.get("high"), f"{field}.high")
    if not low < high:
        raise SweepError(f"{field}.high", f"high ({high}) must be greater than low ({low})")
    if kind == "intUniform":
        if low != int(low) or high != int(high):
            raise SweepError(f"{field}.low", "intUniform's low and high are integers")
        return lambda rng: rng.randint(int(low), int(high))  # both ends included
    if kind == "logUniform":
        if low <= 0:
            raise SweepError(f"{field}.low", f"logUniform's low ({low}) must be greater than 0")
        return lambda rng: _rounded(math.exp(rng.uniform(math.log(low), math.log(high))))
    return lambda rng: _rounded(rng.uniform(low, high))


def _rounded(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def expand(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The children's assignments `{path: value}`, in order; SweepError names the field at
    fault."""
    parameters = spec.get("parameters") or []
    template = (spec.get("template") or {}).get("spec") or {}
    axes: list[tuple[str, list]] = []
    drawers: list[tuple[str, Any]] = []
    paths: list[str] = []
    for i, parameter in enumerate(parameters):
        field = f"spec.parameters[{i}]"
        _check_path(parameter.get("path"), f"{field}.path", paths)
        _check_template_crossing(template, parameter["path"], f"{field}.path")
        paths.append(parameter["path"])
        if ("values" in parameter) == ("distribution" in parameter):
            raise SweepError(field, "set exactly one of values and distribution")
        if "values" in parameter:
            if not parameter["values"]:
                raise SweepError(f"{field}.values", "a grid axis needs at least one value")
            axes.append((parameter["path"], parameter["values"]))
        else:
            drawer = _drawer(parameter["distribution"], f"{field}.distribution")
            drawers.append((parameter["path"], drawer))
    samples = spec.get("samples", 1) if drawers else 1
    total = math.prod(len(values) for _, values in axes) * samples
    if total > MAX_CHILDREN:
        raise SweepError(
            "spec.parameters", f"expands to {total} children, more than {MAX_CHILDREN}"
        )
    rng = random.Random(spec.get("seed", 0))
    draws = [{path: draw(rng) for path, draw in drawers} for _ in range(samples)]
    grid = itertools.product(*(values for _, values in axes))
    children = []
    for point, drawn in itertools.product(grid, draws):
        values = {**dict(zip((path for path, _ in axes), point, strict=True)), **drawn}
        children.append({p: copy.deepcopy(values[p]) for p in paths})  # in parameter order
    return children


# -- the children -------------------------------------------------------------------------------
def child_name(sweep_name: str, index: int) -> str:
    """`<sweep>-<index>`: a valid ERLExperiment name (multislice included) whenever the sweep's
    name is at most MAX_SWEEP_NAME characters and index < MAX_CHILDREN."""
    return f"{sweep_name}-{index}"


def _set(spec: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")[1:]  # after "spec"
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = copy.deepcopy(value)


def child_manifest(sweep: Mapping[str, Any], index: int, assignment: Mapping[str, Any]) -> dict:
    """Child `index` of `sweep`: the template with `assignment` set, labelled as the sweep's."""
    meta, spec = sweep["metadata"], sweep["spec"]
    template = spec["template"]
    template_meta = template.get("metadata") or {}
    child_spec = copy.deepcopy(template["spec"])
    if spec.get("queueName"):
        child_spec["queueName"] = spec["queueName"]
    for path, value in assignment.items():
        _set(child_spec, path, value)
    metadata: dict[str, Any] = {
        "name": child_name(meta["name"], index),
        "labels": {
            **(template_meta.get("labels") or {}),
            SWEEP_LABEL: meta["name"],
            SWEEP_INDEX_LABEL: str(index),
        },
        "annotations": {
            **(template_meta.get("annotations") or {}),
            SWEEP_ASSIGNMENT_ANNOTATION: json.dumps(dict(assignment), separators=(",", ":")),
        },
    }
    if meta.get("namespace"):
        metadata["namespace"] = meta["namespace"]
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": child_spec}


# -- the summary --------------------------------------------------------------------------------
def interval(values: list[float]) -> dict[str, Any]:
    """`{mean, interval, n}`: the mean and its 95% Student-t half-width (0 for one value)."""
    n = len(values)
    mean = statistics.fmean(values)
    half = t975(n - 1) * statistics.stdev(values) / math.sqrt(n) if n > 1 else 0.0
    return {"mean": mean, "interval": half, "n": n}


def _seed_values(child: Mapping[str, Any], key: str) -> list[float]:
    seeds = ((child.get("status") or {}).get("progress") or {}).get("seeds") or []
    found = [s.get(key) for s in seeds if isinstance(s, Mapping)]
    return [
        v
        for v in found
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ]


def _configuration(child: Mapping[str, Any]) -> dict[str, Any]:
    meta = child.get("metadata") or {}
    annotation = (meta.get("annotations") or {}).get(SWEEP_ASSIGNMENT_ANNOTATION)
    configuration: dict[str, Any] = {"name": meta.get("name")}
    if annotation:
        configuration["assignment"] = json.loads(annotation)
    phase = (child.get("status") or {}).get("phase")
    if phase:
        configuration["phase"] = phase
    for key, out in (("bestFitness", "best"), ("fitness", "final")):
        values = _seed_values(child, key)
        if values:
            configuration[out] = interval(values)
    return configuration


def _index(child: Mapping[str, Any]) -> int:
    label = ((child.get("metadata") or {}).get("labels") or {}).get(SWEEP_INDEX_LABEL, "")
    return int(label) if label.isdigit() else MAX_CHILDREN


def summarize(children: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The sweep's status summary of `children` (ERLExperiment objects with their status):
    `counts` per phase, one configuration per child in index order, and `bestConfiguration`,
    the child of the highest mean best fitness. What a child does not report is left out."""
    ordered = sorted(children, key=lambda c: (_index(c), (c.get("metadata") or {}).get("name")))
    return tally([_configuration(child) for child in ordered])


def tally(configurations: list[dict[str, Any]]) -> dict[str, Any]:
    """`counts` per phase, the `configurations` themselves and `bestConfiguration` (the
    highest mean best fitness, the first of equals) of configurations as `summarize` makes
    them: the operator tallies its own list too (with the finished children gone since)."""
    counts: dict[str, int] = {}
    for configuration in configurations:
        if "phase" in configuration:
            counts[configuration["phase"]] = counts.get(configuration["phase"], 0) + 1
    summary: dict[str, Any] = {"counts": counts, "configurations": configurations}
    scored = [c for c in configurations if "best" in c]
    if scored:
        best = max(scored, key=lambda c: c["best"]["mean"])  # the first of equals
        summary["bestConfiguration"] = {"name": best["name"], "best": best["best"]}
    return summary
