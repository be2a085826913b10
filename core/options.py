"""Command options as dataclasses: each command's config is a dataclass whose fields carry their help text, and the
command line is generated from it (types from the annotations, `--no-X` for booleans), so the same command is
callable from Python with the dataclass. Torch-free: `--help` must not wait for torch."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Literal, TypeVar, get_args, get_origin

T = TypeVar("T")


def option(default: Any = dataclasses.MISSING, help: str = "", *, factory=None, **argparse_kw: Any) -> Any:
    """A dataclass field with its command-line help; `argparse_kw` go to add_argument (choices, metavar, type,
    positional=True for an argument without `--`, cli=False for a field the command line does not set)."""
    meta = {"help": help, **argparse_kw}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _base_type(hint: Any) -> tuple[Any, list | None]:
    """(scalar type, choices) of an annotation: `int | None` -> int; Literal["a", "b"] -> str with choices."""
    if get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else str
    if get_origin(hint) is Literal:
        choices = list(get_args(hint))
        return type(choices[0]), choices
    return hint, None


def add_options(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One flag per field of `cls` (dataclass), `--snake-case` from snake_case, help from the field's metadata."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata)
        if f.name in skip or not meta.pop("cli", True) or not f.init:
            continue
        help_text = meta.pop("help", "")
        positional = meta.pop("positional", False)
        typ, choices = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        kw: dict[str, Any] = {"help": help_text, **meta}
        if typ is bool and not positional:
            kw.update(action=argparse.BooleanOptionalAction, default=default)
        else:
            if get_origin(typ) is list:
                item = get_args(typ)[0]
                kw.setdefault("type", lambda s, item=item: [item(x) for x in s.split(",") if x])
            elif typ in (int, float, str):
                kw.setdefault("type", typ)
            if choices is not None:
                kw.setdefault("choices", choices)
            if not positional:
                kw["default"] = default
        if positional:
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                kw.setdefault("nargs", "?")
                kw["default"] = default
            parser.add_argument(f.name, **kw)
        else:
            parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, **kw)


def int_list(text: str) -> list[int]:
    """A comma list of integers (a flag's type)."""
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list of integers") from None


def require_at_least(cfg: Any, bounds: dict[str, int]) -> None:
    """A command config's counts that cannot work (--epochs 0, --img 8) refused before anything runs, in one line
    naming the flag; a field left at None (a default to be filled later) is not checked."""
    from yolov9.core.errors import BadInput

    for name, low in bounds.items():
        value = getattr(cfg, name)
        if value is not None and value < low:
            raise BadInput(f"--{name.replace('_', '-')} {value}: must be at least {low}")


def from_namespace(cls: type[T], ns: argparse.Namespace, **extra: Any) -> T:
    """The dataclass a parsed command line describes (fields the parser did not set keep their defaults)."""
    names = {f.name for f in dataclasses.fields(cls) if f.init and f.metadata.get("cli", True)}
    kw = {k: v for k, v in vars(ns).items() if k in names}
    return cls(**{**kw, **extra})
