"""Faults between distckpt's S3 backend (the core's, reached through ``s3://`` URLs and ``S3Storage``) and the server:
HTTP 500s and throttling injected by a proxy in front of a moto server (_s3_faults.py), connections dropped in the
middle of an upload and of a read, a stalled request, the server killed mid-upload and mid-read, wrong credentials
(a moto server that checks signatures), a missing bucket, a scheme nothing serves, and no libcurl. Transient faults
are retried and the values come back exact; a fault that persists is a clear error naming the URL, with nothing
committed (no metadata.dckpt) and no multipart upload left open (asked of the server directly with boto3)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import _s3_faults
import _s3_server
import distckpt
from _s3_faults import call, cut_response, drop_request, fail, stall, throttle
from conftest import run_python


def make_state():
    """20 MiB of float32 (a data file of 3 parts at the default 8 MiB part size) and small entries."""
    return {"w": np.arange(5 << 20, dtype=np.float32), "b": np.linspace(0, 1, 1000), "step": 9}


def check(out):
    want = make_state()
    np.testing.assert_array_equal(out["w"], want["w"])
    np.testing.assert_array_equal(out["b"], want["b"])
    assert out["step"] == 9


@pytest.fixture
def proxy(s3_env, moto_server, monkeypatch):
    """A fault proxy in front of the session's server, reached through AWS_ENDPOINT_URL; set its ``rules``."""
    p = _s3_faults.FaultProxy(moto_server.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", p.endpoint)
    try:
        yield p
    finally:
        p.stop()


def assert_nothing_left(moto_server, bucket, prefix):
    keys = moto_server.keys(bucket, prefix)
    assert not any(k.endswith("/metadata.dckpt") for k in keys), keys
    assert moto_server.open_uploads(bucket) == [], "a multipart upload was left open"


def test_transient_500s_and_throttling_are_retried(s3_env, moto_server, proxy):
    bucket = s3_env
    proxy.rules = [
        fail(op="create_upload", times=1),
        fail(op="upload_part", times=2),
        throttle(op="upload_part", times=1),
        throttle(op="complete_upload", times=1),
        fail(status=503, code="ServiceUnavailable", op="put", times=2),  # the marker, the metadata: small PUTs
        fail(status=502, op="get", times=1),
        throttle(op="get", times=2),
    ]
    url = f"s3://{bucket}/flaky"
    distckpt.save(make_state(), url)
    check(distckpt.load(None, url))
    with distckpt.open(url) as r:
        r.verify()
    assert [r.fired for r in proxy.rules] == [r.times for r in proxy.rules], proxy.log
    assert moto_server.open_uploads(bucket) == []


def test_a_persistent_500_on_upload_parts_fails_naming_the_url_and_leaves_nothing(s3_env, moto_server, proxy):
    bucket = s3_env
    proxy.rules = [fail(op="upload_part")]
    url = f"s3://{bucket}/failing"
    storage = distckpt.S3Storage(proxy.endpoint, max_attempts=2)
    with pytest.raises(distckpt.Error) as e:
        distckpt.save(make_state(), url, storage=storage)
    assert url in str(e.value) and "500" in str(e.value), str(e.value)
    assert proxy.count("upload_part") >= 2  # retried, within the bound
    assert proxy.count("abort_upload", 204) + proxy.count("abort_upload", 200) >= 1, proxy.log
    assert_nothing_left(moto_server, bucket, "failing/")
    with pytest.raises(distckpt.NotFoundError, match=url):
        distckpt.open(url)


def test_a_commit_that_keeps_being_throttled_commits_nothing(s3_env, moto_server, proxy):
    bucket = s3_env
    proxy.rules = [throttle(op="put", key_contains="metadata.dckpt")]
    url = f"s3://{bucket}/uncommitted"
    with pytest.raises(distckpt.Error) as e:
        distckpt.save(make_state(), url, storage=distckpt.S3Storage(proxy.endpoint, max_attempts=3))
    assert url in str(e.value) and "SlowDown" in str(e.value), str(e.value)
    assert proxy.count("put", "fail 503") == 3
    assert_nothing_left(moto_server, bucket, "uncommitted/")
    assert distckpt.storage_stat(url).kind != "checkpoint"


def test_a_connection_dropped_mid_upload_is_retried_or_a_clean_error(s3_env, moto_server, proxy):
    bucket = s3_env
    proxy.rules = [drop_request(op="upload_part", skip=1, times=1), drop_request(op="put", times=1)]
    url = f"s3://{bucket}/dropped-once"
    distckpt.save(make_state(), url)
    check(distckpt.load(None, url))
    assert proxy.count(what="drop_request") == 2

    proxy.rules = [drop_request(op="upload_part")]
    url = f"s3://{bucket}/dropped"
    with pytest.raises(distckpt.Error, match=url):
        distckpt.save(make_state(), url, storage=distckpt.S3Storage(proxy.endpoint, max_attempts=2))
    assert_nothing_left(moto_server, bucket, "dropped/")


def test_a_connection_dropped_mid_read_is_retried_or_a_clean_error(s3_env, proxy):
    bucket = s3_env
    url = f"s3://{bucket}/cut"
    distckpt.save(make_state(), url)
    proxy.rules = [cut_response(op="get", key_contains="/data-", times=2)]
    check(distckpt.load(None, url))
    assert proxy.count(what="cut_response") == 2

    proxy.rules = [cut_response(op="get", key_contains="/data-")]
    with pytest.raises(distckpt.Error, match=url):
        distckpt.load(None, url, storage=distckpt.S3Storage(proxy.endpoint, max_attempts=2))


def test_a_stalled_request_times_out_and_is_retried(s3_env, proxy):
    bucket = s3_env
    url = f"s3://{bucket}/stalled"
    distckpt.save(make_state(), url)
    proxy.rules = [stall(seconds=60, op="get", key_contains="/data-", times=1)]
    start = time.monotonic()
    check(distckpt.load(None, url, storage=distckpt.S3Storage(proxy.endpoint, request_timeout=1)))
    assert time.monotonic() - start < 30
    assert proxy.count(what="stall") == 1


@pytest.mark.parametrize("when", ["upload", "read"])
def test_the_server_killed_midway_is_an_error_naming_the_url(when):
    server = _s3_server.MotoServer()  # its own: it dies
    try:
        bucket = server.new_bucket()
        url = f"s3://{bucket}/ckpt"
        op = "upload_part" if when == "upload" else "get"
        proxy = _s3_faults.FaultProxy(server.endpoint)
        storage = distckpt.S3Storage(proxy.endpoint, access_key_id="testing", secret_access_key="testing",
                                     max_attempts=3)  # fmt: skip
        try:
            if when == "read":
                distckpt.save(make_state(), url, storage=storage)
            proxy.rules = [call(server.kill, op=op, key_contains="/data-", skip=1)]
            with pytest.raises(distckpt.Error, match=url):
                if when == "upload":
                    distckpt.save(make_state(), url, storage=storage)
                else:
                    distckpt.load(None, url, storage=storage)
            assert server.proc.poll() is not None and proxy.count(what="server unreachable") >= 1, proxy.log
        finally:
            proxy.stop()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def auth_server():
    """A moto server that checks signatures and IAM permissions once four requests have gone by: those create an IAM
    user with S3 rights, its access key, and a bucket. Yields (server, bucket, key id, secret)."""
    pytest.importorskip("moto.server")
    server = _s3_server.MotoServer(extra_env={"INITIAL_NO_AUTH_ACTION_COUNT": "4"})
    try:
        iam = server.client("iam")
        iam.create_user(UserName="trainer")
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam.put_user_policy(UserName="trainer", PolicyName="s3", PolicyDocument=json.dumps(policy))
        server.client().create_bucket(Bucket="secured")
        yield server, "secured", key["AccessKeyId"], key["SecretAccessKey"]
    finally:
        server.stop()


def test_wrong_credentials_are_a_clear_error_naming_the_url(auth_server, monkeypatch):
    server, bucket, key_id, secret = auth_server
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    url = f"s3://{bucket}/signed"
    distckpt.save(make_state(), url)  # the right keys: signed requests are accepted
    check(distckpt.load(None, url))

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-" + secret)
    with pytest.raises(distckpt.Error) as e:
        distckpt.save(make_state(), f"{url}-wrong")
    assert f"{url}-wrong" in str(e.value) and "SignatureDoesNotMatch" in str(e.value), str(e.value)
    with pytest.raises(distckpt.Error, match=url):
        distckpt.load(None, url)
    wrong = distckpt.S3Storage(server.endpoint, access_key_id=key_id, secret_access_key="not-" + secret)
    with pytest.raises(distckpt.Error, match=url):
        distckpt.open(url, storage=wrong)
    s3 = server.client(aws_access_key_id=key_id, aws_secret_access_key=secret)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert not [k for k in keys if k.startswith("signed-wrong/")], keys


def test_a_missing_bucket_is_a_clear_error_naming_it(s3_env):
    url = "s3://no-such-bucket-here/ckpt"
    with pytest.raises(distckpt.Error) as e:
        distckpt.save(make_state(), url)
    assert "no-such-bucket-here" in str(e.value) and "NoSuchBucket" in str(e.value), str(e.value)
    with pytest.raises(distckpt.Error, match="no-such-bucket-here"):
        distckpt.open(url)


def test_a_scheme_nothing_serves_is_an_error_naming_it():
    with pytest.raises(distckpt.UnsupportedError, match="'nosuch'"):
        distckpt.save(make_state(), "nosuch://bucket/ckpt")
    with pytest.raises(distckpt.UnsupportedError, match="gs"):
        distckpt.load(None, "gs://bucket/ckpt")  # fsspec knows gs://, but gcsfs is not installed here
    with pytest.raises(distckpt.UnsupportedError, match="gs") as e:  # the core's own answer, for C, Rust and Go
        distckpt._native.Storage.open_url("gs://bucket/ckpt")
    assert "s3://" in str(e.value), str(e.value)


def test_without_libcurl_s3_is_an_error_naming_it(s3_env):
    out = run_python(
        f"""
        import numpy as np, distckpt
        for attempt in (lambda: distckpt.save({{"w": np.ones(3)}}, "s3://{s3_env}/nocurl"), distckpt.S3Storage):
            try:
                attempt()
            except distckpt.UnsupportedError as e:
                print("unsupported:", e)
            else:
                print("it worked")
        """,
        emulate_cuda=False,
        env={"DCKPT_CURL_LIBRARY": "/nonexistent"},
    )
    lines = out.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("unsupported:") and "libcurl" in line for line in lines), out
