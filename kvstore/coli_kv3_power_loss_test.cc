// Power-loss durability of the .coli_kv v3 create and append protocols
// (docs/coli-kv.md, "Version 3"): for every crash point of a series of
// appends (of one token, of a few, and of more than the ring's live span),
// with every unsynced byte dropped or some of it kept or torn, the file
// reopens at the last acknowledged append or the one in flight; every token
// record that state holds and its whole block log are byte for byte the ones
// written; and the file stays appendable.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/coli_kv3_file.h"
#include "kvstore/crash_points.h"
#include "kvstore/fault_injection_env.h"
#include "kvstore/test_util.h"
#include "kvstore/v3_test_util.h"

namespace strata::kv {
namespace {

using testing::RunEveryCrashPoint;
using testing::Scenario;
using testing::V3Model;

constexpr char kDir[] = "/kv";
constexpr char kPath[] = "/kv/s.coli_kv";

class ColiKv3PowerLossTest : public ::testing::TestWithParam<int> {
 protected:
  std::mt19937_64 rng_ = testing::FreshRng();
};

// The committed state as a reader sees it; fails the test on any mismatch
// with the model at `t` tokens.
void ExpectState(FaultInjectionEnv& env, V3Model& model, int64_t t) {
  auto r = ColiKv3Reader::Open(&env, kPath);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ((*r)->num_tokens(), t);
  std::string got;
  ASSERT_EQ((*r)->first_live(), t - std::min<int64_t>(t, model.sizes().live));
  for (int64_t p = (*r)->first_live(); p < t; ++p) {
    const absl::Status st = (*r)->ReadTokenRecord(p, &got);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(got, model.Token(p)) << "the token record of position " << p << " is not what was written";
  }
  const absl::Status st = (*r)->ReadBlockLog(&got);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(got, model.Blocks(0, t)) << "the block log is not what was written";
}

TEST_P(ColiKv3PowerLossTest, Append) {
  V3Header h = testing::RandomV3Header(rng_);
  // Odd repetitions: a window as long as the released models' (128), so that
  // a commit record (32 + 4 · live bytes) spans two 512-byte sectors and a
  // power loss can tear it.
  if (GetParam() % 2 == 1) h.window = 130 + static_cast<int32_t>(rng_() % 40);
  V3Model model(rng_, h);
  const int64_t live = model.sizes().live;
  // T after each step: setup commits 2, then appends of 1, a few, more than
  // the live span, 1, 1, and a few.
  const std::vector<int64_t> targets = {2, 3, 6, 6 + live + 2, 6 + live + 3, 6 + live + 4, 6 + live + 9};
  Scenario s;
  s.setup = [&](FaultInjectionEnv& env) {
    ASSERT_TRUE(env.CreateDir(kDir).ok());
    auto w = ColiKv3Writer::Create(&env, kPath, model.header());
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append(2, model.Tokens(0, 2), model.Blocks(0, 2)).ok());
  };
  s.work = [&](FaultInjectionEnv& env) {
    auto w = ColiKv3Writer::Open(&env, kPath);
    if (!w.ok()) return 0;
    for (size_t k = 1; k < targets.size(); ++k) {
      const int64_t t0 = targets[k - 1], t1 = targets[k];
      if (!(*w)->Append(t1, model.Tokens(t0, t1), model.Blocks(t0, t1)).ok()) return static_cast<int>(k - 1);
    }
    return static_cast<int>(targets.size() - 1);
  };
  s.check = [&](FaultInjectionEnv& env, int acked) {
    auto r = ColiKv3Reader::Open(&env, kPath);
    ASSERT_TRUE(r.ok()) << r.status();
    const int64_t t = (*r)->num_tokens();
    const bool in_flight = acked + 1 < static_cast<int>(targets.size()) && t == targets[acked + 1];
    ASSERT_TRUE(t == targets[acked] || in_flight)
        << "the file commits " << t << " tokens; acknowledged: " << targets[acked];
    ExpectState(env, model, t);
    // Still appendable, and the append is durable.
    auto w = ColiKv3Writer::Open(&env, kPath);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append(t + 1, model.Tokens(t, t + 1), model.Blocks(t, t + 1)).ok());
    env.DropUnsyncedData();
    ExpectState(env, model, t + 1);
  };
  const int points = RunEveryCrashPoint(s, rng_());
  std::printf("%s: %d crash points\n", model.header().ToString().c_str(), points);
}

// Create is atomic: after a crash there is no file or the complete empty one;
// appends after it follow the same rules.
TEST_P(ColiKv3PowerLossTest, CreateAndFirstAppends) {
  V3Model model(rng_, testing::RandomV3Header(rng_));
  Scenario s;
  s.setup = [&](FaultInjectionEnv& env) { ASSERT_TRUE(env.CreateDir(kDir).ok()); };
  s.work = [&](FaultInjectionEnv& env) {
    auto w = ColiKv3Writer::Create(&env, kPath, model.header());
    if (!w.ok()) return 0;
    if (!(*w)->Append(1, model.Tokens(0, 1), model.Blocks(0, 1)).ok()) return 1;
    if (!(*w)->Append(5, model.Tokens(1, 5), model.Blocks(1, 5)).ok()) return 2;
    return 3;
  };
  s.check = [&](FaultInjectionEnv& env, int acked) {
    const int64_t after[] = {0, 0, 1, 5};
    if (acked == 0 && !env.FileExists(kPath)) return;  // the create was not acknowledged
    auto r = ColiKv3Reader::Open(&env, kPath);
    ASSERT_TRUE(r.ok()) << r.status();
    const int64_t t = (*r)->num_tokens();
    ASSERT_TRUE(t == after[acked] || (acked < 3 && t == after[acked + 1])) << t << " tokens, acked step " << acked;
    ExpectState(env, model, t);
  };
  RunEveryCrashPoint(s, rng_());
}

INSTANTIATE_TEST_SUITE_P(Repetitions, ColiKv3PowerLossTest, ::testing::Range(0, 6));

}  // namespace
}  // namespace strata::kv
