"""What a proxy answers instead of the server: a real store's throttling answers (:func:`s3_slow_down`,
:func:`gcs_rate_limited`), the requests a fault applies to (:class:`Requests`), and a fault itself (:class:`Fault`).
"""

from __future__ import annotations

import dataclasses
import http
import json
import re
from typing import Callable

__all__ = ["Match", "s3_slow_down", "gcs_rate_limited", "Requests", "Fault"]

#: A function of (method, path with its query) that says whether a fault applies to a request.
Match = Callable[[str, str], bool]


def s3_slow_down() -> tuple[int, bytes, dict[str, str]]:
    """S3's throttling answer, as (status, body, headers) for :meth:`StoreProxy.fail_next`.

    >>> status, body, headers = s3_slow_down()
    >>> status, b"<Code>SlowDown</Code>" in body, headers["Content-Type"]
    (503, True, 'application/xml')
    """
    body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            b'<Message>Please reduce your request rate.</Message></Error>')
    return 503, body, {"Content-Type": "application/xml"}


def gcs_rate_limited(status: int = 429) -> tuple[int, bytes, dict[str, str]]:
    """GCS's throttling answer, as (status, body, headers) for :meth:`StoreProxy.fail_next`: 429 (a rate limit
    exceeded) or 503 (the backend asking for a retry), each with the JSON error GCS sends.

    >>> gcs_rate_limited(503)[0], json.loads(gcs_rate_limited()[1])["error"]["errors"][0]["reason"]
    (503, 'rateLimitExceeded')
    """
    if status not in (429, 503):
        raise ValueError(f"GCS throttles with 429 or 503, not {status}")
    reason, message = (("rateLimitExceeded", "The rate of requests exceeds the rate limit. Please reduce your "
                        "request rate.") if status == 429 else
                       ("backendError", "We encountered an internal error. Please try again."))
    error = {"code": status, "message": message, "errors": [{"message": message, "domain": "global",
                                                             "reason": reason}]}
    return status, json.dumps({"error": error}).encode(), {"Content-Type": "application/json; charset=UTF-8"}


@dataclasses.dataclass(frozen=True)
class Requests:
    """A ``match`` for :meth:`StoreProxy.fail_next` and :meth:`StoreProxy.drop_next`: the requests with ``method``
    (any: None) whose path, query included, contains a match of the regular expression ``path`` (any: None).

    >>> Requests("GET", r"[?&]alt=media")("GET", "/storage/v1/b/tfrecords/o/a.bin?alt=media")
    True
    >>> Requests("PUT")("GET", "/tfrecords/a.bin")
    False
    """
    method: str | None = None
    path: str | None = None

    def __call__(self, method: str, path: str) -> bool:
        return ((self.method is None or method == self.method)
                and (self.path is None or re.search(self.path, path) is not None))


@dataclasses.dataclass
class Fault:
    """What the next ``remaining`` requests that ``match`` get instead of the server's answer: ``status`` with
    ``body`` and ``headers``, or (status None) their connection reset."""
    remaining: int
    match: Match | None = None
    status: int | None = None
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()

    def applies(self, method: str, path: str) -> bool:
        return self.remaining > 0 and (self.match is None or bool(self.match(method, path)))

    def answer(self, method: str, keep_alive: bool) -> bytes:
        """The whole response: status line, headers (with Content-Length, and Connection: close unless
        ``keep_alive``) and the body (none to a HEAD)."""
        try:
            reason = http.HTTPStatus(self.status).phrase
        except ValueError:
            reason = "Injected"
        lines = [f"HTTP/1.1 {self.status} {reason}", *(f"{name}: {value}" for name, value in self.headers),
                 f"Content-Length: {len(self.body)}", *([] if keep_alive else ["Connection: close"])]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if method == "HEAD" else head + self.body
