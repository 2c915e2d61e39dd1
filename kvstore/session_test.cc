// Sessions and the store: several writers per session, group commit,
// reads by layer range, truncate, update, delete, failures and their codes.
#include "kvstore/session.h"

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "gtest/gtest.h"
#include "kvstore/fault_injection_env.h"
#include "kvstore/session_file.h"
#include "kvstore/store.h"
#include "kvstore/test_util.h"

namespace strata::kv {
namespace {

// Records the commits a writer is told about.
class Recorder : public CommitListener {
 public:
  void OnCommitted(int64_t nrec) override { last = nrec; }
  void OnFailed(const absl::Status& s) override { failure = s; }
  std::atomic<int64_t> last{-1};
  absl::Status failure;
};

using Model = testing::RecordModel;

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dims_ = testing::RandomDims(rng_);
    dims_.n_layers = 4 + static_cast<int32_t>(rng_() % 5);
    dims_.index_hd = 1 + static_cast<int32_t>(rng_() % 6);
    dims_.nic = 2;
    indexer_layers_ = {1, dims_.n_layers - 1};
    model_ = std::make_unique<Model>(rng_, dims_, indexer_layers_);
    options_.dir = "/kv";
    options_.commit_threads = 0;
    options_.chunk_records = 4;
    store_ = *Store::Open(&env_, options_);
  }

  SessionSpec Spec() {
    SessionSpec s;
    s.dims = dims_;
    s.indexer_layers = indexer_layers_;
    s.fingerprint = fingerprint_;
    s.metadata["model"] = "test";
    return s;
  }

  // Writes positions [from, to) of layers [b, e) through `writer`.
  absl::Status WriteRange(Session& s, int64_t writer, int64_t from, int64_t to, int b, int e) {
    std::vector<int32_t> tokens;
    std::string rows;
    for (int64_t p = from; p < to; ++p) {
      tokens.push_back(model_->Token(p));
      rows += model_->Slice(p, b, e);
    }
    return s.Write(writer, from, tokens, rows);
  }

  void ExpectContents(Session& s, int64_t n) {
    ASSERT_EQ(s.nrec(), n);
    const int b = static_cast<int>(rng_() % dims_.n_layers);
    const int e = b + 1 + static_cast<int>(rng_() % (dims_.n_layers - b));
    std::vector<int32_t> tokens;
    std::string rows;
    ASSERT_TRUE(s.Read(0, n, b, e, &tokens, &rows).ok());
    std::string want;
    for (int64_t p = 0; p < n; ++p) {
      EXPECT_EQ(tokens[static_cast<size_t>(p)], model_->Token(p));
      want += model_->Slice(p, b, e);
    }
    EXPECT_EQ(rows, want) << "layers [" << b << ", " << e << ")";
  }

  FaultInjectionEnv env_;
  std::mt19937_64 rng_ = testing::FreshRng();
  Dims dims_;
  std::vector<int32_t> indexer_layers_;
  std::unique_ptr<Model> model_;
  StoreOptions options_;
  std::unique_ptr<Store> store_;
  const uint64_t fingerprint_ = rng_();
};

TEST(StoreIds, Validation) {
  for (const char* ok : {"a", "session-1", "A.b_c-9", "0"}) {
    EXPECT_TRUE(Store::ValidateSessionId(ok).ok()) << ok;
  }
  for (std::string bad : {std::string(), std::string("../etc/passwd"), std::string("a/b"),
                          std::string(".hidden"), std::string(".."), std::string("-x"),
                          std::string("a b"), std::string("caf\xc3\xa9"), std::string("a\0b", 3),
                          std::string(129, 'a')}) {
    EXPECT_EQ(Store::ValidateSessionId(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(Store::ValidateSessionId(std::string(128, 'a')).ok());
}

TEST_F(SessionTest, TwoStagesCommitTheCommonPrefix) {
  auto s = store_->Create("chat", Spec());
  ASSERT_TRUE(s.ok()) << s.status();
  const int split = 1 + static_cast<int>(rng_() % (dims_.n_layers - 1));
  auto la = std::make_shared<Recorder>(), lb = std::make_shared<Recorder>();
  auto a = (*s)->OpenWriter(0, split, std::nullopt, la);
  auto b = (*s)->OpenWriter(split, dims_.n_layers, std::nullopt, lb);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->next_position, 0);
  EXPECT_EQ(a->slice_bytes, static_cast<int64_t>(model_->Slice(0, 0, split).size()));
  ASSERT_TRUE(WriteRange(**s, a->writer_id, 0, 10, 0, split).ok());
  ASSERT_TRUE(WriteRange(**s, b->writer_id, 0, 6, split, dims_.n_layers).ok());
  EXPECT_EQ((*s)->nrec(), 0);  // nothing synced yet
  ASSERT_EQ(*(*s)->Commit(), 6);
  EXPECT_EQ(la->last, 6);
  EXPECT_EQ(lb->last, 6);
  EXPECT_TRUE((*s)->WriterDurable(a->writer_id));
  ASSERT_TRUE(WriteRange(**s, b->writer_id, 6, 13, split, dims_.n_layers).ok());
  EXPECT_FALSE((*s)->WriterDurable(b->writer_id));
  ASSERT_EQ(*(*s)->Commit(), 10);
  ExpectContents(**s, 10);

  // Stage A leaves; its rows still count. Then a new stage A continues at 10.
  (*s)->CloseWriter(a->writer_id);
  auto a2 = (*s)->OpenWriter(0, split, std::nullopt, la);
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a2->next_position, 10);
  ASSERT_TRUE(WriteRange(**s, a2->writer_id, 10, 13, 0, split).ok());
  store_->CommitAll();
  ExpectContents(**s, 13);

  // The manifest holds the checksums of the complete chunks: reopen and verify.
  (*s)->CloseWriter(a2->writer_id);
  (*s)->CloseWriter(b->writer_id);
  auto m = ReadManifest(&env_, ManifestPath(Session::DataPath("/kv", "chat")));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->chunk_crc32c.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    std::string chunk;
    for (int p = 0; p < 4; ++p) chunk += model_->Record(static_cast<int64_t>(k) * 4 + p);
    EXPECT_EQ(m->chunk_crc32c[k], testing::BitwiseCrc32c(chunk));
  }
  store_.reset();
  store_ = *Store::Open(&env_, options_);
  auto again = store_->Get("chat", fingerprint_);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectContents(**again, 13);
}

// Records after the last complete chunk get a checksum when the writers are
// gone and at every Update (a turn's end), so a session shorter than a chunk
// is covered too; a damaged byte there is DATA_LOSS when it is opened.
TEST_F(SessionTest, RecordsAfterTheLastChunkAreChecksummed) {
  auto s = *store_->Create("short", Spec());
  const std::string manifest_path = ManifestPath(Session::DataPath("/kv", "short"));
  auto tail_of = [&](int64_t first, int64_t n) {
    std::string recs;
    for (int64_t p = first; p < first + n; ++p) recs += model_->Record(p);
    return testing::BitwiseCrc32c(recs);
  };
  auto w = s->OpenWriter(0, dims_.n_layers, std::nullopt, nullptr);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(WriteRange(*s, w->writer_id, 0, 3, 0, dims_.n_layers).ok());
  store_->CommitAll();
  ASSERT_EQ(s->nrec(), 3);
  EXPECT_EQ(ReadManifest(&env_, manifest_path)->tail_records, 0);  // a writer is still open
  s->CloseWriter(w->writer_id);
  store_->CommitAll();
  Manifest m = *ReadManifest(&env_, manifest_path);
  EXPECT_EQ(m.chunk_crc32c.size(), 0u);
  EXPECT_EQ(m.tail_records, 3);
  EXPECT_EQ(m.tail_crc32c, tail_of(0, 3));

  // A chunk completes while a writer is open: the replacement covers the tail too.
  w = s->OpenWriter(0, dims_.n_layers, std::nullopt, nullptr);
  ASSERT_TRUE(WriteRange(*s, w->writer_id, 3, 5, 0, dims_.n_layers).ok());
  store_->CommitAll();
  m = *ReadManifest(&env_, manifest_path);
  EXPECT_EQ(m.chunk_crc32c.size(), 1u);
  EXPECT_EQ(m.tail_records, 1);
  EXPECT_EQ(m.tail_crc32c, tail_of(4, 1));
  ASSERT_TRUE(WriteRange(*s, w->writer_id, 5, 6, 0, dims_.n_layers).ok());
  store_->CommitAll();
  EXPECT_EQ(ReadManifest(&env_, manifest_path)->tail_records, 1);  // no replacement per commit
  ASSERT_TRUE(s->Update(6, {}, {}).ok());
  m = *ReadManifest(&env_, manifest_path);
  EXPECT_EQ(m.tail_records, 2);
  EXPECT_EQ(m.tail_crc32c, tail_of(4, 2));
  s->CloseWriter(w->writer_id);
  store_->CommitAll();

  // Truncating into the tail recomputes it.
  ASSERT_TRUE(s->Truncate(5).ok());
  m = *ReadManifest(&env_, manifest_path);
  EXPECT_EQ(m.tail_records, 1);
  EXPECT_EQ(m.tail_crc32c, tail_of(4, 1));

  // One flipped bit in the tail's records: the session no longer opens.
  s.reset();
  store_.reset();
  {
    const int64_t rb = testing::SpecV2RecordBytes(dims_);
    auto f = env_.Open(Session::DataPath("/kv", "short"), OpenMode::kReadWrite);
    const uint64_t at = 40 + 4 * rb + rng_() % rb;
    char c;
    ASSERT_TRUE((*f)->Read(at, 1, &c).ok());
    c ^= 0x04;
    ASSERT_TRUE((*f)->Write(at, std::string_view(&c, 1)).ok());
  }
  store_ = *Store::Open(&env_, options_);
  EXPECT_EQ(store_->Get("short", fingerprint_).status().code(), absl::StatusCode::kDataLoss);
}

// A manifest written before format version 2 records a version-1 model
// fingerprint: it is checked against the caller's version-1 value, and the
// next manifest write records the current one.
TEST_F(SessionTest, VersionOneFingerprintIsCheckedAndUpgraded) {
  const uint64_t legacy = fingerprint_ ^ 0x5555;
  {
    auto s = *store_->Create("old", Spec());
    auto w = s->OpenWriter(0, dims_.n_layers, std::nullopt, nullptr);
    ASSERT_TRUE(WriteRange(*s, w->writer_id, 0, 3, 0, dims_.n_layers).ok());
    s->CloseWriter(w->writer_id);
    store_->CommitAll();
  }
  store_.reset();
  // Rewrite the manifest as a version-1 build wrote it.
  const std::string path = ManifestPath(Session::DataPath("/kv", "old"));
  const Manifest now = *ReadManifest(&env_, path);
  nlohmann::json j = nlohmann::json::parse(SerializeManifest(now).substr(0, SerializeManifest(now).find('\n')));
  j["version"] = 1;
  j["fingerprint"] = absl::StrFormat("%016x", legacy);
  j.erase("fingerprint_version");
  j.erase("model_digest");
  j.erase("tail_records");
  j.erase("tail_crc32c");
  const std::string body = j.dump() + "\n";
  ASSERT_TRUE(WriteFileAtomically(&env_, path, body + absl::StrFormat("crc32c %08x\n", testing::BitwiseCrc32c(body))).ok());
  ASSERT_EQ(ReadManifest(&env_, path)->fingerprint_version, 1);

  store_ = *Store::Open(&env_, options_);
  EXPECT_EQ(store_->Get("old", fingerprint_).status().code(), absl::StatusCode::kFailedPrecondition)
      << "no version-1 value to compare with";
  EXPECT_EQ(store_->Get("old", ModelIdentity(fingerprint_, legacy + 1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->Get("old", ModelIdentity(legacy, std::nullopt)).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "a version-1 value is never compared with the current one";
  auto s = store_->Get("old", ModelIdentity(fingerprint_, legacy));
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectContents(**s, 3);
  EXPECT_EQ(ReadManifest(&env_, path)->fingerprint_version, 1);  // upgraded by the next write
  ASSERT_TRUE((*s)->Update(3, {}, {}).ok());
  const Manifest upgraded = *ReadManifest(&env_, path);
  EXPECT_EQ(upgraded.fingerprint_version, 2);
  EXPECT_EQ(upgraded.fingerprint, fingerprint_);
  EXPECT_EQ(upgraded.tail_records, 3);
  EXPECT_EQ(store_->Get("old", fingerprint_).status().code(), absl::StatusCode::kOk);
}

TEST_F(SessionTest, WriteErrorsHaveSpecificCodes) {
  auto s = *store_->Create("e", Spec());
  const int L = dims_.n_layers;
  auto a = s->OpenWriter(0, 2, std::nullopt, nullptr);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(s->OpenWriter(1, 3, std::nullopt, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);  // overlaps [0, 2)
  EXPECT_EQ(s->OpenWriter(2, L + 1, std::nullopt, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->OpenWriter(3, 3, std::nullopt, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->OpenWriter(2, L, 5, nullptr).status().code(), absl::StatusCode::kOutOfRange);
  auto b = s->OpenWriter(2, L, std::nullopt, nullptr);
  ASSERT_TRUE(b.ok());

  EXPECT_EQ(WriteRange(*s, a->writer_id, 1, 3, 0, 2).code(), absl::StatusCode::kOutOfRange);
  std::vector<int32_t> t = {model_->Token(0)};
  EXPECT_EQ(s->Write(a->writer_id, 0, t, model_->Slice(0, 0, 2) + "x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Write(a->writer_id, 0, {}, "").code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> bad = {dims_.vocab};
  EXPECT_EQ(s->Write(a->writer_id, 0, bad, model_->Slice(0, 0, 2)).code(),
            absl::StatusCode::kInvalidArgument);
  bad = {-1};
  EXPECT_EQ(s->Write(a->writer_id, 0, bad, model_->Slice(0, 0, 2)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Write(999, 0, t, model_->Slice(0, 0, 2)).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(WriteRange(*s, a->writer_id, 0, 2, 0, 2).ok());
  // Stage B claims another token id at position 1.
  std::vector<int32_t> two = {model_->Token(0), (model_->Token(1) + 1) % dims_.vocab};
  const auto mismatch = s->Write(b->writer_id, 0, two, model_->Slice(0, 2, L) + model_->Slice(1, 2, L));
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.message().find("another layer range"), absl::string_view::npos);
  EXPECT_TRUE(WriteRange(*s, b->writer_id, 0, 2, 2, L).ok());  // the right ids are fine
  EXPECT_EQ(*s->Commit(), 2);

  EXPECT_EQ(s->Truncate(1).code(), absl::StatusCode::kFailedPrecondition);  // writers open
  s->CloseWriter(a->writer_id);
  s->CloseWriter(b->writer_id);
  EXPECT_EQ(s->Truncate(3).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s->Update(3, {}, {}).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s->Update(std::nullopt, {{"", "x"}}, {}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> tokens;
  std::string rows;
  EXPECT_EQ(s->Read(1, 2, 0, L, &tokens, &rows).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s->Read(0, 1, 0, L + 1, &tokens, &rows).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(store_->Create("e", Spec()).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->Create("../e", Spec()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Get("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Get("e", fingerprint_ + 1).status().code(), absl::StatusCode::kFailedPrecondition);
  SessionSpec bad_spec = Spec();
  bad_spec.indexer_layers = {0};  // nic is 2
  EXPECT_EQ(store_->Create("f", bad_spec).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SessionTest, RestartRewritesFromAStartPosition) {
  auto s = *store_->Create("r", Spec());
  auto w = s->OpenWriter(0, dims_.n_layers, std::nullopt, nullptr);
  ASSERT_TRUE(WriteRange(*s, w->writer_id, 0, 5, 0, dims_.n_layers).ok());
  ASSERT_EQ(*s->Commit(), 5);
  ASSERT_TRUE(WriteRange(*s, w->writer_id, 5, 9, 0, dims_.n_layers).ok());
  s->CloseWriter(w->writer_id);
  // A new writer restarts at 6: positions 6.. get new rows (and may get new tokens).
  for (int64_t p = 6; p < 9; ++p) model_->Replace(p);
  auto w2 = s->OpenWriter(0, dims_.n_layers, 6, nullptr);
  ASSERT_TRUE(w2.ok());
  EXPECT_EQ(w2->next_position, 6);
  ASSERT_TRUE(WriteRange(*s, w2->writer_id, 6, 9, 0, dims_.n_layers).ok());
  store_->CommitAll();
  ExpectContents(*s, 9);
}

TEST_F(SessionTest, TruncateUpdateDelete) {
  auto s = *store_->Create("t", Spec());
  auto w = s->OpenWriter(0, dims_.n_layers, std::nullopt, nullptr);
  ASSERT_TRUE(WriteRange(*s, w->writer_id, 0, 11, 0, dims_.n_layers).ok());
  store_->CommitAll();
  ASSERT_TRUE(s->Update(10, {{"title", "a chat"}}, {"model"}).ok());
  EXPECT_EQ(store_->Delete("t").code(), absl::StatusCode::kFailedPrecondition);  // writer open
  s->CloseWriter(w->writer_id);
  ASSERT_TRUE(s->Truncate(6).ok());
  ExpectContents(*s, 6);
  SessionInfo info = s->Info();
  EXPECT_EQ(info.manifest.turn_watermark, 6);
  EXPECT_EQ(info.manifest.chunk_crc32c.size(), 1u);
  EXPECT_EQ(info.manifest.metadata.count("model"), 0u);
  EXPECT_EQ(info.manifest.metadata.at("title"), "a chat");
  EXPECT_EQ(info.file_bytes, static_cast<uint64_t>(40 + 6 * testing::SpecV2RecordBytes(dims_)));
  // New rows after the truncation.
  for (int64_t p = 6; p < 8; ++p) model_->Replace(p);
  auto w2 = s->OpenWriter(0, dims_.n_layers, std::nullopt, nullptr);
  EXPECT_EQ(w2->next_position, 6);
  ASSERT_TRUE(WriteRange(*s, w2->writer_id, 6, 8, 0, dims_.n_layers).ok());
  store_->CommitAll();
  ExpectContents(*s, 8);
  s->CloseWriter(w2->writer_id);

  ASSERT_TRUE(store_->Delete("t").ok());
  EXPECT_FALSE(env_.FileExists("/kv/t.coli_kv"));
  EXPECT_FALSE(env_.FileExists("/kv/t.coli_kv.manifest"));
  EXPECT_EQ(store_->Get("t").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Delete("t").code(), absl::StatusCode::kNotFound);
  std::vector<int32_t> tokens;
  std::string rows;
  EXPECT_EQ(s->Read(0, 1, 0, 1, &tokens, &rows).code(), absl::StatusCode::kNotFound);
}

TEST_F(SessionTest, FullDiskAndFailedSyncs) {
  auto s = *store_->Create("d", Spec());
  auto other = *store_->Create("o", Spec());
  auto listener = std::make_shared<Recorder>();
  auto w = s->OpenWriter(0, dims_.n_layers, std::nullopt, listener);
  ASSERT_TRUE(WriteRange(*s, w->writer_id, 0, 3, 0, dims_.n_layers).ok());
  ASSERT_EQ(*s->Commit(), 3);

  // A full disk on a write: RESOURCE_EXHAUSTED, nothing advanced, still usable.
  FaultInjectionEnv::Fault full;
  full.op = FaultInjectionEnv::OpKind::kWrite;
  full.path_contains = "d.coli_kv";
  env_.AddFault(full);
  EXPECT_EQ(WriteRange(*s, w->writer_id, 3, 5, 0, dims_.n_layers).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(s->health().ok());
  ASSERT_TRUE(WriteRange(*s, w->writer_id, 3, 5, 0, dims_.n_layers).ok());
  ASSERT_EQ(*s->Commit(), 5);

  // A failed sync fails the session: the writer hears it, every call returns it.
  FaultInjectionEnv::Fault sync;
  sync.op = FaultInjectionEnv::OpKind::kSync;
  sync.path_contains = "d.coli_kv";
  env_.AddFault(sync);
  ASSERT_TRUE(WriteRange(*s, w->writer_id, 5, 7, 0, dims_.n_layers).ok());
  EXPECT_EQ(s->Commit().status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(listener->failure.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(WriteRange(*s, w->writer_id, 7, 8, 0, dims_.n_layers).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store_->Get("d").status().code(), absl::StatusCode::kResourceExhausted);  // writer open
  // Another session is unaffected.
  auto ow = other->OpenWriter(0, dims_.n_layers, std::nullopt, nullptr);
  ASSERT_TRUE(WriteRange(*other, ow->writer_id, 0, 2, 0, dims_.n_layers).ok());
  EXPECT_EQ(*other->Commit(), 2);
  // Once the writer is gone the session reopens from the disk.
  s->CloseWriter(w->writer_id);
  s.reset();
  auto again = store_->Get("d", fingerprint_);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectContents(**again, 5);
}

TEST_F(SessionTest, ImportedV1IsUpgradedByTheFirstWriter) {
  Dims d = dims_;
  std::string v1;
  std::vector<testing::V1Rows> rows;
  for (int p = 0; p < 3; ++p) {
    rows.push_back(testing::RandomV1Rows(rng_, d));
    v1 += testing::SpecV1Record(d, rows.back());
  }
  {
    auto f = env_.Open("/kv/old.coli_kv", OpenMode::kCreate);
    ASSERT_TRUE((*f)->Write(0, testing::SpecHeader(false, d, 3) + v1).ok());
  }
  EXPECT_EQ(store_->Get("old").status().code(), absl::StatusCode::kFailedPrecondition);  // no manifest
  ImportOptions io;
  io.dims = d;
  io.fingerprint = fingerprint_;
  io.indexer_layers = indexer_layers_;
  ASSERT_TRUE(ImportSession(&env_, "/kv/old.coli_kv", io).ok());
  auto s = store_->Get("old", fingerprint_);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->Info().version, Version::kV1);
  std::vector<int32_t> tokens;
  std::string before;
  ASSERT_TRUE((*s)->Read(0, 3, 0, d.n_layers, &tokens, &before).ok());  // quantised in memory
  EXPECT_EQ(tokens[2], rows[2].token);
  auto w = (*s)->OpenWriter(0, d.n_layers, std::nullopt, nullptr);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*s)->Info().version, Version::kV2);
  std::string after;
  ASSERT_TRUE((*s)->Read(0, 3, 0, d.n_layers, &tokens, &after).ok());
  EXPECT_EQ(after, before);  // bit-exact across the upgrade
  EXPECT_EQ(w->next_position, 3);
}

TEST_F(SessionTest, StoreRecoveryLockAndList) {
  ASSERT_TRUE(store_->Create("b1", Spec()).ok());
  ASSERT_TRUE(store_->Create("b2", Spec()).ok());
  ASSERT_TRUE(store_->Create("c1", Spec()).ok());
  EXPECT_EQ(Store::Open(&env_, options_).status().code(), absl::StatusCode::kFailedPrecondition);
  store_.reset();
  // Leftovers of interrupted operations.
  ASSERT_TRUE(WriteManifest(&env_, "/kv/gone.coli_kv.manifest", *ReadManifest(&env_, "/kv/b1.coli_kv.manifest")).ok());
  ASSERT_TRUE(env_.Open("/kv/b2.coli_kv.tmp", OpenMode::kCreate).ok());
  {
    auto f = env_.Open("/kv/foreign.coli_kv", OpenMode::kCreate);
    ASSERT_TRUE((*f)->Write(0, testing::SpecHeader(true, dims_, 0)).ok());
  }
  store_ = *Store::Open(&env_, options_);
  EXPECT_FALSE(env_.FileExists("/kv/gone.coli_kv.manifest"));
  EXPECT_FALSE(env_.FileExists("/kv/b2.coli_kv.tmp"));
  bool more = false;
  auto all = store_->List("", "", 0, &more);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 4u);
  EXPECT_EQ((*all)[3].id, "foreign");
  EXPECT_EQ((*all)[3].problem.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*all)[0].problem.ok());
  auto page = store_->List("b", "", 1, &more);
  ASSERT_EQ(page->size(), 1u);
  EXPECT_EQ((*page)[0].id, "b1");
  EXPECT_TRUE(more);
  page = store_->List("b", "b1", 1, &more);
  ASSERT_EQ(page->size(), 1u);
  EXPECT_EQ((*page)[0].id, "b2");
  EXPECT_FALSE(more);
  ASSERT_TRUE(store_->Delete("foreign").ok());  // a file without manifest can be deleted
  EXPECT_FALSE(env_.FileExists("/kv/foreign.coli_kv"));
}

// Real threads: two stages stream concurrently while commit threads run.
TEST_F(SessionTest, ConcurrentStagesWithCommitThreads) {
  store_.reset();
  options_.commit_threads = 2;
  store_ = *Store::Open(&env_, options_);
  auto s = *store_->Create("c", Spec());
  const int split = 1 + static_cast<int>(rng_() % (dims_.n_layers - 1));
  const int64_t total = 300;
  for (int64_t p = 0; p < total; ++p) model_->Record(p);  // generated before the threads start
  auto stage = [&](int b, int e) {
    auto w = s->OpenWriter(b, e, std::nullopt, nullptr);
    ASSERT_TRUE(w.ok());
    std::mt19937_64 local(static_cast<uint64_t>(b) + 17);
    for (int64_t p = 0; p < total;) {
      const int64_t k = std::min<int64_t>(total - p, 1 + static_cast<int64_t>(local() % 9));
      ASSERT_TRUE(WriteRange(*s, w->writer_id, p, p + k, b, e).ok());
      p += k;
    }
    while (!s->WriterDurable(w->writer_id)) std::this_thread::yield();
    s->CloseWriter(w->writer_id);
  };
  std::thread t1(stage, 0, split), t2(stage, split, dims_.n_layers);
  t1.join();
  t2.join();
  store_->CommitAll();
  ExpectContents(*s, total);
}

}  // namespace
}  // namespace strata::kv
