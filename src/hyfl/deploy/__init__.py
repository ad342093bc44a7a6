"""Deployment of HyFDCA on Flower: one party per process or machine.

The same client and server halves as the in-process protocol engine
(:mod:`hyfl.algorithms.hyfdca_parties`), talking over Flower's Message API:

* :mod:`hyfl.deploy.keys` -- Paillier key files (parties: private, server: public);
* :mod:`hyfl.deploy.blocks` -- a party's block of the data (block files, or cut
  from a named dataset);
* :mod:`hyfl.deploy.config` -- the run config (the job) and node config (the party);
* :mod:`hyfl.deploy.codec` -- messages and party state as arrays plus JSON
  (ciphertexts as bytes);
* :mod:`hyfl.deploy.party` -- a party's side, one message at a time;
* :mod:`hyfl.deploy.coordinator` -- the server's side: rounds, absences, results;
* :mod:`hyfl.deploy.app` -- the Flower ServerApp and ClientApp (imports ``flwr``);
* :mod:`hyfl.deploy.flower_app` -- a Flower App project around them (``hyfl deploy
  app``; what ``flwr run`` submits);
* :mod:`hyfl.deploy.local` -- a whole deployment on loopback (SuperLink,
  SuperNodes, ``flwr run``), used by ``hyfl deploy local`` and the tests;
* :mod:`hyfl.deploy.report` -- what a run shows: a line per round, the
  summary table, and whether it learned (exit code 3 if not);
* :mod:`hyfl.deploy._reaper` -- the watchdog each Flower program runs under,
  so that it and what it starts die with the deployment (stdlib only);
* :mod:`hyfl.deploy.cli` -- the ``hyfl deploy`` commands.

Only :mod:`hyfl.deploy.app` imports Flower (install ``hyfl[flower]``); the
rest, like the core library, does not.
"""
