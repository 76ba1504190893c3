"""Every ghcr.io/evokube image that the docs, examples and chart name is one `make images` builds.

The built set is read back from `make -n images` (the Makefile's IMAGES table), never
copied here; the references are found wherever a user reads them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
REGISTRY = "ghcr.io/evokube"
# A name, and the tag when there is one ("ghcr.io/evokube/" alone is a prefix, not an image;
# oci://ghcr.io/evokube/charts is where the chart is pushed).
REFERENCE = re.compile(
    rf"(?<!oci://){re.escape(REGISTRY)}/([a-z0-9][a-z0-9._-]*)(?::([\w][\w.-]*))?"
)


def make_images() -> str:
    """The commands `make images` runs for REGISTRY with the default TAG (printed, not run)."""
    return subprocess.run(
        ["make", "-s", "-n", "images", f"REGISTRY={REGISTRY}", "CONTAINER_TOOL=docker"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def built_images() -> dict[str, str]:
    """Name -> tag of each image `make images` builds."""
    dry_run = make_images()
    tags = re.findall(rf"--tag={re.escape(REGISTRY)}/([^:\s]+):(\S+)", dry_run)
    assert len(tags) == dry_run.count("docker build"), dry_run
    return dict(tags)


def read_by_users() -> list[Path]:
    """The README, docs, examples, chart and Dockerfile: what a user copies image names from."""
    found = [REPO / "README.md", REPO / "Dockerfile"]
    for folder in ("docs", "examples", "helm"):
        found += [path for path in sorted((REPO / folder).rglob("*")) if path.is_file()]
    return found


def test_make_images_builds_every_extra_under_the_projects_version():
    built = built_images()
    extras = set(re.findall(r"--build-arg=EXTRA=(\S+)", make_images()))
    script = (REPO / "docker" / "install-dependencies.sh").read_text()
    (accepted,) = re.findall(r"^\s*([\w|]+)\) ;;$", script, flags=re.MULTILINE)
    assert extras == set(accepted.split("|"))
    chart = yaml.safe_load((REPO / "helm" / "evokube" / "Chart.yaml").read_text())
    # The chart's operator image defaults to its appVersion: the tag `make push` pushes.
    assert set(built.values()) == {chart["appVersion"]}
    values = yaml.safe_load((REPO / "helm" / "evokube" / "values.yaml").read_text())
    assert values["image"]["repository"] == f"{REGISTRY}/operator"


def test_every_image_users_are_shown_is_built_under_that_name_and_tag():
    built = built_images()
    named = {
        (path.relative_to(REPO), name, tag)
        for path in read_by_users()
        for name, tag in REFERENCE.findall(path.read_text(errors="replace"))
    }
    assert {name for _, name, _ in named} >= {"operator", "trainer-cpu"}, "nothing found"
    unbuilt = sorted(ref for ref in named if ref[1] not in built)
    assert not unbuilt, f"named but not built by `make images` ({sorted(built)}): {unbuilt}"
    stale = sorted(ref for ref in named if ref[2] and ref[2] != built[ref[1]])
    assert not stale, f"tags other than the project's version: {stale}"
