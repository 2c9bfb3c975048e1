"""learner: updates/s while synthetic actors flood the learner with samples, against the same
update loop with nothing arriving (uniform and prioritized replay).

The flood is two sender processes pushing valid CartPole messages as fast as the socket takes
them, into the learner's real receive -> validate -> insert path on its own ingest thread, as in
a launched learner. "Nothing arriving" is the same trainer with its ingest thread stopped (the
senders then wait on the high-water mark and cost nothing). The two alternate repeat by repeat.
A last row shows the flood with the ingest budget off (``learner.ingest_max_share: null``): what
the GIL did to training before the budget existed.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import torch
import zmq

from zmqrl.api import load_config
from zmqrl.bench.report import BenchSettings, Comparison, Stat
from zmqrl.bench.senders import SampleShape, Senders, sample_batch
from zmqrl.learner.trainer import Trainer
from zmqrl.transport.channels import BadMessages, SampleReceiver
from zmqrl.transport.messages import SamplesMsg

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "cartpole_dqn.yaml"
SENDERS = 2
TARGET = 0.9


class _Rig:
    """A trainer on the CartPole config, its PULL socket, and an ingest thread to start and stop."""

    def __init__(self, overrides: list[str], run_dir: Path) -> None:
        cfg = load_config(
            CONFIG,
            [
                "learner.eval_interval=0",
                "learner.checkpoint_interval=0",
                "learner.log_interval=1000000",
                "learner.samples_per_insert=null",  # the flood at full rate: no ratio holds it back
                *overrides,
            ],
        )
        self.trainer = Trainer(cfg, run_dir, background_checkpoints=False)
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.setsockopt(zmq.RCVHWM, cfg.transport.samples_hwm)
        self.endpoint = f"tcp://127.0.0.1:{self.pull.bind_to_random_port('tcp://127.0.0.1')}"
        self.receiver = SampleReceiver(self.pull, self.trainer.spec, BadMessages("samples"))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        batch = sample_batch(SampleShape(batch=cfg.actor.send_batch), seed=99)
        seq = 0
        while len(self.trainer.replay) < max(cfg.learner.min_replay_size, 5_000):
            self.trainer.ingest.accept(SamplesMsg(999, seq, 0, batch, episodes=[]))
            seq += 1

    def start_ingest(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self.trainer.ingest.drain, args=(self.receiver, self._stop), name="ingest", daemon=True
        )
        self._thread.start()

    def stop_ingest(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            if self._thread.is_alive():
                raise RuntimeError("the benchmark's ingest thread did not stop")
            self._thread = None

    def measure(self, seconds: float) -> tuple[float, float, float]:
        """Train for ``seconds``: updates/s, transitions/s ingested, ingest thread's CPU share."""
        trainer = self.trainer
        for _ in range(20):  # warm caches after a switch
            trainer.train_step()
        thread = self._thread
        clock_id = time.pthread_getcpuclockid(thread.ident) if thread and thread.ident else None
        cpu0 = time.clock_gettime(clock_id) if clock_id is not None else 0.0
        samples0, updates0 = trainer.counters.samples, trainer.counters.updates
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            trainer.train_step()
        elapsed = time.perf_counter() - start
        cpu = time.clock_gettime(clock_id) - cpu0 if clock_id is not None else 0.0
        return (
            (trainer.counters.updates - updates0) / elapsed,
            (trainer.counters.samples - samples0) / elapsed,
            cpu / elapsed,
        )

    def close(self) -> None:
        self.stop_ingest()
        self.pull.close(0)
        self.ctx.term()
        self.trainer.close()


def compare(
    name: str, overrides: list[str], settings: BenchSettings, repeats: int, target: float | None
) -> Comparison:
    with tempfile.TemporaryDirectory(prefix="zmqrl-bench-") as tmp:
        rig = _Rig(overrides, Path(tmp))
        try:
            with Senders(rig.endpoint, SENDERS, SampleShape(batch=rig.trainer.cfg.actor.send_batch)):
                bare, flooded, ingested, shares = [], [], [], []
                for _ in range(repeats):
                    bare.append(rig.measure(settings.seconds)[0])
                    rig.start_ingest()
                    ups, rate, share = rig.measure(settings.seconds)
                    rig.stop_ingest()
                    flooded.append(ups)
                    ingested.append(rate)
                    shares.append(share)
        finally:
            rig.close()
    return Comparison(
        group="learner",
        name=name,
        unit="updates/s",
        ours=Stat.of(flooded),
        reference=Stat.of(bare),
        target=target,
        notes=f"{SENDERS} senders flooding vs none; ingest {Stat.of(ingested).median:,.0f} transitions/s, "
        f"ingest thread {Stat.of(shares).median:.0%} CPU",
        extra={
            "ingest_transitions_per_s": Stat.of(ingested).median,
            "ingest_cpu_share": Stat.of(shares).median,
        },
    )


def run(settings: BenchSettings) -> list[Comparison]:
    torch.set_num_threads(1)  # as the learner does (learner.torch_threads)
    uncapped_repeats = max(1, min(settings.repeats, 2))
    return [
        compare(
            "CartPole DQN, uniform, 2 senders flooding",
            ["replay.prioritized=false"],
            settings,
            settings.repeats,
            TARGET,
        ),
        compare(
            "CartPole DQN, prioritized, 2 senders flooding",
            ["replay.prioritized=true"],
            settings,
            settings.repeats,
            TARGET,
        ),
        compare(
            "same, uniform, ingest budget off (ingest_max_share null)",
            ["replay.prioritized=false", "learner.ingest_max_share=null"],
            settings,
            uncapped_repeats,
            None,
        ),
    ]
