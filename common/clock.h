// Clock: where a component reads the time, so that a test can hand it a clock
// it advances by hand (common/testing/fake_clock.h) instead of sleeping.
// Components take a `Clock*` in their options; null means Clock::Real().
// Only the time read changes: waits for work still use the real clock.
//
// Thread-safety: Now() may be called from any thread.
#ifndef STRATA_COMMON_CLOCK_H_
#define STRATA_COMMON_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace strata {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;

  // absl::Now(). Never destroyed.
  static Clock* Real();
};

namespace clock_internal {
class RealClock final : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
};
}  // namespace clock_internal

inline Clock* Clock::Real() {
  static Clock* const real = new clock_internal::RealClock;
  return real;
}

}  // namespace strata

#endif  // STRATA_COMMON_CLOCK_H_
