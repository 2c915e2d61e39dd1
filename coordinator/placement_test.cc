#include "coordinator/placement.h"

#include <filesystem>

#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"
#include "model/random_model.h"

namespace strata::coordinator {
namespace {

// A layout with `n` layers of the given weight bytes and 100 KV bytes per token.
ModelLayout Layout(std::vector<uint64_t> weights, std::vector<bool> cut = {}) {
  ModelLayout m;
  m.num_layers = static_cast<int>(weights.size());
  m.layer_weight_bytes = std::move(weights);
  m.can_cut_before = cut.empty() ? std::vector<bool>(m.num_layers, true) : cut;
  m.kv_bytes_per_token.assign(m.num_layers, 100);
  return m;
}

std::vector<WorkerSlot> Workers(int n, uint64_t free = 0) {
  std::vector<WorkerSlot> w;
  for (int i = 0; i < n; ++i) w.push_back({"w" + std::to_string(i), free});
  return w;
}

PlacementOptions NoKv() {
  PlacementOptions o;
  o.max_sessions = 0;
  o.max_context = 0;
  return o;
}

TEST(PlacementTest, BalancesContiguousRangesByMemory) {
  auto plan = PlanBalanced(Layout({10, 10, 10, 10, 40, 40}), Workers(3), NoKv());
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 3u);
  // Best max is 40: [0,4) = 40, [4,5) = 40, [5,6) = 40.
  EXPECT_EQ(plan->stages[0].layer_begin, 0);
  EXPECT_EQ(plan->stages[0].layer_end, 4);
  EXPECT_EQ(plan->stages[1].layer_end, 5);
  EXPECT_EQ(plan->stages[2].layer_end, 6);
  for (size_t s = 0; s < plan->stages.size(); ++s) EXPECT_EQ(plan->stages[s].worker, static_cast<int>(s));
}

TEST(PlacementTest, EmbeddingHeadAndKvBudgetCount) {
  ModelLayout m = Layout({10, 10, 10, 10});
  m.embed_bytes = 25;
  PlacementOptions o;
  o.max_sessions = 1;
  o.max_context = 0;
  auto plan = PlanBalanced(m, Workers(2), o);
  ASSERT_TRUE(plan.ok());
  // Stage 0 carries the embedding: it gets fewer layers.
  EXPECT_EQ(plan->stages[0].layer_end, 1);
  EXPECT_EQ(plan->stages[0].weight_bytes, 35u);
  o.max_context = 10;  // 1000 KV bytes per layer dominate: split evenly
  plan = PlanBalanced(m, Workers(2), o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->stages[0].layer_end, 2);
  EXPECT_EQ(plan->stages[0].kv_bytes, 2000u);
}

TEST(PlacementTest, CutsOnlyWhereAllowedAndLeavesSparesWhenNeeded) {
  auto plan = PlanBalanced(Layout({10, 10, 10, 10}, {true, true, false, false}), Workers(3), NoKv());
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->stages.size(), 2u);
  EXPECT_EQ(plan->stages[1].layer_begin, 1);
  EXPECT_EQ(plan->stages[1].layer_end, 4);
  bool spare_noted = false;
  for (const auto& n : plan->notes) spare_noted |= n.find("w2 gets no layers") != std::string::npos;
  EXPECT_TRUE(spare_noted);
}

TEST(PlacementTest, EveryWorkerGetsALayerWhenPossible) {
  auto plan = PlanBalanced(Layout({1000, 1, 1, 1}), Workers(4), NoKv());
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->stages.size(), 4u);
  for (const auto& s : plan->stages) EXPECT_EQ(s.layer_end - s.layer_begin, 1);
}

TEST(PlacementTest, HeterogeneousMemoryGivesBiggerWorkersMore) {
  std::vector<WorkerSlot> w = {{"small", 100}, {"big", 300}};
  auto plan = PlanBalanced(Layout({10, 10, 10, 10, 10, 10, 10, 10}), w, NoKv());
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->stages[0].layer_end, 2);
}

TEST(PlacementTest, OverrideIsParsedAndChecked) {
  ModelLayout m = Layout({10, 10, 10, 10}, {true, true, false, true});
  auto ok = PlanOverride(m, Workers(2), NoKv(), "0-0:w1,1-3:w0");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->stages[0].worker, 1);
  EXPECT_EQ(ok->stages[1].layer_begin, 1);
  auto by_index = PlanOverride(m, Workers(2), NoKv(), "0-2:#0,3-3:#1");
  EXPECT_TRUE(by_index.ok()) << by_index.status();
  for (const char* bad : {"0-1:w0,2-3:w1",  // cut before a shared layer
                          "0-1:w0",         // does not cover every layer
                          "0-1:w0,3-3:w1",  // gap
                          "0-1:w9,2-3:w1",  // unknown worker
                          "0-0:w0,1-3:w0",  // worker twice
                          "0-7:w0",         // beyond the model
                          "zero:w0", ""}) {
    auto p = PlanOverride(m, Workers(2), NoKv(), bad);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(PlacementTest, SyntheticLayoutIsACheckpointsLayoutInBf16) {
  // A DeepSeek-V3.2-shaped config (MLA, DSA indexer, dense and MoE layers,
  // shared experts): the layout computed from the config alone must equal
  // the one read from a checkpoint written for it (f32 there, so half).
  const std::string config = R"({
    "model_type": "deepseek_v32", "vocab_size": 61, "hidden_size": 32, "intermediate_size": 48,
    "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 2,
    "num_key_value_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8, "v_head_dim": 8, "n_routed_experts": 4, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
    "index_n_heads": 2, "index_head_dim": 16, "index_topk": 8, "max_position_embeddings": 128
  })";
  const std::string dir = MakeScratchDir("synthetic_layout_");
  ASSERT_TRUE(WriteRandomModel(dir, config).ok());
  auto read = ReadModelLayout(dir, KvDtype::kFp8);
  auto cfg = ParseModelConfig(config);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const ModelLayout syn = SyntheticModelLayout(*cfg, KvDtype::kFp8);
  ASSERT_EQ(syn.num_layers, read->num_layers);
  for (int l = 0; l < syn.num_layers; ++l) {
    EXPECT_EQ(2 * syn.layer_weight_bytes[l], read->layer_weight_bytes[l]) << "layer " << l;
    EXPECT_EQ(syn.kv_bytes_per_token[l], read->kv_bytes_per_token[l]) << "layer " << l;
  }
  EXPECT_EQ(2 * syn.embed_bytes, read->embed_bytes);
  EXPECT_EQ(2 * syn.head_bytes, read->head_bytes);
  EXPECT_EQ(syn.can_cut_before, read->can_cut_before);
  EXPECT_GT(syn.layer_weight_bytes[2], syn.layer_weight_bytes[0]);  // MoE above dense here
}

TEST(PlacementTest, AFixedKvPoolReplacesTheEstimate) {
  // Two equal layers; 100 KV bytes per token per layer estimated for 4
  // sessions x 10 tokens = 4000 per layer. Worker w0 reserves a fixed pool
  // (a GPU worker's --gpu-kv-bytes), w1 uses the estimate.
  const ModelLayout m = Layout({1000, 1000});
  PlacementOptions o;
  o.max_sessions = 4;
  o.max_context = 10;
  std::vector<WorkerSlot> w = Workers(2);
  w[0].kv_pool_bytes = 777;
  auto plan = PlanBalanced(m, w, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 2u);
  EXPECT_EQ(plan->stages[0].kv_bytes, 777u);
  EXPECT_EQ(plan->stages[1].kv_bytes, 4000u);
  // The pool counts against the worker's memory: a GPU with room for the
  // weights but not for its pool gets a warning.
  w[0].free_bytes = 1500;
  w[1].free_bytes = 1u << 20;
  auto tight = PlanOverride(m, w, o, "0-0:w0,1-1:w1");
  ASSERT_TRUE(tight.ok()) << tight.status();
  bool warned = false;
  for (const std::string& n : tight->notes) warned |= n.find("warning: stage on w0") != std::string::npos;
  EXPECT_TRUE(warned);
}

TEST(PlacementTest, RejectsNoWorkers) {
  EXPECT_EQ(PlanBalanced(Layout({1}), {}, NoKv()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
// DeepSeek-V4 (docs/service.md, "DeepSeek-V4"): every layer is a cut point,
// DeepSeek's own tensor names count like transformers', and the KV budget is
// the f32 growth of a ratio-4 layer (head_dim + index_head_dim bytes per
// token). Expected bytes are the tensor sizes given, summed by hand.
TEST(PlacementTest, DeepseekV4LayersAreWholeUnitsUnderEitherNaming) {
  auto cfg = ParseModelConfig(R"({"model_type": "deepseek_v4", "vocab_size": 64, "hidden_size": 16,
    "num_hidden_layers": 3, "num_attention_heads": 2, "head_dim": 32, "index_head_dim": 8, "hc_mult": 4,
    "eos_token_id": 1, "bos_token_id": 0})");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->family, ModelFamily::kDeepseekV4);
  EXPECT_EQ(cfg->stream_width(), 64);
  const ModelLayout m = LayoutFromTensors(*cfg, KvDtype::kF32,
                                          {{"embed.weight", 100},
                                           {"layers.0.attn.wkv.weight", 10},
                                           {"model.layers.1.attn.wkv.weight", 20},
                                           {"layers.2.ffn.gate.weight", 30},
                                           {"layers.2.attn.compressor.ape", 5},
                                           {"head.weight", 7},
                                           {"norm.weight", 1},
                                           {"hc_head_fn", 2},
                                           {"mtp.0.emb.weight", 1000}});
  EXPECT_EQ(m.embed_bytes, 100u);
  EXPECT_EQ(m.head_bytes, 10u);
  EXPECT_EQ(m.layer_weight_bytes, (std::vector<uint64_t>{10, 20, 35}));
  EXPECT_EQ(m.can_cut_before, (std::vector<bool>{true, true, true}));
  EXPECT_EQ(m.kv_bytes_per_token, (std::vector<uint64_t>{40, 40, 40}));
}

}  // namespace strata::coordinator
