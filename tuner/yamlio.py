"""YAML loading that remembers the line of every key, for located errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import ConfigError

Loc = tuple[str | int, ...]


class _LineLoader(yaml.SafeLoader):
    pass


def _walk(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> None:
    lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            lines[(*loc, key)] = key_node.start_mark.line + 1
            _walk(value_node, (*loc, key), lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*loc, i)] = item.start_mark.line + 1
            _walk(item, (*loc, i), lines)


def load_yaml(path: str | Path) -> tuple[Any, dict[Loc, int]]:
    """Parse a YAML file; return the data and a map from key path to 1-based line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", file=str(path)) from None
    try:
        node = yaml.compose(text, Loader=_LineLoader)
        data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(f"invalid YAML: {exc.problem}", file=str(path), line=line) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", file=str(path)) from None
    lines: dict[Loc, int] = {}
    if node is not None:
        _walk(node, (), lines)
    return data, lines


def line_of(lines: dict[Loc, int], loc: Loc) -> int | None:
    """The line of the deepest known prefix of `loc`."""
    cur = tuple(loc)
    while cur:
        if cur in lines:
            return lines[cur]
        cur = cur[:-1]
    return lines.get(())


def pydantic_to_config_error(exc: Any, file: str, lines: dict[Loc, int], prefix: Loc = ()) -> ConfigError:
    """Turn the first error of a pydantic ValidationError into a located ConfigError."""
    err = exc.errors()[0]
    loc: Loc = tuple(x for x in (*prefix, *err["loc"]) if not (isinstance(x, str) and x.startswith("function-")))
    field = ".".join(str(x) for x in loc) or "(top level)"
    value = err.get("input")
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field (not allowed here)"
    elif err["type"] == "missing":
        msg = "required field is missing"
    vtxt = ""
    if err["type"] not in ("missing",) and not isinstance(value, dict | list):
        if isinstance(value, str) and "://" in value:  # a URL's password never reaches a message
            value = re.sub(r"(//[^:/@]+:)[^@/]*@", r"\1***@", value)
        vtxt = f" (got {value!r})"
    return ConfigError(f"{msg}{vtxt}", file=file, line=line_of(lines, loc), field=field)
