"""DeepSpeed ZeRO-3 with a persistence threshold above every tensor: the parameter working set (issue 35, stop 46).

    python bench/ds_persist_all.py

Runs the DeepSpeed harness's ZeRO-3 Llama (memform.validation.frameworks.deepspeed BASE: L8 h128, 2 gloo ranks,
fp32) with ``stage3_param_persistence_threshold`` 10 (x h) and 10^9 (above every tensor), and prints each rank's
measured ZeRO-3 working set (the tensors kept gathered and the IPG bucket -- static --, and the peak of the
fetched parameters) beside memform's runtime blocks zero3_persistent, zero3_fetch, zero3_cache. Measured with
deepspeed 0.19.8, torch 2.13 CPU (~2 min per job on 2 cores): at 10^9 the static set is 8,955,520 B on both
ranks, memform's zero3_persistent exactly, and the gathered peak 0 (mark_persistent_parameters marks every
tensor ds_persist; fetch_sub_module gathers only NOT_AVAILABLE ones): memform's zero3_cache 0 and zero3_fetch
the running module's gradient alone (4 B x the embedding's 131,072 elements), which the harness counts on the
activations side. Before stop 46 memform refused such a config (zero3_cache negative).
"""

from __future__ import annotations

import sys
from dataclasses import replace


def main() -> int:
    import memform
    from memform.validation.frameworks import deepspeed as ds

    for persist in (10 * ds.BASE.h, 10 ** 9):
        job = replace(ds.BASE, zero=3, persist=persist)
        ds.run(job.ranks())
        for case in job.ranks():
            step = ds.measure(case)
            runtime = memform.estimate(case.memform_config()).stages[0].runtime
            blocks = {k: int(runtime.get(k, 0)) for k in ds.ZERO3_BLOCKS}
            print(f"{case.label()}: measured static {step.notes['zero3_static']:,} B, gathered peak "
                  f"{step.notes['gathered_peak']:,} B; memform {blocks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
