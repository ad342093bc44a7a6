"""Conventions of the ``hyfl`` command: ``--version``, flags over configs, CSV types."""

from typer.testing import CliRunner

import hyfl
from hyfl.cli import app

runner = CliRunner()


def test_version_prints_the_package_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"hyfl {hyfl.__version__}"
