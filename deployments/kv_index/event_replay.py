"""Asking an engine's KV-event publisher for batches the indexer missed.

vLLM's ZmqEventPublisher keeps its last `buffer_steps` batches and answers,
on its ROUTER replay socket, a request carrying a start sequence number with
every buffered batch from there on, as (topic, seq, payload) frames, then an
end marker (empty topic, seq -1).
"""

from __future__ import annotations

import zmq

END_SEQ = -1


def replay(ctx: zmq.Context, endpoint: str, start: int, timeout_s: float = 2.0) -> list[tuple[int, bytes]] | None:
    """The buffered batches numbered `start` and up, as (seq, payload); None if the
    publisher did not answer in full within `timeout_s` (per frame)."""
    # DEALER, not REQ: the publisher streams many messages for one request.
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
    sock.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))
    out: list[tuple[int, bytes]] = []
    try:
        sock.connect(endpoint)
        sock.send_multipart((b"", start.to_bytes(8, "big")))  # the ROUTER sees (identity, b"", start)
        while True:
            frames = sock.recv_multipart()
            if len(frames) != 4 or frames[0]:
                return None
            _, topic, seq_bytes, payload = frames
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if not topic and seq == END_SEQ:
                return out
            out.append((seq, payload))
    except zmq.ZMQError:
        return None
    finally:
        sock.close(linger=0)
