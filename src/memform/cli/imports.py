"""``memform import FORMAT FILE``: print (or write) a memform YAML config.

The config is written (stdout, or ``-o``) first; then the warnings (fields memform does not use,
values it assumed), each once, on stderr. Exit 0 only when the written config loads as
``memform estimate`` would load it; when it does not, the config is still written and the
command exits 2 with the loader's message. A missing required field or a malformed source file
is a MemformError (exit 2) before anything is written.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..engine.config import parse_override
from ..errors import MemformError
from ..importers import IMPORTERS, Options, import_config, takes_several_files


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="convert a Hugging Face / Megatron-LM / MindFormers / HyperParallel / "
                                      "torchtitan / DeepSpeed config to memform YAML",
                       description="Convert another tool's config into a memform config (YAML on stdout). "
                                   "Exits 0 only when the written config loads; otherwise it is still written "
                                   "and the command exits 2 with the reason.")
    p.add_argument("format", choices=sorted(IMPORTERS),
                   help="hf: config.json (or the checkpoint folder holding it); megatron: Megatron-LM arguments; "
                        "mindformers: MindFormers YAML; hyperparallel: HyperParallel's memory-estimation YAML "
                        "(model.config_overrides, train.accelerator); torchtitan: a torchtitan job config "
                        "(train_configs/*.toml); deepspeed: ds_config.json (with --model)")
    p.add_argument("file", nargs="+", help="the file to import (megatron: one or more argument files)")
    p.add_argument("-o", "--output", metavar="YAML", help="write the config here instead of stdout")
    p.add_argument("--devices", type=int, metavar="N",
                   help="total devices: derives parallel.dp = N / (tp × pp × cp)")
    p.add_argument("--name", help="the config's name (default: the source's model id, else the file name)")
    p.add_argument("--model", metavar="FILE",
                   help="deepspeed, torchtitan: the model underneath, a memform config YAML or a Hugging Face "
                        "config.json (only its shape is taken)")
    p.add_argument("--adapter", metavar="JSON",
                   help="hf: PEFT's adapter_config.json of a LoRA job (rank, target_modules, lora_dropout: lora.*)")
    p.add_argument("--trainer", metavar="FILE",
                   help="hf: the job's TrainingArguments (training_args.json, TrainingArguments.to_json_string) or a "
                        "TRL-style YAML recipe: batch, gradient accumulation, bf16/fp16, optim, gradient "
                        "checkpointing, TRL's LoRA / 4-bit fields (training.framework: hf-trainer)")
    p.add_argument("--accept", action="append", default=[], metavar="FIELD[,FIELD]",
                   help="a source field memform does not read, vouched for as memory-neutral (the import "
                        "refuses unread fields otherwise; repeatable)")
    p.add_argument("--args", dest="script_args", metavar='"ARG ..."',
                   help="megatron: the launch script's own arguments, split shell-style ($1, $2, ..., $#, $@; "
                        "e.g. Pai-Megatron-Patch's run_mcore_*.sh take some 25); or give them after -- at the "
                        "end of the command line, as to the script itself")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="set a memform key in the output, e.g. --set parallel.tp=8 (repeatable)")
    p.set_defaults(func=cmd_import)


def _script_args(text: str | None, tail: list[str] | None = None) -> tuple[str, ...] | None:
    """The launch script's positional arguments: ``--args "a b c"`` (split shell-style) or the words
    after ``--`` (already split by the shell), not both."""
    if tail is not None:
        if text is not None:
            raise MemformError("the launch script's arguments are given twice (--args and after --): give them once")
        return tuple(tail)
    if text is None:
        return None
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise MemformError(f"--args {text!r}: cannot split it shell-style: {exc}") from None


def cmd_import(args: argparse.Namespace) -> int:
    files: list[str] = list(args.file)
    if len(files) > 1 and not takes_several_files(args.format):
        raise MemformError(f"'memform import {args.format}' reads one file, got {len(files)}: "
                           f"{' '.join(files)}" + ("" if args.format == "megatron" else
                                                   " (only 'memform import megatron' reads several)"))
    overrides = dict(parse_override(o) for o in args.overrides)
    source = files if len(files) > 1 else files[0]
    draft = import_config(args.format, source, Options(devices=args.devices, name=args.name,
                                                       overrides=overrides, model=args.model,
                                                       adapter=args.adapter, trainer=args.trainer,
                                                       accept=tuple(a for arg in args.accept
                                                                    for a in arg.split(",")),
                                                       script_args=_script_args(args.script_args,
                                                                                getattr(args, "script_tail", None))))
    text = draft.to_yaml()
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise MemformError(f"cannot write {args.output}: {exc}") from None
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    where = files[0] if len(files) == 1 else ", ".join(files)
    for message in dict.fromkeys(draft.warnings):  # each once, in the order they arose
        print(f"memform: warning: {where}: {message}", file=sys.stderr)
    if draft.load_error is not None:
        written = args.output or "the config printed above"
        raise MemformError(f"{written} was written but does not load (fix the source or pass --set KEY=VALUE): "
                           f"{draft.load_error}")
    return 0
