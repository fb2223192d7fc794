"""Where an S3 archive move (``[[s3]] on_success = "move"``) puts an object: a key under
``archive_prefix`` that holds nothing, claimed before the copy, so that the move never replaces an
object there (a user's, or the archive of an earlier version of the same key) but numbers its key
instead, as the local archive numbers a taken name. ``archive.Archiver`` copies into the claim.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from ocrwatch.errors import OutputConflict
from ocrwatch.infra.s3client import call, error_code
from ocrwatch.sources.base import S3Object

log = structlog.get_logger()

PRECONDITION_FAILED = ("PreconditionFailed", "412")
ARCHIVE_NUMBERS = 1000
"""How many keys (``archive_prefix`` + key, then numbered) a move tries for one object."""


def claim(client: Any, obj: S3Object, prefix: str) -> tuple[str, dict[str, Any]]:
    """A key under ``prefix`` that holds nothing, claimed for ``obj``'s copy by an empty object
    written only where none is (``If-None-Match: *`` on a PUT, which AWS, Ceph RGW and moto honour,
    RGW not in a versioned bucket, where the claim must be the key's only version; on a copy all
    but AWS ignore it): ``prefix`` + its key, else ``stem.N.suffix`` with the first N free, as the
    local archive numbers a taken name. So no object there (a user's, or the archive of an earlier
    version of the key) is replaced; only one written over the claim while the copy is under way
    could be. Returns the key and what names the claim: its version, or its ETag."""
    folder, slash, name = obj.key.rpartition("/")
    plain = Path(name)
    for number in range(ARCHIVE_NUMBERS):
        numbered = name if number == 0 else f"{plain.stem}.{number}{plain.suffix}"
        target = f"{prefix}{folder}{slash}{numbered}"
        try:
            made = call(client.put_object, Bucket=obj.bucket, Key=target, Body=b"", IfNoneMatch="*")
        except Exception as exc:
            if error_code(exc) in (*PRECONDITION_FAILED, "ConditionalRequestConflict"):
                continue  # taken (or being taken): the next number
            raise
        if not made.get("VersionId"):
            return target, {"IfMatch": str(made["ETag"])}
        held: dict[str, Any] = {"VersionId": str(made["VersionId"])}
        if _alone(client, obj.bucket, target, held["VersionId"]):
            return target, held
        unclaim(client, obj.bucket, target, held)  # it was written over an object: that stays
    raise OutputConflict(
        f"s3://{obj.bucket}/{prefix}{obj.key} and {ARCHIVE_NUMBERS - 1} numbered keys beside it "
        "are taken; an archive move replaces none",
        hint="move the archived copies of that key elsewhere; the source stays where it is",
    )


def _alone(client: Any, bucket: str, key: str, version: str) -> bool:
    """Whether the claim ``version`` is the only version of ``key`` in a versioned bucket, where a
    server may write it over an object despite ``If-None-Match`` (Ceph RGW 16 does): a key that
    held any object before is not taken."""
    listed = call(client.list_object_versions, Bucket=bucket, Prefix=key)
    versions = [entry["VersionId"] for entry in listed.get("Versions", []) if entry["Key"] == key]
    return not listed.get("IsTruncated") and versions == [version]


def unclaim(client: Any, bucket: str, target: str, held: dict[str, Any]) -> None:
    """Delete the empty object that claimed ``target`` (``held``: its version, or its ETag, so that
    only while it is still that one); a failure is logged."""
    try:
        call(client.delete_object, Bucket=bucket, Key=target, **held)
    except Exception as exc:
        log.warning("archive_claim_left", uri=f"s3://{bucket}/{target}", error=error_code(exc))
