// Power-loss durability of the store's protocols: session creation (manifest
// then data file), two stages writing one session with group commits and
// chunk checksums brought up to date, truncation (manifest first), and
// deletion — crashed at every operation, with all (or a random part of the)
// unsynced data dropped, then reopened through Store::Open and Store::Get
// with checksum verification. Every acknowledged token must be there,
// unaltered; nrec must not be below what was acknowledged nor above what was
// written; the session must open (or, for an unacknowledged create or an
// acknowledged delete, be absent).
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/fault_injection_env.h"
#include "kvstore/store.h"
#include "kvstore/test_util.h"

namespace strata::kv {
namespace {

struct Step {
  enum Kind { kWriteA, kWriteB, kCommit, kCloseAndTruncate, kReopenWriters, kUpdate, kDelete } kind;
  int64_t arg = 0;  // tokens for writes, target for truncate
};

// What the work had acknowledged when it stopped.
struct Outcome {
  bool created = false;
  bool deleted = false;
  bool delete_in_flight = false;
  int64_t acked_nrec = 0;    // lower bound for nrec
  int64_t written = 0;       // upper bound: positions both stages wrote
  bool truncate_in_flight = false;
  int64_t truncate_target = 0;
  // The manifest's metadata value "k" and turn watermark: what the last
  // acknowledged Update (or Truncate) left, and what one in flight may leave.
  std::optional<std::string> acked_k;
  std::optional<std::string> pending_k;
  int64_t acked_watermark = 0;
  std::optional<int64_t> pending_watermark;
};

// Parameterised by a repetition index only: every repetition draws fresh
// random dimensions and data.
class StorePowerLossTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dims_ = testing::RandomDims(rng_);
    dims_.n_layers = 2 + static_cast<int32_t>(rng_() % 3);
    dims_.nic = 0;
    dims_.index_hd = 0;
    split_ = 1 + static_cast<int>(rng_() % (dims_.n_layers - 1));
    for (int p = 0; p < 64; ++p) {
      records_.push_back(testing::SpecV2Record(dims_, testing::RandomV2Rows(rng_, dims_)));
    }
    options_.dir = "/kv";
    options_.commit_threads = 0;
    options_.chunk_records = 4;
  }

  std::string Slice(int64_t p, int b, int e) const {
    const int64_t lb = dims_.kv_lora + dims_.qk_rope + 8;
    return records_[static_cast<size_t>(p)].substr(static_cast<size_t>(4 + b * lb),
                                                   static_cast<size_t>((e - b) * lb));
  }

  // Runs the steps; stops at the first failure.
  Outcome Work(FaultInjectionEnv& env, const std::vector<Step>& steps) {
    Outcome out;
    auto store = Store::Open(&env, options_);
    if (!store.ok()) return out;
    SessionSpec spec;
    spec.dims = dims_;
    spec.fingerprint = 42;
    auto s = (*store)->Create("s", spec);
    if (!s.ok()) return out;
    out.created = true;
    int64_t next_a = 0, next_b = 0;
    std::optional<int64_t> wa, wb;
    auto open = [&]() {
      auto a = (*s)->OpenWriter(0, split_, std::nullopt, nullptr);
      auto b = (*s)->OpenWriter(split_, dims_.n_layers, std::nullopt, nullptr);
      if (!a.ok() || !b.ok()) return false;
      wa = a->writer_id;
      wb = b->writer_id;
      next_a = a->next_position;
      next_b = b->next_position;
      return true;
    };
    if (!open()) return out;
    auto write = [&](int64_t id, int64_t* next, int64_t k, int b, int e) {
      std::vector<int32_t> tokens;
      std::string rows;
      for (int64_t p = *next; p < *next + k; ++p) {
        tokens.push_back(testing::I32(records_[static_cast<size_t>(p)], 0));
        rows += Slice(p, b, e);
      }
      if (!(*s)->Write(id, *next, tokens, rows).ok()) return false;
      *next += k;
      return true;
    };
    for (const Step& st : steps) {
      bool ok = true;
      switch (st.kind) {
        case Step::kWriteA:
          ok = write(*wa, &next_a, st.arg, 0, split_);
          break;
        case Step::kWriteB:
          ok = write(*wb, &next_b, st.arg, split_, dims_.n_layers);
          break;
        case Step::kCommit: {
          out.written = std::max(out.written, std::min(next_a, next_b));
          auto n = (*s)->Commit();
          ok = n.ok();
          if (ok) out.acked_nrec = *n;
          break;
        }
        case Step::kCloseAndTruncate:
          (*s)->CloseWriter(*wa);
          (*s)->CloseWriter(*wb);
          out.truncate_in_flight = true;
          out.truncate_target = st.arg;
          out.pending_watermark = std::min(out.acked_watermark, st.arg);
          ok = (*s)->Truncate(st.arg).ok();
          if (ok) {
            out.truncate_in_flight = false;
            out.acked_nrec = st.arg;
            out.written = st.arg;
            out.acked_watermark = *out.pending_watermark;
            out.pending_watermark.reset();
          }
          break;
        case Step::kReopenWriters:
          ok = open();
          break;
        case Step::kUpdate: {
          const int64_t watermark = std::min(st.arg, out.acked_nrec);
          out.pending_k = std::to_string(st.arg);
          out.pending_watermark = watermark;
          ok = (*s)->Update(watermark, {{"k", *out.pending_k}}, {}).ok();
          if (ok) {
            out.acked_k = out.pending_k;
            out.acked_watermark = watermark;
            out.pending_k.reset();
            out.pending_watermark.reset();
          }
          break;
        }
        case Step::kDelete:
          (*s)->CloseWriter(*wa);
          (*s)->CloseWriter(*wb);
          out.delete_in_flight = true;
          ok = (*store)->Delete("s").ok();
          if (ok) out.deleted = true;
          break;
      }
      if (!ok) return out;
    }
    return out;
  }

  void Check(FaultInjectionEnv& env, const Outcome& out) {
    auto store = Store::Open(&env, options_);
    ASSERT_TRUE(store.ok()) << store.status();
    auto s = (*store)->Get("s", 42);
    if (out.deleted) {
      EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
      return;
    }
    if (out.delete_in_flight && absl::IsNotFound(s.status())) return;  // it happened
    if (!out.created) {
      // Not acknowledged: absent, or present and empty.
      if (s.ok()) {
        EXPECT_EQ((*s)->nrec(), 0);
      } else {
        EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
      }
      return;
    }
    ASSERT_TRUE(s.ok()) << s.status();  // opens, checksums verified
    const int64_t n = (*s)->nrec();
    const int64_t lo = out.truncate_in_flight ? std::min(out.acked_nrec, out.truncate_target) : out.acked_nrec;
    const int64_t hi = std::max(out.written, out.acked_nrec);
    ASSERT_GE(n, lo) << "an acknowledged token was lost";
    ASSERT_LE(n, hi) << "a token that was never fully written is reported committed";
    std::vector<int32_t> tokens;
    std::string rows;
    ASSERT_TRUE((*s)->Read(0, n, 0, dims_.n_layers, &tokens, &rows).ok());
    std::string want;
    for (int64_t p = 0; p < n; ++p) {
      want += Slice(p, 0, dims_.n_layers);
      ASSERT_EQ(tokens[static_cast<size_t>(p)], testing::I32(records_[static_cast<size_t>(p)], 0))
          << "the token id of committed record " << p << " differs from what was written";
    }
    EXPECT_TRUE(rows == want) << "committed rows differ from what was written";
    // The manifest: the last acknowledged metadata and watermark, or the
    // one in flight.
    const Manifest m = (*s)->Info().manifest;
    const auto k = m.metadata.find("k");
    const std::optional<std::string> have_k =
        k == m.metadata.end() ? std::nullopt : std::optional<std::string>(k->second);
    EXPECT_TRUE(have_k == out.acked_k || (out.pending_k.has_value() && have_k == out.pending_k))
        << "metadata k is " << have_k.value_or("(absent)") << ", acknowledged "
        << out.acked_k.value_or("(absent)");
    EXPECT_TRUE(m.turn_watermark == out.acked_watermark ||
                (out.pending_watermark.has_value() && m.turn_watermark == *out.pending_watermark))
        << "turn watermark " << m.turn_watermark << ", acknowledged " << out.acked_watermark;
    // The session stays writable after recovery.
    auto w = (*s)->OpenWriter(0, dims_.n_layers, std::nullopt, nullptr);
    EXPECT_TRUE(w.ok()) << w.status();
  }

  void RunEveryCrashPoint(const std::vector<Step>& steps) {
    int64_t total;
    {
      FaultInjectionEnv env;
      const Outcome out = Work(env, steps);
      total = env.operation_count();
      env.DropUnsyncedData();
      Check(env, out);
    }
    for (int64_t i = 0; i <= total; ++i) {
      for (int mode = 0; mode < 3; ++mode) {
        FaultInjectionEnv env;
        env.CrashAtOperation(i);
        const Outcome out = Work(env, steps);
        if (mode == 0) {
          env.DropUnsyncedData();
        } else {
          env.DropSomeUnsyncedData(seed_ + static_cast<uint64_t>(i * 3 + mode));
        }
        SCOPED_TRACE(::testing::Message() << "crash at operation " << i << " of " << total
                                          << ", drop mode " << mode << ", acked nrec "
                                          << out.acked_nrec);
        Check(env, out);
        if (HasFatalFailure()) return;
      }
    }
  }

  std::mt19937_64 rng_ = testing::FreshRng();
  const uint64_t seed_ = rng_();
  Dims dims_;
  int split_ = 1;
  std::vector<std::string> records_;
  StoreOptions options_;
};

TEST_P(StorePowerLossTest, TwoStagesGroupCommitAndChunks) {
  RunEveryCrashPoint({{Step::kWriteA, 3},
                      {Step::kWriteB, 1},
                      {Step::kCommit},
                      {Step::kWriteB, 4},
                      {Step::kWriteA, 2},
                      {Step::kCommit},  // completes chunk 0: manifest replaced
                      {Step::kWriteA, 5},
                      {Step::kWriteB, 5},
                      {Step::kCommit},  // chunks 1 and 2
                      {Step::kUpdate, 9}});
}

TEST_P(StorePowerLossTest, TruncateAndRewrite) {
  RunEveryCrashPoint({{Step::kWriteA, 9},
                      {Step::kWriteB, 9},
                      {Step::kCommit},
                      {Step::kUpdate, 9},
                      {Step::kCloseAndTruncate, 3},  // drops chunks 1.., watermark 9 → 3
                      {Step::kReopenWriters},
                      {Step::kWriteA, 2},
                      {Step::kWriteB, 2},
                      {Step::kCommit}});
}

TEST_P(StorePowerLossTest, Delete) {
  RunEveryCrashPoint({{Step::kWriteA, 5}, {Step::kWriteB, 5}, {Step::kCommit}, {Step::kDelete}});
}

INSTANTIATE_TEST_SUITE_P(Repetitions, StorePowerLossTest, ::testing::Range(0, 6));

}  // namespace
}  // namespace strata::kv
