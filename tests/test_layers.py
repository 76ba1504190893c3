"""No back-arrows: each module imports only from its own layer or the layers below it, and no two
parts import each other, not even through a third (docs/architecture.md, "Layers").

Imports are read from the source (ast), those inside functions included: a lazy import is still
an arrow. A new module must belong to a part listed below; a new part must be given a layer.
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = {
    "evokube_contract": REPO / "operator",
    "evokube_operator": REPO / "operator",
    "evokube_sweeps": REPO / "operator",
    "evokube_trainer": REPO / "trainer",
}
# Top-level packages whose __init__ is a part of its own (version, docstring): each of their
# modules must belong to a listed part, not to the package as a whole.
HALVES = {"evokube_operator", "evokube_trainer"}

# Each half's parts, lowest layer first. A part is a package (all its modules) or one module.
TRAINER = (
    ("evokube_contract", "evokube_trainer"),  # the operator-trainer contract; the version
    ("evokube_sweeps",),  # what a sweep does, shared with the operator
    ("evokube_trainer.metric_names",),  # the metrics' names, spelled once
    ("evokube_trainer.utils", "evokube_trainer.replay", "evokube_trainer.recorders"),
    ("evokube_trainer.envs", "evokube_trainer.agents", "evokube_trainer.ec"),  # pure JAX parts
    ("evokube_trainer.workflows",),  # the generation loop that composes them
    ("evokube_trainer.policies",),  # exported policies: written, read, played
    ("evokube_trainer.runtime",),  # what runs in a pod
    # the `evokube` command and the CRD generator: tools of a laptop or a source checkout,
    # never in a pod
    ("evokube_trainer.laptop", "evokube_trainer.generate"),
)
OPERATOR = (
    ("evokube_contract", "evokube_operator"),
    ("evokube_sweeps",),  # what a sweep does, shared with the laptop's `evokube sweep`
    ("evokube_operator.api", "evokube_operator.conditions", "evokube_operator.util"),
    ("evokube_operator.reading",),  # the spec, read into values; what the watches saw
    ("evokube_operator.rules",),  # one rule each: failure, success, start-up, deadlines
    ("evokube_operator.desired",),  # desired objects (pure)
    ("evokube_operator.plans",),  # observation -> plan (pure)
    ("evokube_operator.cluster",),  # I/O: the API server, leader election, Prometheus
    ("evokube_operator.reconcilers",),  # carry a plan out
    ("evokube_operator.handlers", "evokube_operator.options"),  # Kopf
    ("evokube_operator.cli", "evokube_operator.__main__"),
)


def modules() -> dict[str, Path]:
    """Every module of the four packages, by dotted name."""
    found = {}
    for package, root in SOURCES.items():
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The project modules a file imports (the package, where the imported name is no module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{path}:{node.lineno}: write the import absolute"
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                found.add(target if target in known else node.module)
    return {m for m in found if m.partition(".")[0] in SOURCES}


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) for name, path in found.items()}


def part_of(module: str, stack) -> str | None:
    """The part of `stack` that holds `module`, or None where the stack has none."""
    for layer in stack:
        for part in layer:
            if module == part or (module.startswith(f"{part}.") and part not in HALVES):
                return part
    return None


def layer_of(part: str, stack) -> int:
    return next(i for i, layer in enumerate(stack) if part in layer)


def back_arrows(graph: dict[str, set[str]], stack) -> list[str]:
    """Each import by a module of `stack` from a layer above its own, or from outside the stack."""
    found = []
    for module, targets in sorted(graph.items()):
        part = part_of(module, stack)
        if part is None:
            continue
        for target in sorted(targets):
            target_part = part_of(target, stack)
            if target_part is None:
                found.append(f"{module} imports {target}, which is outside its half")
            elif layer_of(target_part, stack) > layer_of(part, stack):
                found.append(f"{module} imports {target}, a layer above its own")
    return found


def part_cycles(graph: dict[str, set[str]], stack) -> dict[str, list[str]]:
    """For each part on an import cycle between parts, the other parts on that cycle."""
    arrows: dict[str, set[str]] = {}
    for module, targets in graph.items():
        part = part_of(module, stack)
        if part is not None:
            arrows.setdefault(part, set())
            arrows[part] |= {part_of(t, stack) for t in targets} - {part, None}
    reach = {part: set(targets) for part, targets in arrows.items()}
    changed = True
    while changed:  # the transitive closure; a few dozen parts
        changed = False
        for targets in reach.values():
            more = set().union(*(reach.get(t, set()) for t in targets)) - targets
            changed = changed or bool(more)
            targets |= more
    return {
        part: sorted(o for o in reach[part] if o != part and part in reach.get(o, set()))
        for part in sorted(reach)
        if part in reach[part]
    }


def test_every_module_belongs_to_a_part_of_its_half():
    for name in modules():
        stack = TRAINER if name.startswith("evokube_trainer") else OPERATOR
        assert part_of(name, stack) is not None, f"{name}: give it a layer in {__file__}"


def test_no_module_imports_from_a_layer_above_its_own():
    graph = import_graph()
    for stack in (TRAINER, OPERATOR):
        assert back_arrows(graph, stack) == []


def test_no_import_cycle_between_parts():
    graph = import_graph()
    for stack in (TRAINER, OPERATOR):
        assert part_cycles(graph, stack) == {}


def test_the_checks_find_a_back_arrow_a_stranger_and_a_cycle():
    graph = {
        "evokube_trainer.workflows._workflow": {"evokube_trainer.runtime.trainer"},
        "evokube_trainer.runtime.trainer": {"evokube_operator.api", "evokube_trainer.envs"},
        "evokube_trainer.envs._base": {"evokube_trainer.ec"},
        "evokube_trainer.ec._base": {"evokube_trainer.agents.networks"},
        "evokube_trainer.agents": {"evokube_trainer.envs._spaces"},
    }
    assert back_arrows(graph, TRAINER) == [
        "evokube_trainer.runtime.trainer imports evokube_operator.api, which is outside its half",
        "evokube_trainer.workflows._workflow imports evokube_trainer.runtime.trainer, "
        "a layer above its own",
    ]
    assert part_cycles(graph, TRAINER) == {  # peers, which the layers alone allow
        "evokube_trainer.agents": ["evokube_trainer.ec", "evokube_trainer.envs"],
        "evokube_trainer.ec": ["evokube_trainer.agents", "evokube_trainer.envs"],
        "evokube_trainer.envs": ["evokube_trainer.agents", "evokube_trainer.ec"],
    }
