"""Importers: other tools' configs → memform YAML configs.

``memform import hf config.json`` (Hugging Face; a checkpoint folder reads its ``config.json``),
``memform import megatron args.txt`` (Megatron-LM arguments), ``memform import mindformers model.yaml``
(MindFormers, the starting point of MemEst users), ``memform import hyperparallel train.yaml``
(HyperParallel's memory-estimation YAML, MemEst's PyTorch fixture format), ``memform import
torchtitan train.toml`` (a torchtitan job config, for the fsdp2 framework profile) and ``memform
import deepspeed ds_config.json``. Each source module fills a :class:`~.draft.Draft`; this module
adds what every import needs: the config's name, the strategy defaults, data parallelism derived
from a device count, the ``formulas:`` list (chosen from the bundled files, see :mod:`.formulas`)
and a final check that the result loads (``Draft.load_error``: the command still writes the config,
then exits 2), so problems show up at import time rather than at estimate time.

May import: :mod:`memform.engine` (the final load check), :mod:`memform.lang`, :mod:`memform.errors`,
:mod:`memform.resources`. The ``memform import`` command itself is :mod:`memform.cli.imports`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Mapping, Sequence

from ..errors import MemformError
from . import formulas
from .draft import Draft, default_name


class _Importers(Mapping[str, ModuleType]):
    """Format name -> its importer module, imported on first use (so that ``memform --help`` or
    ``memform estimate`` does not load every importer's parser)."""

    NAMES = ("hf", "megatron", "mindformers", "hyperparallel", "torchtitan", "deepspeed")

    def __getitem__(self, name: str) -> ModuleType:
        if name not in self.NAMES:
            raise KeyError(name)
        return importlib.import_module(f"{__name__}.{name}")

    def __iter__(self) -> Iterator[str]:
        return iter(self.NAMES)

    def __len__(self) -> int:
        return len(self.NAMES)


IMPORTERS: Mapping[str, ModuleType] = _Importers()


@dataclass
class Options:
    """What the command line adds to a source file."""

    devices: int | None = None
    name: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    check: bool = True
    model: str | None = None  # a model file for formats that describe only training (TAKES_MODEL)
    adapter: str | None = None  # hf: PEFT's adapter_config.json of a LoRA fine-tuning job
    trainer: str | None = None  # hf: the job's TrainingArguments (training_args.json) or TRL YAML recipe
    #: unread source fields the user vouches for as memory-neutral (``--accept``; see Draft.check_unread)
    accept: tuple[str, ...] = ()
    #: megatron: the launch script's own positional arguments (``--args "a b c"``: $1, $2, ..., $#, $@)
    script_args: tuple[str, ...] | None = None


def import_config(fmt: str, path: str | Path | Sequence[str | Path], options: Options | None = None) -> Draft:
    """Read ``path`` in format ``fmt`` (a key of :data:`IMPORTERS`) into a :class:`Draft`.

    ``path`` may be a list: several files are accepted only by formats whose source is spread over
    files (:func:`takes_several_files`). ``hf`` also takes a checkpoint folder (its ``config.json``).
    The result's ``load_error`` says why the finished config does not load (None: it loads).
    """
    if fmt not in IMPORTERS:
        raise MemformError(f"unknown import format {fmt!r} (choose from {', '.join(sorted(IMPORTERS))})")
    options = options or Options()
    module = IMPORTERS[fmt]
    paths = [Path(p) for p in ([path] if isinstance(path, (str, Path)) else path)]
    if not paths:
        raise MemformError(f"'memform import {fmt}' needs a file to read")
    if len(paths) > 1 and not takes_several_files(fmt):
        raise MemformError(f"'memform import {fmt}' reads one file, got {len(paths)} "
                           f"({', '.join(str(p) for p in paths)})")
    if fmt == "hf":
        paths = [_hf_config(p) for p in paths]
    path = paths[0]
    draft = Draft(path, module.TITLE)
    takes_model = getattr(module, "TAKES_MODEL", False)
    if options.model is not None and not takes_model:
        raise MemformError(f"--model is not read by 'memform import {fmt}': its file describes the model itself")
    extra: dict[str, Any] = {"model": Path(options.model) if options.model is not None else None} if takes_model else {}
    if options.script_args is not None:
        if not getattr(module, "TAKES_ARGS", False):
            raise MemformError(f"--args is read by 'memform import megatron' only (a launch script's positional "
                               f"arguments), not by 'memform import {fmt}'")
        extra["args"] = list(options.script_args)
    source: Path | list[Path] = paths if len(paths) > 1 else path
    # the overrides as a mapping: an importer may test a key's presence (``in``) or read its value
    # (megatron: a value its script leaves unknown may come from --set)
    if options.adapter is not None and fmt != "hf":
        raise MemformError(f"--adapter is read by 'memform import hf' only (a PEFT adapter_config.json over a "
                           f"Hugging Face model), not by 'memform import {fmt}'")
    if options.trainer is not None and fmt not in ("hf", "deepspeed"):
        raise MemformError(f"--trainer is read by 'memform import hf' and 'memform import deepspeed' only (a "
                           f"Hugging Face Trainer's TrainingArguments), not by 'memform import {fmt}'")
    if options.trainer is not None and fmt == "deepspeed":   # the Trainer running that ds_config
        extra["trainer"] = Path(options.trainer)
    hinted = module.convert(source, draft, dict(options.overrides), **extra)
    if options.adapter is not None:
        from . import peft

        peft.convert(Path(options.adapter), draft)
    if options.trainer is not None and fmt == "hf":   # hf_trainer.py: batch, precision, optimizer, checkpointing, TRL's LoRA
        from . import hf_trainer

        hf_trainer.convert(Path(options.trainer), draft, dict(options.overrides), adapter=options.adapter is not None)
    draft.apply(options.overrides)
    adjust = getattr(module, "adjust", None)  # an importer's reading of --set values (megatron: vocab padding)
    if adjust is not None:
        adjust(draft, options.overrides)
    _name(draft, path, options.name)
    _strategy(draft, options.devices or hinted, from_cli=options.devices is not None)
    finish = getattr(module, "finish", None)  # an importer's last step, once dp is known
    if finish is not None:
        finish(draft)
    draft.check_unread(options.accept)
    _formulas(draft)
    names = ", ".join(p.name for p in paths)
    draft.header[:0] = [f"memform config imported from {names} ({module.TITLE}) by `memform import {fmt}`."]
    draft.header.append('Values marked "default:" were not in the source: review them before trusting the estimate.')
    if options.check:
        _check(draft)
    return draft


def takes_several_files(fmt: str) -> bool:
    """Whether ``memform import FMT`` reads a source spread over several files (Megatron-LM: a launch
    script and its argument files): the importer module sets ``MULTI_FILE = True``, and its
    ``convert`` then takes one path or a list of them."""
    return bool(getattr(IMPORTERS[fmt], "MULTI_FILE", False))


def _hf_config(path: Path) -> Path:
    """A Hugging Face checkpoint folder stands for its ``config.json``."""
    if not path.is_dir():
        return path
    config = path / "config.json"
    if not config.is_file():
        raise MemformError(f"{path}: a folder, but it holds no config.json (give the config.json file, "
                           f"or the checkpoint folder that has one)")
    return config


def _name(draft: Draft, path: Path, name: str | None) -> None:
    if name:
        draft.set("name", name, "--name")
        return
    if "name" in draft:  # the source's model id (Hugging Face _name_or_path, HyperParallel model.name)
        return
    draft.set("name", default_name(path), f"from the file name {path.name}")


def _strategy(draft: Draft, devices: int | None, *, from_cli: bool) -> None:
    """Defaults for what the source left out; dp = devices / (tp × pp × cp) when a count is known."""
    if devices is not None:
        if devices <= 0:
            raise MemformError(f"--devices must be a positive integer, got {devices}")
        model_parallel = draft.get("parallel.tp", 1) * draft.get("parallel.pp", 1) * draft.get("parallel.cp", 1)
        if devices % model_parallel:
            hint = "" if from_cli else (" (the count comes from the launcher line, one node's worth in many "
                                        "example scripts: pass --devices N with the job's whole device count)")
            raise MemformError(f"{devices} devices cannot hold tp × pp × cp = {model_parallel} "
                               f"({draft.source}): the device count must be a multiple of it{hint}")
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
    profile = f"frameworks/{framework}.mf"
    base = formulas.coverage([formulas.BASE])
    with_profile = formulas.coverage([formulas.BASE, profile])
    if base is None or with_profile is None:
        return frozenset()
    keys = set(with_profile.keys - base.keys)
    # the profile's refinements of other model files (frameworks/NAME/F.mf, loaded after the profile when a
    # config loads F.mf: engine/config.py) bind knobs too, e.g. megatron.moe_token_dispatcher_type
    from ..resources import formulas_dir
    for companion in sorted((formulas_dir() / "frameworks" / framework).glob("*.mf")):
        model_file = companion.name
        alone = formulas.coverage([model_file])
        refined = formulas.coverage([model_file, profile, f"frameworks/{framework}/{model_file}"])
        if alone is not None and refined is not None:
            keys |= refined.keys - alone.keys
    return frozenset(keys)


def _check(draft: Draft) -> None:
    """Load the finished config as ``memform estimate`` would; record the loader's message if it fails."""
    from ..engine.model import load_model
    try:
        load_model(draft.config())
    except MemformError as exc:
        draft.load_error = exc.render()
