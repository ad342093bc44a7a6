"""Count the HTTP requests each Flower server process serves, by path (a measuring aid).

Put this folder on ``PYTHONPATH`` of a deployment (an absolute path: Flower's
processes run in the deployment's own folders) and set ``HYFL_REQUEST_COUNTS`` to
a folder: every process that serves HTTP through Starlette (the SuperLink, each
SuperNode's Runtime API) writes ``counts-PID.txt`` there every two seconds, its
command line first, then one ``COUNT PATH`` line per path, most frequent first::

    mkdir -p /tmp/counts
    PYTHONPATH=$PWD/benchmarks/flower_requests HYFL_REQUEST_COUNTS=/tmp/counts \\
        hyfl deploy local --data ijcnn1 --partition grid:2x2 --participation full \\
        --cipher ckks --iterations 8 --out /tmp/counted

Divide by the run's messages (the sum of ``messages`` over ``deploy.json``'s
``rounds``) for requests per message
(docs/deployment.md, "Exchanges per round"). Nothing of hyfl imports it.
"""

import collections
import os
import sys
import threading
import time

FOLDER = os.environ.get("HYFL_REQUEST_COUNTS", "")


def _count_requests(folder: str) -> None:
    try:
        import starlette.applications as applications
    except ImportError:  # not a process that serves HTTP
        return
    counts: collections.Counter = collections.Counter()
    serve = applications.Starlette.__call__

    async def counted(self, scope, receive, send):
        if scope.get("type") == "http":
            counts[scope.get("path")] += 1
        return await serve(self, scope, receive, send)

    def write_every_two_seconds() -> None:
        path = os.path.join(folder, f"counts-{os.getpid()}.txt")
        while True:
            time.sleep(2.0)
            if counts:
                lines = [" ".join(sys.argv)[:160]] + [f"{n} {p}" for p, n in
                                                        counts.most_common()]
                with open(path, "w") as f:
                    f.write("\n".join(lines) + "\n")

    applications.Starlette.__call__ = counted
    threading.Thread(target=write_every_two_seconds, daemon=True).start()


if FOLDER:
    _count_requests(FOLDER)
