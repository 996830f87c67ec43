#!/usr/bin/python3
"""pypub: a clean-room vLLM-compatible KV-event publisher on real libzmq.

Written from a description of what vLLM's ZmqEventPublisher
(vllm/distributed/kv_events.py) and msgspec's encoder put on the wire (framing,
replay, payload encodings, hashes), not from their code. It exists so that
prefixd's Go tests can talk to libzmq (through pyzmq) instead of only to
go-zeromq, which is the interop risk that matters.

Needs the Debian packages python3-zmq and python3-msgpack; run it with
/usr/bin/python3 (`make test` installs them).

Sockets
  * PUB (bound by default; --connect makes it connect, vLLM's "volatile"
    side): every batch is the 3-frame message [topic, seq (8 bytes BE), payload].
    seq starts at 0 and grows by 1 per batch. SNDHWM/RCVHWM = --hwm.
  * ROUTER (always bound, only with --replay-endpoint): requests
    [identity, "", start] get every buffered batch with seq >= start, then an
    end marker, in the layout chosen by --layout:
        topic : (id, "", topic, seq8, payload) ... (id, "", "", FF*8, "")
        legacy: (id, "", seq8, payload)        ... (id, "", FF*8, "")
    No socket options are set on the ROUTER (libzmq defaults: SNDHWM 1000,
    ROUTER_MANDATORY off), so a large replay to a slow reader drops messages
    silently, exactly like vLLM. Observed with a go-zeromq DEALER (5,000
    batches of 3.7 KB, loopback): batches 0..1499 arrive, everything after,
    end marker included, is discarded while send_multipart succeeds; the next
    request on the same DEALER also loses its first message (a fresh DEALER
    gets all of it).

Threads (as in vLLM): one publisher loop owns both sockets. Each iteration it
polls the ROUTER with timeout 0 and services at most one request, then waits
up to 0.1 s for the next command from a queue fed by a stdin reader thread.

Control protocol: one JSON object per stdin line, one JSON answer per line on
stdout, written after the command took effect. After binding, the first
stdout line is {"endpoint": ..., "replay_endpoint": ...|null}. Commands:

  {"cmd":"publish","events":[EVENT...],"drop":false,"ts":1.5,"rank":0,"echo":false}
      -> {"ok":true,"seq":N,"ts":T,"size":BYTES}            (+ "payload":HEX with echo)
     ts (default time.time()), rank (default --rank; null writes nil) and
     echo (return the payload bytes) are optional. EVENT is one of
       {"type":"BlockStored","block_hashes":[u64...],"parent_block_hash":u64|null,
        "token_ids":[...],"block_size":16,"medium":"GPU"|null,
        "lora_id":null,"lora_name":null}
       {"type":"BlockRemoved","block_hashes":[u64...],"medium":"GPU"|null}
       {"type":"AllBlocksCleared"}
     medium, lora_id, lora_name default to null. In --era sglang, BlockStored
     takes cache_salt and session_id instead of lora_name. In --era map, BlockStored
     also takes extra_keys, group_idx, kv_cache_spec_kind,
     kv_cache_spec_sliding_window, locality, ownership, session_id, and
     BlockRemoved group_idx, locality, ownership (omitted when null, as
     msgspec's omit_defaults does); --era array rejects them.
     drop=true simulates a PUB high-water-mark loss: the seq is consumed and
     the batch buffered for replay, but not sent.
  {"cmd":"restart"}                       -> {"ok":true}  seq back to 0, buffer cleared
  {"cmd":"drop_replay","fraction":F,"seed":S} -> {"ok":true}
     from now on each replay message (batch or end marker) is skipped with
     probability F (random.Random(S)); F = 0 turns it off.
  {"cmd":"stall_replay","seconds":S}      -> {"ok":true}
     replay requests wait unserviced (queued in the ROUTER) for S seconds.
  {"cmd":"state"}   -> {"ok":true,"seq":NEXT,"buffered":[FIRST,LAST]|null,"replays":N,
                        "last_replay":null|{"identity":HEX,"start":S,"sent":N,
                                            "dropped":N,"end_sent":BOOL}}
     replays counts serviced requests; last_replay describes the newest one
     (identity = the routing id libzmq saw; sent/dropped count messages,
     end marker included; sent means handed to libzmq, which may still drop
     it at SNDHWM).
  {"cmd":"quit"}    -> {"ok":true}, then the sockets are closed and it exits 0.
  EOF on stdin also exits 0. A bad command answers {"ok":false,"error":"..."}.

Eras (--era): map and array as vLLM (above); sglang is SGLang's positional
layout: BlockStored [tag, block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium], plus a metadata map {"cache_salt", "session_id"}
as an eighth element when the event sets either (BlockStoredWithMetadata);
BlockRemoved [tag, block_hashes, medium]; AllBlocksCleared [tag]; the rank is
SGLang's attn_dp_rank. Use it with --layout legacy (SGLang's replay has no
topic frame) and --hash signed (SGLang's hashes are signed int64).
sglang-map is SGLang's newer tagged maps: the same fields by name, then
cache_salt and session_id when set (no lora_name).

Self-test: `pypub.py --self-test` checks the encoder against the ten msgspec
0.21.1 payload vectors of events/wire/testdata/vectors.json and the SGLang and
TensorRT-LLM vectors derived from their struct declarations, byte for byte,
and exits 0 (all match) or 1.
"""

import argparse
import collections
import json
import queue
import random
import sys
import threading
import time

try:
    import msgpack
    import zmq
except ImportError as exc:  # the Go harness looks for this text
    sys.stderr.write(
        "pypub: %s; install python3-zmq python3-msgpack (make test does) "
        "and run with /usr/bin/python3\n" % exc
    )
    sys.exit(3)

END_SEQ = b"\xff" * 8
U64_MAX = (1 << 64) - 1

# Field declarations in vLLM's order (BlockStored and BlockRemoved in
# vllm/distributed/kv_events.py; map era as on main 2026-09). REQUIRED fields
# have no default: always written, nil included.
# OPTIONAL fields default to None: written only when not None.
STORED_REQUIRED = ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                   "lora_id", "medium", "lora_name")
STORED_OPTIONAL = ("extra_keys", "group_idx", "kv_cache_spec_kind",
                   "kv_cache_spec_sliding_window", "locality", "ownership", "session_id")
REMOVED_REQUIRED = ("block_hashes", "medium")
REMOVED_OPTIONAL = ("group_idx", "locality", "ownership")
SCHEMA = {
    "BlockStored": (STORED_REQUIRED, STORED_OPTIONAL),
    "BlockRemoved": (REMOVED_REQUIRED, REMOVED_OPTIONAL),
    "AllBlocksCleared": ((), ()),
}
# Fields a caller may leave out of a command (they default to None).
NULLABLE = {"parent_block_hash", "lora_id", "medium", "lora_name"}


class EncodeError(ValueError):
    pass


def wire_hash(h, mode):
    """A block hash as vLLM >= v0.10.2 puts it on the wire (vLLM PR #23673),
    or as a signed int64 (mode "signed": SGLang, TensorRT-LLM)."""
    if isinstance(h, bytes) or mode == "raw":  # self-test only: digests, signed ints
        return h
    if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= U64_MAX:
        raise EncodeError("block hash %r is not a uint64" % (h,))
    if mode == "int":
        return h
    if mode == "signed":
        return h - (1 << 64) if h >= 1 << 63 else h
    # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 sends the 32-byte digest; the int
    # mode value is its last 8 bytes big-endian. Keep that relation.
    return b"\x00" * 24 + h.to_bytes(8, "big")


def wire_field(tag, name, v, hash_mode):
    """A field's value as it goes on the wire: hashes in hash_mode."""
    if name == "block_hashes":
        if not isinstance(v, list):
            raise EncodeError("%s: block_hashes must be a list" % tag)
        return [wire_hash(h, hash_mode) for h in v]
    if name == "parent_block_hash" and v is not None:
        return wire_hash(v, hash_mode)
    return v


def event_fields(ev, era, hash_mode):
    """Returns (tag, [(name, value)...]) with every declared field present."""
    if not isinstance(ev, dict):
        raise EncodeError("event %r is not an object" % (ev,))
    tag = ev.get("type")
    if tag not in SCHEMA:
        raise EncodeError("unknown event type %r" % (tag,))
    required, optional = SCHEMA[tag]
    known = set(required) | set(optional) | {"type"}
    extra = set(ev) - known
    if extra:
        raise EncodeError("%s: unknown fields %s" % (tag, sorted(extra)))
    if era == "array":
        used = [k for k in optional if ev.get(k) is not None]
        if used:
            raise EncodeError("%s: fields %s do not exist in the array era" % (tag, used))
    fields = []
    for name in required + optional:
        if name not in ev and name in required and name not in NULLABLE:
            raise EncodeError("%s: missing %s" % (tag, name))
        fields.append((name, wire_field(tag, name, ev.get(name), hash_mode)))
    return tag, fields, len(required)


def encode_event(ev, era, hash_mode):
    tag, fields, nreq = event_fields(ev, era, hash_mode)
    if era == "array":
        # array_like: [tag, *all fields], never trimmed (msgspec #720).
        return [tag] + [v for _, v in fields[:nreq]]
    # Tagged map: "type" first, required fields always, defaulted fields only
    # when they differ from their default (None). Python dicts keep order.
    m = {"type": tag}
    for i, (name, v) in enumerate(fields):
        if i < nreq or v is not None:
            m[name] = v
    return m


# SGLang's positional structs (python/sglang/srt/disaggregation/kv_events.py,
# array_like, tag=True): BlockStored [tag, block_hashes, parent_block_hash,
# token_ids, block_size, lora_id, medium]; a salted store is
# BlockStoredWithMetadata (tag "BlockStored", sgl-project/sglang PR #30827),
# the same array plus a kw-only `metadata` BlockStoredMetadata, a map struct
# with omit_defaults: {"cache_salt": ...} (and "session_id", PR #37482), left
# out altogether when the request has neither. BlockRemoved [tag,
# block_hashes, medium]; AllBlocksCleared [tag]. The batch's third element is
# attn_dp_rank.
SGLANG_SCHEMA = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                    "lora_id", "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}
SGLANG_METADATA = ("cache_salt", "session_id")


def encode_event_sglang(ev, hash_mode):
    if not isinstance(ev, dict):
        raise EncodeError("event %r is not an object" % (ev,))
    tag = ev.get("type")
    if tag not in SGLANG_SCHEMA:
        raise EncodeError("unknown event type %r" % (tag,))
    fields = SGLANG_SCHEMA[tag]
    known = set(fields) | {"type"} | (set(SGLANG_METADATA) if tag == "BlockStored" else set())
    extra = set(ev) - known
    if extra:
        raise EncodeError("%s: fields %s do not exist in SGLang's positional layout" % (tag, sorted(extra)))
    out = [tag]
    for name in fields:
        if name not in ev and name not in NULLABLE:
            raise EncodeError("%s: missing %s" % (tag, name))
        out.append(wire_field(tag, name, ev.get(name), hash_mode))
    meta = {k: ev[k] for k in SGLANG_METADATA if ev.get(k) is not None}
    if meta:
        out.append(meta)
    return out


def encode_event_sglang_map(ev, hash_mode):
    """SGLang's newer tagged maps (sgl-project/sglang PR #37482): "type", the
    positional fields by name, then cache_salt and session_id only when set.
    The field order is an assumption (no struct declaration was available);
    the decoder reads maps by name."""
    out = encode_event_sglang(ev, hash_mode)
    tag, fields = out[0], SGLANG_SCHEMA[out[0]]
    m = {"type": tag}
    for name, v in zip(fields, out[1:]):
        m[name] = v
    for k in SGLANG_METADATA:
        if ev.get(k) is not None:
            m[k] = ev[k]
    return m


ERAS = ("map", "array", "sglang", "sglang-map")


def encode_batch(ts, events, rank, era, hash_mode):
    """msgspec-identical KVEventBatch: [ts, events, rank], never trimmed."""
    if era not in ERAS:
        raise EncodeError("era must be one of %s" % ", ".join(ERAS))
    if not isinstance(events, list):
        raise EncodeError("events must be a list")
    if era == "sglang":
        evs = [encode_event_sglang(e, hash_mode) for e in events]
    elif era == "sglang-map":
        evs = [encode_event_sglang_map(e, hash_mode) for e in events]
    else:
        evs = [encode_event(e, era, hash_mode) for e in events]
    body = [float(ts), evs, rank]
    return msgpack.packb(body, use_bin_type=True, use_single_float=False)


# ---------------------------------------------------------------------------
# Self-test against the msgspec 0.21.1 vectors of events/wire/testdata/vectors.json
# (the same hex; names abridged).

H = 0xFEDCBA9876543210
STORED_91 = {"type": "BlockStored", "block_hashes": [H], "parent_block_hash": None,
             "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": None,
             "medium": "GPU", "lora_name": None}
SGL_STORED = {k: v for k, v in STORED_91.items() if k != "lora_name"}
VECTORS = [
    ("9.1 map BlockStored", "map", "int", [STORED_91], 0,
     "93cb3ff80000000000009188a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391"
     "cffedcba9876543210b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304"
     "aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c000"),
    ("9.2 map BlockStored as vLLM fills it", "map", "int",
     [dict(STORED_91, parent_block_hash=7, extra_keys=[None], group_idx=0,
           kv_cache_spec_kind="full_attention")], 0,
     "93cb3ff8000000000000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391"
     "cffedcba9876543210b1706172656e745f626c6f636b5f6861736807a9746f6b656e5f6964739401020304"
     "aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0"
     "aa65787472615f6b65797391c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64"
     "ae66756c6c5f617474656e74696f6e00"),
    ("9.3 map BlockRemoved rank 1", "map", "int",
     [{"type": "BlockRemoved", "block_hashes": [H], "medium": "GPU"}], 1,
     "93cb3ff80000000000009183a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573"
     "91cffedcba9876543210a66d656469756da347505501"),
    ("9.3 map AllBlocksCleared rank 0", "map", "int", [{"type": "AllBlocksCleared"}], 0,
     "93cb3ff80000000000009181a474797065b0416c6c426c6f636b73436c656172656400"),
    ("9.3 map AllBlocksCleared rank None", "map", "int", [{"type": "AllBlocksCleared"}], None,
     "93cb3ff80000000000009181a474797065b0416c6c426c6f636b73436c6561726564c0"),
    ("9.3 map BlockStored bytes hash", "map", "int",
     [dict(STORED_91, block_hashes=[bytes(range(32))], token_ids=[1], block_size=1)], 0,
     "93cb3ff80000000000009188a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391"
     "c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fb1706172656e745f62"
     "6c6f636b5f68617368c0a9746f6b656e5f6964739101aa626c6f636b5f73697a6501a76c6f72615f6964c0"
     "a66d656469756da3475055a96c6f72615f6e616d65c000"),
    ("9.3 map BlockRemoved negative hash", "map", "raw",
     [{"type": "BlockRemoved", "block_hashes": [-2], "medium": None}], 0,
     "93cb3ff80000000000009183a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573"
     "91fea66d656469756dc000"),
    ("9.4 array BlockStored", "array", "int", [STORED_91], 0,
     "93cb3ff80000000000009198ab426c6f636b53746f72656491cffedcba9876543210c0940102030404c0"
     "a3475055c000"),
    ("9.4 array BlockRemoved rank 1", "array", "int",
     [{"type": "BlockRemoved", "block_hashes": [H], "medium": "GPU"}], 1,
     "93cb3ff80000000000009193ac426c6f636b52656d6f76656491cffedcba9876543210a347505501"),
    ("9.4 array AllBlocksCleared rank 0", "array", "int", [{"type": "AllBlocksCleared"}], 0,
     "93cb3ff80000000000009191b0416c6c426c6f636b73436c656172656400"),
    # SGLang and TensorRT-LLM vectors of events/wire/testdata/vectors.json (bytes
    # derived from their struct declarations; see each vector's source).
    ("sglang BlockStored unsalted", "sglang", "signed", [SGL_STORED], 0,
     "93cb3ff80000000000009197ab426c6f636b53746f72656491d3fedcba9876543210c0940102030404c0a347505500"),
    ("sglang BlockStoredWithMetadata salted", "sglang", "signed",
     [dict(SGL_STORED, block_hashes=[H, 5], parent_block_hash=U64_MAX - 6,
           token_ids=[1, 2, 3, 4, 5, 6, 7, 8], cache_salt="tenant-a")], 1,
     "93cb3ff80000000000009198ab426c6f636b53746f72656492d3fedcba987654321005f998010203040506070804"
     "c0a347505581aa63616368655f73616c74a874656e616e742d6101"),
    ("sglang BlockRemoved media, AllBlocksCleared", "sglang", "signed",
     [{"type": "BlockRemoved", "block_hashes": [H], "medium": "CPU_PINNED"},
      {"type": "BlockRemoved", "block_hashes": [5, 6], "medium": "DISK"},
      {"type": "BlockRemoved", "block_hashes": [7], "medium": "EXTERNAL"},
      {"type": "AllBlocksCleared"}], 2,
     "93cb3ff80000000000009493ac426c6f636b52656d6f76656491d3fedcba9876543210aa4350555f50494e4e45449"
     "3ac426c6f636b52656d6f766564920506a44449534b93ac426c6f636b52656d6f7665649107a845585445524e41"
     "4c91b0416c6c426c6f636b73436c656172656402"),
    ("sglang mixed batch", "sglang", "signed",
     [SGL_STORED, dict(SGL_STORED, block_hashes=[6], parent_block_hash=H, token_ids=[5, 6, 7, 8],
                       medium="CPU_PINNED", cache_salt="tenant-b", session_id="sess-1"),
      {"type": "BlockRemoved", "block_hashes": [H], "medium": "GPU"}], 3,
     "93cb3ff80000000000009397ab426c6f636b53746f72656491d3fedcba9876543210c0940102030404c0a3475055"
     "98ab426c6f636b53746f7265649106d3fedcba9876543210940506070804c0aa4350555f50494e4e454482aa6361"
     "6368655f73616c74a874656e616e742d62aa73657373696f6e5f6964a6736573732d3193ac426c6f636b52656d6f"
     "76656491d3fedcba9876543210a347505503"),
    ("sglang map-tagged BlockStored", "sglang-map", "signed",
     [dict(SGL_STORED, cache_salt="tenant-a", session_id="sess-1")], 0,
     "93cb3ff80000000000009189a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391"
     "d3fedcba9876543210b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304"
     "aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055aa63616368655f73616c74"
     "a874656e616e742d61aa73657373696f6e5f6964a6736573732d3100"),
    ("trtllm BlockStored signed hash", "map", "signed", [STORED_91], 0,
     "93cb3ff80000000000009188a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391"
     "d3fedcba9876543210b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304"
     "aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c000"),
    ("trtllm coalesced BlockStored, BlockRemoved", "map", "signed",
     [dict(STORED_91, block_hashes=[0x1111222233334444, 0x9999AAAABBBBCCCC], parent_block_hash=0x7777,
           token_ids=[1, 2, 3, 4, 5, 6, 7, 8]),
      {"type": "BlockRemoved", "block_hashes": [H], "medium": "GPU"}], 1,
     "93cb3ff80000000000009288a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf11"
     "11222233334444d39999aaaabbbbccccb1706172656e745f626c6f636b5f68617368cd7777a9746f6b656e5f69"
     "6473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c"
     "6f72615f6e616d65c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391d3fedc"
     "ba9876543210a66d656469756da347505501"),
]


def self_test(out):
    failed = 0
    for name, era, hmode, events, rank, want in VECTORS:
        try:
            got = encode_batch(1.5, events, rank, era, hmode).hex()
        except Exception as exc:  # noqa: BLE001 - report, count, go on
            got = "%s: %s" % (type(exc).__name__, exc)
        ok = got == want
        failed += not ok
        out.write("%s %s (%d bytes)\n" % ("ok  " if ok else "FAIL", name, len(want) // 2))
        if not ok:
            out.write("  want %s\n  got  %s\n" % (want, got))
    # The bytes-hash mode keeps the int-mode value in the digest's last 8
    # bytes: the "9.3 map BlockStored bytes hash" vector's 32-byte digest
    # 00..1f normalises to 0x18191a1b1c1d1e1f; ours writes 24 zero bytes then
    # the uint64.
    got = encode_batch(1.5, [{"type": "BlockRemoved", "block_hashes": [0x18191a1b1c1d1e1f],
                              "medium": None}], 0, "map", "bytes")
    want = msgpack.unpackb(got, raw=True)[1][0][b"block_hashes"][0]
    ok = isinstance(want, bytes) and len(want) == 32 and want[-8:] == bytes.fromhex("18191a1b1c1d1e1f") \
        and got.hex().find("c420" + "00" * 24 + "18191a1b1c1d1e1f") > 0
    failed += not ok
    out.write("%s bytes hash is bin8(32) ending in the uint64\n" % ("ok  " if ok else "FAIL"))
    out.write("%s\n" % ("PASS" if failed == 0 else "FAIL: %d mismatches" % failed))
    return failed == 0


# ---------------------------------------------------------------------------
# Publisher.

class Publisher:
    def __init__(self, args):
        self.topic = args.topic.encode("utf-8")
        self.era = args.era
        self.hash_mode = args.hash
        self.layout = args.layout
        self.rank = args.rank
        self.buffer_steps = args.buffer_steps
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.set_hwm(args.hwm)  # SNDHWM and RCVHWM, as vLLM does
        if args.connect:
            self.pub.connect(args.endpoint)
            self.endpoint = args.endpoint
        else:
            self.pub.bind(args.endpoint)
            self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = None
        self.replay_endpoint = None
        if args.replay_endpoint:
            # Always bound; deliberately no options (libzmq defaults).
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.bind(args.replay_endpoint)
            self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.seq = 0
        self.buffer = collections.deque(maxlen=self.buffer_steps)
        self.drop_fraction = 0.0
        self.drop_rng = random.Random(0)
        self.stall_until = 0.0
        self.replays = 0
        self.last_replay = None

    # -- replay ------------------------------------------------------------

    def service_replay(self):
        """Services at most one replay request (vLLM's poll(0) step)."""
        if self.router is None or time.monotonic() < self.stall_until:
            return
        if not self.router.poll(0, zmq.POLLIN):
            return
        frames = self.router.recv_multipart()
        if len(frames) != 3 or frames[1] != b"":
            log("invalid replay request: %r" % (frames,))
            return
        ident, _, start_b = frames
        start = int.from_bytes(start_b, "big")
        self.replays += 1
        self.last_replay = {"identity": ident.hex(), "start": start,
                            "sent": 0, "dropped": 0, "end_sent": False}
        for seq, payload in self.buffer:
            if seq >= start:
                seq8 = seq.to_bytes(8, "big")
                if self.layout == "topic":
                    self.replay_send((ident, b"", self.topic, seq8, payload))
                else:
                    self.replay_send((ident, b"", seq8, payload))
        if self.layout == "topic":
            end = self.replay_send((ident, b"", b"", END_SEQ, b""))
        else:
            end = self.replay_send((ident, b"", END_SEQ, b""))
        self.last_replay["end_sent"] = end

    def replay_send(self, frames):
        """Sends one replay message unless drop_replay skips it; True if sent."""
        if self.drop_fraction > 0 and self.drop_rng.random() < self.drop_fraction:
            self.last_replay["dropped"] += 1
            return False
        # ROUTER without ROUTER_MANDATORY never blocks: at SNDHWM (or for an
        # unknown identity) libzmq discards the message silently.
        self.router.send_multipart(frames)
        self.last_replay["sent"] += 1
        return True

    # -- commands ----------------------------------------------------------

    def handle(self, cmd):
        if not isinstance(cmd, dict):
            raise EncodeError("command must be a JSON object")
        name = cmd.get("cmd")
        if name == "publish":
            ts = cmd.get("ts")
            ts = time.time() if ts is None else float(ts)
            rank = cmd["rank"] if "rank" in cmd else self.rank
            if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
                raise EncodeError("rank must be an int or null")
            payload = encode_batch(ts, cmd.get("events"), rank, self.era, self.hash_mode)
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, payload))
            if not cmd.get("drop", False):
                self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
            answer = {"ok": True, "seq": seq, "ts": ts, "size": len(payload)}
            if cmd.get("echo"):
                answer["payload"] = payload.hex()
            return answer
        if name == "restart":
            self.seq = 0
            self.buffer.clear()
            return {"ok": True}
        if name == "drop_replay":
            f = float(cmd.get("fraction", 0))
            if not 0 <= f <= 1:
                raise EncodeError("fraction must be in [0, 1]")
            self.drop_fraction = f
            self.drop_rng = random.Random(cmd.get("seed", 0))
            return {"ok": True}
        if name == "stall_replay":
            self.stall_until = time.monotonic() + float(cmd.get("seconds", 0))
            return {"ok": True}
        if name == "state":
            buffered = [self.buffer[0][0], self.buffer[-1][0]] if self.buffer else None
            return {"ok": True, "seq": self.seq, "buffered": buffered,
                    "replays": self.replays, "last_replay": self.last_replay}
        raise EncodeError("unknown cmd %r" % (name,))

    def run(self, commands):
        while True:
            self.service_replay()
            try:
                line = commands.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:  # EOF
                return
            try:
                cmd = json.loads(line)
                if isinstance(cmd, dict) and cmd.get("cmd") == "quit":
                    reply({"ok": True})
                    return
                answer = self.handle(cmd)
            except (ValueError, TypeError, KeyError, OverflowError) as exc:
                answer = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
            reply(answer)

    def close(self):
        self.pub.close(linger=0)
        if self.router is not None:
            self.router.close(linger=0)
        self.ctx.term()


def log(msg):
    sys.stderr.write("pypub: %s\n" % msg)
    sys.stderr.flush()


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def read_stdin(commands):
    for line in sys.stdin:
        line = line.strip()
        if line:
            commands.put(line)
    commands.put(None)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--self-test", action="store_true")
    p.add_argument("--endpoint", default="tcp://127.0.0.1:0")
    p.add_argument("--replay-endpoint", default="",
                   help="ROUTER bind address; empty = no replay socket")
    p.add_argument("--connect", action="store_true",
                   help="connect the PUB instead of binding it (centralised mode)")
    p.add_argument("--topic", default="")
    p.add_argument("--era", choices=ERAS, default="map")
    p.add_argument("--layout", choices=("topic", "legacy"), default="topic")
    p.add_argument("--hash", choices=("int", "bytes", "signed"), default="int")
    p.add_argument("--buffer-steps", type=int, default=10000)
    p.add_argument("--hwm", type=int, default=100000)
    p.add_argument("--rank", type=int, default=0)
    args = p.parse_args(argv)
    if args.self_test:
        return 0 if self_test(sys.stdout) else 1
    if args.buffer_steps < 1:
        p.error("--buffer-steps must be >= 1")

    publisher = Publisher(args)
    reply({"endpoint": publisher.endpoint, "replay_endpoint": publisher.replay_endpoint})
    commands = queue.Queue()
    threading.Thread(target=read_stdin, args=(commands,), daemon=True).start()
    try:
        publisher.run(commands)
    finally:
        publisher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
