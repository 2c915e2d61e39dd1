// FakeClock: a Clock (common/clock.h) that stands still until the test moves
// it. It counts how often it is read since it last moved, so a test can wait
// until a component's loop has seen the new time instead of sleeping:
//
//   clock.Advance(absl::Seconds(4));
//   ASSERT_TRUE(clock.AwaitReads(2));  // a loop that reads once per round
//                                      // has finished a round at the new time
//
// Thread-safety: all methods may be called from any thread.
#ifndef STRATA_COMMON_TESTING_FAKE_CLOCK_H_
#define STRATA_COMMON_TESTING_FAKE_CLOCK_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "absl/time/time.h"
#include "common/clock.h"

namespace strata::testing {

class FakeClock final : public Clock {
 public:
  // An arbitrary fixed start, far from the real time and from zero.
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(2'000'000'000)) : now_(start) {}

  absl::Time Now() override {
    std::lock_guard<std::mutex> l(mu_);
    ++reads_;
    cv_.notify_all();
    return now_;
  }

  void Advance(absl::Duration d) {
    std::lock_guard<std::mutex> l(mu_);
    now_ += d;
    reads_ = 0;
  }

  // Waits (real time, at most `timeout`) until Now() has returned the current
  // time `n` times. False on timeout.
  bool AwaitReads(int64_t n, absl::Duration timeout = absl::Seconds(10)) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, absl::ToChronoMilliseconds(timeout), [&] { return reads_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  absl::Time now_;     // guarded by mu_
  int64_t reads_ = 0;  // guarded by mu_: reads since the last Advance
};

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_FAKE_CLOCK_H_
