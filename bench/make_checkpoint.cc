// Writes a checkpoint in DeepSeek's release format at a config's real
// dimensions, for the loading benchmark (bench/load_bench.cc): the tensors
// of CheckpointTensorShapes (model/random_model.h) for the first N layers,
// linear weights as F8_E4M3 codes with F32 `weight_scale_inv` 128×128 block
// scales, the embedding, head, norms and router in BF16, the router bias in
// F32; sharded into files of about --shard-gb with
// model.safetensors.index.json. Values are random (codes uniform over the
// finite e4m3 codes, scales 1 / (448 sqrt(in))), generated while writing, so
// memory stays at one 64 MiB buffer whatever the size. config.json is the
// given one with num_hidden_layers = N.
//
//   strata_make_checkpoint --config FILE --layers N --out DIR [--shard-gb 5] [--seed 1]
#include <sys/statvfs.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/config.h"
#include "model/random_model.h"
#include "nlohmann/json.hpp"

namespace {

namespace fs = std::filesystem;

struct Tensor {
  std::string name;
  std::string dtype;  // "F8_E4M3", "F32", "BF16"
  std::vector<int64_t> shape;
  float scale = 0;  // F32 tensors: the constant value of a weight's scales
  uint64_t bytes() const {
    uint64_t n = dtype == "F32" ? 4 : dtype == "BF16" ? 2 : 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
};

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The stored form of each tensor, as DeepSeek's fp8 releases store them.
std::vector<Tensor> StoredTensors(const std::vector<strata::TensorShape>& shapes) {
  std::vector<Tensor> out;
  for (const auto& [name, shape] : shapes) {
    const bool linear = shape.size() == 2 && (EndsWith(name, "_proj.weight") || EndsWith(name, ".wq_b.weight") ||
                                              EndsWith(name, ".wk.weight") || EndsWith(name, "_mqa.weight"));
    if (linear && name != "lm_head.weight") {
      out.push_back({name, "F8_E4M3", shape});
      const float s = 1.0f / (448.0f * std::sqrt(static_cast<float>(shape[1])));
      out.push_back({name + "_scale_inv", "F32", {(shape[0] + 127) / 128, (shape[1] + 127) / 128}, s});
    } else if (EndsWith(name, "e_score_correction_bias")) {
      out.push_back({name, "F32", shape, 0.0f});
    } else {
      out.push_back({name, "BF16", shape});
    }
  }
  return out;
}

// Fills `buf` with the tensor's next bytes.
void Generate(const Tensor& t, std::mt19937_64& rng, std::vector<uint8_t>& buf, size_t n) {
  buf.resize(n);
  if (t.dtype == "F32") {
    for (size_t i = 0; i + 4 <= n; i += 4) std::memcpy(&buf[i], &t.scale, 4);
    return;
  }
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(&buf[i], &v, 8);
  }
  for (; i < n; ++i) buf[i] = static_cast<uint8_t>(rng());
  if (t.dtype == "F8_E4M3") {
    for (size_t j = 0; j < n; ++j) {
      if ((buf[j] & 0x7F) == 0x7F) buf[j] ^= 1;  // no NaN codes
    }
  } else {  // BF16: small finite values (exponent bits 0x3C..0x3F), any mantissa
    for (size_t j = 1; j < n; j += 2) buf[j] = static_cast<uint8_t>((buf[j] & 0x80) | 0x3C | (buf[j] & 0x03));
  }
}

bool WriteShard(const fs::path& path, const std::vector<Tensor>& tensors, std::mt19937_64& rng) {
  nlohmann::ordered_json header;
  uint64_t off = 0;
  for (const Tensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes()}}};
    off += t.bytes();
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const uint64_t len = text.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<uint8_t> buf;
  constexpr size_t kChunk = size_t{64} << 20;
  for (const Tensor& t : tensors) {
    for (uint64_t done = 0; done < t.bytes(); done += kChunk) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, t.bytes() - done));
      Generate(t, rng, buf, n);
      f.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(n));
    }
  }
  f.close();
  return static_cast<bool>(f);
}

int Usage() {
  std::fprintf(stderr, "usage: strata_make_checkpoint --config FILE --layers N --out DIR [--shard-gb 5] [--seed 1]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, out;
  int layers = 0;
  double shard_gb = 5;
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--config") {
      config_path = v;
    } else if (k == "--out") {
      out = v;
    } else if (k == "--layers") {
      layers = std::atoi(v.c_str());
    } else if (k == "--shard-gb") {
      shard_gb = std::atof(v.c_str());
    } else if (k == "--seed") {
      seed = std::strtoull(v.c_str(), nullptr, 10);
    } else {
      return Usage();
    }
  }
  if (argc % 2 != 1 || config_path.empty() || out.empty() || layers < 1 || shard_gb <= 0) return Usage();
  std::ifstream cf(config_path);
  nlohmann::json cj = nlohmann::json::parse(cf, nullptr, false);
  if (cj.is_discarded() || !cj.is_object()) {
    std::fprintf(stderr, "%s: not a JSON object\n", config_path.c_str());
    return 1;
  }
  cj["num_hidden_layers"] = layers;
  auto config = strata::ParseModelConfig(cj.dump());
  if (!config.ok()) {
    std::fprintf(stderr, "%s: %s\n", config_path.c_str(), config.status().ToString().c_str());
    return 1;
  }
  const std::vector<Tensor> tensors = StoredTensors(strata::CheckpointTensorShapes(*config));
  uint64_t total = 0;
  for (const Tensor& t : tensors) total += t.bytes();
  fs::create_directories(out);
  struct statvfs vfs;
  if (statvfs(out.c_str(), &vfs) == 0) {
    const double free_bytes = static_cast<double>(vfs.f_bavail) * vfs.f_frsize;
    if (free_bytes < total * 1.02) {
      std::fprintf(stderr, "%s has %.1f GB free; the checkpoint needs %.1f GB\n", out.c_str(), free_bytes / 1e9,
                   total / 1e9);
      return 1;
    }
  }
  // Shards of about shard_gb, tensors whole, in order.
  std::vector<std::vector<Tensor>> shards(1);
  uint64_t in_shard = 0;
  for (const Tensor& t : tensors) {
    if (in_shard > 0 && in_shard + t.bytes() > shard_gb * 1e9) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += t.bytes();
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  std::mt19937_64 rng(seed);
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    if (!WriteShard(fs::path(out) / name, shards[s], rng)) {
      std::fprintf(stderr, "writing %s failed\n", name);
      return 1;
    }
    for (const Tensor& t : shards[s]) index["weight_map"][t.name] = name;
    std::fprintf(stderr, "wrote %s (%zu tensors)\n", name, shards[s].size());
  }
  std::ofstream(fs::path(out) / "model.safetensors.index.json") << index.dump(1);
  std::ofstream(fs::path(out) / "config.json") << cj.dump(2);
  std::printf("%s: %d layers, %zu tensors, %.2f GB in %zu shards\n", out.c_str(), layers, tensors.size(), total / 1e9,
              shards.size());
  return 0;
}
