"""Runs a command against a moto S3 server on loopback: `with_moto.py BUCKET CMD [ARG...]` starts the server the Python
tests use (python/tests/_s3_server.py), creates BUCKET with an unsigned PUT, runs CMD with the server's AWS_*
environment (the endpoint and credentials, as the AWS CLI reads them), stops the server and exits with CMD's status.
Run it with the repository's venv (.venv/bin/python, which has moto[server]); run.sh does."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python", "tests"))
from _s3_server import MotoServer  # noqa: E402

AWS_VARS = ("AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE")


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    bucket, cmd = argv[1], argv[2:]
    server = MotoServer()
    try:
        urllib.request.urlopen(urllib.request.Request(f"{server.endpoint}/{bucket}", method="PUT"), timeout=30).read()
        env = {k: v for k, v in os.environ.items() if k not in AWS_VARS}
        env.update(server.env())
        return subprocess.run(cmd, env=env).returncode
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
