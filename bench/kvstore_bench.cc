// KV store benchmark: append and load throughput of .coli_kv v2 sessions with
// GLM-5.2 dimensions (78 layers, kv_lora 512, rope 64, 21 indexer layers of
// 128: 56 308-byte records), next to the raw sequential write and read speed
// of the same disk measured in the same run; the cost of one commit (two
// fdatasyncs) next to one raw fdatasync; and group commit: how many tokens
// per second single-token writes reach when commits are batched, compared
// with one commit per token; and the same through the gRPC service with 1 and
// 4 sessions, tokens coalesced per message as a worker's appender sends them,
// next to the library's group commit at the same session count.
//
//   kvstore_bench [--dir=DIR] [--tokens=N] [--seconds=S]
//
// DIR (default ./kvstore_bench.tmp) is created and removed afterwards; put
// it on the disk to measure. Reads after dropping the file from the page
// cache (posix_fadvise DONTNEED) approximate cold reads.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "kvstore/coli_kv.h"
#include "kvstore/coli_kv_file.h"
#include "kvstore/env.h"
#include "kvstore/server/server.h"
#include "kvstore/session.h"
#include "kvstore/store.h"
#include "strata/v1/kvstore.grpc.pb.h"

namespace strata::kv {
namespace {

using Clock = std::chrono::steady_clock;

// The worker appender's message limit (KvStoreClientOptions::max_message_bytes)
// and how much a producer may queue ahead of the stream.
constexpr size_t kMessageBytes = size_t{1} << 20;
constexpr size_t kMaxQueuedBytes = size_t{64} << 20;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Args {
  std::string dir = "kvstore_bench.tmp";
  int64_t tokens = 4096;
  double seconds = 3.0;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string p = std::string("--") + name + "=";
      return s.rfind(p, 0) == 0 ? argv[i] + p.size() : nullptr;
    };
    if (const char* v = value("dir")) a.dir = v;
    else if (const char* v = value("tokens")) a.tokens = std::atoll(v);
    else if (const char* v = value("seconds")) a.seconds = std::atof(v);
    else {
      std::fprintf(stderr, "usage: kvstore_bench [--dir=DIR] [--tokens=N] [--seconds=S]\n");
      std::exit(2);
    }
  }
  return a;
}

void DropCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void Row(const char* what, double items_per_s, const char* unit, double mb_per_s, double ref) {
  if (ref > 0) {
    std::printf("%-46s %12.0f %-10s %9.1f MB/s  %5.2f× raw\n", what, items_per_s, unit, mb_per_s,
                mb_per_s / ref);
  } else if (mb_per_s > 0) {
    std::printf("%-46s %12.0f %-10s %9.1f MB/s\n", what, items_per_s, unit, mb_per_s);
  } else {
    std::printf("%-46s %12.1f %-10s\n", what, items_per_s, unit);
  }
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "kvstore_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

// Random records of `dims`, built once.
std::string MakeRecords(const Dims& d, int64_t n) {
  std::mt19937_64 rng(1);
  RecordBuilder b(d);
  std::normal_distribution<float> nd;
  std::vector<float> c(static_cast<size_t>(d.kv_lora)), r(static_cast<size_t>(d.qk_rope)),
      k(static_cast<size_t>(d.index_hd));
  std::string out;
  out.reserve(static_cast<size_t>(n * b.layout().record_bytes()));
  for (int64_t p = 0; p < n; ++p) {
    b.SetToken(static_cast<int32_t>(rng() % static_cast<uint64_t>(d.vocab)));
    for (int l = 0; l < d.n_layers; ++l) {
      for (float& x : c) x = nd(rng);
      for (float& x : r) x = nd(rng);
      b.SetLayer(l, c.data(), r.data());
    }
    for (int s = 0; s < d.nic; ++s) {
      for (float& x : k) x = nd(rng);
      b.SetIndexerKeys(s, k.data());
    }
    out.append(b.bytes());
  }
  return out;
}

int Main(int argc, char** argv) {
  const Args args = Parse(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Env* env = Env::Default();
  Check(env->CreateDir(args.dir));
  const Dims glm{78, 512, 64, 128, 21, 154880};
  std::vector<int32_t> indexer_layers;
  for (int l = 0; l < glm.n_layers && static_cast<int>(indexer_layers.size()) < glm.nic; l += 3) {
    indexer_layers.push_back(l);
  }
  const RecordLayout layout(Version::kV2, glm);
  const int64_t rb = layout.record_bytes();
  const int64_t n = args.tokens;
  const std::string records = MakeRecords(glm, n);
  const double mb = static_cast<double>(records.size()) / 1e6;
  std::printf("GLM-5.2 dims: %lld-byte records, %lld tokens = %.1f MB per pass, dir %s\n\n",
              static_cast<long long>(rb), static_cast<long long>(n), mb, args.dir.c_str());

  // 1. Raw sequential write and read of the same bytes.
  const std::string raw = JoinPath(args.dir, "raw.bin");
  double raw_write, raw_read;
  {
    auto f = *env->Open(raw, OpenMode::kCreateTruncate);
    const auto t = Clock::now();
    const size_t block = size_t{1} << 20;
    for (size_t off = 0; off < records.size(); off += block) {
      Check(f->Write(off, std::string_view(records).substr(off, block)));
    }
    Check(f->Sync());
    raw_write = mb / Since(t);
  }
  DropCache(raw);
  {
    auto f = *env->Open(raw, OpenMode::kRead);
    std::string buf(size_t{1} << 20, '\0');
    const auto t = Clock::now();
    for (uint64_t off = 0; off < records.size(); off += buf.size()) {
      (void)*f->Read(off, buf.size(), buf.data());
    }
    raw_read = mb / Since(t);
  }
  Row("raw sequential write + fdatasync", raw_write * 1e6 / static_cast<double>(rb), "rec/s", raw_write, 0);
  Row("raw sequential read (cache dropped)", raw_read * 1e6 / static_cast<double>(rb), "rec/s", raw_read, 0);

  // 2. Append in prefill batches of 64 records (one commit each).
  const std::string path = JoinPath(args.dir, "prefill.coli_kv");
  {
    auto w = *ColiKvWriter::Create(env, path, Version::kV2, glm);
    const auto t = Clock::now();
    for (int64_t p = 0; p < n; p += 64) {
      const int64_t k = std::min<int64_t>(64, n - p);
      Check(w->Append(std::string_view(records).substr(p * rb, k * rb)));
    }
    const double s = Since(t);
    Row("append, 64 records per commit", static_cast<double>(n) / s, "rec/s", mb / s, raw_write);
  }

  // 3. Load: whole records, sanitised, after dropping the cache; and one
  //    stage's slice (layers 0..38) through a Session.
  DropCache(path);
  {
    auto r = *ColiKvReader::Open(env, path);
    std::string buf;
    const auto t = Clock::now();
    for (int64_t p = 0; p < n; p += 64) {
      Check(r->ReadRecords(p, std::min<int64_t>(64, n - p), RecordFormat::kV2Sanitized, &buf));
    }
    const double s = Since(t);
    Row("load, sanitised records (cache dropped)", static_cast<double>(n) / s, "rec/s", mb / s, raw_read);
  }

  // 4. Commit cost: one record per commit (decode without batching) next to
  //    a raw 4 KiB write + fdatasync.
  {
    const int k = 100;
    auto f = *env->Open(JoinPath(args.dir, "sync.bin"), OpenMode::kCreateTruncate);
    const std::string page(4096, 'x');
    auto t = Clock::now();
    for (int i = 0; i < k; ++i) {
      Check(f->Write(static_cast<uint64_t>(i) * 4096, page));
      Check(f->Sync());
    }
    const double raw_sync_us = Since(t) / k * 1e6;
    auto w = *ColiKvWriter::Create(env, JoinPath(args.dir, "decode.coli_kv"), Version::kV2, glm);
    t = Clock::now();
    for (int i = 0; i < k; ++i) Check(w->Append(std::string_view(records).substr((i % n) * rb, rb)));
    const double commit_us = Since(t) / k * 1e6;
    Row("raw 4 KiB write + fdatasync (µs)", raw_sync_us, "µs", 0, 0);
    Row("commit of one record: write, 2× fdatasync (µs)", commit_us, "µs", 0, 0);
    Row("  → unbatched decode ceiling", 1e6 / commit_us, "tokens/s", 0, 0);
  }

  // 5. Group commit through the store: writers append single tokens as fast
  //    as they can while the commit threads batch whatever has arrived.
  std::map<int, double> group_commit_tps;
  for (int sessions : {1, 4}) {
    StoreOptions so;
    so.dir = JoinPath(args.dir, absl::StrCat("store", sessions));
    so.commit_threads = 4;
    auto store = *Store::Open(env, so);
    struct Counter : CommitListener {
      void OnCommitted(int64_t nrec) override { commits.fetch_add(1); }
      void OnFailed(const absl::Status&) override {}
      std::atomic<int64_t> commits{0};
    };
    std::vector<std::thread> threads;
    std::atomic<int64_t> tokens{0};
    auto counter = std::make_shared<Counter>();
    const auto t = Clock::now();
    for (int s = 0; s < sessions; ++s) {
      SessionSpec spec;
      spec.dims = glm;
      spec.indexer_layers = indexer_layers;
      auto session = *store->Create(absl::StrCat("s", s), spec);
      threads.emplace_back([&, session] {
        auto w = *session->OpenWriter(0, glm.n_layers, std::nullopt, counter);
        int64_t p = 0;
        while (Since(t) < args.seconds) {
          const std::string_view rec = std::string_view(records).substr((p % n) * rb, rb);
          const int32_t token = LoadI32(rec.data());
          Check(session->Write(w.writer_id, p, std::span<const int32_t>(&token, 1), rec.substr(4)));
          ++p;
        }
        while (!session->WriterDurable(w.writer_id)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        session->CloseWriter(w.writer_id);
        tokens += p;
      });
    }
    for (auto& th : threads) th.join();
    const double s = Since(t);
    const double tps = static_cast<double>(tokens.load()) / s;
    Row(absl::StrCat("group commit, ", sessions, " session(s), 1-token writes").c_str(), tps,
        "tokens/s", tps * static_cast<double>(rb) / 1e6, raw_write);
    group_commit_tps[sessions] = tps;
    Row("  commit rounds per second (all sessions)", static_cast<double>(counter->commits.load()) / s,
        "commits/s", 0, 0);
  }

  // 6. The same through gRPC (loopback, in-process server): one Append
  //    stream per session with one token per message, as a decoding worker
  //    sends them, acknowledged (Committed) by the store; then a Load.
  ServerOptions o;
  o.store.dir = JoinPath(args.dir, "grpc");
  auto server = *KvStoreServer::Start(env, o);
  auto stub = strata::v1::KVStore::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", server->port()), grpc::InsecureChannelCredentials()));
  for (int sessions : {1, 4}) {
    for (int s = 0; s < sessions; ++s) {
      grpc::ClientContext ctx;
      strata::v1::CreateSessionRequest req;
      req.set_session_id(absl::StrCat("g", sessions, "_", s));
      auto* d = req.mutable_dims();
      d->set_n_layers(glm.n_layers);
      d->set_kv_lora(glm.kv_lora);
      d->set_qk_rope(glm.qk_rope);
      d->set_index_hd(glm.index_hd);
      d->set_nic(glm.nic);
      d->set_vocab(glm.vocab);
      for (int32_t l : indexer_layers) req.add_indexer_layers(l);
      strata::v1::SessionInfo info;
      if (!stub->CreateSession(&ctx, req, &info).ok()) return 1;
    }
    std::atomic<int64_t> acked{0}, messages{0};
    std::vector<std::thread> threads;
    const auto t = Clock::now();
    for (int s = 0; s < sessions; ++s) {
      threads.emplace_back([&, s] {
        grpc::ClientContext ctx;
        auto rw = stub->Append(&ctx);
        strata::v1::AppendRequest open;
        open.mutable_open()->set_session_id(absl::StrCat("g", sessions, "_", s));
        open.mutable_open()->set_layer_begin(0);
        open.mutable_open()->set_layer_end(glm.n_layers);
        rw->Write(open);
        strata::v1::AppendResponse resp;
        rw->Read(&resp);
        int64_t last = 0;
        std::thread reader([&] {
          strata::v1::AppendResponse r;
          while (rw->Read(&r)) {
            if (r.has_committed()) last = r.committed().nrec();
          }
        });
        // The producer hands over single tokens as fast as it can; the
        // sender ships whatever has accumulated while its previous message
        // was in flight, up to the worker's message limit — how a worker's
        // appender (worker/kv_persist.h) sends.
        std::mutex mu;
        std::condition_variable cv;
        std::deque<std::pair<int32_t, std::string_view>> queued;  // token, its rows
        bool done = false;
        std::thread producer([&] {
          for (int64_t p = 0; Since(t) < args.seconds; ++p) {
            const std::string_view rec = std::string_view(records).substr((p % n) * rb, rb);
            std::unique_lock<std::mutex> l(mu);
            cv.wait(l, [&] { return queued.size() * static_cast<size_t>(rb) < kMaxQueuedBytes; });
            queued.emplace_back(LoadI32(rec.data()), rec.substr(4));
            cv.notify_all();
          }
          std::lock_guard<std::mutex> l(mu);
          done = true;
          cv.notify_all();
        });
        strata::v1::AppendRequest req;
        std::vector<int32_t> tokens;
        std::string rows;
        for (int64_t p = 0;;) {
          {
            std::unique_lock<std::mutex> l(mu);
            cv.wait(l, [&] { return done || !queued.empty(); });
            if (queued.empty()) break;
            tokens.clear();
            rows.clear();
            while (!queued.empty() && (tokens.empty() || rows.size() + queued.front().second.size() <= kMessageBytes)) {
              tokens.push_back(queued.front().first);
              rows.append(queued.front().second);
              queued.pop_front();
            }
            cv.notify_all();
          }
          req.mutable_rows()->set_position(p);
          req.mutable_rows()->mutable_token_ids()->Assign(tokens.begin(), tokens.end());
          req.mutable_rows()->set_rows(rows);
          if (!rw->Write(req)) break;
          p += static_cast<int64_t>(tokens.size());
          messages += 1;
        }
        producer.join();
        rw->WritesDone();
        reader.join();
        const grpc::Status st = rw->Finish();
        if (!st.ok()) std::fprintf(stderr, "append stream: %s\n", st.error_message().c_str());
        acked += last;
      });
    }
    for (auto& th : threads) th.join();
    const double sec = Since(t);
    const double tps = static_cast<double>(acked.load()) / sec;
    Row(absl::StrCat("gRPC Append, ", sessions, " stream(s), acknowledged").c_str(), tps, "tokens/s",
        tps * static_cast<double>(rb) / 1e6, raw_write);
    std::printf("%-46s %12.1f tokens\n", "  tokens per message (coalesced)",
                static_cast<double>(acked.load()) / static_cast<double>(std::max<int64_t>(1, messages.load())));
    std::printf("%-46s %12.2f ×\n", "  vs group commit, same sessions", tps / group_commit_tps[sessions]);
  }
  {
    DropCache(JoinPath(o.store.dir, "g1_0.coli_kv"));
    grpc::ClientContext lctx;
    strata::v1::LoadRequest lr;
    lr.set_session_id("g1_0");
    auto loader = stub->Load(&lctx, lr);
    strata::v1::LoadChunk chunk;
    int64_t got = 0, bytes = 0;
    const auto tl = Clock::now();
    while (loader->Read(&chunk)) {
      got += chunk.token_ids_size();
      bytes += static_cast<int64_t>(chunk.rows().size());
    }
    (void)loader->Finish();
    const double sl = Since(tl);
    Row("gRPC Load, all layers (cache dropped)", static_cast<double>(got) / sl, "rec/s",
        static_cast<double>(bytes) / 1e6 / sl, raw_read);
  }

  // Clean up.
  auto remove_all = [&](const std::string& d) {
    const absl::StatusOr<std::vector<std::string>> names = env->ListDir(d);
    if (names.ok()) {
      for (const std::string& name : *names) (void)env->Delete(JoinPath(d, name));
    }
    ::rmdir(d.c_str());
  };
  for (const char* sub : {"store1", "store4", "grpc"}) remove_all(JoinPath(args.dir, sub));
  remove_all(args.dir);
  return 0;
}

}  // namespace
}  // namespace strata::kv

int main(int argc, char** argv) { return strata::kv::Main(argc, argv); }
