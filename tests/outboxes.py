"""A source under test puts its jobs into an ``Outbox``; ``fed`` answers them with the test's own
``submit`` and ``reject``, through the same ``intake.serve`` the daemon runs."""

from __future__ import annotations

import asyncio

from ocrwatch.jobs import intake
from ocrwatch.sources.base import Outbox, Reject, Submit

_SERVING: set[asyncio.Task[None]] = set()


def fed(submit: Submit, reject: Reject) -> Outbox:
    """An outbox whose jobs go to ``submit`` (and ``reject``) until the test's loop ends."""
    outbox = Outbox()
    task = asyncio.get_running_loop().create_task(intake.serve(outbox, submit, reject))
    _SERVING.add(task)
    task.add_done_callback(_SERVING.discard)
    return outbox
