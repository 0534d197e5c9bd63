"""Importers: other tools' configs → memform YAML configs.

``memform import hf config.json`` (Hugging Face), ``memform import megatron args.txt``
(Megatron-LM arguments), ``memform import mindformers model.yaml`` (MindFormers, the
starting point of MemEst users) and ``memform import torchtitan train.toml`` (a torchtitan job config,
for the fsdp2 framework profile). Each source module fills a :class:`~.draft.Draft`; this module
adds what every import needs: the strategy defaults, data parallelism derived from a device
count, the ``formulas:`` list (chosen from the bundled files, see :mod:`.formulas`) and a final
check that the result loads, so problems show up at import time rather than at estimate time.

May import: :mod:`memform.engine` (the final load check), :mod:`memform.lang`, :mod:`memform.errors`,
:mod:`memform.resources`. The ``memform import`` command itself is :mod:`memform.cli.imports`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import MemformError
from . import deepspeed, formulas, hf, megatron, mindformers, torchtitan
from .draft import Draft

IMPORTERS: dict[str, ModuleType] = {"hf": hf, "megatron": megatron, "mindformers": mindformers,
                                    "torchtitan": torchtitan, "deepspeed": deepspeed}
_NAME_STEMS = ("config", "args", "arguments", "model", "train", "pretrain")


@dataclass
class Options:
    """What the command line adds to a source file."""

    devices: int | None = None
    name: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    check: bool = True
    model: str | None = None  # a model file for formats that describe only training (TAKES_MODEL)


def import_config(fmt: str, path: str | Path, options: Options | None = None) -> Draft:
    """Read ``path`` in format ``fmt`` (``hf``, ``megatron``, ``mindformers``) into a :class:`Draft`."""
    if fmt not in IMPORTERS:
        raise MemformError(f"unknown import format {fmt!r} (choose from {', '.join(sorted(IMPORTERS))})")
    options = options or Options()
    module = IMPORTERS[fmt]
    path = Path(path)
    draft = Draft(path, module.TITLE)
    takes_model = getattr(module, "TAKES_MODEL", False)
    if options.model is not None and not takes_model:
        raise MemformError(f"--model is not read by 'memform import {fmt}': its file describes the model itself")
    extra = {"model": Path(options.model) if options.model is not None else None} if takes_model else {}
    hinted = module.convert(path, draft, set(options.overrides), **extra)
    draft.apply(options.overrides)
    _name(draft, path, options.name)
    _strategy(draft, options.devices or hinted, from_cli=options.devices is not None)
    finish = getattr(module, "finish", None)  # an importer's last step, once dp is known
    if finish is not None:
        finish(draft)
    _formulas(draft)
    draft.header[:0] = [f"memform config imported from {path.name} ({module.TITLE}) by `memform import {fmt}`."]
    draft.header.append('Values marked "default:" were not in the source: review them before trusting the estimate.')
    if options.check:
        _check(draft)
    return draft


def _name(draft: Draft, path: Path, name: str | None) -> None:
    if name:
        draft.set("name", name)
        return
    if "name" in draft:
        return
    stem = path.name.split(".")[0]
    for suffix in ("_config", "-config", "_args", "-args"):
        stem = stem.removesuffix(suffix)
    if stem.lower() in _NAME_STEMS and path.parent.name:
        stem = path.resolve().parent.name
    draft.set("name", stem or "imported", f"from the file name {path.name}")


def _strategy(draft: Draft, devices: int | None, *, from_cli: bool) -> None:
    """Defaults for what the source left out; dp = devices / (tp × pp × cp) when a count is known."""
    if devices is not None:
        if devices <= 0:
            raise MemformError(f"--devices must be a positive integer, got {devices}")
        model_parallel = draft.get("parallel.tp", 1) * draft.get("parallel.pp", 1) * draft.get("parallel.cp", 1)
        if devices % model_parallel:
            raise MemformError(f"{devices} devices cannot hold tp × pp × cp = {model_parallel} "
                               f"({draft.source}): the device count must be a multiple of it")
        dp = devices // model_parallel
        where = "--devices" if from_cli else "the launcher / --world-size"
        if "parallel.dp" in draft and draft.get("parallel.dp") != dp:
            raise MemformError(f"{devices} devices ({where}) need dp = {dp}, but the source sets dp "
                               f"{draft.get('parallel.dp')} ({draft.source})")
        if "parallel.dp" not in draft:
            draft.set("parallel.dp", dp, f"{devices} devices ({where}) / (tp × pp × cp)")
        draft.set("parallel.devices", devices, where)
    elif "parallel.dp" not in draft:
        draft.default("parallel.dp", 1, "pass --devices N (or --set parallel.dp=N) for data parallelism")
    for key in ("parallel.tp", "parallel.pp"):
        if key not in draft:
            draft.default(key, 1, "the source gives no parallel strategy")
    if "training.micro_batch_size" not in draft:
        draft.default("training.micro_batch_size", 1, "one sequence per micro-batch")
    if "training.recompute" not in draft:
        draft.default("training.recompute", "none", "no activation recomputation")
    if "device.capacity_gib" not in draft:
        draft.default("device.capacity_gib", 80, "an 80 GiB accelerator")


def _formulas(draft: Draft) -> None:
    if "formulas" in draft:  # set on the command line
        return
    # keys the framework profile binds (training.framework) are not the model files' to cover
    profile = _profile_keys(draft.get("training.framework"))
    files, missing = formulas.choose(k for k in draft.entries if k not in profile)
    if missing:
        draft.warn(f"no bundled formula file reads {', '.join(missing)} yet; named "
                   f"{', '.join(files)} (the agreed file names)")
    why = "dense transformer" if files == [formulas.BASE] else "the bundled files that read every key below"
    draft.set("formulas", files, why)


def _profile_keys(framework: object) -> frozenset[str]:
    """Config keys a bundled framework profile binds beyond dense.mf (its own knobs, e.g. ``fsdp2.*``)."""
    if not isinstance(framework, str) or framework.endswith(".mf"):
        return frozenset()
    base = formulas.coverage([formulas.BASE])
    with_profile = formulas.coverage([formulas.BASE, f"frameworks/{framework}.mf"])
    if base is None or with_profile is None:
        return frozenset()
    return with_profile.keys - base.keys


def _check(draft: Draft) -> None:
    from ..engine.model import load_model
    try:
        load_model(draft.config())
    except MemformError as exc:
        draft.warn(f"the imported config does not load yet: {exc.render().splitlines()[0]}")
