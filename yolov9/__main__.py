"""`python -m yolov9` is the `yolov9` command."""

import sys

from yolov9.cli import main

sys.exit(main())
