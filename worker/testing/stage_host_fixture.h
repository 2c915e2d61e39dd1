// The stage host's test fixture: a tiny random model on the CPU (written once
// per suite), hosts whose next stage is a fake link (fake_stage_stream.h), a
// sink that records results, and batch builders. Used by stage_host_test.cc
// and stage_metrics_test.cc.
#ifndef STRATA_WORKER_TESTING_STAGE_HOST_FIXTURE_H_
#define STRATA_WORKER_TESTING_STAGE_HOST_FIXTURE_H_

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"
#include "model/engine.h"
#include "model/random_model.h"
#include "worker/stage_host.h"
#include "worker/testing/fake_stage_stream.h"

namespace strata::worker {

constexpr const char* kConfig = R"({
  "model_type": "deepseek_v32", "vocab_size": 97, "hidden_size": 48, "intermediate_size": 64,
  "moe_intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 3,
  "num_key_value_heads": 3, "q_lora_rank": 24, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
  "qk_rope_head_dim": 8, "v_head_dim": 12, "n_routed_experts": 8, "n_shared_experts": 1,
  "num_experts_per_tok": 3, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
  "max_position_embeddings": 64, "index_n_heads": 4, "index_head_dim": 16, "index_topk": 8
})";
constexpr int kHidden = 48, kVocab = 97, kLayers = 4, kContext = 64;
constexpr char kNext[] = "10.0.0.9:50061";

class RecordingSink final : public ResultSink {
 public:
  void Send(v1::StageResult result) override {
    std::lock_guard<std::mutex> l(mu_);
    results_.push_back(std::move(result));
    cv_.notify_all();
  }
  // The result of batch `id` (waits for it; an empty result after the deadline).
  v1::StageResult Wait(uint64_t id) {
    std::unique_lock<std::mutex> l(mu_);
    v1::StageResult out;
    cv_.wait_for(l, testing::kFakeWait, [&] {
      for (const auto& r : results_) {
        if (r.batch_id() == id) {
          out = r;
          return true;
        }
      }
      return false;
    });
    EXPECT_EQ(out.batch_id(), id) << "no result for batch " << id;
    return out;
  }
  std::vector<v1::StageResult> results() {
    std::lock_guard<std::mutex> l(mu_);
    return results_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::StageResult> results_;
};

inline v1::StageSampling Greedy(int logprobs = -1) {
  v1::StageSampling s;
  s.set_temperature(0);
  s.set_top_p(1);
  s.set_repetition_penalty(1);
  s.set_seed(5);
  s.set_logprobs(logprobs);
  return s;
}

struct ChunkSpec {
  uint64_t seq;
  int start;
  std::vector<int> tokens;
  bool sample = true;
  bool sampling = true;  // send sampling parameters (the sequence's first chunk)
};

inline Batch MakeBatch(int64_t epoch, uint64_t id, const std::vector<ChunkSpec>& chunks, std::vector<float> hidden = {}) {
  Batch b;
  b.header.set_epoch(epoch);
  b.header.set_batch_id(id);
  int rows = 0;
  for (const ChunkSpec& c : chunks) {
    v1::StageChunk* ch = b.header.add_chunks();
    ch->set_seq_id(c.seq);
    ch->set_start(c.start);
    for (int t : c.tokens) ch->add_tokens(t);
    ch->set_sample(c.sample);
    ch->set_prompt(true);
    if (c.sampling) *ch->mutable_sampling() = Greedy();
    rows += static_cast<int>(c.tokens.size());
  }
  b.header.set_total_rows(rows);
  if (!hidden.empty()) b.header.set_hidden_size(kHidden);
  b.hidden = std::move(hidden);
  return b;
}

inline int Argmax(const float* logits) { return static_cast<int>(std::max_element(logits, logits + kVocab) - logits); }

class StageHostTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir("stage_host_");
    ASSERT_TRUE(WriteRandomModel(dir_->path(), kConfig).ok());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  std::unique_ptr<StageHost> Host(size_t max_chunk_bytes = kDefaultMaxChunkBytes) {
    StageHostOptions o;
    o.threads = 1;
    o.name = "w-test";
    o.model_root = dir_->path();
    o.max_chunk_bytes = max_chunk_bytes;
    o.dialer = net_.Dialer();
    return std::make_unique<StageHost>(o);
  }
  static v1::AssignLayersRequest Assignment(int64_t epoch, int begin, int end, int stage, int stages) {
    v1::AssignLayersRequest r;
    r.set_epoch(epoch);
    r.set_model_dir(dir_->path());
    r.set_layer_begin(begin);
    r.set_layer_end(end);
    r.set_stage(stage);
    r.set_num_stages(stages);
    if (stage + 1 < stages) r.set_next_address(kNext);
    r.set_threads(1);
    return r;
  }
  static void Assign(StageHost* host, const v1::AssignLayersRequest& r) {
    v1::AssignLayersResponse resp;
    absl::Status st = host->Assign(r, &resp);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_GT(resp.weight_bytes(), 0);
  }
  static std::unique_ptr<Engine> Reference(int begin, int end) {
    EngineOptions o;
    o.kv_dtype = KvDtype::kFp8;
    o.num_threads = 1;
    o.layer_begin = begin;
    o.layer_end = end;
    auto e = Engine::Load(dir_->path(), o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }
  // Stage 0's output rows for `tokens` appended to `kv`.
  static std::vector<float> FirstStageRows(Engine& e, SequenceKv* kv, const std::vector<int>& tokens) {
    std::vector<float> h(tokens.size() * kHidden);
    EXPECT_TRUE(e.Embed(tokens, h.data()).ok());
    SeqChunk c{kv, tokens};
    EXPECT_TRUE(e.RunLayers({c}, h.data()).ok());
    return h;
  }

  inline static ScratchDir* dir_ = nullptr;
  testing::FakeStageNetwork net_;  // outlives the hosts, which dial through it
};

inline std::vector<int> RandomTokens(std::mt19937_64& rng, int n) {
  std::vector<int> t(n);
  for (int& x : t) x = std::uniform_int_distribution<int>(0, kVocab - 1)(rng);
  return t;
}

}  // namespace strata::worker

#endif  // STRATA_WORKER_TESTING_STAGE_HOST_FIXTURE_H_
