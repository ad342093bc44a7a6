"""A Flower App project for deployed HyFDCA: what ``flwr run`` submits.

:func:`write_flower_app` writes the project a Flower user expects::

    OUT/
        pyproject.toml          [project], [tool.flwr.app], its components and run config
        README.md               how to run it: connection, SuperNodes, keys, flwr run
        hyfl_app/__init__.py
        hyfl_app/server_app.py  app = hyfl.deploy.app.server_app
        hyfl_app/client_app.py  app = hyfl.deploy.app.client_app

The components live inside the project (``hyfl_app.server_app:app``), as in
any Flower App, but only re-export hyfl's (:data:`APP_COMPONENTS`): the HyFDCA
server and party stay in the installed ``hyfl`` package, so the app needs
``hyfl[flower]`` on the SuperLink's and every SuperNode's machine and nothing
else. ``[tool.flwr.app.config]`` holds every run config key
(:data:`~hyfl.deploy.config.RUN_DEFAULTS`) with this app's defaults, which
``flwr run --run-config`` overrides per run.

``hyfl deploy app`` writes such a project for users; ``hyfl deploy local`` and
``hyfl deploy run`` write the same one into their working folders
(:func:`hyfl.deploy.local.write_app`). Nothing here imports Flower.

Flower 1.41 keeps SuperLink connections out of the project: ``flwr run APP
CONNECTION`` looks ``CONNECTION`` up in ``$FLWR_HOME/config.toml`` (default
``~/.flwr/config.toml``), and moves a legacy ``[tool.flwr.federations]``
table of ``pyproject.toml`` there. The project therefore only shows an
example connection, in comments and in its README.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyfl._io import check_results_folder, write_text
from hyfl.errors import fail

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

__all__ = [
    "APP_COMPONENTS",
    "APP_FILES",
    "APP_NAME",
    "APP_PACKAGE",
    "APP_PUBLISHER",
    "BUNDLE_MAX_BYTES",
    "FLOWER_VERSION",
    "check_app_config",
    "check_bundle",
    "hyfl_version",
    "toml_value",
    "write_flower_app",
]

#: hyfl's ServerApp and ClientApp, which the project's components re-export.
APP_COMPONENTS = {"serverapp": "hyfl.deploy.app:server_app",
                  "clientapp": "hyfl.deploy.app:client_app"}
#: The project's package (its components are ``hyfl_app.server_app:app`` and
#: ``hyfl_app.client_app:app``).
APP_PACKAGE = "hyfl_app"
#: The project's components, as its pyproject.toml names them.
_PROJECT_COMPONENTS = {"serverapp": f"{APP_PACKAGE}.server_app:app",
                       "clientapp": f"{APP_PACKAGE}.client_app:app"}
APP_NAME = "hyfl-app"
APP_PUBLISHER = "hyfl"
#: The Flower version hyfl[flower] pins (pyproject.toml) and the project requires.
FLOWER_VERSION = "1.41.0"
#: Files of the project; ``--overwrite`` replaces these, nothing else.
APP_FILES = ("pyproject.toml", "README.md", f"{APP_PACKAGE}/__init__.py",
             f"{APP_PACKAGE}/server_app.py", f"{APP_PACKAGE}/client_app.py")
#: Largest app bundle (FAB) a party's worker looks into, packed or unpacked; hyfl's own
#: is a few kilobytes.
BUNDLE_MAX_BYTES = 1 << 20
#: The manifest Flower adds to every bundle (``flwr build``).
_MANIFEST = ".info/CONTENT"
# Names used in the README's examples.
_EXAMPLE_CONNECTION = "my-superlink"
_EXAMPLE_ADDRESS = "link.example.org:8000"


def toml_value(value: Any) -> str:
    """A run or node config value as TOML (booleans, numbers, basic strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


def hyfl_version() -> str:
    """The installed hyfl's version (what the project's dependency pins)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hyfl")
    except PackageNotFoundError:  # run from a source tree that is not installed
        from hyfl import __version__

        return __version__


def check_app_config(config: Mapping[str, Any]):
    """Validate an app's run config defaults as far as they can be known.

    The number of parties and the public key may be left to ``flwr run
    --run-config`` (the key lives on the SuperLink's machine): stand-ins fill
    them for the check, everything else must already be valid. A
    ``public-key`` that exists on this machine must be a public key of the
    cipher, and with ``parties`` set the participation spec must fit them.

    Returns
    -------
    DeployConfig
        The validated config (with the stand-ins).

    Raises
    ------
    HyflError
        Naming the run config key and the fix.
    """
    from hyfl.deploy.config import DeployConfig

    known = dict(config)
    if not known.get("parties"):
        known["parties"] = 1
    if known.get("cipher") != "none" and not known.get("public-key"):
        known["public-key"] = "public-key.json"
    deploy = DeployConfig.from_run_config(known)
    public = str(config.get("public-key") or "")
    if public and deploy.cipher != "none" and os.path.isfile(public):
        from hyfl.deploy.keys import server_cipher

        # The same check the ServerApp makes (a private key file is refused).
        server_cipher(deploy.cipher, public, insecure_test_keys=deploy.insecure_test_keys)
    # A trace file may exist only on the SuperLink's machine: checked there.
    if config.get("parties") and not deploy.participation.startswith("trace:"):
        deploy.participation_schedule()
    return deploy


def write_flower_app(out: str | os.PathLike, run_config: Mapping[str, Any] | None = None, *,
                     overwrite: bool = False) -> Path:
    """Write a Flower App project running HyFDCA with hyfl.

    Parameters
    ----------
    out : path-like
        The project folder. An existing, non-empty folder is refused unless
        ``overwrite``.
    run_config : mapping, optional
        Run config defaults of this app (keys with ``-`` or ``_``; ``None``
        values stay at :data:`~hyfl.deploy.config.RUN_DEFAULTS`). Validated
        with :func:`check_app_config`.
    overwrite : bool, default False
        Write into a non-empty ``out``: the project's files
        (:data:`APP_FILES`) are replaced, other files stay (and are bundled
        by ``flwr run`` like any app file).

    Returns
    -------
    Path
        ``out``.
    """
    from hyfl.deploy.config import run_config_for

    out = Path(out)
    check_results_folder(out, overwrite=overwrite, resumable=False, what="app folder",
                         other="folder", kept="its generated files are replaced, other "
                         "files stay")
    if out.exists() and not out.is_dir():
        raise fail(f"app folder {out}", "is a file", "Pass a folder.")
    config = run_config_for(**dict(run_config or {}))
    check_app_config(config)
    version = hyfl_version()
    texts = {"pyproject.toml": _pyproject(config, version),
             "README.md": _readme(config, version), **_package_texts()}
    for name, text in texts.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text)
    return out


def check_bundle(content: bytes, what: str = "the app bundle") -> None:
    """Check that a Flower app bundle (FAB) is hyfl's app, without running any of it.

    A party's worker holds the private key: it never installs or imports a
    job's bundle, it serves hyfl's installed ClientApp. This check makes sure
    the job asked for that app, reading the bundle as data only (a zip
    archive and a TOML file): its files are the ones :func:`write_flower_app`
    writes (plus Flower's manifest), its Python modules are byte for byte
    hyfl's, and ``pyproject.toml`` names hyfl's components.

    Parameters
    ----------
    content : bytes
        The bundle, as the SuperNode received it.
    what : str, default "the app bundle"
        How errors name it (e.g. ``"app hyfl/hyfl-app 0.4.0"``).

    Raises
    ------
    HyflError
        Naming the file that differs, and the fix.
    """
    import io
    import zipfile

    fix = ("A party's worker serves hyfl's own app only: submit the project `hyfl deploy app` "
           "writes, unchanged (or run other apps on a SuperNode without the worker)")
    if not isinstance(content, bytes) or len(content) > BUNDLE_MAX_BYTES:
        raise fail(what, f"is not a bundle of at most {BUNDLE_MAX_BYTES} bytes", fix)
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as bundle:
            members = bundle.infolist()
            allowed = {*APP_FILES, _MANIFEST}
            stray = sorted({m.filename for m in members} - allowed)
            if stray or len(members) > len(allowed):
                raise fail(what, f"holds {stray[0] if stray else 'a file twice'!r}, which is "
                           "not part of hyfl's app", fix)
            # Sizes are checked before anything is unpacked (a zip bomb stops here).
            if sum(m.file_size for m in members) > BUNDLE_MAX_BYTES:
                raise fail(what, f"unpacks to more than {BUNDLE_MAX_BYTES} bytes", fix)
            files = {m.filename: bundle.read(m) for m in members}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, RuntimeError,
            NotImplementedError) as err:  # not a zip, encrypted, or an unknown compression
        raise fail(what, f"is not a readable zip archive ({type(err).__name__})", fix) from None
    for name, text in _package_texts().items():
        if files.get(name) != text.encode():
            raise fail(what, f"has a {name} that is not hyfl's "
                       f"({'missing' if name not in files else 'changed'})", fix)
    try:
        project = tomllib.loads(files["pyproject.toml"].decode())
        components = project["tool"]["flwr"]["app"]["components"]
    except (KeyError, TypeError, ValueError):  # missing, not UTF-8, not TOML, no table
        raise fail(what, "has no readable pyproject.toml naming its components", fix) from None
    if components != _PROJECT_COMPONENTS:
        raise fail(what, f"names the components {components!r}, not hyfl's "
                   f"{_PROJECT_COMPONENTS!r}", fix)


# ----------------------------------------------------------------------------- the files


def _package_texts() -> dict[str, str]:
    """The project's Python modules (the same bytes in every hyfl app of this version)."""
    return {
        f"{APP_PACKAGE}/__init__.py": '"""HyFDCA with hyfl on Flower: the ServerApp and the '
                                      'ClientApp of this Flower App (see README.md)."""\n',
        f"{APP_PACKAGE}/server_app.py": _component("serverapp"),
        f"{APP_PACKAGE}/client_app.py": _component("clientapp"),
    }


_COMPONENT_DOCS = {
    "serverapp": (
        "The ServerApp of this Flower App: hyfl's HyFDCA server.\n\n"
        "It runs on the SuperLink's machine, holds only the public key and reads the run\n"
        "config ([tool.flwr.app.config] in pyproject.toml, overridden by\n"
        "`flwr run ... --run-config`)."
    ),
    "clientapp": (
        "The ClientApp of this Flower App: hyfl's HyFDCA party.\n\n"
        "It runs on each party's SuperNode; the SuperNode's node config says which party it\n"
        "is and where its private key and data are (see README.md). The party's security\n"
        "policy (its cipher, its key) comes from there, never from the run config."
    ),
}


def _component(kind: str) -> str:
    """A component module: re-exports hyfl's app object as ``app``."""
    module, attribute = APP_COMPONENTS[kind].split(":")
    return (
        f'"""{_COMPONENT_DOCS[kind]}\n"""\n\n'
        f"from {module} import {attribute}\n\n"
        "# pyproject.toml names this module's `app`. Flower checks components without\n"
        "# importing them (it looks for an assignment), so bind the name here rather than\n"
        "# importing it under that name.\n"
        f"app = {attribute}\n"
    )


def _pyproject(config: Mapping[str, Any], version: str) -> str:
    from hyfl.deploy.config import RUN_HELP

    width = max(len(f"{k} = {toml_value(v)}") for k, v in config.items())
    lines = [
        f"# A Flower App running HyFDCA with hyfl {version} (written by `hyfl deploy app`).",
        '# Run it: flwr run . CONNECTION --stream --run-config "key=value ..."; see README.md.',
        "#",
        "# No [build-system]: nothing here is built or installed. The ServerApp and the",
        f"# ClientApp are hyfl's ({APP_PACKAGE}/ re-exports them); install hyfl[flower] on the",
        "# SuperLink's and every SuperNode's machine, and start the SuperLink with",
        "# --disable-runtime-dependency-installation (hyfl deploy superlink does).",
        "",
        "[project]",
        f"name = {toml_value(APP_NAME)}",
        f"version = {toml_value(version)}",
        'description = "HyFDCA (hybrid federated dual coordinate ascent) with hyfl on Flower"',
        'license = "MIT"',
        "dependencies = [",
        f"    {toml_value(f'hyfl[flower]=={version}')},",
        f"    {toml_value(f'flwr=={FLOWER_VERSION}')},",
        "]",
        "",
        "[tool.flwr.app]",
        f"publisher = {toml_value(APP_PUBLISHER)}",
        "",
        "[tool.flwr.app.components]",
        *(f'{kind} = "{component}"' for kind, component in _PROJECT_COMPONENTS.items()),
        "",
        "# The run config: every key hyfl's ServerApp reads, with this app's defaults.",
        '# Override any of them per run: flwr run ... --run-config "iterations=20 seed=1"',
        "# (Flower refuses keys not listed here). Paths are the SuperLink machine's.",
        "[tool.flwr.app.config]",
        *(f"{f'{k} = {toml_value(v)}':<{width}}  # {RUN_HELP[k]}" for k, v in config.items()),
        "",
        "# SuperLink connections are not configured in this file: Flower 1.41 reads them",
        "# from $FLWR_HOME/config.toml (default ~/.flwr/config.toml), for example",
        "#",
        f"#   [superlink.{_EXAMPLE_CONNECTION}]",
        f'#   address = "{_EXAMPLE_ADDRESS}"',
        '#   root-certificates = "/absolute/path/to/ca.crt"',
        "#",
        "# (`flwr run` would move a legacy [tool.flwr.federations] table from here to there).",
        "",
    ]
    return "\n".join(lines)


def _missing(config: Mapping[str, Any]) -> list[str]:
    """Run config keys without a usable default, to pass at ``flwr run``."""
    missing = []
    if not config["parties"]:
        missing.append("parties=2")
    if config["cipher"] != "none" and not config["public-key"]:
        missing.append("public-key='/srv/hyfl/public-key.json'")
    if not config["out"]:
        missing.append("out='/srv/hyfl/results'")
    return missing


def _readme(config: Mapping[str, Any], version: str) -> str:
    from hyfl.deploy.config import NODE_HELP, RUN_HELP

    missing = _missing(config)
    overrides = " ".join(missing) if missing else "iterations=20"
    run_rows = "\n".join(f"| `{k}` | `{toml_value(v)}` | {RUN_HELP[k]} |"
                         for k, v in config.items())
    node_rows = "\n".join(f"| `{k}` | {help_} |" for k, help_ in NODE_HELP.items())
    cipher = config["cipher"]
    node_example = ("party=0 cipher='none'" if cipher == "none" else
                    "party=0 key='/home/party0/keys/private-key.json'"
                    + ("" if cipher == "paillier" else f" cipher='{cipher}'"))
    names = ", ".join(f"`{m.split('=')[0]}`" for m in missing)
    still = (f"This app's defaults leave {names} to be set at `flwr run`." if missing else
             "This app's defaults are complete; `--run-config` may still override any key.")
    return f"""# {APP_NAME}: HyFDCA with hyfl on Flower

A [Flower](https://flower.ai) App (Flower {FLOWER_VERSION}) that trains a linear model with
HyFDCA over parties holding blocks of the data (hybrid federated learning), with
encrypted aggregation. Written by `hyfl deploy app` (hyfl {version}).

| file | content |
|---|---|
| `pyproject.toml` | the project, its components, the run config with this app's defaults |
| `{APP_PACKAGE}/server_app.py` | `app`: hyfl's HyFDCA server (`{APP_COMPONENTS["serverapp"]}`) |
| `{APP_PACKAGE}/client_app.py` | `app`: hyfl's HyFDCA party (`{APP_COMPONENTS["clientapp"]}`) |

The components only re-export hyfl's: install `hyfl[flower]=={version}` on the
SuperLink's machine and on every party's machine. Start the SuperLink with
`--disable-runtime-dependency-installation` (`hyfl deploy superlink` does): the
apps use the installed hyfl, and hyfl is not fetched from a package index.

## 1. Keys

```bash
hyfl deploy keys --out keys      # private-key.json (every party), public-key.json (the server)
```

## 2. The SuperLink (the coordinator)

```bash
flower-superlink --ssl-ca-certfile ca.crt --ssl-certfile server.pem --ssl-keyfile server.key \\
    --disable-runtime-dependency-installation
```

or `hyfl deploy superlink --ssl-ca-certfile ca.crt --ssl-certfile server.pem --ssl-keyfile
server.key`. One port (8000) serves the SuperNodes, `flwr` and the ServerApp.

## 3. One SuperNode per party

Each party's SuperNode says who the party is in its **node config**; the job
(run config) cannot change it:

```bash
flower-supernode --superlink {_EXAMPLE_ADDRESS} --root-certificates ca.crt \\
    --node-config "{node_example} data='/home/party0/party-0.npz'"
```

or `hyfl deploy party --party 0 --superlink {_EXAMPLE_ADDRESS} --root-certificates ca.crt
--key keys/private-key.json --data party-0.npz` (it checks the key file first).

| node config key | meaning |
|---|---|
{node_rows}

To admit only known SuperNodes (TLS only): start the SuperLink with
`--enable-supernode-auth` (and `--database FILE`, so that a restart keeps the
registrations), create a key on each party's machine
(`ssh-keygen -t ecdsa -b 384 -N "" -f supernode-key`), start its SuperNode with
`--auth-supernode-private-key supernode-key`, and register the public key:
`flwr supernode register supernode-key.pub {_EXAMPLE_CONNECTION}`. The SuperLink's
Control API (`flwr run`, `flwr supernode register`) authenticates no user in
open-source Flower: let only the parties and yourself reach its port.

## 4. The connection

Flower {FLOWER_VERSION} reads SuperLink connections from `$FLWR_HOME/config.toml`
(default `~/.flwr/config.toml`), not from `pyproject.toml`. Add:

```toml
[superlink.{_EXAMPLE_CONNECTION}]
address = "{_EXAMPLE_ADDRESS}"
root-certificates = "/absolute/path/to/ca.crt"   # the CA of the SuperLink's certificate
```

(`insecure = true` instead of `root-certificates` on loopback only; `flwr config list`
shows the connections.)

## 5. Run

```bash
flwr run . {_EXAMPLE_CONNECTION} --stream --run-config "{overrides}"
```

{still}

Paths (`public-key`, `out`, `data`) are the SuperLink machine's, where the
ServerApp runs. Results: `deploy.json` and `weights.npz` in `out`; each party's final
duals and weights in its node config's `out`.

| run config key | default here | meaning |
|---|---|---|
{run_rows}

More (TLS certificates, SuperNode authentication, absences, costs): hyfl's
`docs/deployment.md`.
"""
