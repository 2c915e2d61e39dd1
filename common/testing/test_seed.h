// Seeds for randomised tests: every random test draws its seed here, prints
// it, and replays it when STRATA_TEST_SEED is set.
//
//   std::mt19937_64 rng(strata::testing::TestSeed());
//
// TestSeed() returns a fresh seed from std::random_device, or the value of the
// environment variable STRATA_TEST_SEED (a decimal u64) when it is set, and
// prints "seed N (replay: STRATA_TEST_SEED=N)" on stderr and as the current
// test's "seed" property, so a failure's log names the value that replays it.
// Tests read the environment; library code never does.
//
// Thread-safety: safe to call from any thread (the property is recorded only
// when called from the test's main thread, as GoogleTest requires).
#ifndef STRATA_COMMON_TESTING_TEST_SEED_H_
#define STRATA_COMMON_TESTING_TEST_SEED_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace strata::testing {

inline constexpr char kTestSeedEnv[] = "STRATA_TEST_SEED";

// The seed STRATA_TEST_SEED names, or a fresh one. An unparsable value fails
// the current test (and returns 0) instead of silently drawing another seed.
inline uint64_t TestSeed() {
  uint64_t seed = 0;
  const char* fixed = std::getenv(kTestSeedEnv);
  if (fixed != nullptr && *fixed != '\0') {
    char* end = nullptr;
    seed = std::strtoull(fixed, &end, 10);
    if (end == fixed || *end != '\0') {
      ADD_FAILURE() << kTestSeedEnv << "='" << fixed << "' is not a decimal number";
      return 0;
    }
  } else {
    std::random_device rd;
    seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  std::fprintf(stderr, "seed %llu (replay: %s=%llu)\n", static_cast<unsigned long long>(seed), kTestSeedEnv,
               static_cast<unsigned long long>(seed));
  if (::testing::UnitTest::GetInstance()->current_test_info() != nullptr) {
    ::testing::Test::RecordProperty("seed", std::to_string(seed));
  }
  return seed;
}

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_TEST_SEED_H_
