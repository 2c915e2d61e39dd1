#include "model/gpu/device_weights.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/fp8_gemv.h"
#include "kernels/fp8.h"

namespace strata::gpu {

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Alloc(size_t bytes) {
  DeviceBuffer b;
  RETURN_IF_ERROR(b.Reserve(bytes));
  return b;
}

absl::Status DeviceBuffer::Reserve(size_t bytes) {
  if (bytes <= bytes_) return absl::OkStatus();
  if (ptr_ != nullptr) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
  const cudaError_t e = cudaMalloc(&ptr_, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state of a failed allocation
    ptr_ = nullptr;
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes on the GPU: ", cudaGetErrorString(e)));
  }
  bytes_ = bytes;
  return absl::OkStatus();
}

namespace {

uint16_t ToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// Host-to-device copies through two pinned buffers: a chunk is copied into
// one buffer while the other's copy to the device runs, so the host copy and
// the transfer overlap and the source may be any host memory (a pageable
// source would be staged by the driver, one chunk at a time, synchronously).
class Stager {
 public:
  static constexpr size_t kChunk = size_t{64} << 20;

  ~Stager() {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (int i = 0; i < 2; ++i) {
      if (pinned_[i] != nullptr) cudaFreeHost(pinned_[i]);
      if (done_[i] != nullptr) cudaEventDestroy(done_[i]);
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes, const char* what) {
    if (stream_ == nullptr) {
      cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
      for (int i = 0; i < 2 && e == cudaSuccess; ++i) {
        e = cudaHostAlloc(&pinned_[i], kChunk, cudaHostAllocDefault);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming);
      }
      if (e != cudaSuccess) return absl::InternalError(absl::StrCat("staging buffers: ", cudaGetErrorString(e)));
    }
    for (size_t off = 0; off < bytes; off += kChunk) {
      const size_t n = std::min(kChunk, bytes - off);
      const int i = next_;
      next_ ^= 1;
      cudaError_t e = cudaEventSynchronize(done_[i]);  // the buffer's previous copy is done
      if (e == cudaSuccess) {
        std::memcpy(pinned_[i], static_cast<const char*>(src) + off, n);
        e = cudaMemcpyAsync(static_cast<char*>(dst) + off, pinned_[i], n, cudaMemcpyHostToDevice, stream_);
      }
      if (e == cudaSuccess) e = cudaEventRecord(done_[i], stream_);
      if (e != cudaSuccess) return absl::InternalError(absl::StrCat("upload of ", what, ": ", cudaGetErrorString(e)));
    }
    return absl::OkStatus();
  }

  // The stream the copies run on (null before the first copy).
  cudaStream_t stream() const { return stream_; }

  absl::Status Sync() {
    if (stream_ == nullptr) return absl::OkStatus();
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return absl::InternalError(absl::StrCat("uploading weights: ", cudaGetErrorString(e)));
    return absl::OkStatus();
  }

 private:
  cudaStream_t stream_ = nullptr;
  void* pinned_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {nullptr, nullptr};
  int next_ = 0;
};

// Creates device tensors from host floats or from the seed.
class Builder {
 public:
  // synthetic_fp8: generated weights of the layers that may be fp8 are fp8.
  Builder(const ModelWeights* host, uint64_t seed, bool synthetic_fp8)
      : host_(host), seed_(seed), synthetic_fp8_(synthetic_fp8) {}

  // The host weights of the next part (a stream hands them over part by part).
  void SetHost(const ModelWeights* host) { host_ = host; }
  absl::Status Sync() { return stager_.Sync(); }

  // A tensor of n values: the host's (bf16-converted when asked) or uniform
  // offset ± scale.
  absl::StatusOr<DeviceBuffer> Tensor(const std::vector<float>* src, int64_t n, bool bf16, float offset,
                                      float scale, const char* what) {
    const size_t bytes = static_cast<size_t>(n) * (bf16 ? 2 : 4);
    ASSIGN_OR_RETURN(DeviceBuffer d, DeviceBuffer::Alloc(bytes));
    bytes_ += bytes;
    if (host_ != nullptr) {
      if (src == nullptr || static_cast<int64_t>(src->size()) != n) {
        return absl::InternalError(absl::StrCat("weight ", what, " has ", src ? src->size() : 0,
                                                " values, expected ", n));
      }
      if (bf16) {
        std::vector<uint16_t> h(n);
        for (int64_t i = 0; i < n; ++i) h[i] = ToBf16Bits((*src)[i]);
        RETURN_IF_ERROR(stager_.Copy(d.get(), h.data(), bytes, what));
      } else {
        RETURN_IF_ERROR(stager_.Copy(d.get(), src->data(), bytes, what));
      }
    } else {
      const cudaError_t e = cuda::LaunchFillUniform(d.get(), bf16, n, seed_ + 0x1000193ull * ++counter_, offset,
                                                    scale, nullptr);
      if (e != cudaSuccess) return absl::InternalError(absl::StrCat("generating ", what, ": ", cudaGetErrorString(e)));
    }
    return d;
  }

  // may_fp8: a layer the fp8 GEMMs may run (LoadOptions::keep_fp8's list).
  absl::StatusOr<DLinear> Linear(const LinearWeights* src, int out, int in, bool bias, cuda::GemmType type,
                                 const char* what, bool may_fp8 = false) {
    if (host_ == nullptr && synthetic_fp8_ && may_fp8 && in % 16 == 0) return SyntheticFp8Linear(out, in, bias, what);
    DLinear l;
    l.in = in;
    l.out = out;
    l.type = type;
    if (host_ != nullptr && src != nullptr && src->is_fp8()) {
      if (in % 16 == 0) return Fp8Linear(*src, out, in, what);
      // Decoded as the CPU loader decodes (fp8::Decode times the scale, in f32).
      LinearWeights decoded = *src;
      decoded.w = Dequantise(*src);
      decoded.fp8_codes.clear();
      return Linear(&decoded, out, in, bias, type, what);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(in));
    ASSIGN_OR_RETURN(l.w, Tensor(src ? &src->w : nullptr, static_cast<int64_t>(out) * in,
                                 type == cuda::GemmType::kBF16, 0.0f, scale, what));
    const bool has_bias = host_ != nullptr ? (src != nullptr && !src->b.empty()) : bias;
    if (has_bias) {
      ASSIGN_OR_RETURN(l.b, Tensor(src ? &src->b : nullptr, out, false, 0.0f, 0.02f, what));
    }
    return l;
  }

  absl::StatusOr<DLinear> Fp8Linear(const LinearWeights& src, int out, int in, const char* what) {
    const int64_t bn = (out + 127) / 128, bk = (in + 127) / 128;
    if (static_cast<int64_t>(src.fp8_codes.size()) != int64_t{out} * in ||
        static_cast<int64_t>(src.fp8_scales.size()) != bn * bk) {
      return absl::InternalError(absl::StrCat("fp8 weight ", what, " has ", src.fp8_codes.size(), " codes and ",
                                              src.fp8_scales.size(), " scales, expected ", int64_t{out} * in, " and ",
                                              bn * bk));
    }
    DLinear l;
    l.in = in;
    l.out = out;
    l.fp8 = true;
    ASSIGN_OR_RETURN(l.w, Upload(src.fp8_codes.data(), src.fp8_codes.size(), what));
    // NaN codes read as 0 in every product (the library would read NaN).
    const cudaError_t e = cuda::LaunchClearNanCodes(l.w.as<uint8_t>(), int64_t{out} * in, stager_.stream());
    if (e != cudaSuccess) return absl::InternalError(absl::StrCat("clearing NaN codes of ", what, ": ", cudaGetErrorString(e)));
    ASSIGN_OR_RETURN(l.scale, Upload(src.fp8_scales.data(), src.fp8_scales.size() * 4, what));
    if (!src.b.empty()) {
      ASSIGN_OR_RETURN(l.b, Tensor(&src.b, out, false, 0.0f, 0.0f, what));
    }
    return l;
  }

  // Codes uniform in ±448 with every block's scale 1 / (448 sqrt(in)): the
  // values the bf16 synthetic weights have (uniform ± 1 / sqrt(in)), on the
  // e4m3 grid.
  absl::StatusOr<DLinear> SyntheticFp8Linear(int out, int in, bool bias, const char* what) {
    DLinear l;
    l.in = in;
    l.out = out;
    l.fp8 = true;
    const int64_t n = int64_t{out} * in, blocks = ((out + 127) / 128) * int64_t{(in + 127) / 128};
    ASSIGN_OR_RETURN(l.w, DeviceBuffer::Alloc(static_cast<size_t>(n)));
    bytes_ += static_cast<uint64_t>(n);
    cudaError_t e = cuda::LaunchFillRandomFp8(l.w.as<uint8_t>(), n, seed_ + 0x1000193ull * ++counter_, nullptr);
    if (e != cudaSuccess) return absl::InternalError(absl::StrCat("generating ", what, ": ", cudaGetErrorString(e)));
    ASSIGN_OR_RETURN(l.scale, Tensor(nullptr, blocks, false, 1.0f / (448.0f * std::sqrt(static_cast<float>(in))), 0.0f,
                                     what));
    if (bias) {
      ASSIGN_OR_RETURN(l.b, Tensor(nullptr, out, false, 0.0f, 0.02f, what));
    }
    return l;
  }

  static std::vector<float> Dequantise(const LinearWeights& src) {
    const size_t in = static_cast<size_t>(src.in), bk = (in + 127) / 128;
    std::vector<float> w(src.fp8_codes.size());
    for (size_t r = 0; r < static_cast<size_t>(src.out); ++r) {
      const float* srow = src.fp8_scales.data() + (r / 128) * bk;
      for (size_t c = 0; c < in; ++c) w[r * in + c] = fp8::Decode(src.fp8_codes[r * in + c]) * srow[c / 128];
    }
    return w;
  }

  absl::StatusOr<DeviceBuffer> Upload(const void* data, size_t bytes, const char* what) {
    ASSIGN_OR_RETURN(DeviceBuffer d, DeviceBuffer::Alloc(bytes));
    bytes_ += bytes;
    RETURN_IF_ERROR(stager_.Copy(d.get(), data, bytes, what));
    return d;
  }

  absl::StatusOr<DeviceBuffer> Norm(const std::vector<float>* src, int n, const char* what) {
    return Tensor(src, n, false, 1.0f, 0.1f, what);
  }

  // gate and up stacked into one Linear; fp8 only when their rows fill whole
  // 128-row blocks (the stacked blocks are then gate's, then up's), and down
  // in the same form as gate_up (the MoE kernels take one form per layer).
  absl::StatusOr<DMlp> Mlp(const MlpWeights* src, int hidden, int inter, cuda::GemmType t, bool may_fp8 = false) {
    DMlp m;
    LinearWeights stacked, down;
    const bool stack_fp8 = inter % 128 == 0 && hidden % 16 == 0;
    if (src != nullptr && src->gate.is_fp8() && src->up.is_fp8() && stack_fp8) {
      stacked = src->gate;
      stacked.out = 2 * inter;
      stacked.fp8_codes.insert(stacked.fp8_codes.end(), src->up.fp8_codes.begin(), src->up.fp8_codes.end());
      stacked.fp8_scales.insert(stacked.fp8_scales.end(), src->up.fp8_scales.begin(), src->up.fp8_scales.end());
      down = src->down;
    } else if (src != nullptr) {
      stacked.w = src->gate.is_fp8() ? Dequantise(src->gate) : src->gate.w;
      const std::vector<float> up = src->up.is_fp8() ? Dequantise(src->up) : src->up.w;
      stacked.w.insert(stacked.w.end(), up.begin(), up.end());
      down = src->down;
      if (down.is_fp8()) {
        down.w = Dequantise(down);
        down.fp8_codes.clear();
      }
    }
    ASSIGN_OR_RETURN(m.gate_up, Linear(src ? &stacked : nullptr, 2 * inter, hidden, false, t, "mlp.gate_up_proj",
                                       may_fp8 && stack_fp8));
    ASSIGN_OR_RETURN(m.down, Linear(src ? &down : nullptr, hidden, inter, false, t, "mlp.down_proj",
                                    may_fp8 && stack_fp8 && inter % 16 == 0));
    return m;
  }

  uint64_t bytes() const { return bytes_; }

 private:
  const ModelWeights* host_;
  uint64_t seed_;
  bool synthetic_fp8_;
  Stager stager_;
  uint64_t counter_ = 0;
  uint64_t bytes_ = 0;
};

// The embedding and the head (when asked) from `host` (or the seed).
absl::Status BuildEnds(Builder& b, const ModelConfig& c, bool with_embedding, bool with_head, cuda::GemmType t,
                       const ModelWeights* host, DModel* m) {
  const bool bf16 = t == cuda::GemmType::kBF16;
  const int H = c.hidden_size;
  if (with_embedding) {
    ASSIGN_OR_RETURN(m->embed, b.Tensor(host ? &host->embed : nullptr, static_cast<int64_t>(c.vocab_size) * H, bf16,
                                        0.0f, 1.0f, "embed_tokens"));
    m->embed_bf16 = bf16;
  }
  if (with_head) {
    ASSIGN_OR_RETURN(m->final_norm, b.Norm(host ? &host->final_norm : nullptr, H, "norm"));
    ASSIGN_OR_RETURN(m->lm_head, b.Linear(host ? &host->lm_head : nullptr, c.vocab_size, H, false, t, "lm_head", true));
  }
  return absl::OkStatus();
}

// Layer g from `w` (or the seed).
absl::StatusOr<DLayer> BuildLayer(Builder& b, const ModelConfig& c, int g, cuda::GemmType t, const LayerWeights* w) {
  const int H = c.hidden_size, NH = c.num_heads, QK = c.qk_head_dim(), L = c.kv_lora_rank,
            R = c.qk_rope_head_dim;
  DLayer d;
  ASSIGN_OR_RETURN(d.input_norm, b.Norm(w ? &w->input_norm : nullptr, H, "input_layernorm"));
  ASSIGN_OR_RETURN(d.post_norm, b.Norm(w ? &w->post_attention_norm : nullptr, H, "post_attention_layernorm"));
  const bool bias = c.attention_bias;
  if (c.q_lora_rank == 0) {
    ASSIGN_OR_RETURN(d.q_proj, b.Linear(w ? &w->q_proj : nullptr, NH * QK, H, false, t, "q_proj", true));
  } else {
    ASSIGN_OR_RETURN(d.q_a, b.Linear(w ? &w->q_a : nullptr, c.q_lora_rank, H, bias, t, "q_a_proj", true));
    ASSIGN_OR_RETURN(d.q_a_norm, b.Norm(w ? &w->q_a_norm : nullptr, c.q_lora_rank, "q_a_layernorm"));
    ASSIGN_OR_RETURN(d.q_b, b.Linear(w ? &w->q_b : nullptr, NH * QK, c.q_lora_rank, false, t, "q_b_proj", true));
  }
  ASSIGN_OR_RETURN(d.kv_a, b.Linear(w ? &w->kv_a : nullptr, L + R, H, bias, t, "kv_a_proj_with_mqa", true));
  ASSIGN_OR_RETURN(d.kv_a_norm, b.Norm(w ? &w->kv_a_norm : nullptr, L, "kv_a_layernorm"));
  ASSIGN_OR_RETURN(d.kv_b, b.Linear(w ? &w->kv_b : nullptr, NH * (c.qk_nope_head_dim + c.v_head_dim), L, false, t,
                                    "kv_b_proj"));
  ASSIGN_OR_RETURN(d.o, b.Linear(w ? &w->o : nullptr, H, NH * c.v_head_dim, bias, t, "o_proj", true));
  if (c.layers[g].indexer == IndexerMode::kFull) {
    const IndexerWeights* iw = w ? &w->indexer : nullptr;
    const int IH = c.index_n_heads, ID = c.index_head_dim;
    ASSIGN_OR_RETURN(d.index_wq_b, b.Linear(iw ? &iw->wq_b : nullptr, IH * ID, c.q_lora_rank, false, t, "indexer.wq_b", true));
    ASSIGN_OR_RETURN(d.index_wk, b.Linear(iw ? &iw->wk : nullptr, ID, H, false, t, "indexer.wk", true));
    ASSIGN_OR_RETURN(d.index_weights_proj,
                     b.Linear(iw ? &iw->weights_proj : nullptr, IH, H, false, t, "indexer.weights_proj", true));
    ASSIGN_OR_RETURN(d.index_k_norm_w, b.Norm(iw ? &iw->k_norm_w : nullptr, ID, "indexer.k_norm.weight"));
    ASSIGN_OR_RETURN(d.index_k_norm_b, b.Tensor(iw ? &iw->k_norm_b : nullptr, ID, false, 0.0f, 0.02f,
                                                "indexer.k_norm.bias"));
  }
  if (!c.layers[g].moe) {
    ASSIGN_OR_RETURN(d.dense, b.Mlp(w ? &w->dense : nullptr, H, c.intermediate_size, t, true));
  } else {
    const int E = c.n_routed_experts;
    ASSIGN_OR_RETURN(d.router, b.Linear(w ? &w->router : nullptr, E, H, false, cuda::GemmType::kF32, "mlp.gate"));
    ASSIGN_OR_RETURN(d.router_bias, b.Tensor(w ? &w->router_bias : nullptr, E, false, 0.0f, 0.01f,
                                             "e_score_correction_bias"));
    for (int e = 0; e < E; ++e) {
      ASSIGN_OR_RETURN(DMlp x, b.Mlp(w ? &w->experts[e] : nullptr, H, c.moe_intermediate_size, t, true));
      d.experts.push_back(std::move(x));
    }
    if (c.n_shared_experts > 0) {
      ASSIGN_OR_RETURN(d.shared,
                       b.Mlp(w ? &w->shared : nullptr, H, c.moe_intermediate_size * c.n_shared_experts, t, true));
    }
  }
  return d;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DModel>> BuildDeviceModel(const ModelConfig& c, int layer_begin, int layer_end,
                                                         bool with_embedding, bool with_head,
                                                         cuda::GemmType t, const ModelWeights* host,
                                                         uint64_t seed, bool synthetic_fp8) {
  auto m = std::make_unique<DModel>();
  Builder b(host, seed, synthetic_fp8);
  RETURN_IF_ERROR(BuildEnds(b, c, with_embedding, with_head, t, host, m.get()));
  for (int g = layer_begin; g < layer_end; ++g) {
    ASSIGN_OR_RETURN(DLayer d, BuildLayer(b, c, g, t, host ? &host->layers[g - layer_begin] : nullptr));
    m->layers.push_back(std::move(d));
  }
  RETURN_IF_ERROR(b.Sync());
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return absl::InternalError(absl::StrCat("building weights: ", cudaGetErrorString(e)));
  m->bytes = b.bytes();
  return m;
}

absl::StatusOr<std::unique_ptr<DModel>> BuildDeviceModel(const ModelConfig& c, int layer_begin, int layer_end,
                                                         bool with_embedding, bool with_head, cuda::GemmType t,
                                                         WeightStream& stream,
                                                         const std::function<void(const LoadProgress&)>& progress) {
  auto m = std::make_unique<DModel>();
  Builder b(nullptr, 0, false);
  const auto start = std::chrono::steady_clock::now();
  LoadProgress p;
  p.parts = stream.num_parts();
  const bool ends = with_embedding || with_head;
  int g = layer_begin;
  for (;;) {
    ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> part, stream.Next());
    if (part == nullptr) break;
    b.SetHost(part.get());
    if (ends && p.parts_done == 0) {
      RETURN_IF_ERROR(BuildEnds(b, c, with_embedding, with_head, t, part.get(), m.get()));
    } else {
      if (g >= layer_end || part->layers.size() != 1) return absl::InternalError("the weight stream's parts are out of order");
      ASSIGN_OR_RETURN(DLayer d, BuildLayer(b, c, g++, t, &part->layers[0]));
      m->layers.push_back(std::move(d));
    }
    RETURN_IF_ERROR(b.Sync());  // the part's host memory goes once its copies are done
    b.SetHost(nullptr);
    ++p.parts_done;
    p.host_bytes += part->bytes;
    p.device_bytes = b.bytes();
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (progress) progress(p);
  }
  if (g != layer_end) return absl::InternalError("the weight stream ended early");
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return absl::InternalError(absl::StrCat("building weights: ", cudaGetErrorString(e)));
  m->bytes = b.bytes();
  return m;
}

}  // namespace strata::gpu
