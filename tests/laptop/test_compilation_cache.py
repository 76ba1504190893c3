"""EVOKUBE_XLA_CACHE_DIR: one compilation cache for every run on a machine. A second run of
the same programs, in another run folder, compiles nothing new (the suite relies on it to
compile each small program once; docs/testing.md)."""

import evokube_contract as contract
from tests.runtime.test_multihost import OPENES, experiment, finish, start_run


def entries(folder) -> set[str]:
    return {p.name for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


def test_runs_share_the_machines_cache_and_a_second_run_compiles_nothing_new(tmp_path):
    shared = tmp_path / "xla"
    env = {contract.ENV_XLA_CACHE: str(shared)}
    seen = []
    for name in ("first", "second"):
        doc = experiment(name, algorithm=OPENES, hosts=1, devices=1, generations=2)
        code, out = finish(start_run(tmp_path, doc, env=env))
        assert code == 0, out
        assert not (tmp_path / "runs" / name / contract.XLA_CACHE_SUBDIR).exists()
        seen.append(entries(shared))
    assert seen[0], "the first run wrote its programs to the shared cache"
    assert seen[1] == seen[0], sorted(seen[1] - seen[0])
