"""An attacker's review of the party-files alignment: an active server and a hostile peer.

Each test plays one attack against a claim of docs/privacy.md or docs/deployment.md, with
the coordinator and the parties in this process (the real codec and messages,
:mod:`in_process`). The ones that worked on the code before this review (the run finished
with a wrong join or wrong scales, unnoticed) now stop the run:

* **two numbers for one sample** (`labels`/`block`): the server swaps the global numbers of
  two rows one party shares with a peer. Every seal now binds, row by row, each side's
  own number of its row.
* **one number for two samples** (`block`): the server gives a party's private row the
  number of a sample only its peers hold. At `setup` every party checks that each peer's
  samples meet its own exactly in the samples the two share, and that every number has a
  holder.
* **a shared sample left out and split** (`labels`): the server drops the pairs of a sample
  held by three parties from one holder's lists and numbers it apart there. Each party
  now computes its join with each peer itself, from the peer's tagged re-blinding of its
  list, and the pairs must be exactly that join.
* **wrong secure-sum totals** (`block`): the server adds to the totals (with or without a
  guess at the check). The parties now add a keyed linear check sum over ``GF(2^127-1)``,
  masked like every cell, and refuse totals that do not carry it.

Attacks that fail (and failed before) are kept as tests too: a truncated or repeated peer
list, a hostile peer's hello tagged for another party's place, two parties' masked sums
combined, masks compared across runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hyfl.deploy.keys import generate_keys, party_cipher
from hyfl.privacy.alignment import hello_tag
from hyfl.privacy.tags import cipher_secret
from in_process import party_files_deployment as _deploy
from in_process import refusal_of as _run
from synthetic_data import horizontal_organisation_files as _horizontal_files
from synthetic_data import organisation_files


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return generate_keys(tmp_path_factory.mktemp("ckks-keys"), cipher="ckks")


def _chunks(payload: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """A ``labels`` message's pairs per peer: (this party's positions, the peer's)."""
    split = np.cumsum(payload["shared_counts"])[:-1]
    return list(zip(np.split(payload["shared_rows"], split),
                    np.split(payload["peer_rows"], split)))


def _renumber(payload: dict, change) -> dict:
    """A ``labels`` (if it numbers the samples) or ``block`` message with its samples
    changed by ``change(samples, n_samples) -> (samples, n_samples)``."""
    if payload.get("samples") is None:
        return payload
    samples, n = change(np.asarray(payload["samples"]).copy(), int(payload["n_samples"]))
    return {**payload, "samples": samples, "n_samples": n}


# ---------------------------------------------------------------- the numbering of samples

def test_two_holders_of_one_sample_given_two_numbers_stop_the_run(tmp_path, keys):
    """The server swaps, at the telco (party 1), the numbers of two customers it shares
    with the bank only (20-39): each of the two is then under one number at the bank and
    another at the telco -- the same sets of numbers, so nothing counted differs. Before:
    the run finished on that wrong join. Now each seal binds both sides' numbers of every
    row, and the bank's labels do not open at the telco."""
    files, *_ = organisation_files(tmp_path)
    swap: dict[str, np.ndarray] = {}

    def forge(k, kind, payload):
        if k == 1 and kind == "labels":
            (with_0, _), (with_2, _) = _chunks(payload)[0], _chunks(payload)[2]
            alone = np.setdiff1d(with_0, with_2)
            swap["rows"] = alone[:2]
        if k == 1 and kind in ("labels", "block") and "rows" in swap:
            a, b = swap["rows"]

            def change(samples, n):
                samples[[a, b]] = samples[[b, a]]
                return samples, n
            payload = _renumber(payload, change)
        return payload

    refusal = _run(_deploy(files, keys, forge=forge)[0])
    assert refusal is not None, "the run finished with two customers numbered otherwise " \
        "at the bank than at the telco"
    assert "do not open" in refusal, refusal


def test_two_samples_under_one_number_stop_the_run(tmp_path, keys):
    """The server gives one of the bank's own customers (0-19, held by nobody else) the
    number of a customer only the telco and the shop hold: HyFDCA would take two people for
    one sample of three holders. Before: the run finished. Now the bank refuses the
    set-up, whose partition shows it sharing a sample with a peer it shares none with
    there."""
    files, *_ = organisation_files(tmp_path)
    target: dict = {}

    def forge(k, kind, payload):
        if k == 0 and kind == "labels":
            target["shared"] = np.asarray(payload["shared_rows"])
        if kind in ("labels", "block"):
            def change(samples, n):
                if "row" not in target:  # party 0 comes first in every exchange
                    row = int(np.setdiff1d(np.arange(samples.size), target["shared"])[0])
                    peers = np.setdiff1d(np.arange(n - 1), samples)  # a peer's sample
                    target.update(row=row, own=int(samples[row]), peer=int(peers[0]))
                if target["own"] == n - 1:
                    pytest.skip("the private row drew the last number")
                # The last number takes the place of the bank customer's own (so that every
                # number keeps a holder), and the customer takes a peer's sample's number.
                samples[samples == n - 1] = target["own"]
                if k == 0:
                    samples[target["row"]] = target["peer"]
                return samples, n - 1
            payload = _renumber(payload, change)
        return payload

    coordinator, transport = _deploy(files, keys, forge=forge)
    refusal = _run(coordinator)
    assert refusal is not None, "the run finished with two customers under one number"
    assert "setup" in refusal or "do not open" in refusal or "other samples" in refusal, refusal


def test_a_shared_sample_left_out_of_labels_and_split_stops_the_run(tmp_path, keys):
    """A customer the bank, the telco and the shop all hold (40-59): the server leaves the
    bank's pairs of it out of every ``labels`` message and numbers it apart at the bank
    (one sample more for everybody). The telco and the shop still agree on it and the
    bank labels its copy itself: before, the run finished, training on a split sample
    with half its features each. Now the bank computes its join with each peer from the
    peer's tagged re-blinding of its list and refuses the pairs."""
    files, *_ = organisation_files(tmp_path)
    plan: dict = {}

    def drop(payload, peer, position):
        mine, theirs = (list(c) for c in zip(*_chunks(payload)))
        keep = mine[peer] != position
        mine[peer], theirs[peer] = mine[peer][keep], theirs[peer][keep]
        return {**payload, "shared_rows": np.concatenate(mine),
                "peer_rows": np.concatenate(theirs),
                "shared_counts": np.array([m.size for m in mine])}

    def forge(k, kind, payload):
        if kind == "labels":
            if k == 0:
                _, (m1, t1), (m2, t2) = _chunks(payload)
                p0 = int(np.intersect1d(m1, m2)[0])
                plan.update(p0=p0, q1=int(t1[m1 == p0][0]), q2=int(t2[m2 == p0][0]))
                payload = drop(drop(payload, 1, p0), 2, p0)
            else:
                payload = drop(payload, 0, plan["q1" if k == 1 else "q2"])
        if kind in ("labels", "block"):
            def change(samples, n):
                if k == 0:
                    samples[plan["p0"]] = n  # the bank's copy: a sample of its own
                return samples, n + 1
            payload = _renumber(payload, change)
        return payload

    refusal = _run(_deploy(files, keys, forge=forge)[0])
    assert refusal is not None, "the run finished with a sample of three holders split in two"
    assert "names other rows" in refusal, refusal


# ---------------------------------------------------------------- the secure sum's totals


@pytest.mark.parametrize("guess", ["totals only", "check shifted alike"])
def test_wrong_secure_sum_totals_are_refused(tmp_path, keys, guess):
    """The server adds 5.0 to the first column's total sum and 1e4 to its sum of squares
    (every party is sent the same), so every party scales that feature wrongly. Before:
    the run finished on those scales. Now the totals must carry the parties' summed check
    sum, keyed with the key holders' secret and the run: a change the server cannot weigh
    as the key does is refused (here also with the check's lowest limb shifted by the
    same integers, the guess of coefficients 1)."""
    from hyfl.privacy.secure_scaling import encode

    files = _horizontal_files(tmp_path)
    delta = encode(np.array([[5.0, 0, 0], [1e4, 0, 0]]))

    def forge(k, kind, payload):
        if kind == "block" and payload.get("moments") is not None:
            payload = {**payload, "moments": payload["moments"] + delta}
            if guess != "totals only" and payload.get("moments_check") is not None:
                check = payload["moments_check"].copy()
                check[0] = check[0] + delta[0, 0] + delta[1, 0]
                payload["moments_check"] = check
        return payload

    refusal = _run(_deploy(files, keys, forge=forge, standardize=True)[0])
    assert refusal is not None, "the run finished with the server's totals"
    assert "check sum" in refusal, refusal


def test_honest_totals_verify_and_each_runs_check_is_its_own(tmp_path, keys):
    """An honest run with standardize verifies its totals; the totals and check of another
    run of the same parties and data (the same totals) do not verify in a new run."""
    files = _horizontal_files(tmp_path)
    earlier, transport = _deploy(files, keys, standardize=True)
    assert _run(earlier) is None
    old = transport.sent(0, "block")

    def replay(k, kind, payload):
        if kind == "block":
            payload = {**payload, "moments": old["moments"],
                       "moments_check": old["moments_check"]}
        return payload

    refusal = _run(_deploy(files, keys, forge=replay, standardize=True)[0])
    assert refusal is not None and "check sum" in refusal, refusal


# ---------------------------------------------------------------- attacks that fail

@pytest.mark.parametrize("how", ["truncated", "repeated point"])
def test_a_truncated_or_repeated_peer_list_is_refused(tmp_path, keys, how):
    """The server cuts the last five points of the shop's list it gives the telco (to learn
    nothing of them, or to drop samples from the join), or repeats one of its points: the
    shop's tag covers its whole list, so the telco refuses before it re-blinds any."""
    files, *_ = organisation_files(tmp_path)

    def forge(k, kind, payload):
        if k == 1 and kind == "align":
            counts = payload["peer_counts"].copy()
            peers = payload["peers"]
            if how == "truncated":
                peers, counts[2] = peers[:-5], counts[2] - 5
            else:
                peers = np.concatenate([peers[:-1], peers[-2:-1]])
            payload = {**payload, "peers": peers, "peer_counts": counts}
        return payload

    coordinator, transport = _deploy(files, keys, forge=forge)
    refusal = _run(coordinator)
    assert transport.reply(1, "align") is None
    assert refusal is not None and "party 2's hello" in refusal and "tag" in refusal, refusal


def test_peers_re_blindings_swapped_in_labels_are_refused(tmp_path, keys):
    """The server hands the bank the telco's re-blinding of the bank's list in the shop's
    place and the other way round, tags moved along (so that the bank's join checks
    would see other pairs): each tag names its blinder, and the bank refuses."""
    files, *_ = organisation_files(tmp_path)

    def forge(k, kind, payload):
        if k == 0 and kind == "labels":
            first, second = np.split(payload["doubles"], 2)
            tags = payload["double_tags"][[0, 2, 1]]
            payload = {**payload, "doubles": np.concatenate([second, first]),
                       "double_tags": tags}
        return payload

    coordinator, transport = _deploy(files, keys, forge=forge)
    refusal = _run(coordinator)
    assert transport.reply(0, "labels") is None
    assert refusal is not None and "re-blinding of party 0's ids" in refusal, refusal


def test_a_hostile_peer_tagging_its_hello_for_another_place_is_refused(tmp_path, keys):
    """A hostile party holds the key holders' secret, so it can tag anything. The shop
    tags its hello as party 0's (to have its list taken for the bank's): the server puts
    a reply where the node that sent it is, so the peers check the tag for place 2 and
    refuse it before they re-blind anything."""
    files, *_ = organisation_files(tmp_path)
    private, _ = keys
    secret = cipher_secret(party_cipher("ckks", private, insecure_test_keys=True))

    def alter(k, kind, reply):
        if k == 2 and kind == "hello":
            a = reply["align"]
            tag = hello_tag(secret, 0, a["nonce"].tobytes(), a["channel"].tobytes(),
                            a["blinded"], a["column_keys"])
            reply = {**reply, "align": {**a, "tag": np.frombuffer(tag, np.uint8).copy()}}
        return reply

    coordinator, transport = _deploy(files, keys, alter=alter)
    refusal = _run(coordinator)
    assert transport.reply(0, "align") is None and transport.reply(1, "align") is None
    assert refusal is not None and "party 2's hello" in refusal, refusal


def test_two_parties_masked_sums_combined_and_masks_across_runs_show_nothing(tmp_path, keys):
    """Standardize with three organisations: the server adds two parties' masked sums (the
    third's masks stay in); and it compares one party's masked sums of two runs (fresh
    channel keys and run identity: other masks). Neither comes near a party's statistics."""
    from hyfl.privacy.secure_scaling import decode, sum_messages

    files, *_ = organisation_files(tmp_path)
    runs = []
    for _ in range(2):
        coordinator, transport = _deploy(files, keys, standardize=True)
        assert _run(coordinator) is None
        runs.append([transport.reply(k, "labels")["moments"] for k in range(3)])
    first = runs[0]
    # Uniform residues decode to about +-8e6, so one cell in ~8,000 lands within 1e3 of
    # zero by chance; the statistics themselves are sums of |x| < 90. At most one such
    # cell among all the looks below (two would be chance of ~1e-5).
    looks = [decode(sum_messages([first[a], first[b]])) for a, b in ((0, 1), (0, 2), (1, 2))]
    looks.append(decode(runs[0][0] - runs[1][0]))  # one party's sums of two runs
    looks.extend(decode(m) for m in first)  # each alone
    near = sum(int(np.sum(np.abs(look) < 1e3)) for look in looks)
    assert near <= 1, near


# ---------------------------------------------------------------- a local user

@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_the_serverapps_task_token_is_on_no_command_line(tmp_path):
    """``hyfl deploy local``: while a job's ServerApp runs, no process of the deployment has
    a task token on its command line (which every local user reads in /proc/PID/cmdline).
    Before: Flower's SuperExec started ``flwr-serverapp --token <64 hex digits>``, and any
    user could act as that run's server. Now the SuperLink's SuperExec hands it over as
    ``--token-file /dev/fd/N`` (an in-memory file), and the ServerApp still starts."""
    import re
    import time

    from hyfl.deploy.config import run_config_for as run_config
    from hyfl.deploy.local import LocalDeployment

    files, *_ = organisation_files(tmp_path / "files")
    nodes = [{"party": 0, "cipher": "none", "data": str(files[0]), "id-column": "customer",
              "label-column": "income"}]
    work = tmp_path / "flower"
    with LocalDeployment(nodes, work) as local:
        # Two parties expected, one started: the ServerApp waits for the second one.
        local.submit(run_config(parties=2, iterations=1, cipher="none", out=str(tmp_path / "out"),
                                connect_timeout=600.0))
        end, serverapp = time.monotonic() + 180, None
        while serverapp is None and time.monotonic() < end:
            for entry in Path("/proc").iterdir():
                try:
                    line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if "flwr-serverapp" in line:
                    serverapp = line
            time.sleep(0.5)
        assert serverapp is not None, "no ServerApp started"
        # This deployment's processes only (another test's per-message ClientApps, which
        # do pass --token, may run beside it): those addressing its ports.
        ours = [local.address, *local.runtime_apis.values()]
        lines = []
        for entry in Path("/proc").iterdir():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if any(address in line for address in ours):
                lines.append(line)
        assert lines, "none of the deployment's processes found"
    assert "--token-file /dev/fd/" in serverapp, serverapp
    leaked = [line for line in lines if re.search(r"--token[ =][0-9a-f]{32,}", line)]
    assert not leaked, f"a task token on a command line: {leaked}"


def test_the_superexec_patches_hold_on_the_installed_flower():
    """The two patches behind the test above, against the installed Flower (in a fresh
    interpreter, to leave this one's Flower alone): the SuperLink starts its SuperExec
    through hyfl, whose executor passes the token as an open in-memory file."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from hyfl.deploy import flower_patches as p\n"
        "assert p.superexec_through_hyfl() and p.tokens_off_command_lines()\n"
        "import importlib\n"
        "cli = importlib.import_module('flwr.superlink.cli.flower_superlink')\n"
        "command = cli._get_superexec_command(runtime_address='127.0.0.1:1', "
        "runtime_certificates=None, runtime_root_certificates_path=None, parent_pid=1, "
        "runtime_dependency_install=False)\n"
        "assert command[:3] == [sys.executable, '-m', 'hyfl.deploy.superexec'], command\n"
        "from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor\n"
        "assert SubprocessExecutor.launch._hyfl\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_a_stopped_deployment_leaves_no_party_state(tmp_path):
    """``hyfl deploy local`` run to its end and stopped: no party's worker state (its last
    ``context.state``: the block's raw features and labels, the plaintext duals, the
    alignment's secrets) stays in the runtime folder. Before, every party's
    ``hyfl-party-state-*`` folder stayed with its state file (Flower ends a SuperNode on
    SIGTERM through ``os._exit``, which skips ``atexit``); private (0700), but kept past
    the run for as long as the machine's temporary files are."""
    import re

    from hyfl.deploy.config import run_config_for as run_config
    from hyfl.deploy.local import LocalDeployment
    from hyfl.deploy.supernode import _private_runtime_dir

    files, *_ = organisation_files(tmp_path / "files")
    nodes = [{"party": k, "cipher": "none", "data": str(f), "id-column": "customer",
              "label-column": "income"} for k, f in enumerate(files)]
    with LocalDeployment(nodes, tmp_path / "flower") as local:
        results = local.run(run_config(parties=3, iterations=1, cipher="none",
                                       out=str(tmp_path / "out")), timeout=240)
    assert results["status"] == "completed", results.get("error")
    log = (tmp_path / "flower" / "logs" / "party-0.log").read_text(errors="replace")
    run = re.search(r"RUN (\d+)", log).group(1)
    import tempfile

    folder = Path(_private_runtime_dir() or tempfile.gettempdir())
    left = sorted(folder.glob(f"hyfl-party-state-*/run-{run}-party-*"))
    assert not left, f"party states left after the deployment stopped: {left}"
    # The parties keep their states in the deployment's own runtime folder, removed with
    # it, so a SuperNode that Flower ends before its own clean-up leaves nothing either.
    assert not (tmp_path / "flower" / "runtime").exists()


@pytest.mark.slow
def test_no_other_local_user_can_take_the_serverapps_task(tmp_path):
    """``hyfl deploy local``: the SuperLink's ``AcquireTask`` (which hands a run's ServerApp
    task and its token to whoever asks first) refuses a request without the SuperExec's
    secret, or with another (401); the deployment's own SuperExec, which holds it, still
    runs jobs (the other loopback tests). Before: it answered anyone (200), so a local
    user polling it could take a run's task and act as its server."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType

    from hyfl.deploy.local import LocalDeployment
    from test_deploy_channels import _runtime_client, _status

    with LocalDeployment([{"party": 0}], tmp_path / "flower") as local:
        request = AcquireTaskRequest(supported_task_types=[TaskType.SERVER_APP])
        for key in (None, b"not the deployment's secret"):
            stranger = _runtime_client(local.address, secret=key)
            assert _status(lambda c=stranger: c.AcquireTask(request)) == 401
            stranger.close()
