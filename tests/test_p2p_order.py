"""Pipeline messages under NCCL's matching rules (validate/p2p_order.py).

NCCL ignores tags: on one communicator a pair's j-th send fills the j-th receive, and a
rank's operations on it run in the order posted. torch opens a communicator per pair of
ranks and group (lazily initialised groups) or one per group (eagerly initialised ones).
The runner posts every receive of a step first, so it gives every pipeline edge and
direction a group of its own. These tests replay every schedule shape under both rules.
"""
from __future__ import annotations

import pytest

from sim.schedules import Action, make_schedule
from validate.p2p_order import Message, by_kind, group_of, makes, needs, pipeline_edges, replay, replay_lists

SHAPES = ([(s, p, m, 1) for s in ("gpipe", "1f1b") for p in (2, 3, 4, 8) for m in range(1, 17)]
          + [("interleaved", p, m, v) for p in (2, 3, 4) for v in (2, 3, 4) for m in range(p, 4 * p + 1, p)])


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("schedule,p,m,v", SHAPES)
def test_every_schedule_shape_completes_under_nccl_rules(schedule, p, m, v, shared):
    """With the runner's groups (group_of), every receive of every schedule the runner
    accepts (GPipe and 1F1B at 2-8 stages and 1-16 microbatches; interleaved at 2-4
    stages, 2-4 chunks, 1-4 groups of microbatches) gets the message it posted for, and
    every rank finishes its step, with a communicator per pair and group or one per group."""
    assert replay(schedule, p, m, v, shared=shared) is None


@pytest.mark.parametrize("v", [2, 3, 4])
def test_one_group_per_kind_deadlocks_two_stage_interleaving(v):
    """The replay can fail: with activations on one group and gradients on another (the
    runner's groups before group_of), a two-stage interleaved pipeline sends activations
    both ways between ranks 0 and 1 on one group; both post their receives first and wait
    there. Hand-worked: rank 0's second chunk (virtual stage 2) needs microbatch 0 from
    rank 1's first chunk (stage 1), and rank 1's queue on that group starts with its own
    receive of microbatch 0 from stage 0. With a communicator per pair, more stages have
    no pair talking both ways on one group, and pass."""
    assert replay("interleaved", 2, 4, v, by_kind) == "deadlock: rank 0 waits before F1.0 for ('F', 1, 2, 0)"
    assert replay("interleaved", 4, 8, v, by_kind) is None


def test_one_group_per_kind_deadlocks_a_three_stage_1f1b_on_one_communicator():
    """With one communicator per group (eager initialisation), stage 1 of a 3-stage 1F1B
    pipeline posts its receives from stage 0 first on the activations' group and queues its
    sends to stage 2 behind them; stage 0 sends its third microbatch only after the first
    gradient came back, which needs stage 2's first backward, which needs that send.
    GPipe, whose stage 0 sends every activation first, gets through."""
    assert replay("1f1b", 3, 4, 1, by_kind, shared=True) is not None
    assert replay("1f1b", 3, 4, 1, by_kind, shared=False) is None
    assert replay("gpipe", 3, 4, 1, by_kind, shared=True) is None


def test_out_of_order_receive_is_named():
    """A receiver whose actions take microbatches in another order than its sender sent
    them would get the wrong tensor under NCCL (no tags): the replay names both messages.
    GPipe on 2 stages, the last stage's forwards of microbatches 0 and 1 swapped."""
    lists = make_schedule("gpipe", 2, 2, 1)
    last = [Action(0, "F", 1), Action(0, "F", 0)] + [a for a in lists[1] if a.kind == "B"]
    assert replay_lists([lists[0], last], 1) == (
        "group F0>1: rank 0 sends ('F', 0, 1, 0) to rank 1, whose receive at the front expects ('F', 0, 1, 1)")


def test_groups_by_hand():
    """Hand-worked groups of a 4-stage pipeline with 2 chunks (virtual stages 0-7, stage k
    on rank k % 4): activation 2 -> 3 goes from stage 2 to 3, gradient 6 -> 5 from stage 2
    to 1, activation 3 -> 4 from the last stage to the first, gradient 4 -> 3 back; the
    runner creates 8 groups for it (4 edges x 2 directions, wrap included), 4 for 3 stages
    without interleaving, and every name group_of gives is one of them."""
    assert group_of(Message("F", 2, 3, 0), 4) == "F2>3"
    assert group_of(Message("B", 6, 5, 0), 4) == "B2>1"
    assert group_of(Message("F", 3, 4, 0), 4) == "F3>0"
    assert group_of(Message("B", 4, 3, 0), 4) == "B0>3"
    edges = pipeline_edges(4, True)
    assert len(edges) == 8 and len(pipeline_edges(3, False)) == 4
    names = {e[0] for e in edges}
    lists = make_schedule("interleaved", 4, 8, 2)
    for r, acts in enumerate(lists):
        for a in acts:
            for msg in (needs(a, r, 4, 7), makes(a, r, 4, 7)):
                assert msg is None or group_of(msg, 4) in names
