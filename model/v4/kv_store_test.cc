// DeepSeek-V4 sessions through the KV store service (docs/coli-kv.md, "V4
// sessions in the KV store"), on the transformers fixtures: the layer ranges
// of two pipeline stages send each step's parts over their own Append
// streams (EncodeV4Step), the streams end OK only once everything is
// committed, and the session loads onto one, two or three stages
// (DecodeV4Stage per range); the loaded sequence continues with the logits of
// an uninterrupted run, bit for bit, resumed mid-block. The expected logits
// come from the uninterrupted run of the same engine, never from the store.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvstore/fault_injection_env.h"
#include "kvstore/inspect.h"
#include "kvstore/server/server.h"
#include "kvstore/server/service.h"
#include "model/v4/config.h"
#include "model/v4/engine.h"
#include "model/v4/kv_state.h"
#include "nlohmann/json.hpp"
#include "strata/v1/kvstore.grpc.pb.h"

namespace strata::v4 {
namespace {

namespace fs = std::filesystem;
namespace pb = strata::v1;

constexpr uint64_t kFingerprint = 0x5eed5eed5eed5eedull;

std::vector<std::string> V4FixtureDirs() {
  std::vector<std::string> dirs;
  const fs::path root = fs::path(STRATA_SOURCE_DIR) / "tests" / "data" / "models";
  for (const char* name : {"deepseek_v4", "deepseek_v4_b"}) {
    if (fs::exists(root / name / "reference.json")) dirs.push_back((root / name).string());
  }
  return dirs;
}

std::vector<int> FixtureTokens(const std::string& dir) {
  std::ifstream in(dir + "/reference.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str())["tokens"].get<std::vector<int>>();
}

// One stage's Append stream (a sync client: one step per message).
class StageWriter {
 public:
  StageWriter(pb::KVStore::Stub* stub, const std::string& id, int begin, int end) : begin_(begin), end_(end) {
    stream_ = stub->Append(&ctx_);
    pb::AppendRequest open;
    open.mutable_open()->set_session_id(id);
    open.mutable_open()->set_layer_begin(begin);
    open.mutable_open()->set_layer_end(end);
    open.mutable_open()->set_fingerprint(kFingerprint);
    EXPECT_TRUE(stream_->Write(open));
    pb::AppendResponse r;
    EXPECT_TRUE(stream_->Read(&r));
    opened_ = r.opened();
  }
  const pb::AppendOpened& opened() const { return opened_; }
  void Step(const V4Config& c, const V4Sequence& seq, const kv::V3Layout& L, int64_t t0,
            const std::vector<int>& tokens) {
    pb::AppendRequest req;
    pb::AppendRows* rows = req.mutable_rows();
    rows->set_position(t0);
    for (int64_t p = t0; p < seq.num_tokens(); ++p) rows->add_token_ids(tokens[static_cast<size_t>(p)]);
    ASSERT_TRUE(EncodeV4Step(c, seq, begin_, end_, t0, L, rows->mutable_rows(), rows->mutable_blocks()).ok());
    ASSERT_TRUE(stream_->Write(req));
  }
  // Half-closes and waits for the end: OK once everything sent is committed.
  grpc::Status Finish(int64_t* last_committed) {
    stream_->WritesDone();
    pb::AppendResponse r;
    while (stream_->Read(&r)) {
      if (r.has_committed()) *last_committed = r.committed().nrec();
    }
    return stream_->Finish();
  }

 private:
  int begin_, end_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::AppendRequest, pb::AppendResponse>> stream_;
  pb::AppendOpened opened_;
};

// Loads layers [begin, end) through the service into `seq`; returns T.
int64_t LoadRange(pb::KVStore::Stub* stub, const std::string& id, const V4Config& c, const kv::V3Layout& L,
                  int begin, int end, V4Sequence* seq, std::vector<int32_t>* live_tokens) {
  grpc::ClientContext ctx;
  pb::LoadRequest req;
  req.set_session_id(id);
  req.set_layer_begin(begin);
  req.set_layer_end(end);
  req.set_fingerprint(kFingerprint);
  req.set_max_chunk_bytes(3000);  // several chunks of each kind
  auto reader = stub->Load(&ctx, req);
  pb::LoadChunk chunk;
  std::string slices, blocks;
  int64_t t = -1;
  int chunks = 0;
  live_tokens->clear();
  while (reader->Read(&chunk)) {
    ++chunks;
    t = chunk.nrec();
    slices += chunk.rows();
    blocks += chunk.blocks();
    live_tokens->insert(live_tokens->end(), chunk.token_ids().begin(), chunk.token_ids().end());
  }
  const grpc::Status s = reader->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_GE(chunks, 1);
  const absl::Status d = DecodeV4Stage(c, L, begin, end, t, slices, blocks, seq);
  EXPECT_TRUE(d.ok()) << d;
  return t;
}

class V4KvStoreTest : public ::testing::TestWithParam<std::string> {};

TEST_P(V4KvStoreTest, TwoStagesSaveAndOneTwoOrThreeResumeExactly) {
  const std::string dir = GetParam();
  auto engine = V4Engine::Load(dir, {});
  ASSERT_TRUE(engine.ok()) << engine.status();
  V4Engine& e = **engine;
  const V4Config& c = e.config();
  const std::vector<int> tokens = FixtureTokens(dir);
  const kv::V3Header header = V4KvHeader(c, kv::V3RowFormat::kF32);
  const kv::V3Layout L(header);
  const int nl = c.num_layers;
  // Steps: a prefill, a chunk, single tokens, a chunk — ending mid-block for
  // both rates (T mod m != 0) after the window has filled.
  std::vector<int> steps = {20, 5, 1, 1, 10};
  int saved = 0;
  for (int n : steps) saved += n;
  if (saved % 4 == 0) steps.push_back(1), ++saved;
  ASSERT_LT(saved + 12, static_cast<int>(tokens.size()));

  // The uninterrupted run: the same steps, then one token at a time.
  auto run = [&](V4Sequence* seq, int from, std::vector<float>* out) {
    for (int t = from; t < saved + 12; ++t) {
      std::vector<float> logits;
      V4Chunk ch{seq, absl::MakeConstSpan(&tokens[static_cast<size_t>(t)], 1)};
      ASSERT_TRUE(e.Forward({&ch, 1}, false, &logits).ok());
      out->insert(out->end(), logits.begin(), logits.end());
    }
  };

  kv::FaultInjectionEnv env;
  kv::ServerOptions o;
  o.store.dir = "/kv";
  o.store.commit_threads = 2;
  auto server = kv::KvStoreServer::Start(&env, o);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()), grpc::InsecureChannelCredentials());
  auto stub = pb::KVStore::NewStub(channel);
  {
    grpc::ClientContext ctx;
    pb::CreateSessionRequest req;
    req.set_session_id("v4");
    kv::ToProto(header, req.mutable_v4());
    req.set_fingerprint(kFingerprint);
    pb::SessionInfo info;
    const grpc::Status s = stub->CreateSession(&ctx, req, &info);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(info.format_version(), 3);
  }

  // Two stages: layers [0, cut) and [cut, L), each step through both.
  const int cut = nl / 2;
  auto seq = e.NewSequence();
  {
    StageWriter a(stub.get(), "v4", 0, cut), b(stub.get(), "v4", cut, nl);
    EXPECT_EQ(a.opened().live_tokens(), L.live_tokens());
    EXPECT_EQ(a.opened().slice_bytes(), L.slice_bytes(0, cut));
    int t0 = 0;
    for (int n : steps) {
      V4Chunk ch{seq.get(), absl::MakeConstSpan(&tokens[static_cast<size_t>(t0)], static_cast<size_t>(n))};
      std::vector<float> logits;
      ASSERT_TRUE(e.Forward({&ch, 1}, false, &logits).ok());
      a.Step(c, *seq, L, t0, tokens);
      b.Step(c, *seq, L, t0, tokens);
      t0 += n;
    }
    int64_t na = -1, nb = -1;
    const grpc::Status sa = a.Finish(&na), sb = b.Finish(&nb);
    ASSERT_TRUE(sa.ok()) << sa.error_message();
    ASSERT_TRUE(sb.ok()) << sb.error_message();
    EXPECT_EQ(na, saved);  // acknowledged only once committed
    EXPECT_EQ(nb, saved);
  }
  {
    grpc::ClientContext ctx;
    pb::StatRequest req;
    req.set_session_id("v4");
    pb::SessionInfo info;
    ASSERT_TRUE(stub->Stat(&ctx, req, &info).ok());
    EXPECT_EQ(info.nrec(), saved);
    EXPECT_EQ(info.format_version(), 3);
    EXPECT_EQ(info.v4().layer_kinds_size(), nl);
  }
  std::vector<float> want;
  run(seq.get(), saved, &want);

  // The file the store wrote verifies, and only against this model.
  kv::InspectOptions io;
  io.expected_fingerprint = kv::ModelIdentity(kFingerprint, std::nullopt);
  EXPECT_TRUE(kv::VerifyFile(&env, "/kv/v4.coli_kv", io).ok()) << kv::VerifyFile(&env, "/kv/v4.coli_kv", io);
  io.expected_fingerprint = kv::ModelIdentity(kFingerprint + 1, std::nullopt);
  EXPECT_EQ(kv::VerifyFile(&env, "/kv/v4.coli_kv", io).code(), absl::StatusCode::kFailedPrecondition);

  // Resume onto 1, 2 and 3 stages (another placement than the one that saved).
  const std::vector<std::vector<int>> placements = {{0, nl}, {0, 1, nl}, {0, std::max(1, nl / 3), nl - 1, nl}};
  for (const auto& cuts : placements) {
    SCOPED_TRACE(::testing::Message() << dir << ": " << cuts.size() - 1 << " stages");
    auto loaded = e.NewSequence();
    std::vector<int32_t> live;
    for (size_t s = 0; s + 1 < cuts.size(); ++s) {
      if (cuts[s] >= cuts[s + 1]) continue;
      EXPECT_EQ(LoadRange(stub.get(), "v4", c, L, cuts[s], cuts[s + 1], loaded.get(), &live), saved);
    }
    loaded->Commit(saved);
    ASSERT_EQ(static_cast<int64_t>(live.size()), saved - L.first_live(saved));
    for (size_t i = 0; i < live.size(); ++i) EXPECT_EQ(live[i], tokens[L.first_live(saved) + i]);
    std::vector<float> got;
    run(loaded.get(), saved, &got);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
        << "the resumed run's logits differ from the uninterrupted run's";
  }

  // A v3 session loads whole and cannot be rewound; another model is refused.
  {
    grpc::ClientContext ctx;
    pb::LoadRequest req;
    req.set_session_id("v4");
    req.set_position_end(saved - 1);
    auto reader = stub->Load(&ctx, req);
    pb::LoadChunk chunk;
    while (reader->Read(&chunk)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext ctx;
    pb::TruncateRequest req;
    req.set_session_id("v4");
    req.set_nrec(saved - 1);
    pb::TruncateResponse resp;
    EXPECT_EQ(stub->Truncate(&ctx, req, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext ctx;
    pb::TruncateRequest req;
    req.set_session_id("v4");
    req.set_nrec(saved);
    pb::TruncateResponse resp;
    EXPECT_TRUE(stub->Truncate(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.nrec(), saved);
  }
  {
    grpc::ClientContext ctx;
    pb::LoadRequest req;
    req.set_session_id("v4");
    req.set_fingerprint(kFingerprint + 1);
    auto reader = stub->Load(&ctx, req);
    pb::LoadChunk chunk;
    while (reader->Read(&chunk)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext ctx;
    pb::UpdateSessionRequest req;
    req.set_session_id("v4");
    req.set_turn_watermark(saved);
    (*req.mutable_set_metadata())["strata.pending"] = "x";
    pb::SessionInfo info;
    ASSERT_TRUE(stub->UpdateSession(&ctx, req, &info).ok());
    EXPECT_EQ(info.turn_watermark(), saved);
  }
  {
    grpc::ClientContext ctx;
    pb::DeleteRequest req;
    req.set_session_id("v4");
    pb::DeleteResponse resp;
    EXPECT_TRUE(stub->Delete(&ctx, req, &resp).ok());
    EXPECT_FALSE(env.FileExists("/kv/v4.coli_kv"));
    EXPECT_FALSE(env.FileExists("/kv/v4.coli_kv.manifest"));
  }
}

// The life of a served session: one stage writes it, the session is loaded
// onto one stage that goes on writing it from there (a second writer of the
// same file), and then loaded onto two stages; each resumed sequence
// continues like the uninterrupted run.
TEST_P(V4KvStoreTest, ALoadedSequenceGoesOnWritingTheSameFile) {
  const std::string dir = GetParam();
  auto engine = V4Engine::Load(dir, {});
  ASSERT_TRUE(engine.ok()) << engine.status();
  V4Engine& e = **engine;
  const V4Config& c = e.config();
  const std::vector<int> tokens = FixtureTokens(dir);
  const kv::V3Header header = V4KvHeader(c, kv::V3RowFormat::kF32);
  const kv::V3Layout L(header);
  const int nl = c.num_layers;
  kv::FaultInjectionEnv env;
  kv::ServerOptions o;
  o.store.dir = "/kv";
  o.store.commit_threads = 1;
  auto server = kv::KvStoreServer::Start(&env, o);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = pb::KVStore::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    pb::CreateSessionRequest req;
    req.set_session_id("s");
    kv::ToProto(header, req.mutable_v4());
    req.set_fingerprint(kFingerprint);
    pb::SessionInfo info;
    ASSERT_TRUE(stub->CreateSession(&ctx, req, &info).ok());
  }
  auto step = [&](V4Sequence* seq, int t0, int n) {
    V4Chunk ch{seq, absl::MakeConstSpan(&tokens[static_cast<size_t>(t0)], static_cast<size_t>(n))};
    std::vector<float> logits;
    EXPECT_TRUE(e.Forward({&ch, 1}, false, &logits).ok());
    return logits;
  };
  // Phase 1: one stage, a prefill and decode steps.
  auto seq = e.NewSequence();
  int t = 0;
  {
    StageWriter w(stub.get(), "s", 0, nl);
    for (int n : {40, 1, 1, 1, 1, 1, 11, 1, 1, 1, 1, 1}) {  // two served turns
      step(seq.get(), t, n);
      w.Step(c, *seq, L, t, tokens);
      t += n;
    }
    int64_t last = -1;
    ASSERT_TRUE(w.Finish(&last).ok());
    ASSERT_EQ(last, t);
  }
  // Phase 2: loaded onto one stage, which goes on writing.
  auto one = e.NewSequence();
  std::vector<int32_t> live;
  ASSERT_EQ(LoadRange(stub.get(), "s", c, L, 0, nl, one.get(), &live), t);
  one->Commit(t);
  {
    StageWriter w(stub.get(), "s", 0, nl);
    ASSERT_EQ(w.opened().next_position(), t);
    for (int n : {4, 1, 1, 1, 1, 1}) {  // a third turn
      const std::vector<float> a = step(one.get(), t, n), b = step(seq.get(), t, n);
      ASSERT_EQ(a, b) << "at " << t;
      w.Step(c, *one, L, t, tokens);
      t += n;
    }
    int64_t last = -1;
    ASSERT_TRUE(w.Finish(&last).ok());
    ASSERT_EQ(last, t);
  }
  // Phase 3: loaded onto two stages at every cut; each continues like the
  // uninterrupted run.
  for (int cut = 1; cut < nl; ++cut) {
    SCOPED_TRACE(::testing::Message() << "cut " << cut);
    auto two = e.NewSequence();
    ASSERT_EQ(LoadRange(stub.get(), "s", c, L, 0, cut, two.get(), &live), t);
    ASSERT_EQ(LoadRange(stub.get(), "s", c, L, cut, nl, two.get(), &live), t);
    two->Commit(t);
    auto ref = seq->Copy();
    int u = t;
    for (int n : {5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
      if (u + n > static_cast<int>(tokens.size())) break;
      const std::vector<float> a = step(two.get(), u, n), b = step(ref.get(), u, n);
      ASSERT_EQ(a, b) << "at " << u;
      u += n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V4KvStoreTest, ::testing::ValuesIn(V4FixtureDirs()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return fs::path(i.param).filename().string();
                         });

}  // namespace
}  // namespace strata::v4
