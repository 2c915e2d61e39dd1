#include "model/gpu/device_weights.h"

#include <cuda_runtime_api.h>

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

// Creates device tensors from host floats or from the seed.
class Builder {
 public:
  // synthetic_fp8: generated weights of the layers that may be fp8 are fp8.
  Builder(const ModelWeights* host, uint64_t seed, bool synthetic_fp8)
      : host_(host), seed_(seed), synthetic_fp8_(synthetic_fp8) {}

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
      cudaError_t e;
      if (bf16) {
        std::vector<uint16_t> h(n);
        for (int64_t i = 0; i < n; ++i) h[i] = ToBf16Bits((*src)[i]);
        e = cudaMemcpy(d.get(), h.data(), bytes, cudaMemcpyHostToDevice);
      } else {
        e = cudaMemcpy(d.get(), src->data(), bytes, cudaMemcpyHostToDevice);
      }
      if (e != cudaSuccess) return absl::InternalError(absl::StrCat("upload of ", what, ": ", cudaGetErrorString(e)));
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
    const cudaError_t e = cudaMemcpy(d.get(), data, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return absl::InternalError(absl::StrCat("upload of ", what, ": ", cudaGetErrorString(e)));
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
  uint64_t counter_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DModel>> BuildDeviceModel(const ModelConfig& c, int layer_begin, int layer_end,
                                                         bool with_embedding, bool with_head,
                                                         cuda::GemmType t, const ModelWeights* host,
                                                         uint64_t seed, bool synthetic_fp8) {
  auto m = std::make_unique<DModel>();
  Builder b(host, seed, synthetic_fp8);
  const bool bf16 = t == cuda::GemmType::kBF16;
  const int H = c.hidden_size, NH = c.num_heads, QK = c.qk_head_dim(), L = c.kv_lora_rank,
            R = c.qk_rope_head_dim;
  if (with_embedding) {
    ASSIGN_OR_RETURN(m->embed, b.Tensor(host ? &host->embed : nullptr, static_cast<int64_t>(c.vocab_size) * H, bf16,
                                        0.0f, 1.0f, "embed_tokens"));
    m->embed_bf16 = bf16;
  }
  if (with_head) {
    ASSIGN_OR_RETURN(m->final_norm, b.Norm(host ? &host->final_norm : nullptr, H, "norm"));
    ASSIGN_OR_RETURN(m->lm_head, b.Linear(host ? &host->lm_head : nullptr, c.vocab_size, H, false, t, "lm_head", true));
  }
  for (int g = layer_begin; g < layer_end; ++g) {
    const LayerWeights* w = host ? &host->layers[g - layer_begin] : nullptr;
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
    m->layers.push_back(std::move(d));
  }
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return absl::InternalError(absl::StrCat("building weights: ", cudaGetErrorString(e)));
  m->bytes = b.bytes();
  return m;
}

}  // namespace strata::gpu
