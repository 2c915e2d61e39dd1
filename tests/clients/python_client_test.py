#!/usr/bin/env python3
"""The Strata protocol from another language: a Python client (Debian's
python3-grpcio) with stubs generated from proto/ at test time, against a
cluster started with `strata up`.

usage: python_client_test.py STRATA_BINARY SOURCE_DIR
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stubs import generate_stubs  # noqa: E402

STRATA, SOURCE = sys.argv[1], sys.argv[2]
MODEL = os.path.join(SOURCE, "tests", "data", "models", "deepseek_v3")


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        generate_stubs(SOURCE, cls.tmp.name)
        sys.path.insert(0, cls.tmp.name)
        global g, gg, grpc
        import grpc
        from strata.v1 import generation_pb2 as g, generation_pb2_grpc as gg
        cls.up = subprocess.Popen([STRATA, "up", "--workers", "2", "--model", MODEL, "--port", "0", "--no-kvstore"],
                                  stdout=subprocess.PIPE, text=True)
        line = cls.up.stdout.readline().strip()
        if not line.startswith("ready "):
            cls.up.kill()
            raise RuntimeError("strata up did not become ready: %r" % line)
        cls.channel = grpc.insecure_channel(line.split()[1])
        cls.stub = gg.GenerationStub(cls.channel)
        with open(os.path.join(MODEL, "reference.json")) as f:
            cls.ref = json.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.up.send_signal(signal.SIGTERM)
        code = cls.up.wait(timeout=20)
        cls.tmp.cleanup()
        if code != 0:
            raise RuntimeError("strata up exited with %d" % code)

    def greedy(self, prompt, n, **kw):
        return g.GenerateRequest(tokens=g.TokenIds(ids=prompt), sampling=g.SamplingParams(temperature=0),
                                 stopping=g.StoppingParams(max_tokens=n, ignore_eos=True), **kw)

    def test_streams_the_reference_greedy_tokens(self):
        tokens, finals = [], []
        for resp in self.stub.Generate(self.greedy(self.ref["greedy_prompt"], 16), timeout=30):
            if resp.HasField("chunk"):
                tokens += [t.id for t in resp.chunk.tokens]
            else:
                finals.append(resp.final)
        self.assertEqual(tokens, self.ref["greedy_fp8kv"][:16])
        self.assertEqual(len(finals), 1)
        self.assertEqual(finals[0].finish_reason, g.FINISH_REASON_LENGTH)
        self.assertEqual(finals[0].usage.completion_tokens, 16)

    def test_bad_request_is_invalid_argument(self):
        with self.assertRaises(grpc.RpcError) as cm:
            list(self.stub.Generate(self.greedy([], 4), timeout=10))
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("prompt is empty", cm.exception.details())

    def test_stats_show_two_stages(self):
        stats = self.stub.Stats(g.StatsRequest(), timeout=10)
        self.assertTrue(stats.ready)
        self.assertEqual(len(stats.stages), 2)
        self.assertEqual(stats.stages[-1].layer_end, 4)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
