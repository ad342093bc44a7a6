"""``flower-superlink`` whose Control API admits only the deploying user (Flower 1.41.0).

``python -m hyfl.deploy.superlink --hyfl-control-token-file FILE [flower-superlink
options]`` starts Flower's ordinary SuperLink with one change: a Control API request
(``flwr run``, ``flwr ls``, ``flwr stop``...; everything under ``/v1/control/``) is
admitted only with ``Authorization: Bearer <token>``, the token being the bytes of
``FILE`` (:func:`hyfl.deploy.flower_patches.require_control_token`). Why: in
open-source Flower the Control API has no authentication, and it is what submits
jobs, so any user of the machine could otherwise run code as the deploying user.

``FILE`` must be readable by its owner only (this user) and is removed, with its
folder, as soon as it is read: the token then lives in this process and in the
deploying user's ``$FLWR_HOME/credentials.yaml`` (0600, in a 0700 folder), from
which ``flwr run`` sends it (:func:`hyfl.deploy.local.write_control_credentials`).

The same port's ServerAppIo API is closed too: the SuperLink runs in process
isolation with a SuperExec of its own (:func:`own_superexec`), sharing a secret
that Flower's ``AcquireTask`` requires, so no other local user can take a run's
ServerApp task (and its token); and that SuperExec hands the token to the
ServerApp as an in-memory file, on no command line (:mod:`hyfl.deploy.superexec`).

What this does not close (docs/deployment.md, "Who can reach a local deployment"):
the same port's Fleet API (any local user can join as one more SuperNode: without
the parties' key it cannot make a party's announcement, so at most it stops the
run, and it cannot act as a party's SuperNode, whose requests are signed with a key
pair that lives in that SuperNode's memory); SuperNode authentication needs TLS.

With another Flower version the SuperLink is not started (exit with a message): an
open Control API is not an acceptable fallback.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from hyfl.deploy.flower_patches import (
    PATCHED_VERSION,
    hold_pulls,
    lean_http_middleware,
    require_control_token,
    superexec_through_hyfl,
)

#: The option naming the token file (removed from what Flower sees).
TOKEN_OPTION = "--hyfl-control-token-file"


def _take_option(argv: list[str], name: str) -> tuple[str | None, list[str]]:
    rest, value, i = [], None, 0
    while i < len(argv):
        if argv[i] == name and i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith(name + "="):
            value = argv[i].split("=", 1)[1]
        else:
            rest.append(argv[i])
        i += 1
    return value, rest


def read_token(path: str) -> bytes:
    """The token in ``path`` (owner-only, 32 to 4096 bytes); its folder is removed."""
    from hyfl.deploy.supernode import check_private

    problem = check_private(path)
    if problem is not None:
        sys.exit(f"hyfl: {TOKEN_OPTION} {path} {problem}")
    token = Path(path).read_bytes()
    # No copy stays on disk beside the client's credential store.
    shutil.rmtree(Path(path).parent, ignore_errors=True)
    if not 32 <= len(token) <= 4096:
        sys.exit(f"hyfl: {TOKEN_OPTION} {path}: a token of 32 to 4096 bytes, not {len(token)}")
    return token


def own_superexec(argv: list[str]) -> list[str]:
    """Start the SuperExec here, with a secret shared with this SuperLink; the SuperLink's
    options (``argv``) with ``--isolation process`` and that secret.

    Why: Flower's ``AcquireTask`` on the SuperLink's ServerAppIo API hands a run's
    ServerApp task, with its token, to whoever asks first -- any local user polling
    it could act as the run's server. Flower authenticates it with
    ``--superexec-auth-secret-file`` only in process isolation with a SuperExec of
    one's own, which is this: the secret (32 random bytes) is in an in-memory file
    (``memfd_create``) that this process reads as ``/dev/fd/N`` and passes to the
    SuperExec as an open descriptor -- on no disk, command line or environment. The
    SuperExec is ``python -m hyfl.deploy.superexec`` (task tokens on no command line),
    in this process's group and told this process's id (it dies with it). Without
    ``--port``, or with an isolation or secret of the caller's own: ``argv`` as is.
    """
    import os
    import secrets
    import subprocess

    port, _ = _take_option(list(argv), "--port")
    host, _ = _take_option(list(argv), "--host")
    isolation, _ = _take_option(list(argv), "--isolation")
    given, _ = _take_option(list(argv), "--superexec-auth-secret-file")
    if port is None or isolation is not None or given is not None:
        return argv
    fd = os.memfd_create("hyfl-superexec-secret")  # close-on-exec: only pass_fds hands it on
    os.write(fd, secrets.token_bytes(32))
    secret_file = f"/dev/fd/{fd}"
    address = f"{'127.0.0.1' if host in (None, '', '0.0.0.0') else host}:{port}"
    subprocess.Popen([sys.executable, "-m", "hyfl.deploy.superexec", "--insecure",  # noqa: S603
                      "--runtime-api-address", address, "--parent-pid", str(os.getpid()),
                      "--superexec-auth-secret-file", secret_file], pass_fds=(fd,))
    return [*argv, "--isolation", "process", "--superexec-auth-secret-file", secret_file]


def main() -> None:
    path, argv = _take_option(sys.argv[1:], TOKEN_OPTION)
    if path is None:
        sys.exit(f"hyfl: {TOKEN_OPTION} FILE is required (the Control API's token)")
    if not (require_control_token(read_token(path)) and superexec_through_hyfl()):
        sys.exit(f"hyfl: the SuperLink's owner-only Control API needs Flower {PATCHED_VERSION}; "
                 f"install flwr=={PATCHED_VERSION}")
    # Speed-ups: without them the SuperLink is Flower's.
    lean_http_middleware("superlink")
    hold_pulls()
    from flwr.superlink.cli.flower_superlink import flower_superlink

    sys.argv = ["flower-superlink", *own_superexec(argv)]
    flower_superlink()


if __name__ == "__main__":
    main()
