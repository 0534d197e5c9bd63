"""DeepSpeed's PipelineEngine: what a pipeline stage keeps per in-flight micro-batch, at each moment (CPU gloo ranks).

    python bench/ds_pipe_buffers.py --m 1 2 4 8 --stages 2 3 4 --bf16 [--json tests/data/ds-pipe-buffers.json]

Trains the distributed harness's model (``memform.validation.distributed.BASE``: Llama-style, h64 s32 b2,
vocabulary 256, one decoder per stage; here with the fused SwiGLU stand-in, the Megatron-style kernel the
profile's ``deepspeed.modeling: plain`` assumes) as a DeepSpeed ``PipelineModule`` of ``--stages`` pieces
(:class:`memform.validation.dist_models.Piece`: embedding + block 0; block i; last block + final norm + head)
on as many gloo ranks: ``deepspeed.initialize`` and ``engine.train_batch`` with ``m`` micro-batches
(TrainSchedule, the client torch AdamW) -- fp32 at ZeRO 0, and with ``--bf16`` also bf16 with ZeRO-1 and fp32
gradient accumulation (BF16_Optimizer, BLOOM's set-up). Two steps are traced from before the first, as the
distributed harness traces torch's schedules (``Trace``: every storage the steps create, less the
parameters' gradients, the optimizer's states and master partitions and the persistent receive buffers).
Per rank it prints, next to memform's estimate of the same job under ``training.framework: deepspeed``
(:func:`job_config`), the activation-side bytes live at each moment of the second step: when its first
``BackwardPass`` starts (the end of warm-up: moment ``warmup``), their peak (the schedule's activations; the
fused stand-ins' row-block temporaries, ``torch_models._by_rows``, which a fused kernel keeps in registers,
are tagged and left out, ``activations_peak_raw`` keeps them), when ``OptimizerStep`` starts (moment
``step``) and, bf16, inside BF16_Optimizer's ``update_hp_grads`` (moment ``hp_grads``) and inside ``ReduceGrads``
(moment ``reduce``: the bf16 copy of its flat gradient buffer, layer quantity ``after_bwd``); also what
``engine.pipe_buffers`` holds at the end of warm-up, the receive buffers (runtime ``ds_pipe_p2p``) and what
stays alive between the steps.

What DeepSpeed 0.19.8 keeps (``deepspeed/runtime/pipe/engine.py``): ``_exec_recv_activations`` stores the
received activation (``pipe_recv_buf.clone()``, a leaf requiring grad) in ``pipe_buffers['inputs']`` and
``_exec_forward_pass`` runs the stage on a further ``clone()`` of it; the stage output stays in
``pipe_buffers['outputs']`` until ``_exec_backward_pass`` sets it to None; the input (and the gradient
backward writes into it) until ``_exec_send_grads``. On the last stage ``_exec_backward_pass`` returns
after ``backward(self.loss)`` without clearing ``pipe_buffers['outputs']``: the logits, and through their
graph the micro-batch's input and input gradient, stay in their buffer slot until a later micro-batch's
forward overwrites it (``TrainSchedule.num_pipe_buffers``: ``max(2, min(stages - stage_id,
micro_batches))`` slots) -- also through the optimizer step. The first stage keeps a clone of each slot's
token ids. Both receive buffers come from one ``_grad_layer_buf`` per tensor position. Recorded in
``formulas/frameworks/deepspeed.mf`` (``ds_pipe_kept``, ``ds_pipe_stale``, ``ds_ids``, ``ds_step_stale``,
moments ``step``, ``hp_grads`` and ``reduce``, runtime ``ds_pipe_p2p``); ``tests/test_framework_deepspeed.py`` holds
memform to the recorded rows. ``MEMFORM_DS_DEBUG=1`` also prints each rank's live bytes by op and per
instruction.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def POINT(world: int = 2, bf16: bool = False):  # noqa: ANN201, N802 - the harness's point, fused SwiGLU (Megatron-style)
    """One decoder per stage (the harness's L2 at 2 stages, L``world`` beyond); fp32, or bf16 parameters with
    fp32 gradients and master weights (``bf16``: BF16_Optimizer, below)."""
    from memform.validation.distributed import BASE

    return replace(BASE, swiglu_impl="fused", L=max(2, world), precision="bf16-mixed" if bf16 else "fp32")


def job_config(m: int, world: int = 2, bf16: bool = False) -> dict:
    """memform's config of the job the ranks run (``bf16``: ZeRO-1 with fp32 gradient accumulation, which
    DeepSpeed runs with BF16_Optimizer: frameworks/deepspeed.mf grad_mem, keep_lp_grads)."""
    cfg = POINT(world, bf16).config()
    cfg["name"] = f"ds-pipe-p{world}-m{m}" + ("-bf16" if bf16 else "")
    cfg["training"].update(framework="deepspeed", num_micro_batches=m)
    cfg["parallel"].update(pp=world, zero=1 if bf16 else 0)
    cfg["deepspeed"] = {"modeling": "plain", **({"keep_lp_grads": True} if bf16 else {})}
    return cfg


def _measure(item: dict, rank: int, world: int) -> dict:
    os.environ.update(DS_ACCELERATOR="cpu", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    import importlib

    import deepspeed
    import torch
    from deepspeed.pipe import PipelineModule
    from deepspeed.utils import logger

    from memform.validation.dist_models import pieces, pipeline_loss
    from memform.validation.distributed import Case, Trace, _model, _nbytes, _opt_states, _storages
    from memform.validation.torch_models import build

    logger.setLevel(logging.ERROR)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed("gloo")
    m, bf16 = item["m"], item.get("bf16", False)
    point = POINT(world, bf16)
    case = Case("1f1b", world=world, point=point, m=m)
    # (bf16: built in bf16, buffers too -- DeepSpeed casts the parameters only, RoPE's cos/sin would stay fp32)
    parts = pieces(_model(case) if not bf16 else build(point.config(), torch.bfloat16, seed=0), world)
    module = PipelineModule(layers=parts, num_stages=world, loss_fn=pipeline_loss, partition_method="uniform")
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3, foreach=False)
    b = point.b
    cfg = {"train_micro_batch_size_per_gpu": b, "gradient_accumulation_steps": m, "train_batch_size": b * m,
           "zero_optimization": {"stage": 0}, "steps_per_print": 10 ** 9, "zero_allow_untested_optimizer": True}
    if bf16:   # engine.py: bf16 + ZeRO-1 + fp32 accumulation is BF16_Optimizer (BLOOM's "z0 ... zero stage 1 equivalent")
        cfg.update(bf16={"enabled": True}, zero_optimization={"stage": 1}, data_types={"grad_accum_dtype": "fp32"})
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=opt, config=cfg)
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, point.vocab, (b, point.s), generator=gen),
                torch.randint(0, point.vocab, (b, point.s), generator=gen)) for _ in range(m)]
    params = list(engine.module.parameters())
    ids = [t for pair in batches for t in pair]
    # two steps traced from before the first: what the second step holds includes what the first left in
    # the engine's buffers (the last stage's stale slot); the optimizer's states and the persistent receive
    # buffers, made in the first step, are tagged after it
    trace = Trace(_storages([*params, *engine.module.buffers(), *ids]))
    # the fused kernels' stand-ins (torch_models._by_rows: the SwiGLU's and RMSNorm's backward, row block by
    # row block) make FUSED_ROWS-row fp32 temporaries that a fused kernel keeps in registers: tagged, so that
    # the peak is read with and without them ("activations_peak" without, "activations_peak_raw" with)
    from memform.validation import torch_models

    by_rows = torch_models._by_rows

    def tagged_rows(fn, out, *inputs, _orig=by_rows):  # noqa: ANN001, ANN202
        first = trace._next
        _orig(fn, out, *inputs)
        for serial in range(first, trace._next):
            trace.tags.setdefault(serial, "fused_tmp")
    torch_models._by_rows = tagged_rows
    # BF16_Optimizer.update_hp_grads, after each micro-batch's backward (pipe/engine.py _exec_backward_pass):
    # hp_grad.add_(lp.grad.to(fp32)) parameter by parameter (bf16_optimizer.py _update_hp_grad); its windows
    windows: list[tuple[int, int]] = []
    if hasattr(engine.optimizer, "update_hp_grads"):
        update = engine.optimizer.update_hp_grads

        def hp_grads(*a, _orig=update, **k):  # noqa: ANN002, ANN003, ANN202
            trace.tag([q.grad for q in params], "grad")   # the bf16 .grad, kept (deepspeed.keep_lp_grads)
            trace.sample()
            first = len(trace.samples) - 1
            out = _orig(*a, **k)
            trace.sample()
            if "step2" in trace.marks:
                windows.append((first, len(trace.samples)))
            return out
        engine.optimizer.update_hp_grads = hp_grads
    held: dict[str, int] = {}
    from deepspeed.runtime.pipe import schedule

    timeline: list[tuple[str, int]] = []

    def instr(name, orig):  # noqa: ANN001, ANN202 - each instruction, sampled after it (the timeline)
        def run(self, *a, **k):  # noqa: ANN001, ANN202
            if name == "OptimizerStep":   # the accumulated gradients, before the step frees them (zero_grad)
                trace.tag([q.grad for q in params], "grad")
                if "step2" in trace.marks:    # what the pipe buffers hold when optimizer.step() runs
                    trace.sample()
                    trace.mark("step")
            out = orig(self, *a, **k)
            trace.sample()
            timeline.append((f"{name}{k.get('buffer_id', '')}", len(trace.samples) - 1))
            return out
        return run

    imap = {cls: instr(cls.__name__, fn) for cls, fn in type(engine)._INSTRUCTION_MAP.items()}
    orig = imap[schedule.BackwardPass]

    def backward(self, buffer_id, _orig=orig):  # noqa: ANN001, ANN202
        if "step2" in trace.marks and "warmup" not in trace.marks:
            trace.sample()
            trace.mark("warmup")
            for key, slots in engine.pipe_buffers.items():
                held[key] = _nbytes(t for s in slots if s is not None
                                    for t in (s if isinstance(s, (tuple, list)) else (s,))
                                    if isinstance(t, torch.Tensor) and t.is_floating_point())
        return _orig(self, buffer_id=buffer_id)

    # (_exec_schedule binds the class's _INSTRUCTION_MAP entry to the engine: an instance map overrides it)
    engine._INSTRUCTION_MAP = {**imap, schedule.BackwardPass: backward}
    with trace.mode:
        engine.train_batch(iter(batches))      # the first step: the optimizer's states, receive buffers
        gc.collect()
        trace.sample()
        first = len(timeline)
        trace.mark("step2")
        engine.train_batch(iter(batches))
        trace.sample()
    persistent = [t for t in (engine.pipe_recv_buf, engine.grad_layer, engine.meta_buffer,
                              *engine._grad_layer_buf) if isinstance(t, torch.Tensor)]
    # (BF16_Optimizer: its fp32 master partitions and gradient buffers too, made before the trace and first seen
    # as an op's output in it)
    wrapped = engine.optimizer
    trace.tag([*_opt_states(opt), *_opt_states(getattr(wrapped, "optimizer", opt)),
               *getattr(wrapped, "fp32_groups_flat_partition", ()), *getattr(wrapped, "fp32_groups_gradients_flat", ())],
              "optimizer")
    trace.tag(persistent, "comm")
    torch_models._by_rows = by_rows
    act = lambda s: s not in trace.tags  # noqa: E731
    raw = lambda s: trace.tags.get(s, "fused_tmp") == "fused_tmp"  # noqa: E731
    last = trace.samples[-1]
    alive_end = sorted(((trace.op_of.get(sr), n) for sr, n in last if act(sr)), key=lambda x: -x[1])[:8]
    warm, step = trace.marks["warmup"], trace.marks["step"]
    peak, at = trace.peak(act, start=trace.marks["step2"])
    timeline = timeline[first:]
    # inside ReduceGrads (the data-parallel all-reduce after the last backward): every op's sample between the
    # instruction before it and its end. BF16_Optimizer's: engine.py _bf16_reduce_grads -> buffered_allreduce_fallback
    # of its flat fp32 gradient buffer, whose allreduce_bucket flattens it (one tensor: a view) and copies it whole
    # to the communication dtype (bf16): deepspeed.mf moment reduce, layer quantity after_bwd
    ends = {name: i for name, i in timeline}
    before = max((i for name, i in timeline if i < ends.get("ReduceGrads", -1)), default=-1)
    reduce = max((trace.at(i, act) for i in range(before + 1, ends.get("ReduceGrads", -1) + 1)), default=0)
    return {"activations": trace.at(warm, act), "activations_peak": peak,
            "activations_peak_raw": trace.peak(raw, start=trace.marks["step2"])[0],
            "step": trace.at(step, act), "between_steps": trace.at(trace.marks["step2"], act),
            "hp_grads": max((trace.at(i, act) for a, b in windows for i in range(a, b)), default=0),
            "reduce": reduce,
            "pipe_buffers": held, "persistent": _nbytes(persistent), "slots": engine.num_pipe_buffers,
            "warmup_by_op": trace.by_op(warm, act), "peak_by_op": trace.by_op(at, act),
            "step_by_op": trace.by_op(step, act),
            "timeline": [(a, trace.at(i, act)) for a, i in timeline],
            "peak_after": next((a for a, i in timeline if i >= at), "end"), "alive_end": alive_end}


def _row(world: int, m: int, rank: int, r: dict, st, bf16: bool = False) -> dict:  # noqa: ANN001
    """One rank's measured columns beside memform's, printed."""
    row = {"stages": world, "m": m, "rank": rank, "bf16": bf16,
           **{k: r[k] for k in ("activations", "activations_peak", "activations_peak_raw", "step", "hp_grads", "reduce",
                                "pipe_buffers", "persistent", "slots", "between_steps")},
           "est_activations": int(st.moments.get("warmup", st.values["activations"])),
           "est_activations_peak": int(st.values["activations"]),
           "est_step": int(st.moments.get("step", 0)),
           "est_hp_grads": int(st.moments.get("hp_grads", 0)),
           "est_reduce": int(st.moments.get("reduce", 0)),
           "est_persistent": int(st.runtime.get("ds_pipe_p2p", 0))}
    err = lambda k: (row[f"est_{k}"] - row[k]) / max(1, row[k]) * 100  # noqa: E731
    if bf16:
        print(f"p{world} m{m} bf16 rank {rank}: in update_hp_grads {row['hp_grads'] / 1024:.1f} / "
              f"{row['est_hp_grads'] / 1024:.1f} KiB ({err('hp_grads'):+.2f} %), in ReduceGrads "
              f"{row['reduce'] / 1024:.1f} / {row['est_reduce'] / 1024:.1f} KiB ({row['reduce'] - row['est_reduce']} B "
              f"more measured); ", end="")
    print(f"p{world} m{m} rank {rank}: warm-up {row['activations'] / 1024:.1f} / {row['est_activations'] / 1024:.1f}"
          f" KiB ({err('activations'):+.2f} %), peak {row['activations_peak'] / 1024:.1f} / "
          f"{row['est_activations_peak'] / 1024:.1f} KiB ({err('activations_peak'):+.2f} %; with the fused stand-ins' "
          f"row temporaries {row['activations_peak_raw'] / 1024:.1f}), at optimizer.step() {row['step'] / 1024:.1f} / "
          f"{row['est_step'] / 1024:.1f} KiB; at warm-up's end pipe_buffers hold "
          f"{', '.join(f'{k} {v / 1024:.1f}' for k, v in r['pipe_buffers'].items())} KiB ({r['slots']} slots); "
          f"receive buffers {r['persistent'] / 1024:.1f} / {row['est_persistent'] / 1024:.1f} KiB; held between "
          f"steps {r['between_steps'] / 1024:.1f} KiB")
    if os.environ.get("MEMFORM_DS_DEBUG"):
        print("   warmup_by_op", r["warmup_by_op"], "\n   peak_by_op", r["peak_by_op"], "\n   step_by_op",
              r["step_by_op"], "\n   timeline", r["timeline"], "peak after", r["peak_after"],
              "\n   alive at the end", r["alive_end"])
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, nargs="*", default=[4], help="micro-batches per step (one job each)")
    ap.add_argument("--stages", type=int, nargs="*", default=[2],
                    help="pipeline stages (gloo ranks), one decoder each; every --m is run at each")
    ap.add_argument("--bf16", action="store_true",
                    help="also run each job in bf16 with ZeRO-1 and fp32 gradient accumulation (BF16_Optimizer): its "
                         "update_hp_grads moment (rows with bf16: true)")
    ap.add_argument("--json", type=Path, help="also write the rows to PATH")
    args = ap.parse_args()
    import memform
    from memform.validation import ranks

    rows = []
    for world in args.stages:
        items = [{"m": m, "bf16": bf16} for bf16 in ([False, True] if args.bf16 else [False]) for m in args.m]
        results = ranks.spawn(world, _measure, items, prefix="memform-dspipe-")
        for item, per_rank in zip(items, results):
            est = memform.estimate(job_config(item["m"], world, item["bf16"]))
            for rank, r in enumerate(per_rank):
                rows.append(_row(world, item["m"], rank, r, est.stages[rank], item["bf16"]))
    if args.json:   # (tests/data/ds-pipe-buffers.json: the measured columns are what the tests hold memform to)
        import deepspeed
        import torch

        args.json.write_text(json.dumps({
            "command": "python bench/ds_pipe_buffers.py " + " ".join(sys.argv[1:]),
            "deepspeed": deepspeed.__version__, "torch": torch.__version__.split("+")[0],
            "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
