"""SequenceTracker: the rules by which the learner counts lost, reordered and restarted samples streams."""

from __future__ import annotations

import threading

from zmqrl.transport.sequence import EXTRA_TRACKED_IDS, MAX_SEQ_GAP, REORDER_WINDOW, SequenceTracker


def feed(tracker: SequenceTracker, actor_id: int, *seqs: int, samples: int = 1) -> None:
    for seq in seqs:
        tracker.observe(actor_id, seq, samples)


def stats(tracker: SequenceTracker, actor_id: int = 0) -> dict[str, int]:
    return tracker.per_actor()[actor_id]


def test_an_in_order_stream_counts_nothing_but_batches_and_samples() -> None:
    tracker = SequenceTracker()
    feed(tracker, 0, *range(100), samples=64)
    assert stats(tracker) == {
        "batches": 100,
        "samples": 6400,
        "lost": 0,
        "reordered": 0,
        "restarts": 0,
        "last_seq": 99,
    }


def test_the_first_message_seen_is_the_baseline_not_a_gap() -> None:
    tracker = SequenceTracker()  # e.g. a restarted learner joining an actor's stream at seq 500
    feed(tracker, 7, 500, 501)
    assert stats(tracker, 7)["lost"] == 0


def test_gaps_count_the_missing_seq_numbers() -> None:
    tracker = SequenceTracker()
    feed(tracker, 0, 0, 1, 5, 6, 10)
    assert stats(tracker)["lost"] == 3 + 3


def test_late_and_duplicate_messages_count_as_reordered_and_keep_the_baseline() -> None:
    tracker = SequenceTracker()
    feed(tracker, 0, 0, 1, 3, 2, 3, 4)
    s = stats(tracker)
    assert (s["lost"], s["reordered"], s["restarts"], s["last_seq"]) == (1, 2, 0, 4)


def test_seq_back_to_zero_is_a_restart_and_the_new_incarnation_is_tracked_afresh() -> None:
    tracker = SequenceTracker()
    feed(tracker, 0, *range(50))
    feed(tracker, 0, 0, 1, 2)  # the actor process was replaced
    s = stats(tracker)
    assert (s["restarts"], s["lost"], s["reordered"], s["last_seq"], s["batches"]) == (1, 0, 0, 2, 53)


def test_seq_far_behind_is_a_restart_whose_first_messages_were_lost() -> None:
    tracker = SequenceTracker()
    feed(tracker, 0, *range(1000))
    feed(tracker, 0, 3, 4)  # new incarnation; its seq 0, 1, 2 never arrived
    s = stats(tracker)
    assert (s["restarts"], s["lost"], s["reordered"], s["last_seq"]) == (1, 3, 0, 4)
    feed(tracker, 0, 2)
    assert stats(tracker)["reordered"] == 1, "just behind the new baseline it is only late"


def test_the_reorder_window_separates_late_messages_from_restarts() -> None:
    tracker = SequenceTracker()
    feed(tracker, 0, 1000, 1000 - REORDER_WINDOW)
    assert (stats(tracker)["reordered"], stats(tracker)["restarts"]) == (1, 0)
    feed(tracker, 0, 1000 - REORDER_WINDOW - 1)
    assert (stats(tracker)["reordered"], stats(tracker)["restarts"]) == (1, 1)


def test_two_live_actors_sharing_an_id_show_up_as_a_stream_of_restarts_and_losses() -> None:
    tracker = SequenceTracker()
    for k in range(20):
        feed(tracker, 4, 500 + k, k)
    s = stats(tracker, 4)
    assert s["restarts"] >= 19 and s["lost"] > 1000


def test_actors_are_tracked_independently_and_totals_sum_them() -> None:
    tracker = SequenceTracker()
    feed(tracker, 0, 0, 2)  # one lost
    feed(tracker, 1, 0, 1, 1)  # one reordered
    feed(tracker, 2, 9, 0)  # one restart
    assert sorted(tracker.per_actor()) == [0, 1, 2]
    assert tracker.totals() == {
        "lost_batches": 1,
        "reordered_batches": 1,
        "actor_restarts": 1,
        "tracked_actors": 3,
        "untracked_batches": 0,
        "untracked_samples": 0,
    }


def test_ids_outside_the_run_are_counted_in_one_bucket_not_one_entry_each() -> None:
    tracker = SequenceTracker.for_run(num_actors=4)
    for actor_id in range(10_000):
        tracker.observe(actor_id * 7919, 0, 2)
    tracked = [a * 7919 for a in range(10_000) if a * 7919 < 4 + EXTRA_TRACKED_IDS]
    totals = tracker.totals()
    assert totals["tracked_actors"] == len(tracked) == len(tracker.per_actor())
    assert totals["untracked_batches"] == 10_000 - len(tracked)
    assert totals["untracked_samples"] == 2 * (10_000 - len(tracked))
    tracker.observe(-1, 0, 2)  # a negative id is no actor of the run either
    assert tracker.totals()["untracked_batches"] == 10_000 - len(tracked) + 1
    tracker.observe(0, 1, 2)  # the run's own ids are followed one by one
    assert stats(tracker)["batches"] == 2


def test_scaled_replicas_past_the_config_are_still_tracked_one_by_one() -> None:
    tracker = SequenceTracker.for_run(num_actors=2)
    feed(tracker, 2 + EXTRA_TRACKED_IDS - 1, 0, 1)
    assert tracker.per_actor()[2 + EXTRA_TRACKED_IDS - 1]["batches"] == 2


def test_a_jump_no_queue_can_lose_is_a_restart_not_a_loss() -> None:
    tracker = SequenceTracker()
    feed(tracker, 0, 0, MAX_SEQ_GAP + 1)  # the largest gap queues can explain
    assert (stats(tracker)["lost"], stats(tracker)["restarts"]) == (MAX_SEQ_GAP, 0)
    feed(tracker, 1, 0, 2**63 - 1)
    assert (stats(tracker, 1)["lost"], stats(tracker, 1)["restarts"]) == (0, 1)
    feed(tracker, 1, 2**62)  # far behind, and too far from 0 to be a new incarnation's losses
    assert (stats(tracker, 1)["lost"], stats(tracker, 1)["restarts"]) == (0, 2)


def test_counters_saturate_at_what_a_heartbeat_can_carry() -> None:
    tracker = SequenceTracker()
    for actor_id in range(3):
        feed(tracker, actor_id, 0, samples=2**62)
        feed(tracker, actor_id, 1, samples=2**62)
    assert stats(tracker)["samples"] == 2**63 - 1
    assert tracker.totals()["untracked_samples"] == 0
    for actor_id in range(3):  # gaps from many actors cannot sum past int64 either
        tracker._actors[actor_id].lost = 2**62  # as if after 2**62 lost messages
    assert tracker.totals()["lost_batches"] == 2**63 - 1


def test_per_actor_is_a_copy_and_observing_from_another_thread_is_safe() -> None:
    tracker = SequenceTracker()
    snapshot = tracker.per_actor()
    done = threading.Event()

    def ingest() -> None:
        for seq in range(20_000):
            tracker.observe(seq % 8, seq // 8, 1)
        done.set()

    thread = threading.Thread(target=ingest)
    thread.start()
    while not done.is_set():
        tracker.totals()
        tracker.per_actor()
    thread.join(timeout=30)
    assert snapshot == {}
    assert sum(s["batches"] for s in tracker.per_actor().values()) == 20_000
    assert tracker.totals()["lost_batches"] == 0
