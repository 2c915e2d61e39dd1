// StopMatcher: finds stop strings in text that arrives in pieces.
//
// Generated text reaches the client as deltas, one per token or so, and a
// stop string may be split across any number of them ("Hel" "lo wor" "ld").
// Feed() takes each delta and returns the text that is safe to emit now: it
// holds back the longest tail that could still be the start of a stop string
// and releases it once it cannot. When a stop string completes, the output
// ends just before it; the stop string and anything after it are never
// emitted (OpenAI semantics).
//
// Which stop wins: the first one to complete as the text grows (the
// earliest end position); if several complete at the same byte, the longest
// (it starts earliest); then the lowest index.
//
// Matching is on bytes. Stop strings that are valid UTF-8 (Validate() in
// model/sampler.h requires it) only match on character boundaries, and the
// held-back tail always starts at one, so if every delta is whole UTF-8
// characters so is every piece returned.
//
// Cost: O(delta bytes x number of stop strings) per Feed() (one KMP automaton
// per stop string); memory is the held-back tail, shorter than the longest
// stop string.
//
// Thread-safety: not thread-safe; one per request, used by one thread at a
// time.
#ifndef STRATA_MODEL_STOP_MATCHER_H_
#define STRATA_MODEL_STOP_MATCHER_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

class StopMatcher {
 public:
  struct Result {
    std::string text;      // safe to emit now (may be empty)
    bool stopped = false;  // a stop string completed; generation should end
    int stop_index = -1;   // which one (index into the constructor's vector)
  };

  // Empty strings in `stops` never match (Validate() rejects them earlier).
  // With no stop strings, Feed() returns every delta unchanged.
  explicit StopMatcher(std::vector<std::string> stops);

  // Consumes the next piece of text. Once a stop string has completed,
  // further calls return an empty, stopped result.
  Result Feed(std::string_view delta);

  // Ends the stream: returns the held-back tail (empty after a stop). If no
  // stop string has completed, the matcher then starts afresh (a stop string
  // spanning a Flush() is not found); after a stop it stays stopped.
  std::string Flush();

  bool stopped() const { return stop_index_ >= 0; }
  // Index of the completed stop string, or -1.
  int stop_index() const { return stop_index_; }
  // Bytes currently held back.
  size_t held_back() const { return held_.size(); }

 private:
  struct Stop {
    std::string text;
    std::vector<int> fail;  // KMP prefix function of `text`
    int index;              // in the constructor's vector
    int state = 0;          // longest suffix of the stream that is a prefix
  };

  std::vector<Stop> stops_;
  std::string held_;  // consumed but not yet emitted
  int stop_index_ = -1;
};

}  // namespace strata

#endif  // STRATA_MODEL_STOP_MATCHER_H_
