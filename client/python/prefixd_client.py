"""A client of the prefixd HTTP API (docs/api.md), standard library only.

    from prefixd_client import Client, Overloaded, NotFound

    c = Client("http://prefixd:8090", token=os.environ.get("PREFIXD_TOKEN"))
    sel = c.select_and_reserve("meta-llama/Llama-3.1-8B-Instruct", token_ids=ids, selection_id=req_id)
    # forward the request to sel["endpoint"]; at its first streamed token:
    c.reservation_prefill_complete(req_id)
    # when the response ends or the client goes away:
    c.free_reservation(req_id)

One argument convention: a method's one positional argument is the model
it is about (model_name) or the id of the reservation or plan it acts on
(selection_id, request_id); every other argument is keyword-only.

Every method returns the decoded JSON answer (a dict or list) or None.
An answer other than 2xx raises PrefixdError, or the subclass of its
status (Invalid, Unauthorized, NotFound, Conflict, Overloaded,
Unavailable); a failed plan's error carries the plan (e.plan). A Client
keeps one keep-alive connection per thread and is safe to share between
threads.
"""

import http.client
import json
import threading
import urllib.parse

__all__ = [
    "Client", "PrefixdError", "Invalid", "Unauthorized", "NotFound",
    "Conflict", "Overloaded", "Unavailable",
]

MAX_ANSWER_BYTES = 64 << 20
# MAX_WAIT_SECONDS is how long a waiting select_and_reserve without
# wait_timeout_ms may take to answer: the API's longest wait.
MAX_WAIT_SECONDS = 3600


class PrefixdError(Exception):
    """An answer other than 2xx: its method, path, status and message."""

    def __init__(self, method, path, status, message, plan=None, retry_after=None, reason=None):
        self.method, self.path, self.status = method, path, status
        self.message, self.plan = message, plan
        # retry_after: the answer's Retry-After in seconds (an int), or None;
        # reason: the body's reason (a 429 of the router queue: "queue_full"
        # or "wait_expired"), or None.
        self.retry_after, self.reason = retry_after, reason
        super().__init__("%s %s: %s (%d)" % (method, path, message or "HTTP error", status))


class Invalid(PrefixdError):
    """400 or 413: the request is wrong; the message names the field."""


class Unauthorized(PrefixdError):
    """401 or 403: a token is missing, wrong, or the read token where the API token is needed."""


class NotFound(PrefixdError):
    """404: no such model, worker, reservation or plan."""


class Conflict(PrefixdError):
    """409: a booking id in use, a block size that conflicts, a plan in the wrong state."""


class Overloaded(PrefixdError):
    """429: every eligible worker is busy, or the router queue turned the
    request away (e.reason "queue_full" or "wait_expired"; e.retry_after
    says how many seconds to wait before trying again)."""


class Unavailable(PrefixdError):
    """503: no schedulable worker, or prefixd not ready."""


_BY_STATUS = {400: Invalid, 413: Invalid, 401: Unauthorized, 403: Unauthorized, 404: NotFound,
              409: Conflict, 429: Overloaded, 503: Unavailable}


def _drop_none(d):
    return {k: v for k, v in d.items() if v is not None}


class Client:
    """Talks to one prefixd server (or a load balancer in front of its replicas)."""

    def __init__(self, base_url="http://127.0.0.1:8090", token=None, timeout=10.0):
        u = urllib.parse.urlsplit(base_url.rstrip("/"))
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ValueError("base_url %r: want http(s)://host:port" % base_url)
        self._scheme, self._netloc, self._prefix = u.scheme, u.netloc, u.path
        self.token, self.timeout = token, timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns = []

    def _conn(self):
        c = getattr(self._local, "conn", None)
        if c is None:
            cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
            c = self._local.conn = cls(self._netloc, timeout=self.timeout)
            with self._lock:
                self._conns.append(c)
        return c

    def close(self):
        """Closes every thread's connection (a later call opens a new one)."""
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            c.close()
        self._local = threading.local()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _do(self, method, path, body=None, raw=False, headers=None, wait=None):
        headers = dict(headers or {}, Accept="application/json")
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        for attempt in (0, 1):
            conn = self._conn()
            try:
                conn.request(method, self._prefix + path, body=data, headers=headers)
                if wait is not None and conn.sock is not None:
                    # The answer may come after the request's wait in the router queue.
                    conn.sock.settimeout(self.timeout + wait)
                try:
                    resp = conn.getresponse()
                    payload = resp.read(MAX_ANSWER_BYTES + 1)
                finally:
                    if wait is not None and conn.sock is not None:
                        conn.sock.settimeout(self.timeout)
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A keep-alive connection the server closed: once more on a new one.
                conn.close()
                self._local.conn = None
                with self._lock:
                    if conn in self._conns:
                        self._conns.remove(conn)
                if attempt:
                    raise
        if len(payload) > MAX_ANSWER_BYTES:
            raise PrefixdError(method, path, resp.status, "answer longer than %d bytes" % MAX_ANSWER_BYTES)
        if resp.status // 100 != 2:
            message, plan, reason = "", None, None
            try:
                doc = json.loads(payload)
                message, plan, reason = doc.get("error", ""), doc.get("plan"), doc.get("reason")
            except (ValueError, AttributeError):
                pass
            raise _BY_STATUS.get(resp.status, PrefixdError)(method, path, resp.status, message, plan,
                                                             _retry_after(resp.getheader("Retry-After")), reason)
        if raw:
            return payload
        return json.loads(payload) if payload else None

    @staticmethod
    def _id(prefix, ident, suffix=""):
        return prefix + urllib.parse.quote(ident, safe="") + suffix

    # Workers.
    def register(self, model_name, *, instance_id, endpoint, block_size, **extensions):
        """POST /register: routing_group, dp_rank, replay_endpoint, data_parallel_size, engine_endpoint, role, … as keywords."""
        return self._do("POST", "/register", dict(instance_id=instance_id, endpoint=endpoint,
                                                  model_name=model_name, block_size=block_size, **extensions))

    def unregister(self, model_name, *, instance_id, routing_group=None, dp_rank=None):
        """POST /unregister: one group, every group of the model (no routing_group), or one rank."""
        return self._do("POST", "/unregister", _drop_none(dict(instance_id=instance_id, model_name=model_name,
                                                               routing_group=routing_group, dp_rank=dp_rank)))

    def workers(self, model_name=None, *, routing_group=None):
        """GET /workers: the workers with their ranks' stream state."""
        q = urllib.parse.urlencode(_drop_none(dict(model_name=model_name, routing_group=routing_group)))
        return self._do("GET", "/workers" + ("?" + q if q else ""))

    # Scores.
    def query(self, model_name, *, token_ids, **kw):
        """POST /query: every worker rank's cached prefix of the prompt (lora_name, cache_salt, routing_group as keywords)."""
        return self._do("POST", "/query", dict(model_name=model_name, token_ids=list(token_ids), **kw))

    def query_by_hash(self, model_name, *, block_hashes, **kw):
        """POST /query_by_hash: the prompt as local block hashes."""
        return self._do("POST", "/query_by_hash", dict(model_name=model_name, block_hashes=list(block_hashes), **kw))

    # Selection and reservations.
    def select(self, model_name, *, token_ids=None, **kw):
        """POST /select: choose a worker, book nothing."""
        return self._do("POST", "/select", _drop_none(dict(model_name=model_name, token_ids=_list(token_ids), **kw)))

    def select_and_reserve(self, model_name, *, token_ids=None, selection_id=None, wait_timeout_ms=None, priority=None, **kw):
        """POST /select_and_reserve: choose a worker and book selection_id on it.

        With wait_timeout_ms or priority the request may wait in prefixd's
        router queue while every worker is busy (serve --queue-threshold):
        at most wait_timeout_ms (None: the server's --queue-max-wait), at
        priority (higher first; a negative one is shed first). A request
        turned away raises Overloaded with e.retry_after and e.reason.
        """
        wait, read = None, None
        if wait_timeout_ms is not None or priority is not None:
            wait = _drop_none(dict(timeout_ms=wait_timeout_ms, priority=priority))
            read = wait_timeout_ms / 1000 if wait_timeout_ms is not None else MAX_WAIT_SECONDS
        return self._do("POST", "/select_and_reserve", _drop_none(dict(model_name=model_name, token_ids=_list(token_ids),
                                                                       selection_id=selection_id, wait=wait, **kw)),
                        wait=read)

    def reserve(self, model_name, *, selection_id, worker_id, dp_rank=0, token_ids=None, **kw):
        """POST /reservations: book selection_id on a worker the caller chose."""
        return self._do("POST", "/reservations", _drop_none(dict(model_name=model_name, selection_id=selection_id,
                                                                 worker_id=worker_id, dp_rank=dp_rank,
                                                                 token_ids=_list(token_ids), **kw)))

    def reservation_prefill_complete(self, selection_id):
        """POST /reservations/{id}/prefill_complete: the booked request's prefill is done."""
        return self._do("POST", self._id("/reservations/", selection_id, "/prefill_complete"))

    def free_reservation(self, selection_id):
        """DELETE /reservations/{id}."""
        return self._do("DELETE", self._id("/reservations/", selection_id))

    # Disaggregated plans.
    def create_plan(self, model_name, *, request_id, token_ids=None, **kw):
        """POST /disagg/plans: decode first unless order="prefill-first" (defer_decode=True books decode later)."""
        return self._do("POST", "/disagg/plans", _drop_none(dict(request_id=request_id, model_name=model_name,
                                                                 token_ids=_list(token_ids), **kw)))

    def plan(self, request_id):
        """GET /disagg/plans/{id}."""
        return self._do("GET", self._id("/disagg/plans/", request_id))

    def plan_prefill_complete(self, request_id):
        """POST /disagg/plans/{id}/prefill_complete: decode may start."""
        return self._do("POST", self._id("/disagg/plans/", request_id, "/prefill_complete"))

    def plan_prefill_failed(self, request_id):
        """POST /disagg/plans/{id}/prefill_failed: the plan's prefill-failure policy applies."""
        return self._do("POST", self._id("/disagg/plans/", request_id, "/prefill_failed"))

    def plan_decode(self, request_id):
        """POST /disagg/plans/{id}/decode: book a deferred plan's decode after the prefill hand-off."""
        return self._do("POST", self._id("/disagg/plans/", request_id, "/decode"))

    def release_plan(self, request_id):
        """DELETE /disagg/plans/{id}: release every booking at the end of the request."""
        return self._do("DELETE", self._id("/disagg/plans/", request_id))

    # Operations.
    def health(self):
        return self._do("GET", "/health")

    def ready(self):
        return self._do("GET", "/ready")

    def metrics(self):
        """GET /metrics, as text."""
        return self._do("GET", "/metrics", raw=True).decode()


def _retry_after(v):
    """A Retry-After of whole seconds as an int; None when absent or a date."""
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _list(ids):
    return None if ids is None else list(ids)
