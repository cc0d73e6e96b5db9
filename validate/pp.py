"""Pipeline parallelism: one rank runs exactly its action list from sim/schedules.py.

The simulator and the runner execute the same artefact: ``make_schedule(plan.schedule,
p, m, v)[stage]``, a list of (chunk, F|B, microbatch). Chunk c on stage r is virtual
stage k = c * p + r; F of k > 0 receives its input from the rank of k - 1, B of
k < p*v - 1 receives its output gradient from the rank of k + 1.

Sends are non-blocking (isend) and receives block only when the action needs the data,
so no rank ever waits on a send: the exchange cannot deadlock when the schedule itself
is deadlock-free, which sim/schedules.list_schedule_makespan checks for every schedule.
Messages between the same two ranks are told apart by tag (direction, virtual stage,
microbatch), so their order on the wire does not matter.

Every receive of the step is posted before the step's first action. On NCCL, which
ignores tags and matches a pair's messages by order, that is safe because every pipeline
edge and direction has a process group of its own (validate/p2p_order.py: group_of, and a
replay of every schedule shape under NCCL's rules in tests/test_p2p_order.py). gloo's
TCP pairs are a
rendezvous (gloo/transport/tcp/pair.cc: a send waits in localPendingSend_ until the
peer's NOTIFY_RECV_READY), so a receive posted after its send has to wake the sender's
transport thread; on a host whose cores are all computing, that thread's event loop then
spins on a pair lock held by a descheduled thread (Pair::handleEvents skips a pair it
cannot try_lock, and the level-triggered epoll hands it back at once) until a scheduler
tick. Measured here (2026-12-01, tiny model, pp=2, four to six launches each): receives
posted as the actions reach them, GPipe 74-89 ms and 1F1B 63-90 ms a step, GPipe's
backward either keeping pace or locked to the 4 ms tick; every receive posted at the
start, GPipe 58-64 ms and 1F1B 55-62 ms. Posted first, a message is written by the
sender's own isend call into the waiting buffer, as a GPU pipeline's matched send and
receive proceed without either side's host. Activations and gradients also travel on
process groups of their own (pipeline_groups), so that a message arriving while the
receiving rank writes one the other way does not meet the same pair's lock
(docs/validation-cpu.md, mechanism 21).

Timing categories: time blocked in a receive is ``bubble`` (waiting for the pipeline
neighbour, including the transfer itself, which the host cannot separate); the time to
post a send and to wait for sends still in flight at the end of the step is ``pp``.
"""
from __future__ import annotations

from sim.schedules import Action, make_schedule
from validate.p2p_order import Message, group_of
from validate.timeline import Recorder


class PipelineStage:
    """This rank's chunks and its neighbours on the pipeline.

    chunks: {chunk index: GPTChunk}; peer(stage) -> global rank of that pipeline stage
    with this rank's DP and TP coordinates; act_shape: activation shape [mbs, s, h]
    passed between stages (s split by tp under sequence parallelism)."""

    def __init__(self, stage: int, p: int, v: int, chunks: dict, peer, act_shape, rec: Recorder,
                 reducer, device, groups: dict | None = None):
        self.stage, self.p, self.v = stage, p, v
        # {group name: process group}, one per pipeline edge and direction
        # (pipeline_groups); None: the default group for everything.
        self.groups = groups or {}
        self.chunks, self.peer, self.act_shape = chunks, peer, tuple(act_shape)
        self.rec, self.reducer, self.device = rec, reducer, device
        self.last_vstage = p * v - 1

    def actions(self, schedule: str, m: int) -> list[Action]:
        return make_schedule(schedule, self.p, m, self.v)[self.stage]

    def _group(self, msg: Message):
        """The process group ``msg`` travels on (validate/p2p_order.group_of; None: the
        default group, when the runner made none: a one-stage pipeline)."""
        return self.groups.get(group_of(msg, self.p))

    def _tag(self, kind: str, vstage: int, mb: int, m: int) -> int:
        return ((0 if kind == "F" else 1) * (self.last_vstage + 1) + vstage) * m + mb

    def run(self, acts: list[Action], microbatches: list[tuple], loss_scale: float) -> float:
        """Execute ``acts``; microbatches[i] = (input ids, target ids). Returns the sum
        of the scaled losses this rank computed (nonzero only on the last virtual stage)."""
        import torch
        import torch.distributed as dist
        rec, m = self.rec, len(microbatches)
        last_b = {}
        for i, a in enumerate(acts):
            if a.kind == "B":
                last_b[a.chunk] = i
        held: dict[tuple[int, int], tuple] = {}
        sends: list[list] = []  # [work, start_s, label]
        loss_sum = 0.0

        def send(t, dst_vstage: int, kind: str, mb: int, label: str):
            with rec.span("pp", "pp_send", f"send {label}"):
                t = t.contiguous()
                msg = Message(kind, dst_vstage + (1 if kind == "B" else -1), dst_vstage, mb)
                w = dist.isend(t, self.peer(dst_vstage % self.p), group=self._group(msg),
                               tag=self._tag(kind, dst_vstage, mb, m))
            rec.sent("pp", t.numel() * t.element_size())
            sends.append([w, rec.now(), f"send {label}", t])

        # Every receive this rank's actions need, posted now (module docstring): the key is
        # (source virtual stage, kind, this virtual stage, microbatch).
        posted: dict[tuple[int, str, int, int], tuple] = {}
        for a in acts:
            k = a.chunk * self.p + self.stage
            src = k - 1 if a.kind == "F" else k + 1
            if 0 <= src <= self.last_vstage:
                buf = torch.empty(self.act_shape, device=self.device)
                work = dist.irecv(buf, self.peer(src % self.p), group=self._group(Message(a.kind, src, k, a.mb)),
                                  tag=self._tag(a.kind, k, a.mb, m))
                posted[(src, a.kind, k, a.mb)] = (buf, work)

        def recv(src_vstage: int, kind: str, dst_vstage: int, mb: int, label: str):
            buf, work = posted.pop((src_vstage, kind, dst_vstage, mb))
            with rec.span("bubble", "pp_wait", f"wait {label}"):
                work.wait()
            return buf

        def close_sends(block: bool):
            for s in list(sends):
                w = s[0]
                if block and not w.is_completed():
                    with rec.span("pp", "pp_send", f"wait {s[2]}"):
                        w.wait()
                if block or w.is_completed():
                    rec.segment("pp", "send", s[1], rec.now(), s[2])
                    sends.remove(s)

        for i, a in enumerate(acts):
            k = a.chunk * self.p + self.stage
            chunk = self.chunks[a.chunk]
            tokens, targets = microbatches[a.mb]
            if a.kind == "F":
                if k == 0:
                    inp = tokens
                else:
                    inp = recv(k - 1, "F", k, a.mb, f"act {a}").requires_grad_()
                with rec.span("compute", "forward", str(a)):
                    out = chunk.forward(inp, targets if k == self.last_vstage else None, loss_scale)
                held[(a.chunk, a.mb)] = (inp, out)
                if k == self.last_vstage:
                    loss_sum += float(out.detach())
                else:
                    send(out.detach(), k + 1, "F", a.mb, str(a))
            else:
                inp, out = held.pop((a.chunk, a.mb))
                if i == last_b[a.chunk]:
                    self.reducer.final.add(a.chunk)  # this backward completes the chunk's grads
                if k == self.last_vstage:
                    with rec.span("compute", "backward", str(a)):
                        out.backward()
                else:
                    grad = recv(k + 1, "B", k, a.mb, f"grad {a}")
                    with rec.span("compute", "backward", str(a)):
                        out.backward(grad)
                if k > 0:
                    send(inp.grad, k - 1, "B", a.mb, str(a))
            close_sends(block=False)
        close_sends(block=True)
        return loss_sum


def pipeline_groups(pipelines: list[list[int]], rank: int, interleaved: bool = False, device=None) -> dict | None:
    """{group name: process group} of the pipeline holding ``rank`` (None if none): a
    two-rank group for every edge and direction of each pipeline (validate/p2p_order:
    pipeline_edges names them, group_of picks one for a message), activations from stage r
    to r+1, gradients back, and when ``interleaved`` the wrap-around messages between the
    last stage and the first. On each group a rank then only sends or only receives, which
    NCCL, matching messages by order, needs (p2p_order's module doc). Collective over the
    whole world: every rank creates every group, in the same order.

    gloo needs the directions apart too: its TCP pair serialises its socket under one
    lock, and the transport thread that reads a message only try-locks it
    (gloo/transport/tcp/pair.cc, Pair::handleEvents: "attempt to lock the pair and skip
    handling the events until the next tick"). In 1F1B's steady state the two neighbours
    send to each other at once, so a message arriving on the very pair whose lock the
    receiving rank's isend holds makes its transport thread spin on the level-triggered
    event, taking the core from the thread that holds the lock. Measured here (2026-12-01,
    tiny, pp=2 1F1B, receives posted first, one pair): isend calls of 3-5 ms on both ranks
    at the same instant, where one usually takes 0.06-0.1 ms; with a pair per direction
    an arriving message never waits on the lock of a pair the receiving rank is writing,
    as two NCCL peers' send and receive proceed without each other's host. (A two-stage
    interleaved pipeline of tiny: 81-82 ms a step with its wrap-around messages apart,
    86 ms with them on the same groups, 2026-12-04.)"""
    import torch
    import torch.distributed as dist
    from validate.p2p_order import pipeline_edges
    mine = None
    made = []
    for ranks in pipelines:
        gs = {name: dist.new_group(sorted((ranks[a], ranks[b]))) for name, a, b in
              pipeline_edges(len(ranks), interleaved)}
        made.append((ranks, gs))
        if rank in ranks:
            mine = gs
    # One blocking message on every group before any step, every rank taking the groups in
    # the same order (so the first unfinished one always has both its ranks at it). NCCL
    # sets a group's communicator up at its first call, with both ranks inside it; the
    # step's first calls are receives posted on different groups by the two neighbours
    # (stage 0 on the gradients', stage 1 on the activations'), each waiting in a set-up
    # the other never joins. On gloo it is one small message per group.
    token = torch.zeros(1, device=device)
    for ranks, gs in made:
        for name, a, b in pipeline_edges(len(ranks), interleaved):
            if rank == ranks[a]:
                dist.send(token, ranks[b], group=gs[name])
            elif rank == ranks[b]:
                dist.recv(token, ranks[a], group=gs[name])
    return mine
