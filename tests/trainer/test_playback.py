"""`evokube eval` and `evokube render` (policies/play.py) on policies a real run exported.

A module fixture trains a short Pendulum run with `evokube run` (OpenES, 50-step episodes, 5
generations: about 10 s on 2 CPUs), so the artifact is the trainer's own export. Brax is rendered
from a hand-made untrained actor (5-step episodes): what is tested there is the viewer file.
"""

import base64
import html.parser
import json
import re
import zlib
from pathlib import Path

import fsspec
import gymnax
import gymnax.visualize.visualizer
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from evokube_trainer.agents import Actor, ParamFlattener
from evokube_trainer.envs import env_spec
from evokube_trainer.laptop import cli
from evokube_trainer.policies import (
    GYMNAX_VISUALIZED,
    METADATA_FILE,
    PlaybackError,
    PolicyArtifact,
    evaluate_policy,
    find_policy,
    network_config,
    read_policy,
    render_policy,
    write_policy,
)
from evokube_trainer.runtime import exitcodes, manifest
from evokube_trainer.runtime.config import to_run_config
from evokube_trainer.workflows import make_workflow

EPISODE_LENGTH = 50
EVAL_EPISODES = 10
RUN = {
    "apiVersion": "evokube.io/v1alpha1",
    "kind": "ERLExperiment",
    "metadata": {"name": "tiny-pendulum"},
    "spec": {
        "image": "trainer:1",
        "seed": 0,
        "algorithm": {"name": "openes"},  # normalizes observations by default
        "environment": {"name": "gymnax/Pendulum-v1", "episodeLength": EPISODE_LENGTH},
        "policy": {"hiddenLayers": [16]},
        "population": {"size": 16},
        "evaluation": {"episodes": EVAL_EPISODES},
        "stopping": {"maxGenerations": 5},
    },
}
LINE = re.compile(
    r"^Pendulum-v1: return (?P<mean>-?[\d.]+) ± (?P<std>[\d.]+) over (?P<episodes>\d+) episodes "
    r"\(policy from generation (?P<generation>\d+), trained return (?P<trained>-?[\d.]+)\)$"
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    path = runs / "tiny-pendulum.yaml"
    path.write_text(json.dumps(RUN))  # JSON is YAML
    assert cli.main(["run", str(path), "--runs-dir", str(runs)]) == exitcodes.SUCCESS
    return runs / "tiny-pendulum"


def _history(run_dir: Path) -> dict[int, dict]:
    lines = (run_dir / "history.jsonl").read_text().splitlines()
    return {int(r["generation"]): r["metrics"] for r in map(json.loads, lines)}


def _eval_line(capsys, *args: str) -> re.Match:
    assert cli.main(["eval", *args]) == exitcodes.SUCCESS
    out = capsys.readouterr().out.strip()
    match = LINE.match(out)
    assert match, out
    return match


def test_eval_of_a_run_folder_is_within_the_training_runs_reported_return(run_dir, capsys):
    match = _eval_line(capsys, str(run_dir))  # a run folder: its policies/best
    best = read_policy(str(run_dir / "policies" / "best"))
    generation = int(match["generation"])
    reported = _history(run_dir)[generation]
    assert best.metadata["generation"] == generation
    assert float(match["trained"]) == pytest.approx(reported["eval/return_mean"], abs=0.05)
    assert int(match["episodes"]) == EVAL_EPISODES
    # Both numbers are means of 10 episodes of the same deterministic policy from independent
    # random starts (training's key is its state's; ours is PRNGKey(0)), so they differ by
    # noise with a standard error of sqrt(std_a^2 + std_b^2) / sqrt(10). Four standard errors:
    # a chance failure is below 1e-4, while a policy played wrongly (unnormalized observations,
    # wrong env settings) moves Pendulum's return by hundreds. `best` was picked as the best
    # of 5 evaluations, which biases the reported return up by about one standard error.
    noise = np.hypot(float(match["std"]), reported["eval/return_std"]) / np.sqrt(EVAL_EPISODES)
    assert abs(float(match["mean"]) - float(match["trained"])) <= 4 * noise


def test_evaluate_policy_is_trainings_evaluation_with_the_same_key(run_dir):
    """The same episodes as the run's own evaluator (same env, normalization and actions)
    given the same key; the seed picks the episodes."""
    artifact = read_policy(find_policy(str(run_dir)))
    workflow = make_workflow(to_run_config(manifest.load(run_dir / "experiment.yaml")).workflow)
    flat = ParamFlattener.from_params(artifact.params).flatten(artifact.params)[None]  # [1, D]
    key = jax.random.PRNGKey(3)
    trainer = jax.jit(workflow.evaluator.run)(
        flat, jnp.zeros((1,)), key, obs_stats=artifact.obs_stats
    )
    returns = evaluate_policy(artifact, EVAL_EPISODES, seed=3)
    assert returns.shape == (EVAL_EPISODES,)
    np.testing.assert_allclose(returns, trainer.episode_returns[0], rtol=1e-5)
    assert not np.allclose(returns, evaluate_policy(artifact, EVAL_EPISODES, seed=4))


def test_a_policy_in_a_bucket_evaluates_as_the_same_policy_on_disk(run_dir, capsys):
    bucket = "memory://evokube-tests/tiny-pendulum"  # a checkpoint location in a bucket
    write_policy(f"{bucket}/policies/best", read_policy(str(run_dir / "policies" / "best")))
    try:
        assert _eval_line(capsys, bucket, "--episodes", "4", "--seed", "7").groups() == (
            _eval_line(capsys, str(run_dir), "--episodes", "4", "--seed", "7").groups()
        )
    finally:
        fsspec.filesystem("memory").rm("/evokube-tests", recursive=True)


def test_render_writes_a_gif_of_one_pendulum_episode(run_dir, tmp_path, capsys):
    path = tmp_path / "pendulum.gif"
    assert cli.main(["render", str(run_dir), "-o", str(path), "--seed", "1"]) == 0
    assert str(path) in capsys.readouterr().out
    with Image.open(path) as gif:
        assert gif.format == "GIF"
        # Pendulum never terminates: the states acted on, from the reset to the last step.
        assert gif.n_frames == EPISODE_LENGTH


def _artifact(env: dict, hidden=(8,)) -> PolicyArtifact:
    """An untrained actor for `env` (a defaulted `spec.environment`)."""
    spec = env_spec(env["name"])
    network = Actor(spec.action_dim, hidden)
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((spec.obs_dim,)))
    metadata = {
        "algorithm": "openes",
        "environment": {"episodesPerEvaluation": 1, "actionRepeat": 1, "rewardScale": 1.0, **env},
        "evaluationEpisodes": 2,
        "normalizeObservations": False,
        "network": network_config(network),
        "generation": 0,
        "evalReturn": None,
        "seed": 0,
    }
    return PolicyArtifact(metadata=metadata, params=jax.device_get(params), obs_stats=None)


class _Scripts(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)


def test_a_brax_policy_renders_as_brax_html_viewer_with_its_episode(tmp_path, capsys):
    bucket = "memory://evokube-tests/brax-run"
    length = 5
    write_policy(
        f"{bucket}/policies/best",
        _artifact({"name": "brax/inverted_pendulum", "episodeLength": length}),
    )
    path = tmp_path / "episode.html"
    try:
        assert cli.main(["render", bucket, "-o", str(path)]) == exitcodes.SUCCESS
    finally:
        fsspec.filesystem("memory").rm("/evokube-tests", recursive=True)
    parser = _Scripts()
    parser.feed(path.read_text())
    parser.close()
    # The viewer's scene: the system and the episode's states, zlib-compressed JSON in base64.
    (encoded,) = re.findall(r'var system = "([^"]+)"', "\n".join(parser.scripts))
    scene = json.loads(zlib.decompress(base64.b64decode(encoded)))
    assert "pole" in scene["link_names"]
    frames = scene["states"]["x"]
    assert 1 < len(frames) <= length  # from the reset until the episode ended
    assert any("new Viewer(" in script for script in parser.scripts)


def test_missing_and_unreadable_policies_are_errors_without_a_traceback(tmp_path, capsys):
    assert cli.main(["eval", str(tmp_path / "nothing")]) == exitcodes.PERMANENT
    err = capsys.readouterr().err
    assert "no policy there" in err and "Traceback" not in err

    folder = str(tmp_path / "future")
    write_policy(folder, _artifact({"name": "gymnax/Pendulum-v1"}))
    metadata = json.loads((tmp_path / "future" / METADATA_FILE).read_text())
    metadata["format"] = "evokube.policy/v9"
    (tmp_path / "future" / METADATA_FILE).write_text(json.dumps(metadata))
    assert cli.main(["render", folder, "-o", str(tmp_path / "x.gif")]) == exitcodes.PERMANENT
    err = capsys.readouterr().err
    assert "evokube.policy/v9" in err and "Traceback" not in err
    assert not (tmp_path / "x.gif").exists()


@pytest.mark.parametrize(
    ("env", "file", "says"),
    [
        ("gymnax/DeepSea-bsuite", "a.gif", "cannot draw gymnax/DeepSea-bsuite"),
        ("gymnax/Pendulum-v1", "a.html", "*.gif or *.mp4"),
        ("gymnax/Pendulum-v1", "a.mp4", "needs ffmpeg"),  # PATH is emptied below
        ("brax/inverted_pendulum", "a.gif", "*.html"),
        ("gymnax/Pendulum-v1", "memory://bucket/a.gif", "writes a local file"),
    ],
)
def test_render_refuses_what_it_cannot_write_naming_why(tmp_path, monkeypatch, env, file, says):
    monkeypatch.setenv("PATH", "")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PlaybackError, match=re.escape(says)):
        render_policy(_artifact({"name": env}), file)
    assert not any(tmp_path.iterdir())  # nothing written, not even a folder


def test_the_visualized_envs_are_the_ones_gymnax_visualizer_draws():
    source = Path(gymnax.visualize.visualizer.__file__).read_text()
    named = set(re.findall(r'"([\w.-]+)"', source)) & set(gymnax.registered_envs)
    assert named == GYMNAX_VISUALIZED


def test_an_episode_count_below_one_is_refused():
    with pytest.raises(PlaybackError, match="at least 1"):
        evaluate_policy(_artifact({"name": "gymnax/Pendulum-v1"}), episodes=0)
