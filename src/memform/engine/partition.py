"""The pipeline stage partition ``layers[stage][chunk]``.

The stack declared in the formula files (``first embedding  decoder * L  last output``) is
laid out here: body layers are split into ``pp × vpp`` consecutive pieces (evenly, or as
``parallel.stage_layers`` says), each piece is placed on a (stage, chunk) by the schedule's
placement, and pinned layers go in front of the first piece / behind the last one.

Placements (named by the schedule block's ``placement`` quantity):

* ``interleaved`` -- piece k goes to stage k mod p, chunk k div p (Megatron virtual pipeline;
  with one chunk this is the plain split).
* ``v`` -- chunk 0 runs down the stages and chunk 1 back up: piece k < p goes to stage k,
  piece k ≥ p to stage 2p-1-k (zero-bubble-V / DualPipeV, Qi et al. 2024).
* ``mirror`` -- the body is cut into p pieces and each is held twice: piece k is stage k's chunk 0
  and stage p-1-k's chunk 1 (DualPipe, DeepSeek-AI 2024 §3.2.1: micro-batches enter from both ends,
  so every rank keeps two copies of parameters). ``parallel.stage_layers`` then gives each piece's
  layers, one count per stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import MemformError

#: Most layers a stack may have: real models have a few hundred; the layout walks every layer,
#: so a count like 10^9 (a typo, or a formula mistake) would otherwise run for hours.
MAX_LAYERS = 100_000


@dataclass(frozen=True)
class LayerGroup:
    """``count`` consecutive layers of one block with one recompute mode."""

    block: str
    mode: str
    count: Any            # the evaluator's number: symbolic (e.g. L/p) when the split is even, else an integer
    count_value: int
    first_layer: int      # index of the first layer in the whole stack (0-based)
    #: the stack entry's per-layer ``where`` values, sorted by name: the block is evaluated with them
    bindings: tuple[tuple[str, Any], ...] = ()


@dataclass
class Chunk:
    stage: int
    index: int
    groups: list[LayerGroup] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return sum(g.count_value for g in self.groups)


@dataclass
class Partition:
    pp: int
    vpp: int
    chunks: list[list[Chunk]]  # [stage][chunk]

    def describe(self) -> list[str]:
        """One line per stage in the compact notation ``[['1embedding', '16decoder:full']]``."""
        lines = []
        for s, chunks in enumerate(self.chunks):
            parts = []
            for c in chunks:
                parts.append("[" + ", ".join(f"{g.count_value}×{g.block}" + (f"({g.mode})" if g.mode != "none" else "")
                                             for g in c.groups) + "]")
            lines.append(f"stage {s}: " + " ".join(parts))
        return lines


@dataclass(frozen=True)
class StackItem:
    place: str | None
    block: str
    count: Any             # as written (symbolic)
    count_value: int
    bindings: tuple[tuple[str, Any], ...] = ()   # per-layer ``where`` values (see LayerGroup)


def build_partition(items: list[StackItem], *, pp: int, vpp: int, placement: str,
                    stage_layers: list[int | list[int]] | None, mode_of, pieces_symbol: Any,
                    integer: Callable[[int], Any]) -> Partition:
    """Lay the stack out on ``pp`` stages × ``vpp`` chunks.

    ``mode_of(stage, chunk, index_in_stage, block, index_in_chunk=, body_index=)`` gives each
    layer's recompute mode (the indices are ``None`` for pinned first/last layers; ``body_index``
    counts body layers in forward order from 0);
    ``pieces_symbol`` is the symbolic number of pieces (p·vpp) used for even splits (None: counts
    are plain numbers); ``integer`` makes the evaluator's integer of a group's layer count.
    """
    # an entry counted zero times (``moe_decoder * 0`` in a dense config, ``mtp * 0``) is absent
    items = [i for i in items if i.count_value > 0]
    first = [i for i in items if i.place == "first"]
    last = [i for i in items if i.place == "last"]
    body = [i for i in items if i.place is None]
    total = sum(i.count_value for i in body)
    npieces = pp * vpp
    if sum(i.count_value for i in items) > MAX_LAYERS:
        raise MemformError(f"the stack has {sum(i.count_value for i in items)} layers; memform lays out at most "
                           f"{MAX_LAYERS} (check model.num_layers and the stack counts)")
    # a stage may list its chunks' counts (Megatron-Core's --account-for-embedding/loss-in-pipeline-split
    # with a virtual pipeline: the first chunk of the first stage may hold the embedding alone, the last
    # chunk of the last stage the output alone)
    per_chunk = stage_layers is not None and any(isinstance(x, list) for x in stage_layers)
    if vpp > 1 and npieces > total and not per_chunk:
        raise MemformError(f"parallel.pp × parallel.vpp = {pp} × {vpp} = {npieces} pipeline chunks but the model "
                           f"has only {total} body layers: every chunk needs at least one (lower parallel.vpp)")
    if placement not in ("interleaved", "v", "mirror"):
        raise MemformError(f"unknown placement '{placement}' (use 'interleaved', 'v' or 'mirror')")
    if placement == "v" and vpp != 2:
        raise MemformError(f"the V-shaped schedule needs parallel.vpp = 2 (two chunks per stage), got {vpp}")
    if placement == "mirror":
        if per_chunk:
            raise MemformError("parallel.stage_layers: DualPipe (mirror placement) takes one count per piece, "
                               "not a list per stage")
        if vpp != 2 or pp % 2:
            raise MemformError(f"DualPipe (mirror placement) needs parallel.vpp = 2 (each rank holds a piece of "
                               f"each direction) and an even parallel.pp, got vpp {vpp}, pp {pp}")
        return _mirror(first, body, last, total, pp=pp, stage_layers=stage_layers, mode_of=mode_of,
                       pieces_symbol=pieces_symbol, integer=integer)

    if stage_layers is not None:
        given = sum(sum(x) if isinstance(x, list) else x for x in stage_layers)
        if given != total:
            raise MemformError(f"parallel.stage_layers sums to {given} but the model has {total} "
                               f"body layers")
        sizes = []
        for stage, per_stage in enumerate(stage_layers):
            if isinstance(per_stage, list):
                if placement != "interleaved" or len(per_stage) != vpp:
                    raise MemformError(f"parallel.stage_layers lists {len(per_stage)} chunk counts for stage {stage}: "
                                       f"a stage's list needs one count per chunk (parallel.vpp = {vpp}) and the "
                                       f"interleaved placement")
                for c, n in enumerate(per_stage):
                    ends = ((stage, c) == (0, 0) and bool(first)) or ((stage, c) == (pp - 1, vpp - 1) and bool(last))
                    if n == 0 and not ends:
                        raise MemformError(f"parallel.stage_layers gives stage {stage} chunk {c} no layers: only the "
                                           f"first chunk of the first stage (with the embedding) or the last chunk "
                                           f"of the last stage (with the output layer) may hold none")
                sizes.append(list(per_stage))
                continue
            if vpp > 1 and per_stage < vpp:
                raise MemformError(f"parallel.stage_layers gives stage {stage} {per_stage} layers, fewer than its "
                                   f"parallel.vpp = {vpp} chunks (every chunk needs at least one layer)")
            base, extra = divmod(per_stage, vpp)
            sizes.append([base + (1 if c < extra else 0) for c in range(vpp)])
        piece_sizes = [0] * npieces
        for k in range(npieces):
            s, c = _place(k, pp, placement)
            piece_sizes[k] = sizes[s][c]
        even = False
    else:
        if total % npieces:
            raise MemformError(f"{total} body layers do not split evenly over parallel.pp × parallel.vpp = "
                               f"{pp} × {vpp}; set parallel.stage_layers (one count per stage) or change pp")
        piece_sizes = [total // npieces] * npieces
        even = True

    chunks = [[Chunk(s, c) for c in range(vpp)] for s in range(pp)]
    per_piece = None if pieces_symbol is None else (lambda count: count / pieces_symbol)
    pieces, layer_no = _cut(body, piece_sizes, [_place(k, pp, placement) for k in range(npieces)], mode_of,
                            sum(i.count_value for i in first), per_piece if even else None, integer)
    for k, groups in enumerate(pieces):
        s, c = _place(k, pp, placement)
        chunks[s][c].groups.extend(groups)

    first_s, first_c = _place(0, pp, placement)
    last_s, last_c = _place(npieces - 1, pp, placement)
    head_layer = 0
    head_groups = []
    for i in first:
        head_groups.append(LayerGroup(i.block, mode_of(first_s, first_c, None, i.block, index_in_chunk=None,
                                                       body_index=None), i.count,
                                      i.count_value, head_layer, i.bindings))
        head_layer += i.count_value
    chunks[first_s][first_c].groups[:0] = head_groups
    for i in last:
        chunks[last_s][last_c].groups.append(LayerGroup(i.block, mode_of(last_s, last_c, None, i.block,
                                                                         index_in_chunk=None, body_index=None),
                                                        i.count,
                                                        i.count_value, layer_no, i.bindings))
        layer_no += i.count_value
    return Partition(pp, vpp, chunks)


def _mirror(first: list[StackItem], body: list[StackItem], last: list[StackItem], total: int, *, pp: int,
            stage_layers: list[int | list[int]] | None, mode_of, pieces_symbol: Any,
            integer: Callable[[int], Any]) -> Partition:
    """DualPipe's layout: the body cut into ``pp`` pieces (``stage_layers``: one count per piece),
    piece k on stage k as chunk 0 and on stage pp-1-k as chunk 1; the first layers go with piece 0
    and the last ones with piece pp-1, in both of their copies."""
    if stage_layers is not None:
        if sum(stage_layers) != total:
            raise MemformError(f"parallel.stage_layers sums to {sum(stage_layers)} but the model has {total} "
                               f"body layers")
        sizes, even = list(stage_layers), False
    else:
        if total % pp:
            raise MemformError(f"{total} body layers do not split evenly over the {pp} DualPipe pieces; set "
                               f"parallel.stage_layers (one count per piece) or change pp")
        sizes, even = [total // pp] * pp, True
    chunks = [[Chunk(s, c) for c in range(2)] for s in range(pp)]
    # pieces_symbol is p·vp = 2p pieces of a V; DualPipe cuts p, each twice as long
    per_piece = None if pieces_symbol is None else (lambda count: count / pieces_symbol * 2)
    pieces, layer_no = _cut(body, sizes, [(k, 0) for k in range(pp)], mode_of, sum(i.count_value for i in first),
                            per_piece if even else None, integer)
    head, tail, head_layer = [], [], 0
    for i in first:
        head.append(LayerGroup(i.block, mode_of(0, 0, None, i.block, index_in_chunk=None, body_index=None),
                               i.count, i.count_value, head_layer, i.bindings))
        head_layer += i.count_value
    for i in last:
        tail.append(LayerGroup(i.block, mode_of(pp - 1, 0, None, i.block, index_in_chunk=None, body_index=None),
                               i.count, i.count_value, layer_no, i.bindings))
        layer_no += i.count_value
    pieces[0][:0] = head
    pieces[-1].extend(tail)
    for k, groups in enumerate(pieces):
        chunks[k][0].groups.extend(groups)
        chunks[pp - 1 - k][1].groups.extend(groups)
    return Partition(pp, 2, chunks)


def _cut(body: list[StackItem], sizes: list[int], places: list[tuple[int, int]], mode_of, layer_no: int,
         per_piece, integer: Callable[[int], Any]) -> tuple[list[list[LayerGroup]], int]:
    """Cut the body into consecutive pieces of ``sizes`` layers, piece k on ``places[k]`` = (stage, chunk)
    for the layers' recompute modes; the body's first layer is stack layer ``layer_no``. ``per_piece``
    (an even split of a single body entry): the symbolic count of a piece from the entry's count.
    Returns each piece's layer groups and the stack index after the body."""
    runs = [(i.block, i.count_value, i.count, i.bindings) for i in body]
    body_start, run_idx, used = layer_no, 0, 0
    per_stage_seen: dict[int, int] = {}
    pieces = []
    for need, (s, c) in zip(sizes, places):
        modes: list[tuple[str, str, int, tuple]] = []  # (block, mode, first_layer, bindings) per layer
        while need:
            block, count, _, bindings = runs[run_idx]
            take = min(need, count - used)
            for _ in range(take):
                mode = mode_of(s, c, per_stage_seen.get(s, 0), block, index_in_chunk=len(modes),
                               body_index=layer_no - body_start)
                per_stage_seen[s] = per_stage_seen.get(s, 0) + 1
                modes.append((block, mode, layer_no, bindings))
                layer_no += 1
            used += take
            need -= take
            if used == count:
                run_idx, used = run_idx + 1, 0
        groups = _rle(modes, integer)
        if per_piece is not None and len(runs) == 1 and len(groups) == 1:
            g = groups[0]
            groups = [LayerGroup(g.block, g.mode, per_piece(runs[0][2]), g.count_value, g.first_layer, g.bindings)]
        pieces.append(groups)
    return pieces, layer_no


def _place(k: int, pp: int, placement: str) -> tuple[int, int]:
    if placement == "v":
        return (k, 0) if k < pp else (2 * pp - 1 - k, 1)
    return k % pp, k // pp


def _rle(layers: list[tuple[str, str, int, tuple]], integer: Callable[[int], Any]) -> list[LayerGroup]:
    groups: list[LayerGroup] = []
    for block, mode, no, bindings in layers:
        if groups and groups[-1].block == block and groups[-1].mode == mode and groups[-1].bindings == bindings:
            g = groups[-1]
            groups[-1] = LayerGroup(block, mode, integer(g.count_value + 1), g.count_value + 1, g.first_layer,
                                    bindings)
        else:
            groups.append(LayerGroup(block, mode, integer(1), 1, no, bindings))
    return groups
