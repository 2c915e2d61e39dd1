// GpuEngine against the CPU engine (model/engine.h), both with fp8 KV and
// fp8 indexer keys: on every transformers fixture (tests/data/models) the
// f32-GEMM test mode gives logits within 1e-3 * max|ref|, the same DSA
// selections and the same cache codes (up to rounding-boundary flips); the
// bf16 production mode agrees on the top-1 token of the trained demo model;
// DeepSeek-shaped random models exercise the tuned kernels. Also: batch
// invariance and prefill == decode bit for bit, the KV page budget
// (RESOURCE_EXHAUSTED leaves the sequence unchanged), bad input, and greedy
// tokens chosen on the device as the CPU Sampler chooses them.
// Without a CUDA device only the GpuEngineHostTest cases run (the binary
// exits 77 for the others: kernels/cuda/gpu_test_main.cc).
#include "model/gpu/gpu_engine.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/testing/scratch_dir.h"
#include "common/testing/test_seed.h"
#include "gtest/gtest.h"
#include "model/engine.h"
#include "model/random_model.h"
#include "model/sampler.h"
#include "kernels/cuda/layer_ops.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

namespace fs = std::filesystem;

// The fixtures of this source tree, or of the current directory when the
// binary runs on another machine from a copy of the tree's root.
// The fixtures' folder: in the source tree, or under the working directory
// (a GPU machine running binaries built elsewhere).
fs::path FixtureRoot() {
  fs::path root = fs::path(STRATA_SOURCE_DIR) / "tests" / "data" / "models";
  if (!fs::exists(root)) root = fs::current_path() / "tests" / "data" / "models";
  return root;
}

std::vector<std::string> FixtureDirs() {
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(FixtureRoot())) {
    // The MLA families; DeepSeek-V4 has an engine of its own (model/v4).
    if (!fs::exists(e.path() / "reference.json") || e.path().filename().string().rfind("deepseek_v4", 0) == 0) {
      continue;
    }
    dirs.push_back(e.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// The "tokens" array of a JSON file (a fixture's reference.json, the demo's
// held-out text).
std::vector<int> TokensOf(const std::string& json_path) {
  std::ifstream in(json_path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str())["tokens"].get<std::vector<int>>();
}

int Argmax(const float* v, int n) { return static_cast<int>(std::max_element(v, v + n) - v); }

float MaxAbs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// The CPU engine's logits for `tokens`: a prefill of the first `split`
// tokens, then one token per step; with the selections of every step.
struct CpuRun {
  std::vector<float> logits;  // [T][V]
  std::vector<std::vector<std::vector<int32_t>>> selections;  // [layer][position] = sorted positions
  std::vector<LayerKv> kv;    // the cache after the run
};

CpuRun RunCpu(const std::string& dir, const std::vector<int>& tokens, int split) {
  EngineOptions opt;
  opt.kv_dtype = KvDtype::kFp8;
  opt.fp8_indexer_keys = true;
  opt.num_threads = 1;
  opt.record_selections = true;
  auto engine = Engine::Load(dir, opt);
  EXPECT_TRUE(engine.ok()) << engine.status();
  CpuRun run;
  auto seq = (*engine)->NewSequence();
  const int L = (*engine)->config().num_layers;
  run.selections.resize(L);
  auto step = [&](absl::Span<const int> toks) {
    std::vector<float> lg;
    SeqChunk ch{seq.get(), toks};
    EXPECT_TRUE((*engine)->Forward({&ch, 1}, true, &lg).ok());
    run.logits.insert(run.logits.end(), lg.begin(), lg.end());
    const auto& sel = (*engine)->last_selections();
    for (int l = 0; l < L; ++l) {
      for (size_t r = 0; r < toks.size(); ++r) {
        run.selections[l].push_back(sel[l].empty() ? std::vector<int32_t>{} : sel[l][r]);
      }
    }
  };
  step(absl::MakeConstSpan(tokens).subspan(0, split));
  for (size_t t = split; t < tokens.size(); ++t) step(absl::MakeConstSpan(tokens).subspan(t, 1));
  for (int l = 0; l < L; ++l) run.kv.push_back(seq->layer(l));
  return run;
}

struct GpuRun {
  std::vector<float> logits;
  std::vector<std::vector<std::vector<int>>> selections;  // [layer][position] = valid entries, increasing
  std::vector<std::vector<uint8_t>> kv_rows;  // [layer] v2 rows of every position
};

GpuRun RunGpu(GpuEngine* engine, const std::vector<int>& tokens, int split) {
  GpuRun run;
  auto seq = engine->NewSequence();
  EXPECT_TRUE(seq.ok()) << seq.status();
  const ModelConfig& c = engine->config();
  run.selections.resize(c.num_layers);
  auto step = [&](absl::Span<const int> toks) {
    std::vector<float> lg;
    GpuChunk ch{seq->get(), toks};
    const absl::Status s = engine->Forward({&ch, 1}, true, &lg);
    EXPECT_TRUE(s.ok()) << s;
    run.logits.insert(run.logits.end(), lg.begin(), lg.end());
    const auto& sel = engine->last_selections();
    for (int l = 0; l < c.num_layers; ++l) {
      for (size_t r = 0; r < toks.size(); ++r) {
        std::vector<int> v;
        if (l < static_cast<int>(sel.size()) && !sel[l].empty()) {
          for (int j = 0; j < c.index_topk; ++j) {
            const int p = sel[l][r * c.index_topk + j];
            if (p >= 0) v.push_back(p);
          }
        }
        run.selections[l].push_back(v);
      }
    }
  };
  step(absl::MakeConstSpan(tokens).subspan(0, split));
  for (size_t t = split; t < tokens.size(); ++t) step(absl::MakeConstSpan(tokens).subspan(t, 1));
  run.kv_rows.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const absl::Status s = engine->ReadKvRows(**seq, l, 0, static_cast<int64_t>(tokens.size()), &run.kv_rows[l]);
    EXPECT_TRUE(s.ok()) << s;
  }
  return run;
}

// Cache codes that differ between the engines, and the worst relative
// scale difference. A code may flip where its input sits on an fp8
// rounding midpoint and the engines' inputs differ in the last bits.
struct CodeDiff {
  int64_t codes = 0, differing = 0;
  double worst_scale_rel = 0;
  int64_t first_position = INT64_MAX;  // earliest position with a differing code
  bool first_are_one_ulp = true;       // the codes differing there are neighbours
};

CodeDiff CompareCaches(const CpuRun& cpu, const GpuRun& gpu, int L, int R, size_t layers = SIZE_MAX) {
  CodeDiff d;
  const size_t row = L + 4 + R + 4;
  for (size_t l = 0; l < std::min(layers, cpu.kv.size()); ++l) {
    const LayerKv& k = cpu.kv[l];
    const size_t T = k.c_scale.size();
    EXPECT_EQ(gpu.kv_rows[l].size(), T * row);
    for (size_t t = 0; t < T && (t + 1) * row <= gpu.kv_rows[l].size(); ++t) {
      const uint8_t* g = &gpu.kv_rows[l][t * row];
      for (int i = 0; i < L + R; ++i) {
        const uint8_t a = i < L ? k.c_codes[t * L + i] : k.r_codes[t * R + i - L];
        const uint8_t b = i < L ? g[i] : g[L + 4 + i - L];
        if (a == b) continue;
        ++d.differing;
        std::printf("  layer %zu position %zu element %d: cpu code 0x%02x gpu 0x%02x\n", l, t, i, a, b);
        const bool one_ulp = (a & 0x80) == (b & 0x80) && std::abs((a & 0x7F) - (b & 0x7F)) == 1;
        if (static_cast<int64_t>(t) < d.first_position) {
          d.first_position = static_cast<int64_t>(t);
          d.first_are_one_ulp = one_ulp;
        } else if (static_cast<int64_t>(t) == d.first_position) {
          d.first_are_one_ulp &= one_ulp;
        }
      }
      float cs, rs;
      std::memcpy(&cs, g + L, 4);
      std::memcpy(&rs, g + L + 4 + R, 4);
      const double rel = std::max(std::fabs(cs - k.c_scale[t]) / double{k.c_scale[t]},
                                  std::fabs(rs - k.r_scale[t]) / double{k.r_scale[t]});
      if (rel > 1e-5) std::printf("  layer %zu position %zu: scale rel diff %.3g\n", l, t, rel);
      d.worst_scale_rel = std::max(d.worst_scale_rel, rel);
      d.codes += L + R;
    }
  }
  return d;
}

// Largest |gpu - cpu| logit difference over the positions before
// `first_flip` and over the rest (see CodeDiff); NaN logits fail the test.
struct SplitError {
  float before = 0, after = 0;
};

SplitError LogitErrorAroundFlip(const std::vector<float>& cpu, const std::vector<float>& gpu, int V, int T,
                                int64_t first_flip) {
  SplitError e;
  for (int t = 0; t < T; ++t) {
    float d = 0;
    for (int v = 0; v < V; ++v) {
      EXPECT_FALSE(std::isnan(gpu[static_cast<size_t>(t) * V + v])) << "position " << t;
      d = std::max(d, std::fabs(gpu[static_cast<size_t>(t) * V + v] - cpu[static_cast<size_t>(t) * V + v]));
    }
    float& into = t < first_flip ? e.before : e.after;
    into = std::max(into, d);
  }
  return e;
}

class GpuFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuFixtureTest, F32ModeMatchesCpuEngine) {
  const std::string dir = GetParam();
  const std::vector<int> tokens = TokensOf(dir + "/reference.json");
  const int split = static_cast<int>(tokens.size()) / 2;
  const CpuRun cpu = RunCpu(dir, tokens, split);
  GpuEngineOptions opt;
  opt.f32_gemm = true;
  opt.kv_cache_bytes = 64 << 20;
  opt.record_selections = true;
  auto engine = GpuEngine::Load(dir, opt);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const GpuRun gpu = RunGpu(engine->get(), tokens, split);
  ASSERT_EQ(gpu.logits.size(), cpu.logits.size());
  const int V = (*engine)->config().vocab_size;
  const int T = static_cast<int>(tokens.size());
  // A cache code can differ where the quantiser's input sits on an fp8
  // rounding midpoint and the engines' inputs differ in the last bits; that
  // one-ulp flip then moves every later position a little. The 1e-3 bound
  // holds up to the first flip; later positions get 1e-2.
  const ModelConfig& c = (*engine)->config();
  const CodeDiff cd = CompareCaches(cpu, gpu, c.kv_lora_rank, c.qk_rope_head_dim);
  std::printf("%s: cache codes differing %lld of %lld, worst scale rel diff %.3g\n", fs::path(dir).filename().c_str(),
              static_cast<long long>(cd.differing), static_cast<long long>(cd.codes), cd.worst_scale_rel);
  EXPECT_LE(cd.differing, cd.codes / 1000);
  EXPECT_TRUE(cd.first_are_one_ulp) << "the first differing codes are not rounding-boundary neighbours";
  const float max_ref = MaxAbs(cpu.logits);
  const SplitError err = LogitErrorAroundFlip(cpu.logits, gpu.logits, V, T, cd.first_position);
  const float worst = err.before, worst_after = err.after;
  EXPECT_LE(worst, 1e-3f * max_ref) << dir;
  EXPECT_LE(worst_after, 1e-2f * max_ref) << dir;
  std::printf("%s: f32 mode max |gpu - cpu| / max|cpu| = %.3g%s\n", fs::path(dir).filename().c_str(),
              worst / max_ref,
              cd.first_position < T
                  ? (" before position " + std::to_string(cd.first_position) + ", " +
                     std::to_string(worst_after / max_ref) + " from there (one-ulp fp8 flip)").c_str()
                  : "");
  int compared = 0;
  for (size_t l = 0; l < cpu.selections.size(); ++l) {
    for (int t = 0; t < T; ++t) {
      const auto& a = cpu.selections[l][t];
      if (a.empty()) continue;
      const std::vector<int> want(a.begin(), a.end());
      EXPECT_EQ(gpu.selections[l][t], want) << "layer " << l << " position " << t;
      ++compared;
    }
  }
  if (c.has_dsa) {
    EXPECT_GT(compared, 0);
  }
}

TEST_P(GpuFixtureTest, Bf16ModeTopTokenAgreement) {
  const std::string dir = GetParam();
  const std::vector<int> tokens = TokensOf(dir + "/reference.json");
  const int split = static_cast<int>(tokens.size()) / 2;
  const CpuRun cpu = RunCpu(dir, tokens, split);
  GpuEngineOptions opt;
  opt.kv_cache_bytes = 64 << 20;
  auto engine = GpuEngine::Load(dir, opt);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const GpuRun gpu = RunGpu(engine->get(), tokens, split);
  const int V = (*engine)->config().vocab_size;
  const int T = static_cast<int>(tokens.size());
  int agree = 0;
  float worst = 0;
  for (int t = 0; t < T; ++t) {
    agree += Argmax(&gpu.logits[t * V], V) == Argmax(&cpu.logits[t * V], V);
    for (int v = 0; v < V; ++v) worst = std::max(worst, std::fabs(gpu.logits[t * V + v] - cpu.logits[t * V + v]));
  }
  std::printf("%s: bf16 mode top-1 agreement %d/%d, max |gpu - cpu| / max|cpu| = %.3g\n",
              fs::path(dir).filename().c_str(), agree, T, worst / MaxAbs(cpu.logits));
  // These random models route and select on gaps of ~1e-3: rounding their
  // weights to bf16 on the CPU alone leaves 22-39 of 40 top-1 tokens
  // (docs/gpu-engine.md), so the 99 % criterion is checked on the trained
  // demo model below; here only a broken bf16 path (near-random tokens) fails.
  EXPECT_GE(agree, T / 2) << dir;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuFixtureTest, ::testing::ValuesIn(FixtureDirs()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return fs::path(info.param).filename().string();
                         });

// The fp8 checkpoint fixture with its fp8 weights kept as stored (f32 for
// the rest, the test mode): the fixture's widths (320, 64, 32, 16) are not
// multiples of 128, so every fp8 layer runs the fp8 GEMV on the f32 inputs
// and the exact decoded weights, eight rows at a time (the library path, for
// widths of whole 128-column blocks, is checked by fp8_gemm_cuda_test), and
// the logits meet the f32 mode's bounds against the CPU engine (which decodes
// the weights to f32), for a prefill of 8 and of 39 rows; the weights take
// fewer bytes.
TEST(GpuEngineTest, Fp8WeightsStayFp8AndMatchTheCpuEngine) {
  const std::string dir = (FixtureRoot() / "deepseek_v3_fp8").string();
  const std::vector<int> tokens = TokensOf(dir + "/reference.json");
  const int T = static_cast<int>(tokens.size());
  GpuEngineOptions opt;
  opt.f32_gemm = true;
  opt.kv_cache_bytes = 64 << 20;
  auto decoded = GpuEngine::Load(dir, opt);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  opt.fp8_weights = true;
  auto engine = GpuEngine::Load(dir, opt);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::printf("fp8 fixture: weights %llu bytes with fp8 kept, %llu decoded to f32\n",
              static_cast<unsigned long long>((*engine)->weight_bytes()),
              static_cast<unsigned long long>((*decoded)->weight_bytes()));
  EXPECT_LT((*engine)->weight_bytes(), (*decoded)->weight_bytes());
  const int V = (*engine)->config().vocab_size;
  for (int split : {8, T - 1}) {
    const CpuRun cpu = RunCpu(dir, tokens, split);
    const GpuRun gpu = RunGpu(engine->get(), tokens, split);
    ASSERT_EQ(gpu.logits.size(), cpu.logits.size());
    const ModelConfig& c = (*engine)->config();
    const CodeDiff cd = CompareCaches(cpu, gpu, c.kv_lora_rank, c.qk_rope_head_dim);
    EXPECT_LE(cd.differing, cd.codes / 1000);
    const float max_ref = MaxAbs(cpu.logits);
    const SplitError err = LogitErrorAroundFlip(cpu.logits, gpu.logits, V, T, cd.first_position);
    std::printf("fp8 weights, a prefill of %d rows: max |gpu - cpu| / max|cpu| = %.3g (%.3g after position %lld)\n",
                split, err.before / max_ref, err.after / max_ref, static_cast<long long>(cd.first_position));
    EXPECT_LE(err.before, 1e-3f * max_ref) << "prefill " << split;
    EXPECT_LE(err.after, 1e-2f * max_ref) << "prefill " << split;
  }
}

// A tiny model with DeepSeek's attention shapes (latent 512, rope 64, index
// dim 128, 8 index heads) so the tuned decode and indexer kernels run. Dense
// MLPs only: a random router flips experts under the tuned kernels' bf16
// rounding, which would hide what these tests measure (the fixtures cover MoE).
// (dense_layers: the first layers with a dense MLP, the rest MoE; -1 = all)
std::string DeepseekShapedModel(int topk, int layers = 3, int dense_layers = -1) {
  if (dense_layers < 0) dense_layers = layers;
  // One scratch root per test process: the models are made once and shared
  // by its tests, never taken from an earlier run.
  static const std::string root = MakeScratchDir("gpu_engine_test_");
  const fs::path d = fs::path(root) /
                     ("gpu_engine_test_ds_shaped_" + std::to_string(topk) + "_" + std::to_string(layers) + "_" +
                      std::to_string(dense_layers));
  if (fs::exists(d / "model.safetensors")) return d.string();
  fs::create_directories(d);
  std::string config = R"({
    "model_type": "deepseek_v32", "architectures": ["DeepseekV32ForCausalLM"],
    "vocab_size": 320, "hidden_size": 256, "intermediate_size": 384, "moe_intermediate_size": 256,
    "num_hidden_layers": LAYERS, "num_attention_heads": 16, "num_key_value_heads": 16,
    "q_lora_rank": 96, "kv_lora_rank": 512, "qk_nope_head_dim": 32, "qk_rope_head_dim": 64,
    "v_head_dim": 32, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
    "first_k_dense_replace": DENSE, "moe_layer_freq": 1, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": null,
    "index_n_heads": 8, "index_head_dim": 128, "index_topk": TOPK,
    "attention_bias": false, "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1
  })";
  config.replace(config.find("TOPK"), 4, std::to_string(topk));
  config.replace(config.find("DENSE"), 5, std::to_string(dense_layers));
  for (size_t at; (at = config.find("LAYERS")) != std::string::npos;) config.replace(at, 6, std::to_string(layers));
  const absl::Status s = WriteRandomModel(d.string(), config, {});
  EXPECT_TRUE(s.ok()) << s;
  return d.string();
}

std::vector<int> RandomTokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> t(n);
  for (int& x : t) x = static_cast<int>(rng() % vocab);
  return t;
}

// With index_topk above the length every position is selected, so the
// logits depend on the attention kernels alone: the generic kernels match
// the CPU to f32 rounding, the tuned ones (bf16 tensor cores on queries
// and probabilities, docs/gpu-kernels.md) to the kernels' own criterion.
// One layer: in a random multi-layer model the tuned kernels' 0.3 %
// rounding is amplified from layer to layer (to 20-50 % of max|logit| by
// layer 3 for some seeds, measured), which says nothing about the kernels.
TEST(GpuEngineTest, TunedKernelsMatchCpuEngine) {
  const std::string dir = DeepseekShapedModel(256, 1);
  const uint64_t seed = strata::testing::TestSeed();
  const std::vector<int> tokens = RandomTokens(150, 320, seed);
  const CpuRun cpu = RunCpu(dir, tokens, 100);
  for (bool tuned : {true, false}) {
    GpuEngineOptions opt;
    opt.f32_gemm = true;
    opt.tuned_kernels = tuned;
    opt.kv_cache_bytes = 256 << 20;
    auto engine = GpuEngine::Load(dir, opt);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const GpuRun gpu = RunGpu(engine->get(), tokens, 100);
    ASSERT_EQ(gpu.logits.size(), cpu.logits.size());
    double dot = 0, na = 0, nb = 0;
    for (size_t i = 0; i < cpu.logits.size(); ++i) {
      dot += double{gpu.logits[i]} * cpu.logits[i];
      na += double{gpu.logits[i]} * gpu.logits[i];
      nb += double{cpu.logits[i]} * cpu.logits[i];
    }
    const double cosine = dot / std::sqrt(na * nb);
    // The generic kernels' 1e-3 holds up to the first one-ulp fp8 code flip
    // (as in F32ModeMatchesCpuEngine); from there 1e-2. The tuned kernels
    // (bf16 operands) get 2e-2 everywhere.
    const CodeDiff cd = CompareCaches(cpu, gpu, 512, 64);
    EXPECT_LE(cd.differing, cd.codes / 1000);
    const int V = (*engine)->config().vocab_size, T = static_cast<int>(tokens.size());
    const SplitError err = LogitErrorAroundFlip(cpu.logits, gpu.logits, V, T, tuned ? T : cd.first_position);
    const float max_ref = MaxAbs(cpu.logits);
    std::printf("DeepSeek-shaped, %s kernels: max |gpu - cpu| / max|cpu| = %.3g before the first code flip "
                "(position %lld), %.3g after, cosine %.7f (seed %llu)\n",
                tuned ? "tuned" : "generic", err.before / max_ref, static_cast<long long>(cd.first_position),
                err.after / max_ref, cosine, static_cast<unsigned long long>(seed));
    EXPECT_LE(err.before, (tuned ? 2e-2f : 1e-3f) * max_ref) << "seed " << seed;
    EXPECT_LE(err.after, 1e-2f * max_ref) << "seed " << seed;
    if (!tuned) EXPECT_TRUE(cd.first_are_one_ulp) << "the first differing codes are not neighbours; seed " << seed;
    EXPECT_GE(cosine, tuned ? 0.9995 : 0.999999) << "seed " << seed;
  }
}

// With top-64 of up to 150 positions the selection matters. The engines'
// scores differ in the last bits (generic kernel) or by the e4m3 pairs the
// tuned kernel scores the queries as, and random weights leave near-ties,
// so a selection may swap a boundary position; a wrong key mapping would
// change most of them.
TEST(GpuEngineTest, TunedIndexerSelectsAsCpuEngine) {
  const std::string dir = DeepseekShapedModel(64);
  const uint64_t seed = strata::testing::TestSeed();
  const std::vector<int> tokens = RandomTokens(150, 320, seed);
  const CpuRun cpu = RunCpu(dir, tokens, 100);
  for (bool tuned : {true, false}) {
    GpuEngineOptions opt;
    opt.f32_gemm = true;
    opt.tuned_kernels = tuned;
    opt.kv_cache_bytes = 256 << 20;
    opt.record_selections = true;
    auto engine = GpuEngine::Load(dir, opt);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const GpuRun gpu = RunGpu(engine->get(), tokens, 100);
    int64_t same = 0, compared = 0, common = 0, total = 0;
    for (size_t l = 0; l < cpu.selections.size(); ++l) {
      for (size_t t = 0; t < cpu.selections[l].size(); ++t) {
        const auto& a = cpu.selections[l][t];
        if (a.empty()) continue;
        const std::vector<int> want(a.begin(), a.end());
        const std::vector<int>& got = gpu.selections[l][t];
        ++compared;
        same += got == want;
        std::vector<int> both;
        std::set_intersection(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(both));
        common += static_cast<int64_t>(both.size());
        total += static_cast<int64_t>(want.size());
      }
    }
    std::printf("DeepSeek-shaped top-64, %s kernels: identical selections %lld of %lld, positions in common %.4f "
                "(seed %llu)\n",
                tuned ? "tuned" : "generic", static_cast<long long>(same), static_cast<long long>(compared),
                static_cast<double>(common) / total, static_cast<unsigned long long>(seed));
    ASSERT_GT(compared, 0);
    EXPECT_GE(static_cast<double>(common) / total, tuned ? 0.98 : 0.995) << "seed " << seed;
  }
}

// The production mode on the trained demo model: bf16 weights (the
// checkpoint's own) and bf16 GEMMs against the CPU engine in f32, on the
// 512-token held-out text (256 tokens of prefill, then 256 decode steps).
// By default the GEMMs take their f32 inputs as hi + lo bf16 terms
// (measured 511 of 512 top-1 tokens; the other a near-tie, margin 0.005):
// asserted >= 99 % top-1 agreement (the issue's bar) and the mean NLL within
// 0.5 %. With split_bf16_max_rows = 0 (--gpu-gemm bf16-rounded) the prefill's
// inputs are rounded to bf16 (the decode steps, one row each, take the
// small-step kernels on f32 inputs either way; measured 504 of 512):
// asserted >= 99 % where the f32 top-2 margin is at least 0.05, and the NLL
// bound.
TEST(GpuEngineTest, Bf16ModeAgreesWithCpuOnDemoModel) {
  fs::path root = fs::path(STRATA_SOURCE_DIR);
  if (!fs::exists(root / "models" / "demo")) root = fs::current_path();
  const std::string dir = (root / "models" / "demo").string();
  const std::vector<int> tokens = TokensOf((root / "tests" / "data" / "demo_heldout.json").string());
  const int split = 256;
  const CpuRun cpu = RunCpu(dir, tokens, split);
  for (const int split_rows : {GpuEngineOptions().split_bf16_max_rows, 0}) {
    SCOPED_TRACE(::testing::Message() << "split_bf16_max_rows " << split_rows);
    GpuEngineOptions opt;
    opt.kv_cache_bytes = 64 << 20;
    opt.split_bf16_max_rows = split_rows;
    auto engine = GpuEngine::Load(dir, opt);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const GpuRun gpu = RunGpu(engine->get(), tokens, split);
    const int V = (*engine)->config().vocab_size;
    const int T = static_cast<int>(tokens.size());
    int agree = 0, agree_prefill = 0, decisive = 0, decisive_agree = 0;
    double nll_gpu = 0, nll_cpu = 0;
    for (int t = 0; t < T; ++t) {
      const bool same = Argmax(&gpu.logits[t * V], V) == Argmax(&cpu.logits[t * V], V);
      agree += same;
      agree_prefill += same && t < split;
      std::vector<float> top(cpu.logits.begin() + t * V, cpu.logits.begin() + (t + 1) * V);
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
      if (top[0] - top[1] >= 0.05f) {
        ++decisive;
        decisive_agree += same;
      }
      if (t + 1 < T) {
        for (int pass = 0; pass < 2; ++pass) {
          const float* lg = pass ? &cpu.logits[t * V] : &gpu.logits[t * V];
          const float m = *std::max_element(lg, lg + V);
          double z = 0;
          for (int v = 0; v < V; ++v) z += std::exp(double{lg[v]} - m);
          (pass ? nll_cpu : nll_gpu) += std::log(z) + m - lg[tokens[t + 1]];
        }
      }
    }
    std::printf("demo model, bf16 mode, split_bf16_max_rows %d: top-1 agreement %d/%d (prefill %d/%d, decode "
                "%d/%d; %d/%d where the f32 margin >= 0.05), mean NLL %.6f (CPU f32 %.6f)\n",
                split_rows, agree, T, agree_prefill, split, agree - agree_prefill, T - split, decisive_agree,
                decisive, nll_gpu / (T - 1), nll_cpu / (T - 1));
    for (int t = 0; t < T; ++t) {
      const float* c = &cpu.logits[t * V];
      const int a = Argmax(c, V), b = Argmax(&gpu.logits[t * V], V);
      if (a != b) std::printf("  position %d: cpu top %d (%.4f), gpu top %d (cpu logit %.4f)\n", t, a, c[a], b, c[b]);
    }
    if (split_rows > 0) {
      EXPECT_GE(agree, static_cast<int>(std::ceil(0.99 * T)));
    } else {
      EXPECT_GE(decisive_agree, static_cast<int>(std::ceil(0.99 * decisive)));
      EXPECT_GE(decisive, T * 9 / 10);
    }
    EXPECT_LE(std::fabs(nll_gpu - nll_cpu) / nll_cpu, 0.005);
  }
}

// Logits of `a` alone and batched with `b`, with prefill and decode steps.
TEST(GpuEngineTest, BatchInvariantAndPrefillEqualsDecode) {
  for (const std::string& dir : {FixtureDirs()[0], DeepseekShapedModel(64)}) {
    GpuEngineOptions opt;
    opt.batch_invariant_gemm = true;
    opt.kv_cache_bytes = 128 << 20;
    auto engine = GpuEngine::Load(dir, opt);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const int V = (*engine)->config().vocab_size;
    const std::vector<int> a = RandomTokens(150, V, 7), b = RandomTokens(29, V, 8);  // 150: three attention blocks
    // a alone, one prefill.
    std::vector<float> alone;
    {
      auto s = (*engine)->NewSequence();
      GpuChunk ch{s->get(), a};
      const absl::Status st = (*engine)->Forward({&ch, 1}, true, &alone);
      ASSERT_TRUE(st.ok()) << st;
    }
    // a token by token, next to b in chunks of 3.
    std::vector<float> mixed;
    auto sa = (*engine)->NewSequence();
    auto sb = (*engine)->NewSequence();
    size_t bi = 0;
    for (size_t t = 0; t < a.size(); ++t) {
      std::vector<GpuChunk> chunks{{sa->get(), absl::MakeConstSpan(a).subspan(t, 1)}};
      if (bi < b.size()) {
        const size_t n = std::min<size_t>(3, b.size() - bi);
        chunks.push_back({sb->get(), absl::MakeConstSpan(b).subspan(bi, n)});
        bi += n;
      }
      std::vector<float> lg;
      const absl::Status st = (*engine)->Forward(chunks, true, &lg);
      ASSERT_TRUE(st.ok()) << st;
      mixed.insert(mixed.end(), lg.begin(), lg.begin() + V);
    }
    ASSERT_EQ(mixed.size(), alone.size());
    EXPECT_EQ(std::memcmp(mixed.data(), alone.data(), alone.size() * sizeof(float)), 0) << dir;
  }
}

// Save (ReadKvRows, ReadIndexKeys) and resume (AppendStoredRows) give the
// stored bytes back and the same next logits, bit for bit.
TEST(GpuEngineTest, StoredRowsResumeBitExactly) {
  for (const std::string& dir : {FixtureDirs()[0], FixtureDirs()[1], DeepseekShapedModel(64)}) {
    GpuEngineOptions opt;
    opt.kv_cache_bytes = 128 << 20;
    auto engine = GpuEngine::Load(dir, opt);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const ModelConfig& c = (*engine)->config();
    const std::vector<int> toks = RandomTokens(90, c.vocab_size, 11);
    const int P = 77;
    auto a = (*engine)->NewSequence();
    std::vector<float> la, lb;
    GpuChunk ca{a->get(), absl::MakeConstSpan(toks).subspan(0, P)};
    ASSERT_TRUE((*engine)->Forward({&ca, 1}, false, &la).ok());
    std::vector<std::vector<uint8_t>> rows(c.num_layers);
    std::vector<std::vector<float>> keys(c.num_layers);
    for (int l = 0; l < c.num_layers; ++l) {
      ASSERT_TRUE((*engine)->ReadKvRows(**a, l, 0, P, &rows[l]).ok());
      if (c.layers[l].indexer == IndexerMode::kFull) ASSERT_TRUE((*engine)->ReadIndexKeys(**a, l, 0, P, &keys[l]).ok());
    }
    auto b = (*engine)->NewSequence();
    // Another sequence first, so b's pages are other page ids than a's.
    auto other = (*engine)->NewSequence();
    GpuChunk co{other->get(), absl::MakeConstSpan(toks).subspan(0, 70)};
    ASSERT_TRUE((*engine)->Forward({&co, 1}, false, &lb).ok());
    const absl::Status st = (*engine)->AppendStoredRows(b->get(), P, rows, keys);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ((*b)->num_tokens(), P);
    for (int l = 0; l < c.num_layers; ++l) {
      std::vector<uint8_t> back;
      ASSERT_TRUE((*engine)->ReadKvRows(**b, l, 0, P, &back).ok());
      EXPECT_EQ(back, rows[l]) << dir << " layer " << l;
      if (!keys[l].empty()) {
        std::vector<float> kb;
        ASSERT_TRUE((*engine)->ReadIndexKeys(**b, l, 0, P, &kb).ok());
        EXPECT_EQ(std::memcmp(kb.data(), keys[l].data(), kb.size() * sizeof(float)), 0) << dir << " layer " << l;
      }
    }
    for (int t = P; t < 90; ++t) {
      GpuChunk na{a->get(), absl::MakeConstSpan(toks).subspan(t, 1)};
      GpuChunk nb{b->get(), absl::MakeConstSpan(toks).subspan(t, 1)};
      ASSERT_TRUE((*engine)->Forward({&na, 1}, false, &la).ok());
      ASSERT_TRUE((*engine)->Forward({&nb, 1}, false, &lb).ok());
      ASSERT_EQ(la.size(), lb.size());
      EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << dir << " position " << t;
    }
    // Wrong sizes are refused and change nothing.
    rows[0].pop_back();
    EXPECT_EQ((*engine)->AppendStoredRows(b->get(), P, rows, keys).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*b)->num_tokens(), 90);
  }
}

TEST(GpuEngineTest, FullCacheIsResourceExhaustedAndChangesNothing) {
  const std::string dir = FixtureDirs()[0];
  GpuEngineOptions opt;
  opt.f32_gemm = true;
  // Room for exactly three page ids (64 tokens each, every layer).
  {
    auto probe = GpuEngine::Load(dir, opt);
    ASSERT_TRUE(probe.ok());
    const int64_t per_id = (*probe)->page_id_bytes();
    ASSERT_GT(per_id, 0);
    EXPECT_EQ((*probe)->total_pages(), opt.kv_cache_bytes / per_id);
    opt.kv_cache_bytes = 3 * per_id + per_id / 2;
  }
  auto engine = GpuEngine::Load(dir, opt);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_EQ((*engine)->total_pages(), 3);
  const int V = (*engine)->config().vocab_size;
  const std::vector<int> toks = RandomTokens(130, V, 3);
  auto a = (*engine)->NewSequence();
  auto b = (*engine)->NewSequence();
  std::vector<float> lg;
  GpuChunk ca{a->get(), absl::MakeConstSpan(toks).subspan(0, 65)};  // 2 pages
  ASSERT_TRUE((*engine)->Forward({&ca, 1}, false, &lg).ok());
  GpuChunk cb{b->get(), absl::MakeConstSpan(toks).subspan(0, 64)};  // 1 page
  ASSERT_TRUE((*engine)->Forward({&cb, 1}, false, &lg).ok());
  EXPECT_EQ((*engine)->free_pages(), 0);
  // b needs a second page: none is free.
  GpuChunk cb2{b->get(), absl::MakeConstSpan(toks).subspan(64, 1)};
  const absl::Status full = (*engine)->Forward({&cb2, 1}, false, &lg);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("KV cache is full"), std::string::npos) << full;
  EXPECT_EQ((*b)->num_tokens(), 64);
  // a still has room in its second page; after a is dropped, b continues
  // and gives what a fresh engine gives.
  GpuChunk ca2{a->get(), absl::MakeConstSpan(toks).subspan(65, 1)};
  EXPECT_TRUE((*engine)->Forward({&ca2, 1}, false, &lg).ok());
  a->reset();
  std::vector<float> after;
  ASSERT_TRUE((*engine)->Forward({&cb2, 1}, false, &after).ok());
  GpuEngineOptions big;
  big.f32_gemm = true;
  big.kv_cache_bytes = 64 << 20;
  auto fresh = GpuEngine::Load(dir, big);
  ASSERT_TRUE(fresh.ok());
  auto f = (*fresh)->NewSequence();
  std::vector<float> want;
  GpuChunk cf{f->get(), absl::MakeConstSpan(toks).subspan(0, 64)};
  ASSERT_TRUE((*fresh)->Forward({&cf, 1}, false, &want).ok());
  GpuChunk cf2{f->get(), absl::MakeConstSpan(toks).subspan(64, 1)};
  ASSERT_TRUE((*fresh)->Forward({&cf2, 1}, false, &want).ok());
  ASSERT_EQ(after.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(after[i], want[i], 1e-5f * MaxAbs(want));
}

TEST(GpuEngineTest, BadInputIsInvalidArgument) {
  const std::string dir = FixtureDirs()[0];
  GpuEngineOptions opt;
  opt.kv_cache_bytes = 16 << 20;
  auto engine = GpuEngine::Load(dir, opt);
  ASSERT_TRUE(engine.ok());
  auto s = (*engine)->NewSequence();
  std::vector<float> lg;
  const std::vector<int> bad{1, 2, 100000};
  GpuChunk c{s->get(), bad};
  EXPECT_EQ((*engine)->Forward({&c, 1}, false, &lg).code(), absl::StatusCode::kInvalidArgument);
  GpuChunk empty{s->get(), {}};
  EXPECT_EQ((*engine)->Forward({&empty, 1}, false, &lg).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int> ok{1, 2};
  GpuChunk twice[2] = {{s->get(), ok}, {s->get(), ok}};
  EXPECT_EQ((*engine)->Forward(twice, false, &lg).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->num_tokens(), 0);
  GpuEngineOptions tiny;
  tiny.kv_cache_bytes = 100;
  EXPECT_EQ(GpuEngine::Load(dir, tiny).status().code(), absl::StatusCode::kInvalidArgument);
}

// The layer range is checked against the config before any CUDA call: runs
// without a device.
TEST(GpuEngineHostTest, LoadRefusesAnEmptyOrOutOfRangeLayerRange) {
  const std::string dir = FixtureDirs()[0];
  for (const auto& [begin, end] : {std::pair{3, 2}, std::pair{1, 1}, std::pair{-1, 1}, std::pair{0, 1000}}) {
    GpuEngineOptions range;
    range.layer_begin = begin;
    range.layer_end = end;
    EXPECT_EQ(GpuEngine::Load(dir, range).status().code(), absl::StatusCode::kInvalidArgument)
        << "[" << begin << ", " << end << ")";
  }
}

// The CPU Sampler's greedy choice for one row.
int SamplerGreedy(const float* row, int n) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.seed = 1;
  auto s = Sampler::Create(p, n);
  return (*s)->Sample(absl::Span<const float>(row, n));
}

TEST(GpuEngineTest, ArgmaxRowsFollowsSamplerRules) {
  const int n = 129280;  // DeepSeek's vocabulary
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  std::mt19937_64 rng(strata::testing::TestSeed());
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<std::vector<float>> rows;
  for (int r = 0; r < 4; ++r) {  // fresh random rows
    rows.emplace_back(n);
    for (float& x : rows.back()) x = normal(rng);
  }
  {  // ties at the maximum, far apart: the lowest id wins
    std::vector<float> r(n, -1.0f);
    for (int i : {n - 1, 70000, 513, 40000}) r[i] = 5.0f;
    rows.push_back(r);
  }
  {  // NaN everywhere a value could win, and at 0
    std::vector<float> r(n, 0.5f);
    r[0] = nan;
    r[9] = nan;
    r[12345] = 0.75f;
    r[12346] = nan;
    rows.push_back(r);
  }
  rows.push_back(std::vector<float>(n, -inf));  // nothing above -inf: token 0
  rows.push_back(std::vector<float>(n, nan));
  {  // -inf and NaN only, then one finite value late
    std::vector<float> r(n, -inf);
    for (int i = 0; i < n; i += 7) r[i] = nan;
    r[n - 2] = -1e30f;
    rows.push_back(r);
  }
  {  // +inf ties
    std::vector<float> r(n, 1.0f);
    r[777] = inf;
    r[77] = inf;
    rows.push_back(r);
  }
  const int R = static_cast<int>(rows.size());
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  float* d_x = nullptr;
  int* d_out = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_x), flat.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_out), R * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_x, flat.data(), flat.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cuda::LaunchArgmaxRows(d_x, R, n, d_out, nullptr), cudaSuccess);
  std::vector<int> got(R);
  ASSERT_EQ(cudaMemcpy(got.data(), d_out, R * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d_x);
  cudaFree(d_out);
  for (int r = 0; r < R; ++r) EXPECT_EQ(got[r], SamplerGreedy(rows[r].data(), n)) << "row " << r;
  EXPECT_EQ(got[4], 513);
  EXPECT_EQ(got[6], 0);
  EXPECT_EQ(got[5], 12345);
  EXPECT_EQ(got[9], 77);
}

// A fixture's engine after one stage step over its first `n` reference
// tokens: the hidden rows the last-stage tests turn into logits and tokens.
struct StagedRows {
  std::unique_ptr<GpuEngine> engine;
  std::unique_ptr<GpuSequence> seq;  // (destroyed before the engine)
  std::vector<int> tokens;
  std::vector<float> hidden;
  int rows = 0;
};

StagedRows RunFixtureStage(const std::string& dir, size_t n) {
  StagedRows st;
  GpuEngineOptions opt;
  opt.kv_cache_bytes = 16 << 20;
  auto engine = GpuEngine::Load(dir, opt);
  if (!engine.ok()) {
    ADD_FAILURE() << engine.status();
    return st;
  }
  st.engine = std::move(*engine);
  auto seq = st.engine->NewSequence();
  if (!seq.ok()) {
    ADD_FAILURE() << seq.status();
    return st;
  }
  st.seq = std::move(*seq);
  std::vector<int> tokens = TokensOf((fs::path(dir) / "reference.json").string());
  tokens.resize(std::min(tokens.size(), n));
  st.tokens = tokens;
  GpuChunk c{st.seq.get(), st.tokens};
  const absl::Status run = st.engine->RunStage({&c, 1}, &st.hidden);
  EXPECT_TRUE(run.ok()) << run;
  st.rows = run.ok() ? static_cast<int>(tokens.size()) : 0;
  return st;
}

TEST(GpuEngineTest, GreedyTokensAreTheArgmaxOfTheLogits) {
  for (const std::string& dir : FixtureDirs()) {
    SCOPED_TRACE(dir);
    const StagedRows st = RunFixtureStage(dir, 24);
    ASSERT_GT(st.rows, 0);
    const int rows = st.rows;
    std::vector<float> logits;
    std::vector<int> greedy;
    ASSERT_TRUE(st.engine->Logits(st.hidden.data(), rows, &logits).ok());
    ASSERT_TRUE(st.engine->GreedyTokens(st.hidden.data(), rows, &greedy).ok());
    const int V = st.engine->config().vocab_size;
    ASSERT_EQ(static_cast<int>(greedy.size()), rows);
    for (int r = 0; r < rows; ++r) EXPECT_EQ(greedy[r], SamplerGreedy(&logits[static_cast<size_t>(r) * V], V));
  }
}

// The device sampler through the engine: each row's draw is put in the
// middle of one token's share of the host Sampler's walk (id order without
// truncation, ranking order with top-k), so that token is the only right
// answer. (kernels/cuda/sampling_test.cc checks the kernel itself against
// the Sampler on random draws.)
TEST(GpuEngineTest, SampleTokensDrawWhereTheSamplerWould) {
  const StagedRows st = RunFixtureStage(FixtureDirs().front(), 16);
  ASSERT_GT(st.rows, 0);
  const int rows = st.rows;
  const int V = st.engine->config().vocab_size;
  const std::vector<float>& hidden = st.hidden;
  std::vector<float> logits;
  ASSERT_TRUE(st.engine->Logits(hidden.data(), rows, &logits).ok());

  // Variants: no truncation (id-order walk), top-k 5 (ranking order), and
  // penalties that demote each row's most likely token (the sampler's
  // counts travel in the draw) with three logprobs alternatives, checked
  // against a twin host Sampler's report (the target is then the penalised
  // argmax: rank 1).
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    const int top_k = variant == 1 ? 5 : 0;
    std::vector<SampleDraw> draws(rows);
    std::vector<int> want(rows);
    std::vector<SampleLogprobs> want_lp(rows);
    for (int r = 0; r < rows; ++r) {
      SamplingParams sp;
      sp.top_k = top_k;
      sp.temperature = 0.8f;
      const absl::Span<const float> row(&logits[static_cast<size_t>(r) * V], V);
      if (variant == 2) {
        sp.repetition_penalty = 1.2f;
        sp.presence_penalty = 2.0f;
        sp.logprobs = 3;
      }
      auto sampler = Sampler::Create(sp, V);
      auto twin = Sampler::Create(sp, V);
      ASSERT_TRUE(sampler.ok() && twin.ok());
      if (variant == 2) {
        for (Sampler* s : {sampler->get(), twin->get()}) {
          s->ObservePrompt(st.tokens);
          s->Observe(static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin()), false);
        }
        (*twin)->Sample(row, &want_lp[r]);
      }
      const std::vector<double> probs = (*sampler)->Probabilities(row);
      std::vector<int> order;  // the walk: id order, or ranking order once top-k applies
      for (int i = 0; i < V; ++i)
        if (probs[i] > 0) order.push_back(i);
      if (top_k > 0) {
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
      }
      // The target: the most likely token (id order), the third (ranked).
      const int target = top_k > 0 ? order[2] : static_cast<int>(std::max_element(probs.begin(), probs.end()) -
                                                                  probs.begin());
      double before = 0;
      for (int i : order) {
        if (i == target) break;
        before += probs[i];
      }
      ASSERT_GT(probs[target], 1e-4) << "row " << r;
      draws[r] = (*sampler)->NextDraw();
      draws[r].u = before + probs[target] / 2;
      want[r] = target;
    }
    std::vector<int> got;
    std::vector<SampleLogprobs> got_lp;
    ASSERT_TRUE(st.engine->SampleTokens(hidden.data(), draws, &got, &got_lp).ok());
    EXPECT_EQ(got, want);
    ASSERT_EQ(got_lp.size(), static_cast<size_t>(rows));
    for (int r = 0; r < rows && variant == 2; ++r) {
      EXPECT_EQ(got_lp[r].rank, 1) << "row " << r;
      ASSERT_EQ(got_lp[r].top.size(), 3u) << "row " << r;
      EXPECT_NEAR(got_lp[r].logprob, want_lp[r].top[0].logprob, 1e-5) << "row " << r;
      for (int j = 0; j < 3; ++j) {
        EXPECT_EQ(got_lp[r].top[j].token, want_lp[r].top[j].token) << "row " << r;
        EXPECT_NEAR(got_lp[r].top[j].logprob, want_lp[r].top[j].logprob, 1e-5) << "row " << r;
      }
    }
  }
  std::vector<int> none;
  EXPECT_EQ(st.engine->SampleTokens(hidden.data(), {}, &none).code(), absl::StatusCode::kInvalidArgument);
}

// WarmUp runs real steps on a throwaway sequence; afterwards the pool is as
// it was and a request gets the same bits as on an engine never warmed up.
TEST(GpuEngineTest, WarmUpChangesNothingALaterStepSees) {
  const std::string dir = FixtureDirs().front();
  std::vector<int> tokens = TokensOf((fs::path(dir) / "reference.json").string());
  tokens.resize(std::min<size_t>(tokens.size(), 20));
  std::vector<float> logits[2];
  for (int warm = 0; warm < 2; ++warm) {
    GpuEngineOptions opt;
    opt.kv_cache_bytes = 16 << 20;
    auto engine = GpuEngine::Load(dir, opt);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const int64_t free_before = (*engine)->free_pages();
    if (warm) {
      ASSERT_TRUE((*engine)->WarmUp(100).ok());
      EXPECT_EQ((*engine)->free_pages(), free_before);
    }
    auto seq = (*engine)->NewSequence();
    ASSERT_TRUE(seq.ok());
    const GpuChunk c{seq->get(), tokens};
    ASSERT_TRUE((*engine)->Forward({&c, 1}, /*all_logits=*/true, &logits[warm]).ok());
  }
  EXPECT_EQ(logits[0], logits[1]);
}

// Steps of more than 4 rows run the routed experts with the tensor-core
// kernel (hidden 256, expert width 256, bf16), single rows with the
// matrix-vector kernel: a prompt prefilled in one step and the same prompt
// fed one token per step must give the same logits up to bf16 rounding (the
// tensor-core kernel rounds activations to bf16). Random routers choose on
// small gaps, so a rounding difference may send a position to another
// expert and move it by O(1): 90 % of the positions must agree; a wrong
// entry, expert or combine would move nearly all of them.
TEST(GpuEngineTest, LargeMoeStepsOnTensorCoresMatchSingleRowSteps) {
  const std::string dir = DeepseekShapedModel(256, 2, /*dense_layers=*/1);
  const uint64_t seed = strata::testing::TestSeed();
  const std::vector<int> tokens = RandomTokens(48, 320, seed);
  std::vector<float> logits[2];
  for (int one_by_one = 0; one_by_one < 2; ++one_by_one) {
    GpuEngineOptions opt;
    opt.kv_cache_bytes = 64 << 20;
    auto engine = GpuEngine::Load(dir, opt);
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto seq = (*engine)->NewSequence();
    ASSERT_TRUE(seq.ok());
    if (one_by_one) {
      for (size_t t = 0; t < tokens.size(); ++t) {
        std::vector<float> lg;
        const GpuChunk c{seq->get(), absl::MakeConstSpan(&tokens[t], 1)};
        ASSERT_TRUE((*engine)->Forward({&c, 1}, false, &lg).ok());
        logits[1].insert(logits[1].end(), lg.begin(), lg.end());
      }
    } else {
      const GpuChunk c{seq->get(), tokens};
      ASSERT_TRUE((*engine)->Forward({&c, 1}, true, &logits[0]).ok());
    }
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  const int V = 320, T = static_cast<int>(tokens.size());
  const float max_ref = MaxAbs(logits[1]);
  int close = 0;
  float worst_close = 0;
  for (int t = 0; t < T; ++t) {
    float d = 0;
    for (int v = 0; v < V; ++v) {
      const size_t i = static_cast<size_t>(t) * V + v;
      ASSERT_TRUE(std::isfinite(logits[0][i])) << "position " << t;
      d = std::max(d, std::fabs(logits[0][i] - logits[1][i]));
    }
    if (d <= 2e-2f * max_ref) {
      ++close;
      worst_close = std::max(worst_close, d);
    }
  }
  std::printf("MoE on tensor cores vs matrix-vector: %d of %d positions within 2e-2 of max |logit| (worst of "
              "those %.3g) (seed %llu)\n", close, T, worst_close / max_ref, static_cast<unsigned long long>(seed));
  EXPECT_GE(close, T * 9 / 10) << "seed " << seed;
}

}  // namespace
}  // namespace strata
