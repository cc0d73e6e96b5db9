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

Timing categories: time blocked in a receive is ``bubble`` (waiting for the pipeline
neighbour, including the transfer itself, which the host cannot separate); the time to
post a send and to wait for sends still in flight at the end of the step is ``pp``.
"""
from __future__ import annotations

from sim.schedules import Action, make_schedule
from validate.timeline import Recorder


class PipelineStage:
    """This rank's chunks and its neighbours on the pipeline.

    chunks: {chunk index: GPTChunk}; peer(stage) -> global rank of that pipeline stage
    with this rank's DP and TP coordinates; act_shape: activation shape [mbs, s, h]
    passed between stages (s split by tp under sequence parallelism)."""

    def __init__(self, stage: int, p: int, v: int, chunks: dict, peer, act_shape, rec: Recorder,
                 reducer, device):
        self.stage, self.p, self.v = stage, p, v
        self.chunks, self.peer, self.act_shape = chunks, peer, tuple(act_shape)
        self.rec, self.reducer, self.device = rec, reducer, device
        self.last_vstage = p * v - 1

    def actions(self, schedule: str, m: int) -> list[Action]:
        return make_schedule(schedule, self.p, m, self.v)[self.stage]

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
                w = dist.isend(t, self.peer(dst_vstage % self.p), tag=self._tag(kind, dst_vstage, mb, m))
            rec.sent("pp", t.numel() * t.element_size())
            sends.append([w, rec.now(), f"send {label}", t])

        def recv(src_vstage: int, kind: str, dst_vstage: int, mb: int, label: str):
            buf = torch.empty(self.act_shape, device=self.device)
            with rec.span("bubble", "pp_wait", f"wait {label}"):
                dist.irecv(buf, self.peer(src_vstage % self.p), tag=self._tag(kind, dst_vstage, mb, m)).wait()
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
