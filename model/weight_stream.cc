#include "model/weight_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace strata {

WeightStream::WeightStream(const TensorStore& store, const ModelConfig& config, int layer_begin, int layer_end,
                           bool with_embedding, bool with_head, const WeightStreamOptions& options)
    : store_(store),
      config_(config),
      layer_begin_(layer_begin),
      layer_end_(layer_end),
      with_embedding_(with_embedding),
      with_head_(with_head),
      options_(options),
      first_layer_part_(with_embedding || with_head ? 1 : 0),
      num_parts_(first_layer_part_ + std::max(0, layer_end - layer_begin)) {
  {
    absl::MutexLock l(&mu_);
    ready_.resize(num_parts_);
  }
  const int readers = std::clamp(options_.readers, 1, std::max(1, num_parts_));
  for (int i = 0; i < readers; ++i) readers_.emplace_back([this] { Reader(); });
}

WeightStream::~WeightStream() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : readers_) t.join();
}

absl::StatusOr<std::unique_ptr<ModelWeights>> WeightStream::LoadPart(int part) const {
  if (part < first_layer_part_) {
    return LoadWeights(store_, config_, layer_begin_, layer_begin_, with_embedding_, with_head_, options_.load);
  }
  const int layer = layer_begin_ + part - first_layer_part_;
  return LoadWeights(store_, config_, layer, layer + 1, false, false, options_.load);
}

void WeightStream::Reader() {
  const int ahead = std::max(1, options_.max_ahead);
  for (;;) {
    int part;
    {
      absl::MutexLock l(&mu_);
      auto may_start = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || next_to_read_ >= num_parts_ || next_to_read_ < taken_ + ahead;
      };
      mu_.Await(absl::Condition(&may_start));
      if (stopping_ || next_to_read_ >= num_parts_) return;
      part = next_to_read_++;
    }
    auto loaded = std::make_unique<absl::StatusOr<std::unique_ptr<ModelWeights>>>(LoadPart(part));
    absl::MutexLock l(&mu_);
    ready_[part] = std::move(loaded);
  }
}

absl::StatusOr<std::unique_ptr<ModelWeights>> WeightStream::Next() {
  absl::MutexLock l(&mu_);
  if (!failed_.ok()) return failed_;
  if (layer_begin_ < 0 || layer_end_ > config_.num_layers || layer_begin_ > layer_end_) {
    failed_ = absl::InvalidArgumentError(absl::StrCat("layer range [", layer_begin_, ", ", layer_end_,
                                                      ") is outside the model's ", config_.num_layers, " layers"));
    return failed_;
  }
  if (taken_ >= num_parts_) return std::unique_ptr<ModelWeights>();
  const int part = taken_;
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ready_[part] != nullptr; };
  mu_.Await(absl::Condition(&ready));
  absl::StatusOr<std::unique_ptr<ModelWeights>> got = std::move(*ready_[part]);
  ready_[part].reset();
  ++taken_;  // lets a reader start the part max_ahead further on
  if (!got.ok()) failed_ = got.status();
  return got;
}

}  // namespace strata
