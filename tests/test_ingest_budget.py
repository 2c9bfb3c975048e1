"""The ingest thread's share of the learner's time is capped, so a flood of samples cannot starve
training of the GIL (issue 12: 490 updates/s fell to 47 with one uncapped sender)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import zmq

from zmqrl.api import load_config
from zmqrl.bench.senders import SampleShape, Senders
from zmqrl.errors import ConfigError
from zmqrl.learner.ingest import BUDGET_BURST_SECONDS, IngestBudget
from zmqrl.learner.trainer import Trainer
from zmqrl.transport.channels import BadMessages, SampleReceiver

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cartpole_dqn.yaml"


class Clocks:
    """A wall clock and the thread's CPU clock, both moved by hand."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 5.0

    def work(self, seconds: float) -> None:
        self.wall += seconds
        self.cpu += seconds

    def idle(self, seconds: float) -> None:
        self.wall += seconds


def budget(share: float | None, clocks: Clocks) -> IngestBudget:
    return IngestBudget(share, cpu_clock=lambda: clocks.cpu, clock=lambda: clocks.wall)


def test_no_share_never_pauses() -> None:
    clocks = Clocks()
    b = budget(None, clocks)
    clocks.work(10.0)
    assert b.wait_time() == 0.0


def test_a_burst_within_the_bank_runs_without_pausing() -> None:
    clocks = Clocks()
    b = budget(0.1, clocks)
    clocks.work(BUDGET_BURST_SECONDS * 0.9)
    assert b.wait_time() == 0.0


def test_spent_budget_pauses_until_half_a_burst_is_earned_back() -> None:
    clocks = Clocks()
    b = budget(0.1, clocks)
    clocks.work(BUDGET_BURST_SECONDS + 0.001)  # 1 ms over the bank (and 0.6 ms earned meanwhile)
    wait = b.wait_time()
    earned = (BUDGET_BURST_SECONDS + 0.001) * 0.1
    assert wait == pytest.approx((BUDGET_BURST_SECONDS / 2 + 0.001 - earned) / 0.1)
    clocks.idle(wait)
    assert b.wait_time() == 0.0


def test_sustained_work_is_held_to_its_share_of_wall_time() -> None:
    """Simulate the ingest loop: work in 0.2 ms messages, pause when told; count the share."""
    clocks = Clocks()
    b = budget(0.05, clocks)
    start_wall, start_cpu = clocks.wall, clocks.cpu
    while clocks.wall - start_wall < 20.0:
        clocks.work(0.0002)
        clocks.idle(b.wait_time())
    share = (clocks.cpu - start_cpu) / (clocks.wall - start_wall)
    assert 0.045 < share < 0.055


def test_idle_time_banks_at_most_one_burst() -> None:
    clocks = Clocks()
    b = budget(0.1, clocks)
    clocks.idle(3600.0)  # an hour of quiet earns no more than the bank holds
    clocks.work(0.0001)  # the first message after the quiet spell
    assert b.wait_time() == 0.0
    clocks.work(BUDGET_BURST_SECONDS * 1.5)
    assert b.wait_time() > 0


def test_restart_forgets_what_ran_before() -> None:
    clocks = Clocks()
    b = budget(0.1, clocks)
    clocks.work(5.0)  # filling replay: not charged
    b.restart()
    assert b.wait_time() == 0.0


@pytest.mark.parametrize("share", ["0", "1.5", "-0.1"])
def test_share_outside_zero_one_is_a_config_error_naming_the_key(share: str) -> None:
    with pytest.raises(ConfigError, match=r"learner\.ingest_max_share"):
        load_config(CONFIG, [f"learner.ingest_max_share={share}"])


@pytest.mark.slow
def test_a_flooding_sender_is_held_back_while_training_runs(tmp_path: Path) -> None:
    """A real ingest thread under a sender that pushes as fast as it can: once replay is ready,
    the thread pauses on its budget, and what it lets in still reaches replay."""
    cfg = load_config(
        CONFIG,
        [
            "learner.eval_interval=0",
            "learner.checkpoint_interval=0",
            "learner.ingest_max_share=0.05",
            "learner.samples_per_insert=null",  # a flood no replay ratio holds back
        ],
    )
    trainer = Trainer(cfg, tmp_path, background_checkpoints=False)
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    receiver = SampleReceiver(pull, trainer.spec, BadMessages("samples"))
    stop = threading.Event()
    thread = threading.Thread(target=trainer.ingest.drain, args=(receiver, stop), daemon=True)
    try:
        with Senders(f"tcp://127.0.0.1:{port}", 1, SampleShape()):
            thread.start()
            assert trainer.ingest.replay_ready.wait(60), "replay never reached min_replay_size"
            deadline = time.monotonic() + 30
            while trainer.ingest.budget.paused_seconds < 0.5 and time.monotonic() < deadline:
                trainer.train_step()
            assert trainer.ingest.budget.paused_seconds >= 0.5
            before = trainer.counters.samples
            while trainer.counters.samples == before and time.monotonic() < deadline:
                trainer.train_step()
            assert trainer.counters.samples > before  # held back, not shut out
    finally:
        stop.set()
        thread.join(timeout=10)
        pull.close(0)
        ctx.term()
        trainer.close()
    assert not thread.is_alive()
