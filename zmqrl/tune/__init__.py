"""``zmqrl tune``: hyperparameter search with Optuna over real runs (docs/tuning.md).

A search space file (:mod:`zmqrl.tune.space`) names dotted config keys and their distributions and
says what a trial is scored on (:mod:`zmqrl.tune.objective`); each trial is a ``zmqrl launch`` of
its own, followed through its ``metrics.jsonl`` and stopped with SIGTERM when the pruner gives up
on it (:mod:`zmqrl.tune.trial`); :mod:`zmqrl.tune.study` keeps the study in SQLite or any Optuna
storage URL and resumes it without losing or double-counting a trial; :mod:`zmqrl.tune.report`
writes the results table and the best config.

Optuna is imported only by the modules that need it (study, report), and only when ``zmqrl tune``
runs: the rest of zmqrl never depends on the ``tune`` extra.
"""

# The hint printed (exit 2) when the tune extra is missing.
INSTALL_HINT = "zmqrl tune needs optuna: pip install 'zmqrl[tune]'"
# The hint when a --storage URL's database driver is missing (PostgreSQL's is the one we test).
POSTGRES_HINT = "for PostgreSQL: pip install 'zmqrl[tune-postgres]'"
