"""The formula language: each feature, and each mistake a formula author can make."""

from __future__ import annotations

import textwrap
from pathlib import Path

import json
import re

import pytest
import sympy

import memform
from memform.errors import MemformError
from memform.lang.loader import EVERY_KEY, load_program
from memform.lang.parser import parse_text

HEADER = """
symbol h : int = model.hidden_size "hidden size"
symbol n : int = model.num_layers "layers"
symbol b : int = training.micro_batch_size default 1 "micro-batch"
symbol m : int = training.num_micro_batches default 1 "micro-batches"
symbol p : int = parallel.pp default 1 "stages"
schedule 1f1b { inflight = min(p - stage, m) }
block layer {
  params = 0
  param_bytes = 2 * params
  grad_bytes = 2 * params
  optimizer_bytes = 12 * params
  act = 0
  comm = 0
}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def model(tmp_path: Path, body: str, **model_keys) -> memform.Estimate:
    f = write(tmp_path, "m.mf", HEADER + body)
    cfg = {"formulas": [str(f)], "model": {"hidden_size": 8, "num_layers": 4, **model_keys}}
    return memform.estimate(cfg)


def test_arithmetic_functions_and_conditionals(tmp_path):
    est = model(tmp_path, """
        option fancy : bool = model.fancy default false "x"
        def twice(x) = 2 * x
        let w = if fancy and not (h < 4) then ceil(h / 3) else floor(h / 3)
        block dec extends layer {
          params = twice(w) + max(h, 3) + log2(h) + 7 % 4 + 2^3
          act = h * b
        }
        stack { dec * n }
    """, fancy=True)
    per = est.stages[0].layers[0].per_layer_values
    assert per["param_count"] == 2 * 3 + 8 + 3 + 3 + 8
    assert per["activations"] == 8


def test_variants_default_and_specific(tmp_path):
    body = """
        block dec extends layer {
          act = 10 * h
          act[full] = h
        }
        stack { dec * n }
    """
    f = write(tmp_path, "m.mf", HEADER + body)
    for mode, want in (("none", 80), ("selective", 80), ("full", 8)):
        est = memform.estimate({"formulas": [str(f)], "model": {"hidden_size": 8, "num_layers": 4},
                                "training": {"recompute": mode}})
        assert est.stages[0].layers[0].per_layer_values["activations"] == want


def test_extends_is_late_bound(tmp_path):
    # layer.param_bytes = 2 * params must use the child's params
    est = model(tmp_path, "block dec extends layer { params = h }\nstack { dec * n }")
    assert est.stages[0].values["params"] == 2 * 8 * 4


def test_override_in_later_file(tmp_path):
    base = write(tmp_path, "base.mf", HEADER + "block dec extends layer { params = h  act = h }\nstack { dec * n }")
    over = write(tmp_path, "over.mf", "block dec { act = 3 * h }\n")
    est = memform.estimate({"formulas": [str(base), str(over)], "model": {"hidden_size": 8, "num_layers": 4}})
    layer = est.stages[0].layers[0]
    assert layer.per_layer_values["activations"] == 24
    assert layer.per_layer_values["param_count"] == 8  # untouched quantity survives
    assert "over.mf" in layer.sources["activations"]


def test_super_is_the_definition_a_later_file_replaces(tmp_path):
    # a profile adds to a block whatever file defined it: per variant, and through inheritance
    base = write(tmp_path, "base.mf", HEADER + """
        block dec extends layer {
          params = h
          act[none, selective] = 10 * h
          act[full] = h
        }
        stack { dec * n }
    """)
    over = write(tmp_path, "over.mf", "block dec { act[none] = super + 1  act[full] = 2 * super  comm = super + h }\n")
    for mode, act in (("none", 81), ("selective", 80), ("full", 16)):
        est = memform.estimate({"formulas": [str(base), str(over)], "training": {"recompute": mode},
                                "model": {"hidden_size": 8, "num_layers": 4}})
        per = est.stages[0].layers[0].per_layer_values
        assert (per["activations"], per["comm"]) == (act, 8)   # comm: layer's 0, inherited, + h


def test_super_without_an_earlier_definition(tmp_path):
    write(tmp_path, "base.mf", HEADER + "block dec extends layer { params = h }\n")
    expect_error(tmp_path, 'include "base.mf"\nblock dec { fancy = super + 1 }\n', "no file before this one defines 'fancy'")
    err = expect_error(tmp_path, HEADER + "let w = super * 2\n", "'super' (the definition a quantity replaces)")
    assert err.loc.line == HEADER.count("\n") + 1


def test_include_resolves_relative_and_bundled(tmp_path):
    write(tmp_path, "lib.mf", "let k = 5\n")
    main = write(tmp_path, "main.mf", 'include "lib.mf"\nlet j = k + 1\n')
    prog = load_program([main])
    assert set(prog.lets) == {"k", "j"}
    bundled = write(tmp_path, "x.mf", 'include "common.mf"\n')
    assert "bytes_master" in load_program([bundled]).lets


def test_a_program_is_loaded_once_until_a_file_it_read_changes(tmp_path):
    """load_program returns the program it loaded before for the same files and texts (a config's every
    estimate loads the same one), and loads again where a loaded file's text, an include's target or a
    `when` answer differs -- never a stale program."""
    write(tmp_path, "lib.mf", "let k = 5\n")
    main = write(tmp_path, "main.mf", 'include "lib.mf"\nlet j = k + 1\n')
    first = load_program([main])
    assert load_program([main]) is first
    write(tmp_path, "lib.mf", "let k = 6\nlet extra = 1\n")            # a file it included changed
    second = load_program([main])
    assert second is not first and "extra" in second.lets
    shadow = write(tmp_path, "common.mf", "let mine = 1\n")             # an include now finds a nearer file
    bundled = write(tmp_path, "x.mf", 'include "common.mf"\n')
    shadow.unlink()
    assert "bytes_master" in load_program([bundled]).lets
    write(tmp_path, "common.mf", "let mine = 1\n")
    assert set(load_program([bundled]).lets) == {"mine"}
    write(tmp_path, "late.mf", "let late = 1\n")                        # a `when` answered otherwise
    cond = write(tmp_path, "cond.mf", 'symbol w : int = model.w default 1 "w"\ninclude "late.mf" when model.w\n')
    assert "late" not in load_program([cond], config={}).lets
    assert "late" in load_program([cond], config={"model": {"w": 2}}).lets
    assert "late" not in load_program([cond], config={}).lets


def test_source_locations_kept():
    f = parse_text("let x = 1\n\nlet y = x + 2\n", "f.mf")
    assert (f.decls[1].loc.file, f.decls[1].loc.line) == ("f.mf", 3)


def expect_error(tmp_path, text, fragment, name="bad.mf"):
    path = write(tmp_path, name, text)
    with pytest.raises(MemformError) as info:
        load_program([path])
    assert fragment in str(info.value), str(info.value)
    return info.value


def test_syntax_error_has_line_column_and_caret(tmp_path):
    err = expect_error(tmp_path, "let a = 1\nlet b = (a + * 2)\n", "syntax error")
    assert err.loc.line == 2 and err.loc.col == 14
    assert "let b = (a + * 2)" in err.render() and "^" in err.render()
    assert str(err).startswith(f"{tmp_path / 'bad.mf'}:2:14:")


def test_unknown_symbol_did_you_mean(tmp_path):
    err = expect_error(tmp_path, HEADER + "let w = hh * 2\n", "unknown symbol 'hh'")
    assert "did you mean 'h'" in str(err)


def test_duplicate_definition_same_file(tmp_path):
    expect_error(tmp_path, "let a = 1\nlet a = 2\n", "defined twice")


def test_duplicate_quantity_in_block(tmp_path):
    expect_error(tmp_path, HEADER + "block x extends layer { act = 1 act = 2 }\n", "defined twice in block")


def test_cyclic_lets(tmp_path):
    expect_error(tmp_path, "let a = b + 1\nlet b = c\nlet c = a\n", "cyclic definition")


def test_cyclic_quantities_through_blocks(tmp_path):
    expect_error(tmp_path, HEADER + "block x extends layer { act = y.act }\nblock y extends layer { act = x.act }\n",
                 "cyclic definition")


def test_cyclic_extends(tmp_path):
    expect_error(tmp_path, "block a extends b { q = 1 }\nblock b extends a { q = 2 }\n", "cyclic 'extends'")


def test_missing_variant(tmp_path):
    expect_error(tmp_path, HEADER + "block dec extends layer { act[none] = 1 act[selective] = 2 }\n"
                 "stack { dec * n }\n", "no formula for recompute mode 'full'")


def test_unknown_variant_name(tmp_path):
    expect_error(tmp_path, HEADER + "block dec extends layer { act[ful] = 1 }\n", "did you mean 'full'")


def test_include_cycle(tmp_path):
    write(tmp_path, "a.mf", 'include "b.mf"\n')
    write(tmp_path, "b.mf", 'include "a.mf"\n')
    with pytest.raises(MemformError, match="include cycle"):
        load_program([tmp_path / "a.mf"])


def test_wrong_arity_and_unknown_function(tmp_path):
    expect_error(tmp_path, "let a = ceil(1, 2)\n", "takes 1 argument")
    expect_error(tmp_path, "let a = cel(1)\n", "did you mean 'ceil'")


def test_layer_block_missing_quantity(tmp_path):
    expect_error(tmp_path, HEADER + "block lonely { act = 1 }\nstack { lonely * n }\n", "must define params")


def test_string_compared_with_number(tmp_path):
    with pytest.raises(MemformError, match="string"):
        model(tmp_path, 'option k : {"x", "y"} = model.kind default "x" "k"\n'
                        'block dec extends layer { act = if k == 1 then 1 else 2 }\nstack { dec * n }\n')


def test_require_names_keys(tmp_path):
    with pytest.raises(MemformError, match=r"n must be even \(model.num_layers = 3"):
        model(tmp_path, 'require n % 2 == 0 "n must be even"\nblock dec extends layer { }\nstack { dec * n }\n'
              .replace("model(", ""), num_layers=3)


def test_resolve_false_keeps_piecewise(tmp_path):
    f = write(tmp_path, "m.mf", HEADER + "block dec extends layer { act = if h > 4 then h else 0 }\nstack { dec * n }")
    cfg = {"formulas": [str(f)], "model": {"hidden_size": 8, "num_layers": 4}}
    resolved = memform.estimate(cfg)
    assert resolved.stages[0].layers[0].per_layer["activations"] == sympy.Symbol("h", positive=True, integer=True)
    assert "h > 4" in resolved.assumptions
    general = memform.estimate(cfg, resolve=False)
    assert isinstance(general.stages[0].layers[0].per_layer["activations"], sympy.Piecewise)
    assert general.stages[0].values == resolved.stages[0].values


def test_cyclic_extends_closed_by_an_override_points_at_the_override(tmp_path):
    write(tmp_path, "base.mf", "block a { q = 1 }\nblock b extends a { q = 2 }\n")
    over = write(tmp_path, "over.mf", 'include "base.mf"\nblock a extends b { }\n')
    with pytest.raises(MemformError, match="cyclic 'extends'") as info:
        load_program([over])
    assert info.value.loc.file.endswith("over.mf") and info.value.loc.line == 2


# ---- per-layer choices in the stack, and `int | list` options ------------------------------------

PATTERN = """
option freq : int[1..64] | list = model.moe_layer_freq default 1 "MoE layer pattern"
def is_moe(i) = if is_list(freq) then at(freq, i) != 0 else i % freq == 0
block dense extends layer { params = h }
block sparse extends layer { params = 10 * h }
stack { dense * 1  sparse * (n - 1) if is_moe(layer_index) else dense }
"""


@pytest.mark.parametrize("freq, layout", [
    # layer_index counts the body layers from 0 (the dense one in front is layer 0): Megatron-LM's
    # --moe-layer-freq rule, layer i is MoE when i % N == 0 (gpt_layer_specs.py moe_layer_pattern)
    # (the partition merges neighbouring layers of one block into a group)
    (1, [(1, "dense"), (5, "sparse")]),
    (2, [(2, "dense"), (1, "sparse"), (1, "dense"), (1, "sparse"), (1, "dense")]),
    (3, [(3, "dense"), (1, "sparse"), (2, "dense")]),
    ([0, 1, 1, 0, 0, 1], [(1, "dense"), (2, "sparse"), (2, "dense"), (1, "sparse")]),
])
def test_stack_choice_picks_a_block_per_layer(tmp_path, freq, layout):
    est = model(tmp_path, PATTERN, num_layers=6, moe_layer_freq=freq)
    groups = [(g.count_value, g.block) for g in est.partition.chunks[0][0].groups]
    assert groups == layout
    n_sparse = sum(c for c, blk in layout if blk == "sparse")
    assert est.stages[0].param_count == 8 * (6 - n_sparse) + 80 * n_sparse


def test_stack_choice_of_one_block_keeps_the_symbolic_count(tmp_path):
    f = write(tmp_path, "m.mf", HEADER + PATTERN)
    m = memform.load_model({"formulas": [str(f)], "model": {"hidden_size": 8, "num_layers": 6}})
    items = memform.api.stack_items(m, m.evaluator())
    n = sympy.Symbol("n", positive=True, integer=True)
    assert [(i.block, i.count, i.count_value) for i in items] == [("dense", 1, 1), ("sparse", n - 1, 5)]
    m = memform.load_model({"formulas": [str(f)], "model": {"hidden_size": 8, "num_layers": 6, "moe_layer_freq": 5}})
    items = memform.api.stack_items(m, m.evaluator())
    assert [(i.block, i.count_value) for i in items] == [("dense", 1), ("dense", 4), ("sparse", 1)]


def test_stack_choice_splits_over_pipeline_stages(tmp_path):
    f = write(tmp_path, "m.mf", HEADER + PATTERN)
    est = memform.estimate({"formulas": [str(f)], "model": {"hidden_size": 8, "num_layers": 6, "moe_layer_freq": 2},
                            "parallel": {"pp": 2}})
    assert [s.param_count for s in est.stages] == [8 + 8 + 80, 8 + 80 + 8]


def test_stack_choice_round_trips_through_the_printer():
    from memform.lang.printer import print_file
    src = HEADER + PATTERN
    tree = parse_text(src, "t.mf")
    printed = print_file(tree)
    assert "sparse * (n - 1) if is_moe(layer_index) else dense" in printed
    assert "option freq : int[1..64] | list = model.moe_layer_freq" in printed
    assert print_file(parse_text(printed, "again.mf")) == printed


@pytest.mark.parametrize("text, fragment", [
    ("stack { dense * n if layer_index > 0 else nowhere }", "unknown block 'nowhere'"),
    ("let x = layer_index", "unknown symbol 'layer_index'"),
    ("stack { dense * n if lyer_index > 0 else dense }", "did you mean 'layer_index'"),
    ("let x = at(1, 2, 3)", "takes 2 arguments"),
])
def test_stack_choice_mistakes(tmp_path, text, fragment):
    expect_error(tmp_path, HEADER + "block dense extends layer { params = h }\n" + text + "\n", fragment)


# ---- chained choices, per-layer `where` bindings and `list {...}` options (hybrid / NAS stacks) ----

HYBRID = """
option kinds : list {"M", "*", "-"} = model.hybrid_pattern default "M" "one layer kind per layer"
symbol f : int = model.ffn_hidden_size default 4 "FFN width"
option layer_f : int | list = model.layer_ffn default 0 "per-layer FFN widths"
block mamba extends layer { params = h }
block attn extends layer { params = 3 * h  act = b * h }
block mlp extends layer { params = f }
stack { mamba * len(kinds) if at(kinds, layer_index) == "M" else attn if at(kinds, layer_index) == "*" else mlp }
"""


@pytest.mark.parametrize("pattern, layout", [
    # Megatron-LM's hybrid pattern letters (mamba_hybrid_layer_allocation.py): M mamba, * attention, - MLP;
    # the first block whose condition holds, the last `else` otherwise; neighbours of one block merge
    ("M-M*-", [(1, "mamba"), (1, "mlp"), (1, "mamba"), (1, "attn"), (1, "mlp")]),
    ("MM**--", [(2, "mamba"), (2, "attn"), (2, "mlp")]),
    (["M", "-", "-"], [(1, "mamba"), (2, "mlp")]),
    ("***", [(3, "attn")]),
])
def test_chained_stack_choice_reads_a_layer_pattern(tmp_path, pattern, layout):
    est = model(tmp_path, HYBRID, hybrid_pattern=pattern, ffn_hidden_size=5)
    groups = [(g.count_value, g.block) for g in est.partition.chunks[0][0].groups]
    assert groups == layout
    per = {"mamba": 8, "attn": 24, "mlp": 5}
    assert est.stages[0].param_count == sum(c * per[blk] for c, blk in layout)


NAS = """
option layer_f : int | list = model.layer_ffn default 0 "per-layer FFN widths"
option kv : int | list = model.layer_kv default 1 "per-layer K/V heads"
symbol f : int = model.ffn_hidden_size default 4 "FFN width"
block dec extends layer { params = h + f + kv  act = b * f }
stack { dec * n where f = at(layer_f, layer_index), kv = if is_list(kv) then at(kv, layer_index) else kv }
"""


def test_stack_bindings_give_each_layer_its_own_values(tmp_path):
    # DeciLM-style heterogeneous layers: each layer's block evaluated with f and kv replaced, as
    # `params where f = ..., kv = ...` would; equal neighbours merge into one group
    est = model(tmp_path, NAS, num_layers=5, layer_ffn=[10, 10, 0, 7, 7], layer_kv=[2, 2, 2, 0, 0])
    groups = [(g.count_value, g.bindings) for g in est.partition.chunks[0][0].groups]
    assert groups == [(2, (("f", 10), ("kv", 2))), (1, (("f", 0), ("kv", 2))), (2, (("f", 7), ("kv", 0)))]
    assert est.stages[0].param_count == 2 * (8 + 10 + 2) + (8 + 0 + 2) + 2 * (8 + 7)
    assert est.stages[0].values["activations"] == 2 * 10 + 0 + 2 * 7
    layers = est.stages[0].layers
    assert [lr.per_layer_values["param_count"] for lr in layers] == [20, 10, 15]
    assert est.parameters["total"] == 2 * 20 + 10 + 2 * 15
    # pipeline stages cut through the groups; each piece keeps its layers' values
    est2 = memform.estimate({"formulas": [str(tmp_path / "m.mf")], "parallel": {"pp": 2},
                             "model": {"hidden_size": 8, "num_layers": 4, "layer_ffn": [10, 3, 3, 10], "layer_kv": 1}})
    assert [s.param_count for s in est2.stages] == [(8 + 10 + 1) + (8 + 3 + 1), (8 + 3 + 1) + (8 + 10 + 1)]


def test_stack_bindings_numeric_path_and_closed_forms_agree(tmp_path):
    from memform.engine.model import estimate_model, load_model
    f = write(tmp_path, "m.mf", HEADER + NAS)
    cfg = {"formulas": [str(f)], "model": {"hidden_size": 8, "num_layers": 3, "layer_ffn": [4, 6, 6], "layer_kv": 2}}
    sym = estimate_model(load_model(cfg), keep=frozenset())
    num = estimate_model(load_model(cfg, numeric=True), resolve=True)
    assert [s.values for s in sym.stages] == [s.values for s in num.stages]
    h = sympy.Symbol("h", positive=True, integer=True)
    closed = estimate_model(load_model(cfg)).stages[0].param_count_expr
    assert sympy.simplify(closed - (3 * h + 4 + 12 + 6)) == 0


AFTER = """
option layer_f : int | list = model.layer_ffn default 0 "per-layer widths"
symbol f : int = model.ffn_hidden_size default 4 "FFN width"
block dec extends layer { params = f  act = f }
schedule after { inflight = 1  moment warmup = layers_sum(act)  moment backward = warmup + layers_max(3 * act - layers_after(act)) }
stack { dec * n where f = at(layer_f, layer_index) }
"""


@pytest.mark.parametrize("widths, backward", [
    # layers_after(act): the later layers' act (count x act per group); the stage's last group counts itself
    # once (its second-to-last layer has one of it after it). warmup = the sum of the widths.
    ([5, 5, 5], 15 + 3 * 5 - 5),                           # identical layers: one layer's act after
    ([40, 2, 2, 2], 46 + max(120 - 6, 6 - 2)),             # a wide first layer: the three after it freed
    ([2, 2, 40], 44 + max(6 - 40, 120 - 40)),              # a wide last layer counts itself once
    ([7, 3, 9], 19 + max(21 - 12, 9 - 9, 27 - 9)),         # three groups
])
def test_layers_after_sums_the_later_layers_of_the_stage(tmp_path, widths, backward):
    f = write(tmp_path, "m.mf", HEADER + AFTER)
    cfg = {"formulas": [str(f)], "model": {"hidden_size": 8, "num_layers": len(widths), "layer_ffn": widths},
           "parallel": {"pp_schedule": "after"}}
    from memform.engine.model import estimate_model, load_model
    for numeric in (False, True):
        est = estimate_model(load_model(cfg, numeric=numeric), keep=frozenset())
        assert est.stages[0].moments == {"warmup": sum(widths), "backward": backward}


@pytest.mark.parametrize("text, fragment", [
    ("schedule s2 { inflight = 1  moment x = layers_after(act) }", "inside the argument of layers_sum/max/last"),
    ("schedule s2 { inflight = 1  moment x = layers_max(layers_after(layers_sum(act))) }", "cannot hold another"),
    ("block b2 extends layer { act = layers_after(act) }", "inside the argument"),
])
def test_layers_after_mistakes(tmp_path, text, fragment):
    expect_error(tmp_path, HEADER + "block dense extends layer { params = h }\nstack { dense * n }\n" + text + "\n",
                 fragment)


def test_stack_bindings_are_held_to_every_require(tmp_path):
    # a per-layer value is refused as the config-wide one would be, naming the layer and the key
    body = NAS + 'symbol t : int = parallel.tp default 1 "tp"\nrequire f % t == 0 "parallel.tp must divide each FFN width"\n'
    est = model(tmp_path, body, num_layers=3, layer_ffn=[4, 8, 4], layer_kv=1, ffn_hidden_size=4)
    assert est.stages[0].param_count == 3 * 8 + 16 + 3
    f = write(tmp_path, "m.mf", HEADER + body)
    with pytest.raises(MemformError, match=r"parallel.tp must divide each FFN width \(at layer 1 of the stack entry "
                                           r"'dec': f = 6 in place of model.ffn_hidden_size"):
        memform.estimate({"formulas": [str(f)], "parallel": {"tp": 4},
                          "model": {"hidden_size": 8, "num_layers": 3, "layer_ffn": [4, 6, 4], "layer_kv": 1,
                                    "ffn_hidden_size": 4}})


@pytest.mark.parametrize("pattern, params", [
    # has(kinds, "*"): whether the list holds the name at least once
    ("M-M", 8 + 5 + 8), ("M*-", 8 + 24 + 5 + 100), ("**", 24 + 24 + 100),
])
def test_has_asks_whether_a_list_option_holds_a_name(tmp_path, pattern, params):
    # one more layer (an extra block) in the stack where the pattern has an attention layer
    body = HYBRID.replace("stack { ", 'block extra extends layer { params = 100 }\nstack { last extra * (if has(kinds, "*") then 1 else 0)  ')
    est = model(tmp_path, body, hybrid_pattern=pattern, ffn_hidden_size=5)
    assert est.parameters["total"] == params


def test_has_mistakes_on_list_options(tmp_path):
    expect_error(tmp_path, HEADER + HYBRID.replace("stack {", 'let x = has(kinds, "Q")\nstack {'),
                 "'Q' is not a member of list option 'kinds'")


def test_empty_string_is_an_empty_name_list_whatever_the_names(tmp_path):
    body = ('option kinds : list {"attention", "linear"} = model.kinds default "" "x"\n'
            'block dense extends layer { params = h }\nstack { dense * (n + len(kinds)) }\n')
    assert model(tmp_path, body, num_layers=2).stages[0].param_count == 16
    assert model(tmp_path, body, num_layers=2, kinds=["linear"]).stages[0].param_count == 24


def test_chained_choice_and_bindings_round_trip_through_the_printer():
    from memform.lang.printer import print_file
    for body in (HYBRID, NAS):
        printed = print_file(parse_text(HEADER + body, "t.mf"))
        assert print_file(parse_text(printed, "again.mf")) == printed
    printed = print_file(parse_text(HEADER + HYBRID, "t.mf"))
    assert ('mamba * len(kinds) if at(kinds, layer_index) == "M" else attn if at(kinds, layer_index) == "*" '
            'else mlp') in printed
    assert 'option kinds : list {"M", "*", "-"}' in printed
    assert "dec * n where f = at(layer_f, layer_index), kv = if is_list(kv) then at(kv, layer_index) else kv" in print_file(
        parse_text(HEADER + NAS, "t.mf"))


@pytest.mark.parametrize("text, fragment", [
    ("stack { dense * n if layer_index > 0 else dense if layer_index > 1 else nowhere }", "unknown block 'nowhere'"),
    ("stack { dense * n where zz = 1 }", "must name a symbol or an option"),
    ("stack { dense * n where h = 1, h = 2 }", "binds a name twice"),
    ("stack { dense * n where h = lyer_index }", "did you mean 'layer_index'"),
])
def test_chained_choice_and_binding_mistakes(tmp_path, text, fragment):
    expect_error(tmp_path, HEADER + "block dense extends layer { params = h }\n" + text + "\n", fragment)


@pytest.mark.parametrize("pattern, fragment, where", [
    ("M-X", "entry 2, 'X', is not one of them", "config"),
    ("M-X", "entry 2, 'X', is not one of them", "default"),
    (["M", "**"], "entry 1, '**'", "config"),
    (3, "must be a list of names, one per entry", "config"),
])
def test_names_list_option_mistakes(tmp_path, pattern, fragment, where):
    with pytest.raises(MemformError, match=re.escape(fragment)):
        if where == "config":
            model(tmp_path, HYBRID, hybrid_pattern=pattern)
        else:  # a default is an expression: a string, never a YAML list
            model(tmp_path, HYBRID.replace('default "M"', f"default {json.dumps(pattern)}"))


@pytest.mark.parametrize("freq, fragment", [
    ([1, 0], "at(): index 2 is outside the list of 2 entries"),
    ([1, True, 0, 0, 0, 0], "must be an integer in 1..64, or a list of integers"),
    ("every", "must be an integer in 1..64, or a list of integers"),
])
def test_int_or_list_option_mistakes(tmp_path, freq, fragment):
    with pytest.raises(MemformError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        model(tmp_path, PATTERN, num_layers=6, moe_layer_freq=freq)


def test_a_list_is_not_a_number(tmp_path):
    with pytest.raises(MemformError, match="a list cannot be used as a number"):
        model(tmp_path, PATTERN.replace("params = 10 * h", "params = 10 * h + freq"), num_layers=6,
              moe_layer_freq=[1, 1, 1, 1, 1, 1])
    with pytest.raises(MemformError, match=r"len\(\) needs a list"):
        model(tmp_path, PATTERN.replace("params = 10 * h", "params = len(freq)"), num_layers=6)


def test_a_def_may_take_no_arguments(tmp_path):
    est = model(tmp_path, "def width() = 3 * h\nblock dec extends layer { params = width() }\nstack { dec * n }")
    assert est.stages[0].param_count == 4 * 24
    expect_error(tmp_path, "def width() = 3\nlet x = width(1)\n", "takes 0 arguments")


# ---- set options: any subset of named members (Megatron's --recompute-modules) ------------------------
SET_BODY = """
    option parts : set {"attn", "mlp", "norm"} = model.parts default "attn" "modules"
    block dec extends layer {
      params = 1
      act = 100 * has(parts, "attn") + 10 * has(parts, "mlp") + has(parts, "norm")
    }
    stack { dec * n }
"""


@pytest.mark.parametrize("value, act", [
    (None, 100),                      # the default, one name
    (["mlp", "norm"], 11),            # a YAML list
    ("attn,norm", 101),               # a command line's comma- or space-separated names
    ("attn mlp norm", 111),
    ([], 0),                          # the empty set
])
def test_set_option_members_are_read_with_has(tmp_path, value, act):
    keys = {} if value is None else {"parts": value}
    est = model(tmp_path, SET_BODY, **keys)
    assert est.stages[0].layers[0].per_layer_values["activations"] == act


def test_set_option_refuses_a_name_outside_the_set(tmp_path):
    with pytest.raises(MemformError, match=r"config key 'model.parts' must be a list of names from .*'mpl' is not one"):
        model(tmp_path, SET_BODY, parts=["attn", "mpl"])
    with pytest.raises(MemformError, match="config key 'model.parts'"):
        model(tmp_path, SET_BODY, parts=3)


def test_has_checks_its_arguments_when_the_file_loads(tmp_path):
    err = expect_error(tmp_path, HEADER + SET_BODY.replace('has(parts, "mlp")', 'has(parts, "mpl")'),
                       "'mpl' is not a member of set option 'parts'")
    assert "did you mean 'mlp'" in str(err) and err.loc.line > 1
    expect_error(tmp_path, HEADER + SET_BODY.replace('has(parts, "mlp")', 'has(h, "mlp")'),
                 "has() takes a set or list option")


def test_set_option_default_must_be_members(tmp_path):
    body = 'option bad : set {"a", "b"} = model.bad default "c" "x"\nblock d extends layer { params = has(bad, "a") }\nstack { d * n }\n'
    with pytest.raises(MemformError, match="default of option 'bad'.*must be a list of names"):
        model(tmp_path, body)


# ---- tensors(...): a list value of numbers (the allocator replay's tensor sizes, README "formula language")
TENSORS = """
option wide : bool = model.wide default false "x"
let parts = tensors(h, 2 * h)
block dec extends layer {
  params = h
  sizes = tensors(parts, 3, if wide then 4 * h else 1)
  both = if wide then tensors(h, h) else tensors(1, 2)
}
stack { dec * n }
"""


@pytest.mark.parametrize("wide, sizes, both", [
    # h = 8: parts = (8, 16) flattened in place, then 3, then the if's branch
    (False, (8, 16, 3, 1), (1, 2)),
    (True, (8, 16, 3, 32), (8, 8)),          # an if between two lists of one length: entry by entry
])
def test_tensors_is_a_flat_list_of_numbers(tmp_path, wide, sizes, both):
    from memform.engine.model import load_model
    path = write(tmp_path, "m.mf", HEADER + TENSORS)
    model_ = load_model({"formulas": [str(path)], "model": {"hidden_size": 8, "num_layers": 2, "wide": wide}})
    ev = model_.evaluator(keep=frozenset())   # every symbol replaced by its number
    assert tuple(int(x) for x in ev.quantity("dec", "sizes")) == sizes
    assert tuple(int(x) for x in ev.quantity("dec", "both")) == both


@pytest.mark.parametrize("text, fragment", [
    ("params = h + tensors(h, h)", "a list cannot be used as a number"),
    ("params = len(tensors(h, 2 * h)) + at(tensors(h, 2 * h), 1)", None),   # 2 + 16: at() and len() read it
    ("params = at(tensors(h), 0)", "takes at least 2 arguments"),
])
def test_tensors_mistakes_and_list_functions(tmp_path, text, fragment):
    body = f"block dec extends layer {{ {text} }}\nstack {{ dec * n }}"
    if fragment is None:
        assert model(tmp_path, body).stages[0].param_count == 4 * 18
    else:
        with pytest.raises(MemformError, match=re.escape(fragment)):
            model(tmp_path, body)


# ---- named tensors(...) entries and slots(): positions by name (README "formula language")
NAMED = """
option wide : bool = model.wide default false "x"
block dec extends layer {
  params = h
  norm_t = tensors(x32: 4 * h, rstd: 4, y: 2 * h)
  saved = tensors(norm1: norm_t, attn: tensors(q: h, k: 2 * h), norm2: norm_t, 7)
  pos = slots(saved, "norm1", "norm1.y", "attn.k", "norm2.rstd", "end")
  entry = at(saved, "attn.k")
  both = if wide then tensors(a: h, b: h) else tensors(a: 1, b: 2)
  pos_both = slots(both, "b", "a")
}
stack { dec * n }
"""


@pytest.mark.parametrize("numeric", [False, True])
@pytest.mark.parametrize("wide", [False, True])
def test_named_entries_are_read_by_name(tmp_path, numeric, wide):
    from memform.engine.model import load_model
    path = write(tmp_path, "m.mf", HEADER + NAMED)
    cfg = {"formulas": [str(path)], "model": {"hidden_size": 8, "num_layers": 2, "wide": wide}}
    ev = load_model(cfg, numeric=True).evaluator() if numeric else load_model(cfg).evaluator(keep=frozenset())
    # h = 8: norm1 = (32, 4, 16) at 0..2, attn = (8, 16) at 3..4, norm2 at 5..7, 7 at 8 (unnamed); "end" = 9
    assert tuple(int(x) for x in ev.quantity("dec", "saved")) == (32, 4, 16, 8, 16, 32, 4, 16, 7)
    assert tuple(int(x) for x in ev.quantity("dec", "pos")) == (0, 2, 4, 6, 9)
    assert int(ev.quantity("dec", "entry")) == 16
    assert tuple(int(x) for x in ev.quantity("dec", "pos_both")) == (1, 0)   # either branch names the same


def test_named_entries_survive_an_undecided_condition(tmp_path):
    # resolve=False keeps h > 4 undecided: the two lists are chosen entry by entry, their names kept
    from memform.engine.model import load_model
    body = ("block dec extends layer { params = h\n  both = if h > 4 then tensors(a: h, b: 2 * h) else tensors(a: 1, b: 2)\n"
            "  pos = slots(both, \"b\", \"end\") }\nstack { dec * n }")
    path = write(tmp_path, "m.mf", HEADER + body)
    ev = load_model({"formulas": [str(path)], "model": {"hidden_size": 8, "num_layers": 2}}).evaluator(resolve=False)
    assert isinstance(ev.quantity("dec", "both")[1], sympy.Piecewise)
    assert tuple(int(x) for x in ev.quantity("dec", "pos")) == (1, 2)


def test_named_entries_round_trip_through_the_printer():
    from memform.lang.printer import print_file
    text = 'let x = tensors(a: 1, 2, b: tensors(c: 3, 4))\nlet y = slots(x, "b.c", "end")\nlet z = max(1, 2)\n'
    tree = parse_text(text, "t.mf")
    assert print_file(tree) == text
    assert parse_text(print_file(tree), "t.mf").decls[0].expr.names == ("a", None, "b")


@pytest.mark.parametrize("text, fragment", [
    ("params = max(a: h, h)", "only tensors(...) names its entries"),
    ("params = h + len(tensors(q: h, q: h))", "'q' names two entries"),
    ("params = h + len(tensors(end: h, h))", "'end' cannot name an entry"),
    ("params = h + len(slots(tensors(q: h, k: h), q))", "slots() takes the names of the list's entries, in quotes"),
])
def test_named_entry_mistakes_found_by_the_checker(tmp_path, text, fragment):
    err = expect_error(tmp_path, HEADER + f"block dec extends layer {{ {text} }}\nstack {{ dec * n }}", fragment)
    assert err.loc is not None and err.loc.file.endswith("bad.mf") and err.loc.line == 16


@pytest.mark.parametrize("text, fragment", [
    ('at(slots(tensors(q: h, k: h), "kk"), 0)', "no entry of this list is named 'kk' (did you mean 'k'?)"),
    ('at(slots(tensors(h, h), "k"), 0)', "it names none"),
    ('at(tensors(q: h, k: h), "end")', "no entry of this list is named 'end'"),
    # the same name inside two unnamed list entries: readable only once the entries are named
    ('at(slots(tensors(tensors(q: h, k: h), tensors(q: h, k: h)), "q"), 0)', "'q' names more than one entry"),
    ('at(slots(h, "q"), 0)', "slots() needs a tensors(...) list"),
])
def test_named_entry_mistakes_found_where_the_list_is_read(tmp_path, text, fragment):
    with pytest.raises(MemformError, match=re.escape(fragment)) as info:
        model(tmp_path, f"block dec extends layer {{ params = h + {text} }}\nstack {{ dec * n }}")
    assert info.value.loc is not None and info.value.loc.line == 16


# the hf-trainer decoder's forward temporaries were placed by position until names replaced them: the
# positions its names give are those it held (frameworks/hf-trainer.mf at commit 795b61f, decoder
# fwd_slot / fwd_until lines 109-111 and 119-120), on every recompute mode
OLD_FWD_SLOT = (0, 1, 2, 3, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 8, 8, 9, 10, 11, 16, 16)
OLD_FWD_UNTIL = (16, 1, 3, 7, 4, 5, 6, 4, 4, 4, 4, 5, 5, 5, 5, 6, 8, 16, 9, 11, 16, 16, 16)


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_hf_trainer_temporaries_keep_their_positions(mode):
    from memform.engine.model import load_model
    root = Path(__file__).resolve().parents[1]
    m = load_model(root / "configs" / "llama3-8b.yaml", ["training.framework=hf-trainer", "hf_trainer.amp=bf16"],
                   numeric=True)
    ev = m.evaluator()
    assert len(ev.quantity("decoder", "fwd_tensor", mode)) == len(OLD_FWD_SLOT)
    assert tuple(ev.quantity("decoder", "fwd_slot", mode)) == OLD_FWD_SLOT
    assert tuple(ev.quantity("decoder", "fwd_until", mode)) == OLD_FWD_UNTIL


# ---- `stage` in lets and defs: the stage of the schedule, runtime or cost block that reads them
STAGED = """
let not_last = p > 1 and stage < p - 1
def held(x) = if not_last then x else 0
schedule 1f1b { inflight = min(p - stage, m) + held(1) }
runtime first_only { bytes = if stage == 0 then 0 else held(100) + 5 * stage }
block dec extends layer { params = h  act = 1 }
stack { dec * n }
"""


@pytest.mark.parametrize("numeric", [False, True])
def test_stage_is_read_in_lets_and_defs(tmp_path, numeric):
    from memform.engine.model import estimate
    base = write(tmp_path, "base.mf", HEADER)
    extra = write(tmp_path, "staged.mf", STAGED)
    cfg = {"formulas": [str(base), str(extra)], "model": {"hidden_size": 8, "num_layers": 6},
           "parallel": {"pp": 3}, "training": {"num_micro_batches": 4}}
    est = estimate(cfg, numeric=numeric) if numeric else estimate(cfg, keep=frozenset())
    # 2 layers a stage, act 1: inflight min(3 - i, 4) + (1 on stages 0, 1; 0 on the last)
    assert [int(s.values["activations"]) for s in est.stages] == [2 * 4, 2 * 3, 2 * 1]
    # runtime: stage 0 none, stage 1 held 100 + 5, stage 2 (the last) 0 + 10
    assert [int(s.values["runtime"]) for s in est.stages] == [0, 105, 10]
    # read from Python without a stage (as the allocator reads its lets, once per model): a clear error
    from memform.engine.model import load_model
    ev = load_model(cfg, numeric=numeric).evaluator()
    with pytest.raises(MemformError, match="'not_last' reads the pipeline stage"):
        ev.let("not_last")
    assert ev.let("not_last", stage=ev.integer(1)) is True and ev.let("not_last", stage=ev.integer(2)) is False


@pytest.mark.parametrize("text, fragment", [
    ("let x = stage + 1\nblock dec extends layer { params = h + x }", "'x' reads the pipeline stage ('stage'), which is "
     "bound only in schedule, runtime and cost blocks (and in the lets and defs they use), not in a layer block"),
    ("let x = stage + 1\nlet y = 2 * x\ncomm c { bytes = y }\nblock dec extends layer { params = h }",
     "'y' reads the pipeline stage"),
    ("def f() = stage\nrequire f() >= 0 \"stage\"\nblock dec extends layer { params = h }", "f() reads the pipeline stage"),
    ("option o : int = model.o default stage \"o\"\nblock dec extends layer { params = h + o }",
     "'stage' is only defined inside schedule"),
])
def test_stage_readers_used_where_no_stage_is_bound(tmp_path, text, fragment):
    err = expect_error(tmp_path, HEADER + text + "\nstack { dec * n }", fragment)
    assert err.loc is not None and err.loc.file.endswith("bad.mf")


# ---- include ... after profile / when KEY (what Python's load order used to decide for offload.mf) -----------
LATE = """option extra : int[0..100] = model.extra default 0 "x"
option other : int[0..100] = model.other default 0 "y"
block dec { act = super * 10 + extra + other }
"""


def _late_model(tmp_path, include: str):
    """A model file that includes late.mf as ``include``, and a profile of its own that doubles each layer's act."""
    write(tmp_path, "late.mf", LATE)
    base = write(tmp_path, "base.mf", HEADER + "block dec extends layer { act = h * b }\nstack { dec * n }\n" + include + "\n")
    profile = write(tmp_path, "profile.mf", "block dec { act = super * 2 }\n")
    return {"formulas": [str(base)], "model": {"hidden_size": 8, "num_layers": 4},
            "training": {"framework": str(profile)}}


def _act(est) -> int:
    return est.stages[0].values["activations"]


def test_include_after_profile_follows_the_framework_profile(tmp_path):
    """In place, late.mf comes before the profile, whose `super * 2` then doubles it: (8·10)·2 per layer; after the
    profile it has the last word: (8·2)·10."""
    in_place = _late_model(tmp_path, 'include "late.mf"')
    assert _act(memform.estimate(in_place)) == 4 * 8 * 10 * 2
    after = _late_model(tmp_path, 'include "late.mf" after profile')
    assert _act(memform.estimate(after)) == 4 * 8 * 2 * 10
    files = [Path(f).name for f in memform.load_model(after).program.files]
    assert files[-2:] == ["profile.mf", "late.mf"]


def test_include_when_a_key_is_set_with_any_value(tmp_path):
    """`when model.extra`: loaded for a config that sets the key (0 included: its keys are declared there),
    not for one that does not (whose numbers and key set are what they were without the include)."""
    cfg = _late_model(tmp_path, 'include "late.mf" after profile when model.other or model.extra')
    without = memform.load_model(cfg)
    assert "late.mf" not in {Path(f).name for f in without.program.files}
    assert _act(memform.estimate(cfg)) == 4 * 8 * 2
    for extra, per_layer in ((0, 8 * 2 * 10), (5, 8 * 2 * 10 + 5)):
        set_ = {**cfg, "model": {**cfg["model"], "extra": extra}}
        assert _act(memform.estimate(set_)) == 4 * per_layer
        # rebind loads the program again where an include's answer changes
        assert _act(memform.estimate_model(memform.rebind(without, {"model.extra": extra}))) == 4 * per_layer
    # the lint and the importers' key coverage take every `when` include; a program of files alone none
    assert "extra" in load_program([tmp_path / "base.mf"], config=EVERY_KEY).bindings
    assert "extra" not in load_program([tmp_path / "base.mf"]).bindings
    from cli_inprocess import memform_in_process
    keys = memform_in_process("keys", "--formulas", tmp_path / "base.mf")
    assert keys.returncode == 0 and "model.extra" in keys.stdout and "late.mf" in keys.stdout


def test_include_after_profile_of_a_file_loaded_before_it_is_an_error(tmp_path):
    cfg = _late_model(tmp_path, 'include "late.mf" after profile')
    cfg["formulas"] = [str(tmp_path / "base.mf"), str(tmp_path / "late.mf")]
    with pytest.raises(MemformError) as info:
        memform.estimate(cfg)
    assert info.value.loc.file.endswith("base.mf") and info.value.loc.line == HEADER.count("\n") + 3
    assert "must load after the framework profile" in str(info.value) and "leave it out" in str(info.value)


@pytest.mark.parametrize("include, fragment, col", [
    ('include "late.mf" after profile when model.extar', "no loaded formula file binds config key 'model.extar'", 1),
    ('include "late.mf" after', "syntax error: unexpected end of file; expected 'profile'", 19),
    ('include "late.mf" when', "syntax error: unexpected end of file; expected a name", 19),
    ('include "late.mf" when model.extra or', "expected a name", 36),
])
def test_include_misuse_is_a_located_error_exit_2(tmp_path, include, fragment, col):
    from cli_inprocess import memform_in_process
    _late_model(tmp_path, include)
    r = memform_in_process("check", tmp_path / "base.mf")
    line = HEADER.count("\n") + 3
    assert r.returncode == 2 and fragment in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert f"base.mf:{line}:{col}" in r.stderr, r.stderr
    if "extar" in include:
        assert "did you mean 'model.extra'" in r.stderr


def test_include_clauses_print_back():
    from memform.lang.printer import print_file
    text = 'include "x.mf" if "dense.mf" after profile when a.b or c\n'
    tree = parse_text(text)
    assert print_file(tree) == text
    assert (tree.decls[0].when, tree.decls[0].after_profile, tree.decls[0].keys) == ("dense.mf", True, ("a.b", "c"))
