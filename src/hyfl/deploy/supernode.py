"""``flower-supernode`` with a shorter idle poll (optional; Flower 1.41.0 only).

A SuperNode with nothing to do asks the SuperLink for new messages every 3 s,
and waits for its ClientApp's reply in steps of 0.5 s; both intervals are
hard-coded in ``flwr.supernode.start_client_internal`` (1.41.0). Each HyFDCA
message therefore waits 1.5 s on average before a party even starts on it.
Run as ``python -m hyfl.deploy.supernode [flower-supernode options]``, this
module caps those sleeps at ``$HYFL_SUPERNODE_POLL`` seconds (default 0.2)
and then starts the ordinary SuperNode. The cost is more idle requests to the
SuperLink (five a second per party at 0.2 s).

It replaces the ``time`` module seen by that one Flower module, so it is tied
to the pinned Flower version: with any other version, or if the module no
longer sleeps through ``time.sleep``, it starts the unmodified SuperNode.

On Linux it also starts the SuperNode's SuperExec (the one process the
SuperNode starts, from its main thread; it starts the ClientApp processes)
with ``SIGKILL`` as its parent-death signal (:func:`die_with_supernode`):
killing the SuperNode, even with SIGKILL, ends its SuperExec at once
instead of leaving it re-parented to init. The ClientApp processes it had
started then stop through Flower's own ``--parent-pid`` monitor; under
:mod:`hyfl.deploy._reaper` (``hyfl deploy local``, ``hyfl deploy party``)
the reaper kills them as well.
"""

from __future__ import annotations

import os
import signal
import subprocess as _subprocess
import sys
import time as _time

PATCHED_VERSION = "1.41.0"


class _CappedTime:
    """The ``time`` module with ``sleep`` capped at ``limit`` seconds."""

    def __init__(self, limit: float):
        self.limit = limit

    def __getattr__(self, name):
        return getattr(_time, name)

    def sleep(self, seconds: float) -> None:
        _time.sleep(min(seconds, self.limit))


def patch(limit: float) -> bool:
    """Cap the SuperNode's poll sleeps; False (and no change) if Flower is not 1.41.0."""
    import flwr
    import flwr.supernode.start_client_internal as internal

    if flwr.__version__ != PATCHED_VERSION or getattr(internal, "time", None) is not _time:
        return False
    internal.time = _CappedTime(limit)
    return True


class _DyingSubprocess:
    """The ``subprocess`` module whose ``Popen`` children get SIGKILL when their parent dies."""

    def __getattr__(self, name):
        return getattr(_subprocess, name)

    @staticmethod
    def Popen(*args, **kwargs):  # noqa: N802 (the module's name)
        from hyfl.deploy._reaper import PR_SET_PDEATHSIG, prctl

        if "preexec_fn" not in kwargs:
            kwargs["preexec_fn"] = lambda: prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        return _subprocess.Popen(*args, **kwargs)


def die_with_supernode() -> bool:
    """Linux: the SuperExec the SuperNode starts dies with it; False (no change) elsewhere."""
    import flwr
    import flwr.supernode.start_client_internal as internal

    from hyfl.deploy._reaper import LINUX

    if (not LINUX or flwr.__version__ != PATCHED_VERSION
            or getattr(internal, "subprocess", None) is not _subprocess):
        return False
    internal.subprocess = _DyingSubprocess()
    return True


def main() -> None:
    limit = float(os.environ.get("HYFL_SUPERNODE_POLL", "0.2"))
    die_with_supernode()
    if not patch(limit):
        print(f"hyfl: Flower is not {PATCHED_VERSION}; starting the SuperNode unmodified",
              file=sys.stderr)
    from flwr.supernode.cli.flower_supernode import flower_supernode

    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":
    main()
