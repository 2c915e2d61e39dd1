// Process crashes: a real strata-kvstore is killed with SIGKILL at random
// moments while two writers stream the two layer halves of one session (and,
// now and then, after a truncate), at least 200 times. After each kill the
// session's files are opened with every check (manifest, checksums,
// fingerprint) and compared with what the clients saw acknowledged:
//   - no acknowledged token is lost or altered (nrec >= the largest
//     Committed.nrec a writer received, and every committed record equals
//     what the writers sent);
//   - nrec never shrinks except by a truncate (an acknowledged one, or the
//     one in flight when the server died);
//   - nothing is committed that both writers had not sent.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "common/testing/test_seed.h"
#include "gtest/gtest.h"
#include "kvstore/session_file.h"
#include "kvstore/test_util.h"
#include "strata/v1/kvstore.grpc.pb.h"

extern char** environ;

namespace strata::kv {
namespace {

namespace pb = strata::v1;
using Clock = std::chrono::steady_clock;

constexpr int kKills = 200;
constexpr uint64_t kFingerprint = 0x5eed5eed5eed5eedull;
constexpr int64_t kTruncateAbove = 6000;  // keeps each check quick

// A running strata-kvstore; killed with SIGKILL when destroyed.
class ServerProcess {
 public:
  ServerProcess(const std::string& dir, const std::string& port_file) {
    ::unlink(port_file.c_str());
    std::vector<std::string> args = {STRATA_KVSTORE_BINARY, "--dir=" + dir,
                                     "--listen=127.0.0.1:0", "--port-file=" + port_file,
                                     "--commit-threads=2", "--insecure-cluster"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);  // quiet
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (pid_ > 0 && Clock::now() < deadline) {
      std::ifstream in(port_file);
      if (in >> port_ && port_ > 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  ~ServerProcess() { Kill(); }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

class CrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/kv_crash_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/kv";
    dims_ = {4, 24, 8, 0, 0, 50000};
  }

  // The record every writer sends for position p, fixed per position.
  std::string Record(int64_t p) {
    std::mt19937_64 rng(static_cast<uint64_t>(p) * 0x9E3779B97F4A7C15ull + 1);
    return testing::SpecV2Record(dims_, testing::RandomV2Rows(rng, dims_));
  }
  std::string Slice(const std::string& rec, int b, int e) const {
    const int64_t lb = dims_.kv_lora + dims_.qk_rope + 8;
    return rec.substr(static_cast<size_t>(4 + b * lb), static_cast<size_t>((e - b) * lb));
  }

  std::string root_, dir_;
  Dims dims_;
};

// One writer stream: sends its layer half in random batches until the
// server goes away; records the largest Committed.nrec it received.
struct Writer {
  int begin, end;
  std::atomic<int64_t> acked{-1};
  std::atomic<int64_t> sent{0};  // positions fully sent (Write returned true)
  bool opened = false;
};

TEST_F(CrashTest, SigkillDuringTwoWriterStreams) {
  std::mt19937_64 rng(strata::testing::TestSeed());
  const auto start = Clock::now();
  int64_t floor = 0;  // nrec may not go below this
  int64_t max_sent_both = 0;
  int kills = 0, truncates = 0;
  int64_t max_nrec = 0;
  bool created = false;
  for (int iter = 0; iter < kKills; ++iter) {
    ServerProcess server(dir_, root_ + "/port");
    ASSERT_GT(server.port(), 0) << "the server did not start (iteration " << iter << ")";
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server.port()),
                                       grpc::InsecureChannelCredentials());
    auto stub = pb::KVStore::NewStub(channel);
    if (!created) {
      grpc::ClientContext ctx;
      pb::CreateSessionRequest req;
      req.set_session_id("s");
      pb::KvDims* d = req.mutable_dims();
      d->set_n_layers(dims_.n_layers);
      d->set_kv_lora(dims_.kv_lora);
      d->set_qk_rope(dims_.qk_rope);
      d->set_vocab(dims_.vocab);
      req.set_fingerprint(kFingerprint);
      pb::SessionInfo info;
      ASSERT_TRUE(stub->CreateSession(&ctx, req, &info).ok());
      created = true;
    }
    // The kill: at a random moment, also during a truncate.
    const auto kill_at = Clock::now() + std::chrono::milliseconds(20 + rng() % 180);
    bool truncate_in_flight = false;
    int64_t truncate_to = 0;
    if (iter % 8 == 7 || floor > kTruncateAbove) {
      truncate_to = floor > 0 ? static_cast<int64_t>(rng() % static_cast<uint64_t>(floor)) : 0;
      truncate_in_flight = true;
      std::thread killer([&] {
        std::this_thread::sleep_until(Clock::now() + std::chrono::microseconds(rng() % 3000));
        if (rng() % 4 == 0) server.Kill();  // sometimes right in the truncate
      });
      grpc::ClientContext ctx;
      pb::TruncateRequest req;
      req.set_session_id("s");
      req.set_nrec(truncate_to);
      pb::TruncateResponse resp;
      const grpc::Status st = stub->Truncate(&ctx, req, &resp);
      killer.join();
      if (st.ok()) {
        truncate_in_flight = false;
        floor = truncate_to;
        ++truncates;
      }
    }
    Writer w[2] = {{0, 2}, {2, dims_.n_layers}};
    std::vector<std::thread> threads;
    for (Writer& wr : w) {
      threads.emplace_back([&, seed = rng()] {
        std::mt19937_64 local(seed);
        grpc::ClientContext ctx;
        auto rw = stub->Append(&ctx);
        pb::AppendRequest open;
        open.mutable_open()->set_session_id("s");
        open.mutable_open()->set_layer_begin(wr.begin);
        open.mutable_open()->set_layer_end(wr.end);
        open.mutable_open()->set_fingerprint(kFingerprint);
        pb::AppendResponse resp;
        if (!rw->Write(open) || !rw->Read(&resp) || !resp.has_opened()) return;
        wr.opened = true;
        int64_t next = resp.opened().next_position();
        wr.sent = next;
        std::thread reader([&] {
          pb::AppendResponse r;
          while (rw->Read(&r)) {
            if (r.has_committed()) wr.acked = std::max<int64_t>(wr.acked, r.committed().nrec());
          }
        });
        while (Clock::now() < kill_at + std::chrono::seconds(1)) {
          const int64_t k = 1 + static_cast<int64_t>(local() % 8);
          pb::AppendRequest req;
          req.mutable_rows()->set_position(next);
          for (int64_t p = next; p < next + k; ++p) {
            const std::string rec = Record(p);
            req.mutable_rows()->add_token_ids(testing::I32(rec, 0));
            req.mutable_rows()->mutable_rows()->append(Slice(rec, wr.begin, wr.end));
          }
          if (!rw->Write(req)) break;
          next += k;
          wr.sent = next;
          if (local() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
        }
        ctx.TryCancel();
        reader.join();
        rw->Finish();
      });
    }
    std::this_thread::sleep_until(kill_at);
    server.Kill();
    ++kills;
    for (std::thread& t : threads) t.join();
    // Only positions both halves sent (and, before the kill, the server saw
    // neither more) can be committed.
    max_sent_both = std::max(max_sent_both, std::min(w[0].sent.load(), w[1].sent.load()));
    const int64_t acked = std::max(w[0].acked.load(), w[1].acked.load());

    // Check the files as the killed server left them.
    CheckOptions check;
    check.expected_fingerprint = kFingerprint;
    auto session = OpenCheckedSession(Env::Default(), dir_ + "/s.coli_kv", check);
    ASSERT_TRUE(session.ok()) << "iteration " << iter << ": " << session.status();
    const int64_t n = session->reader->nrec();
    const int64_t lower = truncate_in_flight ? std::min(floor, truncate_to) : floor;
    ASSERT_GE(n, acked) << "iteration " << iter << ": an acknowledged token was lost";
    ASSERT_GE(n, lower) << "iteration " << iter << ": nrec shrank without a truncate";
    ASSERT_LE(n, std::max(max_sent_both, floor))
        << "iteration " << iter << ": a token not sent by both writers is committed";
    std::string stored;
    ASSERT_TRUE(session->reader->ReadRecords(0, n, RecordFormat::kStored, &stored).ok());
    const int64_t rb = testing::SpecV2RecordBytes(dims_);
    for (int64_t p = 0; p < n; ++p) {
      ASSERT_TRUE(std::string_view(stored).substr(p * rb, rb) == Record(p))
          << "iteration " << iter << ": committed record " << p << " was altered";
    }
    floor = n;
    max_sent_both = n;  // the next server restarts every writer at nrec
    max_nrec = std::max(max_nrec, n);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("crash test: %d kills, %d acknowledged truncates, largest nrec %lld, %.1f s\n", kills,
              truncates, static_cast<long long>(max_nrec), seconds);
  EXPECT_GE(kills, kKills);
  EXPECT_GT(max_nrec, 100) << "the writers hardly wrote anything";
}

}  // namespace
}  // namespace strata::kv
