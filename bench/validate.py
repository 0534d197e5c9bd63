#!/usr/bin/env python
"""Hold memform's estimates against real PyTorch training steps on the CPU.

    python bench/validate.py              # the whole sweep (dozens of tiny models, well under a minute)
    python bench/validate.py --quick      # the subset the test suite runs
    python bench/validate.py --amp        # PyTorch AMP (fp32 model, bf16 autocast) vs the hf-trainer profile
    python bench/validate.py --fsdp2      # FSDP2 (fully_shard, 2-4 CPU ranks over gloo) vs the fsdp2 profile
    python bench/validate.py --distributed   # DDP, ZeRO-1, FSDP2, DTensor TP/SP, EP, CP and torch's
                                          # pipeline schedules on 2-4 gloo ranks, every rank vs memform
    python bench/validate.py --frameworks # the frameworks' own code as ground truth: Hugging Face
                                          # transformers models (real steps, and fake-tensor traces at
                                          # published sizes) vs the hf-trainer profile ('.[frameworks]');
                                          # hf-nas: DeciLM / Nemotron-NAS layers of Llama modules vs nas.mf;
                                          # hf-fsdp2 / hf-fsdp1: the Trainer's FSDP2 / FSDP1 on 2-4 gloo ranks
    python bench/validate.py --explain    # also list, per case, which ops' outputs forward left alive
                                          # and which were live at the measured peak

For every case it builds the model from a memform config, runs forward + backward + AdamW, measures
params / grads / optimizer states / activations after forward / the peak of live activation-side bytes
over forward + backward (see memform/validation/measure.py for exactly what is counted), estimates the same config with memform and prints measured vs estimated with the relative
error. Exits 1 if any category's |error| exceeds its threshold (memform.validation.compare.THRESHOLDS,
AMP_THRESHOLDS for --amp: each just above the precision this script achieved over its whole sweep, see
there), 2 if PyTorch is missing or --only matches no case.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="run the small subset the tests run")
    ap.add_argument("--amp", action="store_true",
                    help="the PyTorch AMP cases (fp32 model, forward under bf16 autocast, as the HF Trainer runs "
                         "it) against training.framework: hf-trainer (with --quick: the tests' subset)")
    ap.add_argument("--fsdp2", action="store_true",
                    help="FSDP2 training steps (fully_shard on a CPU mesh, 2 and 4 ranks over gloo, as torchtitan "
                         "wraps the model) against training.framework: fsdp2 (with --quick: the tests' subset)")
    ap.add_argument("--distributed", action="store_true",
                    help="multi-process torch.distributed steps (gloo ranks on loopback: ddp, zero1, fsdp, tp, tp+sp, "
                         "ep, cp, 1f1b, gpipe, interleaved, zbv, dualpipev), every rank against memform's estimate "
                         "(training.framework: torch; with --quick: the tests' subset)")
    ap.add_argument("--frameworks", action="store_true",
                    help="the real frameworks' training code as the ground truth (memform.validation.frameworks: "
                         "Hugging Face transformers, real CPU steps and fake-tensor traces at published sizes), each "
                         "under the profile named after it (with --quick: the tests' subset)")
    ap.add_argument("--only", metavar="TEXT", help="run only cases whose label contains TEXT (e.g. moe, fp32)")
    ap.add_argument("--explain", action="store_true",
                    help="print, per creating op, the bytes alive after forward and those live at the measured peak")
    ap.add_argument("--json", metavar="PATH", help="also write every row as JSON to PATH")
    ap.add_argument("--record", action="store_true",
                    help="write this run's signed errors as each case's recorded agreement (its own bound from now "
                         "on: memform/validation/bounds.py, bounds.yaml beside it)")
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench/validate.py needs PyTorch: pip install '.[validate]'", file=sys.stderr)
        return 2
    if args.frameworks:
        return _frameworks(args)
    if args.fsdp2:
        return _fsdp2(args)
    if args.distributed:
        return _distributed(args)
    from memform.validation.compare import AMP_THRESHOLDS, CATEGORIES, THRESHOLDS, compare, format_table
    from memform.validation.sweep import amp_sweep, full_sweep, quick_amp_sweep, quick_sweep

    if args.amp:
        points = quick_amp_sweep() if args.quick else _with_quick(args, amp_sweep(), quick_amp_sweep())
    else:
        points = quick_sweep() if args.quick else _with_quick(args, full_sweep(), quick_sweep())
    if args.only:
        points = [p for p in points if args.only in p.label()]
        if not points:
            return _no_match(args.only)
    start = time.perf_counter()
    rows = []
    for p in points:
        rows.append(compare(p))
        if args.explain:
            print(p.label(), "after forward:", rows[-1].activations_by_op)
            print(p.label(), "at the peak:", rows[-1].peak_by_op)
    elapsed = time.perf_counter() - start
    print(format_table(rows))
    _record(args, "amp" if args.amp else "single", [(r.point.label(), r) for r in rows], CATEGORIES)
    return _summary(rows, elapsed, AMP_THRESHOLDS if args.amp else THRESHOLDS, lambda r: r.point.label(), args.json)


def _with_quick(args: argparse.Namespace, full: list, quick: list) -> list:
    """The whole sweep; with ``--record`` also the tests' quick cases it lacks (each gets its own bound)."""
    return full + [c for c in quick if c not in full] if args.record else full


def _no_match(text: str) -> int:
    """``--only TEXT`` that selects nothing is a usage error, not a pass with zero cases."""
    print(f"validate: --only {text!r} matches no case (run without --only to see the case labels)", file=sys.stderr)
    return 2


def _record(args: argparse.Namespace, suite: str, keyed, categories) -> None:  # noqa: ANN001
    """``--record``: this run's signed errors become each case's recorded agreement (memform.validation.bounds)."""
    if not args.record:
        return
    from memform.validation import bounds

    rows = [(key, {c: r.error(c) for c in categories if c in r.measured and c in r.estimated
                   and (not hasattr(r, "checked") or r.checked(c))}) for key, r in keyed]
    print(f"recorded {len(rows)} {suite} cases in {bounds.record(suite, rows)}")


def _summary(rows, elapsed: float, thresholds: dict, label, json_path: str | None, extra: str = "") -> int:
    """The closing lines every mode prints (cases, time, what is over its bound) and the --json dump."""
    from memform.validation import bounds

    failed = [r for r in rows if r.failures()]
    own = sum(1 for r in rows if hasattr(r, "limits") and r.limits() != thresholds)
    print(f"{len(rows)} cases in {elapsed:.1f} s; {len(failed)} over their bounds ({own} held to their own recorded "
          f"agreement + {bounds.SLACK:.1%}, the rest to the suite's thresholds "
          + ", ".join(f"{c} {t:.1%}" for c, t in thresholds.items()) + ")" + extra)
    for r in failed:
        print(f"FAIL {label(r)}: " + ", ".join(f"{c} {r.error(c):+.2%}" for c in r.failures()))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as fh:
            json.dump([r.to_dict() for r in rows], fh, indent=1)
    return 1 if failed else 0


def _fsdp2(args: argparse.Namespace) -> int:
    """``--fsdp2``: memform.validation.fsdp2's cases, measured per rank (rank 0 shown)."""
    from memform.validation import fsdp2

    cases = fsdp2.quick_sweep() if args.quick else _with_quick(args, fsdp2.sweep(), fsdp2.quick_sweep())
    if args.only:
        cases = [c for c in cases if args.only in c.label()]
        if not cases:
            return _no_match(args.only)
    start = time.perf_counter()
    rows = fsdp2.run(cases)
    elapsed = time.perf_counter() - start
    if args.explain:
        for r in rows:
            print(r.case.label(), "at the peak:", r.by_op.get("peak"))
            print(r.case.label(), "FSDP buffers at their peak:", r.by_op.get("comm"))
    print(fsdp2.format_table(rows))
    _record(args, "fsdp2", [(r.case.label(), r) for r in rows], fsdp2.THRESHOLDS)
    return _summary(rows, elapsed, fsdp2.THRESHOLDS, lambda r: r.case.label(), args.json,
                    f", peak at most {fsdp2.PEAK_UNDER:.0%} under")


def _frameworks(args: argparse.Namespace) -> int:
    """``--frameworks``: memform.validation.frameworks' cases, framework by framework."""
    from memform.validation import frameworks

    rows, not_run = [], []
    start = time.perf_counter()
    for name in frameworks.FRAMEWORKS:
        try:
            mod = frameworks.module(name)
        except ImportError as exc:
            not_run.append(f"{name}: {exc}")
            continue
        cases = mod.quick_sweep() if args.quick else _with_quick(args, mod.sweep(), mod.quick_sweep())
        if args.only:
            cases = [c for c in cases if args.only in c.label()]
        if hasattr(mod, "run"):   # multi-rank harnesses: every job at once, one spawned group per world size
            mod.run(cases)
        for case in cases:
            rows.append(frameworks.compare(case, mod))
            if args.explain:
                print(case.label(), "at the activation peak:", rows[-1].peak_by_op)
    elapsed = time.perf_counter() - start
    if args.only and not rows:
        for why in not_run:
            print(f"not run: {why}")
        return _no_match(args.only)
    if rows:
        print(frameworks.format_table(rows))
        _record(args, "frameworks", [(r.case.label(), r) for r in rows], frameworks.CATEGORIES)
    for why in not_run:
        print(f"not run: {why}")
    code = _summary(rows, elapsed, frameworks.THRESHOLDS, lambda r: r.case.label(), args.json)
    return code if rows or not not_run else 2


def _distributed(args: argparse.Namespace) -> int:
    """``--distributed``: memform.validation.distributed's cases, one row per rank (= stage)."""
    from memform.validation import distributed

    cases = distributed.quick_sweep() if args.quick else _with_quick(args, distributed.sweep(), distributed.quick_sweep())
    if args.only:
        cases = [c for c in cases if args.only in c.label()]
        if not cases:
            return _no_match(args.only)
    start = time.perf_counter()
    rows, not_run = distributed.run(cases)
    elapsed = time.perf_counter() - start
    if args.explain:
        for r in rows:
            for key, value in r.notes.items():
                print(f"{r.case.label()} rank {r.rank} {key}: {value}")
    print(distributed.format_table(rows, not_run))
    _record(args, "distributed", [(r.key, r) for r in rows], distributed.CATEGORIES)
    failed = [r for r in rows if r.failures()]
    for r in failed:
        print(f"OVER {r.case.label()} rank {r.rank}: " + ", ".join(f"{c} {r.error(c):+.2%}" for c in r.failures()))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"rows": [r.to_dict() for r in rows],
                       "not_run": [{"case": c.label(), "why": why} for c, why in not_run]}, fh, indent=1)
    print(distributed.summary(rows, not_run, elapsed=elapsed))
    # a case that cannot run on this build (listed with its reason) is not a failure; one that broke is
    broken = [c for c, _ in not_run if c.kind not in distributed.UNSUPPORTED]
    return 1 if failed or broken else 0


if __name__ == "__main__":
    sys.exit(main())
