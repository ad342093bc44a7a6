"""Run one command so that it, and every process it starts, dies with this process's parent.

``python -I -S _reaper.py PARENT_PID -- COMMAND...`` (what
:class:`hyfl.deploy.local.LocalDeployment` starts for each Flower process):

* the reaper asks the kernel for ``SIGHUP`` when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``) and also checks ``getppid()`` every 0.1 s
  (the parent *thread* may end while the parent process lives on, and other
  POSIX systems have no such signal); if the parent is already gone when it
  starts (``PARENT_PID`` is not its parent), it starts nothing;
* it becomes a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): a
  process started below it whose parent dies is re-parented to the reaper,
  not to init, so the whole tree stays in sight -- also the helpers Flower
  detaches into sessions of their own (the SuperLink's SuperExec and its
  ServerApp);
* it starts ``COMMAND`` in the reaper's process group (killing that group
  kills both), with ``SIGKILL`` as the command's parent-death signal, and marks the environment with
  ``HYFL_REAPER=<token>``, which every process below inherits;
* **the parent died** (SIGKILL included): everything below is killed with
  ``SIGKILL`` at once, then the reaper exits;
* **the command exited** (e.g. a SuperNode killed on its own): what it
  started (its SuperExec, ClientApp processes) gets ``SIGTERM``, after 2 s
  ``SIGKILL``; the reaper exits with the command's exit code;
* **SIGTERM or SIGINT** to the reaper (an orderly stop): everything below
  gets ``SIGTERM``, after ``$HYFL_REAPER_GRACE`` seconds (default 8)
  ``SIGKILL``.

"Everything below" is the tree of the reaper's descendants (from
``/proc/*/stat``) plus every process whose environment carries the token.
Elsewhere (no ``/proc``, no ``prctl``: macOS, BSD) it degrades to the
command's process group: the parent's death is noticed by polling
``getppid()``, and the reaper's process group is killed -- Flower's own ``--parent-pid``
monitors have to stop the helpers it detaches. The one case not covered is
the reaper itself being killed with SIGKILL on its own: then its command
dies (parent-death signal), but what that command started does not. Kill
the reaper's process group instead (``LocalDeployment`` does).

``PARENT_PID`` 0 watches no parent (``hyfl deploy party``, which replaces
itself by the reaper: the party runs until it is stopped, and a SuperNode
that dies still takes its helpers along).

Only the standard library is imported, and the file runs as a script
(``-I -S``: no site packages), so each reaper is a small process.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
MARKER = "HYFL_REAPER"
LINUX = sys.platform.startswith("linux") and os.path.isdir("/proc")


def prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` on Linux; False (nothing done) elsewhere or on failure."""
    if not LINUX:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> bool:
    """A child's own parent-death signal: ``sig`` when ``parent`` dies; False if it is gone.

    Called by the child itself as it starts -- instead of a ``preexec_fn``, which runs
    between ``fork`` and ``exec`` and is unsafe in a parent with threads (a SuperNode
    has several). The signal is armed first, then ``getppid()`` is compared with
    ``parent``: a parent that died before the signal was armed has re-parented the
    child already, which the comparison sees, so no window is left. Elsewhere (no
    ``prctl``) only the comparison is made. ``parent`` 0 checks nothing.
    """
    if parent == 0:
        return True
    prctl(PR_SET_PDEATHSIG, sig)
    return os.getppid() == parent


def _stat(pid: str) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def below(root: int, token: str | None) -> set[int]:
    """Live processes below ``root`` (its descendants) or carrying ``HYFL_REAPER=token``."""
    if not LINUX:
        return set()
    children: dict[int, list[int]] = {}
    marked, mark = set(), f"{MARKER}={token}".encode() if token else None
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == root:
            continue
        info = _stat(entry)
        if info is None or info[0] in "ZX":
            continue
        children.setdefault(info[1], []).append(int(entry))
        if mark is not None:
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        marked.add(int(entry))
            except OSError:
                pass
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found | marked


def _signal(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Reaper:
    """The watchdog's state: its parent, its command, what it has seen."""

    def __init__(self, parent: int, command: list[str]):
        self.parent = parent
        self.command = command
        self.token = f"{os.getpid()}-{time.time_ns()}"
        self.child: subprocess.Popen | None = None
        self.code: int | None = None
        self.stop_requested = False

    # -- signals ------------------------------------------------------------------------
    def _on_stop(self, signum, frame) -> None:
        self.stop_requested = True

    def _on_hangup(self, signum, frame) -> None:
        pass  # the loop checks getppid(): the parent *thread* may have ended, not the process

    def parent_gone(self) -> bool:
        return self.parent != 0 and os.getppid() != self.parent

    # -- the tree -----------------------------------------------------------------------
    def reap(self) -> None:
        """Collect exited children (ours and re-parented orphans); note the command's code."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.child is not None and pid == self.child.pid:
                self.code = os.waitstatus_to_exitcode(status)
                self.child.returncode = self.code

    def tree(self) -> set[int]:
        found = below(os.getpid(), self.token)
        if self.child is not None and self.code is None:
            found.add(self.child.pid)
        found.discard(os.getpid())
        return found

    def kill_tree(self, grace: float, group: bool = False) -> None:
        """SIGTERM (unless ``grace`` is 0), wait up to ``grace`` s, then SIGKILL what is left.

        Without ``/proc`` (``group``): SIGKILL to the reaper's own process group, the
        reaper included, if it leads one.
        """
        if grace > 0:
            _signal(self.tree(), signal.SIGTERM)
            end = time.monotonic() + grace
            while time.monotonic() < end:
                self.reap()
                if not self.tree():
                    break
                time.sleep(0.05)
        for _ in range(50):  # a process may start another one while it is being killed
            self.reap()
            left = self.tree()
            if not left:
                break
            _signal(left, signal.SIGKILL)
            time.sleep(0.02)
        self.reap()
        if group and not LINUX and os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)  # no /proc: the group is all we can name

    # -- the run ------------------------------------------------------------------------
    def run(self) -> int:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        if self.parent != 0:
            signal.signal(signal.SIGHUP, self._on_hangup)
            prctl(PR_SET_PDEATHSIG, signal.SIGHUP)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        if self.parent_gone():  # the parent died before the death signal was armed
            return 1
        env = {**os.environ, MARKER: self.token}
        self.child = subprocess.Popen(
            self.command, env=env,  # in the reaper's process group
            preexec_fn=lambda: prctl(PR_SET_PDEATHSIG, signal.SIGKILL),
        )
        grace = float(os.environ.get("HYFL_REAPER_GRACE", "8"))
        while True:
            self.reap()
            if self.parent_gone():
                self.kill_tree(0.0, group=True)
                return 1
            if self.stop_requested:
                self.kill_tree(grace, group=True)
                return self.code if self.code is not None else 1
            if self.code is not None:
                self.kill_tree(2.0)
                return self.code
            time.sleep(0.1)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: _reaper.py PARENT_PID -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    return Reaper(int(argv[0]), argv[2:]).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
