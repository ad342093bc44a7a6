"""What the benchmarks record about the machine they ran on."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` says (or "?")."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def git(*args) -> str:
    """Output of ``git -C REPO args`` (e.g. the commit a run measured), or "?"."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    except OSError:
        return "?"
    return done.stdout.strip() if done.returncode == 0 else "?"
