#include "model/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace strata {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].empty()) continue;
    Stop s;
    s.text = std::move(stops[i]);
    s.index = static_cast<int>(i);
    // fail[j]: length of the longest proper prefix of text[0..j] that is
    // also a suffix of it.
    const std::string& t = s.text;
    s.fail.assign(t.size(), 0);
    for (size_t j = 1, k = 0; j < t.size(); ++j) {
      while (k > 0 && t[j] != t[k]) k = s.fail[k - 1];
      if (t[j] == t[k]) ++k;
      s.fail[j] = static_cast<int>(k);
    }
    stops_.push_back(std::move(s));
  }
}

StopMatcher::Result StopMatcher::Feed(std::string_view delta) {
  Result result;
  if (stopped()) {
    result.stopped = true;
    result.stop_index = stop_index_;
    return result;
  }
  if (stops_.empty()) {
    result.text.assign(delta);
    return result;
  }

  // `held_` + `delta` is everything not yet emitted. Every state counts bytes
  // at the end of the stream, and no state exceeds held_.size() on entry
  // (that is what was held back), so a match never reaches into text that
  // was already emitted.
  std::string text = std::move(held_);
  held_.clear();
  const size_t base = text.size();
  text.append(delta);

  for (size_t pos = base; pos < text.size(); ++pos) {
    const char c = text[pos];
    const Stop* done = nullptr;
    for (Stop& s : stops_) {
      int st = s.state;
      while (st > 0 && s.text[st] != c) st = s.fail[st - 1];
      if (s.text[st] == c) ++st;
      if (st == static_cast<int>(s.text.size())) {
        if (done == nullptr || s.text.size() > done->text.size()) done = &s;
        st = s.fail[st - 1];  // keep the automaton valid
      }
      s.state = st;
    }
    if (done != nullptr) {
      stop_index_ = done->index;
      const size_t start = pos + 1 - done->text.size();
      text.resize(start);
      result.text = std::move(text);
      result.stopped = true;
      result.stop_index = stop_index_;
      return result;
    }
  }

  int hold = 0;
  for (const Stop& s : stops_) hold = std::max(hold, s.state);
  held_.assign(text, text.size() - hold, hold);
  text.resize(text.size() - hold);
  result.text = std::move(text);
  return result;
}

std::string StopMatcher::Flush() {
  std::string out = std::move(held_);
  held_.clear();
  for (Stop& s : stops_) s.state = 0;
  return out;
}

}  // namespace strata
