// Runs the real `strata` binary as a user would.
#include <sys/wait.h>

#include <cstdio>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"
#include "kvstore/coli_kv.h"
#include "kvstore/coli_kv_file.h"
#include "kvstore/env.h"
#include "model/random_model.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int code;
  std::string out;
};

// Runs a shell command line: its exit code and standard output; standard
// error is dropped, or kept in `out` with keep_stderr; timeout_s > 0 stops it
// after that long.
RunResult RunCommand(const std::string& command, bool keep_stderr = false, int timeout_s = 0) {
  const std::string cmd = (timeout_s > 0 ? "timeout " + std::to_string(timeout_s) + " " : std::string()) + command +
                          (keep_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Runs `strata ARGS` from the build tree.
RunResult Strata(const std::string& args, bool keep_stderr = false, int timeout_s = 0) {
  return RunCommand(std::string(STRATA_BINARY_DIR) + "/cli/strata " + args, keep_stderr, timeout_s);
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeScratchDir("cli_test_");
    const std::string cfg = R"({"model_type": "deepseek_v32", "vocab_size": 50, "hidden_size": 32,
      "intermediate_size": 40, "moe_intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
      "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
      "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
      "first_k_dense_replace": 1, "index_n_heads": 2, "index_head_dim": 8, "index_topk": 3})";
    ASSERT_TRUE(WriteRandomModel(dir_, cfg).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(CliTest, ScorePrintsTheDocumentedJson) {
  RunResult r = Strata("score --model " + dir_ + " --tokens 3,17,42,5,9 --full-logits");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tokens"], nlohmann::json({3, 17, 42, 5, 9}));
  ASSERT_EQ(j["argmax"].size(), 5u);
  ASSERT_EQ(j["next_token_logprobs"].size(), 4u);
  ASSERT_EQ(j["logits"].size(), 5u);
  ASSERT_EQ(j["logits"][0].size(), 50u);
  // next_token_logprobs[i] is log softmax(logits[i])[tokens[i+1]].
  for (int i = 0; i < 4; ++i) {
    const auto& row = j["logits"][i];
    double m = -1e30, s = 0;
    for (const auto& v : row) m = std::max(m, v.get<double>());
    for (const auto& v : row) s += std::exp(v.get<double>() - m);
    const int next = j["tokens"][i + 1];
    EXPECT_NEAR(j["next_token_logprobs"][i].get<double>(), row[next].get<double>() - m - std::log(s), 1e-5);
  }
  RunResult pre = Strata("score --model " + dir_ + " --tokens 3,17,42,5,9 --full-logits --prefill");
  ASSERT_EQ(pre.code, 0);
  EXPECT_EQ(nlohmann::json::parse(pre.out), j);
  RunResult fp8 = Strata("score --model " + dir_ + " --tokens 3,17,42,5,9 --kv-dtype fp8");
  ASSERT_EQ(fp8.code, 0);
  EXPECT_FALSE(nlohmann::json::parse(fp8.out).contains("logits"));
}

TEST_F(CliTest, BadInputGivesAClearError) {
  EXPECT_EQ(Strata("score --model " + dir_ + " --tokens 3,50").code, 1);       // outside vocab
  // ... named by its position in the whole sequence (scoring runs one token per step)
  const RunResult vocab = Strata("score --model " + dir_ + " --tokens 3,4,50", /*keep_stderr=*/true);
  EXPECT_EQ(vocab.code, 1);
  EXPECT_NE(vocab.out.find("token id 50 at position 2 is outside"), std::string::npos) << vocab.out;
  EXPECT_EQ(Strata("score --model " + dir_ + " --tokens 3,x").code, 2);        // not a number
  EXPECT_EQ(Strata("score --model " + dir_).code, 2);                          // no tokens
  EXPECT_EQ(Strata("score --model " + dir_ + " --tokens 1 --kv-dtype f16").code, 2);
  EXPECT_EQ(Strata("score --model /nonexistent --tokens 1").code, 1);
  EXPECT_EQ(Strata("score --bogus").code, 2);
  EXPECT_EQ(Strata("frobnicate").code, 2);
}

// DeepSeek-V4 goes through its own engine: `score` matches transformers'
// logits (tests/data/models/deepseek_v4*), decode and --prefill agree, and
// `generate` reproduces the greedy continuation; an fp8 cache is refused.
TEST(CliV4Test, ScoreAndGenerateMatchTheFixtures) {
  for (const char* name : {"deepseek_v4", "deepseek_v4_b"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(STRATA_SOURCE_DIR) + "/tests/data/models/" + name;
    std::ifstream in(dir + "/reference.json");
    const auto ref = nlohmann::json::parse(in);
    auto file = SafetensorsFile::Open(dir + "/reference.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    const TensorInfo* info = (*file)->Find("logits_f32");
    ASSERT_NE(info, nullptr);
    const int V = static_cast<int>(info->shape[1]);
    std::vector<float> want(info->num_elements());
    std::memcpy(want.data(), (*file)->Data(*info).data(), want.size() * sizeof(float));
    float max_ref = 0;
    for (float v : want) max_ref = std::max(max_ref, std::fabs(v));

    const std::vector<int> all = ref["tokens"].get<std::vector<int>>();
    const std::vector<int> tokens(all.begin(), all.begin() + 24);  // causal: a prefix scores the same
    const std::string ids = absl::StrJoin(tokens, ",");
    RunResult r = Strata("score --model " + dir + " --tokens " + ids + " --full-logits");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["logits"].size(), tokens.size());
    for (size_t p = 0; p < tokens.size(); ++p) {
      int best = 0;
      for (int v = 0; v < V; ++v) {
        EXPECT_NEAR(j["logits"][p][v].get<double>(), want[p * V + v], 1e-3 * max_ref) << p << "," << v;
        if (want[p * V + v] > want[p * V + best]) best = v;
      }
      EXPECT_EQ(j["argmax"][p].get<int>(), best) << p;
    }
    RunResult pre = Strata("score --model " + dir + " --tokens " + ids + " --full-logits --prefill");
    ASSERT_EQ(pre.code, 0);
    EXPECT_EQ(nlohmann::json::parse(pre.out), j);
    EXPECT_EQ(Strata("score --model " + dir + " --tokens 1,2 --kv-dtype fp8").code, 2);

    const std::string prompt = absl::StrJoin(ref["greedy_prompt"].get<std::vector<int>>(), ",");
    RunResult g = Strata("generate --model " + dir + " --tokens " + prompt +
                         " --max-tokens 16 --temperature 0 --ignore-eos --json");
    ASSERT_EQ(g.code, 0) << g.out;
    EXPECT_EQ(nlohmann::json::parse(g.out)["tokens"], ref["greedy_f32"]);
    EXPECT_EQ(Strata("generate --model " + dir + " --tokens 1,2 --kv-dtype fp8").code, 2);
  }
}

// `strata up --device gpu` as a user without a GPU meets it: a clear reason
// and exit 1 (a CUDA build without a device, or a build without CUDA). On a
// GPU machine the cluster becomes ready instead (stopped by the timeout).
TEST(CliUpTest, GpuFlagsAreCheckedAndAMissingGpuIsExplained) {
  EXPECT_EQ(Strata("up --device tpu").code, 2);
  EXPECT_EQ(Strata("up --gpu-kv-bytes 1000000").code, 2);
  EXPECT_EQ(Strata("up --gpu-gemm f32").code, 2);
  const RunResult gemm = Strata(std::string("up --device gpu --gpu-gemm bf17 --model ") + STRATA_SOURCE_DIR +
                                    "/models/demo",
                                /*keep_stderr=*/true);
  EXPECT_EQ(gemm.code, 2);
  EXPECT_NE(gemm.out.find("--gpu-gemm must be bf16, bf16-rounded or f32"), std::string::npos) << gemm.out;
  const RunResult syn = Strata(std::string("up --synthetic-weights 7 --model ") + STRATA_SOURCE_DIR + "/models/demo",
                               /*keep_stderr=*/true);
  EXPECT_EQ(syn.code, 2);
  EXPECT_NE(syn.out.find("need --device gpu"), std::string::npos) << syn.out;
  const RunResult r = Strata(std::string("up --device gpu --workers 1 --no-kvstore --port 0 --ready-timeout 5 ") +
                                 "--model " + STRATA_SOURCE_DIR + "/models/demo",
                             /*keep_stderr=*/true, /*timeout_s=*/30);
  if (r.out.rfind("ready ", 0) == 0 || r.out.find("\nready ") != std::string::npos) {
    GTEST_SKIP() << "a GPU is present: the cluster started";
  }
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(r.out.find("no CUDA device is visible") != std::string::npos ||
              r.out.find("built without CUDA") != std::string::npos)
      << r.out;
}

// Numbers out of range are refused before anything starts, with the flag
// named: by `strata up` and by the server binaries it runs.
TEST(CliUpTest, NumbersOutOfRangeAreRefusedWithTheFlagNamed) {
  struct Case {
    std::string cmd, flag;
  };
  const std::string bin = STRATA_BINARY_DIR;
  const std::string model = std::string(" --model ") + STRATA_SOURCE_DIR + "/models/demo";
  const std::vector<Case> cases = {
      {bin + "/cli/strata up --worker-threads -1" + model, "--worker-threads"},
      {bin + "/cli/strata up --ready-timeout 0" + model, "--ready-timeout"},
      {bin + "/worker/strata-worker --coordinator 127.0.0.1:1 --threads -5", "--threads"},
      {bin + "/worker/strata-worker --coordinator 127.0.0.1:1 --gpu-kv-bytes 1e99", "--gpu-kv-bytes"},
      {bin + "/coordinator/strata-coordinator --worker-threads -2" + model, "--worker-threads"},
      {bin + "/coordinator/strata-coordinator --workers 0" + model, "--workers"},
  };
  for (const Case& c : cases) {
    const RunResult r = RunCommand(c.cmd, /*keep_stderr=*/true, /*timeout_s=*/20);
    EXPECT_EQ(r.code, 2) << c.cmd << "\n" << r.out;
    // The first line is the reason; the usage after it names every flag.
    const std::string reason = r.out.substr(0, r.out.find('\n'));
    EXPECT_NE(reason.find(c.flag), std::string::npos) << c.cmd << "\n" << r.out;
  }
}

// The demo model ships with a tokenizer: generate streams text, --json gives
// the documented object, the same seed gives the same tokens.
TEST(CliDemoTest, GenerateFromTheDemoModel) {
  const std::string demo = std::string(STRATA_SOURCE_DIR) + "/models/demo";
  RunResult a = Strata("generate --model " + demo + " --prompt 'The list type' --max-tokens 12 --seed 7 --json");
  ASSERT_EQ(a.code, 0) << a.out;
  auto j = nlohmann::json::parse(a.out);
  EXPECT_EQ(j["tokens"].size(), 12u);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_FALSE(j["text"].get<std::string>().empty());
  RunResult b = Strata("generate --model " + demo + " --prompt 'The list type' --max-tokens 12 --seed 7 --json");
  EXPECT_EQ(nlohmann::json::parse(b.out)["tokens"], j["tokens"]);
  // Streaming prints the same text as --json carries.
  RunResult s = Strata("generate --model " + demo + " --prompt 'The list type' --max-tokens 12 --seed 7");
  ASSERT_EQ(s.code, 0);
  EXPECT_EQ(s.out, j["text"].get<std::string>() + "\n");
  // A stop string ends the text before it.
  RunResult st = Strata("generate --model " + demo + " --prompt 'import os' --max-tokens 40 --temperature 0 --stop os --json");
  ASSERT_EQ(st.code, 0);
  auto sj = nlohmann::json::parse(st.out);
  EXPECT_EQ(sj["finish_reason"], "stop");
  EXPECT_EQ(sj["text"].get<std::string>().find("os"), std::string::npos);
  // --text scores as the tokenizer encodes it (BOS first), with perplexity.
  RunResult sc = Strata("score --model " + demo + " --text 'The for statement in Python'");
  ASSERT_EQ(sc.code, 0);
  auto scj = nlohmann::json::parse(sc.out);
  EXPECT_EQ(scj["tokens"][0], 0);  // BOS
  EXPECT_EQ(scj["n_tokens"], scj["tokens"].size());
  EXPECT_NEAR(std::log(scj["perplexity"].get<double>()), scj["mean_nll"].get<double>(), 1e-9);
}

TEST(CliDemoTest, GenerateRejectsBadInput) {
  const std::string demo = std::string(STRATA_SOURCE_DIR) + "/models/demo";
  for (const std::string bad : {"--prompt ''", "--prompt x --temperature -1", "--prompt x --top-p 1.5",
                                "--prompt x --max-tokens 0", "--prompt x --tokens 1", "--tokens 1,99999",
                                "--prompt x --min-p 2", "--prompt x --frequency-penalty 3"}) {
    RunResult r = Strata("generate --model " + demo + " " + bad);
    EXPECT_NE(r.code, 0) << bad;
  }
}

// A colibri-style file (no manifest) for the demo model's dimensions goes
// through import, verify, inspect and convert; a file from another model or
// a corrupted one is refused with a clear error.
TEST(CliKvTest, ImportVerifyInspectConvert) {
  const std::string demo = std::string(STRATA_SOURCE_DIR) + "/models/demo";
  const std::string fix = std::string(STRATA_SOURCE_DIR) + "/tests/data/models/deepseek_v32";
  const fs::path dir = MakeScratchDir("cli_kv_");
  const std::string file = (dir / "s.coli_kv").string();
  // The demo model: 4 layers, kv_lora 64, rope 16, 4 indexer layers of 32, vocab 2048.
  kv::Dims d{4, 64, 16, 32, 4, 2048};
  {
    auto w = kv::ColiKvWriter::Create(kv::Env::Default(), file, kv::Version::kV2, d);
    ASSERT_TRUE(w.ok()) << w.status();
    kv::RecordBuilder rb(d);
    std::vector<float> lat(64), rope(16), keys(32);
    std::string recs;
    // 70 records: one complete 64-record chunk (checksummed) and a partial one.
    for (int t = 0; t < 70; ++t) {
      rb.Reset();
      rb.SetToken((t * 7) % 2048);
      for (int l = 0; l < 4; ++l) {
        for (int i = 0; i < 64; ++i) lat[i] = std::sin(t + i + l);
        for (int i = 0; i < 16; ++i) rope[i] = std::cos(t * i + l);
        rb.SetLayer(l, lat.data(), rope.data());
      }
      for (int s = 0; s < 4; ++s) {
        for (int i = 0; i < 32; ++i) keys[i] = 0.1f * (i - s);
        rb.SetIndexerKeys(s, keys.data());
      }
      recs += std::string(rb.bytes());
    }
    ASSERT_TRUE((*w)->Append(recs).ok());
    ASSERT_TRUE((*w)->Commit(70).ok());
  }
  EXPECT_EQ(Strata("kv verify " + file).code, 1);  // no manifest yet
  EXPECT_EQ(Strata("kv import --model " + fix + " " + file).code, 1);  // other dimensions
  const std::string with_digest = (dir / "s3.coli_kv").string();
  fs::copy_file(file, with_digest);
  ASSERT_EQ(Strata("kv import --model " + demo + " " + file).code, 0);
  ASSERT_EQ(Strata("kv import --full --model " + demo + " " + with_digest).code, 0);
  EXPECT_EQ(Strata("kv verify --full --model " + demo + " " + with_digest).code, 0);
  EXPECT_EQ(Strata("kv import --model " + demo + " " + file).code, 1);  // already imported
  EXPECT_EQ(Strata("kv verify --model " + demo + " " + file).code, 0);
  EXPECT_EQ(Strata("kv verify --model " + demo + " --full " + file).code, 1);  // no digest recorded
  EXPECT_EQ(Strata("kv verify --full " + file).code, 2);                       // --full needs --model
  RunResult ins = Strata("kv inspect " + file);
  ASSERT_EQ(ins.code, 0);
  auto j = nlohmann::json::parse(ins.out);
  EXPECT_EQ(j["nrec"], 70);
  EXPECT_EQ(j["first_tokens"][4], 28);
  const std::string v1 = (dir / "s1.coli_kv").string(), v2 = (dir / "s2.coli_kv").string();
  ASSERT_EQ(Strata("kv convert --to v1 " + file + " " + v1).code, 0);
  ASSERT_EQ(Strata("kv convert --to v2 " + v1 + " " + v2).code, 0);
  EXPECT_EQ(Strata("kv verify --model " + demo + " " + v2).code, 0);
  // Flip one byte inside record 0: the first chunk's checksum no longer matches.
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40 + 100);
    char c;
    f.seekg(40 + 100);
    f.get(c);
    f.seekp(40 + 100);
    f.put(static_cast<char>(c ^ 0x5A));
  }
  EXPECT_EQ(Strata("kv verify " + file).code, 1);
  EXPECT_EQ(Strata("kv verify " + (dir / "missing.coli_kv").string()).code, 1);
  EXPECT_EQ(Strata("kv convert --to v3 " + file + " " + v1).code, 2);
  EXPECT_EQ(Strata("kv frob").code, 2);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata
