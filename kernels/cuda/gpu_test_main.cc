// main() of the test binaries whose suites need a CUDA device
// (strata_cc_test(... DEVICE) in cmake/StrataHelpers.cmake).
//
// Convention: a suite whose name ends in "HostTest" needs no device
// (argument checks, host-side layouts and planners); every other suite of
// such a binary does. CTest runs each binary twice, with a filter for each
// kind, so that the host suites run and fail on every machine and the device
// suites are reported as skipped, never as passed, where there is no device:
//
//   NAME        --gtest_filter=-*HostTest.*   exit 77 without a device
//   NAME_host   --gtest_filter=*HostTest.*    (only when HOST_SUITES is given)
//
// Before the first test runs, once GoogleTest has applied the filter: with
// no device and at least one device test selected, the binary prints what
// it did not run and exits with kSkipExitCode (CTest's SKIP_RETURN_CODE);
// with no test selected at all it fails, so that an entry that runs nothing
// cannot pass.
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace {

// Also in cmake/StrataHelpers.cmake (SKIP_RETURN_CODE).
constexpr int kSkipExitCode = 77;
constexpr std::string_view kHostSuffix = "HostTest";

bool IsHostSuite(std::string_view suite) {
  return suite.size() >= kHostSuffix.size() && suite.substr(suite.size() - kHostSuffix.size()) == kHostSuffix;
}

class DeviceGate : public ::testing::EmptyTestEventListener {
 public:
  void OnTestProgramStart(const ::testing::UnitTest& unit) override {
    int device_tests = 0, host_tests = 0;
    for (int i = 0; i < unit.total_test_suite_count(); ++i) {
      const ::testing::TestSuite* suite = unit.GetTestSuite(i);
      (IsHostSuite(suite->name()) ? host_tests : device_tests) += suite->test_to_run_count();
    }
    if (device_tests + host_tests == 0) {
      std::printf("FAILED: the filter selects no test of this binary\n");
      std::fflush(stdout);
      std::_Exit(1);
    }
    if (device_tests > 0 && !strata::cuda::testing::HaveDevice()) {
      std::printf("SKIPPED: no CUDA device; %d device test(s) not run (exit code %d). Suites named *%s need "
                  "no device: --gtest_filter='*%s.*' runs them.\n",
                  device_tests, kSkipExitCode, kHostSuffix.data(), kHostSuffix.data());
      std::fflush(stdout);
      std::_Exit(kSkipExitCode);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Appended after the printer, so the header lines come first; owned by
  // GoogleTest.
  ::testing::UnitTest::GetInstance()->listeners().Append(new DeviceGate);
  return RUN_ALL_TESTS();
}
