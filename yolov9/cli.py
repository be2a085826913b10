"""The `yolov9` command, above the three stages: each stage registers its own subcommands (train/cli.py,
export/cli.py, serve/cli.py) and `quickstart` chains them."""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys


class HelpFormatter(argparse.HelpFormatter):
    """Adds '(default: X)' to a flag's help unless the help already names its default or there is none to name."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def _all_parsers(p: argparse.ArgumentParser):
    yield p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _all_parsers(child)


def build_parser() -> argparse.ArgumentParser:
    from yolov9 import quickstart, val
    from yolov9.export import cli as export_cli
    from yolov9.serve import cli as serve_cli
    from yolov9.train import cli as train_cli

    p = argparse.ArgumentParser(prog="yolov9", description="Train, export, serve and load-test YOLOv9 detectors.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = sub.add_parser("bench", help="benchmarks (train step, inference engines, serving pipeline)").add_subparsers(
        dest="bench", required=True, metavar="WHAT"
    )
    quickstart.register(sub)
    train_cli.register(sub, bench)
    export_cli.register(sub, bench)
    val.register(sub)
    serve_cli.register(sub, bench)
    for parser in _all_parsers(p):
        parser.formatter_class = HelpFormatter
        parser.set_defaults(_parser=parser)  # the deepest one parsed wins: the command's own, for its errors
    return p


# the official scripts' spellings of options this project spells shorter
OFFICIAL_SPELLINGS = {
    "--batch-size": "--batch",
    "--imgsz": "--img",
    "--img-size": "--img",
    "--conf-thres": "--conf",
    "--iou-thres": "--iou",
}


def unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """argparse's message for arguments that no option of the command takes, with the fix for the habits they mostly
    come from: the official scripts' spellings (--batch-size, --img-size, positional arguments written as --weights
    and --source) and Ultralytics' key=value."""
    options = {s for a in parser._actions for s in a.option_strings}
    positionals = {a.dest: a.metavar or a.dest.upper() for a in parser._actions if not a.option_strings}
    hints = []
    for arg in extra:
        key, eq, value = arg.partition("=")
        flag = "--" + key.lstrip("-").replace("_", "-")
        ours = OFFICIAL_SPELLINGS.get(flag, flag)
        if eq and not arg.startswith("-") and ours in options:
            hints.append(f"write {arg} as {ours} {value}")
        elif ours != flag and ours in options:
            hints.append(f"{flag} is {ours} here")
        elif arg.startswith("--") and flag[2:].replace("-", "_") in positionals:
            hints.append(f"{positionals[flag[2:].replace('-', '_')]} is positional: give it without {key}")
    return f"unrecognized arguments: {' '.join(extra)}" + (f" ({'; '.join(hints)})" if hints else "")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    args, extra = build_parser().parse_known_args(argv)
    if extra:  # said by the command's own parser, with its usage line, not the top level's
        args._parser.error(unrecognized(args._parser, extra))
    return args


def main(argv: list[str] | None = None) -> int:
    # a crash inside native code (an engine's runtime, a CUDA library) then names the Python call it came from
    faulthandler.enable()
    args = parse(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given, for commands that start others
    from yolov9.core.errors import UsageError

    try:
        args.func(args)
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except UsageError as e:  # a mistake the user can fix: one line, no traceback
        if "YOLOV9_DEBUG" in os.environ:
            raise
        print(f"yolov9 {args.command}: error: {e}", file=sys.stderr)
        return 2
    except Exception:  # a bug or a failure of the machine: its traceback, under one line saying what was running
        print(f"yolov9 {args.command}: failed running `yolov9 {' '.join(args.argv)}`:", file=sys.stderr)
        raise
