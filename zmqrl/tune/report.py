"""What a study found: a table of the best trials and the parameters' importances (printed and
written to ``results.md`` in the tune dir), and the best trial's config as ``best.yaml``.

``best.yaml`` is the trials' config file with the best trial's values (and the space's ``set``)
written into it, so ``zmqrl launch best.yaml`` runs what that trial ran. The config is edited as
YAML data, not resolved: every setting the original left to its default still is.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from zmqrl.config import load_config
from zmqrl.tune.space import Space
from zmqrl.tune.study import decoded

RESULTS_FILE = "results.md"
BEST_FILE = "best.yaml"
TOP_TRIALS = 10


def summary(study: optuna.Study, space: Space) -> str:
    """Markdown: the counts, the best trials, the importances."""
    trials = study.get_trials(deepcopy=False)
    counts = {state.name.lower(): sum(t.state == state for t in trials) for state in TrialState}
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    reverse = space.objective.direction == "maximize"
    complete.sort(key=lambda t: float(t.value or 0.0), reverse=reverse)
    keys = [p.key for p in space.params]
    lines = [
        f"# Study {study.study_name}: {space.objective.metric} ({space.objective.direction})",
        "",
        ", ".join(f"{n} {state}" for state, n in counts.items() if n),
        "",
        "| trial | " + " | ".join([space.objective.metric, *keys]) + " |",
        "|" + "---|" * (len(keys) + 2),
    ]
    for trial in complete[:TOP_TRIALS]:
        values = decoded(space, trial.params)
        cells = [str(trial.number), _fmt(trial.value), *(_fmt(values.get(k)) for k in keys)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Parameter importances (Optuna's default evaluator, over the complete trials):", ""]
    lines += [f"- {key}: {share:.2f}" for key, share in importances(study).items()] or [
        "- (too few complete trials)"
    ]
    return "\n".join(lines) + "\n"


def importances(study: optuna.Study) -> dict[str, float]:
    """Each parameter's share of the objective's variance, or {} with too few trials to say."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2:
        return {}
    try:
        return dict(optuna.importance.get_param_importances(study))
    except (RuntimeError, ValueError):  # e.g. every complete trial has the same parameters
        return {}


def write_best(study: optuna.Study, space: Space, config: Path, out: Path) -> FrozenTrial | None:
    """Write ``best.yaml`` (None, and nothing written, before the first complete trial)."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        return None
    best = study.best_trial
    tree = yaml.safe_load(config.read_text()) or {}
    values = decoded(space, best.params)
    for key, value in {**space.fixed, **values}.items():
        _set_dotted(tree, key, value)
    run = tree.setdefault("run", {})
    run["name"] = f"{study.study_name}-best"
    header = [
        f"# Tuned by zmqrl tune: study {study.study_name}, trial {best.number} of {len(study.trials)},",
        f"# {space.objective.metric} {_fmt(best.value)} ({space.objective.direction}), from {config}.",
        "# Tuned: " + ", ".join(f"{k}={_fmt(v)}" for k, v in values.items()),
    ]
    if space.fixed:
        header.append(
            "# Fixed for tuning (space set:): " + ", ".join(f"{k}={_fmt(v)}" for k, v in space.fixed.items())
        )
    out.write_text("\n".join(header) + "\n" + yaml.dump(tree, Dumper=_ConfigDumper, sort_keys=False))
    load_config(out)  # what was written must launch: a ConfigError here is a bug of this module
    return best


class _ConfigDumper(yaml.SafeDumper):
    """Lists of plain values on one line (``hidden_sizes: [128, 128]``), as the shipped configs
    write them; everything else in block style."""


def _list(dumper: yaml.SafeDumper, items: list[Any]) -> yaml.Node:
    flat = all(not isinstance(item, (list, dict)) for item in items)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=flat)


_ConfigDumper.add_representer(list, _list)


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    *sections, leaf = key.split(".")
    for section in sections:
        tree = tree.setdefault(section, {})
    tree[leaf] = value


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)
