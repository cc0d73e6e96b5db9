"""Which process group each pipeline message travels on, and a replay of one step's
exchanges under NCCL's rules. No torch here: the exchanges are data derived from the
schedule's action lists (sim/schedules.py), like the schedule itself.

The runner (validate/pp.py) posts every receive of a step before its first action and
each send right after the action that produced it; gloo tells messages apart by tag.
NCCL ignores tags: between two ranks of one communicator, the j-th send from a to b
fills the j-th receive b posted from a, and each rank runs its point-to-point calls on
that communicator in the order it issued them (NCCL user guide, "Point-to-point
communication"; torch.distributed.batch_isend_irecv's docstring: the order of several
operations between the same pair in the same direction is what matches them). torch
gives each process group its own communicator for a pair of ranks (ProcessGroupNCCL:
one NCCL communicator and stream per peer key of a group).

So the runner puts messages on groups such that on every group a pair of ranks talks in
one direction only (``group_of``): activations and gradients apart, and, when the
pipeline is interleaved, the wrap-around messages (the last rank's activations to the
first rank's next chunk, the first rank's gradients back to the last) on groups of their
own. With two stages and no such split, ranks 0 and 1 send activations to each other on
one group: both post their receives first and both streams wait there for ever.

``replay`` checks an assignment: it runs one step of every rank (actions in order, each
group's operations per rank in the order they were posted, a send and its receive ending
together once both are at the front of their ranks' queues) and reports a receive that
would get another message than it expects, or a step that cannot end. The tests run it
over every schedule shape the runner accepts, and show the unsplit assignment fails.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, NamedTuple

from sim.schedules import Action, make_schedule


class Message(NamedTuple):
    """One activation (kind F) or gradient (kind B) of microbatch ``mb`` from virtual
    stage ``src`` to virtual stage ``dst``."""

    kind: str
    src: int
    dst: int
    mb: int


def group_of(msg: Message, p: int) -> str:
    """The runner's group for ``msg`` in a p-stage pipeline: 'F' and 'B' for messages to
    the next and the previous rank, 'Fw' and 'Bw' for the wrap-around ones between the last
    and the first rank of an interleaved pipeline."""
    wrap = (msg.src % p == p - 1) if msg.kind == "F" else (msg.src % p == 0)
    return msg.kind + ("w" if wrap and p > 1 else "")


def by_kind(msg: Message, p: int) -> str:
    """One group per kind, as the runner had before group_of: the negative case."""
    return msg.kind


def needs(a: Action, stage: int, p: int, last: int) -> Message | None:
    """The message action ``a`` on pipeline rank ``stage`` waits for, if any."""
    k = a.chunk * p + stage
    src = k - 1 if a.kind == "F" else k + 1
    return Message(a.kind, src, k, a.mb) if 0 <= src <= last else None


def makes(a: Action, stage: int, p: int, last: int) -> Message | None:
    """The message action ``a`` on pipeline rank ``stage`` sends, if any: F's output to
    the next virtual stage, B's input gradient to the previous one."""
    k = a.chunk * p + stage
    dst = k + 1 if a.kind == "F" else k - 1
    return Message(a.kind, k, dst, a.mb) if 0 <= dst <= last else None


def replay(schedule: str, p: int, m: int, v: int,
           group: Callable[[Message, int], str] = group_of) -> str | None:
    """One step of ``schedule`` under NCCL's rules with messages on ``group``; None when
    every receive gets its own message and every rank finishes, else what goes wrong."""
    return replay_lists(make_schedule(schedule, p, m, v), v, group)


def replay_lists(lists: list[list[Action]], v: int,
                 group: Callable[[Message, int], str] = group_of) -> str | None:
    """``replay`` of explicit per-rank action lists (one per pipeline rank)."""
    p = len(lists)
    last = p * v - 1
    # queues[(rank, group, peer)]: this rank's operations with that peer on that group,
    # in the order it posts them: every receive first, then its sends as produced.
    queues: dict[tuple[int, str, int], deque] = {}
    for r, acts in enumerate(lists):
        for a in acts:
            if (msg := needs(a, r, p, last)) is not None:
                queues.setdefault((r, group(msg, p), msg.src % p), deque()).append(("recv", msg, None))
        for i, a in enumerate(acts):
            if (msg := makes(a, r, p, last)) is not None:
                queues.setdefault((r, group(msg, p), msg.dst % p), deque()).append(("send", msg, i))
    done = [0] * p  # actions each rank has run
    arrived: set[tuple[int, Message]] = set()
    moved = True
    while moved:
        moved = False
        for (r, g, peer), q in queues.items():
            if not q or q[0][0] != "send" or q[0][2] >= done[r]:
                continue  # only a send whose data exists can start a pair
            other = queues.get((peer, g, r))
            if not other or other[0][0] != "recv":
                continue
            if other[0][1] != q[0][1]:
                return (f"group {g}: rank {r} sends {tuple(q[0][1])} to rank {peer}, whose receive "
                        f"at the front expects {tuple(other[0][1])}")
            arrived.add((peer, other.popleft()[1]))
            q.popleft()
            moved = True
        for r, acts in enumerate(lists):
            while done[r] < len(acts):
                msg = needs(acts[done[r]], r, p, last)
                if msg is not None and (r, msg) not in arrived:
                    break
                done[r] += 1
                moved = True
    for r, acts in enumerate(lists):
        if done[r] < len(acts):
            a = acts[done[r]]
            return f"deadlock: rank {r} waits before {a.kind}{a.chunk}.{a.mb} for {tuple(needs(a, r, p, last))}"
    left = [k for k, q in queues.items() if q]
    return f"deadlock: rank {left[0][0]} still has operations on group {left[0][1]}" if left else None
