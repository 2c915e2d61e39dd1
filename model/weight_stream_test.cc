// WeightStream on the fp8 checkpoint fixture: the parts come in order and
// hold what LoadWeights of the same range holds; no more than max_ahead
// parts are read ahead of the consumer; a checkpoint that disagrees with
// its config fails at the first broken part, naming the tensor and the
// file, and every later call fails the same way.
#include "model/weight_stream.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "model/config.h"
#include "model/safetensors.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string FixtureDir() {
  return (fs::path(STRATA_SOURCE_DIR) / "tests" / "data" / "models" / "deepseek_v3_fp8").string();
}

TEST(WeightStreamTest, PartsComeInOrderAndHoldWhatLoadWeightsHolds) {
  auto config = LoadModelConfig(FixtureDir());
  ASSERT_TRUE(config.ok()) << config.status();
  auto store = TensorStore::OpenDir(FixtureDir());
  ASSERT_TRUE(store.ok()) << store.status();
  const int n = config->num_layers;
  for (int readers : {1, 3}) {
    WeightStreamOptions o;
    o.load.keep_fp8 = true;
    o.readers = readers;
    WeightStream stream(**store, *config, 1, n, true, true, o);
    ASSERT_EQ(stream.num_parts(), n);  // the ends, then layers 1 .. n-1
    auto ends = stream.Next();
    ASSERT_TRUE(ends.ok()) << ends.status();
    ASSERT_NE(*ends, nullptr);
    EXPECT_TRUE((*ends)->layers.empty());
    auto want_ends = LoadWeights(**store, *config, 1, 1, true, true, o.load);
    ASSERT_TRUE(want_ends.ok());
    EXPECT_EQ((*ends)->embed, (*want_ends)->embed);
    EXPECT_EQ((*ends)->lm_head.w, (*want_ends)->lm_head.w);
    for (int l = 1; l < n; ++l) {
      auto part = stream.Next();
      ASSERT_TRUE(part.ok()) << part.status();
      ASSERT_NE(*part, nullptr);
      auto want = LoadWeights(**store, *config, l, l + 1, false, false, o.load);
      ASSERT_TRUE(want.ok());
      EXPECT_EQ((*part)->layer_begin, l);
      ASSERT_EQ((*part)->layers.size(), 1u);
      EXPECT_EQ((*part)->bytes, (*want)->bytes) << "layer " << l;
      EXPECT_EQ((*part)->layers[0].q_a.fp8_codes, (*want)->layers[0].q_a.fp8_codes) << "layer " << l;
      EXPECT_EQ((*part)->layers[0].kv_b.w, (*want)->layers[0].kv_b.w) << "layer " << l;
    }
    auto end = stream.Next();
    ASSERT_TRUE(end.ok());
    EXPECT_EQ(*end, nullptr);
  }
}

TEST(WeightStreamTest, ReadsAtMostMaxAheadPartsBeforeTheyAreTaken) {
  auto config = LoadModelConfig(FixtureDir());
  ASSERT_TRUE(config.ok()) << config.status();
  auto store = TensorStore::OpenDir(FixtureDir());
  ASSERT_TRUE(store.ok()) << store.status();
  WeightStreamOptions o;
  o.readers = 4;
  o.max_ahead = 2;
  WeightStream stream(**store, *config, 0, config->num_layers, false, false, o);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (stream.parts_started() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // time for a reader to overstep
  EXPECT_EQ(stream.parts_started(), 2);
  ASSERT_TRUE(stream.Next().ok());
  while (stream.parts_started() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(stream.parts_started(), 3);
}

TEST(WeightStreamTest, ABrokenPartFailsNamingTheTensorAndEveryLaterCallFails) {
  // The fixture's config with a wider q_lora_rank: its q_a_proj no longer
  // has the shape the config asks for.
  auto config = LoadModelConfig(FixtureDir());
  ASSERT_TRUE(config.ok()) << config.status();
  ModelConfig bad = *config;
  bad.q_lora_rank += 16;
  auto store = TensorStore::OpenDir(FixtureDir());
  ASSERT_TRUE(store.ok()) << store.status();
  WeightStream stream(**store, bad, 0, bad.num_layers, false, false, WeightStreamOptions{});
  auto first = stream.Next();
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(first.status().message().find("q_a_proj"), std::string::npos) << first.status();
  EXPECT_NE(first.status().message().find("model.safetensors"), std::string::npos) << first.status();
  EXPECT_EQ(stream.Next().status(), first.status());
  WeightStream out_of_range(**store, *config, 0, config->num_layers + 1, false, false, WeightStreamOptions{});
  EXPECT_EQ(out_of_range.Next().status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
