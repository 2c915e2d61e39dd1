// Device memory and the weights of a GpuEngine (model/gpu/gpu_engine.h):
// uploaded from the CPU engine's float32 weights, or generated on the device
// from a seed for synthetic benchmarks. Internal to model/gpu.
//
// Thread-compatible.
#ifndef STRATA_MODEL_GPU_DEVICE_WEIGHTS_H_
#define STRATA_MODEL_GPU_DEVICE_WEIGHTS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/layer_ops.h"
#include "model/config.h"
#include "model/weight_stream.h"
#include "model/weights.h"

namespace strata::gpu {

// An owned device allocation (cudaMalloc / cudaFree).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // RESOURCE_EXHAUSTED when the device has not `bytes` free.
  static absl::StatusOr<DeviceBuffer> Alloc(size_t bytes);
  // Grows (never shrinks) to at least `bytes`; the contents are not kept.
  absl::Status Reserve(size_t bytes);

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct DLinear {
  DeviceBuffer w;  // [out][in] in `type`, or e4m3 codes when fp8
  DeviceBuffer b;  // [out] f32 or empty
  int in = 0, out = 0;
  cuda::GemmType type = cuda::GemmType::kBF16;
  // The checkpoint's fp8 block-scaled form (docs/gpu-engine.md, "fp8
  // weights"): w holds the codes, scale [ceil(out/128)][ceil(in/128)] f32.
  bool fp8 = false;
  DeviceBuffer scale;
  const float* bias() const { return b.bytes() ? b.as<float>() : nullptr; }
};

// gate_proj and up_proj stacked into one [2 * inter][hidden] Linear (one
// GEMM), then down_proj.
struct DMlp {
  DLinear gate_up, down;
};

struct DLayer {
  DeviceBuffer input_norm, post_norm;  // f32
  DLinear q_proj, q_a, q_b;
  DeviceBuffer q_a_norm;
  DLinear kv_a;
  DeviceBuffer kv_a_norm;
  DLinear kv_b;
  DLinear o;
  DLinear index_wq_b, index_wk, index_weights_proj;  // kFull layers
  DeviceBuffer index_k_norm_w, index_k_norm_b;
  DMlp dense;
  DLinear router;            // always f32
  DeviceBuffer router_bias;  // f32
  std::vector<DMlp> experts;
  DMlp shared;
};

struct DModel {
  DeviceBuffer embed;  // [vocab][hidden] in the GEMM type
  bool embed_bf16 = false;
  DeviceBuffer final_norm;
  DLinear lm_head;
  std::vector<DLayer> layers;
  uint64_t bytes = 0;
};

// Builds the device weights of layers [layer_begin, layer_end) (plus the
// embedding / head when asked). With `host` set, copies its tensors
// (converted to bf16 when type is kBF16; Linear weights the host holds in
// fp8 form stay fp8 where the fp8 GEMM takes them — `in` a multiple of 16,
// gate and up stacked only when their rows fill whole 128-row blocks — and
// are decoded to `type` elsewhere); with host == nullptr, generates every
// tensor on the device from `seed` (fp8 with block scales, the values of the
// bf16 ones on the e4m3 grid, for the layers that may be fp8 when
// synthetic_fp8).
absl::StatusOr<std::unique_ptr<DModel>> BuildDeviceModel(const ModelConfig& c, int layer_begin, int layer_end,
                                                         bool with_embedding, bool with_head,
                                                         cuda::GemmType type, const ModelWeights* host,
                                                         uint64_t seed, bool synthetic_fp8 = false);

// The same from a stream of the checkpoint's parts: each part is uploaded
// (through pinned buffers, copies overlapping the host's) while the stream's
// readers read the next ones, and freed once resident; `progress` (may be
// empty) is called after each part. Errors of the stream (a missing tensor,
// a shape that disagrees with the config) come back as they are.
absl::StatusOr<std::unique_ptr<DModel>> BuildDeviceModel(const ModelConfig& c, int layer_begin, int layer_end,
                                                         bool with_embedding, bool with_head, cuda::GemmType type,
                                                         WeightStream& stream,
                                                         const std::function<void(const LoadProgress&)>& progress);

}  // namespace strata::gpu

#endif  // STRATA_MODEL_GPU_DEVICE_WEIGHTS_H_
