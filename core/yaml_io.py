"""Reading the YAML files users write (dataset, hyper-parameter and model files): a syntax error becomes one line
that names the file, the line and column PyYAML found it at, and what it found."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from yolov9.core.errors import BadInput, MissingInput


def read_yaml(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise MissingInput(f"{path}: no such file")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        context = getattr(e, "context", None)
        hint = "; YAML indents with spaces, not tabs" if "\\t" in str(e) or "tab" in str(e) else ""
        raise BadInput(
            f"{path}{where}: not valid YAML: {problem}" + (f" ({context})" if context else "") + hint
        ) from None
