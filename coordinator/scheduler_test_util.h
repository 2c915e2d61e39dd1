// What the scheduler's tests share (scheduler_test.cc, scheduler_end_test.cc):
// a fixture with a scheduler over a fake pipeline (coordinator/testing/
// fake_pipeline.h) and a fake clock, on models/demo's config and tokenizer,
// and helpers to read batches and answer them.
//
// The scheduler thread sends batches on its own; the tests wait for them
// (condition waits with generous deadlines) and answer them by calling
// OnResult, as the cluster's stream reader does. To check that something was
// NOT sent, a test frees a sentinel sequence and waits for the batch that
// carries the free (Barrier): every batch the scheduler could form before it
// has then been sent.
#ifndef STRATA_COORDINATOR_SCHEDULER_TEST_UTIL_H_
#define STRATA_COORDINATOR_SCHEDULER_TEST_UTIL_H_

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/testing/fake_clock.h"
#include "coordinator/scheduler.h"
#include "coordinator/testing/fake_pipeline.h"
#include "gtest/gtest.h"

namespace strata::coordinator::testing {

inline constexpr int64_t kEpoch = 7;
inline constexpr int kEos = 1;  // models/demo

inline bool HasSeq(const v1::StageBatch& b, uint64_t seq) {
  return std::any_of(b.chunks().begin(), b.chunks().end(), [&](const v1::StageChunk& c) { return c.seq_id() == seq; });
}

inline bool Frees(const v1::StageBatch& b, uint64_t seq) {
  return std::find(b.free_seq_ids().begin(), b.free_seq_ids().end(), seq) != b.free_seq_ids().end();
}

inline std::vector<int> Tokens(const v1::StageChunk& c) { return {c.tokens().begin(), c.tokens().end()}; }

// A result that samples `token` for every chunk that asks for one.
inline v1::StageResult Result(const v1::StageBatch& b, int token) {
  v1::StageResult r;
  r.set_batch_id(b.batch_id());
  for (const auto& c : b.chunks()) {
    if (!c.sample()) continue;
    v1::SampledToken* t = r.add_tokens();
    t->set_seq_id(c.seq_id());
    t->set_token(token);
  }
  return r;
}

inline v1::StageResult Failed(const v1::StageBatch& b, absl::StatusCode code, int stage, const std::string& error) {
  v1::StageResult r;
  r.set_batch_id(b.batch_id());
  r.set_code(static_cast<int>(code));
  r.set_failed_stage(stage);
  r.set_error(error);
  return r;
}

inline RequestSpec Spec(std::vector<int> prompt, std::optional<int> max_tokens = 4, std::string id = "") {
  RequestSpec s;
  s.request_id = std::move(id);
  s.prompt = std::move(prompt);
  s.sampling.temperature = 0;
  s.sampling.seed = 42;
  s.sampling.max_tokens = max_tokens;
  return s;
}

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = LoadModelContext(std::string(STRATA_SOURCE_DIR) + "/models/demo");
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
    ASSERT_NE(model_->tokenizer, nullptr);
    ASSERT_EQ(model_->config.eos_token_ids, std::vector<int>{kEos});
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void TearDown() override {
    pipeline_.Release();
    sched_.reset();
  }

  void Make(SchedulerOptions o = {}, int stages = 1, bool up = true, const ModelContext* model = nullptr) {
    o.clock = &clock_;
    sched_ = std::make_unique<Scheduler>(o, model ? model : model_, &pipeline_, &sessions_);
    if (up) sched_->OnPipelineUp(stages, kEpoch);
  }

  std::shared_ptr<FakeSink> Submit(RequestSpec spec, std::optional<absl::Time> deadline = std::nullopt) {
    auto sink = std::make_shared<FakeSink>();
    absl::Status st = sched_->Submit(std::move(spec), sink, deadline);
    EXPECT_TRUE(st.ok()) << st;
    return sink;
  }

  // The next batch with an id (free-only batches are skipped) after the ones
  // this returned before; an empty batch after the fakes' deadline.
  v1::StageBatch NextBatch() {
    v1::StageBatch out;
    pipeline_.WaitUntil([&](const std::vector<v1::StageBatch>& sent) {
      for (; next_ < sent.size(); ++next_) {
        if (sent[next_].batch_id() != 0) {
          out = sent[next_++];
          return true;
        }
      }
      return false;
    });
    EXPECT_NE(out.batch_id(), 0u) << "no batch was sent";
    return out;
  }

  // Returns once every batch the scheduler could form so far has been sent.
  void Barrier() {
    const uint64_t sentinel = (uint64_t{1} << 40) + sentinel_++;
    sched_->FreeSequence(sentinel);
    ASSERT_TRUE(pipeline_.WaitUntil([&](const std::vector<v1::StageBatch>& sent) {
      return std::any_of(sent.begin(), sent.end(), [&](const v1::StageBatch& b) { return Frees(b, sentinel); });
    }));
  }

  bool WaitFreed(uint64_t seq) {
    return pipeline_.WaitUntil([&](const std::vector<v1::StageBatch>& sent) {
      return std::any_of(sent.begin(), sent.end(), [&](const v1::StageBatch& b) { return Frees(b, seq); });
    });
  }
  bool Freed(uint64_t seq) {
    auto sent = pipeline_.sent();
    return std::any_of(sent.begin(), sent.end(), [&](const v1::StageBatch& b) { return Frees(b, seq); });
  }
  // Batches with an id that hold a chunk of `seq`.
  int BatchesOf(uint64_t seq) {
    auto sent = pipeline_.sent();
    return static_cast<int>(std::count_if(sent.begin(), sent.end(), [&](const v1::StageBatch& b) { return HasSeq(b, seq); }));
  }

  inline static ModelContext* model_ = nullptr;
  strata::testing::FakeClock clock_;
  FakePipeline pipeline_;
  SessionTable sessions_;
  std::unique_ptr<Scheduler> sched_;  // destroyed before the fakes it uses
  size_t next_ = 0;
  uint64_t sentinel_ = 0;
};


}  // namespace strata::coordinator::testing

#endif  // STRATA_COORDINATOR_SCHEDULER_TEST_UTIL_H_
