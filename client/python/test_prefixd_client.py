"""Tests of prefixd_client against a real prefixd API.

Run by client's TestPythonClient (go test ./client), which serves the API
with engines 1 (aggregated, holding the 64-token prompt 1..64), 2
(prefill) and 3 (decode) of model "m", and passes its URL and API token
in PREFIXD_URL and PREFIXD_TOKEN.
"""

import inspect
import os
import threading
import unittest

import prefixd_client as pc

URL = os.environ.get("PREFIXD_URL")
TOKEN = os.environ.get("PREFIXD_TOKEN")
PROMPT = list(range(1, 65))


@unittest.skipUnless(URL, "PREFIXD_URL is not set (run go test ./client)")
class ClientTest(unittest.TestCase):
    def setUp(self):
        self.c = pc.Client(URL, token=TOKEN)
        self.addCleanup(self.c.close)

    def test_health_and_metrics(self):
        self.assertEqual(self.c.health(), {"status": "ok"})
        self.c.ready()
        self.assertIn("up 1", self.c.metrics())

    def test_query(self):
        s = self.c.query("m", token_ids=PROMPT)
        self.assertEqual(s["instances"]["1"]["longest_matched"], 64)
        with self.assertRaises(pc.NotFound) as e:
            self.c.query("nope", token_ids=PROMPT)
        self.assertIn("no indexer for model=nope", e.exception.message)

    def test_register_and_workers(self):
        self.c.register("m", instance_id=9, endpoint="tcp://h:5557", block_size=16, engine_endpoint="http://h:8000", role="decode")
        ws = self.c.workers(model_name="m")
        self.assertIn(9, [w["instance_id"] for w in ws])
        with self.assertRaises(pc.Invalid) as e:
            self.c.register("m", instance_id=9, endpoint="udp://h", block_size=16)
        self.assertTrue(e.exception.message.startswith("endpoint:"), e.exception.message)
        with pc.Client(URL) as anonymous, self.assertRaises(pc.Unauthorized):
            anonymous.register("m", instance_id=9, endpoint="tcp://h:5557", block_size=16)

    def test_reservation_lifecycle(self):
        sel = self.c.select_and_reserve("m", token_ids=PROMPT, selection_id="py-a")
        self.assertEqual((sel["worker_id"], sel["overlap"]["gpu"]), (1, 64))
        with self.assertRaises(pc.Conflict):
            self.c.select_and_reserve("m", token_ids=PROMPT, selection_id="py-a")
        self.c.reservation_prefill_complete("py-a")
        self.c.free_reservation("py-a")
        with self.assertRaises(pc.NotFound):
            self.c.free_reservation("py-a")
        r = self.c.reserve("m", selection_id="py-b", worker_id=1, token_ids=PROMPT)
        self.assertEqual(r["worker_id"], 1)
        self.c.free_reservation("py-b")

    def test_wait_in_the_router_queue(self):
        # 64 uncached tokens make engine 1 busy (the fixture's queue:
        # threshold 0.5 of its max_num_batched_tokens 64).
        busy = list(range(1000, 1064))
        self.c.select_and_reserve("m", token_ids=busy, selection_id="py-busy")
        self.addCleanup(self.c.free_reservation, "py-busy")
        with self.assertRaises(pc.Overloaded) as e:
            self.c.select_and_reserve("m", token_ids=PROMPT, selection_id="py-late", wait_timeout_ms=50, priority=3)
        self.assertEqual(e.exception.reason, "wait_expired")
        self.assertGreaterEqual(e.exception.retry_after, 1)
        self.assertIn("priority 3", e.exception.message)
        with self.assertRaises(pc.Invalid) as e:
            self.c.select_and_reserve("m", token_ids=PROMPT, selection_id="py-bad", priority=5000)
        self.assertTrue(e.exception.message.startswith("wait.priority:"), e.exception.message)
        self.assertIsNone(e.exception.retry_after)
        # Placed as soon as the booking is freed.
        got = {}
        t = threading.Thread(target=lambda: got.update(self.c.select_and_reserve(
            "m", token_ids=PROMPT, selection_id="py-queued", wait_timeout_ms=30000)))
        t.start()
        self.c.free_reservation("py-busy")
        t.join(30)
        self.assertEqual(got.get("worker_id"), 1)
        self.c.free_reservation("py-queued")
        # Without a wait nothing waits.
        sel = self.c.select_and_reserve("m", token_ids=busy, selection_id="py-busy")
        self.assertEqual(sel["worker_id"], 1)

    def test_plan_lifecycle(self):
        p = self.c.create_plan("m", request_id="py-p", token_ids=[0] * 4096)
        self.assertEqual((p["state"], p["decode"]["worker_id"], p["prefill"]["worker_id"]), ("Linked", 3, 2))
        self.assertEqual(self.c.plan("py-p")["state"], "Linked")
        self.assertEqual(self.c.plan_prefill_complete("py-p")["state"], "PrefillReleased")
        self.assertEqual(self.c.release_plan("py-p")["state"], "Released")
        with self.assertRaises(pc.NotFound):
            self.c.release_plan("py-p")

    def test_deferred_plan(self):
        p = self.c.create_plan("m", request_id="py-d", token_ids=[0] * 64, order="prefill-first", defer_decode=True)
        self.assertEqual((p["state"], p["decode"]), ("PrefillCommitted", None))
        self.c.plan_prefill_complete("py-d")
        self.assertEqual(self.c.plan_decode("py-d")["decode"]["worker_id"], 3)
        self.c.release_plan("py-d")

    def test_threads_share_a_client(self):
        errors = []

        def run(i):
            try:
                for j in range(20):
                    sid = "py-t%d-%d" % (i, j)
                    self.c.select_and_reserve("m", token_ids=PROMPT, selection_id=sid)
                    self.c.free_reservation(sid)
            except Exception as e:  # reported below
                errors.append(e)

        ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])

    def test_one_argument_convention(self):
        """Every method takes at most one positional argument (the model,
        or the reservation's or plan's id); the rest are keyword-only."""
        methods = [m for m in dir(pc.Client) if not m.startswith("_") and callable(getattr(pc.Client, m))]
        self.assertIn("create_plan", methods)
        for name in methods:
            params = list(inspect.signature(getattr(pc.Client, name)).parameters.values())[1:]  # self
            positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
            self.assertLessEqual(len(positional), 1, "%s takes %s positionally" % (name, positional))
            if positional and name not in ("health", "ready", "metrics", "close"):
                self.assertIn(positional[0], ("model_name", "selection_id", "request_id"), name)
        with self.assertRaises(TypeError):
            self.c.create_plan("py-x", "m", [0] * 64)  # the old order
        with self.assertRaises(TypeError):
            self.c.select_and_reserve("m", PROMPT)

    def test_bad_base_url(self):
        with self.assertRaises(ValueError):
            pc.Client("ftp://x")


if __name__ == "__main__":
    unittest.main()
