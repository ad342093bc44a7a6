"""``flower-superexec`` whose task processes get their token on no command line (Flower 1.41.0).

``python -m hyfl.deploy.superexec [flower-superexec options]`` is what
``hyfl deploy local``'s SuperLink starts instead of ``flower-superexec``
(:func:`hyfl.deploy.flower_patches.superexec_through_hyfl`): Flower's SuperExec with
one change, :func:`hyfl.deploy.flower_patches.tokens_off_command_lines` -- each
ServerApp reads its task token from ``--token-file /dev/fd/N``, an in-memory file
passed as a descriptor, where Flower puts ``--token TOKEN`` on the command line that
every local user can read in ``/proc/PID/cmdline``.

With another Flower version the SuperExec is not started (exit with a message): a
token on the command line is not an acceptable fallback.
"""

from __future__ import annotations

import sys

from hyfl.deploy.flower_patches import PATCHED_VERSION, tokens_off_command_lines


def main() -> None:
    if not tokens_off_command_lines():
        sys.exit(f"hyfl: the SuperExec that keeps task tokens off command lines needs Flower "
                 f"{PATCHED_VERSION} on Linux; install flwr=={PATCHED_VERSION}")
    from flwr.supercore.cli.flower_superexec import flower_superexec

    sys.argv = ["flower-superexec", *sys.argv[1:]]
    flower_superexec()


if __name__ == "__main__":
    main()
