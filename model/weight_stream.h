// A stage's weights read part by part on several reader threads, so that a
// GPU engine uploads one part while the next ones are read and the host holds
// only the parts in flight, never the whole stage (docs/gpu-engine.md,
// "Loading").
//
// The parts, in order: the embedding and the head (when asked; part 0, with
// no layers), then one part per layer of [layer_begin, layer_end). Each part
// is LoadWeights of that range with the stream's LoadOptions. Readers start
// part i only while i < (parts taken by Next) + max_ahead, so at most
// max_ahead parts are held at once.
//
// Thread-safety: Next() from one thread at a time; the destructor stops the
// readers (parts being read are finished and dropped).
#ifndef STRATA_MODEL_WEIGHT_STREAM_H_
#define STRATA_MODEL_WEIGHT_STREAM_H_

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace strata {

// Where a streamed load stands, after each part (docs/gpu-engine.md, "Loading").
struct LoadProgress {
  int parts_done = 0, parts = 0;
  uint64_t host_bytes = 0;    // read from the checkpoint so far (as held on the host)
  uint64_t device_bytes = 0;  // resident on the device so far
  double seconds = 0;         // since the first part was asked for
};

struct WeightStreamOptions {
  LoadOptions load;
  int readers = 4;    // reader threads (>= 1)
  int max_ahead = 2;  // parts held at once, read or being read (>= 1)
};

class WeightStream {
 public:
  // `store` and `config` must outlive the stream. The range is checked as
  // LoadWeights checks it (INVALID_ARGUMENT from the first Next()).
  WeightStream(const TensorStore& store, const ModelConfig& config, int layer_begin, int layer_end,
               bool with_embedding, bool with_head, const WeightStreamOptions& options);
  ~WeightStream();
  WeightStream(const WeightStream&) = delete;
  WeightStream& operator=(const WeightStream&) = delete;

  // The number of parts: one per layer, plus one for the embedding and head
  // when either is asked for.
  int num_parts() const { return num_parts_; }

  // The next part in order (its ModelWeights covers that part's range only:
  // layer_begin == layer_end for the embedding/head part), or nullptr after
  // the last. A part that failed to load returns its error, and so does
  // every later call.
  absl::StatusOr<std::unique_ptr<ModelWeights>> Next();

  // Parts the readers have started so far (tests: the max_ahead bound).
  int parts_started() {
    absl::MutexLock l(&mu_);
    return next_to_read_;
  }

 private:
  void Reader();
  absl::StatusOr<std::unique_ptr<ModelWeights>> LoadPart(int part) const;

  const TensorStore& store_;
  const ModelConfig& config_;
  const int layer_begin_, layer_end_;
  const bool with_embedding_, with_head_;
  const WeightStreamOptions options_;
  const int first_layer_part_;  // 1 when part 0 is the embedding/head, else 0
  const int num_parts_;

  absl::Mutex mu_;
  int next_to_read_ ABSL_GUARDED_BY(mu_) = 0;
  int taken_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);  // returned by every Next() after a failure
  std::vector<std::unique_ptr<absl::StatusOr<std::unique_ptr<ModelWeights>>>> ready_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> readers_;
};

}  // namespace strata

#endif  // STRATA_MODEL_WEIGHT_STREAM_H_
