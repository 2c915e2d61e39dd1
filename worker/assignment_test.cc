// What an AssignLayers request must hold before a worker loads anything: the
// stage sizes its buffers from these numbers.
#include <string>

#include "gtest/gtest.h"
#include "worker/stage_host.h"

namespace strata::worker {
namespace {

v1::AssignLayersRequest Valid() {
  v1::AssignLayersRequest r;
  r.set_epoch(1);
  r.set_model_dir("models/demo");
  r.set_layer_begin(0);
  r.set_layer_end(2);
  r.set_stage(0);
  r.set_num_stages(2);
  return r;
}

TEST(AssignmentTest, TheCoordinatorsRequestsAreAccepted) {
  EXPECT_TRUE(ValidateAssignment(Valid()).ok());
  v1::AssignLayersRequest r = Valid();
  r.set_stage(1);
  r.set_layer_begin(2);
  r.set_layer_end(4);
  r.set_threads(kMaxThreads);
  r.set_kv_dtype(v1::KV_DTYPE_F32);
  EXPECT_TRUE(ValidateAssignment(r).ok());
}

TEST(AssignmentTest, BadNumbersAreInvalidArgumentNamingWhatIsWrong) {
  struct Case {
    void (*mutate)(v1::AssignLayersRequest&);
    std::string says;
  };
  const Case cases[] = {
      {[](v1::AssignLayersRequest& r) { r.set_layer_end(-1); }, "layer range [0, -1)"},
      {[](v1::AssignLayersRequest& r) { r.set_layer_end(0); }, "layer range [0, 0)"},
      {[](v1::AssignLayersRequest& r) { r.set_layer_begin(-3); }, "layer range [-3, 2)"},
      {[](v1::AssignLayersRequest& r) { r.set_stage(2); }, "stage 2 of 2"},
      {[](v1::AssignLayersRequest& r) { r.set_num_stages(0); }, "stage 0 of 0"},
      {[](v1::AssignLayersRequest& r) { r.set_stage(-1); }, "stage -1 of 2"},
      {[](v1::AssignLayersRequest& r) { r.set_threads(2147483647); }, "threads must be in [0, 4096]"},
      {[](v1::AssignLayersRequest& r) { r.set_threads(-1); }, "threads must be in [0, 4096]"},
      {[](v1::AssignLayersRequest& r) { r.set_kv_dtype(static_cast<v1::KvDtype>(999)); }, "unknown kv dtype 999"},
      {[](v1::AssignLayersRequest& r) { r.set_epoch(0); }, "epoch must be positive"},
  };
  for (const Case& c : cases) {
    v1::AssignLayersRequest r = Valid();
    c.mutate(r);
    const absl::Status st = ValidateAssignment(r);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.says;
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace strata::worker
