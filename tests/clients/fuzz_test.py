#!/usr/bin/env python3
"""Bad input never kills a server: random requests at every RPC of a running
cluster (strata-kvstore, strata-coordinator, two strata-worker processes).

Three rounds, from a seed printed at the start (STRATA_TEST_SEED replays one,
as for every randomised test of the project; STRATA_FUZZ_SEED, its older name,
is still read when STRATA_TEST_SEED is unset):
  1. every method of Generation, Coordinator, Worker and KVStore gets messages
     whose fields hold random or extreme values (ints at their limits, NaN and
     infinite floats, long, empty and path-like strings, big repeated fields),
     and one call in six gets bytes that are not a message at all;
     then both workers' Execute streams get stage batches as the coordinator
     sends them (current epoch, ids in the vocabulary, hidden rows of the
     right size) with zero to three fields broken;
  2. valid Generate requests with one to three fields mutated, sixteen at a
     time, with session saves, resumes and deletes among them;
  3. the greedy request asked before the rounds is asked again.
It fails when a process exits, when a call ends with UNKNOWN, INTERNAL,
DATA_LOSS or DEADLINE_EXCEEDED (a crash, an unhandled case or a hang rather
than an answer), or when the last request's tokens differ from the first's.

usage: fuzz_test.py BINARY_DIR SOURCE_DIR
"""
import json
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stubs import generate_stubs  # noqa: E402

BIN, SOURCE = sys.argv[1], sys.argv[2]
MODEL = os.path.join(SOURCE, "models", "demo")  # has a tokenizer: prompts, chats and stop strings too
with open(os.path.join(MODEL, "config.json")) as f:
    _config = json.load(f)
HIDDEN, VOCAB = _config["hidden_size"], _config["vocab_size"]


def test_seed():
    """The seed STRATA_TEST_SEED (or STRATA_FUZZ_SEED) names, else a fresh one,
    as common/testing/test_seed.h draws them: a decimal u64."""
    for name in ("STRATA_TEST_SEED", "STRATA_FUZZ_SEED"):
        value = os.environ.get(name, "")
        if value:
            if not value.isdigit() or int(value) >= 1 << 64:
                sys.exit("%s=%r is not a decimal u64" % (name, value))
            return int(value)
    return random.SystemRandom().getrandbits(64)


SEED = test_seed()
BAD_CODES = ("UNKNOWN", "INTERNAL", "DATA_LOSS", "DEADLINE_EXCEEDED")
# Deadlines: a call answers in milliseconds here; these leave room for a
# loaded CI machine and still end a hang (a Save that waits for rows that
# never come waits up to 60 s on the server).
CALL_S, SESSION_CALL_S = 20, 30


def wait_for(what, predicate, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError("%s: not within %d s" % (what, timeout_s))


class Values:
    """Random and extreme values for protobuf fields."""

    def __init__(self, rng, strings):
        self.rng = rng
        self.strings = strings

    def scalar(self, f):
        r, T = self.rng, FieldDescriptor
        if f.type in (T.TYPE_INT32, T.TYPE_SINT32, T.TYPE_SFIXED32):
            return r.choice([0, 1, -1, 7, 2**31 - 1, -2**31, r.randint(-1000, 1000), r.randint(0, 60)])
        if f.type in (T.TYPE_INT64, T.TYPE_SINT64, T.TYPE_SFIXED64):
            return r.choice([0, 1, -1, 2**63 - 1, -2**63, r.randint(-10**6, 10**6), r.randint(0, 60)])
        if f.type in (T.TYPE_UINT32, T.TYPE_FIXED32):
            return r.choice([0, 1, 2**32 - 1, r.randint(0, 1000)])
        if f.type in (T.TYPE_UINT64, T.TYPE_FIXED64):
            return r.choice([0, 1, 2**64 - 1, r.randint(0, 10**6)])
        if f.type in (T.TYPE_FLOAT, T.TYPE_DOUBLE):
            return r.choice([0.0, 1.0, -1.0, float("nan"), float("inf"), -float("inf"), 1e30, -1e-30,
                             r.uniform(-3, 3)])
        if f.type == T.TYPE_BOOL:
            return r.random() < 0.5
        if f.type == T.TYPE_STRING:
            return r.choice(self.strings)
        if f.type == T.TYPE_BYTES:
            return bytes(r.getrandbits(8) for _ in range(r.choice([0, 1, 16, 100, 4096])))
        if f.type == T.TYPE_ENUM:
            return r.choice([v.number for v in f.enum_type.values] + [999, -1])
        raise ValueError("field type %d" % f.type)

    def set_field(self, msg, f, depth):
        r = self.rng
        try:
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                entry = f.message_type.fields_by_name
                getattr(msg, f.name)[self.scalar(entry["key"])] = self.scalar(entry["value"])
            elif f.label == f.LABEL_REPEATED:
                rep = getattr(msg, f.name)
                for _ in range(r.choice([0, 1, 2, 3, 8, 50, 2000 if depth == 0 else 4])):
                    if f.message_type is not None:
                        if depth < 4:
                            self.fill(rep.add(), depth + 1)
                    else:
                        rep.append(self.scalar(f))
            elif f.message_type is not None:
                if depth < 4:
                    self.fill(getattr(msg, f.name), depth + 1)
            else:
                setattr(msg, f.name, self.scalar(f))
        except (ValueError, TypeError, OverflowError):
            pass  # a value the field's type cannot hold; the Python library refuses it

    def fill(self, msg, depth=0):
        for f in msg.DESCRIPTOR.fields:
            if self.rng.random() < 0.6:
                self.set_field(msg, f, depth)
        return msg

    def mutate(self, msg):
        """Sets one to three fields anywhere in `msg` (nested ones too)."""
        for _ in range(self.rng.randint(1, 3)):
            m = msg
            while True:
                f = self.rng.choice(m.DESCRIPTOR.fields)
                nested = f.message_type is not None and f.label != f.LABEL_REPEATED
                if nested and self.rng.random() < 0.6:
                    m = getattr(m, f.name)
                    continue
                self.set_field(m, f, 3)
                break
        return msg


class FuzzTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        print("seed %d (replay: STRATA_TEST_SEED=%d)" % (SEED, SEED), flush=True)
        cls.tmp = tempfile.TemporaryDirectory()
        work = cls.tmp.name
        generate_stubs(SOURCE, work, ["strata/v1/generation.proto", "strata/v1/worker.proto",
                                      "strata/v1/kvstore.proto"])
        sys.path.insert(0, work)
        global grpc, g, gg, symbol_database, FieldDescriptor, worker_pb2, worker_pb2_grpc, kvstore_pb2
        import grpc
        from google.protobuf import symbol_database
        from google.protobuf.descriptor import FieldDescriptor
        from strata.v1 import generation_pb2 as g, generation_pb2_grpc as gg, worker_pb2, worker_pb2_grpc, kvstore_pb2
        cls.modules = {"strata.v1.Generation": g, "strata.v1.Coordinator": worker_pb2,
                       "strata.v1.Worker": worker_pb2, "strata.v1.KVStore": kvstore_pb2}
        cls.logs = {}
        cls.procs = {}

        def spawn(name, args):
            cls.logs[name] = os.path.join(work, name + ".log")
            with open(cls.logs[name], "w") as log:
                cls.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

        os.mkdir(os.path.join(work, "kv"))
        port_file = os.path.join(work, "kv.port")
        spawn("kvstore", [os.path.join(BIN, "kvstore", "strata-kvstore"), "--dir=" + os.path.join(work, "kv"),
                          "--listen=127.0.0.1:0", "--port-file=" + port_file, "--insecure-cluster"])
        def port():
            if not os.path.exists(port_file):
                return None
            with open(port_file) as f:
                return f.read().strip()
        cls.kv_address = "127.0.0.1:" + wait_for("strata-kvstore's port", port, 20)

        def announced(prefix):
            def find():
                with open(cls.logs["coordinator"]) as log:
                    for line in log:
                        if line.startswith(prefix):
                            return line.split()[1]
                return None
            return find

        spawn("coordinator", [os.path.join(BIN, "coordinator", "strata-coordinator"), "--model", MODEL,
                              "--listen", "127.0.0.1:0", "--internal-listen", "127.0.0.1:0", "--workers", "2",
                              "--kvstore", cls.kv_address, "--insecure-cluster", "--insecure-public",
                              "--allow-unauthenticated"])
        cls.address = wait_for("strata-coordinator's address", announced("listening "), 20)
        cls.internal_address = wait_for("strata-coordinator's internal address", announced("internal "), 20)
        for i in range(2):
            spawn("w%d" % i, [os.path.join(BIN, "worker", "strata-worker"), "--coordinator", cls.internal_address,
                              "--name", "w%d" % i, "--threads", "1", "--model-root", MODEL, "--insecure-cluster"])
        cls.channel = grpc.insecure_channel(cls.address)
        cls.stub = gg.GenerationStub(cls.channel)
        cls.worker_addresses = cls.wait_ready()

    @classmethod
    def wait_ready(cls, timeout_s=60):
        def stages():
            try:
                st = cls.stub.Stats(g.StatsRequest(), timeout=2)
                return [s.address for s in st.stages] if st.ready and len(st.stages) == 2 else None
            except grpc.RpcError:
                return None
        return wait_for("the cluster's readiness", stages, timeout_s)

    @classmethod
    def tearDownClass(cls):
        for p in cls.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in cls.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        cls.tmp.cleanup()

    def dead(self):
        out = []
        for name, p in self.procs.items():
            if p.poll() is not None:
                with open(self.logs[name]) as log:
                    out.append("%s (exit %d; log:\n%s)" % (name, p.returncode, log.read()[-2000:]))
        return out

    def log_tails(self):
        out = []
        for name, path in self.logs.items():
            with open(path, errors="replace") as log:
                out.append("--- %s (last lines)\n%s" % (name, "".join(log.readlines()[-15:])))
        return "\n".join(out)

    def greedy(self):
        req = g.GenerateRequest(tokens=g.TokenIds(ids=[5, 17, 3, 42, 9, 11]), sampling=g.SamplingParams(temperature=0),
                                stopping=g.StoppingParams(max_tokens=8, ignore_eos=True))
        tokens = []
        for resp in self.stub.Generate(req, timeout=30):
            if resp.HasField("chunk"):
                tokens += [t.id for t in resp.chunk.tokens]
        return tokens

    def stage_messages(self, rng, stage, epoch):
        """A StageBatch for `stage` (and its hidden rows), then broken a little."""
        w = worker_pb2
        b = w.StageBatch(epoch=epoch, batch_id=rng.randrange(1, 1 << 40))
        rows = 0
        for _ in range(rng.choice([1, 2, 3])):
            tokens = [rng.randrange(VOCAB) for _ in range(rng.choice([1, 1, 3, 8]))]
            # Sequence ids far above the coordinator's (see own_sequences).
            c = b.chunks.add(seq_id=rng.choice([1 << 40, (1 << 40) + 1, (1 << 40) + rng.randint(2, 50)]),
                             start=rng.choice([0, 0, 0, 1, 5]), tokens=tokens, sample=rng.random() < 0.7,
                             prompt=rng.random() < 0.5)
            if rng.random() < 0.7:
                c.sampling.CopyFrom(w.StageSampling(temperature=rng.choice([0, 0.7]), top_p=1,
                                                    logprobs=rng.choice([-1, 0, 2])))
            if rng.random() < 0.2:
                # Not a session of round 2: nothing frees these sequences, so
                # their append streams stay open (and Truncate or Delete of the
                # session wait for them), as for any sequence a stage keeps.
                c.session_id = rng.choice(["fz1", "fz2"])
                c.persist = rng.random() < 0.5
            rows += len(tokens)
        b.total_rows = rows
        b.hidden_size = 0 if stage == 0 else HIDDEN
        for _ in range(rng.randint(0, 3)):
            what = rng.choice(["epoch", "rows", "hidden", "start", "token", "seq", "free", "sampling", "twice"])
            if what == "epoch":
                b.epoch = rng.choice([0, -1, min(epoch + 1, (1 << 63) - 1), 1 << 62])
            elif what == "rows":
                b.total_rows = rng.choice([0, -1, rows + 1, rows - 1, 1 << 30])
            elif what == "hidden":
                b.hidden_size = rng.choice([0, -1, HIDDEN + 1, HIDDEN, 1 << 30])
            elif what == "start":
                b.chunks[0].start = rng.choice([-1, 1 << 30, 4095, 4096])
            elif what == "token":
                b.chunks[0].tokens.append(rng.choice([-1, VOCAB, 1 << 30]))
            elif what == "seq":
                b.chunks[0].seq_id = rng.choice([1 << 41, (1 << 64) - 1])
            elif what == "free":
                b.free_seq_ids.extend((1 << 40) + rng.randint(0, 100) for _ in range(3))
            elif what == "sampling":
                b.chunks[0].sampling.CopyFrom(w.StageSampling(temperature=float("nan"), top_k=-5, logprobs=1000,
                                                              top_p=rng.choice([0, 2, float("inf")])))
            else:
                b.chunks.add().CopyFrom(b.chunks[0])
        messages = [w.StageMessage(batch=b)]
        if b.hidden_size == HIDDEN and 0 < b.total_rows < 1000:
            values = [rng.choice([0.0, 1.0, float("nan"), 1e30, rng.uniform(-1, 1)])
                      for _ in range(b.total_rows * HIDDEN)]
            data = struct.pack("<%df" % len(values), *values)
            if rng.random() < 0.2:
                data = data[:rng.randrange(len(data) + 1)]
            messages.append(w.StageMessage(hidden=w.TensorChunk(
                batch_id=b.batch_id if rng.random() < 0.9 else 7, row_offset=rng.choice([0, 0, 0, 1, -1]),
                data=data)))
        return messages

    def test_random_requests_get_answers_and_the_servers_keep_serving(self):
        rng = random.Random(SEED)
        before = self.greedy()
        self.assertEqual(len(before), 8)
        # "r1": a session id of this round only (round 2 uses s1..s3).
        strings = ["", "a", "r1", "w0", "The list type", "<|im_start|>\n", "\ufffd\ud7ff", "x" * 5000,
                   "../../etc/passwd", "/", "\x00", "\u00e9\u4e2d", MODEL, self.address,
                   self.kv_address] + self.worker_addresses
        values = Values(rng, strings)

        def own_sequences(msg):
            # The Worker and KVStore RPCs are internal and trust their caller:
            # a stage batch, load or free naming one of the coordinator's
            # sequences would change a conversation under it, a sequence made
            # here (which nothing frees) would hold a session's layers in the
            # store for good, and a store call could truncate or delete what
            # the coordinator serves. Faults of the caller, not robustness
            # questions: these calls get sequence ids at or above 2^40 (the
            # coordinator never reaches them) and session ids starting "fz-".
            if isinstance(msg, worker_pb2.StageMessage) and msg.HasField("batch"):
                for c in msg.batch.chunks:
                    c.seq_id |= 1 << 40
                    if c.session_id:
                        c.session_id = "fz-" + c.session_id
                msg.batch.free_seq_ids[:] = [x | 1 << 40 for x in msg.batch.free_seq_ids]
            elif isinstance(msg, worker_pb2.FreeSequencesRequest):
                msg.seq_ids[:] = [x | 1 << 40 for x in msg.seq_ids]
            elif isinstance(msg, worker_pb2.LoadSessionRequest):
                msg.seq_id |= 1 << 40
                if msg.session_id:
                    msg.session_id = "fz-" + msg.session_id
            elif msg.DESCRIPTOR.file.name == "strata/v1/kvstore.proto":
                target = msg.open if isinstance(msg, kvstore_pb2.AppendRequest) else msg
                if "session_id" in target.DESCRIPTOR.fields_by_name and target.session_id:
                    target.session_id = "fz-" + target.session_id

        def bounded(req):
            # A valid request without max_tokens generates until the context
            # (4096 tokens) is full: seconds of work on the CPU, not a hang.
            # Such lengths become 1..64; invalid ones (<= 0, beyond the
            # context) stay, to be refused.
            stopping = req.stopping
            if not stopping.HasField("max_tokens") or 64 < stopping.max_tokens <= 4096:
                stopping.max_tokens = rng.randint(1, 64)
        bad = []
        codes = {}  # (method, status code) -> calls, printed at the end
        lock = threading.Lock()

        def count(method, code):
            with lock:
                codes[(method, code)] = codes.get((method, code), 0) + 1

        # Round 1: every method of every service.
        # The public port never answers the cluster's internal services.
        public = grpc.insecure_channel(self.address)
        for service in ("strata.v1.Coordinator", "strata.v1.Worker", "strata.v1.KVStore"):
            descriptor = self.modules[service].DESCRIPTOR.services_by_name[service.split(".")[-1]]
            for method in descriptor.methods:
                path = "/%s/%s" % (service, method.name)
                try:
                    if method.client_streaming:
                        call = (public.stream_stream if method.server_streaming else public.stream_unary)(
                            path, lambda b: b, lambda b: b)
                        result = call(iter([b""]), timeout=CALL_S)
                    else:
                        call = (public.unary_stream if method.server_streaming else public.unary_unary)(
                            path, lambda b: b, lambda b: b)
                        result = call(b"", timeout=CALL_S)
                    if method.server_streaming:
                        list(result)
                    self.fail("%s answered on the public port" % path)
                except grpc.RpcError as e:
                    self.assertEqual(e.code(), grpc.StatusCode.UNIMPLEMENTED, "%s on the public port" % path)
        public.close()

        targets = [(self.address, "strata.v1.Generation"), (self.internal_address, "strata.v1.Coordinator"),
                   (self.kv_address, "strata.v1.KVStore")] + [(a, "strata.v1.Worker") for a in self.worker_addresses]
        channels = {a: grpc.insecure_channel(a, options=[("grpc.max_send_message_length", 64 << 20)])
                    for a, _ in targets}
        ident = (lambda b: b)
        for i in range(3000):
            address, service = rng.choice(targets)
            descriptor = self.modules[service].DESCRIPTOR.services_by_name[service.split(".")[-1]]
            method = rng.choice(descriptor.methods)
            request_class = symbol_database.Default().GetSymbol(method.input_type.full_name)

            sent = []  # the messages of this call, for the failure report

            def payload():
                if rng.random() < 1 / 6:
                    sent.append("(bytes that are not a message)")
                    return bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 5, 50, 500])))
                msg = values.fill(request_class())
                if isinstance(msg, g.GenerateRequest):
                    bounded(msg)
                own_sequences(msg)
                sent.append(str(msg)[:300])
                return msg.SerializeToString()

            path = "/%s/%s" % (service, method.name)
            ch = channels[address]
            try:
                if method.client_streaming and method.server_streaming:
                    list(ch.stream_stream(path, ident, ident)(iter([payload() for _ in range(rng.randint(1, 4))]),
                                                               timeout=CALL_S))
                elif method.server_streaming:
                    list(ch.unary_stream(path, ident, ident)(payload(), timeout=CALL_S))
                elif method.client_streaming:
                    ch.stream_unary(path, ident, ident)(iter([payload()]), timeout=CALL_S)
                else:
                    ch.unary_unary(path, ident, ident)(payload(), timeout=CALL_S)
                count(path, "OK")
            except grpc.RpcError as e:
                count(path, e.code().name)
                if e.code().name in BAD_CODES:
                    bad.append("%s: %s %s\n  sent: %s" % (path, e.code().name, e.details(), sent))
            died = self.dead()
            self.assertEqual(died, [], "after call %d (%s)" % (i, path))
        for ch in channels.values():
            ch.close()

        # Round 1b: stage batches as the coordinator sends them (the current
        # epoch, token ids in the vocabulary, hidden rows of the right size),
        # with zero to three fields broken, on both workers' Execute streams.
        for i in range(400):
            stage = rng.randrange(len(self.worker_addresses))
            address = self.worker_addresses[stage]
            channel = grpc.insecure_channel(address)
            worker = worker_pb2_grpc.WorkerStub(channel)
            try:
                epoch = worker.Stats(worker_pb2.WorkerStatsRequest(), timeout=CALL_S).epoch
                results = list(worker.Execute(iter(self.stage_messages(rng, stage, epoch)), timeout=CALL_S))
                count("Execute (stage batches)", "OK" if all(r.code == 0 for r in results) else
                      "OK, a result with code %d" % max(r.code for r in results))
            except grpc.RpcError as e:
                count("Execute (stage batches)", e.code().name)
                if e.code().name in BAD_CODES:
                    bad.append("Execute on stage %d: %s %s" % (stage, e.code().name, e.details()))
            channel.close()
            self.assertEqual(self.dead(), [], "after stage batch %d" % i)

        # Round 2: valid Generate requests with mutated fields, sixteen at a time.
        def one():
            with lock:  # the generator is shared
                req = g.GenerateRequest(tokens=g.TokenIds(ids=[rng.randint(0, 60) for _ in range(rng.randint(1, 12))]),
                                        sampling=g.SamplingParams(temperature=rng.choice([0, 0.7])),
                                        stopping=g.StoppingParams(max_tokens=rng.randint(1, 8)))
                if rng.random() < 0.6:
                    req.session_id = rng.choice(["s1", "s2", "s3"])
                values.mutate(req)
                bounded(req)
                session = rng.choice(["s1", "s2", "s3", "s3", "", "x" * 300]) if rng.random() < 0.4 else None
            calls = [("Generate", lambda: list(self.stub.Generate(req, timeout=30)))]
            if session is not None:
                calls += [("SaveSession", lambda: self.stub.SaveSession(g.SaveSessionRequest(session_id=session),
                                                                        timeout=SESSION_CALL_S)),
                          ("ResumeSession", lambda: self.stub.ResumeSession(
                              g.ResumeSessionRequest(session_id=session), timeout=SESSION_CALL_S)),
                          ("DeleteSession", lambda: self.stub.DeleteSession(
                              g.DeleteSessionRequest(session_id=session), timeout=SESSION_CALL_S))]
            for name, call in calls:
                try:
                    call()
                    count(name, "OK")
                except grpc.RpcError as e:
                    count(name, e.code().name)
                    if e.code().name in BAD_CODES:
                        with lock:
                            bad.append("%s: %s %s\n  request: %s" % (name, e.code().name, e.details(),
                                                                     str(req)[:500]))

        for _ in range(40):
            threads = [threading.Thread(target=one) for _ in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(self.dead(), [])

        for (method, code), n in sorted(codes.items()):
            print("%5d %-20s %s" % (n, code, method))
        self.assertEqual(bad, [], "seed %d\n%s" % (SEED, self.log_tails()))
        # Round 3: the cluster still serves, and gives the same tokens (a
        # Register in round 1 may have taken a real worker's address: its next
        # heartbeat registers it again).
        self.wait_ready()
        self.assertEqual(self.greedy(), before, "seed %d" % SEED)
        self.assertEqual(self.dead(), [])


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
