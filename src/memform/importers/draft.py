"""What every importer shares: typed reads from a foreign config, and the memform config it builds.

An importer reads one source file (a Hugging Face ``config.json``, Megatron-LM arguments, a
MindFormers YAML) through :class:`Fields`, which checks types, names the file and field in
every error and remembers which fields were used, so that the rest can be refused unless the
importer lists them as memory-neutral (:meth:`Draft.refuse_unused`).
It writes a :class:`Draft`: dotted memform keys with a note on where each value came from;
values the source did not give are marked as defaults so the emitted YAML says what to review.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from ..errors import MemformError, read_text

#: the order sections are written in; anything else follows
SECTION_ORDER = ("name", "formulas", "model", "parallel", "training", "device")

_MISSING = object()

#: file stems that name no model: the folder's name is used instead (``Meta-Llama-3-8B/config.json``)
_NAME_STEMS = ("config", "args", "arguments", "model", "train", "pretrain", "default", "ds", "deepspeed")
#: file extensions dropped from a default name (case-insensitive)
_NAME_EXTENSIONS = (".json", ".yaml", ".yml", ".txt", ".sh", ".toml", ".args")
#: what marks a file as a config rather than naming the model (``llama3-8b.config.json``)
_NAME_SUFFIX = re.compile(r"[._-](config|args|arguments)$", re.IGNORECASE)


def describe(value: Any) -> str:
    if value is None:
        return "null"
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
            dict: "mapping"}.get(type(value), type(value).__name__)
    return f"{kind} {value!r}"


@dataclass
class Fields:
    """A mapping read from ``file``; ``where`` prefixes field names in messages (e.g. ``moe_config.``)."""

    data: Mapping[str, Any]
    file: Path
    where: str = ""
    used: set[str] = field(default_factory=set)

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def name(self, key: str) -> str:
        return f"{self.where}{key}"

    def raw(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        value = self.data.get(key, default)
        return default if value is None else value

    def error(self, key: str, what: str) -> MemformError:
        return MemformError(f"{self.file}: field '{self.name(key)}' {what}")

    def missing(self, key: str, why: str = "") -> MemformError:
        return MemformError(f"{self.file}: required field '{self.name(key)}' is missing{why}")

    def integer(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> Any:
        """An integer >= ``minimum`` (integral floats such as 8.0 are accepted)."""
        value = self.raw(key)
        if value is None:
            if default is _MISSING:
                raise self.missing(key)
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            bound = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.error(key, f"must be {bound}, got {describe(value)}")
        return value

    def number(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw(key)
        if value is None:
            if default is _MISSING:
                raise self.missing(key)
            return default
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(key, f"must be a number, got {describe(value)}")
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw(key)
        if value is None:
            if default is _MISSING:
                raise self.missing(key)
            return default
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {describe(value)}")
        return value

    def string(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw(key)
        if value is None:
            if default is _MISSING:
                raise self.missing(key)
            return default
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {describe(value)}")
        return value

    def first(self, keys: Iterable[str], read: Callable[[str], Any]) -> tuple[str | None, Any]:
        """The first of ``keys`` present (read with ``read``), else (None, None)."""
        for key in keys:
            if self.has(key):
                return key, read(key)
            self.used.add(key)
        return None, None

    def alias(self, keys: Iterable[str], read: Callable[[str], Any],
              why: str = "the file disagrees with itself") -> tuple[str | None, Any]:
        """A setting the format spells several ways: the first of ``keys`` present, read with ``read``;
        every other spelling present is read too and must give the same value, else an error naming both
        fields and ``why`` (GLM-4 configs carry num_layers and num_hidden_layers; MindFormers maps a dozen
        spellings onto one setting). (None, None) where none is present."""
        keys = tuple(keys)
        first, value = self.first(keys, read)
        for other in keys:
            if other != first and self.has(other):
                if read(other) != value:
                    raise self.error(other, f"is {self.raw(other)!r} but '{self.name(first)}' is "
                                            f"{self.raw(first)!r}: {why}")
                self.used.add(other)
        return first, value

    def section(self, key: str) -> "Fields":
        """A nested mapping as its own :class:`Fields` (empty when absent)."""
        value = self.raw(key, {})
        if not isinstance(value, Mapping):
            raise self.error(key, f"must be a mapping, got {describe(value)}")
        return Fields(value, self.file, f"{self.name(key)}.")

    def unused(self, ignored: Iterable[str] = ()) -> list[str]:
        skip = set(ignored) | self.used
        return [k for k in self.data if isinstance(k, str) and k not in skip]


@dataclass
class Entry:
    """One emitted config value and the comment that explains it."""

    value: Any
    note: str = ""
    default: bool = False


@dataclass
class Draft:
    """A memform config being built from a foreign one (dotted keys, insertion-ordered)."""

    source: Path
    fmt: str
    entries: dict[str, Entry] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    header: list[str] = field(default_factory=list)
    #: why the finished config does not load (the loader's message), None when it loads or was not checked
    load_error: str | None = None
    #: fields the source sets that memform neither reads nor knows to leave memory unchanged (their
    #: names as messages print them): the import refuses them unless ``--accept`` names each one
    unread: list[str] = field(default_factory=list)
    #: the file an unread field is in, where it is not :attr:`source` (deepspeed's ``--model config.json``)
    unread_file: dict[str, Path] = field(default_factory=dict)

    def set(self, path: str, value: Any, note: str = "", *, default: bool = False) -> None:
        self.entries[path] = Entry(value, note, default)

    def default(self, path: str, value: Any, why: str) -> None:
        """A value the source did not state: written with a ``# default: why`` comment."""
        self.entries[path] = Entry(value, why, True)

    def get(self, path: str, default: Any = None) -> Any:
        entry = self.entries.get(path)
        return default if entry is None else entry.value

    def __contains__(self, path: str) -> bool:
        return path in self.entries

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def refuse_unused(self, fields: Fields, neutral: Iterable[str] = ()) -> None:
        """Record every field of ``fields`` that was neither read nor listed in ``neutral`` (an
        importer's table of fields that cannot change memory, each with its reason): a field
        memform skips may change the model or the strategy, so the import refuses it at its end
        (:meth:`check_unread`) rather than warning past a silently wrong estimate."""
        for key in fields.unused(neutral):
            self.refuse_unread(fields.name(key), fields.file)

    def refuse_unread(self, name: str, file: Path | None = None) -> None:
        if name not in self.unread:
            self.unread.append(name)
        if file is not None and Path(file) != Path(self.source):
            self.unread_file[name] = Path(file)

    def check_unread(self, accepted: Iterable[str] = ()) -> None:
        """Raise (exit 2) naming every unread field ``accepted`` (``--accept``) does not name; the
        accepted ones become warnings, so the output still says what was taken on trust."""
        accept = {a.strip().lstrip("-") for a in accepted if a.strip()}
        left = [name for name in self.unread if name.lstrip("-") not in accept]
        for name in self.unread:
            if name.lstrip("-") in accept:
                self.warn(f"field '{name}' is not read by memform; taken as memory-neutral (--accept)")
        for name in sorted(accept - {n.lstrip("-") for n in self.unread}):
            self.warn(f"--accept {name}: the source sets no such unread field")
        if left:
            listed = ", ".join(f"'{name}'" + (f" (in {self.unread_file[name]})" if name in self.unread_file else "")
                               for name in left)
            flags = ",".join(name.lstrip("-") for name in left)
            raise MemformError(
                f"{self.source}: memform does not read {listed} and does not know "
                f"{'it' if len(left) == 1 else 'them'} to leave memory unchanged, so an estimate that "
                f"skipped {'it' if len(left) == 1 else 'them'} could be silently wrong. Remove "
                f"{'it' if len(left) == 1 else 'them'} from the source, or pass --accept {flags} if "
                f"{'it does' if len(left) == 1 else 'they do'} not change the model, the strategy or "
                f"the precision (the README's importer table lists what each format reads)")

    def apply(self, overrides: Mapping[str, Any]) -> None:
        """``--set`` values from the command line win over imported ones."""
        for path, value in overrides.items():
            # a key replaces what lies below it, and a scalar above it (--set training.precision=...)
            parts = path.split(".")
            above = {".".join(parts[:i]) for i in range(1, len(parts))}
            for old in [k for k in self.entries if k.startswith(path + ".") or k in above]:
                del self.entries[old]
            self.entries[path] = Entry(value, "set on the command line")

    def config(self) -> dict[str, Any]:
        """The nested mapping ``memform estimate`` reads."""
        out: dict[str, Any] = {}
        for path, entry in self.ordered():
            node = out
            parts = path.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = entry.value
        return out

    def ordered(self) -> list[tuple[str, Entry]]:
        def rank(item: tuple[str, Entry]) -> int:
            top = item[0].split(".")[0]
            return SECTION_ORDER.index(top) if top in SECTION_ORDER else len(SECTION_ORDER)
        return sorted(self.entries.items(), key=rank)  # stable: keeps import order within a section

    def to_yaml(self) -> str:
        """The config as commented YAML (comments say where each value came from)."""
        lines = [f"# {comment(line)}" if line else "#" for line in self.header]

        def emit(node: Mapping[str, Any], prefix: str, depth: int) -> None:
            for key, value in node.items():
                path = f"{prefix}{key}"
                entry = self.entries.get(path)
                if entry is None:  # a section: its keys follow, indented
                    lines.append(f"{'  ' * depth}{key}:")
                    emit(value, f"{path}.", depth + 1)
                    continue
                text = f"{'  ' * depth}{key}: {scalar(entry.value)}"
                if entry.default:
                    text += f"  # default: {comment(entry.note)}" if entry.note else "  # default"
                elif entry.note:
                    text += f"  # {comment(entry.note)}"
                lines.append(text)

        emit(self.config(), "", 0)
        return "\n".join(lines) + "\n"


def read_json(path: Path, what: str = "config.json") -> dict:
    """A JSON file holding one object (``what`` names the kind in the error); a syntax error names
    line and column."""
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MemformError(f"{path}:{exc.lineno}:{exc.colno}: JSON syntax error: {exc.msg}") from None
    if not isinstance(data, dict):
        raise MemformError(f"{path}: a {what} must hold a JSON object, got {describe(data)}")
    return data


def comment(text: str) -> str:
    """A YAML comment's text: one line of printable characters (notes may quote source values)."""
    return "".join(c if c.isprintable() else "?" for c in text)


def scalar(value: Any) -> str:
    """One YAML value on one line (lists in flow style)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False)
    return text.replace("\n...\n", "").strip()


def pad_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of ``make_vocab_size_divisible_by × tp``
    (Megatron-LM megatron/training/tokenizer/tokenizer.py, ``_vocab_size_with_padding``)."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def gated_ffn_size(hidden: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """The Llama reference code's SwiGLU width: 2/3 of 4h, times an optional multiplier, rounded
    up to ``multiple_of`` (meta-llama/llama model.py ``FeedForward.__init__``; MindFormers
    derives ``intermediate_size`` the same way when it is not given)."""
    width = int(2 * 4 * hidden / 3)
    if ffn_dim_multiplier is not None:
        width = int(ffn_dim_multiplier * width)
    return multiple_of * -(-width // multiple_of)


def dtype_name(value: str, fields: Fields, key: str) -> str:
    """A framework dtype spelling (``bfloat16``, ``float32``, ``torch.float16``) as memform's."""
    names = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16",
             "float32": "fp32", "fp32": "fp32", "float": "fp32"}
    key_name = value.lower().removeprefix("torch.").removeprefix("mstype.")
    if key_name not in names:
        raise fields.error(key, f"must be a dtype (bfloat16, float16, float32), got {describe(value)}")
    return names[key_name]


def divide(total: int, part: int, what: str, file: Path) -> int:
    if part <= 0 or total % part:
        raise MemformError(f"{file}: {what}: {total} is not divisible by {part}")
    return total // part


def default_name(path: Path) -> str:
    """A config name from a file name: the whole stem (``llama-3.1-8b.json`` → ``llama-3.1-8b``) less
    extensions and a config marker (``llama3-8b.config.json`` → ``llama3-8b``); a stem that names no
    model (``config.json``, ``train.yaml``) gives the folder's name."""
    stem = path.name
    changed = True
    while changed:
        changed = False
        for ext in _NAME_EXTENSIONS:
            if len(stem) > len(ext) and stem.lower().endswith(ext):
                stem, changed = stem[:-len(ext)], True
        if _NAME_SUFFIX.search(stem) and len(_NAME_SUFFIX.sub("", stem)) > 0:
            stem, changed = _NAME_SUFFIX.sub("", stem), True
    if stem.lower() in _NAME_STEMS or stem.lower() in {e.lstrip(".") for e in _NAME_EXTENSIONS}:
        folder = path.resolve().parent.name
        if folder:
            return folder
    return stem or "imported"
