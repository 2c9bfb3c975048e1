"""Checkpoint writes (issue 37, item 7): a transient OSError (an NFS EIO / ESTALE) is retried a
bounded number of times with backoff, counted and logged; a full or read-only disk still ends the
role with exit 2 and one line, the evaluator's ``best`` as the learner's; temp files are created
where no planted symlink can redirect them.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest
import torch
import typer
import zmq

from tests.conftest import tiny_config
from tests.test_checkpoint_pairs import checkpoint_at, names, trainer
from tests.test_roles import FakeSupervisor, start, with_transport
from zmqrl.checkpoints import files
from zmqrl.checkpoints.files import (
    LATEST,
    CheckpointStorageError,
    CheckpointWriteError,
    WriteRetries,
    atomic_write,
    load_checkpoint,
    save_checkpoint,
)
from zmqrl.checkpoints.policy import make_eval_agent
from zmqrl.cli.process import run_role
from zmqrl.envs.factory import make_env
from zmqrl.evaluator.greedy import make_eval_policy
from zmqrl.evaluator.scoring import Scorer
from zmqrl.learner.main import Learner
from zmqrl.learner.trainer import Trainer
from zmqrl.metrics import NullLogger
from zmqrl.transport.wire import WeightsMsg
from zmqrl.types import Weights

real_save = torch.save


def failing(codes: list[int]) -> Callable[[object, IO[bytes]], None]:
    """A torch.save whose next calls fail with ``codes`` in turn (after writing a little), then
    save for real."""

    def save(obj: object, f: IO[bytes]) -> None:
        if codes:
            f.write(b"\0" * 100)
            code = codes.pop(0)
            raise OSError(code, os.strerror(code))
        real_save(obj, f)

    return save


def no_waiting(t: Trainer) -> list[float]:
    """The trainer's retry waits, recorded instead of slept."""
    waits: list[float] = []
    t.checkpoints.retries.sleep = waits.append
    return waits


@pytest.mark.parametrize("code", [errno.EIO, errno.ESTALE])
def test_a_transient_error_is_retried_after_a_wait_counted_and_logged_and_the_pair_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    t = trainer(tiny_config(tmp_path))
    waits = no_waiting(t)
    monkeypatch.setattr(torch, "save", failing([code]))
    caplog.set_level("WARNING", logger="zmqrl.checkpoints")
    checkpoint_at(t, 100, rows=30)
    t.close()
    assert t.checkpoints.retries.retried == 1 and waits == [files.RETRY_FIRST_SECONDS]
    said = [r.getMessage() for r in caplog.records]
    name = errno.errorcode[code]
    assert len(said) == 1 and "ckpt-0000000100 failed (" in said[0] and f"[{name}]): retry 1 of 3" in said[0]
    assert not [n for n in names(t.checkpoints.directory) if n.startswith(".")], "no temp file left"
    monkeypatch.undo()
    resumed = trainer(tiny_config(tmp_path), resume=True)
    assert resumed.counters.updates == 100 and len(resumed.replay) == 30
    resumed.close()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES])
def test_a_full_or_read_only_disk_is_not_retried_and_stays_one_line_for_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    t = trainer(tiny_config(tmp_path))
    waits = no_waiting(t)
    monkeypatch.setattr(torch, "save", failing([code]))
    with pytest.raises(CheckpointWriteError) as failed:
        checkpoint_at(t, 100, rows=30)
    t.close()
    assert waits == [] and t.checkpoints.retries.retried == 0
    message = str(failed.value)
    assert "\n" not in message and f"[{errno.errorcode[code]}]" in message
    assert f"cannot write ckpt-0000000100 in {t.checkpoints.directory}" in message


def test_a_transient_error_that_outlasts_the_retries_ends_as_a_failure_to_restart_not_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = trainer(tiny_config(tmp_path))
    checkpoint_at(t, 100, rows=30)
    waits = no_waiting(t)
    monkeypatch.setattr(torch, "save", failing([errno.EIO] * files.WRITE_ATTEMPTS))
    with pytest.raises(CheckpointStorageError) as failed:
        checkpoint_at(t, 200, rows=20)
    t.close()
    assert not isinstance(failed.value, CheckpointWriteError), "not the operator's setting: restarted"
    assert waits == [0.5, 1.0, 2.0] and t.checkpoints.retries.retried == 3
    message = str(failed.value)
    assert "\n" not in message and f"[EIO], {files.WRITE_ATTEMPTS} times in a row" in message
    directory = t.checkpoints.directory
    assert not [n for n in names(directory) if n.startswith(".")]
    monkeypatch.undo()
    resumed = trainer(tiny_config(tmp_path), resume=True)
    assert resumed.counters.updates == 100 and len(resumed.replay) == 30, "the previous pair, whole"
    resumed.close()


def test_retries_are_bounded_and_their_waits_double() -> None:
    waits: list[float] = []
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        raise OSError(errno.ESTALE, "Stale file handle")

    retries = WriteRetries(attempts=3, first_wait=0.25, sleep=waits.append)
    with pytest.raises(CheckpointStorageError, match=r"Stale file handle \[ESTALE\], 3 times in a row"):
        retries.run(write, Path("/run/checkpoints/latest"), Path("/run"))
    assert len(calls) == 3 and waits == [0.25, 0.5] and retries.retried == 2


def write_snapshot(f: IO[bytes]) -> None:
    f.write(b"snapshot")


def test_a_symlink_planted_at_the_old_predictable_temp_name_is_not_followed(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    for name in ("ckpt-0000000100", "replay-0000000100.npz", LATEST):
        (directory / f".{name}.tmp-{os.getpid()}").symlink_to(victim)
    files.save_periodic(directory, 100, {"x": torch.ones(2)}, keep=2)
    atomic_write(directory / "replay-0000000100.npz", write_snapshot)
    assert victim.read_bytes() == b"precious"
    for name in ("ckpt-0000000100", LATEST, "replay-0000000100.npz"):
        assert not (directory / name).is_symlink()
    assert torch.equal(load_checkpoint(directory / LATEST)["x"], torch.ones(2))


def test_a_temp_name_taken_by_a_symlink_is_never_written_through_another_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even a name someone managed to plant (here, the random part made predictable) is refused
    (O_EXCL | O_NOFOLLOW): the write moves on to another name."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    parts = iter(["guessed", "fresh"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(parts))
    (tmp_path / f".best.tmp-{os.getpid()}-guessed").symlink_to(victim)
    save_checkpoint(tmp_path / "best", {"x": torch.zeros(1)})
    assert victim.read_bytes() == b"precious" and not (tmp_path / "best").is_symlink()
    assert load_checkpoint(tmp_path / "best")["x"].shape == (1,)


def test_a_background_write_that_outlasts_its_retries_ends_the_learner_with_that_error_in_one_line(
    ctx: zmq.Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Raised on the learner's main thread as itself (exit 1: restarted), not as a dead thread."""
    cfg = tiny_config(
        tmp_path, learner__max_updates=100_000, learner__checkpoint_interval=50, learner__eval_interval=0
    )
    t = trainer(cfg)
    checkpoint_at(t, 100, rows=500)  # a replay to train from: no actor needed
    t.close()
    sup = FakeSupervisor(ctx)
    monkeypatch.setattr(files, "RETRY_FIRST_SECONDS", 0.0)
    learner = Learner(with_transport(cfg, **sup.endpoints()), ctx=ctx, resume=True)
    monkeypatch.setattr(torch, "save", failing([errno.EIO] * 1000))
    failed: list[BaseException] = []

    def run() -> None:
        try:
            learner.run()
        except BaseException as exc:
            failed.append(exc)

    thread = start(run)
    thread.join(timeout=120)
    sup.close()
    assert not thread.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], CheckpointStorageError), failed
    assert "cannot write ckpt-0000000150" in str(failed[0]) and "\n" not in str(failed[0])
    assert learner.stats["state"] == "failed"
    assert "thread 'checkpoint-writer' died" not in caplog.text
    assert caplog.text.count("retry ") == files.WRITE_ATTEMPTS - 1


class EvaluatorRole:
    """The evaluator's scoring of one version, as the evaluator process runs it under run_role."""

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer

    def request_stop(self) -> None:
        """Nothing to stop: run() ends by itself."""

    def run(self) -> dict[str, Any]:
        self.scorer.evaluate_pending(lambda: False)
        return {}


def test_the_evaluators_best_on_a_full_disk_exits_2_with_one_line_as_the_learners_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tiny_config(tmp_path, env__max_episode_steps=20)
    env = make_env(cfg.env, training=False)
    policy = make_eval_policy(cfg, env, seed=0)
    scorer = Scorer(cfg, policy, [env], NullLogger(), cfg.run_dir, launched=time.time())
    weights = make_eval_agent(cfg, env, seed=0).export_weights()
    scorer.offer(WeightsMsg(Weights(1, weights), agent=cfg.agent.kind))
    monkeypatch.setattr(torch, "save", failing([errno.ENOSPC]))
    with pytest.raises(typer.Exit) as ended:
        run_role(lambda: EvaluatorRole(scorer))
    env.close()
    assert ended.value.exit_code == 2
    lines = capsys.readouterr().err.splitlines()
    where = cfg.run_dir / "checkpoints"
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write best in {where}")
    assert "No space left on device [ENOSPC]" in lines[0]
