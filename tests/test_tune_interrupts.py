"""The tuner's signals: raised while a run is followed, held while the study is written."""

from __future__ import annotations

import signal

import pytest

from zmqrl.tune.interrupts import Interrupts


def test_a_signal_while_a_run_is_followed_interrupts_at_once() -> None:
    interrupts = Interrupts()
    with pytest.raises(KeyboardInterrupt) as caught, interrupts.following():
        interrupts.signal(signal.SIGINT)
    assert caught.value.args == (signal.SIGINT,) and interrupts.pending is None


def test_a_signal_during_a_write_waits_for_the_write_to_end() -> None:
    interrupts = Interrupts()
    written = []
    with pytest.raises(KeyboardInterrupt) as caught, interrupts.following():
        with interrupts.writing():
            interrupts.signal(signal.SIGTERM)  # held: the write goes on
            written.append("report")
        written.append("never")  # raised as the write ended
    assert written == ["report"] and caught.value.args == (signal.SIGTERM,)


def test_a_signal_outside_a_run_waits_for_the_next_run_or_the_trial_loop() -> None:
    interrupts = Interrupts()
    interrupts.signal(signal.SIGINT)  # e.g. while Optuna saves a trial
    assert interrupts.pending == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
        interrupts.check()
    interrupts.signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), interrupts.following():
        pass  # the next run is never followed


def test_a_second_signal_while_one_waits_is_raised_at_once() -> None:
    interrupts = Interrupts()
    with interrupts.writing():
        interrupts.signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            interrupts.signal(signal.SIGINT)
    assert interrupts.pending is None
