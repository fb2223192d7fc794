"""ocrwatch.infra.s3client: the error mapping (the ``ocrwatch check`` probes are
tests/test_checks.py)."""

from __future__ import annotations

import botocore.exceptions

from ocrwatch.errors import StorageUnavailable
from ocrwatch.infra.s3client import error_code, is_not_found, is_transient, storage_error


def client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject",
    )


def test_failures_of_the_world_are_transient_and_map_to_storage_unavailable() -> None:
    for exc in (
        client_error(503, "SlowDown"),
        client_error(400, "RequestTimeout"),
        client_error(429, "x"),
        botocore.exceptions.EndpointConnectionError(endpoint_url="http://s3"),
    ):
        assert is_transient(exc), exc
    assert not is_transient(client_error(404, "NoSuchKey")) and not is_transient(ValueError("x"))
    assert (
        error_code(client_error(404, "NoSuchKey")) == "NoSuchKey"
        and error_code(ValueError()) == "ValueError"
    )
    denied = storage_error(client_error(403, "AccessDenied"), "reading s3://b/k")
    assert (
        isinstance(denied, StorageUnavailable)
        and "access denied" in str(denied)
        and denied.retryable
    )
    assert "no credentials" in str(
        storage_error(botocore.exceptions.NoCredentialsError(), "reading")
    )


def test_one_rule_says_nothing_is_there() -> None:
    """The sink, the download and the archive once each had a set of their own (the archive's
    lacked ``NotFound`` or ``NoSuchVersion``, none but the download's had all): one set, for a
    key, a version and a bucket, and a HEAD's bare 404."""
    for code in ("NoSuchKey", "NoSuchVersion", "NoSuchBucket", "404", "NotFound"):
        assert is_not_found(client_error(404, code)), code
    others = (client_error(403, "AccessDenied"), client_error(412, "PreconditionFailed"))
    for exc in (*others, KeyError("404")):
        assert not is_not_found(exc), exc
