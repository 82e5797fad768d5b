"""SequenceTracker: in-order batches apply, gaps replay, restarts forget, overlaps skip."""

from routing.prefix.event_sequence import SequenceTracker, Step, replay_complete


def test_in_order_batches_apply():
    t = SequenceTracker()
    for seq in range(3):
        assert t.observe("a", seq).step is Step.APPLY
        t.applied("a", seq)
    assert t.expected == {"a": 3}


def test_a_gap_names_the_first_missing_batch():
    t = SequenceTracker()
    t.applied("a", 0)
    v = t.observe("a", 4)
    assert v.step is Step.GAP and v.missing_from == 1


def test_a_replica_first_seen_late_replays_from_zero():
    v = SequenceTracker().observe("b", 7)
    assert v.step is Step.GAP and v.missing_from == 0


def test_numbers_back_to_zero_are_a_restart_and_older_ones_stale():
    t = SequenceTracker()
    for seq in range(5):
        t.applied("a", seq)
    assert t.observe("a", 0).step is Step.RESTART
    assert t.observe("a", 3).step is Step.STALE
    t.forget("a")
    assert t.observe("a", 0).step is Step.APPLY


def test_streams_are_independent():
    t = SequenceTracker()
    t.applied("a", 0)
    assert t.observe("b", 0).step is Step.APPLY and t.observe("a", 1).step is Step.APPLY


def test_replay_complete():
    assert replay_complete(2, 5, [2, 3, 4])
    assert replay_complete(2, 5, [4, 2, 3, 3, 5])
    assert not replay_complete(2, 5, [3, 4])
    assert replay_complete(3, 3, [])
