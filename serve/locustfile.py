"""Locust scenario for load beyond one client machine: the same requests as `yolov9 loadtest`.

    locust -f serve/locustfile.py --host http://127.0.0.1:8080 --headless -u 50 -r 10 -t 30s
Images come from $YOLOV9_LOADTEST_IMAGES (default: the shipped samples)."""

import itertools
import os
from pathlib import Path

from locust import HttpUser, between, task

from yolov9.core.detection_defaults import CONF
from yolov9.core.paths import SAMPLE_IMAGES

_FOLDER = Path(os.environ.get("YOLOV9_LOADTEST_IMAGES", SAMPLE_IMAGES))
_IMAGES = [p.read_bytes() for p in sorted(_FOLDER.glob("*.jpg"))]
_CYCLE = itertools.cycle(range(len(_IMAGES)))
_CONF = os.environ.get("YOLOV9_LOADTEST_CONF", str(CONF))


class DetectUser(HttpUser):
    wait_time = between(0, 0.01)

    @task
    def detect(self):
        self.client.post(
            f"/v1/detect?conf={_CONF}",
            data=_IMAGES[next(_CYCLE)],
            headers={"Content-Type": "image/jpeg"},
            name="/v1/detect",
        )
