// DeviceStage in a build without CUDA.
#include "worker/device_stage.h"

namespace strata::worker {

bool DeviceStage::Built() { return false; }

absl::Status DeviceStage::Memory(int, int64_t*, int64_t*) {
  return absl::UnimplementedError("this strata-worker was built without CUDA");
}

absl::StatusOr<std::unique_ptr<DeviceStage>> DeviceStage::Create(const std::string&, int, int,
                                                                 const DeviceStageOptions&) {
  return absl::UnimplementedError("this strata-worker was built without CUDA; rebuild with nvcc or use --device cpu");
}

}  // namespace strata::worker
