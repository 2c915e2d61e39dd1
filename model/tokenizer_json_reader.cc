#include "model/tokenizer_json_reader.h"

#include "absl/strings/str_cat.h"
#include "model/tokenizer_json_util.h"

namespace strata::tokenizer_internal {
namespace {

using nlohmann::json;

// Builds a DOM like nlohmann's own parser, except that the members "vocab"
// (an object) and "merges" (an array) of the top-level "model" object are
// streamed into TokenizerJson's vectors.
class Handler : public nlohmann::json_sax<json> {
 public:
  Handler(TokenizerJson* out, int64_t max_id) : out_(out), max_id_(max_id) {}

  const std::string& error() const { return error_; }

  bool null() override { return Scalar(json(nullptr)); }
  bool boolean(bool v) override { return Scalar(json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab) return VocabId(v);
    return Scalar(json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab) {
      return VocabId(v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v));
    }
    return Scalar(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return Scalar(json(v)); }
  bool binary(binary_t&) override { return Fail("binary values are not JSON"); }

  bool string(string_t& v) override {
    switch (mode_) {
      case Mode::kMerges: {
        const size_t space = v.find(' ');
        if (space == std::string::npos || v.find(' ', space + 1) != std::string::npos) {
          return Fail(absl::StrCat("tokenizer.json: model.merges[", out_->merges.size(), "]: ",
                                   DescribeJson(v), " must be two tokens separated by one space"));
        }
        out_->merges.emplace_back(v.substr(0, space), v.substr(space + 1));
        return true;
      }
      case Mode::kMergePair:
        if (pair_size_ >= 2) return BadMerge();
        (pair_size_ == 0 ? pair_.first : pair_.second) = std::move(v);
        ++pair_size_;
        return true;
      case Mode::kVocab:
        return BadVocab(json(v));
      case Mode::kDom:
        return Scalar(json(std::move(v)));
    }
    return false;
  }

  bool key(string_t& v) override {
    if (mode_ == Mode::kVocab) {
      vocab_key_ = std::move(v);
    } else {
      key_ = std::move(v);
    }
    return true;
  }

  bool start_object(std::size_t) override {
    if (mode_ == Mode::kVocab) return BadVocab(json::object());
    if (mode_ != Mode::kDom) return BadMerge();
    if (InModel() && key_ == "vocab") {
      if (out_->has_vocab) return Fail("tokenizer.json: model.vocab appears twice");
      out_->has_vocab = true;
      mode_ = Mode::kVocab;
      return true;
    }
    return Open(json::object());
  }

  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    stack_.pop_back();
    return true;
  }

  bool start_array(std::size_t) override {
    switch (mode_) {
      case Mode::kVocab:
        return BadVocab(json::array());
      case Mode::kMerges:
        mode_ = Mode::kMergePair;
        pair_size_ = 0;
        return true;
      case Mode::kMergePair:
        return BadMerge();
      case Mode::kDom:
        break;
    }
    if (InModel() && key_ == "merges") {
      if (out_->has_merges) return Fail("tokenizer.json: model.merges appears twice");
      out_->has_merges = true;
      mode_ = Mode::kMerges;
      return true;
    }
    return Open(json::array());
  }

  bool end_array() override {
    if (mode_ == Mode::kMergePair) {
      if (pair_size_ != 2) return BadMerge();
      out_->merges.push_back(std::move(pair_));
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      return true;
    }
    stack_.pop_back();
    return true;
  }

  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& e) override {
    if (error_.empty()) {
      error_ = absl::StrCat("tokenizer.json is not valid JSON (byte ", position, "): ", e.what());
    }
    return false;
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };
  static constexpr size_t kMaxDepth = 64;

  // Directly inside the top-level "model" object.
  bool InModel() const {
    return stack_.size() == 2 && stack_[0]->is_object() && stack_[1]->is_object() &&
           stack_[1] == model_;
  }

  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }
  bool BadMerge() {
    return Fail(absl::StrCat("tokenizer.json: model.merges[", out_->merges.size(),
                             "] must be \"a b\" or [\"a\", \"b\"]"));
  }
  bool BadVocab(const json& value) {
    return JsonTypeFail(absl::StrCat("model.vocab[", DescribeJson(vocab_key_), "]"), value);
  }
  bool JsonTypeFail(const std::string& path, const json& value) {
    return Fail(std::string(
        JsonTypeError(path, absl::StrCat("an id in [0, ", max_id_, "]").c_str(), value).message()));
  }
  bool VocabId(int64_t id) {
    if (id < 0 || id > max_id_) return BadVocab(json(id));
    out_->vocab.emplace_back(std::move(vocab_key_), static_cast<int>(id));
    return true;
  }

  // Adds a scalar to the DOM (or rejects it where the bulk members need
  // other types).
  bool Scalar(json&& value) {
    if (mode_ == Mode::kVocab) return BadVocab(value);
    if (mode_ != Mode::kDom) return BadMerge();
    if (stack_.empty()) {
      out_->dom = std::move(value);
      return true;
    }
    Insert(std::move(value));
    return true;
  }

  json* Insert(json&& value) {
    json* top = stack_.back();
    if (top->is_object()) {
      json& slot = (*top)[key_];
      slot = std::move(value);
      return &slot;
    }
    top->push_back(std::move(value));
    return &top->back();
  }

  bool Open(json&& container) {
    // Real files nest about six levels; a deep value would make the
    // recursive walks over the DOM (and its printing) overflow the stack.
    if (stack_.size() >= kMaxDepth) {
      return Fail(absl::StrCat("tokenizer.json nests deeper than ", kMaxDepth, " levels"));
    }
    json* opened;
    if (stack_.empty()) {
      out_->dom = std::move(container);
      opened = &out_->dom;
    } else {
      const bool is_model = stack_.size() == 1 && stack_[0]->is_object() && key_ == "model";
      opened = Insert(std::move(container));
      if (is_model) model_ = opened;
    }
    stack_.push_back(opened);
    return true;
  }

  TokenizerJson* out_;
  const int64_t max_id_;
  std::vector<json*> stack_;  // open containers, outermost first
  json* model_ = nullptr;     // the top-level "model" object, once opened
  std::string key_;
  std::string vocab_key_;
  Mode mode_ = Mode::kDom;
  std::pair<std::string, std::string> pair_;
  int pair_size_ = 0;
  std::string error_;
};

}  // namespace

absl::StatusOr<TokenizerJson> ParseTokenizerJson(std::string_view text, int64_t max_id) {
  TokenizerJson out;
  Handler handler(&out, max_id);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &handler);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json is not valid JSON: ", e.what()));
  }
  if (!ok) {
    return absl::InvalidArgumentError(handler.error().empty() ? "tokenizer.json is not valid JSON"
                                                              : handler.error());
  }
  return out;
}

}  // namespace strata::tokenizer_internal
