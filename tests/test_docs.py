"""The docs stay true to the tree: every file a doc names exists, and every example experiment
and sweep passes `evokube validate`."""

import re
from pathlib import Path

import pytest
import yaml

from evokube_trainer.laptop import cli
from evokube_trainer.runtime import exitcodes

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", *REPO.glob("docs/**/*.md"), *REPO.glob("*/README.md")])
# A path of the tree, as docs write it: a top-level folder, then a file or folder name.
NAMED_PATH = re.compile(
    r"(?<![\w/.-])((?:examples|docs|tests|benchmarks|operator|trainer|crds|helm|\.ci)/[\w./-]*\w)"
)
EXAMPLES = sorted(REPO.glob("examples/**/*.yaml"))


def named_paths(text: str) -> set[str]:
    """The tree paths a document names (a pytest node id names its file)."""
    return {
        match.group(1).split("::")[0]
        for match in NAMED_PATH.finditer(text)
        if "*" not in match.group(1) and "<" not in match.group(1)
    }


def test_a_named_path_is_found_and_a_missing_one_is_not():
    text = "run `examples/openes-pendulum.yaml`; see tests/test_docs.py::test_x and docs/nope.md."
    found = named_paths(text)
    assert found == {"examples/openes-pendulum.yaml", "tests/test_docs.py", "docs/nope.md"}
    assert not (REPO / "docs/nope.md").exists()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_a_doc_names_exists(doc):
    missing = sorted(p for p in named_paths(doc.read_text()) if not (REPO / p).exists())
    assert missing == [], f"{doc.relative_to(REPO)} names what the tree does not have"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_example_experiment_and_sweep_is_valid(path, tmp_path, capsys):
    for i, document in enumerate(yaml.safe_load_all(path.read_text())):
        if not document or document.get("kind") not in ("ERLExperiment", "ERLSweep"):
            continue  # Kueue's queues, GKE's node pools: their own tools check them
        one = tmp_path / f"{i}.yaml"
        one.write_text(yaml.safe_dump(document))
        code = cli.main(["validate", str(one)])
        assert code == exitcodes.SUCCESS, f"{path.relative_to(REPO)}: {capsys.readouterr().err}"
