"""The one ownership rule of outputs (``sinks.ownership``): its verdict says ``ours`` in so many
words, and what it says of each case. The sinks', the archive's and the quarantine's tests check it
where they ask it."""

from __future__ import annotations

import pytest

from ocrwatch.sinks.ownership import OURS, Stored, Verdict, judge_object, rule
from ocrwatch.store.written import object_record


def test_a_verdict_has_no_truth_value_to_misread() -> None:
    """An empty "why" once meant "ours", so ``if verdict:`` read as "not ours": no such reading."""
    assert OURS.ours and Verdict(True) == OURS
    with pytest.raises(TypeError, match="ours"):
        bool(OURS)


def test_the_rule_says_ours_only_for_the_owner_of_what_the_record_holds() -> None:
    assert rule(True, [1000], 1000, False, "a file") == OURS
    assert rule(True, [1000], 1001, False, "a file") == Verdict(
        False, "ocrwatch's output for a document of another user"
    )
    assert rule(True, [], 1000, True, "a file").why == (
        "a file ocrwatch did not write, or one changed since ocrwatch wrote it"
    )
    assert rule(False, [], 1000, True, "a file") == OURS  # an older ocrwatch's, by its mark
    assert not rule(False, [], None, True, "a file").ours  # whose document: unknown
    assert rule(False, [], 1000, False, "an object").why == "an object ocrwatch did not write"


def test_an_object_is_judged_by_the_record_it_carries() -> None:
    """The S3 form of the rule: the record in the object's metadata, its ETag the MD5 recorded."""
    mine, md5 = "s3://in/a.pdf", "0" * 32
    stored = Stored(md5, object_record(mine, md5))
    assert judge_object(stored, mine, lambda: False, lambda: None) == OURS
    assert judge_object(stored, "s3://in/b.pdf", lambda: False, lambda: None).why == (
        f"ocrwatch's output for {mine}"
    )
    assert judge_object(None, mine, lambda: False, lambda: None) == OURS  # nothing there
    older = Stored("1" * 32, {"ocrwatch-source-etag": "x"})
    assert judge_object(older, mine, lambda: True, lambda: None) == OURS
    assert not judge_object(older, mine, lambda: False, lambda: None).ours
