"""Which process group each pipeline message travels on, and a replay of one step's
exchanges under NCCL's rules. No torch here: the exchanges are data derived from the
schedule's action lists (sim/schedules.py), like the schedule itself.

The runner (validate/pp.py) posts every receive of a step before its first action and
each send right after the action that produced it; gloo tells messages apart by tag.
NCCL ignores tags: the j-th send from a to b fills the j-th receive b posted from a, and a
rank runs its point-to-point calls on a communicator in the order it issued them, one
after another on that communicator's stream (NCCL user guide, "Point-to-point
communication"; torch.distributed.batch_isend_irecv's docstring: the order of several
operations between the same pair in the same direction is what matches them). Which
communicator torch uses depends on how the process group was set up
(ProcessGroupNCCL::pointToPoint): a lazily initialised group opens a two-rank
communicator per pair of peers (getKeySendRecv), an eagerly initialised one
(init_process_group with a device_id) sends everything over the group's own
communicator, so a rank's sends to one peer queue behind its receives from another.

So the runner puts every pipeline edge and direction on a process group of its own
(``group_of``: the activations from stage r to r+1, the gradients back, and an
interleaved pipeline's wrap-around messages between the last and the first stage): on
each group a rank only sends or only receives, in the order both sides' action lists
give, whichever way torch maps groups to communicators. With one group per kind instead,
a two-stage interleaved pipeline sends activations both ways on one group and, on a
shared stream, a middle stage of a 1F1B pipeline waits in its receives from the previous
stage before it can send to the next.

``replay`` checks an assignment: it runs one step of every rank (actions in order; on
each communicator a rank's operations in the order it posted them; a send and its
receive end together once both are at the front of their queues) and reports a receive
that would get another message than it expects, or a step that cannot end, with
``shared`` False (a communicator per pair and group) or True (one per group). The tests
run it over every schedule shape the runner accepts, and show that one group per kind
fails.
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
    """The runner's group for ``msg`` in a p-stage pipeline: its kind and the pipeline
    stages it goes from and to ('F0>1': activations from stage 0 to stage 1; 'F3>0' in an
    interleaved 4-stage pipeline: from the last stage's chunk to the first stage's next)."""
    return f"{msg.kind}{msg.src % p}>{msg.dst % p}"


def pipeline_edges(p: int, interleaved: bool) -> list[tuple[str, int, int]]:
    """Every group group_of can name for a p-stage pipeline, as (name, from stage, to
    stage), in one fixed order (every rank creates them in this order)."""
    out = []
    for kind, step in (("F", 1), ("B", -1)):
        for a in range(p):
            b = a + step
            wrap = not 0 <= b < p
            if wrap and not interleaved:
                continue
            b %= p
            if a != b:
                out.append((f"{kind}{a}>{b}", a, b))
    return out


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
           group: Callable[[Message, int], str] = group_of, shared: bool = False) -> str | None:
    """One step of ``schedule`` under NCCL's rules with messages on ``group`` (``shared``:
    one communicator per group, else one per pair of ranks and group); None when every
    receive gets its own message and every rank finishes, else what goes wrong."""
    return replay_lists(make_schedule(schedule, p, m, v), v, group, shared)


def replay_lists(lists: list[list[Action]], v: int, group: Callable[[Message, int], str] = group_of,
                 shared: bool = False) -> str | None:
    """``replay`` of explicit per-rank action lists (one per pipeline rank)."""
    p = len(lists)
    last = p * v - 1
    # queues[(rank, communicator)]: this rank's operations on it in the order it posts
    # them, every receive first, then its sends as produced: (op, message, peer, action).
    queues: dict[tuple, deque] = {}

    def comm(g: str, r: int, peer: int) -> tuple:
        return (g,) if shared else (g, min(r, peer), max(r, peer))

    for r, acts in enumerate(lists):
        for a in acts:
            if (msg := needs(a, r, p, last)) is not None:
                g, peer = group(msg, p), msg.src % p
                queues.setdefault((r, comm(g, r, peer)), deque()).append(("recv", msg, peer, None))
        for i, a in enumerate(acts):
            if (msg := makes(a, r, p, last)) is not None:
                g, peer = group(msg, p), msg.dst % p
                queues.setdefault((r, comm(g, r, peer)), deque()).append(("send", msg, peer, i))
    done = [0] * p  # actions each rank has run
    arrived: set[tuple[int, Message]] = set()
    moved = True
    while moved:
        moved = False
        for (r, c), q in queues.items():
            if not q or q[0][0] != "send" or q[0][3] >= done[r]:
                continue  # only a send whose data exists can start a pair
            peer = q[0][2]
            other = queues.get((peer, c))
            if not other or other[0][0] != "recv" or other[0][2] != r:
                continue
            if other[0][1] != q[0][1]:
                return (f"group {c[0]}: rank {r} sends {tuple(q[0][1])} to rank {peer}, whose receive "
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
    return f"deadlock: rank {left[0][0]} still has operations on group {left[0][1][0]}" if left else None
