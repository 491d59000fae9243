"""A moto S3 server on loopback for the S3 tests and the benchmark: a real HTTP endpoint that s3fs and boto3 talk to."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """`python -m moto.server` in a subprocess. `env()` is what a process needs to reach it: credentials, and the
    endpoint for s3fs through fsspec's configuration (FSSPEC_S3, read when fsspec is imported) and for boto3
    (AWS_ENDPOINT_URL)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **CREDENTIALS},
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=2).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the moto server did not start") from None
                time.sleep(0.1)

    def env(self) -> dict:
        return {
            **CREDENTIALS,
            "AWS_ENDPOINT_URL": self.endpoint,
            "FSSPEC_S3": json.dumps({"client_kwargs": {"endpoint_url": self.endpoint}}),
        }

    def s3fs(self, **kwargs):
        import s3fs

        return s3fs.S3FileSystem(client_kwargs={"endpoint_url": self.endpoint}, **kwargs)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
