"""The no-progress warning (issue 28, item 4): a run that trains at full speed while its
evaluations stay flat says so, with what to try, in the dashboard, the progress lines, `zmqrl
status` and the final summary. The rule is driven with a made-up clock (no sleeps); the pointer
reads a zoo directory made in tmp_path; the views are fed snapshots built from hand-made
heartbeats, as tests/test_dashboard_view.py does."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
import zmq

from tests.test_dashboard_view import beat, builder, config, line_of, slot, text_of
from tests.test_status import Served, status_cmd
from zmqrl.config import Config
from zmqrl.supervisor.progress_watch import (
    RESULTS_POINTER,
    NoProgressWarning,
    ProgressWatch,
    Stall,
    latest_logged,
    stall_message,
    zoo_config,
    zoo_pointer,
)
from zmqrl.supervisor.render import plain_line
from zmqrl.supervisor.snapshot import RunSnapshot
from zmqrl.supervisor.summary import Reporter, Slot

MCC = "MountainCarContinuous-v0"


def evaluations(
    watch: ProgressWatch, times: range | list[float], best: float, first: int = 1
) -> Stall | None:
    """One evaluation at each time in ``times`` (counted on from ``first``), all with ``best``;
    returns the watch's answer after the last."""
    answer = None
    for i, t in enumerate(times):
        answer = watch.observe(float(t), best, first + i)
    return answer


# ------------------------------------------------------------------ the rule


def test_flat_evaluations_for_the_whole_stretch_are_a_stall() -> None:
    watch = ProgressWatch(600.0)
    assert evaluations(watch, range(0, 600, 10), best=-0.03) is None, "599 s: not yet"
    stall = watch.observe(600.0, -0.03, 60)
    assert stall == Stall(since=0.0, seconds=600.0, best=-0.03, evaluations=59, target_met_first=False)
    assert watch.observe(900.0, -0.03, 60) is not None, "still stalled between evaluations"


def test_a_new_best_clears_the_stall_but_noise_within_the_margin_does_not() -> None:
    watch = ProgressWatch(600.0, target=None)
    assert evaluations(watch, range(0, 700, 10), best=100.0) is not None
    # 1% of the return scale (100) is 1: a best of 100.5 is evaluation noise, not learning.
    assert watch.observe(700.0, 100.5, 71) is not None
    assert watch.observe(710.0, 102.0, 72) is None, "a real new best clears it"
    assert evaluations(watch, range(720, 1300, 10), best=102.0, first=73) is None, "a new stretch starts"
    assert watch.observe(1310.0, 102.0, 200) is not None, "600 s after the new best: stalled again"


def test_a_run_that_reached_its_target_is_never_stalled() -> None:
    watch = ProgressWatch(600.0, target=-200.0)
    assert watch.observe(0.0, -1400.0, 1) is None
    assert watch.observe(10.0, -150.0, 2) is None
    assert evaluations(watch, range(20, 5000, 10), best=-150.0, first=3) is None
    assert watch.reached


def test_a_target_met_by_the_first_evaluation_is_another_tasks_and_does_not_silence_the_watch() -> None:
    """Pendulum's config copied to MountainCarContinuous: its -200 is met by a policy that stands
    still, before any learning."""
    watch = ProgressWatch(600.0, target=-200.0)
    stall = evaluations(watch, range(0, 610, 10), best=-0.03)
    assert stall is not None and stall.target_met_first and not watch.reached
    text = stall_message(stall, RESULTS_POINTER, target=-200.0)
    assert "learner.target_return -200 was met by the first evaluation" in text


def test_a_watch_that_joins_late_does_not_take_the_target_for_anothers() -> None:
    """`zmqrl supervise` started after the run: the best it first hears may be a learned one."""
    watch = ProgressWatch(600.0, target=-200.0)
    assert watch.observe(0.0, -150.0, 40) is None and watch.reached


def test_too_few_evaluations_in_the_stretch_are_not_yet_a_stall() -> None:
    watch = ProgressWatch(600.0)
    assert watch.observe(0.0, 5.0, 1) is None
    assert watch.observe(500.0, 5.0, 2) is None
    assert watch.observe(1000.0, 5.0, 3) is None, "two evaluations since the best: too few to judge"
    assert watch.observe(1500.0, 5.0, 4) is not None


def test_no_evaluation_yet_is_no_stall() -> None:
    watch = ProgressWatch(10.0)
    assert all(watch.observe(float(t), None, 0) is None for t in range(0, 100, 5))
    assert watch.observe(100.0, float("nan"), 0) is None


def test_zero_turns_it_off() -> None:
    assert evaluations(ProgressWatch(0.0), range(0, 10_000, 10), best=1.0) is None


def test_a_restarted_evaluator_counting_from_zero_still_counts() -> None:
    watch = ProgressWatch(60.0)
    watch.observe(0.0, 1.0, 5)  # the first heard: its count so far is no evaluation of the stretch
    watch.observe(30.0, 1.0, 6)
    assert watch.observe(70.0, 1.0, 1) is None, "restarted: 6 -> 1 is one more, two in all"
    stall = watch.observe(80.0, 1.0, 2)
    assert stall is not None and stall.evaluations == 3


# ------------------------------------------------------------------ the words


def zoo(tmp_path: Path) -> Path:
    d = tmp_path / "zoo"
    d.mkdir()
    (d / "mountaincar_continuous_sac.yaml").write_text(
        f"run:\n  name: mcc_sac\nenv:\n  id: {MCC}\nagent:\n  kind: sac\n"
    )
    (d / "mountaincar_continuous_td3.yaml").write_text(f"env:\n  id: {MCC}\nagent:\n  kind: td3\n")
    (d / "broken.yaml").write_text("env: [unclosed\n")
    (d / "notes.yaml").write_text("just a string\n")
    return d


def test_the_pointer_names_the_zoo_config_for_the_runs_env(tmp_path: Path) -> None:
    d = zoo(tmp_path)
    assert (
        zoo_pointer(MCC, "sac", zoo_dir=d)
        == f"a tuned config for {MCC}: configs/zoo/mountaincar_continuous_sac.yaml"
    )
    found = zoo_config(MCC, "td3", zoo_dir=d)
    assert found is not None and found.path == "configs/zoo/mountaincar_continuous_td3.yaml"
    other = zoo_config(MCC, "dqn", zoo_dir=d)
    assert other is not None and other.path.endswith("_sac.yaml"), "another agent's: the first"
    assert "this is the tuned config (configs/zoo/mountaincar_continuous_sac.yaml)" in zoo_pointer(
        MCC, "sac", "mcc_sac", zoo_dir=d
    )


def test_without_a_zoo_config_the_pointer_is_the_results_page(tmp_path: Path) -> None:
    assert zoo_pointer("Hopper-v4", "sac", zoo_dir=zoo(tmp_path)) == RESULTS_POINTER
    assert zoo_pointer(MCC, "sac", zoo_dir=tmp_path / "absent") == RESULTS_POINTER
    assert RESULTS_POINTER == "see docs/results.md for tuned configs"


def test_the_message_says_the_eval_fact_a_collapsed_alpha_and_the_pointer() -> None:
    stall = Stall(since=0.0, seconds=725.0, best=-0.0312, evaluations=80, target_met_first=False)
    text = stall_message(stall, "a tuned config for X: configs/zoo/x.yaml", alpha=2e-4)
    assert text == (
        "no progress: no new best evaluation for 12m05s (80 evaluations, best -0.0312); "
        "entropy weight alpha 0.0002 (collapsed); a tuned config for X: configs/zoo/x.yaml"
    )
    healthy = stall_message(stall, RESULTS_POINTER, alpha=0.05)
    assert "alpha" not in healthy and healthy.endswith(RESULTS_POINTER), "only the eval fact"


def test_the_latest_alpha_is_read_from_the_end_of_metrics_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"source": "learner", "tag": "losses/alpha", "step": 1, "value": 0.5},
        {"source": "learner", "tag": "losses/alpha", "step": 2, "value": 0.0003},
        {"source": "learner", "tag": "losses/alpha", "step": 3, "value": None},
        {"source": "evaluator", "tag": "losses/alpha", "step": 4, "value": 9.0},
        {"source": "learner", "tag": "losses/critic_loss", "step": 4, "value": 1.0},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut short')
    assert latest_logged(path, "losses/alpha") == 0.0003
    assert latest_logged(path, "losses/alpha", tail_bytes=60) is None, "only its tail is read"
    assert latest_logged(tmp_path / "none.jsonl", "losses/alpha") is None


def stalled_config(env_id: str = MCC, seconds: float = 60.0) -> Config:
    cfg = config()
    cfg.env.id = env_id
    cfg.supervisor.no_progress_seconds = seconds
    cfg.evaluator.enabled = True
    return cfg


def test_one_warning_line_when_a_stall_begins_and_one_when_it_clears(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = [{"source": "learner", "tag": "losses/alpha", "step": 9, "value": 1e-5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    warning = NoProgressWarning(stalled_config(), tmp_path, zoo_dir=zoo(tmp_path))
    with caplog.at_level(logging.WARNING, logger="zmqrl.supervisor"):
        for i, t in enumerate(range(0, 200, 5)):
            warning.update(float(t), -0.03, i + 1)
        assert warning.text.startswith("no progress: no new best evaluation for 3m15s")
        assert "entropy weight alpha 1e-05 (collapsed)" in warning.text
        assert warning.text.endswith(f"a tuned config for {MCC}: configs/zoo/mountaincar_continuous_sac.yaml")
        assert warning.update(200.0, 50.0, 41) == "" and warning.seconds is None
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 2, said
    assert said[0].startswith("no progress: no new best evaluation for 1m00s")
    assert said[1] == "progress again (new best evaluation 50): the no-progress warning is cleared"


# ------------------------------------------------------------------ where the operator sees it


def stalled_snapshot(cfg: Config) -> RunSnapshot:
    """An evaluator whose best stays put for two minutes of evaluations, with a learner beating."""
    b = builder(cfg)
    learner, ev = slot("learner", pid=100), slot("evaluator")
    run: dict[str, Slot] = {s.name: s for s in (learner, ev)}
    snap = RunSnapshot()
    for n, t in enumerate(range(10, 130, 5)):
        beat(learner, float(t), 100, updates=50 * n, duration=float(t))
        beat(ev, float(t), 300, evaluations=n + 1, eval_return=-0.05, eval_best=-0.03)
        snap = b.build(run, now=float(t) + 0.5)
    return snap


def test_the_dashboard_and_the_progress_line_show_the_warning() -> None:
    snap = stalled_snapshot(stalled_config("NoSuchEnv-v0"))
    assert (
        snap.no_progress.startswith("no progress: no new best evaluation for 1m") and snap.no_progress_seconds
    )
    text = text_of(snap)
    warning = line_of(text, "warning")
    assert "no progress: no new best evaluation" in warning
    assert "see docs/results.md for tuned configs" in " ".join(text.split())
    line = plain_line(snap)
    assert line.startswith("updates ") and line.endswith(" | " + snap.no_progress)
    back = RunSnapshot.from_dict(json.loads(json.dumps(snap.to_dict())))
    assert back.no_progress == snap.no_progress, "`zmqrl status` receives it"
    assert "warning" not in text_of(stalled_snapshot(stalled_config(seconds=0.0))), "off: no line"


def test_the_summary_says_a_stall_standing_at_the_end(tmp_path: Path) -> None:
    cfg = stalled_config()
    out = io.StringIO()
    message = "no progress: no new best evaluation for 12m00s (80 evaluations, best -0.03); see docs"
    summary = Reporter(cfg, tmp_path, out, lambda _: None).final(
        {}, {"launched": 0.0, "outcome": "finished", "no_progress": message}
    )
    assert f"warning: {message}" in out.getvalue().splitlines()
    assert summary["no_progress"] == message
    assert json.loads((tmp_path / "stats.json").read_text())["no_progress"] == message
    quiet = io.StringIO()
    Reporter(cfg, tmp_path, quiet, lambda _: None).final({}, {"launched": 0.0, "no_progress": None})
    assert "no progress" not in quiet.getvalue()


def test_zmqrl_status_shows_the_warning(ctx: zmq.Context) -> None:
    snap = stalled_snapshot(stalled_config("NoSuchEnv-v0"))
    server = Served(ctx, lambda: snap)
    try:
        code, out = status_cmd("--endpoint", server.endpoint)
    finally:
        server.close()
    assert code == 0, out
    assert "no progress: no new best evaluation" in out and "docs/results.md" in out


def test_the_loop_feeds_the_watch_every_heartbeat_so_the_first_evaluation_is_seen_as_the_first() -> None:
    """Off a terminal a snapshot is built only at each progress line, by when the evaluator may have
    scored several times: the supervisor's loop feeds the watch every heartbeat meanwhile."""
    cfg = stalled_config("NoSuchEnv-v0")
    cfg.learner.target_return = -200.0
    b = builder(cfg)
    ev = slot("evaluator")
    run: dict[str, Slot] = {ev.name: ev}
    for n, t in enumerate(range(10, 130, 5)):
        beat(ev, float(t), 300, evaluations=n + 1, eval_return=-0.05, eval_best=-0.03)
        b.watch_progress(run, float(t))
    snap = b.build(run, now=130.0)
    assert "learner.target_return -200 was met by the first evaluation" in snap.no_progress
    late = builder(cfg)  # built first at the end: the count says the first was missed
    assert late.build(run, now=130.0).no_progress == "", "a target reached is never a stall"
