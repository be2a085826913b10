"""The `yolov9` command: one entry point whose subcommands live with the package that does the work
(train/ for models, training and validation; export/ for engines, prediction and inference benchmarks;
serve/ for Triton, the gateway and load tests)."""

from __future__ import annotations

import argparse
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    from export import cli as export_cli
    from serve import cli as serve_cli
    from train import commands as train_commands

    p = argparse.ArgumentParser(prog="yolov9", description="Train, export, serve and load-test YOLOv9 detectors.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    bench = sub.add_parser("bench", help="benchmarks (train step, inference engines)").add_subparsers(
        dest="bench", required=True, metavar="WHAT")
    train_commands.register(sub, bench)
    export_cli.register(sub, bench)
    serve_cli.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as e:
        # user-facing errors (bad file, bad input, missing dependency) end in one line, not a traceback
        if "YOLOV9_DEBUG" in os.environ:
            raise
        print(f"yolov9 {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
