"""docs/quickstart.md as a user follows it: its blocks and the files they come from, the node
pools its gcloud commands create, the nodes GKE makes of them, and the trainer pods the
operator makes of its manifests."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from evokube_operator import api
from evokube_operator.desired import builders
from evokube_operator.reading.spec import Experiment, parse_spec
from evokube_trainer.runtime import manifest
from tests.cluster.controlplane import fake_node

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "docs" / "quickstart.md"
EXAMPLES = REPO / "examples" / "gke"
# A block names its file on the line before its opening fence.
BLOCK = re.compile(r"^<!-- file: (\S+) -->\n```[\w-]*\n(.*?)^```$", re.MULTILINE | re.DOTALL)
FENCE = re.compile(r"^```", re.MULTILINE)


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository
    text: str


def blocks() -> list[Block]:
    """Every fenced block of the quickstart that names its file, in order."""
    return [Block(m[1], m[2]) for m in BLOCK.finditer(QUICKSTART.read_text())]


def fenced_blocks() -> int:
    """How many fenced blocks the quickstart has, named or not."""
    return len(FENCE.findall(QUICKSTART.read_text())) // 2


def shown(path: Path) -> str:
    """What the quickstart shows of a file: a script from its first blank line on (its header
    sets the shell options, the folder and env.sh), anything else whole."""
    text = path.read_text()
    return text.split("\n\n", 1)[1] if path.suffix == ".sh" else text


def commands(script: Path) -> list[list[str]]:
    """Each command the quickstart shows of a script, as its words (quotes removed)."""
    body = shown(script).replace("\\\n", " ")
    return [shlex.split(line) for line in body.splitlines() if line.strip()]


def flags(words: list[str]) -> dict[str, str]:
    """--name=value (and bare --name, as "") of a command."""
    return dict(w[2:].partition("=")[::2] for w in words if w.startswith("--"))


def experiments() -> dict[Path, dict]:
    """The ERLExperiment manifests of examples/gke, by file."""
    found = {p: yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES.glob("*.yaml"))}
    return {p: m for p, m in found.items() if m.get("kind") == api.KIND}


# -- GKE ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Machine:
    """What GKE gives a node of one machine type: its accelerator, and how many per node."""

    cpu: str
    memory: str
    tpu: str | None = None  # cloud.google.com/gke-tpu-accelerator
    topology: str | None = None  # a single host's slice: cloud.google.com/gke-tpu-topology
    gpu: str | None = None  # cloud.google.com/gke-accelerator; the machine type fixes it
    count: int = 0  # chips or GPUs per node


# GKE's documentation ("Plan TPUs in GKE", "About GPUs in GKE"), for the machine types
# examples/gke creates only: a new one there needs its row here.
MACHINES = {
    "ct5lp-hightpu-8t": Machine(
        "224", "384Gi", tpu="tpu-v5-lite-podslice", topology="2x4", count=8
    ),
    "g2-standard-24": Machine("24", "96Gi", gpu="nvidia-l4", count=2),
}


@dataclass(frozen=True)
class NodePool:
    """One `gcloud container node-pools create` of the quickstart."""

    script: Path
    name: str
    flags: dict[str, str]

    @property
    def machine(self) -> Machine:
        return MACHINES[self.flags["machine-type"]]

    @property
    def accelerator(self) -> dict[str, str]:
        """--accelerator=type=...,count=...,... as a dict."""
        raw = self.flags.get("accelerator", "")
        return dict(item.partition("=")[::2] for item in raw.split(",") if item)

    def shape(self) -> dict[str, Any]:
        """What GKE gives each node of this pool (labels, taints, capacity), in the form of the
        test cluster's pools (tests/cluster/nodes.yaml)."""
        machine = self.machine
        labels = {"cloud.google.com/gke-nodepool": self.name}
        capacity = {"cpu": machine.cpu, "memory": machine.memory, "pods": "110"}
        if machine.tpu:
            labels[api.TPU_ACCELERATOR_SELECTOR] = machine.tpu
            labels[api.TPU_TOPOLOGY_SELECTOR] = self.flags.get("tpu-topology", machine.topology)
            resource = api.TPU_RESOURCE
        else:
            labels[api.GPU_PRODUCT_SELECTOR] = self.accelerator["type"]
            resource = api.GPU_RESOURCE
        capacity[resource] = str(machine.count)
        taints = [{"key": resource, "value": "present", "effect": "NoSchedule"}]
        return {"labels": labels, "taints": taints, "capacity": capacity}

    def nodes(self) -> list[dict[str, Any]]:
        """The pool's nodes, `<pool>-<i>`, as Node objects kwok can run."""
        count = int(self.flags["num-nodes"])
        return [fake_node(f"{self.name}-{i}", self.name, self.shape()) for i in range(count)]


def node_pools() -> list[NodePool]:
    """Every node pool the quickstart's scripts create."""
    found = []
    for script in sorted(EXAMPLES.glob("*.sh")):
        for words in commands(script):
            if words[:4] == ["gcloud", "container", "node-pools", "create"]:
                found.append(NodePool(script, words[4], flags(words)))
    return found


# -- what the operator makes of a manifest --------------------------------------------------
def trainer_job(document: dict, namespace: str = "default") -> dict[str, Any]:
    """The Job of the experiment's first gang, as the operator builds it."""
    defaulted, errors = manifest.check(document)
    assert errors == [], errors
    body = {**defaulted, "metadata": {**defaulted["metadata"], "namespace": namespace}}
    exp = Experiment.from_body(body)
    return builders.job(exp, parse_spec(exp.spec), 0)


def fits(job: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """Why one trainer pod of the Job cannot go on the node (empty: it fits), as the scheduler
    judges node selector, taints and extended resources."""
    pod = job["spec"]["template"]["spec"]
    labels, capacity = node["metadata"]["labels"], node["status"]["allocatable"]
    reasons = [
        f"nodeSelector {key}={value} (node: {labels.get(key)})"
        for key, value in (pod.get("nodeSelector") or {}).items()
        if labels.get(key) != value
    ]
    tolerated = {(t["key"], t.get("effect")) for t in pod.get("tolerations") or []}
    reasons += [
        f"taint {t['key']}:{t['effect']} not tolerated"
        for t in node["spec"]["taints"]
        if (t["key"], t["effect"]) not in tolerated
    ]
    for name, amount in pod["containers"][0]["resources"].get("limits", {}).items():
        if "/" in name and int(amount) > int(capacity.get(name, 0)):
            reasons.append(f"{name}: {amount} wanted, {capacity.get(name, 0)} on the node")
    return reasons
