"""YAML loading that remembers the line of every key, for located errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tuner.base.files import read_text_bounded
from tuner.base.redact import redact_text
from tuner.errors import ConfigError

Loc = tuple[str | int, ...]


class _LineLoader(yaml.SafeLoader):
    pass


def _walk(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> None:
    stack = [(node, loc)]
    while stack:
        node, loc = stack.pop()
        lines.setdefault(loc, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node.value)[:40]
                lines[(*loc, key)] = key_node.start_mark.line + 1
                stack.append((value_node, (*loc, key)))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[(*loc, i)] = item.start_mark.line + 1
                stack.append((item, (*loc, i)))


MAX_YAML_BYTES = 1_000_000
MAX_YAML_NODES = 20_000  # nodes after every alias is expanded (a spec has a few hundred)
MAX_YAML_DEPTH = 64
MAX_YAML_INDENT = 256


def _check_keys(node: yaml.MappingNode, loader: yaml.SafeLoader, file: str) -> None:
    """Refuse a key written twice in one mapping (YAML would keep the last silently: a second `slos:` would
    replace the real SLOs), naming both lines. Keys compare as their values (`1` and `0x1` are one key);
    keys a merge (`<<: *base`) brings in may be overridden, as YAML intends."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: PyYAML refuses it when it constructs the mapping
            continue
        if first is not None:
            raise ConfigError(f"duplicate key {key_node.value!r} (first on line {first}): each key may appear "
                              "only once in a mapping", file=file, line=line)
        seen[key] = line


def _check_graph(root: yaml.Node, file: str, loader: yaml.SafeLoader | None = None) -> None:
    """Refuse a recursive anchor, an alias expansion past MAX_YAML_NODES (a "billion laughs"), nesting past
    MAX_YAML_DEPTH, and a duplicate key (with `loader`), before anything is constructed. Walked without
    recursion."""
    count = 0
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, leaving = stack.pop()
        if leaving:
            on_path.discard(id(node))
            continue
        line = node.start_mark.line + 1
        if id(node) in on_path:
            raise ConfigError("invalid YAML: an alias refers to its own anchor (a recursive structure)",
                              file=file, line=line)
        count += 1
        if count > MAX_YAML_NODES:
            raise ConfigError(f"invalid YAML: anchors and aliases expand to over {MAX_YAML_NODES} nodes",
                              file=file, line=line)
        if depth > MAX_YAML_DEPTH:
            raise ConfigError(f"invalid YAML: nested over {MAX_YAML_DEPTH} levels deep", file=file, line=line)
        if isinstance(node, yaml.MappingNode):
            if loader is not None:
                _check_keys(node, loader, file)
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            if node.tag.endswith(":float") and str(node.value).lower().lstrip("+-") in (".nan", "nan"):
                raise ConfigError("not a number (.nan) is not a valid value anywhere in a spec", file=file,
                                  line=line)
            continue
        on_path.add(id(node))
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in children)


_LEADING_DASHES = re.compile(r"^[ \t]*((?:-[ \t]+)*)")


def _text_nesting(text: str) -> tuple[int, int, int]:
    """Before PyYAML sees the text (its scanner slows to minutes on a few thousand nested brackets): the
    deepest flow nesting ([ and { outside quotes and comments), the most block sequence dashes opening one
    line, and the widest indentation."""
    flow = deepest_flow = dashes = indent = 0
    quote = ""
    for line in text.splitlines():
        if not quote:
            m = _LEADING_DASHES.match(line)
            if m:
                dashes = max(dashes, m.group(1).count("-"))
            indent = max(indent, len(line) - len(line.lstrip(" ")))
        prev = " "
        i = 0
        while i < len(line):
            ch = line[i]
            if quote:
                if ch == "\\" and quote == '"':
                    i += 2
                    continue
                if ch == quote:
                    quote = ""
            elif ch in "'\"" and prev in " \t[{,:":
                quote = ch
            elif ch == "#" and prev in " \t":
                break
            elif ch in "[{":
                flow += 1
                deepest_flow = max(deepest_flow, flow)
            elif ch in "]}":
                flow = max(0, flow - 1)
            prev = ch
            i += 1
    return deepest_flow, dashes, indent


def load_yaml(path: str | Path) -> tuple[Any, dict[Loc, int]]:
    """Parse a YAML file; return the data and a map from key path to 1-based line. Bounded: a regular file
    of at most MAX_YAML_BYTES, alias expansion, nesting; no recursive structures, no NaN, no duplicate keys."""
    return parse_yaml(read_text_bounded(path, MAX_YAML_BYTES), str(path))


def parse_yaml(text: str, path: str) -> tuple[Any, dict[Loc, int]]:
    """`load_yaml` of a text already read (`path` names it in errors)."""
    flow, dashes, indent = _text_nesting(text)
    if flow > MAX_YAML_DEPTH or dashes > MAX_YAML_DEPTH or indent > MAX_YAML_INDENT:
        raise ConfigError(f"invalid YAML: nested over {MAX_YAML_DEPTH} levels deep (or indented over "
                          f"{MAX_YAML_INDENT} columns)", file=str(path))
    loader: _LineLoader | None = None
    try:
        loader = _LineLoader(text)  # the reader refuses unprintable characters here
        node = loader.get_single_node()
        if node is not None:
            _check_graph(node, str(path), loader)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(f"invalid YAML: {exc.problem}", file=str(path), line=line) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {str(exc).splitlines()[0]}", file=str(path)) from None
    except RecursionError:
        raise ConfigError(f"invalid YAML: nested over {MAX_YAML_DEPTH} levels deep", file=str(path)) from None
    finally:
        if loader is not None:
            loader.dispose()
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
        if isinstance(value, str):  # a URL's password never reaches a message
            value = redact_text(value)
        vtxt = f" (got {value!r})"
    return ConfigError(f"{msg}{vtxt}", file=file, line=line_of(lines, loc), field=field)
