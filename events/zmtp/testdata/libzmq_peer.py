"""A libzmq peer (pyzmq) for the zmtp interop tests.

    libzmq_peer.py pub           bind a PUB to tcp://127.0.0.1:0, print the
                                 endpoint, then publish messages 0, 1, 2, ...
                                 until stdin closes
    libzmq_peer.py sub ENDPOINT  connect a SUB, subscribed to everything, and
                                 print "SEQ DIGEST" for each message received
                                 until stdin closes

Message i has three frames: the topic b"kv@w1@m", i as 8 bytes big-endian,
and a payload of SIZES[i % len(SIZES)] bytes whose byte j is (31*i + j) mod
256. DIGEST is the SHA-256 of every frame prefixed by its length as 8 bytes
big-endian. The Go test builds the same messages and digests.

Run it with /usr/bin/python3 and the Debian package python3-zmq.
"""

import hashlib
import os
import struct
import sys

import zmq

TOPIC = b"kv@w1@m"
SIZES = [0, 1, 255, 256, 2048, 70000, 1 << 20]
BASE = bytes(range(256)) * (SIZES[-1] // 256 + 2)


def message(i):
    off = (31 * i) % 256
    return [TOPIC, struct.pack(">Q", i), BASE[off:off + SIZES[i % len(SIZES)]]]


def digest(frames):
    h = hashlib.sha256()
    for f in frames:
        h.update(struct.pack(">Q", len(f)))
        h.update(f)
    return h.hexdigest()


def stdin_closed(poller, timeout_ms):
    """Waits up to timeout_ms for stdin; True once it is closed."""
    for sock, _ in poller.poll(timeout_ms):
        if sock == sys.stdin.fileno() and os.read(sys.stdin.fileno(), 4096) == b"":
            return True
    return False


def pub():
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 16)
    s.bind("tcp://127.0.0.1:0")
    print(s.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    poller = zmq.Poller()
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    i = 0
    while not stdin_closed(poller, 5):
        s.send_multipart(message(i))
        i += 1
    s.close()
    ctx.term()


def sub(endpoint):
    ctx = zmq.Context()
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(endpoint)
    poller = zmq.Poller()
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    poller.register(s, zmq.POLLIN)
    while True:
        events = dict(poller.poll())
        if sys.stdin.fileno() in events and os.read(sys.stdin.fileno(), 4096) == b"":
            break
        if s in events:
            frames = s.recv_multipart()
            seq = struct.unpack(">Q", frames[1])[0] if len(frames) > 1 and len(frames[1]) == 8 else -1
            print(seq, digest(frames), flush=True)
    s.close()
    ctx.term()


if __name__ == "__main__":
    if sys.argv[1:2] == ["pub"]:
        pub()
    elif sys.argv[1:2] == ["sub"] and len(sys.argv) == 3:
        sub(sys.argv[2])
    else:
        sys.exit(__doc__)
