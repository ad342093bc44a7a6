"""``hyfl deploy predict`` in this process: the parties of a party spec, each with only its
own file, node config and state, scoring new rows over the deployment's messages
(:mod:`hyfl.deploy.scoring`) through the real codec and
:func:`hyfl.deploy.party.handle_message` -- what Flower's per-message ClientApp runs for
each message; only the network is left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hyfl.errors import fail

__all__ = ["InProcessTransport", "predict_local"]


class InProcessTransport:
    """The parties in this process, each seeing only its own node config and state: every
    message goes through the real codec and :func:`hyfl.deploy.party.handle_message`
    (what Flower's per-message ClientApp runs), no network."""

    def __init__(self, nodes, run_config, cipher=None):
        self.nodes, self.run_config, self.cipher = list(nodes), dict(run_config), cipher
        self.states: dict[int, Any] = dict.fromkeys(range(len(self.nodes)))

    def _deliver(self, k: int, kind: str, payload: dict) -> dict:
        from hyfl.deploy.codec import decode, encode
        from hyfl.deploy.party import handle_message

        reply, self.states[k] = handle_message(kind, encode(payload), self.states[k],
                                               self.nodes[k], self.run_config)
        return decode(*reply, self.cipher)

    def connect(self, n_parties: int, timeout: float, hello: dict) -> dict[int, dict]:
        return {k: self._deliver(k, "hello", hello) for k in range(n_parties)}

    def exchange(self, messages: dict, timeout: float) -> tuple[dict, set]:
        return {k: self._deliver(k, kind, payload) for k, (kind, payload) in messages.items()}, \
            set()


def predict_local(model_path, data: str, out, *, asker: int = 0, cipher: str = "ckks",
                  keys_dir=None, reply_timeout: float = 120.0, insecure_test_keys: bool = False,
                  flower: bool = False, timeout: float | None = None, log=None) -> dict:
    """``hyfl deploy predict``: every party of the spec ``data`` with its own file, scoring
    the rows of ``asker``: in this process (:class:`InProcessTransport`: each party sees
    only its node config and state, every message goes through the real codec), or with
    ``flower`` over Flower on loopback as ``hyfl deploy local`` runs a job (a SuperLink,
    one SuperNode process per party, the ServerApp with run config ``model``;
    ``OUT/server/deploy.json`` records the job, ``OUT/flower`` holds Flower's files and
    logs).

    With a ``cipher`` other than none (default ckks, as ``hyfl deploy local``),
    ``keys_dir`` holds the key pair of ``hyfl deploy keys`` (``private-key.json``,
    ``public-key.json``; default ``OUT/keys``, generated when absent): the parties'
    shared secret then tags every relayed hello and re-blinding (the authenticated
    alignment). With cipher none nothing authenticates the alignment, so an active
    server can read every party's part (docs/privacy.md): only for tests and trials. The asker
    writes ``OUT/party-<asker>/predictions.csv``; returns :func:`score_deployed`'s record
    with ``predictions`` (that path).
    """
    from hyfl.deploy.config import DeployConfig, run_config_for
    from hyfl.deploy.keys import server_cipher
    from hyfl.deploy.local import party_file_nodes
    from hyfl.deploy.scoring import score_deployed
    from hyfl.model_file import load_model

    model = load_model(model_path)
    if model.loss not in ("hinge", "logistic", "squared", "smoothed_hinge"):
        raise fail(f"model {model_path}", f"has loss {model.loss!r}, which a deployment does "
                   "not run", "Score it with hyfl predict.")
    nodes, run_extra = party_file_nodes(data)
    private = public = None
    out = Path(out).resolve()
    if cipher == "none":
        (log or (lambda line: None))(
            "warning: --cipher none: the alignment is not authenticated, so an active server "
            "could read every party's part of the scores (tests and trials only)")
    elif keys_dir is None:  # as hyfl deploy local: OUT/keys, generated once, then reused
        from hyfl._private_files import private_folder
        from hyfl.deploy.local import local_keys

        private_folder(out)
        private, public, _ = local_keys(out, None, 2048, insecure_test_keys,
                                         log or (lambda line: None), cipher=cipher)
    else:
        private, public = Path(keys_dir) / "private-key.json", Path(keys_dir) / "public-key.json"
        for path in (private, public):
            if not path.is_file():
                raise fail(f"key file {path}", "does not exist", "Pass --keys with the folder "
                           "hyfl deploy keys wrote.")
    run = run_config_for(parties=len(nodes), loss=model.loss, cipher=cipher,
                         public_key=str(public or ""), reply_timeout=reply_timeout,
                         insecure_test_keys=insecure_test_keys, **run_extra)
    policy = ({"cipher": "none"} if cipher == "none" else
              {"cipher": cipher, "key": str(private), "insecure-test-keys": insecure_test_keys})
    nodes = [{**node, **policy, "party": k, "out": str(out / f"party-{k}")}
             for k, node in enumerate(nodes)]
    if flower:
        return _over_flower(Path(model_path).resolve(), nodes, run, out, asker, timeout, log)
    config = DeployConfig.from_run_config(run)
    server = server_cipher(cipher, public, **config.cipher_options(),
                           insecure_test_keys=insecure_test_keys)
    record = score_deployed(model, config, InProcessTransport(nodes, run, server), asker=asker,
                            log=log)
    return {**record, "predictions": str(out / f"party-{asker}" / "predictions.csv")}


def _over_flower(model_path: Path, nodes: list[dict], run: dict, out: Path, asker: int,
                 timeout: float | None, log) -> dict:
    """The scoring job over Flower on loopback: :class:`hyfl.deploy.local.LocalDeployment`
    (SuperLink, SuperNodes, their workers), the ServerApp's :func:`hyfl.deploy.scoring.
    run_scoring`; returns its record (``deploy.json``) with ``predictions``."""
    from hyfl._private_files import private_folder
    from hyfl.deploy.local import LocalDeployment

    private_folder(out)
    run = {**run, "model": str(model_path), "asker": asker, "out": str(out / "server")}
    with LocalDeployment(nodes, out / "flower", log=log or (lambda line: None)) as local:
        record = local.run(run, timeout=timeout)
    return {**record, "predictions": str(out / f"party-{asker}" / "predictions.csv")}
