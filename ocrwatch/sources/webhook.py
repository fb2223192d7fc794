"""S3 as a source, webhook transport: Ceph RGW or MinIO POST ``{"Records": [...]}`` to an HTTP
endpoint.

The endpoint is guarded by a shared token (``Authorization: Bearer`` or ``?token=``, since RGW's
push endpoint is a bare URL) and answers 2xx only after every job of the request is in the ledger,
so the sender resends what a crash lost. With RGW that needs a persistent topic
(``persistent=true``): a plain topic makes the upload wait for the answer and drops the event when
it fails. RGW resends a refused event at once, in a tight loop, so the sender's refusals (the token
shown, the event not taken) are answered after ``reject_delay_seconds``.

A request that has not shown the token (wrong path, no token, a wrong one) costs nothing: it is
answered at once, its body never read, its connection closed. Holding it for a delay, as before,
let a local account's flood keep every connection of the listener busy, so the sender got none (0
of 10 real events in 30 s, and a log line for each refusal). A peer (an address; an IPv6 /64) that
keeps failing gets a bare 429 beyond ``PEER_BURST`` refusals, ``PEER_RATE`` a second after that;
the token is still checked first, since the flood and the sender may share an address (127.0.0.1):
a request with the token is always served. Such refusals are counted, not logged one by one: the
first after a quiet spell at once, then one ``s3_webhook_refused`` line per ``REFUSALS_LOG_SECONDS``
with the count, the peers, the statuses and the loudest peer.

HTTP is ``ocrwatch.infra.http`` (aiohttp, with a connection limit and idle timeout); the body is
bounded by ``max_body_bytes`` and must arrive within ``READ_TIMEOUT`` seconds.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import time
from collections import Counter, OrderedDict

import structlog
from aiohttp import web

from ocrwatch.config import LimitsConfig, S3Config
from ocrwatch.infra.http import Listener
from ocrwatch.sources.base import Job, Outbox, Outcome
from ocrwatch.sources.s3events import S3EventSource, parse

log = structlog.get_logger()

READ_TIMEOUT = 30.0
MAX_CONNECTIONS = 64
PEER_BURST = 20
"""Refusals a peer gets answered in full (401, 403, 404) before it is held to ``PEER_RATE``."""
PEER_RATE = 1.0
"""Refusals a second answered in full to a peer past its burst; the rest get a bare 429."""
MAX_PEERS = 4096
"""Peers whose refusals are remembered (the least recently refused forgotten first): the memory a
flood from many addresses may take stays bounded."""
REFUSALS_LOG_SECONDS = 10.0
"""How often refusals of requests without the token are logged, counted in one line."""


class _Refused(Exception):
    """An answer other than 200: its status, a reason for the JSON body and the log, and extra
    headers."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers or {}


def _peer_of(address: str | None) -> str:
    """Who a refusal is counted against: the address, an IPv6 one's /64 (what one host is given)."""
    if address is None:
        return "unknown"
    if ":" not in address:  # IPv4, as aiohttp gives it: taken as it is, unparsed (a flood's cost)
        return address
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        if not ip.is_loopback:
            return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class _Refusals:
    """The requests refused before they showed the token: a budget per peer (a token bucket of
    ``burst`` refusals, ``rate`` a second) and their log, a line at once for the first after a
    quiet ``interval``, then one counted line per ``interval`` while they go on (and at a stop)."""

    def __init__(
        self, source: str, *, burst: int, rate: float, interval: float, max_peers: int
    ) -> None:
        self.source, self.burst, self.rate = source, burst, rate
        self.interval, self.max_peers = interval, max_peers
        self._budgets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, when
        self._count = 0
        self._limited = 0
        self._statuses: Counter[int] = Counter()
        self._peers: Counter[str] = Counter()
        self._timer: asyncio.TimerHandle | None = None

    def refused(self, address: str | None, status: int, reason: str) -> bool:
        """Count a refusal of ``address``; whether its peer is within its budget, so that the
        refusal is answered in full."""
        peer = _peer_of(address)
        now = time.monotonic()
        tokens, then = self._budgets.pop(peer, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        within = tokens >= 1.0
        self._budgets[peer] = (tokens - 1.0 if within else tokens, now)
        if len(self._budgets) > self.max_peers:
            self._budgets.popitem(last=False)
        if self._timer is None:  # the first after a quiet spell: said at once
            log.warning(
                "s3_webhook_refused",
                source=self.source,
                count=1,
                peers=1,
                status=status,
                reason=reason,
                peer=address,
            )
            self._timer = asyncio.get_running_loop().call_later(self.interval, self._tick)
            return within
        self._count += 1
        self._limited += not within
        self._statuses[status if within else 429] += 1
        self._peers[peer] += 1
        return within

    def _tick(self) -> None:
        self._timer = None
        if self._count:
            self.flush()
            self._timer = asyncio.get_running_loop().call_later(self.interval, self._tick)

    def flush(self) -> None:
        """Log the refusals counted since the last line, if any, in one line."""
        if not self._count:
            return
        loudest, loudest_count = self._peers.most_common(1)[0]
        log.warning(
            "s3_webhook_refused",
            source=self.source,
            count=self._count,
            peers=len(self._peers),
            statuses={str(status): n for status, n in sorted(self._statuses.items())},
            limited=self._limited,
            loudest=loudest,
            loudest_count=loudest_count,
            seconds=self.interval,
        )
        self._count = self._limited = 0
        self._statuses.clear()
        self._peers.clear()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()


class WebhookSource(S3EventSource):
    """A ``Source`` for one ``[[s3]]`` table with ``transport = "webhook"``.

    A webhook holds no messages (the sender keeps what is not answered 2xx). An event is refused
    (5xx, the sender resends it) only for a failure a retry may cure; one that no retry can cure is
    given up through ``reject`` and answered 2xx, or the sender would resend it for ever, holding
    back every event behind it. A request that is not an S3 event gets a 4xx answer, whatever it
    holds.
    """

    reject_delay_seconds = 1.0
    refusals_log_seconds = REFUSALS_LOG_SECONDS

    def __init__(
        self, cfg: S3Config, *, name: str = "s3", limits: LimitsConfig | None = None
    ) -> None:
        super().__init__(cfg, name=name, limits=limits)
        self._listener: Listener | None = None
        self._submits: set[asyncio.Task[None]] = set()
        self._refusals: _Refusals | None = None

    async def start(self, outbox: Outbox) -> None:
        self._submit, self._reject = outbox.submit, outbox.reject
        self._refusals = _Refusals(
            self.name,
            burst=PEER_BURST,
            rate=PEER_RATE,
            interval=self.refusals_log_seconds,
            max_peers=MAX_PEERS,
        )
        app = web.Application(client_max_size=self.cfg.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self._handle, expect_handler=self._expect)
        self._listener = Listener(
            app,
            self.cfg.listen,
            name=self.name,
            max_connections=MAX_CONNECTIONS,
            idle_timeout=READ_TIMEOUT,
        )
        await self._listener.start()
        log.info(
            "s3_source_started",
            source=self.name,
            transport="webhook",
            listen=self.address,
            path=self.cfg.path,
        )

    async def stop(self) -> None:
        """Stop listening. A request being submitted has the listener's shutdown time to finish (its
        submit is shielded from the request's cancellation); then it is cancelled, and the sender
        resends the event."""
        if self._listener is not None:
            await self._listener.stop()
        for submit in list(self._submits):
            submit.cancel()
        if self._refusals is not None:
            self._refusals.stop()
        log.info("s3_source_stopped", source=self.name)

    def _submitting(self, job: Job) -> asyncio.Task[None]:
        """The job's submit as a task of its own, held here: it outlives a request cancelled at
        stop, and its failure (already logged by ``_submit_job``) is taken even when no request is
        left to answer."""
        submit = asyncio.get_running_loop().create_task(self._submit_job(job))
        self._submits.add(submit)
        submit.add_done_callback(self._submitted)
        return submit

    def _submitted(self, submit: asyncio.Task[None]) -> None:
        self._submits.discard(submit)
        if not submit.cancelled():
            submit.exception()  # retrieved: no "Task exception was never retrieved" on the way out

    async def finish(self, job: Job, outcome: Outcome, kind: str | None = None) -> None:
        """Nothing to acknowledge: the event was answered once its job was in the ledger."""

    @property
    def address(self) -> tuple[str, int]:
        """Where the webhook listens (the real port when ``listen`` asked for port 0)."""
        if self._listener is None:
            raise RuntimeError("the webhook is not listening")
        return self._listener.address

    # -- HTTP

    async def _expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue``: refuse before the body is sent, or invite it."""
        if (stranger := self._stranger(request)) is not None:
            return stranger
        try:
            self._check(request)
        except _Refused as exc:
            return await self._refuse(request, exc)
        if request.version >= (1, 1):
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if (stranger := self._stranger(request)) is not None:
            return stranger
        try:
            self._check(request)
            body = await self._body(request)
            try:
                objects = self._accepted(parse(body))
            except ValueError as exc:
                raise _Refused(400, f"not an S3 event notification: {str(exc)[:200]}") from None
            for obj in objects:
                try:  # shielded: stopping the listener must not cut a submit halfway
                    await asyncio.shield(self._submitting(self._job(obj)))
                except Exception:
                    raise _Refused(503, "not recorded, send again", {"Retry-After": "5"}) from None
        except _Refused as exc:
            return await self._refuse(request, exc)
        return web.json_response({"accepted": len(objects)})

    def _stranger(self, request: web.Request) -> web.StreamResponse | None:
        """The answer to a request that has not shown the token (path and token checked, in that
        order), None to one that has. Given at once, its connection closed, no more of it read
        and no line of its own logged: a flood of them holds no connection and fills no log. A peer
        past its budget gets a bare 429."""
        try:
            if request.rel_url.raw_path != self.cfg.path:  # as sent: no percent-decoding games
                raise _Refused(404, "not found")
            self._authorize(
                request.headers.get("Authorization"), request.query.getall("token", None)
            )
        except _Refused as refused:
            assert self._refusals is not None
            response: web.StreamResponse
            if self._refusals.refused(request.remote, refused.status, refused.reason):
                response = web.json_response(
                    {"error": refused.reason}, status=refused.status, headers=refused.headers
                )
            else:
                response = web.Response(
                    status=429, headers={"Retry-After": str(max(1, round(1 / PEER_RATE)))}
                )
            response.force_close()
            return response
        return None

    def _check(self, request: web.Request) -> None:
        """Method and declared length, of a request that showed the token: what can be refused
        before the body."""
        if request.method != "POST":
            raise _Refused(405, "method not allowed", {"Allow": "POST"})
        if request.content_length is not None and request.content_length > self.cfg.max_body_bytes:
            raise _Refused(413, f"body larger than max_body_bytes = {self.cfg.max_body_bytes}")

    def _authorize(self, authorization: str | None, query_tokens: list[str] | None) -> None:
        """The shared token, as ``Authorization: Bearer`` or ``?token=`` (RGW's push endpoint is a
        bare URL)."""
        presented: str | None = None
        if authorization is not None:
            scheme, _, credentials = authorization.partition(" ")
            if scheme.lower() == "bearer":
                presented = credentials.strip()
        elif query_tokens is not None:
            if len(query_tokens) != 1:
                raise _Refused(400, "more than one token")
            presented = query_tokens[0]
        if not presented:
            raise _Refused(401, "token required", {"WWW-Authenticate": 'Bearer realm="ocrwatch"'})
        assert self.cfg.token is not None
        if not hmac.compare_digest(
            presented.encode("utf-8", "surrogatepass"), self.cfg.token.encode()
        ):
            raise _Refused(403, "wrong token")

    async def _body(self, request: web.Request) -> bytes:
        """The body, at most ``max_body_bytes`` (a chunked body is cut off there too), within
        ``READ_TIMEOUT``."""
        try:
            return await asyncio.wait_for(request.read(), READ_TIMEOUT)
        except web.HTTPRequestEntityTooLarge:
            raise _Refused(
                413, f"body larger than max_body_bytes = {self.cfg.max_body_bytes}"
            ) from None
        except asyncio.TimeoutError:
            raise _Refused(408, "request body too slow") from None

    async def _refuse(self, request: web.Request, refused: _Refused) -> web.StreamResponse:
        log.warning(
            "s3_webhook_rejected",
            source=self.name,
            status=refused.status,
            reason=refused.reason,
            peer=request.remote,
        )
        # RGW resends a refused event at once, in a tight loop: answering slowly paces it (and
        # guessers)
        await asyncio.sleep(self.reject_delay_seconds)
        response: web.StreamResponse = web.json_response(
            {"error": refused.reason}, status=refused.status, headers=refused.headers
        )
        response.force_close()
        return response
