"""Who can reach ``hyfl deploy local``'s SuperLink (issue 42, point 7).

Open-source Flower 1.41's Control API -- what ``flwr run`` calls to submit a job,
whose ServerApp then runs as the deploying user -- has no authentication: any user
of the machine could submit a job. hyfl's SuperLink (:mod:`hyfl.deploy.superlink`)
admits a Control API request only with the deployment's token, which only the
deploying user holds. These tests start the SuperLink alone (no parties, no run:
seconds, not minutes); an unauthenticated request was admitted before.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import httpx
import pytest

pytest.importorskip("flwr")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _list_runs(address: str, token: bytes | None = None) -> httpx.Response:
    """A Control API call (ListRuns) as any local user could make it, with or without a token."""
    from flwr.proto.control_pb2 import ListRunsRequest

    headers = {"content-type": "application/protobuf", "accept": "application/protobuf"}
    if token is not None:
        headers["authorization"] = f"Bearer {token.decode()}"
    return httpx.post(f"http://{address}/v1/control/list-runs", headers=headers,
                      content=ListRunsRequest().SerializeToString(), timeout=30)


@pytest.fixture(scope="module")
def superlink(tmp_path_factory):
    from hyfl.deploy.local import LocalDeployment

    work = tmp_path_factory.mktemp("access") / "flower"
    lines: list[str] = []
    with LocalDeployment([], work, log=lines.append) as local:
        yield local, lines


def test_the_control_api_refuses_a_request_without_the_token(superlink):
    """Another local user's request (no token, a wrong token) is refused; the owner's passes."""
    local, _ = superlink
    assert _list_runs(local.address).status_code == 401
    assert _list_runs(local.address, b"0" * 64).status_code == 401
    assert _list_runs(local.address, local.control_token).status_code == 200


def test_flwr_without_the_owners_credentials_cannot_submit(superlink, tmp_path):
    """``flwr`` with another FLWR_HOME (another user's) is refused; with the deployment's own
    credentials (or ones written for it) it is admitted."""
    from hyfl.deploy.local import flower_command, flower_env, write_connection

    local, _ = superlink
    other = tmp_path / "other-user"
    write_connection(other, local.address)
    env = flower_env(other)
    refused = subprocess.run([flower_command("flwr", env), "ls"], env=env, capture_output=True,
                             text=True, timeout=300)
    assert refused.returncode != 0
    for home in (local.home, other):
        if home == other:
            local.write_control_credentials(other)
        env = flower_env(home)
        admitted = subprocess.run([flower_command("flwr", env), "ls"], env=env,
                                  capture_output=True, text=True, timeout=300)
        assert admitted.returncode == 0, admitted.stdout[-2000:] + admitted.stderr[-2000:]


def test_the_token_is_private_and_its_file_is_gone(superlink):
    """The token is in FLWR_HOME's credential store (0600, folder 0700), nowhere else on disk,
    and not on any command line."""
    local, _ = superlink
    credentials = local.home / "credentials.yaml"
    assert _mode(credentials) == 0o600 and _mode(local.home) == 0o700
    assert local.control_token.decode() not in credentials.read_text()  # (stored base64)
    argv = Path(f"/proc/{local.superlink.pid}/cmdline").read_bytes()
    token_file = Path(argv.split(b"\0")[argv.split(b"\0").index(b"--hyfl-control-token-file")
                                       + 1].decode())
    assert not token_file.exists() and not token_file.parent.exists()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                assert local.control_token not in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue


def _listening_ports(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of the TCP sockets in LISTEN held by ``pids``."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                address, port = fields[1].split(":")
                found.add((address, int(port, 16)))
    return found


def test_only_the_one_loopback_port_is_open_and_the_output_says_who_reaches_what(superlink):
    """No legacy gRPC Control or Fleet API (Flower's 9093/9092 on 0.0.0.0): the SuperLink's
    processes listen on its one port on 127.0.0.1 only; the output names each API."""
    from hyfl.deploy.local import _descendants

    local, lines = superlink
    pids = {local.superlink.pid, *_descendants(local.superlink.pid)}
    ports = _listening_ports(pids)
    assert ports and {port for _, port in ports} == {local.port}, ports
    assert all(address == "0100007F" for address, _ in ports), ports  # 127.0.0.1
    said = " ".join(lines)
    for needed in ("Control API (flwr run: jobs run as you): owner only", "Fleet API",
                   "ServerAppIo API", str(local.home / "credentials.yaml")):
        assert needed in said, said


def test_the_plugin_admits_only_the_exact_token():
    from flwr.common.constant import ACCESS_TOKEN_KEY

    from hyfl.deploy.flower_patches import owner_token_authn

    plugin = owner_token_authn(b"a" * 64)
    assert plugin.validate_tokens_in_metadata([(ACCESS_TOKEN_KEY, "a" * 64)])[0]
    for metadata in ([], [(ACCESS_TOKEN_KEY, "a" * 63)], [(ACCESS_TOKEN_KEY, "")],
                     [(ACCESS_TOKEN_KEY, "a" * 64), (ACCESS_TOKEN_KEY, "b" * 64)],
                     [("other", "a" * 64)]):
        assert plugin.validate_tokens_in_metadata(metadata) == (False, None)
    assert plugin.refresh_tokens([(ACCESS_TOKEN_KEY, "a" * 64)]) == (None, None)
    with pytest.raises(ValueError):
        owner_token_authn(b"short")
