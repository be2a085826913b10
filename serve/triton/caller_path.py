"""Imported first by every model file here: Triton's python-backend stub runs an isolated interpreter, which
ignores PYTHONPATH, so the entries the server was started with (serve/triton_server.py interpreter_env: the
caller's own) go ahead of site-packages here. Copied beside each model.py (serve/repository.py install_model)."""

import os
import sys

sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
