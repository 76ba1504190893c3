"""Operator at scale: N experiments of 4 CPU hosts each on the kwok test control plane.

    .venv/bin/python -m benchmarks.operator_scale --experiments 100 500
    .venv/bin/python -m benchmarks.operator_scale --experiments 1000 --timeout 900 \
        --operator-args --workers 16
    .venv/bin/python -m benchmarks.operator_scale --experiments 1000 --largest --restart --delete \
        --timeout 3000

For each N the script starts a fresh test control plane (tests/cluster, through its command
line `python -m tests.cluster`: benchmarks do not import the tests) with enough fake CPU nodes
for the gangs (110 pods a node), installs the CRD, starts `evokube-operator` as a child
process (admin credentials: RBAC is not what is measured) and creates N ERLExperiments of 4
hosts as fast as the API accepts them, from `--clients` threads. Watches (opened before the
first create) time-stamp, for each experiment, the first ADDED event of its Job and the first
status with phase Running. Latencies are measured from the moment the create call returned,
on the same clock. While it runs, the operator's RSS and CPU time are sampled from /proc.

Reported per N: create rate, p50/p99/max creation -> Job and creation -> Running, how many
reached Running before `--timeout`, the operator's peak RSS, its CPU seconds and mean CPU
share, reconciles and reconcile errors (operator metrics), the operator's own API requests per
experiment (its counter, by verb), and the API server's count of writes to erlexperiments
(Kopf's annotation patches and the operator's status patches) per experiment. Once all are
Running, every experiment gets one `status.progress` merge patch, as the trainer's
StatusReporter sends it, and the script counts the reconciles that follow (per patch).

`--largest` creates experiments near the largest size the CRD admits
(benchmarks/largest_experiment.py: about 220 KiB of spec each) of one host each (their Jobs
and pods are each twice that size again, and etcd holds all of them), after labelling the
nodes and annotating the namespace as they need. `--delete` then deletes every experiment,
waits until their pods are gone and the operator is quiet, and samples its RSS again: what it
keeps of deleted experiments. `--restart` first restarts the operator among them all (a new
leader lists every experiment, Job and pod and reconciles each) and samples its peak. The
operator's RSS is reported at start, at its peak, once loaded, at the restarted one's peak and
after deleting.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from benchmarks._common import REPO, free_port, load, print_header, print_row, wait_until
from benchmarks.largest_experiment import NODE_LABELS, largest_experiment, namespace_annotations
from evokube_contract import API_VERSION, GROUP, KIND, LABEL_EXPERIMENT, PLURAL, VERSION
from evokube_operator.plans.decide import JOB_EVENTS_GRACE_SECONDS

NAMESPACE = "scale"
HOSTS = 4
PODS_PER_NODE = 110
IMAGE = "ghcr.io/evokube/trainer-cpu:0.1.0"


def experiment(name: str, largest: bool = False) -> dict:
    if largest:
        return largest_experiment(name, NAMESPACE, IMAGE, hosts=1)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "image": IMAGE,
            "algorithm": {"name": "openes"},
            "environment": {"name": "gymnax/Pendulum-v1"},
            "population": {"size": 64},
            "stopping": {"maxGenerations": 10},
            "accelerator": {"type": "cpu", "hosts": HOSTS},
        },
    }


class Cluster:
    """A fresh test control plane in `workdir`, started and stopped through its command line
    (`python -m tests.cluster up --json`, `down`), which says where it is."""

    def __init__(self, workdir: Path, *up_args: str):
        self.workdir = workdir
        run = self._cli("up", "--json", *up_args)
        where = json.loads(run.stdout.splitlines()[-1])
        self.kubeconfig, self.kubectl_path = where["kubeconfig"], where["kubectl"]
        self.pids: dict[str, int] = where["pids"]

    def _cli(self, *args: str) -> subprocess.CompletedProcess:
        run = subprocess.run(
            [sys.executable, "-m", "tests.cluster", *args, "--dir", str(self.workdir)],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            raise RuntimeError(f"tests.cluster {args[0]} failed: {run.stderr.strip()}")
        return run

    def stop(self) -> None:
        self._cli("down")

    def kubectl(self, *args: str) -> subprocess.CompletedProcess:
        """Our pinned kubectl as admin; a failure raises with its stderr."""
        run = subprocess.run(
            [self.kubectl_path, f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {run.stderr.strip()}")
        return run

    def established(self, crd: str) -> bool:
        """Whether the CRD is Established (kubectl wait refuses one without conditions yet)."""
        wait = [self.kubectl_path, f"--kubeconfig={self.kubeconfig}", "wait", crd]
        flags = ["--for=condition=Established", "--timeout=10s"]
        return subprocess.run([*wait, *flags], capture_output=True).returncode == 0

    def api_client(self):
        """A kubernetes-client ApiClient, as admin."""
        from kubernetes import config

        return config.new_client_from_config(self.kubeconfig)


class ProcSampler(threading.Thread):
    """Samples one process's RSS and CPU time every `interval` seconds."""

    def __init__(self, pid: int, interval: float = 0.5):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_rss = 0
        self.stop_event = threading.Event()
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.cpu_start = self.cpu_seconds()
        self.t_start = time.monotonic()

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.ticks  # utime + stime

    def rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            try:
                self.peak_rss = max(self.peak_rss, self.rss())
            except OSError:
                return

    def stop(self) -> tuple[float, float]:
        self.stop_event.set()
        self.join()
        return self.cpu_seconds() - self.cpu_start, time.monotonic() - self.t_start


def metrics_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def metric_samples(text: str, name: str) -> list[tuple[dict, float]]:
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, value = line.rsplit(" ", 1)
        metric, _, labels = series.partition("{")
        if metric != name:
            continue
        parsed = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        out.append((parsed, float(value)))
    return out


def apiserver_writes(plane: Cluster, every: bool = False) -> dict[str, float]:
    """apiserver_request_total for erlexperiments (or every resource), by verb (all clients)."""
    text = plane.kubectl("get", "--raw", "/metrics").stdout
    counts: dict[str, float] = {}
    for labels, value in metric_samples(text, "apiserver_request_total"):
        if every or labels.get("resource") == PLURAL:
            sub = labels.get("subresource")
            verb = labels["verb"] + (f"/{sub}" if sub else "")
            counts[verb] = counts.get(verb, 0) + value
    return counts


def reconcile_count(url: str) -> float:
    text = metrics_text(url + "/metrics")
    return sum(v for _, v in metric_samples(text, "evokube_operator_reconciles_total"))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def watch(plane: Cluster, path: str, on_event, stop: threading.Event) -> threading.Thread:
    """Streams `kubectl get --raw` watch events (one JSON object a line) to on_event."""

    def run():
        while not stop.is_set():
            proc = subprocess.Popen(
                [plane.kubectl_path, "--kubeconfig", plane.kubeconfig, "get", "--raw", path],
                stdout=subprocess.PIPE,
                text=True,
            )
            for line in proc.stdout:
                event = json.loads(line)
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):  # not ERROR's Status
                    on_event(event, time.monotonic())
                if stop.is_set():
                    break
            proc.kill()
            proc.wait()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_quiet(url: str, seconds: float = 30.0) -> None:
    """Until the operator has reconciled nothing for `seconds`."""
    count, quiet_since = reconcile_count(url), time.monotonic()
    while time.monotonic() - quiet_since < seconds:
        time.sleep(1.0)
        if (now := reconcile_count(url)) != count:
            count, quiet_since = now, time.monotonic()


def delete_all(plane: Cluster, pid: int, url: str) -> int:
    """Delete every experiment, wait until their pods are gone (owner references) and the
    operator is quiet, then sample its RSS: what it still holds of them."""
    plane.kubectl("delete", PLURAL, "--all", "-n", NAMESPACE, "--wait=false")

    def gone() -> bool:
        time.sleep(2.0)  # thousands of objects to list: not every 0.2 s
        left = plane.kubectl("get", f"{PLURAL},jobs,pods", "-n", NAMESPACE, "-o", "name")
        return not left.stdout.strip()

    wait_until(gone, 1800, "the experiments, their Jobs and pods to be deleted")
    wait_quiet(url)
    return ProcSampler(pid).rss()


def prepare(plane: Cluster, namespace: str, largest: bool) -> None:
    """The CRDs of crds/ installed and Established, and `namespace` with its default account;
    with `largest`, what the largest experiment's nodeSelector, pod affinity and references
    need of the nodes and the namespace."""
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    for path in sorted((REPO / "crds").glob("*.yaml")):
        crd = f"crd/{path.name.removesuffix('.yaml')}"
        wait_until(lambda c=crd: plane.established(c), 60, f"{crd} to be Established")
    plane.kubectl("create", "namespace", namespace)
    plane.kubectl("wait", "--for=create", "--timeout=30s", "sa/default", "-n", namespace)
    if largest:
        labels = [f"{k}={v}" for k, v in NODE_LABELS.items()]
        plane.kubectl("label", "nodes", "--all", "--overwrite", *labels)
        listed = [f"{k}={v}" for k, v in namespace_annotations().items()]
        plane.kubectl("annotate", "namespace", namespace, "--overwrite", *listed)


class Operator:
    """`evokube-operator` as a child process (admin credentials: RBAC is not what is
    measured), its metrics URL and its log, which every start appends to."""

    def __init__(self, plane: Cluster, log_path: Path, *args: str):
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.command = [
            str(Path(sys.executable).with_name("evokube-operator")),
            f"--kubeconfig={plane.kubeconfig}",
            f"--metrics-port={port}",
            "--metrics-address=127.0.0.1",
            "--leader-election-namespace=default",  # the Lease (a write every 2 s)
            *args,
        ]

    def start(self) -> subprocess.Popen:
        with self.log_path.open("a") as log:
            return subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        try:
            return urllib.request.urlopen(self.url + "/readyz", timeout=2).status == 200
        except OSError:
            return False


def run_scale(n: int, args: argparse.Namespace) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix=f"evokube-scale-{n}-"))
    hosts = 1 if args.largest else HOSTS
    up = [f"--pool-size=cpu={-(-n * hosts // PODS_PER_NODE) + 1}"]  # every gang fits, and one
    if args.controller_manager_qps:
        up.append(f"--controller-manager-qps={args.controller_manager_qps}")
    plane = Cluster(workdir, *up)  # its nodes are Ready
    operator = None
    try:
        prepare(plane, NAMESPACE, args.largest)
        launcher = Operator(plane, workdir / "operator.log", *args.operator_args)
        operator = launcher.start()
        wait_until(launcher.ready, 60, f"the operator to become ready (log: {launcher.log_path})")
        writes_before = apiserver_writes(plane)

        created: dict[str, float] = {}
        job_at: dict[str, float] = {}
        running_at: dict[str, float] = {}
        lock = threading.Lock()

        def on_job(event, now):
            if event.get("type") != "ADDED":
                return
            owner = event["object"]["metadata"].get("labels", {}).get(LABEL_EXPERIMENT)
            with lock:
                job_at.setdefault(owner, now)

        def on_experiment(event, now):
            obj = event.get("object", {})
            if (obj.get("status") or {}).get("phase") == "Running":
                with lock:
                    running_at.setdefault(obj["metadata"]["name"], now)

        stop = threading.Event()
        watch(plane, f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs?watch=1", on_job, stop)
        watch(
            plane,
            f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}?watch=1",
            on_experiment,
            stop,
        )
        time.sleep(1.0)
        sampler = ProcSampler(operator.pid)
        rss_start = sampler.rss()
        sampler.start()
        # Where else the CPU goes: the control plane's own processes.
        others = {
            name: ProcSampler(pid)
            for name, pid in plane.pids.items()
            if name in ("kube-apiserver", "etcd", "kube-controller-manager", "kwok")
        }
        for other in others.values():
            other.start()
        requests_before = sum(apiserver_writes(plane, every=True).values())
        load_start = load()

        from kubernetes import client

        api_clients = [plane.api_client() for _ in range(args.clients)]
        names = [f"x{i:04d}" for i in range(n)]

        def create(index: int) -> None:
            api = client.CustomObjectsApi(api_clients[index % args.clients])
            api.create_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, experiment(names[index], args.largest)
            )
            now = time.monotonic()
            with lock:
                created[names[index]] = now

        begin = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(create, range(n)))
        create_s = time.monotonic() - begin

        deadline = begin + args.timeout
        while time.monotonic() < deadline:
            with lock:
                if len(running_at) >= n:
                    break
            time.sleep(1.0)
        settle_s = time.monotonic() - begin
        # Quiet first, so that what follows is the patches': no reconcile for longer than the
        # one-off look a gang that lacked pods gets JOB_EVENTS_GRACE_SECONDS after its Job
        # (up to 60 s).
        quiet_s = JOB_EVENTS_GRACE_SECONDS + 1.0
        reconciles_before, quiet_since = reconcile_count(launcher.url), time.monotonic()
        while time.monotonic() - quiet_since < quiet_s and time.monotonic() - begin < settle_s + 60:
            time.sleep(0.5)
            count = reconcile_count(launcher.url)
            if count != reconciles_before:
                reconciles_before, quiet_since = count, time.monotonic()

        def progress(index: int) -> None:  # what the trainer's StatusReporter sends
            api = client.CustomObjectsApi(api_clients[index % args.clients])
            body = {"status": {"progress": {"generation": index, "envSteps": 1000 * index}}}
            api.patch_namespaced_custom_object_status(
                GROUP, VERSION, NAMESPACE, PLURAL, names[index], body
            )

        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(progress, range(n)))
        time.sleep(5.0)
        progress_reconciles = reconcile_count(launcher.url) - reconciles_before
        rss_loaded = sampler.rss()
        cpu_s, wall_s = sampler.stop()
        other_cpu = {name: other.stop()[0] / wall_s for name, other in others.items()}
        api_rate = (sum(apiserver_writes(plane, every=True).values()) - requests_before) / wall_s
        load_end = load()
        stop.set()
        for api in api_clients:
            api.close()

        text = metrics_text(launcher.url + "/metrics")
        requests: dict[str, float] = {}
        for labels, value in metric_samples(text, "evokube_operator_api_requests_total"):
            requests[labels["verb"]] = requests.get(labels["verb"], 0) + value
        reconciles = sum(v for _, v in metric_samples(text, "evokube_operator_reconciles_total"))
        errors = sum(v for _, v in metric_samples(text, "evokube_operator_reconcile_errors_total"))
        writes_after = apiserver_writes(plane)
        exp_writes = {
            verb: writes_after.get(verb, 0) - writes_before.get(verb, 0)
            for verb in writes_after
            if verb not in ("WATCH", "LIST", "GET") and not verb.startswith("WATCH")
        }
        exp_writes.pop("POST", None)  # the benchmark's own creates
        exp_writes["PATCH/status"] = exp_writes.get("PATCH/status", 0) - n  # and progress
        log_text = launcher.log_path.read_text(errors="replace")
        rss_restart = float("nan")
        print(
            f"# loaded: RSS start {rss_start / 2**20:.0f} MiB, peak {sampler.peak_rss / 2**20:.0f}"
            f", loaded {rss_loaded / 2**20:.0f}",
            flush=True,
        )
        if args.restart:  # a new leader lists every experiment, Job and pod, and reconciles all
            operator.terminate()
            operator.wait(60)
            operator = launcher.start()
            restarted = ProcSampler(operator.pid, interval=0.2)
            restarted.start()
            try:
                wait_until(
                    launcher.ready,
                    300,
                    f"the restarted operator to become ready ({launcher.log_path})",
                )
                wait_quiet(launcher.url)
            except (OSError, RuntimeError) as err:  # it may lose its Lease under load, and exit
                print(f"# the restarted operator failed: {err}", flush=True)
            restarted.stop_event.set()  # not stop(): its CPU time is gone with a dead process
            restarted.join()
            rss_restart = restarted.peak_rss
            if operator.poll() is not None:  # measure the deletion with a running one
                operator = launcher.start()
                wait_until(
                    launcher.ready, 300, f"the operator to become ready again ({launcher.log_path})"
                )
        rss_deleted = delete_all(plane, operator.pid, launcher.url) if args.delete else float("nan")
        to_job = [job_at[k] - created[k] for k in created if k in job_at]
        to_running = [running_at[k] - created[k] for k in created if k in running_at]
        return {
            "n": n,
            "create_rate": n / create_s,
            "job": len(to_job),
            "job_p50": percentile(to_job, 0.5),
            "job_p99": percentile(to_job, 0.99),
            "job_max": max(to_job, default=float("nan")),
            "running": len(to_running),
            "run_p50": percentile(to_running, 0.5),
            "run_p99": percentile(to_running, 0.99),
            "run_max": max(to_running, default=float("nan")),
            "settle_s": settle_s,
            "rss_mib": sampler.peak_rss / 2**20,
            "rss_start_mib": rss_start / 2**20,
            "rss_loaded_mib": rss_loaded / 2**20,
            "rss_restart_mib": rss_restart / 2**20,
            "rss_deleted_mib": rss_deleted / 2**20,
            "cpu_s": cpu_s,
            "cpu_share": cpu_s / wall_s,
            "reconciles": reconciles,
            "errors": errors,
            "warnings": log_text.count("reconcile failed"),
            "tracebacks": log_text.count("Traceback"),
            "requests": {k: v / n for k, v in sorted(requests.items())},
            "exp_writes": {k: v / n for k, v in sorted(exp_writes.items())},
            "progress_reconciles": progress_reconciles / n,
            "control_plane_cpu": {k: round(v, 2) for k, v in other_cpu.items()},
            "api_requests_per_s": api_rate,
            "load": f"{load_start:.1f}->{load_end:.1f}",
        }
    finally:
        if operator is not None and operator.poll() is None:
            operator.terminate()
            try:
                operator.wait(20)
            except subprocess.TimeoutExpired:
                operator.kill()
        if not args.keep:
            plane.stop()
            shutil.rmtree(workdir, ignore_errors=True)  # etcd data and logs: up to a GiB
        else:
            print(f"# cluster kept in {workdir}", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiments", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--clients", type=int, default=8, help="threads creating experiments")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait per N")
    parser.add_argument("--keep", action="store_true", help="leave each cluster running")
    parser.add_argument(
        "--largest", action="store_true", help="experiments near the largest the CRD admits"
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="then restart the operator: its peak RSS while it lists and reconciles them all",
    )
    parser.add_argument(
        "--delete", action="store_true", help="delete them all, then sample the RSS again"
    )
    parser.add_argument(
        "--controller-manager-qps",
        type=int,
        default=None,
        help="kube-controller-manager's client rate limit (its default: 20/s, burst 30)",
    )
    parser.add_argument(
        "--operator-args", nargs=argparse.REMAINDER, default=[], help="passed to the operator"
    )
    args = parser.parse_args(argv)
    print(f"# {os.cpu_count()} CPUs; load average at start {load():.2f}", flush=True)
    print(f"# operator args: {' '.join(args.operator_args) or '(defaults)'}", flush=True)
    print(f"# kube-controller-manager QPS: {args.controller_manager_qps or '20 (default)'}")
    print(f"# experiments: {'largest, 1 host' if args.largest else f'small, {HOSTS} hosts'}")
    rows = []
    for n in args.experiments:
        row = run_scale(n, args)
        rows.append(row)
        print("# " + json.dumps(row), flush=True)
    print_header(
        "N",
        "creates/s",
        "Job p50 / p99 / max s",
        "reached Running",
        "Running p50 / p99 / max s",
        "operator RSS MiB: start / peak / loaded / restarted peak / after delete",
        "operator CPU s (share)",
        "reconciles / errors",
        "operator API requests per exp.",
        "erlexperiments writes per exp.",
        "reconciles per progress patch",
        "API server req/s (all clients)",
        "control plane CPU (share of one core)",
        "load",
    )
    for r in rows:
        req = ", ".join(f"{k} {v:.2f}" for k, v in r["requests"].items())
        writes = ", ".join(f"{k} {v:.2f}" for k, v in r["exp_writes"].items())
        cpu = ", ".join(f"{k} {v:.0%}" for k, v in r["control_plane_cpu"].items())
        print_row(
            r["n"],
            f"{r['create_rate']:.0f}",
            f"{r['job_p50']:.2f} / {r['job_p99']:.2f} / {r['job_max']:.2f}",
            f"{r['running']}/{r['n']}",
            f"{r['run_p50']:.1f} / {r['run_p99']:.1f} / {r['run_max']:.1f}",
            f"{r['rss_start_mib']:.0f} / {r['rss_mib']:.0f} / {r['rss_loaded_mib']:.0f}"
            f" / {r['rss_restart_mib']:.0f} / {r['rss_deleted_mib']:.0f}",
            f"{r['cpu_s']:.0f} ({r['cpu_share']:.0%})",
            f"{r['reconciles']:.0f} / {r['errors']:.0f}",
            req,
            writes,
            f"{r['progress_reconciles']:.2f}",
            f"{r['api_requests_per_s']:.0f}",
            cpu,
            r["load"],
        )
    print(f"# load average at end {load():.2f}")


if __name__ == "__main__":
    main()
