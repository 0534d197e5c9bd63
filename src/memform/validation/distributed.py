"""memform's parallel terms against multi-process PyTorch training steps (gloo ranks on loopback).

Every case spawns ``world`` processes (2-4) with ``torch.multiprocessing``, each running the harness model
(:mod:`.torch_models`, fp32, the same seed on every rank) under one parallel strategy of torch's own:

- ``ddp``: ``DistributedDataParallel`` (bucketed gradient all-reduce, ``gradient_as_bucket_view`` off);
- ``zero1``: DDP + ``ZeroRedundancyOptimizer`` over AdamW (optimizer states sharded by parameter);
- ``fsdp``: FSDP2 ``fully_shard`` with ``reshard_after_forward`` true and false (:mod:`.fsdp2`, bf16 mixed);
- ``tp`` / ``tp+sp``: DTensor ``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel``
  (torchtitan's plan), + ``SequenceParallel`` norms;
- ``ep``: one expert per rank, tokens dispatched and combined with autograd ``all_to_all_single``;
- ``1f1b``, ``gpipe``, ``interleaved``, ``zbv``, ``dualpipev``: ``torch.distributed.pipelining`` schedules
  (``Schedule1F1B``, ``ScheduleGPipe``, ``ScheduleInterleaved1F1B``, ``ScheduleZBVZeroBubble``,
  ``ScheduleDualPipeV``) over p = 2-4 stages (ranks) and m >= 2p micro-batches.

Each rank runs one untraced step (DDP rebuilds its buckets, the optimizer creates its states, the pipeline
allocates its receive buffers), then a traced one, and measures, with the harness's storage accounting
(a dispatch mode that records every storage an ATen op creates and samples the live bytes after each op):

- params, grads (``.grad``; DDP: + its bucket buffers), optimizer (the state tensors after the step);
- activations: the activation-side bytes live at the end of warm-up -- after forward (no pipeline), or
  when the rank's first backward starts (pipeline);
- activations_peak: their largest sum over the step (pipeline: ``--explain`` prints the bytes after every
  schedule action, ``timeline``, and the action the peak follows, ``peak_after``);
- comm: the communication buffers: the largest layer's all-to-all dispatch + combine outputs (ep: they
  are also the activations the expert and the weighting keep), DTensor collectives' outputs that forward
  did not keep (tp, tp+sp: an all-gathered input a GEMM keeps is an activation), the pipeline's receive
  buffers (persistent between steps) plus the tensors its sends hold (the schedules on
  ``_PipelineScheduleRuntime`` wait for their sends only at the end of the step), FSDP2's buffers
  (:mod:`.fsdp2`). DDP's buckets are persistent and counted in grads, as the profile does.

The memform side is :meth:`Case.config`: the same model and strategy with ``training.framework: torch``
(``formulas/frameworks/torch.mf``) and, for a pipeline, ``parallel.pp_schedule`` set to the torch
schedule's block (``formulas/schedules.mf``). Rank r is compared with memform's stage r (pipeline) or
stage 0. Needs the ``validate`` extra (CPU PyTorch).
"""

from __future__ import annotations

import gc
import math
import traceback
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from . import ranks
from .compare import Point, relative_error
from .samples import StorageSamples

#: largest |relative error| per category, each set just above the precision the whole sweep achieves, so
#: that a formula error larger than that fails (issue 17): `python bench/validate.py --distributed`
#: (24 cases, 67 rank rows, torch 2.13 on the CPU, 2026-12-03) measured max |error| params 0.000 %,
#: grads 0.000 %, optimizer 1.494 % (zero1 n4, rank 3), activations
#: 0.832 % (ep n4), activations_peak 4.721 % (1f1b p4 m8 rank 2), comm 12.000 % (dualpipev p2 m4, both
#: ranks; every other row 0.000 %); the quick sweep's ep n2 case (tests/test_distributed.py) measures
#: activations -3.9 % on rank 0, so activations allow 4.5 %
THRESHOLDS: dict[str, float] = {"params": 0.001, "grads": 0.001, "optimizer": 0.016, "activations": 0.045,
                                "activations_peak": 0.05, "comm": 0.125}
CATEGORIES = tuple(THRESHOLDS)
TITLES = {"activations_peak": "act.peak", "activations": "act", "optimizer": "optim"}

#: the torch pipelining schedule class and memform schedule block of each pipeline case
SCHEDULES: dict[str, tuple[str, str]] = {
    "1f1b": ("Schedule1F1B", "torch-1f1b"),
    "gpipe": ("ScheduleGPipe", "torch-gpipe"),
    "interleaved": ("ScheduleInterleaved1F1B", "torch-interleaved"),
    "zbv": ("ScheduleZBVZeroBubble", "torch-zbv"),
    "dualpipev": ("ScheduleDualPipeV", "torch-dualpipev"),
}
KINDS = ("ddp", "zero1", "fsdp", "tp", "tp+sp", "ep", "cp", *SCHEDULES)

#: what cannot run on a CPU build, with the reason (reported, never skipped silently)
UNSUPPORTED: dict[str, str] = {
    "cp": "torch.distributed.tensor.experimental.context_parallel has no sharding strategy for the CPU "
          "attention kernel (aten._scaled_dot_product_flash_attention_for_cpu): NotImplementedError on torch 2.13",
}

#: the base shape: Llama-style, flash attention (SDPA), eager SwiGLU (separate gate/up: TP-shardable)
BASE = Point(b=2, s=32, L=2, h=64, head_dim=16, vocab=256, swiglu_impl="eager", precision="fp32")


@dataclass(frozen=True)
class Case:
    """One distributed case: strategy ``kind`` over ``world`` ranks on model ``point``."""

    kind: str
    world: int = 2
    point: Point = BASE
    m: int = 0              # pipeline micro-batches (default 2·world)
    vp: int = 1             # pipeline chunks per rank (interleaved: 2; V schedules: always 2)
    reshard: bool = True    # fsdp: reshard_after_forward

    @property
    def micro_batches(self) -> int:
        return self.m or 2 * self.world

    @property
    def chunks(self) -> int:
        return 2 if self.kind in ("zbv", "dualpipev") else (self.vp if self.kind == "interleaved" else 1)

    def label(self) -> str:
        p = self.point
        extra = ""
        if self.kind in SCHEDULES:
            extra = f" p{self.world} m{self.micro_batches}" + (f" v{self.chunks}" if self.chunks > 1 else "")
        elif self.kind == "fsdp":
            extra = f" raf={str(self.reshard).lower()}"
        else:
            extra = f" n{self.world}"
        return f"{self.kind}{extra} L{p.L} h{p.h} s{p.s} b{p.b}" + (f" e{p.experts}" if p.experts > 1 else "")

    def config(self) -> dict[str, Any]:
        """The memform config of what the workers run."""
        if self.kind == "fsdp":
            return self.fsdp_case().config()
        cfg = self.point.config()
        cfg["name"] = "dist-" + self.label().replace(" ", "-").replace("=", "")
        cfg["training"]["framework"] = "torch"
        par = cfg["parallel"]
        par["pp_schedule"] = "torch-1f1b"   # one stage: the torch profile's backward moment
        if self.kind in ("ddp", "zero1"):
            par["dp"] = self.world
            if self.kind == "zero1":
                par["zero"] = 1
        elif self.kind in ("tp", "tp+sp"):
            par["tp"] = self.world
            par["sequence_parallel"] = self.kind == "tp+sp"
            # torch's loss_parallel keeps the log-softmax shard and writes one gradient of its size (no second
            # s·b·v/t one as eager F.cross_entropy's backward): memform's vocab-parallel ("fused") loss
            cfg["model"]["cross_entropy"] = "fused"
        elif self.kind == "ep":
            par.update(dp=self.world, ep=self.world, expert_tp=1)
            cfg["torch"] = {"ddp": False}   # the dense weights are replicated, not wrapped in DDP
        elif self.kind in SCHEDULES:
            par.update(pp=self.world, vpp=self.chunks, pp_schedule=SCHEDULES[self.kind][1])
            cfg["training"]["num_micro_batches"] = self.micro_batches
        return cfg

    def fsdp_case(self):  # noqa: ANN201
        from .fsdp2 import BASE as FSDP_BASE, Case as FsdpCase

        return FsdpCase(FSDP_BASE, world=self.world, reshard=self.reshard)


def sweep() -> list[Case]:
    """What ``bench/validate.py --distributed`` runs: every strategy, pipelines over 2-4 stages."""
    moe, moe4 = _moe(2), _moe(4)
    deep = replace(BASE, L=4)
    deep8 = replace(BASE, L=8)
    cases = [Case("ddp"), Case("ddp", world=4), Case("zero1"), Case("zero1", world=4),
             Case("fsdp"), Case("fsdp", reshard=False),
             Case("tp"), Case("tp+sp"), Case("tp", world=4, point=replace(BASE, head_dim=8)),
             Case("ep", point=moe), Case("ep", world=4, point=moe4), Case("cp")]
    for kind in SCHEDULES:
        cases.append(Case(kind, world=2, point=deep, vp=2))
    cases += [Case("1f1b", world=4, point=deep), Case("gpipe", world=4, point=deep),
              Case("1f1b", world=2, m=6, point=deep), Case("interleaved", world=4, point=deep8, vp=2),
              Case("zbv", world=4, point=deep8), Case("dualpipev", world=4, point=deep8),
              # the zero-bubble cooldown (deferred W passes) with two decoders per piece, and at an odd p
              Case("zbv", world=2, point=deep8), Case("zbv", world=3, point=replace(BASE, L=6))]
    return cases


def _moe(n: int) -> Point:
    """n experts, every token routed to all of them (top-k = n: balanced dispatch on every rank, so each
    rank's share is memform's average; router imbalance is not modelled), fused SwiGLU experts."""
    return replace(BASE, experts=n, top_k=n, swiglu_impl="fused")


def quick_sweep() -> list[Case]:
    """The tests' subset: two ranks, one case per strategy family."""
    deep = replace(BASE, L=4)
    return [Case("ddp"), Case("zero1"), Case("tp+sp"), Case("ep", point=_moe(2)),
            Case("1f1b", point=deep), Case("zbv", point=deep)]


# ---- rows ------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One rank (= memform stage for a pipeline) of one case: measured and estimated bytes per category."""

    case: Case
    rank: int
    measured: dict[str, int]
    estimated: dict[str, int]
    notes: dict[str, Any] = field(default_factory=dict)

    def error(self, cat: str) -> float:
        return relative_error(self.estimated[cat], self.measured[cat])

    @property
    def key(self) -> str:
        """This row's case in :mod:`memform.validation.bounds`: the case's label and the rank."""
        return f"{self.case.label()} rank {self.rank}"

    def limits(self) -> dict[str, float]:
        """Each category's bound: the rank's own recorded agreement (:mod:`.bounds`), within THRESHOLDS."""
        from .bounds import limits
        return limits("distributed", self.key, THRESHOLDS)

    def failures(self, thresholds: dict[str, float] | None = None) -> list[str]:
        limits = thresholds or self.limits()
        return [c for c in CATEGORIES if abs(self.error(c)) > limits[c]]

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case.label(), "kind": self.case.kind, "rank": self.rank,
                "measured": self.measured, "estimated": self.estimated,
                "error": {c: self.error(c) for c in CATEGORIES}, "notes": self.notes}


def estimate(case: Case) -> list[dict[str, int]]:
    """memform's numbers per rank: stage r for a pipeline, stage 0 on every rank otherwise."""
    import memform

    est = memform.estimate(case.config())
    out = []
    for r in range(case.world):
        st = est.stages[r if case.kind in SCHEDULES else 0]
        d = {c: st.values[c] for c in ("params", "grads", "optimizer")}
        d["activations"] = st.moments.get("warmup", st.values["activations"])
        d["activations_peak"] = st.values["activations"]
        # torch's persistent pipeline buffers are the torch profile's runtime block torch_p2p
        d["comm"] = st.values["comm"] + st.runtime.get("torch_p2p", 0)
        out.append(d)
    return out


def run(cases: list[Case]) -> tuple[list[Row], list[tuple[Case, str]]]:
    """Measure and estimate ``cases``; returns the rows and the cases that could not run (with why)."""
    rows: list[Row] = []
    failed: list[tuple[Case, str]] = []
    runnable = []
    for c in cases:
        if c.kind in UNSUPPORTED:
            failed.append((c, UNSUPPORTED[c.kind]))
        else:
            runnable.append(c)
    fsdp = [c for c in runnable if c.kind == "fsdp"]
    if fsdp:
        from . import fsdp2

        for c, r in zip(fsdp, fsdp2.run([c.fsdp_case() for c in fsdp])):
            for rank, meas in enumerate(r.ranks):
                rows.append(Row(c, rank, {k: meas[k] for k in CATEGORIES}, {k: r.estimated[k] for k in CATEGORIES}))
    by_world: dict[int, list[Case]] = {}
    for c in runnable:
        if c.kind != "fsdp":
            by_world.setdefault(c.world, []).append(c)
    for world, group in by_world.items():
        for case, result in zip(group, _spawn(world, group)):
            if "error" in result[0]:
                failed.append((case, result[0]["error"]))
                continue
            est = estimate(case)
            for rank in range(world):
                rows.append(Row(case, rank, result[rank]["measured"], est[rank], result[rank].get("notes", {})))
    order = {c: i for i, c in enumerate(cases)}
    rows.sort(key=lambda r: (order[r.case], r.rank))
    return rows, failed


def _spawn(world: int, cases: list[Case]) -> list[list[dict[str, Any]]]:
    """Run ``cases`` in one process group of ``world`` ranks; per case, per rank, the worker's result."""
    return ranks.spawn(world, _measure_item, [asdict(c) for c in cases], prefix="memform-dist-")


def _case_from(d: dict[str, Any]) -> Case:
    d = dict(d)
    d["point"] = Point(**d["point"])
    return Case(**d)


def _measure_item(d: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """One case on this rank (:func:`.ranks.spawn` runs it in each rank's process); a case that fails is
    reported with its error, and the other cases still run."""
    case = _case_from(d)
    try:
        measured, notes = MEASURE[case.kind](case, rank, world)
        return {"measured": measured, "notes": notes}
    except Exception as exc:  # noqa: BLE001 - reported per case
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300],
                "trace": traceback.format_exc()[-2000:]}


# ---- the measurement (runs in each rank's process) -------------------------------------------------


class Trace(StorageSamples):
    """A dispatch mode sampling, after every ATen op, the live bytes of each storage made while active
    (:class:`.samples.StorageSamples`). A DTensor's wrapper storage reports the global size without
    holding memory: its local tensor's storage is recorded instead. Storages are tagged ``comm`` when a
    collective returns them (c10d / functional collectives) or when :meth:`tag` says so; ``grad`` by
    :meth:`tag` (the parameter gradients autograd accumulates). :meth:`mark` names a sample index.
    """

    COMM_OPS = ("all_gather", "reduce_scatter", "all_reduce", "allreduce", "alltoall", "all_to_all",
                "broadcast", "_allgather_base", "_reduce_scatter_base", "wait_tensor")
    unwrap_dtensor = True

    def __init__(self, ignore) -> None:  # noqa: ANN001
        super().__init__(ignore)
        self.marks: dict[str, int] = {}

    def _classify(self, op: str) -> str | None:
        return "comm" if any(k in op for k in self.COMM_OPS) else None

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, len(self.samples))

    def by_op(self, i: int, keep: Callable[[int], bool], limit: int | None = 12) -> dict[str, int]:
        return super().by_op(i, keep, limit)


def _model(case: Case, cfg: dict[str, Any] | None = None):  # noqa: ANN202
    import torch

    from .torch_models import build

    return build(cfg or case.point.config(), torch.float32, seed=0)


def _inputs(case: Case, rank: int, rows: int):  # noqa: ANN202
    import torch

    gen = torch.Generator().manual_seed(1 + rank)
    p = case.point
    ids = torch.randint(0, p.vocab, (rows, p.s), generator=gen)
    labels = torch.randint(0, p.vocab, (rows, p.s), generator=gen)
    return ids, labels


def _storages(tensors) -> list:  # noqa: ANN001
    from .tracker import storages_of

    return storages_of(t._local_tensor if hasattr(t, "_local_tensor") else t for t in tensors if t is not None)


def _nbytes(tensors) -> int:  # noqa: ANN001
    return sum(st.nbytes() for st in _storages(tensors))


def _opt_states(opt) -> list:  # noqa: ANN001
    import torch

    return [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]


def _plain_step(case: Case, model, opt, ids, labels, persistent_comm=(), extra_static=(),  # noqa: ANN001
                comm_tensors: Callable[[], list] | None = None, states: Callable[[], list] | None = None,
                warm: Callable[[], None] | None = None, collectives_are_activations: bool = False):
    """Two untraced steps (``warm`` runs between them), then a traced one: a non-pipeline case."""
    params = list(model.parameters())
    states = states or (lambda: _opt_states(opt))

    backward = _loss_parallel_backward if collectives_are_activations else (lambda loss: loss.backward())

    def step() -> None:
        backward(model(ids, labels))
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    if warm:
        warm()
    step()
    gc.collect()
    static = _storages([*params, *model.buffers(), ids, labels, *states(), *persistent_comm, *extra_static])
    trace = Trace(static)
    with trace.mode:
        loss = model(ids, labels)
        trace.mark("forward")
        trace.sample()
        kept = {s for s, _ in trace.samples[-1]}
        backward(loss)
        trace.sample()
        del loss
    grads = [p.grad for p in params]
    trace.tag(grads, "grad")
    if collectives_are_activations:
        # DTensor's collectives are out of place: an all-gathered input that a GEMM keeps is an activation;
        # the comm buffers are the collectives' outputs that forward did not keep (consumed and freed)
        act = lambda s: trace.tags.get(s) != "grad"  # noqa: E731
        is_comm = lambda s: trace.tags.get(s) == "comm" and s not in kept  # noqa: E731
    else:
        act = lambda s: s not in trace.tags  # noqa: E731
        is_comm = lambda s: trace.tags.get(s) == "comm"  # noqa: E731
    activations = trace.at(trace.marks["forward"], act)
    peak, at = trace.peak(act)
    comm_peak, comm_at = trace.peak(is_comm)
    measured = {"params": _nbytes(params), "grads": _nbytes(grads), "optimizer": 0,
                "activations": activations, "activations_peak": peak,
                "comm": comm_peak + sum(st.nbytes() for st in _storages(persistent_comm))}
    notes = {"peak_by_op": trace.by_op(at, act), "warmup_by_op": trace.by_op(trace.marks["forward"], act),
             "comm_by_op": trace.by_op(comm_at, is_comm)}
    opt.step()
    measured["optimizer"] = _nbytes(states())
    return measured, notes


def _measure_ddp(case: Case, rank: int, world: int):  # noqa: ANN202
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _model(case)
    ddp = DDP(model)   # bucket_cap_mb 25, gradient_as_bucket_view False: the defaults
    buckets: dict[int, Any] = {}

    def hook(state, bucket):  # noqa: ANN001, ANN202 - torch's comm hook signature
        buf = bucket.buffer()
        buckets[id(buf.untyped_storage())] = buf
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    if case.kind == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(list(model.parameters()), optimizer_class=torch.optim.AdamW, lr=1e-3,
                                      foreach=False)
        states = lambda: _opt_states(opt.optim)  # noqa: E731 - this rank's shard
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        states = None
    ids, labels = _inputs(case, rank, case.point.b)

    class Wrapped(torch.nn.Module):   # DDP's forward, the harness's parameters and buffers
        def __init__(self):
            super().__init__()
            self.inner = ddp

        def forward(self, ids, labels):  # noqa: ANN001, ANN202
            return ddp(ids, labels)

    wrapped = Wrapped()
    # DDP rebuilds its buckets in the forward after the first backward (reducer.cpp rebuild_buckets): the
    # hook's record of the first step's buckets is dropped, the second step's are the ones that stay
    measured, notes = _plain_step(case, wrapped, opt, ids, labels, states=states,
                                  persistent_comm=_BucketList(buckets), warm=buckets.clear)
    bucket_bytes = sum(st.nbytes() for st in _storages(buckets.values()))
    measured["grads"] += bucket_bytes          # the torch profile counts DDP's bucket copy with the grads
    notes["ddp_bucket_bytes"] = bucket_bytes
    measured["comm"] -= bucket_bytes           # ... not as a transient buffer: the comm column is transients
    return measured, notes


class _BucketList:
    """The DDP bucket buffers seen so far (filled by the comm hook during the untraced step)."""

    def __init__(self, buckets: dict[int, Any]):
        self.buckets = buckets

    def __iter__(self):  # noqa: ANN204
        return iter(list(self.buckets.values()))


def _measure_ep(case: Case, rank: int, world: int):  # noqa: ANN202
    import torch

    from .dist_models import expert_parallel

    model = _model(case)
    moes = expert_parallel(model, rank, world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ids, labels = _inputs(case, rank, case.point.b)

    def buffers() -> list:
        out = [t for m in moes for t in m.buffers]
        return out

    def clear() -> None:
        for m in moes:
            m.buffers.clear()

    # the all-to-all outputs are both the dispatch/combine buffers and what the expert GEMM / the
    # weighting keep: counted as activations, and their own peak is the comm column
    model(ids, labels).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    clear()
    gc.collect()
    params = list(model.parameters())
    static = _storages([*params, *model.buffers(), ids, labels, *_opt_states(opt)])
    trace = Trace(static)
    with trace.mode:
        loss = model(ids, labels)
        trace.mark("forward")
        trace.sample()
        loss.backward()
        trace.sample()
        del loss
    grads = [p.grad for p in params]
    trace.tag(grads, "grad")
    act = lambda s: trace.tags.get(s) not in ("grad",)  # noqa: E731 - the a2a buffers are activations too
    activations = trace.at(trace.marks["forward"], act)
    peak, at = trace.peak(act)
    # the largest layer's dispatch + combine buffers (both kept until its backward)
    comm = max(sum(st.nbytes() for st in _storages(m.buffers)) for m in moes)
    clear()
    opt.step()
    measured = {"params": _nbytes(params), "grads": _nbytes(grads), "optimizer": _nbytes(_opt_states(opt)),
                "activations": activations, "activations_peak": peak, "comm": comm}
    return measured, {"peak_by_op": trace.by_op(at, act), "warmup_by_op": trace.by_op(trace.marks["forward"], act)}


def _measure_tp(case: Case, rank: int, world: int):  # noqa: ANN202
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   loss_parallel, parallelize_module)

    from .dist_models import localise_attention

    sp = case.kind == "tp+sp"
    model = _model(case)
    mesh = init_device_mesh("cpu", (world,))
    # torchtitan's llama plan (torchtitan/models/llama3/parallelize.py apply_tp) with the loss parallel over
    # the vocabulary (loss_parallel, as Megatron's vocab-parallel cross-entropy). The norms run on the
    # local sequence shard as plain modules (torchtitan's SequenceParallel would make them DTensor
    # modules: the harness's fused-RMSNorm stand-in is an autograd.Function over plain tensors); their
    # weights' gradients would be all-reduced after backward, which holds no memory here.
    seq = Shard(1) if sp else Replicate()
    parallelize_module(model, mesh, {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False),
    })
    for blk in model.blocks:
        layer: dict[str, Any] = {
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(output_layouts=seq),
            "mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(),
            "mlp.down": RowwiseParallel(output_layouts=seq),
        }
        if sp:
            layer.update({m: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                use_local_output=True) for m in ("attn", "mlp")})
        parallelize_module(blk, mesh, layer)
    localise_attention(model, world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ids, labels = _inputs(case, 0, case.point.b)   # TP ranks see the same batch

    class Parallel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, ids, labels):  # noqa: ANN001, ANN202
            with loss_parallel():
                return model(ids, labels)

    return _plain_step(case, Parallel(), opt, ids, labels, collectives_are_activations=True)


def _loss_parallel_backward(loss):  # noqa: ANN001, ANN202
    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel():
        loss.backward()


def _measure_pipeline(case: Case, rank: int, world: int):  # noqa: ANN202
    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules

    from .dist_models import pieces, pipeline_loss

    p, v, m = world, case.chunks, case.micro_batches
    n = p * v
    parts = pieces(_model(case), n)
    if case.kind in ("zbv", "dualpipev"):
        idx = [rank, 2 * p - 1 - rank]
    else:
        idx = [rank + c * p for c in range(v)]
    local = [parts[i] for i in idx]
    del parts
    stages = [PipelineStage(mod, i, n, torch.device("cpu")) for mod, i in zip(local, idx)]
    cls = getattr(schedules, SCHEDULES[case.kind][0])
    sched = cls(stages if v > 1 or case.kind in ("zbv", "dualpipev") else stages[0], n_microbatches=m,
                loss_fn=pipeline_loss)
    params = [q for mod in local for q in mod.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=False)
    ids, labels = _inputs(case, 0, case.point.b * m)
    first, last = 0 in idx, n - 1 in idx

    def step() -> None:
        args = (ids,) if first else ()
        kw = {"target": labels} if last else {}
        sched.step(*args, return_outputs=False, **kw)

    step()
    opt.step()
    opt.zero_grad(set_to_none=True)
    gc.collect()

    def recv_buffers() -> list:
        out = []
        for st in stages:
            for infos in (*st.args_recv_info.values(), *st.grad_recv_info.values()):
                out += [getattr(i, "buffer", None) for i in infos]
        return [t for t in out if isinstance(t, torch.Tensor)]

    def input_grads() -> list:
        return [t.grad for t in recv_buffers() if t.grad is not None]

    persistent = recv_buffers()
    static = _storages([*params, *[b for mod in local for b in mod.buffers()], ids, labels, *_opt_states(opt),
                        *persistent])
    trace = Trace(static)
    # every action the schedule runs on this rank, with the sample after it (notes["timeline"]); the end of
    # warm-up is when the rank's first backward starts (zero-bubble schedules: the input-gradient pass I)
    actions: list[tuple[str, int]] = []
    for st in stages:
        for name, code in (("forward_one_chunk", "F"), ("backward_one_chunk", "B"),
                           ("backward_weight_one_chunk", "W")):
            orig = getattr(st, name)

            def wrapped(mb, *a, _orig=orig, _code=code, _stage=st.stage_index, **k):  # noqa: ANN001, ANN202
                if _code == "B":
                    trace.sample()
                    trace.mark("warmup")
                    if not k.get("full_backward", True):
                        _code = "I"
                out = _orig(mb, *a, **k)
                trace.sample()
                actions.append((f"{_code}{_stage}.{mb}", len(trace.samples) - 1))
                return out

            setattr(st, name, wrapped)
    runtime = isinstance(sched, schedules._PipelineScheduleRuntime)
    if runtime:
        # these schedules wait for their sends only at the end of the step (_step_microbatches: `while
        # send_ops: _wait_batch_p2p(send_ops.pop())`): every tensor sent is a send buffer until then
        orig_batch = schedules._batch_p2p

        def batch_p2p(ops, *a, **k):  # noqa: ANN001, ANN202
            trace.tag([op.tensor for op in ops if op.op is torch.distributed.isend], "comm")
            return orig_batch(ops, *a, **k)

        schedules._batch_p2p = batch_p2p
    try:
        with trace.mode:
            step()
            trace.sample()
    finally:
        if runtime:
            schedules._batch_p2p = orig_batch
    trace.tag([q.grad for q in params], "grad")
    trace.tag(input_grads(), "comm")
    act = lambda s: s not in trace.tags  # noqa: E731
    warm = trace.marks.get("warmup", -1)
    activations = trace.at(warm, act)
    peak, at = trace.peak(act)
    comm_peak, comm_at = trace.peak(lambda s: trace.tags.get(s) == "comm")
    persistent_bytes = sum(st.nbytes() for st in _storages(persistent))
    grads = [q.grad for q in params]
    measured = {"params": _nbytes(params), "grads": _nbytes(grads), "optimizer": 0,
                "activations": activations, "activations_peak": peak, "comm": persistent_bytes + comm_peak}
    notes = {"peak_by_op": trace.by_op(at, act), "warmup_by_op": trace.by_op(warm, act),
             "recv_buffer_bytes": persistent_bytes, "input_grad_peak": comm_peak,
             # activation bytes live after each action (stage index . micro-batch; I/W: zero-bubble split),
             # and the action after which the peak was sampled
             "timeline": [(a, trace.at(i, act)) for a, i in actions],
             "peak_after": next((a for a, i in actions if i >= at), "end")}
    opt.step()
    measured["optimizer"] = _nbytes(_opt_states(opt))
    return measured, notes


MEASURE: dict[str, Callable] = {"ddp": _measure_ddp, "zero1": _measure_ddp, "tp": _measure_tp,
                                "tp+sp": _measure_tp, "ep": _measure_ep,
                                **{k: _measure_pipeline for k in SCHEDULES}}


# ---- output ----------------------------------------------------------------------------------------


def format_table(rows: list[Row], failed: list[tuple[Case, str]] = (),
                 thresholds: dict[str, float] | None = None) -> str:
    """Per row: case, rank/stage, measured / estimated KiB and the error per category (``!`` = over its
    bound: ``thresholds`` where given, else the row's own, :meth:`Row.limits`)."""
    width = max([len(r.case.label()) for r in rows] + [4])
    cell = 24
    head = f"{'case':<{width}} {'rank':>4}" + "".join(
        f" | {TITLES.get(c, c) + ' KiB m/e err':>{cell}}" for c in CATEGORIES)
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = []
        limits = thresholds or r.limits()
        for c in CATEGORIES:
            flag = "!" if abs(r.error(c)) > limits[c] else " "
            err = "  n/a " if math.isinf(r.error(c)) else f"{r.error(c):+6.1%}"
            cells.append(f" | {f'{r.measured[c] / 1024:.1f}/{r.estimated[c] / 1024:.1f} {err}{flag}':>{cell}}")
        lines.append(f"{r.case.label():<{width}} {r.rank:>4}" + "".join(cells))
    lines.append("-" * len(head))
    for c, why in failed:
        lines.append(f"NOT RUN {c.label()}: {why}")
    return "\n".join(lines)


def summary(rows: list[Row], failed: list[tuple[Case, str]] = (), thresholds: dict[str, float] | None = None,
            elapsed: float | None = None) -> str:
    """The last line: cases, rows, max |error| per category, how many rows are over their bound (each its
    own recorded agreement within the suite's THRESHOLDS, or ``thresholds`` where given)."""
    cases = {r.case for r in rows}
    worst = {c: max((abs(r.error(c)) for r in rows), default=0.0) for c in CATEGORIES}
    over = sum(1 for r in rows if r.failures(thresholds))
    time = f" in {elapsed:.0f} s" if elapsed is not None else ""
    return (f"{len(cases)} cases, {len(rows)} rank rows{time}; max |error|: "
            + ", ".join(f"{TITLES.get(c, c)} {worst[c]:.1%} (≤{(thresholds or THRESHOLDS)[c]:.1%})" for c in CATEGORIES)
            + f"; {over} rows over {'threshold' if thresholds else 'their own bounds'}; {len(failed)} cases not run")
