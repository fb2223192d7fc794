"""The daemon's control channel: ``ocrwatch status``, ``retry`` and ``ocr`` talk to the running
daemon.

A running daemon listens on a Unix socket in ``state_dir`` (``control.sock``, mode 0600, so only the
user it runs as, and root, can connect). A connection carries one request, a JSON object on one line
(``{"op": "status"}``, ``{"op": "retry", "selectors": [...]}``, ``{"op": "ocr", "files": [...],
...}``); the answer is JSON lines, streamed while the request runs (an ``ocr`` request's page
progress and each file's result), the last one ``{"event": "end"}``. This is not
``ocrwatch.infra.http``'s job: that layer serves HTTP over TCP to whoever reaches a port (metrics,
health, the S3 webhook); this channel is local, owner-only by its file mode, and streams lines to
one waiting command.

The state lock (``daemon.lock``, held with ``flock`` for the daemon's whole life) is the authority
on whether a daemon runs: a client asks the socket only while the lock is held, and a daemon removes
the socket file a killed predecessor left behind, since holding the lock proves nobody serves it.

The parts, as gunicorn's ``ctl/``: ``protocol`` (the wire), ``client`` (the CLI's end), ``server``
(the daemon's end), ``status`` (what ``status`` shows) and ``ocr`` (what an ``ocr`` request runs).
This package imports only the light parts, so a client never loads the pipeline.
"""

from ocrwatch.control.client import Client
from ocrwatch.control.protocol import CONNECT_SECONDS
from ocrwatch.control.status import listeners

__all__ = ["CONNECT_SECONDS", "Client", "listeners"]  # what ``checks`` asks of a running daemon
