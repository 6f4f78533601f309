"""A loopback HTTP proxy that gives an object store's test server a real store's manners: time to first byte,
throttling and dropped connections.

S3 and GCS answer each request after tens of milliseconds and now and then throttle (S3: 503 with the XML error
``SlowDown``; GCS: 429 or 503 with a JSON error); SeaweedFS and fake-gcs-server on 127.0.0.1 (the
``tests/object_stores`` fixtures) answer in about a millisecond and never refuse. A :class:`StoreProxy` sits between
pyarrow and such a server: pyarrow is pointed at the proxy (``endpoint_override=proxy.endpoint``, or
``AWS_ENDPOINT_URL`` / ``STORAGE_EMULATOR_HOST`` set to ``proxy.url``), and every request goes on to the server
unchanged, its answer coming back unchanged ``latency_s`` after the request; or, without reaching the server, a
throttling answer or a reset comes back instead (:meth:`StoreProxy.fail_next`, :meth:`StoreProxy.drop_next`)::

    with StoreProxy(s3_server.endpoint, latency_s=0.03) as proxy:
        fs = pyarrow.fs.S3FileSystem(endpoint_override=proxy.endpoint, scheme="http", ...)
        proxy.fail_next(2, *s3_slow_down())          # pyarrow's retries must get past these two
        data = fs.open_input_file("bucket/key").read()
        proxy.requests, proxy.failed, proxy.recent   # forwarded, answered by the proxy, the last (method, path, status)

``tests/object_stores/test_store_proxy.py`` checks it against both servers (uploads, whole and ranged reads,
listings, latency per request and not per connection, pyarrow's retries past injected throttling and resets) and
against a plain server of its own (chunked bodies, ``Expect: 100-continue``, the Host header, kept-alive
connections). It is meant for ``python -m bench`` suites that read TFRecords from a bucket: a proxy in front of the
loopback server, its ``latency_s`` set per measurement, makes the reads those of a store with a real store's delays.

The proxy runs in a process of its own (``python -m bench.peers.store_proxy``, driven over its stdin and stdout), one
thread per client connection: pyarrow holds the GIL in some calls that wait on the network (``closed``, which it
checks before every read, waits for a GCS download's first byte), so a proxy thread in the calling process could
not answer them, and would take the GIL from the process it measures.

Requests go to the server as they came, the Host header included: SigV4 signs the Host that the AWS SDK sent (the
proxy's host:port) and SeaweedFS checks the signature against the Host it receives (one rewritten to the server's
address is refused, SignatureDoesNotMatch); fake-gcs-server names its resumable upload sessions from it, so that an
upload's later requests come through the proxy too. Bodies pass through framed as they came (``Content-Length``, or
chunked with its extensions and trailers, as the AWS SDK sends its ``aws-chunked`` parts; an answer may also run
until the server closes); a client that sends ``Expect: 100-continue`` (the AWS SDK's parts, google-cloud-cpp's
large uploads) is told to go on at once, and the server's own ``100 Continue`` is not passed on. Both sides are
kept alive, so the latency is per request, not per connection. Standard library only.
"""

from bench.peers.store_proxy.client import ProxyFailed, StoreProxy
from bench.peers.store_proxy.faults import Requests, gcs_rate_limited, s3_slow_down
from bench.peers.store_proxy.server import THREAD_PREFIX, ProxyServer

__all__ = ["StoreProxy", "ProxyServer", "Requests", "s3_slow_down", "gcs_rate_limited", "ProxyFailed",
           "THREAD_PREFIX"]
