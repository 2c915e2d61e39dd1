#include "model/tokenizer_added.h"

#include <algorithm>
#include <bitset>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "model/tokenizer_regex.h"
#include "model/tokenizer_utf8.h"

namespace strata::tokenizer_internal {
namespace {

// Unicode \w as Rust's regex crate defines it (Alphabetic, marks, decimal
// numbers, connector punctuation, joiners).
bool IsWordChar(uint32_t cp) {
  static const Regex* const word = [] {
    auto regex = Regex::Compile("[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]");
    if (!regex.ok()) regex = Regex::Compile("[\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]");
    return regex.ok() ? regex->release() : nullptr;
  }();
  if (cp < 0x80) {
    return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') ||
           cp == '_';
  }
  if (word == nullptr) return false;
  std::string text;
  AppendUtf8(cp, &text);
  std::vector<std::pair<size_t, size_t>> matches;
  return word->FindAll(text, &matches).ok() && !matches.empty();
}

bool EndsWithWord(std::string_view s) {
  size_t len = 0;
  const uint32_t cp = DecodeLastUtf8(s, &len);
  return len > 0 && IsWordChar(cp);
}

bool StartsWithWord(std::string_view s) {
  if (s.empty()) return false;
  size_t len = 0;
  return IsWordChar(DecodeUtf8At(s, 0, &len));
}

// Start of the whitespace run that ends `s`.
size_t TrailingSpaceStart(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t len = 0;
    const uint32_t cp = DecodeLastUtf8(s.substr(0, end), &len);
    if (!IsUnicodeWhiteSpace(cp)) break;
    end -= len;
  }
  return end;
}

// Length of the whitespace run that starts `s`.
size_t LeadingSpaceLength(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t len = 0;
    const uint32_t cp = DecodeUtf8At(s, pos, &len);
    if (!IsUnicodeWhiteSpace(cp)) break;
    pos += len;
  }
  return pos;
}

}  // namespace

// A byte trie over token contents; LongestAt() gives the longest token that
// starts at a position, which scanned left to right yields leftmost-longest
// non-overlapping matches.
class AddedVocabulary::Matcher {
 public:
  Matcher() { terminal_.push_back(-1); }

  void Add(std::string_view content, int token_index) {
    first_.set(static_cast<unsigned char>(content[0]));
    int node = 0;
    for (char c : content) {
      const uint64_t key = EdgeKey(node, c);
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        const int child = static_cast<int>(terminal_.size());
        terminal_.push_back(-1);
        it = edges_.emplace(key, child).first;
      }
      node = it->second;
    }
    terminal_[node] = token_index;
  }

  bool empty() const { return first_.none(); }
  bool MayStartAt(unsigned char c) const { return first_.test(c); }

  int LongestAt(std::string_view text, size_t pos, size_t* len) const {
    int node = 0;
    int best = -1;
    for (size_t i = pos; i < text.size(); ++i) {
      auto it = edges_.find(EdgeKey(node, text[i]));
      if (it == edges_.end()) break;
      node = it->second;
      if (terminal_[node] >= 0) {
        best = terminal_[node];
        *len = i + 1 - pos;
      }
    }
    return best;
  }

 private:
  static uint64_t EdgeKey(int node, char c) {
    return (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(c);
  }

  std::bitset<256> first_;
  absl::flat_hash_map<uint64_t, int> edges_;
  std::vector<int> terminal_;  // token index ending at each node, or -1
};

AddedVocabulary::AddedVocabulary() = default;
AddedVocabulary::~AddedVocabulary() = default;

absl::StatusOr<std::unique_ptr<AddedVocabulary>> AddedVocabulary::Create(
    const std::vector<AddedToken>& tokens) {
  std::unique_ptr<AddedVocabulary> vocab(new AddedVocabulary());
  vocab->tokens_ = tokens;
  vocab->raw_ = std::make_unique<Matcher>();
  vocab->normalized_ = std::make_unique<Matcher>();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].content.empty()) continue;
    (tokens[i].normalized ? vocab->normalized_ : vocab->raw_)
        ->Add(tokens[i].content, static_cast<int>(i));
  }
  return vocab;
}

void AddedVocabulary::FindMatches(std::string_view sentence, const Matcher& matcher,
                                  std::vector<Segment>* out) const {
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < sentence.size()) {
    if (!matcher.MayStartAt(static_cast<unsigned char>(sentence[pos]))) {
      ++pos;
      continue;
    }
    size_t len = 0;
    const int index = matcher.LongestAt(sentence, pos, &len);
    if (index < 0) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = pos + len;
    pos = stop;  // the next search starts after this match, kept or not
    const AddedToken& token = tokens_[index];
    if (token.single_word) {
      const bool space_before = start == 0 || !EndsWithWord(sentence.substr(0, start));
      const bool space_after = stop == sentence.size() || !StartsWithWord(sentence.substr(stop));
      if (!space_before || !space_after) continue;
    }
    if (token.lstrip) {
      start = std::max(TrailingSpaceStart(sentence.substr(0, start)), start_offset);
    }
    if (token.rstrip) stop += LeadingSpaceLength(sentence.substr(stop));
    // A token only begins where the previous one ended or later.
    start = std::max(start, start_offset);
    if (start_offset < start) out->push_back({start_offset, start, -1});
    out->push_back({start, stop, token.id});
    start_offset = stop;
  }
  if (start_offset < sentence.size()) out->push_back({start_offset, sentence.size(), -1});
}

void AddedVocabulary::Split(std::string_view text, std::vector<Segment>* out) const {
  if (text.empty()) return;
  std::vector<Segment> first;
  if (raw_->empty()) {
    first.push_back({0, text.size(), -1});
  } else {
    FindMatches(text, *raw_, &first);
  }
  if (normalized_->empty()) {
    out->insert(out->end(), first.begin(), first.end());
    return;
  }
  std::vector<Segment> inner;
  for (const Segment& segment : first) {
    if (segment.id >= 0) {
      out->push_back(segment);
      continue;
    }
    inner.clear();
    FindMatches(text.substr(segment.begin, segment.end - segment.begin), *normalized_, &inner);
    for (Segment s : inner) {
      s.begin += segment.begin;
      s.end += segment.begin;
      out->push_back(s);
    }
  }
}

}  // namespace strata::tokenizer_internal
