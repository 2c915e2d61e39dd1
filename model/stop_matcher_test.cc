#include "model/stop_matcher.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// Feeds `deltas` in order and returns every piece emitted (Flush included if
// the stream did not stop), plus the final state.
struct Streamed {
  std::vector<std::string> pieces;
  std::string text;  // pieces joined
  bool stopped = false;
  int stop_index = -1;
};

Streamed FeedAll(StopMatcher& m, const std::vector<std::string>& deltas) {
  Streamed run;
  for (const std::string& d : deltas) {
    StopMatcher::Result r = m.Feed(d);
    run.pieces.push_back(r.text);
    run.text += r.text;
    if (r.stopped) {
      run.stopped = true;
      run.stop_index = r.stop_index;
      break;
    }
  }
  if (!run.stopped) {
    run.pieces.push_back(m.Flush());
    run.text += run.pieces.back();
  }
  return run;
}

TEST(StopMatcherTest, NoStopsPassesTextThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.Feed("Hello").text, "Hello");
  EXPECT_EQ(m.Feed(" world").text, " world");
  EXPECT_EQ(m.held_back(), 0u);
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, StopSplitAcrossDeltas) {
  StopMatcher m({"world"});
  StopMatcher::Result r = m.Feed("Hel");
  EXPECT_EQ(r.text, "Hel");
  EXPECT_FALSE(r.stopped);
  r = m.Feed("lo wor");
  EXPECT_EQ(r.text, "lo ");  // "wor" might start "world"
  EXPECT_EQ(m.held_back(), 3u);
  r = m.Feed("ld");
  EXPECT_EQ(r.text, "");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.stop_index, 0);
  EXPECT_TRUE(m.stopped());
  // After a stop nothing more comes out.
  r = m.Feed("more");
  EXPECT_EQ(r.text, "");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, StopSpanningManyDeltasOneByteEach) {
  StopMatcher m({"Hello world"});
  const std::string text = "Say Hello worlds. Hello world!";
  std::vector<std::string> deltas;
  for (char c : text) deltas.push_back(std::string(1, c));
  const Streamed run = FeedAll(m, deltas);
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.text, "Say ");
}

TEST(StopMatcherTest, HeldBackTextIsReleasedWhenItCannotMatch) {
  StopMatcher m({"world"});
  EXPECT_EQ(m.Feed("a wo").text, "a ");
  EXPECT_EQ(m.Feed("rm").text, "worm");
  EXPECT_EQ(m.held_back(), 0u);
}

TEST(StopMatcherTest, OverlappingPrefixes) {
  // "aab" inside "aaab": a naive matcher that restarts after the failed
  // "aa" + "a" misses it.
  {
    StopMatcher m({"aab"});
    const Streamed run = FeedAll(m, {"a", "a", "a", "b", "c"});
    EXPECT_TRUE(run.stopped);
    EXPECT_EQ(run.text, "a");
    EXPECT_THAT(run.pieces, testing::ElementsAre("", "", "a", ""));
  }
  {
    StopMatcher m({"aab"});
    EXPECT_EQ(FeedAll(m, {"xaaab"}).text, "xa");
  }
  {
    StopMatcher m({"abac"});
    const Streamed run = FeedAll(m, {"ab", "ab", "ac", "zz"});
    EXPECT_TRUE(run.stopped);
    EXPECT_EQ(run.text, "ab");
  }
}

TEST(StopMatcherTest, FirstStopToCompleteWins) {
  {
    // "lo" completes before "world" would.
    StopMatcher m({"world", "lo"});
    const Streamed run = FeedAll(m, {"Hel", "lo wor", "ld"});
    EXPECT_TRUE(run.stopped);
    EXPECT_EQ(run.stop_index, 1);
    EXPECT_EQ(run.text, "Hel");
  }
  {
    // "bc" completes before "abcd", although "abcd" starts earlier.
    StopMatcher m({"abcd", "bc"});
    const Streamed run = FeedAll(m, {"xab", "cd"});
    EXPECT_EQ(run.stop_index, 1);
    EXPECT_EQ(run.text, "xa");
  }
  {
    // Both complete on the same byte: the longer one (earlier start).
    StopMatcher m({"bc", "abc"});
    const Streamed run = FeedAll(m, {"xa", "bc"});
    EXPECT_EQ(run.stop_index, 1);
    EXPECT_EQ(run.text, "x");
  }
}

TEST(StopMatcherTest, EmptyStopStringsAreIgnoredButIndicesKept) {
  StopMatcher m({"", "END"});
  const Streamed run = FeedAll(m, {"abc", "EN", "D"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.stop_index, 1);
  EXPECT_EQ(run.text, "abc");
}

TEST(StopMatcherTest, StopAtTheVeryStart) {
  StopMatcher m({"###"});
  const Streamed run = FeedAll(m, {"##", "#", "text"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.text, "");
}

TEST(StopMatcherTest, FlushReleasesTheHeldBackTail) {
  StopMatcher m({"</s>"});
  EXPECT_EQ(m.Feed("answer </").text, "answer ");
  EXPECT_EQ(m.held_back(), 2u);
  EXPECT_EQ(m.Flush(), "</");
  EXPECT_EQ(m.held_back(), 0u);
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.Flush(), "");
}

// True if `s` is whole UTF-8 characters (structure only).
bool WholeUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80         ? 1
                 : (c >> 5) == 6  ? 2
                 : (c >> 4) == 14 ? 3
                 : (c >> 3) == 30 ? 4
                                  : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t j = 1; j < len; ++j) {
      if ((static_cast<unsigned char>(s[i + j]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

TEST(StopMatcherTest, Utf8StopsAndPiecesStayWholeCharacters) {
  {
    StopMatcher m({"世界"});
    const Streamed run = FeedAll(m, {"你好", "，世", "界！"});
    EXPECT_TRUE(run.stopped);
    EXPECT_EQ(run.text, "你好，");
    for (const std::string& p : run.pieces) EXPECT_TRUE(WholeUtf8(p)) << p;
  }
  {
    // "日本" is held while it might become "日本語", then released whole.
    StopMatcher m({"日本語"});
    EXPECT_EQ(m.Feed("私は日").text, "私は");
    EXPECT_EQ(m.Feed("本").text, "");
    EXPECT_EQ(m.Feed("人です").text, "日本人です");
  }
  {
    // "é" (C3 A9) and "ê" (C3 AA) share a lead byte; no false match.
    StopMatcher m({"é", "😀"});
    const Streamed run = FeedAll(m, {"tê", "te", "😃", "!"});
    EXPECT_FALSE(run.stopped);
    EXPECT_EQ(run.text, "tête😃!");
    for (const std::string& p : run.pieces) EXPECT_TRUE(WholeUtf8(p)) << p;
  }
  {
    StopMatcher m({"😀"});
    const Streamed run = FeedAll(m, {"a😃", "b😀c"});
    EXPECT_EQ(run.text, "a😃b");
  }
}

// Reference: the stop that completes first in the whole text (longest on a
// tie, then lowest index), found by brute force.
Streamed Reference(const std::string& text,
                   const std::vector<std::string>& stops) {
  Streamed run;
  for (size_t end = 1; end <= text.size(); ++end) {
    int best = -1;
    for (size_t i = 0; i < stops.size(); ++i) {
      const std::string& s = stops[i];
      if (s.empty() || s.size() > end) continue;
      if (text.compare(end - s.size(), s.size(), s) != 0) continue;
      if (best < 0 || s.size() > stops[best].size()) best = static_cast<int>(i);
    }
    if (best >= 0) {
      run.stopped = true;
      run.stop_index = best;
      run.text = text.substr(0, end - stops[best].size());
      return run;
    }
  }
  run.text = text;
  return run;
}

TEST(StopMatcherTest, RandomStreamsMatchBruteForce) {
  std::mt19937 gen(2718);
  auto rand_string = [&](int min_len, int max_len) {
    std::uniform_int_distribution<int> len(min_len, max_len);
    std::uniform_int_distribution<int> ch(0, 2);  // small alphabet: overlaps
    std::string s;
    for (int n = len(gen); n > 0; --n) s.push_back("abc"[ch(gen)]);
    return s;
  };
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<std::string> stops;
    const int n_stops = std::uniform_int_distribution<int>(1, 3)(gen);
    for (int i = 0; i < n_stops; ++i) stops.push_back(rand_string(1, 5));
    const std::string text = rand_string(0, 30);
    std::vector<std::string> deltas;
    for (size_t pos = 0; pos < text.size();) {
      const size_t len = std::uniform_int_distribution<size_t>(0, 4)(gen);
      deltas.push_back(text.substr(pos, len));
      pos += len;
    }
    StopMatcher m(stops);
    const Streamed got = FeedAll(m, deltas);
    const Streamed want = Reference(text, stops);
    ASSERT_EQ(got.stopped, want.stopped) << text;
    ASSERT_EQ(got.stop_index, want.stop_index) << text;
    ASSERT_EQ(got.text, want.text) << text;
    // Never more held back than a stop string could need.
    size_t longest = 0;
    for (const std::string& s : stops) longest = std::max(longest, s.size());
    ASSERT_LT(m.held_back(), longest);
  }
}

}  // namespace
}  // namespace strata
