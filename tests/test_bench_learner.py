"""`zmqrl bench`'s learner part: a real trainer, real sender processes, a well-formed result."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from zmqrl.bench import learner
from zmqrl.bench.report import BenchSettings


@pytest.mark.slow
def test_learner_part_compares_flooded_with_idle_training_and_leaves_no_process() -> None:
    settings = BenchSettings(quick=True, repeats=1, seconds=0.2)
    c = learner.compare("uniform", [], settings, settings.repeats, learner.TARGET)
    assert c.group == "learner" and c.unit == "updates/s" and c.reference is not None
    assert c.ours.median > 0 and c.reference.median > 0 and c.target == learner.TARGET
    # The flood really arrived: the ingest thread took transitions in while training ran.
    assert c.extra["ingest_transitions_per_s"] > 0
    assert mp.active_children() == []
