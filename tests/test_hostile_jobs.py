"""A hostile job against a party: its bundle's code never runs, it cannot pick the party's data.

Issue 26, points 1 and 4. Each test performs the attack and shows that it fails.
"""

from __future__ import annotations

import io
import sys
import zipfile
from types import SimpleNamespace

import pytest

from hyfl.deploy.flower_app import BUNDLE_MAX_BYTES, check_bundle, write_flower_app
from hyfl.errors import HyflError

flwr = pytest.importorskip("flwr")

MARKER = "hyfl-test-job-code-ran"


def _bundle(folder) -> bytes:
    from flwr.cli.build import build_fab_from_disk

    return build_fab_from_disk(folder)


@pytest.fixture
def app(tmp_path):
    return write_flower_app(tmp_path / "app", {"parties": 2, "cipher": "none"})


def _payload(tmp_path) -> str:
    """A line of job code that leaves a trace if it ever runs."""
    return f"\nopen({str(tmp_path / MARKER)!r}, 'w').write('ran')\n"


def _worker_check(content: bytes):
    from hyfl.deploy.worker import Worker

    worker = Worker("127.0.0.1:1")  # never connects: only its bundle check is used
    run = SimpleNamespace(fab_id="hyfl/hyfl-app", fab_version="1")
    worker._check_app(run, SimpleNamespace(content=content))
    return worker


def test_hyfls_own_bundle_is_served_with_the_installed_client_app(app):
    from hyfl.deploy.app import client_app

    content = _bundle(app)
    check_bundle(content)
    worker = _worker_check(content)
    assert list(worker.apps.values()) == [client_app]


def test_a_bundle_whose_client_app_adds_a_line_is_refused_before_anything_runs(app, tmp_path):
    """The issue's reproducer: re-export hyfl's app and add a line; the line never runs."""
    from flwr.clientapp.client_app import LoadClientAppError

    module = app / "hyfl_app" / "client_app.py"
    module.write_text(module.read_text() + _payload(tmp_path))
    loaded = set(sys.modules)
    with pytest.raises(LoadClientAppError, match="hyfl_app/client_app.py that is not hyfl's"):
        _worker_check(_bundle(app))
    assert not (tmp_path / MARKER).exists()
    assert not {m for m in set(sys.modules) - loaded if m.startswith("hyfl_app")}


@pytest.mark.parametrize("change", ["foreign components", "extra module", "server module",
                                    "package init"])
def test_other_code_in_a_bundle_is_refused_unread(app, tmp_path, change):
    project = app / "pyproject.toml"
    if change == "foreign components":  # a foreign app with top-level code of its own
        (app / "evil").mkdir()
        (app / "evil" / "__init__.py").write_text("")
        (app / "evil" / "client.py").write_text(_payload(tmp_path) + "app = None\n")
        (app / "evil" / "server.py").write_text("app = None\n")
        project.write_text(project.read_text()
                           .replace('"hyfl_app.client_app:app"', '"evil.client:app"')
                           .replace('"hyfl_app.server_app:app"', '"evil.server:app"'))
        expected = "evil/__init__.py"
    elif change == "extra module":
        (app / "hyfl_app" / "helpers.py").write_text(_payload(tmp_path))
        expected = "hyfl_app/helpers.py"
    elif change == "server module":
        module = app / "hyfl_app" / "server_app.py"
        module.write_text(module.read_text() + _payload(tmp_path))
        expected = "server_app.py that is not hyfl's"
    else:
        (app / "hyfl_app" / "__init__.py").write_text(_payload(tmp_path))
        expected = "__init__.py that is not hyfl's"
    with pytest.raises(HyflError, match=expected):
        check_bundle(_bundle(app))
    assert not (tmp_path / MARKER).exists()


def test_components_pointing_elsewhere_are_refused(app):
    """hyfl's modules intact, but pyproject.toml names another object to load."""
    project = app / "pyproject.toml"
    project.write_text(project.read_text().replace('"hyfl_app.client_app:app"',
                                                   '"hyfl_app.client_app:other"'))
    with pytest.raises(HyflError, match="names the components"):
        check_bundle(_bundle(app))


def _zip(files: dict[str, bytes], declared: dict[str, int] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    content = buffer.getvalue()
    for name, size in (declared or {}).items():  # lie about a member's unpacked size
        with zipfile.ZipFile(io.BytesIO(content)) as archive:
            info = archive.getinfo(name)
        old = info.file_size.to_bytes(4, "little")
        content = content.replace(old, size.to_bytes(4, "little"))
    return content


def test_bundles_that_are_not_small_zip_archives_are_refused(app):
    genuine = _bundle(app)
    with zipfile.ZipFile(io.BytesIO(genuine)) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    bomb = {**files, "README.md": b"\0" * (BUNDLE_MAX_BYTES + 1)}  # packs to ~1 kB
    for content, expected in [
        (b"not a zip", "not a readable zip archive"),
        (genuine[: len(genuine) // 2], "not a readable zip archive"),
        (_zip(bomb), "unpacks to more than"),
        (b"\0" * (BUNDLE_MAX_BYTES + 1), "is not a bundle of at most"),
        (_zip({**files, "hyfl_app/client_app.py": files["hyfl_app/client_app.py"] + b"#"}),
         "client_app.py that is not hyfl's"),
        (_zip({k: v for k, v in files.items() if k != "hyfl_app/client_app.py"}),
         "client_app.py that is not hyfl's \\(missing\\)"),
        (_zip({**files, "pyproject.toml": b"[tool.flwr"}), "no readable pyproject.toml"),
    ]:
        assert len(content) < 2 * BUNDLE_MAX_BYTES
        with pytest.raises(HyflError, match=expected):
            check_bundle(content)


# ----------------------------------------------------------------------------- point 4

SECRET = "DB_PASSWORD=hunter2"


@pytest.fixture
def secret_file(tmp_path):
    """A file of the party's machine that is not data: what a job would like to read."""
    path = tmp_path / "secrets.env"
    path.write_text(f"{SECRET}\n")
    return path


def _hello(kind="hello") -> tuple:
    from hyfl.deploy.codec import encode

    return encode({"cipher": "none", "fingerprint": ""} if kind == "hello" else {})


def _run(**more) -> dict:
    from hyfl.deploy.config import run_config_for

    return run_config_for(parties=2, cipher="none", partition="horizontal:2", **more)


def test_a_job_cannot_name_the_file_a_party_reads(secret_file):
    """The job names a file for a party whose node config names none: refused, unread."""
    from hyfl.deploy.party import handle_message, server_text

    for key, value in [("data", str(secret_file)), ("data-dir", str(secret_file.parent))]:
        config = {**_run(), key: value}
        with pytest.raises(HyflError, match=f"run config key '{key}' is not the job's") as err:
            handle_message("hello", _hello(), None, {"party": 0, "cipher": "none"}, config)
        assert SECRET not in server_text(err.value, "hello")
    # Without a name from the job, a node config without data reads nothing.
    with pytest.raises(HyflError, match="node config data is not set"):
        handle_message("hello", _hello(), None, {"party": 0, "cipher": "none"}, _run())


def test_the_node_configs_data_dir_is_where_a_named_dataset_is_read(tmp_path, monkeypatch):
    import hyfl.data
    from hyfl.deploy.codec import decode
    from hyfl.deploy.party import handle_message

    asked = []
    real = hyfl.data.load_data

    def spy(name, data_dir=None, *args, **kwargs):
        asked.append((name, data_dir))
        return real(name, data_dir, *args, **kwargs)

    monkeypatch.setattr(hyfl.data, "load_data", spy)
    node = {"party": 1, "cipher": "none", "data": "breast_cancer", "data-dir": str(tmp_path)}
    reply, _ = handle_message("hello", _hello(), None, node, _run())
    assert asked == [("breast_cancer", str(tmp_path))]
    hello = decode(*reply)
    assert hello["n_samples"] == 569 and 280 <= len(hello["samples"]) <= 290  # horizontal:2


def test_what_the_server_hears_of_a_partys_failure_quotes_nothing_of_its_files(secret_file,
                                                                               monkeypatch):
    """The loader's error quotes the file's first bad token; the server gets a generic text."""
    from flwr.app import Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from hyfl.deploy.app import _handler, pack
    from hyfl.deploy.party import handle_message

    node = {"party": 0, "cipher": "none", "data": str(secret_file)}
    with pytest.raises(HyflError, match="hunter2"):  # the party's own log has the details
        handle_message("hello", _hello(), None, node, _run())
    for name in ("_task_id", "_run_id", "_node_id"):  # what a ClientApp process has
        monkeypatch.setattr(TaskIdentity, name, 1)
    message = Message(pack(*_hello()), dst_node_id=1, message_type="query.hello")
    context = Context(run_id=1, node_id=1, node_config=node, state=RecordDict(),
                      run_config=_run())
    with pytest.raises(HyflError) as err:  # what Flower sends back is str(err)
        _handler("hello")(message, context)  # the ClientApp's handler of query.hello
    assert SECRET not in str(err.value) and "hunter2" not in str(err.value)
    assert "the party could not handle the server's 'hello' message" in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_a_refusal_of_the_job_still_reaches_the_server_word_for_word(tmp_path):
    """The job's own mistakes are the submitter's to fix: those texts go back."""
    from hyfl.deploy.keys import generate_keys
    from hyfl.deploy.party import handle_message, server_text

    private, _ = generate_keys(tmp_path / "keys", 256, insecure_test_keys=True)
    node = {"party": 0, "key": str(private), "insecure-test-keys": True, "data": "x.npz"}
    with pytest.raises(HyflError) as err:
        handle_message("hello", _hello(), None, node, _run())
    assert server_text(err.value, "hello") == str(err.value)
    assert "refuses the job: the job asks for cipher 'none'" in str(err.value)
    with pytest.raises(HyflError) as err:
        handle_message("hello", _hello(), None, node, {**_run(), "iterations": 0})
    assert "run config iterations must be >= 1" in server_text(err.value, "hello")
