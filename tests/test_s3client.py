"""ocrwatch.s3client: the probe ``ocrwatch check`` runs against moto_server, and the error mapping."""

from __future__ import annotations

import botocore.exceptions
import pytest

from ocrwatch.config import S3Config
from ocrwatch.errors import StorageUnavailable
from ocrwatch.s3client import check, error_code, is_transient, storage_error
from tests.s3servers import MotoServer, free_port


def client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError({"Error": {"Code": code, "Message": "m"},
                                            "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


def test_failures_of_the_world_are_transient_and_map_to_storage_unavailable() -> None:
    for exc in (client_error(503, "SlowDown"), client_error(400, "RequestTimeout"), client_error(429, "x"),
                botocore.exceptions.EndpointConnectionError(endpoint_url="http://s3")):
        assert is_transient(exc), exc
    assert not is_transient(client_error(404, "NoSuchKey")) and not is_transient(ValueError("x"))
    assert error_code(client_error(404, "NoSuchKey")) == "NoSuchKey" and error_code(ValueError()) == "ValueError"
    denied = storage_error(client_error(403, "AccessDenied"), "reading s3://b/k")
    assert isinstance(denied, StorageUnavailable) and "access denied" in str(denied) and denied.retryable
    assert "no credentials" in str(storage_error(botocore.exceptions.NoCredentialsError(), "reading"))


@pytest.mark.s3
def test_check_reports_queue_bucket_and_endpoint_problems(moto: MotoServer) -> None:
    queue = moto.bucket_with_queue("docs", "events")
    assert check(S3Config(queue_url=queue, bucket="docs", **moto.s3_config())) == []

    problems = check(S3Config(queue_url=queue.replace("events", "nope"), bucket="missing", **moto.s3_config()))
    assert len(problems) == 2 and "queue" in problems[0] and "bucket missing" in problems[1]

    dead_letter = check(S3Config(queue_url=queue, on_max_receives="dead_letter", **moto.s3_config()))
    assert len(dead_letter) == 1 and "RedrivePolicy" in dead_letter[0]

    unreachable = S3Config(transport="webhook", token="t", bucket="docs",
                           **moto.s3_config(endpoint_url=f"http://127.0.0.1:{free_port()}"))
    [problem] = check(unreachable)
    assert "bucket docs" in problem and "testing" not in problem  # credentials never shown

    [listen] = check(S3Config(transport="webhook", token="t", listen="nowhere", **moto.s3_config()))
    assert "HOST:PORT" in listen
