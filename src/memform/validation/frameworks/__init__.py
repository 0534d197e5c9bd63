"""The real frameworks' own training code as memform's ground truth (``bench/validate.py --frameworks``).

Each framework module builds a model with the framework's code, runs a warm-up step and a traced one
(:mod:`.tracking`), and says how memform describes the same job: the config (through memform's own
importer where one reads the framework's files) and the profile named after the framework. This
package holds what every framework shares: the compared categories, their thresholds, a row of
measured against estimated bytes, and the table.

- :mod:`.hf`: Hugging Face transformers (``training.framework: hf-trainer``), real steps at small
  shapes and fake-tensor traces at the sizes of published models;
- :mod:`.titan`: torchtitan's own Llama 3 and DeepSeek-V3 recipes (``training.framework: fsdp2``), traced at their
  published sizes with fake tensors and a fake process group.

Needs the ``frameworks`` extra (transformers) and, for torchtitan, torchtitan 0.3.0 with triton; a
framework that is not installed is reported as not run, with the reason, never passed silently.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import memform

from ..compare import relative_error

#: largest |relative error| per category (issue 29's acceptance: static <= 2 %, activations and the
#: activation peak <= 10 %, communication buffers <= 25 %; the allocator's reserve is a peak figure: its
#: error, as a share of the reserved peak, is held to the peaks' 10 %; the optimizer step's moment, a peak, likewise)
THRESHOLDS: dict[str, float] = {"params": 0.02, "grads": 0.02, "optimizer": 0.02, "activations": 0.10,
                                "activations_peak": 0.10, "comm": 0.25, "reserve": 0.10, "host": 0.02,
                                "step": 0.10}
CATEGORIES = tuple(THRESHOLDS)
TITLES = {"activations_peak": "act.peak", "activations": "act", "optimizer": "optim", "step": "opt.step"}
#: the allocator's reserve is checked where it matters: a step whose replayed reserved peak is below this
#: is dominated by the allocator's 2 MiB / 20 MiB segment sizes, which per-layer figures cannot resolve
RESERVE_FROM = 2 ** 30
def llama_hf_config(case: Any) -> Any:
    """transformers' Llama config of a rank job's shape (``h``, ``ffn``, ``L``, ``heads``, ``kv_heads``,
    ``vocab``, ``s``), embeddings untied: the model the DeepSpeed and Trainer-FSDP harnesses train."""
    from transformers import AutoConfig

    return AutoConfig.for_model("llama", hidden_size=case.h, intermediate_size=case.ffn,
                                num_hidden_layers=case.L, num_attention_heads=case.heads,
                                num_key_value_heads=case.kv_heads, vocab_size=case.vocab,
                                max_position_embeddings=case.s, tie_word_embeddings=False)


@dataclass(frozen=True)
class ModelShape:
    """The shape fields of a multi-rank harness's small model (DeepSpeed, the Trainer's FSDP1 / FSDP2,
    megatron-core): hidden size, layers, attention heads, FFN width, vocabulary, micro-batch, sequence."""

    h: int = 128
    L: int = 4
    heads: int = 8
    ffn: int = 352
    vocab: int = 1024
    b: int = 2
    s: int = 256


@dataclass(frozen=True)
class LlamaRankCase(ModelShape):
    """A job over transformers' Llama (:func:`llama_hf_config`) on ``world`` gloo ranks, and which rank's row
    (the job runs once for all of them): the DeepSpeed and Trainer-FSDP harnesses' cases."""

    kv_heads: int = 4
    world: int = 2
    rank: int = 0

    def job(self) -> Any:
        """The case without its row (the same job for every rank)."""
        return replace(self, rank=0)

    def ranks(self) -> list[Any]:
        """The job's row on every rank."""
        return [replace(self, rank=r) for r in range(self.world)]

    def hf_config(self) -> Any:
        return llama_hf_config(self)


#: framework name -> (module of this package, the package it needs)
FRAMEWORKS: dict[str, tuple[str, str]] = {"hf": ("hf", "transformers"), "hf-nas": ("hf_nas", "transformers"),
                                          "hf_vision": ("hf_vision", "transformers"),
                                          "hf_linear": ("hf_linear", "transformers"),
                                          "hf_hybrid": ("hf_hybrid", "transformers"),
                                          "hf_lfm2": ("hf_lfm2", "transformers"),
                                          "hf_qlora": ("hf_qlora", "bitsandbytes"),
                                          "hf_frozen": ("hf_frozen", "transformers"),
                                          "hf_optim": ("hf_optim", "bitsandbytes"),
                                          "hf_muon": ("hf_muon", "transformers"),
                                          "hf_fsdp": ("hf_fsdp", "accelerate"),
                                          "hf_fsdp1": ("hf_fsdp1", "accelerate"),
                                          "titan": ("titan", "torchtitan"),
                                          "deepspeed": ("deepspeed", "deepspeed"), "mcore": ("mcore", "megatron.core")}


class Case(Protocol):
    def label(self) -> str: ...
    def memform_config(self) -> dict[str, Any]: ...


@dataclass
class RankStep:
    """One rank's measured bytes per category, the ops live at its activation peak, and notes."""

    measured: dict[str, int]
    peak_by_op: dict[str, int] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)


class RankJobs:
    """The jobs of a multi-rank harness (deepspeed, mcore), each run once per process: every job not run
    yet in one spawned group of gloo ranks per world size; a case's row is one rank's result of its job.
    Cases give ``job()`` (the job several rows share), ``world`` and ``label()``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.results: dict[Any, list[dict[str, Any]]] = {}

    def run(self, cases: list[Any], measure_item: Any) -> None:
        """Run the jobs of ``cases`` not run yet; ``measure_item(job_dict, rank, world)`` on every rank."""
        from .. import ranks

        jobs: dict[int, list[Any]] = {}
        for c in cases:
            if c.job() not in self.results and c.job() not in jobs.get(c.world, []):
                jobs.setdefault(c.world, []).append(c.job())
        for world, group in jobs.items():
            for job, per_rank in zip(group, ranks.spawn(world, measure_item, [asdict(j) for j in group],
                                                        prefix=self.prefix)):
                self.results[job] = per_rank

    def step(self, case: Any, rank: int, measure_item: Any) -> RankStep:
        """Rank ``rank``'s measurement of ``case``'s job (run on first use); a rank's error is raised."""
        self.run([case], measure_item)
        result = self.results[case.job()][rank]
        if "error" in result:
            raise RuntimeError(f"{case.label()}: {result['error']}\n{result.get('trace', '')}")
        return RankStep(result["measured"], result["notes"].get("peak_by_op", {}), result["notes"])


def rank_result(run_rank: Any, case_type: Any, d: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """A rank's result of one job, as :class:`RankJobs` collects it: ``run_rank(case_type(**d), rank, world)``'s
    ``(measured, notes)``, or the error's first line and its traceback (:meth:`RankJobs.step` raises them with
    the case's label)."""
    import traceback

    try:
        measured, notes = run_rank(case_type(**d), rank, world)
        return {"measured": measured, "notes": notes}
    except Exception as exc:  # noqa: BLE001 - reported with the case
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300],
                "trace": traceback.format_exc()[-3000:]}


def imported_config(importer: str, path: Path, label: str, **options: Any) -> dict[str, Any]:
    """The config ``memform import <importer>`` makes of a case's own files (``path``): how a user would
    describe the same job. A draft that does not load is a fault of the harness, raised as such."""
    from ...importers import Options, import_config

    draft = import_config(importer, path, Options(name=label.replace(" ", "-"), **options))
    if draft.load_error:
        raise RuntimeError(f"{label}: memform import {importer} gave a config that does not load: {draft.load_error}")
    return draft.config()


@dataclass
class Row:
    """One case's measured and estimated bytes; error = (estimate − measured) / measured."""

    case: Any
    measured: dict[str, int]
    estimated: dict[str, int]
    peak_by_op: dict[str, int] = field(default_factory=dict)

    def error(self, cat: str) -> float:
        if cat == "reserve":
            # the allocator's reserve beyond the step's allocated peak (replayed reserved - requested),
            # its error as a share of the reserved bytes the device must hold: the allocator model's own
            # error, apart from the allocated categories' (which have their own columns)
            return relative_error(self.measured["reserved"] + self.estimated["reserve"] - self.measured["reserve"],
                                  self.measured["reserved"])
        if cat not in self.measured or cat not in self.estimated:
            return math.nan   # a category this case does not measure (host: only offloading cases; the optimizer step)
        return relative_error(self.estimated[cat], self.measured[cat])

    def checked(self, cat: str) -> bool:
        if cat not in self.measured or cat not in self.estimated:
            return False      # a harness that does not replay its trace (yet): shown as not measured
        if cat == "reserve" and not getattr(self.case, "reserve_checked", True):
            return False
        return cat != "reserve" or self.measured.get("reserved", 0) >= RESERVE_FROM

    def limits(self) -> dict[str, float]:
        """Each category's bound: the case's own recorded agreement (:mod:`..bounds`), within THRESHOLDS."""
        from ..bounds import limits
        return limits("frameworks", self.case.label(), THRESHOLDS)

    def failures(self) -> list[str]:
        limits = self.limits()
        return [c for c in CATEGORIES if self.checked(c) and abs(self.error(c)) > limits[c]]

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case.label(), "measured": self.measured, "estimated": self.estimated,
                "error": {c: self.error(c) for c in CATEGORIES if c in self.measured and c in self.estimated}}


def estimated(cfg: dict[str, Any], stage_index: int = 0) -> dict[str, int]:
    """memform's figures for the categories a step measures on pipeline stage ``stage_index`` (0: a
    single-stage step): the static bytes, what the forward leaves saved (the ``warmup`` moment: the end
    of the stage's warm-up with a pipeline) and the stage's largest activation moment."""
    stage = memform.estimate(cfg).stages[stage_index]
    out = {c: int(stage.values[c]) for c in ("params", "grads", "optimizer")}
    out["activations"] = int(stage.moments.get("warmup", stage.values["activations"]))
    out["activations_peak"] = int(stage.values["activations"])
    out["comm"] = int(stage.values["comm"])
    out["reserve"] = int(stage.reserve or 0)
    out["reserved"] = int(stage.reserved_bytes)
    out["step_peak"] = int(stage.model_bytes)
    out["host"] = int(stage.host_bytes)
    # the optimizer step's moment, where a profile says it exceeds the forward / backward's (hf-trainer.mf
    # runtime optimizer_step: Muon's Newton-Schulz temporaries): the harnesses that trace the step compare it
    beyond = int(stage.runtime.get("optimizer_step", 0))
    if beyond > 0:
        out["step"] = int(stage.model_bytes) + beyond
    return out


def module(name: str):  # noqa: ANN201 - a module of this package
    """The module of framework ``name``; ImportError names the package to install."""
    mod_name, package = FRAMEWORKS[name]
    try:
        importlib.import_module(package)
    except ImportError as exc:
        how = {"transformers": "pip install '.[frameworks]'",
               "deepspeed": "pip install '.[frameworks]', or pip install deepspeed==0.19.8 torch==2.13.0",
               "megatron.core": "pip install numpy packaging triton && pip install --no-deps "
                                "--ignore-requires-python megatron-core==0.19.2"}.get(
            package, "pip install torchtitan==0.3.0 && pip install --no-deps triton")
        raise ImportError(f"{package} is not installed ({how}): {exc}") from exc
    return importlib.import_module(f"{__name__}.{mod_name}")


def compare(case: Case, mod) -> Row:  # noqa: ANN001
    step = mod.measure(case)
    # a case that is one rank of a pipeline says which stage (megatron-core's rows)
    return Row(case, step.measured, estimated(case.memform_config(), getattr(case, "stage", 0)), step.peak_by_op)


def format_table(rows: list[Row]) -> str:
    """Measured / estimated MiB per category and the relative error (``!`` = over its bound: the case's own
    recorded agreement, :mod:`memform.validation.bounds`, within the suite's THRESHOLDS)."""
    width = max([len(r.case.label()) for r in rows] + [4])
    cell = 24
    # host memory (offloaded activations) and the optimizer step's moment: a column only where some row
    # measured it
    cats = [c for c in CATEGORIES if c not in ("host", "step") or any(c in r.measured for r in rows)]
    head = f"{'case':<{width}}" + "".join(f" | {TITLES.get(c, c) + ' MiB meas/est, err':>{cell}}" for c in cats)
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = []
        limits = r.limits()
        for c in cats:
            flag = " " if not r.checked(c) else ("!" if abs(r.error(c)) > limits[c] else " ")
            if not r.checked(c):
                flag = "~"
            text = (f"{_mib(r.measured[c])} / {_mib(r.estimated[c])} {r.error(c):+7.1%}{flag}"
                    if c in r.measured and c in r.estimated else "not measured  ")
            cells.append(f" | {text:>{cell}}")
        lines.append(f"{r.case.label():<{width}}" + "".join(cells))
    lines.append("-" * len(head))
    if rows:
        lines.append("max |error|: " + ", ".join(
            f"{c} {max((abs(r.error(c)) for r in rows if r.checked(c)), default=0):.1%} (suite limit {THRESHOLDS[c]:.0%})"
            for c in CATEGORIES))
        lines.append(f"reserve: the allocator's reserve beyond the step's allocated peak (the traced step replayed "
                     f"through memform's allocator model vs memform's own replay), its error as a share of the "
                     f"reserved bytes; ~: not checked below {RESERVE_FROM / 2 ** 30:.0f} GiB reserved")
        lines.append("step peak, every tensor at once (replayed allocated vs memform's model bytes; not a threshold: "
                     "memform's categories peak at different moments): " + ", ".join(
                         f"{r.case.label()} {r.error('step_peak'):+.1%}" for r in rows
                         if "step_peak" in r.measured and "step_peak" in r.estimated))
    return "\n".join(lines)


def _mib(n: int) -> str:
    x = n / 2 ** 20
    return f"{x:.3g}" if x < 1000 else f"{x:,.0f}"
