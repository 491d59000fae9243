"""A moto S3 server on loopback for the S3 tests, the cross-language suite and the benchmark: a real HTTP endpoint that
distckpt's core, boto3 and s3fs talk to, plus what the tests read back through boto3 (objects, open multipart
uploads).

Run as a script, it serves other languages' tests (tests/crosslang/run.sh): starts the server, makes the buckets
named, prints ``export AWS_ENDPOINT_URL=...`` and the credentials as shell lines, then serves until it is
terminated (SIGTERM, SIGINT)::

    python python/tests/_s3_server.py --bucket ckpts > env.sh &
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Dict, List, Optional

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
    endpoint for distckpt's core and boto3 (AWS_ENDPOINT_URL) and for s3fs through fsspec's configuration (FSSPEC_S3,
    read when fsspec is imported).

    extra_env: more environment for the server, e.g. ``{"INITIAL_NO_AUTH_ACTION_COUNT": "4"}``: moto then checks
    signatures and IAM permissions after that many requests (made to create an IAM user and its key)."""

    def __init__(self, extra_env: Optional[Dict[str, str]] = None) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, **CREDENTIALS, **(extra_env or {})},
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the moto server did not start") from None
                time.sleep(0.1)
        if not extra_env:  # its own API answers once the app is loaded (with authentication on, it counts as a request)
            urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=30).read()

    def env(self) -> dict:
        return {
            **CREDENTIALS,
            "AWS_ENDPOINT_URL": self.endpoint,
            "FSSPEC_S3": json.dumps({"client_kwargs": {"endpoint_url": self.endpoint}}),
        }

    def client(self, service: str = "s3", **kwargs):
        """A boto3 client of this server (the test's own view of the store, never through distckpt)."""
        import boto3

        args = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
        return boto3.client(service, endpoint_url=self.endpoint, **{**args, **kwargs})

    def new_bucket(self) -> str:
        bucket = f"b{time.monotonic_ns()}"
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def keys(self, bucket: str, prefix: str = "") -> List[str]:
        """The keys below `prefix`, sorted."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def open_uploads(self, bucket: str) -> List[str]:
        """The keys of the multipart uploads begun and neither completed nor aborted."""
        return [u["Key"] for u in self.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]

    def s3fs(self, **kwargs):
        import s3fs

        return s3fs.S3FileSystem(client_kwargs={"endpoint_url": self.endpoint}, **kwargs)

    def kill(self) -> None:
        """SIGKILL: the server dies with whatever it was doing (and everything it stored)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description="a moto S3 server on loopback for tests in other languages")
    ap.add_argument("--bucket", action="append", default=[], help="a bucket to create (repeatable)")
    args = ap.parse_args()
    server = MotoServer()
    try:
        for b in args.bucket:
            server.client().create_bucket(Bucket=b)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        for k, v in {**CREDENTIALS, "AWS_ENDPOINT_URL": server.endpoint}.items():
            print(f"export {k}={v}")
        sys.stdout.flush()
        while server.proc.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
