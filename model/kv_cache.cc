#include "model/kv_cache.h"

#include <cstddef>

#include "kernels/fp8.h"

namespace strata {
namespace {

// Quantises n floats into codes + scale and appends the dequantised values.
void AppendQuantised(const float* x, int n, std::vector<uint8_t>* codes, std::vector<float>* scales,
                     std::vector<float>* deq) {
  const size_t at = codes->size();
  codes->resize(at + n);
  const float s = fp8::QuantizeRow(x, n, codes->data() + at);
  scales->push_back(s);
  deq->resize(deq->size() + n);
  fp8::DequantizeRow(codes->data() + at, s, n, deq->data() + deq->size() - n);
}

}  // namespace

void SequenceKv::AppendRow(int layer, const float* c, const float* r) {
  LayerKv& L = layers_[layer];
  if (dtype_ == KvDtype::kF32) {
    L.c.insert(L.c.end(), c, c + kv_lora_);
    L.r.insert(L.r.end(), r, r + rope_);
    return;
  }
  AppendQuantised(c, kv_lora_, &L.c_codes, &L.c_scale, &L.c);
  AppendQuantised(r, rope_, &L.r_codes, &L.r_scale, &L.r);
}

void SequenceKv::AppendIndexKey(int layer, const float* k) {
  LayerKv& L = layers_[layer];
  if (!fp8_index_) {
    L.index_k.insert(L.index_k.end(), k, k + index_dim_);
    return;
  }
  std::vector<uint8_t> codes(index_dim_);
  const float s = fp8::QuantizeRow(k, index_dim_, codes.data());
  L.index_k.resize(L.index_k.size() + index_dim_);
  fp8::DequantizeRow(codes.data(), s, index_dim_, L.index_k.data() + L.index_k.size() - index_dim_);
}

void SequenceKv::AppendQuantizedRow(int layer, const uint8_t* c_codes, float c_scale, const uint8_t* r_codes,
                                    float r_scale) {
  LayerKv& L = layers_[layer];
  L.c.resize(L.c.size() + kv_lora_);
  fp8::DequantizeRow(c_codes, c_scale, kv_lora_, L.c.data() + L.c.size() - kv_lora_);
  L.r.resize(L.r.size() + rope_);
  fp8::DequantizeRow(r_codes, r_scale, rope_, L.r.data() + L.r.size() - rope_);
  if (dtype_ == KvDtype::kF32) return;
  L.c_codes.insert(L.c_codes.end(), c_codes, c_codes + kv_lora_);
  L.r_codes.insert(L.r_codes.end(), r_codes, r_codes + rope_);
  L.c_scale.push_back(c_scale);
  L.r_scale.push_back(r_scale);
}

void SequenceKv::AppendStoredIndexKey(int layer, const float* k) {
  LayerKv& L = layers_[layer];
  L.index_k.insert(L.index_k.end(), k, k + index_dim_);
}

void SequenceKv::Truncate(int n) {
  if (n >= num_tokens_) return;
  for (LayerKv& L : layers_) {
    L.c.resize(static_cast<size_t>(n) * kv_lora_);
    L.r.resize(static_cast<size_t>(n) * rope_);
    if (dtype_ == KvDtype::kFp8) {
      L.c_codes.resize(static_cast<size_t>(n) * kv_lora_);
      L.r_codes.resize(static_cast<size_t>(n) * rope_);
      L.c_scale.resize(n);
      L.r_scale.resize(n);
    }
    if (!L.index_k.empty()) L.index_k.resize(static_cast<size_t>(n) * index_dim_);
  }
  num_tokens_ = n;
}

uint64_t SequenceKv::bytes() const {
  uint64_t b = 0;
  for (const LayerKv& L : layers_) {
    b += (L.c.capacity() + L.r.capacity() + L.c_scale.capacity() + L.r_scale.capacity() +
          L.index_k.capacity()) * sizeof(float);
    b += L.c_codes.capacity() + L.r_codes.capacity();
  }
  return b;
}

}  // namespace strata
