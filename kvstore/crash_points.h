// Runs a file-system workload once per crash point under the fault-injection
// Env (kvstore/fault_injection_env.h): the shared driver of the power-loss
// tests (docs/coli-kv.md, "Testing"). Each crash point runs with every unsynced
// byte dropped, and kSomeSeeds more times with DropSomeUnsyncedData (every
// unsynced write independently lost, kept or torn).
//
// Not thread-safe; test-only.
#ifndef STRATA_KVSTORE_CRASH_POINTS_H_
#define STRATA_KVSTORE_CRASH_POINTS_H_

#include <cstdint>
#include <functional>

#include "gtest/gtest.h"
#include "kvstore/fault_injection_env.h"

namespace strata::kv::testing {

constexpr int kSomeSeeds = 2;

// Runs `work` against a fresh env prepared by `setup`, once without faults to
// count its operations, then once per crash point. `check` gets the env after
// the power loss and how many steps of the work were acknowledged.
struct Scenario {
  std::function<void(FaultInjectionEnv&)> setup;
  // Runs the steps in order, stopping at the first error; returns how many
  // completed (were acknowledged).
  std::function<int(FaultInjectionEnv&)> work;
  // REQUIRES: `acked` steps acknowledged; step `acked` (if any) was in flight.
  std::function<void(FaultInjectionEnv&, int acked)> check;
};

inline int RunEveryCrashPoint(const Scenario& s, uint64_t seed_base) {
  int64_t total;
  int steps;
  {
    FaultInjectionEnv env;
    s.setup(env);
    const int64_t base = env.operation_count();
    steps = s.work(env);
    total = env.operation_count() - base;
    env.DropUnsyncedData();
    s.check(env, steps);  // no crash at all: everything acknowledged
  }
  EXPECT_GT(total, 0);
  for (int64_t i = 0; i <= total; ++i) {
    for (int mode = 0; mode <= kSomeSeeds; ++mode) {
      FaultInjectionEnv env;
      s.setup(env);
      env.CrashAtOperation(env.operation_count() + i);
      const int acked = s.work(env);
      EXPECT_LE(acked, steps);
      if (i < total) {
        EXPECT_TRUE(env.crashed()) << "crash point " << i;
      }
      if (mode == 0) {
        env.DropUnsyncedData();
      } else {
        env.DropSomeUnsyncedData(seed_base + static_cast<uint64_t>(i * 7 + mode));
      }
      SCOPED_TRACE(::testing::Message() << "crash at operation " << i << " of " << total
                                        << ", drop mode " << mode << ", acked " << acked);
      s.check(env, acked);
      if (::testing::Test::HasFatalFailure()) return static_cast<int>(total);
    }
  }
  return static_cast<int>(total);
}

}  // namespace strata::kv::testing

#endif  // STRATA_KVSTORE_CRASH_POINTS_H_
