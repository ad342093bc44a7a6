"""Every file a party or a command writes that holds private material is private from the
moment it exists (issue 42, point 5).

Each test runs under a umask of 0, so that a file created with the default mode would
be readable (and writable) by every local user, and records the mode each file has
when it is renamed into place (a temporary file made with the default mode and
restricted only afterwards was readable meanwhile; a ``chmod`` also does not close a
descriptor opened before it). Each of these tests failed before hyfl wrote these files
through :mod:`hyfl._private_files`.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from hyfl._private_files import open_private, private_folder, private_write, savez_private
from hyfl.errors import HyflError
from synthetic_data import synthetic

SRC = Path(__file__).resolve().parents[1] / "src" / "hyfl"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def renamed(monkeypatch):
    """Under umask 0: the mode of every file at the moment it is renamed into place."""
    seen: dict[Path, int] = {}
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        seen[Path(dst).resolve()] = _mode(Path(src))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    old = os.umask(0)
    try:
        yield seen
    finally:
        os.umask(old)


def assert_private(renamed: dict[Path, int], *paths: Path, folders: tuple[Path, ...] = ()
                   ) -> None:
    """Each of ``paths`` is a 0600 file now and was when it was renamed into place (if it
    was); each of ``folders`` is 0700."""
    for path in paths:
        assert path.is_file(), path
        assert _mode(path) == 0o600, f"{path} is {oct(_mode(path))}"
        if path.resolve() in renamed:
            at_rename = renamed[path.resolve()]
            assert at_rename == 0o600, f"{path} was {oct(at_rename)} before its rename"
    for folder in folders:
        assert folder.is_dir(), folder
        assert _mode(folder) == 0o700, f"folder {folder} is {oct(_mode(folder))}"


# -- the helper ------------------------------------------------------------------------

def test_the_helper_creates_private_files_and_folders(renamed, tmp_path):
    target = tmp_path / "a" / "b" / "file.bin"
    with private_write(target) as f:
        f.write(b"secret")
    savez_private(tmp_path / "a" / "arrays.npz", x=np.arange(3))
    with open_private(tmp_path / "a" / "c" / "log.txt") as log:
        log.write(b"line\n")
    assert_private(renamed, target, tmp_path / "a" / "arrays.npz", tmp_path / "a" / "c" / "log.txt",
                   folders=(tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "c"))
    assert target.read_bytes() == b"secret"


def test_an_open_log_that_others_could_read_is_replaced_not_chmodded(renamed, tmp_path):
    """Someone who opened a world-readable log earlier keeps reading what is appended to
    that inode; the private file is a new one, with the old lines."""
    log = tmp_path / "run.log"
    log.write_bytes(b"old\n")
    log.chmod(0o644)
    earlier = open(log, "rb")  # noqa: SIM115 (another user's descriptor)
    try:
        with open_private(log) as f:
            f.write(b"new values\n")
        assert log.read_bytes() == b"old\nnew values\n"
        assert earlier.read() == b"old\n"  # the old inode: nothing new reaches it
        assert_private(renamed, log)
    finally:
        earlier.close()


def test_a_planted_symlink_is_refused(tmp_path):
    (tmp_path / "elsewhere").write_bytes(b"")
    (tmp_path / "log").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(HyflError, match="cannot be opened"):
        open_private(tmp_path / "log")
    assert private_folder(tmp_path / "new") == tmp_path / "new"


# -- each kind of file -------------------------------------------------------------------

def test_split_block_files_are_private_from_creation(renamed, tmp_path):
    """``hyfl deploy split``'s party-K.npz hold raw feature values and labels."""
    from hyfl.deploy.blocks import write_blocks
    from hyfl.partition import grid
    from hyfl.problem import make_problem

    problem = make_problem(synthetic(n=30, m=4), "hinge", 0.05)
    out = tmp_path / "split" / "blocks"
    files = write_blocks(problem, grid(30, 4, 2, 1), out)
    assert_private(renamed, *files, folders=(out, tmp_path / "split"))


def test_key_files_and_their_folder_are_private(renamed, tmp_path):
    """The private key is 0600 from its creation, its new folder 0700; the public key may
    be read but never written by others (a swapped public key would re-key the run)."""
    from hyfl.deploy.keys import generate_keys

    private, public = generate_keys(tmp_path / "keys", 256, insecure_test_keys=True)
    assert_private(renamed, private, folders=(tmp_path / "keys",))
    assert _mode(public) & 0o022 == 0, oct(_mode(public))
    assert renamed[public.resolve()] & 0o022 == 0


def test_a_party_state_file_is_private_from_creation(renamed, tmp_path):
    """A party's saved state (its block, duals, keys' material) is never a default-mode file,
    not even before a chmod."""
    from flwr.app import Context, RecordDict

    from hyfl.deploy.app import save_state

    context = Context(run_id=7, node_id=1, node_config={"party": 0}, state=RecordDict(),
                      run_config={})
    folder = tmp_path / "worker" / "state"
    save_state(context, ({"alpha": np.array([1.0, -1.0])}, "{}"), folder)
    assert_private(renamed, folder / "run-7-party-0.npz", folders=(folder,))


@pytest.fixture
def deployed_run(renamed, tmp_path):
    """An in-process deployed run whose parties and server write their results."""
    from hyfl.deploy.blocks import write_blocks
    from hyfl.deploy.config import DeployConfig, run_config_for
    from hyfl.deploy.coordinator import Coordinator
    from hyfl.deploy.keys import generate_keys, server_cipher
    from hyfl.partition import grid
    from hyfl.problem import make_problem
    from in_process import RecordingTransport

    private, public = generate_keys(tmp_path / "keys", 256, insecure_test_keys=True)
    problem = make_problem(synthetic(n=30, m=4), "hinge", 0.05)
    files = write_blocks(problem, grid(30, 4, 1, 2), tmp_path / "blocks")
    nodes = [{"party": k, "key": str(private), "cipher": "paillier", "insecure-test-keys": True,
              "data": str(f), "out": str(tmp_path / "parties")} for k, f in enumerate(files)]
    config = run_config_for(parties=2, iterations=2, cipher="paillier", public_key=str(public),
                            seed=1, insecure_test_keys=True, out=str(tmp_path / "server"))
    job = DeployConfig.from_run_config(config)
    cipher = server_cipher("paillier", public, **job.cipher_options(), insecure_test_keys=True)
    Coordinator(job, RecordingTransport(nodes, config, cipher), cipher,
                log=lambda line: None).run()
    return tmp_path


def test_a_party_final_file_is_private(renamed, deployed_run):
    """parties/party-K.npz holds the party's final duals, whose signs are its labels."""
    parties = deployed_run / "parties"
    assert_private(renamed, parties / "party-0.npz", parties / "party-1.npz", folders=(parties,))


def test_the_server_outputs_are_private(renamed, deployed_run):
    """weights.npz, weights-latest.npz (a model of the parties' data) and deploy.json."""
    from hyfl.deploy.coordinator import LATEST_WEIGHTS

    server = deployed_run / "server"
    assert_private(renamed, server / "weights.npz", server / "deploy.json", folders=(server,))
    assert renamed[(server / LATEST_WEIGHTS).resolve()] == 0o600


def test_a_model_file_is_private(renamed, tmp_path):
    """model.npz: weights and the parties' feature scales (column statistics)."""
    from hyfl.model_file import model_from_problem, save_model
    from hyfl.problem import make_problem

    problem = make_problem(synthetic(n=30, m=4), "hinge", 0.05)
    path = save_model(tmp_path / "out" / "model.npz",
                      model_from_problem(problem, np.ones(4), feature_scale=np.full(4, 2.0)))
    assert_private(renamed, Path(path), folders=(tmp_path / "out",))


def test_a_checkpoint_is_private(renamed, tmp_path):
    """A run's checkpoint holds every party's duals and weights."""
    from hyfl.algorithms import make_algorithm
    from hyfl.participation import parse_participation
    from hyfl.partition import grid
    from hyfl.problem import make_problem
    from hyfl.runtime.checkpoint import Checkpointing
    from hyfl.runtime.simulation import simulate

    problem = make_problem(synthetic(n=30, m=4), "hinge", 0.05)
    path = tmp_path / "run" / "checkpoint.npz"
    simulate(make_algorithm("hyfdca", {}), problem, grid(30, 4, 2, 2),
             parse_participation("full", 4), 2, seed=0, checkpointing=Checkpointing(path, every=1))
    assert_private(renamed, path, folders=(tmp_path / "run",))


def test_predictions_are_private(renamed, tmp_path):
    """One line per sample of a party's data: its predictions and labels."""
    from hyfl.predict import write_predictions

    out = write_predictions(tmp_path / "p" / "predictions.csv", np.array([1.0, -1.0]), ["y"],
                            np.array([[1.0], [-1.0]]))
    assert_private(renamed, out, folders=(tmp_path / "p",))


def test_a_local_deployment_files_are_private(renamed, tmp_path):
    """FLWR_HOME's connection file, node configs, run configs and each process's log (a
    party's log quotes the errors of its messages)."""
    from hyfl.deploy.local import LocalDeployment, _prepare_out, flower_env, write_connection

    out = tmp_path / "local" / "out"
    _prepare_out(out, overwrite=False)
    work = out / "flower"
    deployment = LocalDeployment([{"party": 0, "data": "x"}], work)
    deployment.workdir.mkdir(mode=0o700)
    deployment.home = work / "flwr_home"
    deployment.env = flower_env(deployment.home)
    deployment.logs = private_folder(work / "logs")
    deployment.app = work / "app"
    connection = write_connection(deployment.home, "127.0.0.1:1")
    process = deployment._spawn("probe", [sys.executable, "-c", "print('value 0.25')"])
    process.wait(timeout=60)
    deployment.submit({"seed": 1}, "run")  # no SuperLink there: it fails, its log stays
    deployment.stop()
    assert_private(renamed, connection, work / "logs" / "probe.log", work / "run-config.toml",
                   work / "logs" / "run.log", folders=(out, deployment.home))


def test_no_default_mode_writer_left_in_deploy():
    """Every write in hyfl.deploy goes through hyfl._private_files (or names why not)."""
    # (np.savez(f, ...) writes into a file private_write opened)
    writers = re.compile(r"np\.savez\((?!f\b|\s*$)|\.write_text\(|\.write_bytes\(|\bwrite_json\(|"
                         r"\bwrite_text\(|atomic_write\(|\.mkdir\(|open\([^)]*['\"][wa]b?['\"]")
    allowed = {  # file: why a default-mode write is right there
        "flower_app.py": "the Flower App project: hyfl's own code and the job's options",
    }
    found = []
    for path in sorted((SRC / "deploy").glob("*.py")):
        if path.name in allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            # The public key is meant to be read by others (written 0644, see keys.py).
            if writers.search(code) and "private" not in code and "public_path" not in code:
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
