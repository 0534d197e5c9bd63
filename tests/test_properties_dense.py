"""Hypothesis properties of the dense model: symbolic == numeric, sharding never hurts."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memform.engine.interpreter import CATEGORIES
from memform.engine.model import estimate as interpreted
from estimate_helpers import numbers  # numbers only: the numeric path (tests/test_numeric.py ties it to sympy's)

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def dense_configs(draw, pps=(1, 2, 4), tied=None, tp_room=1, zero_max=3):
    """Valid dense configs. Properties that need a kind of config ask for it here rather than skipping
    examples: ``pps`` the pipeline sizes, ``tied`` the embedding tying (None: either), ``tp_room`` a factor
    by which tp can still grow (heads, KV heads, FFN and vocabulary stay divisible), ``zero_max``."""
    t = draw(st.sampled_from([1, 2, 4]))
    g = t * tp_room * draw(st.sampled_from([1, 2]))
    a = g * draw(st.sampled_from([1, 2, 4]))
    dh = draw(st.sampled_from([8, 16, 64]))
    p = draw(st.sampled_from(list(pps)))
    return {
        "model": {"hidden_size": a * dh, "num_heads": a, "num_kv_heads": g,
                  "num_layers": p * draw(st.integers(1, 4)),
                  "ffn_hidden_size": t * tp_room * draw(st.integers(1, 64)),
                  "vocab_size": t * tp_room * draw(st.integers(1, 500)),
                  "seq_length": t * tp_room * draw(st.integers(1, 1024)),  # sequence parallelism splits s over t
                  "activation": draw(st.sampled_from(["gelu", "swiglu"])),
                  "norm": draw(st.sampled_from(["layernorm", "rmsnorm"])),
                  "bias": draw(st.booleans()), "dropout": draw(st.booleans()),
                  "flash_attention": draw(st.booleans()), "tied_embeddings": draw(st.booleans()) if tied is None else tied,
                  "position_embedding": draw(st.sampled_from(["learned", "rope"]))},
        "parallel": {"dp": draw(st.sampled_from([1, 2, 8])), "tp": t, "pp": p,
                     "sequence_parallel": draw(st.booleans()), "zero": draw(st.integers(0, zero_max))},
        "training": {"micro_batch_size": draw(st.integers(1, 8)), "num_micro_batches": draw(st.integers(1, 8)),
                     "recompute": draw(st.sampled_from(["none", "selective", "full"])),
                     "precision": {"params": draw(st.sampled_from(["bf16", "fp32"])),
                                   "activations": draw(st.sampled_from(["bf16", "fp32"]))}},
    }


def values_of(est):
    return est.model.bound.values


@SETTINGS
@given(dense_configs())
def test_symbolic_equals_numeric(cfg):
    est = interpreted(cfg)  # closed forms: the symbolic interpreter
    vals = values_of(est)
    for stage in est.stages:
        for c in CATEGORIES:
            assert stage.exprs[c].xreplace(vals) == stage.exact[c]
        assert stage.total_expr.xreplace(vals) == sum(stage.exact.values())


@SETTINGS
@given(dense_configs())
def test_general_form_agrees_with_resolved_form(cfg):
    # resolve=False keeps Piecewise/Min: valid for all values, so it must agree at this config too
    resolved = interpreted(cfg)
    general = interpreted(cfg, resolve=False)
    numeric = interpreted(cfg, keep=frozenset())
    for r, g, n in zip(resolved.stages, general.stages, numeric.stages):
        assert r.values == g.values == n.values
        for c in CATEGORIES:
            assert g.exprs[c].xreplace(values_of(general)) == r.exact[c]


def static(est):
    return [s.static_bytes for s in est.stages]


@SETTINGS
@given(st.data(), st.sampled_from(["parallel.dp", "parallel.zero", "parallel.tp"]))
def test_more_sharding_never_increases_static_bytes(data, key):
    # every example checks the property: the config is drawn so that the key can grow
    cfg = data.draw(dense_configs(tp_room=2 if key == "parallel.tp" else 1,
                                  zero_max=2 if key == "parallel.zero" else 3))
    base = numbers(cfg)
    grown = {"parallel.zero": cfg["parallel"]["zero"] + 1, "parallel.dp": cfg["parallel"]["dp"] * 2,
             "parallel.tp": cfg["parallel"]["tp"] * 2}[key]
    bumped = numbers(cfg, {key: grown})
    assert max(static(bumped)) <= max(static(base))


@SETTINGS
@given(dense_configs())
def test_recompute_orders_activations(cfg):
    acts = {}
    for mode in ("none", "selective", "full"):
        est = numbers(cfg, {"training.recompute": mode})
        acts[mode] = [s.values["activations"] for s in est.stages]
    for a_full, a_sel, a_none in zip(acts["full"], acts["selective"], acts["none"]):
        assert a_full <= a_sel <= a_none


@SETTINGS
@given(dense_configs(pps=(2, 4), tied=False))
def test_pipeline_split_conserves_static_bytes(cfg):
    # the same layers on more stages: the sum over stages of parameter counts is unchanged (untied: a
    # tied head has its own copy only when it sits on another stage than the embedding)
    split = numbers(cfg)
    whole = numbers(cfg, {"parallel.pp": 1})
    assert sum(s.param_count for s in split.stages) == whole.stages[0].param_count
    assert max(static(split)) <= max(static(whole))
