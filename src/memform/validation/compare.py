"""Hold memform's estimate against a measured training step, category by category.

A :class:`Point` is one tiny model + training set-up. :meth:`Point.config` writes it as a memform
config (dp = tp = pp = 1, one micro-batch, the architecture switches and the precision keys of the
PyTorch set-up), the same dict the PyTorch model is built from, so both sides see exactly one description.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import memform

from .measure import AMP, PRECISIONS, measure_step

#: the categories compared, and the largest |relative error| each may show (stated in the README).
#: ``activations`` is what forward leaves saved (memform's ``warmup`` moment); ``activations_peak``
#: the peak of live activation-side bytes over forward + backward (memform's ``backward`` moment).
#: Each is set just above the precision achieved over the whole sweep, so that a formula error larger
#: than the harness's own noise fails: `python bench/validate.py` (72 cases, 2026-12-03) measured max
#: |error| params 0.00 %, grads 0.00 %, optimizer 0.01 %, activations 1.05 %, activations_peak 7.08 %.
THRESHOLDS: dict[str, float] = {"params": 0.001, "grads": 0.001, "optimizer": 0.001, "activations": 0.015,
                                "activations_peak": 0.075}
#: the PyTorch AMP cases (fp32 model, bf16 autocast, the hf-trainer profile): `python bench/validate.py
#: --amp` (17 cases, 2026-12-03) measured max |error| params 0.00 %, grads 0.00 %, optimizer 0.01 %,
#: activations 4.16 % (one case: selective recompute with the eager core; every other case <= 0.68 %),
#: activations_peak 5.86 %
AMP_THRESHOLDS: dict[str, float] = {"params": 0.001, "grads": 0.001, "optimizer": 0.001, "activations": 0.045,
                                    "activations_peak": 0.065}
CATEGORIES = tuple(THRESHOLDS)


def relative_error(estimated: int, measured: int) -> float:
    """(estimate − measured) / measured; a category both sides say is empty is exact, an estimate of
    something measured as empty infinitely wrong. Every harness's rows use it."""
    return (estimated - measured) / measured if measured else (0.0 if estimated == 0 else math.inf)


def thresholds_for(point: "Point") -> dict[str, float]:
    """The thresholds that apply to ``point``: :data:`AMP_THRESHOLDS` for an autocast set-up."""
    return AMP_THRESHOLDS if point.precision in AMP else THRESHOLDS
#: short column titles
TITLES = {"activations_peak": "act. peak"}


@dataclass(frozen=True)
class Point:
    """One validation case: model shape, batch and training set-up."""

    b: int = 2
    s: int = 64
    L: int = 2
    h: int = 64
    head_dim: int = 16
    kv_heads: int | None = None     # default: num_heads / 2 (GQA)
    vocab: int = 512
    recompute: str = "none"
    flash: bool = True
    swiglu_impl: str = "fused"
    precision: str = "bf16-mixed"    # a measure.PRECISIONS set-up, or an autocast one (measure.AMP)
    experts: int = 1                # > 1: Mixtral-style MoE (needs formulas/moe.mf)
    top_k: int = 2
    shared_experts: int = 0         # with experts > 1: DeepSeekMoE shared experts, each ffn wide, ungated
    arch: str = "llama"             # llama: RMSNorm, SwiGLU, RoPE, no biases; gpt: LayerNorm, GeLU, learned positions, biases
    dropout: bool = False
    # attention "mla": DeepSeek-V2's multi-head latent attention (formulas/mla.mf; llama arch only), its
    # widths small versions of DeepSeek-V3's (d_c' 1536, d_c 512, d_h^R 64 = d_h / 2, d_h = d_v 128):
    # query latent d_c' (0: no query compression), KV latent d_c, rope / nope head dims, value head dim
    attention: str = "mha"
    q_rank: int = 48
    kv_rank: int = 32
    d_rope: int = 8
    d_nope: int = 16
    d_v: int = 16
    # MoE under the megatron profile (the default): the router probabilities weight the tokens inside the
    # experts (Megatron-Core 0.13+), or at the combine (false: megatron.moe_probs_in_experts, moe.mf's)
    probs_in_experts: bool = True

    @property
    def heads(self) -> int:
        return self.h // self.head_dim

    @property
    def ffn(self) -> int:
        # GPT: 4h (Radford et al. 2019); Llama: 8h/3 (Touvron et al. 2023 §2.2), rounded up to 16
        return 4 * self.h if self.arch == "gpt" else 16 * math.ceil(8 * self.h / 3 / 16)

    @property
    def kv(self) -> int:
        if self.attention == "mla":   # every head has its own up-projected K and V (eqs. 10-11, 17)
            return self.heads
        if self.kv_heads is not None:
            return self.kv_heads
        return self.heads if self.arch == "gpt" else max(1, self.heads // 2)

    def label(self) -> str:
        parts = [self.arch, f"b{self.b} s{self.s} L{self.L} h{self.h} a{self.heads}/{self.kv}",
                 self.recompute, "flash" if self.flash else "core", self.precision]
        if self.vocab != Point.vocab:   # labels name a case uniquely (its recorded bound is keyed by it)
            parts.append(f"V{self.vocab}")
        if self.dropout:
            parts.append("dropout")
        if self.swiglu_impl != "fused":
            parts.append(f"swiglu-{self.swiglu_impl}")
        if self.attention == "mla":
            parts.append(f"mla q{self.q_rank} kv{self.kv_rank} r{self.d_rope} n{self.d_nope} v{self.d_v}")
        if self.experts > 1:
            shared = f"+{self.shared_experts}shared" if self.shared_experts else ""
            parts.append(f"moe{self.experts}x{self.top_k}{shared}" + ("" if self.probs_in_experts else "-combine"))
        return " ".join(parts)

    def config(self) -> dict[str, Any]:
        """The memform config describing exactly what the PyTorch harness runs."""
        gpt = self.arch == "gpt"
        model: dict[str, Any] = {
            "hidden_size": self.h, "num_heads": self.heads, "num_kv_heads": self.kv,
            "ffn_hidden_size": self.ffn, "num_layers": self.L, "vocab_size": self.vocab,
            "seq_length": self.s, "activation": "gelu" if gpt else "swiglu",
            "norm": "layernorm" if gpt else "rmsnorm", "bias": gpt, "dropout": self.dropout,
            "flash_attention": self.flash, "tied_embeddings": False,
            "position_embedding": "learned" if gpt else "rope", "swiglu_impl": self.swiglu_impl,
            "cross_entropy": "eager",   # the harness's loss is PyTorch's F.cross_entropy
        }
        cfg: dict[str, Any] = {
            "name": "validate-" + self.label().replace(" ", "-").replace("/", "g"),
            "model": model,
            "parallel": {"dp": 1, "tp": 1, "pp": 1},
            "training": {"micro_batch_size": self.b, "num_micro_batches": 1, "recompute": self.recompute,
                         "precision": dict(PRECISIONS.get(self.precision, (None, {}))[1])},
        }
        if self.precision in AMP:   # PyTorch autocast over an fp32 model: the hf-trainer profile's keys
            overlay = copy.deepcopy(AMP[self.precision][1])
            cfg["training"].update(overlay.pop("training"))
            cfg.update(overlay)
        if self.experts > 1:
            model.update(num_experts=self.experts, moe_top_k=self.top_k, moe_ffn_hidden_size=self.ffn)
            if self.shared_experts > 0:   # DeepSeek-V3 §2.1.2: always-active experts beside the routed ones
                model.update(num_shared_experts=self.shared_experts)
            cfg["parallel"].update(ep=1, expert_tp=1)
            cfg["formulas"] = ["moe.mf"]
            if not self.probs_in_experts:
                cfg["megatron"] = {"moe_probs_in_experts": False}
        if self.attention == "mla":   # as configs/deepseek-v2-lite.yaml: [moe.mf, mla.mf]
            model.update(attention="mla", q_lora_rank=self.q_rank, kv_lora_rank=self.kv_rank,
                         qk_rope_head_dim=self.d_rope, qk_nope_head_dim=self.d_nope, v_head_dim=self.d_v)
            cfg["formulas"] = cfg.get("formulas", []) + ["mla.mf"]
        return cfg


@dataclass
class Row:
    """Measured and estimated bytes of one point, with the relative error (estimate − measured) / measured."""

    point: Point
    measured: dict[str, int]
    estimated: dict[str, int]
    activations_by_op: dict[str, int] = field(default_factory=dict)
    peak_by_op: dict[str, int] = field(default_factory=dict)

    def error(self, cat: str) -> float:
        return relative_error(self.estimated[cat], self.measured[cat])

    @property
    def categories(self) -> tuple[str, ...]:
        """The compared categories both sides have (a hand-made row may leave the peak out)."""
        return tuple(c for c in CATEGORIES if c in self.measured and c in self.estimated)

    @property
    def suite(self) -> str:
        """This row's suite in :mod:`memform.validation.bounds` (``bench/validate.py`` or ``--amp``)."""
        return "amp" if self.point.precision in AMP else "single"

    def limits(self) -> dict[str, float]:
        """Each category's bound: the case's own recorded agreement (:mod:`.bounds`), within the suite's."""
        from .bounds import limits
        return limits(self.suite, self.point.label(), thresholds_for(self.point))

    def failures(self, thresholds: dict[str, float] | None = None) -> list[str]:
        limits = thresholds or self.limits()
        return [c for c in self.categories if abs(self.error(c)) > limits[c]]

    def to_dict(self) -> dict[str, Any]:
        return {"point": asdict(self.point), "measured": self.measured, "estimated": self.estimated,
                "error": {c: self.error(c) for c in self.categories}}


def compare(point: Point) -> Row:
    """Measure ``point`` with PyTorch and estimate it with memform."""
    cfg = point.config()
    measured = measure_step(cfg, point.precision)
    stage = memform.estimate(cfg).stages[0]
    estimated = {c: stage.values[c] for c in ("params", "grads", "optimizer")}
    # what forward leaves saved -- layers_sum(inflight · act), the "warmup" moment -- is what the
    # measurement's `activations` sees; the stage's activation value is its largest moment (for
    # 1F1B the first backward), held against the measured peak over forward + backward
    moments = getattr(stage, "moments", {})
    estimated["activations"] = moments.get("warmup", stage.values["activations"])
    estimated["activations_peak"] = stage.values["activations"]
    return Row(point, measured.as_dict(), estimated, measured.activations_by_op, measured.peak_by_op)


def format_table(rows: list[Row], thresholds: dict[str, float] | None = None) -> str:
    """A fixed-width table: per category measured / estimated KiB and the relative error (``!`` = over)."""
    width = max([len(r.point.label()) for r in rows] + [4])
    cell = 27
    head = f"{'case':<{width}}" + "".join(f" | {TITLES.get(c, c) + ' KiB meas/est, err':>{cell}}" for c in CATEGORIES)
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = []
        for c in CATEGORIES:
            flag = "!" if abs(r.error(c)) > (thresholds or thresholds_for(r.point))[c] else " "
            text = f"{r.measured[c] / 1024:.1f} / {r.estimated[c] / 1024:.1f} {r.error(c):+7.2%}{flag}"
            cells.append(f" | {text:>{cell}}")
        lines.append(f"{r.point.label():<{width}}" + "".join(cells))
    lines.append("-" * len(head))
    if rows:
        worst = {c: max(abs(r.error(c)) for r in rows) for c in CATEGORIES}
        lines.append("mean error: " + ", ".join(f"{TITLES.get(c, c)} {sum(r.error(c) for r in rows) / len(rows):+.2%}"
                                                for c in CATEGORIES))
        limits = thresholds or thresholds_for(rows[0].point)
        lines.append("max |error|: " + ", ".join(f"{c} {worst[c]:.2%} (limit {limits[c]:.1%})" for c in CATEGORIES))
    return "\n".join(lines)
