"""The `evokube` command: check and run ERLExperiment manifests without a cluster.

evokube validate FILE...             every error with its field path; exit 78 if any
                                     (an ERLSweep: its own fields and every child's)
evokube run FILE [--processes N] [--slices S]
                                     train here, N local processes wired like pods (S slices)
evokube sweep FILE [--parallel K] [--out DIR]
                                     an ERLSweep here: its children, K at a time; the summary
evokube curve NAME|FOLDER|URL        the learning-curve PNG of any run's history.jsonl
evokube eval POLICY [--episodes N]   a trained policy's mean and std return over N episodes
evokube render POLICY -o FILE        one episode to watch: Brax HTML viewer, gymnax GIF/MP4

POLICY: a policy folder, or a run folder / checkpoint location (its policies/best), as a path
or a gs://, s3:// URL.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import evokube_contract as contract
from evokube_trainer.runtime import exitcodes


def _experiment(path: str) -> dict:
    from evokube_trainer.runtime import manifest

    loaded = manifest.load(path)
    from evokube_trainer.runtime.config import to_run_config  # imports JAX: valid files only

    to_run_config(loaded)  # what the trainer itself would refuse
    return loaded


def _load(path: str, load=_experiment):
    """What `load` makes of the file (the defaulted manifest), or print every error and return
    None; never raises, since a manifest file is untrusted input and a traceback is no answer."""
    from evokube_trainer.runtime import manifest

    try:
        loaded = load(path)
    except manifest.ManifestError as err:
        print(f"error: {err}", file=sys.stderr)
        return None
    except Exception as err:  # a bug here must still not crash on hostile input
        reason = manifest.shorten(f"{type(err).__name__}: {err}", 200)
        print(f"error: {manifest.shorten(path)}: could not be checked: {reason}", file=sys.stderr)
        return None
    return loaded


def validate(args: argparse.Namespace) -> int:
    from evokube_contract.sweep import SWEEP_KIND
    from evokube_trainer.laptop.sweep import kind_of, load_sweep

    ok = True
    for path in args.files:
        if kind_of(path) == SWEEP_KIND:
            loaded = _load(path, load_sweep)
            if loaded is not None:
                print(f"{path}: valid, {len(loaded[1])} children")
        else:
            loaded = _load(path)
            if loaded is not None:
                print(f"{path}: valid")
        ok = ok and loaded is not None
    return exitcodes.SUCCESS if ok else exitcodes.PERMANENT


def sweep(args: argparse.Namespace) -> int:
    from evokube_trainer.laptop.sweep import load_sweep, run_sweep

    if args.parallel < 1:
        print("error: --parallel must be at least 1", file=sys.stderr)
        return exitcodes.PERMANENT
    loaded = _load(args.file, load_sweep)
    if loaded is None:
        return exitcodes.PERMANENT
    sweep_doc, children = loaded
    return run_sweep(sweep_doc, children, parallel=args.parallel, out_root=Path(args.out))


def hosts_per_slice(accelerator: dict) -> int:
    """spec.accelerator.hosts, which a TPU manifest may leave to its topology (as the operator
    does): the processes `evokube run` starts for each slice."""
    tpu = accelerator.get("tpu")
    if accelerator.get("hosts") is None and accelerator["type"] == "tpu" and tpu:
        return contract.topology_chips(tpu["topology"]) // tpu["chipsPerHost"]  # defaulted
    return accelerator.get("hosts", 1)


def run(args: argparse.Namespace) -> int:
    from evokube_trainer.laptop.local import run_locally

    loaded = _load(args.file)
    if loaded is None:
        return exitcodes.PERMANENT
    accelerator = loaded["spec"]["accelerator"]
    manifest_slices = (accelerator.get("tpu") or {}).get("slices", 1)
    slices = manifest_slices if args.slices is None else args.slices
    processes = args.processes
    if processes is None:  # the manifest's pods: one per host of every slice
        processes = hosts_per_slice(accelerator) * manifest_slices
    if processes < 1:
        print("error: --processes must be at least 1", file=sys.stderr)
        return exitcodes.PERMANENT
    if slices < 1 or processes % slices:
        print(
            f"error: --slices {slices} must be at least 1 and divide --processes {processes}",
            file=sys.stderr,
        )
        return exitcodes.PERMANENT
    return run_locally(loaded, processes=processes, slices=slices, runs_root=Path(args.runs_dir))


def curve(args: argparse.Namespace) -> int:
    from evokube_trainer.laptop.curves import CurveError, draw

    try:
        png, generations = draw(args.target, args.output, args.namespace)
    except CurveError as err:
        print(f"error: {err}", file=sys.stderr)
        return exitcodes.PERMANENT
    print(f"{png}: {generations} generations")
    return exitcodes.SUCCESS


def add_curve_command(commands) -> None:
    plot = commands.add_parser("curve", help="draw a run's learning curve (PNG)")
    plot.add_argument(
        "target",
        help="an ERLExperiment's name (through the kubeconfig), a run folder or history.jsonl, "
        "or a bucket URL (checkpoint location or history.jsonl)",
    )
    plot.add_argument(
        "-o", "--output", type=Path, help="the PNG (default: <name>-learning-curve.png)"
    )
    plot.add_argument("--namespace", help="the experiment's namespace (default: the context's)")
    plot.set_defaults(func=curve)


def _policy(url: str):
    """The policy `url` names, or print why there is none and return None (no traceback)."""
    from evokube_trainer.policies import PlaybackError, PolicyReadError, find_policy, read_policy

    try:
        return read_policy(find_policy(url))
    except (PlaybackError, PolicyReadError) as err:
        print(f"error: {err}", file=sys.stderr)
    except Exception as err:  # an unreachable bucket, a corrupt file: still no traceback
        print(f"error: {url}: could not be read: {type(err).__name__}: {err}", file=sys.stderr)
    return None


def _with_policy(url: str, play) -> int:
    """Load the policy `url` names and print what `play(artifact)` says of it; a problem is
    one line on stderr and exit 78, never a traceback."""
    from evokube_trainer.policies import PlaybackError

    artifact = _policy(url)
    if artifact is None:
        return exitcodes.PERMANENT
    try:
        print(play(artifact))
    except PlaybackError as err:
        print(f"error: {err}", file=sys.stderr)
        return exitcodes.PERMANENT
    return exitcodes.SUCCESS


def evaluate(args: argparse.Namespace) -> int:
    from evokube_trainer.policies import evaluate_policy

    def play(artifact) -> str:
        returns = evaluate_policy(artifact, args.episodes, args.seed)
        meta = artifact.metadata
        env_id = artifact.env_config.name.partition("/")[2]
        trained = meta.get("evalReturn")
        trained_text = "not evaluated" if trained is None else f"{trained:.1f}"
        return (
            f"{env_id}: return {returns.mean():.1f} ± {returns.std():.1f} over {len(returns)} "
            f"episodes (policy from generation {meta.get('generation')}, "
            f"trained return {trained_text})"
        )

    return _with_policy(args.policy, play)


def render(args: argparse.Namespace) -> int:
    from evokube_trainer.policies import render_policy
    from evokube_trainer.runtime import folders

    if "://" not in args.output:  # render_policy refuses URLs itself
        try:
            folders.prepare_file(args.output)  # before the episode is played, not after
        except OSError as err:
            print(f"error: {folders.describe(args.output, err)}", file=sys.stderr)
            return exitcodes.PERMANENT

    def play(artifact) -> str:
        path = render_policy(artifact, args.output, args.seed)
        return f"{artifact.env_config.name}: one episode written to {path}"

    return _with_policy(args.policy, play)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="evokube", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("validate", help="check manifests offline against the CRD")
    check.add_argument("files", nargs="+")
    check.set_defaults(func=validate)
    train = commands.add_parser("run", help="train a manifest on this machine")
    train.add_argument("file")
    train.add_argument(
        "--processes",
        type=int,
        default=None,
        help="local processes, each standing in for one host "
        "(default: spec.accelerator.hosts x spec.accelerator.tpu.slices)",
    )
    train.add_argument(
        "--slices",
        type=int,
        default=None,
        help="split the processes into this many slices, wired like a multislice gang "
        "(default: spec.accelerator.tpu.slices, else 1)",
    )
    train.add_argument("--runs-dir", default="runs", help="where runs/<name>/ goes")
    train.set_defaults(func=run)
    many = commands.add_parser("sweep", help="run an ERLSweep's children on this machine")
    many.add_argument("file")
    many.add_argument(
        "--parallel", type=int, default=1, help="children running at a time (default 1)"
    )
    many.add_argument(
        "--out",
        default="evokube-sweeps",
        help="where <sweep>/<child>/ go (default evokube-sweeps); rerun to resume",
    )
    many.set_defaults(func=sweep)
    add_curve_command(commands)
    policy_help = "a policy folder, or a run folder / checkpoint location (its policies/best)"
    play = commands.add_parser("eval", help="a trained policy's return over fresh episodes")
    play.add_argument("policy", help=policy_help)
    play.add_argument("--episodes", type=int, default=10, help="episodes to play (default 10)")
    play.add_argument("--seed", type=int, default=0, help="seed of the episodes (default 0)")
    play.set_defaults(func=evaluate)
    show = commands.add_parser("render", help="one episode of a trained policy, to watch")
    show.add_argument("policy", help=policy_help)
    show.add_argument(
        "-o",
        "--output",
        required=True,
        help="the file to write: .html for Brax envs, .gif (or .mp4 with ffmpeg) for gymnax",
    )
    show.add_argument("--seed", type=int, default=0, help="seed of the episode (default 0)")
    show.set_defaults(func=render)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
