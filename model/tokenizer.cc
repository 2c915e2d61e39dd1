#include "model/tokenizer.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/tokenizer_bpe.h"
#include "model/tokenizer_json_reader.h"
#include "model/tokenizer_json_util.h"
#include "model/tokenizer_pretokenizer.h"

namespace strata {
namespace {

using nlohmann::json;
using tokenizer_internal::DescribeJson;
using tokenizer_internal::JsonBool;
using tokenizer_internal::JsonInvalid;
using tokenizer_internal::JsonTypeError;
using tokenizer_internal::JsonTypeName;
using tokenizer_internal::JsonUnsupported;

constexpr uint8_t kKnown = 1;
constexpr uint8_t kSpecial = 2;
constexpr int64_t kMaxId = tokenizer_internal::BpeModel::kMaxTokenId;

const json& Member(const json& obj, const char* key) {
  static const json* const kNull = new json();
  auto it = obj.find(key);
  return it == obj.end() ? *kNull : *it;
}

// Only normalizers that change nothing are accepted: null and (nested)
// Sequences of nothing.
absl::Status CheckNormalizer(const json& value, const std::string& path) {
  if (value.is_null()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::string type, JsonTypeName(value, path));
  if (type != "Sequence") {
    return JsonUnsupported(path + ".type", type,
                           "only null or an empty Sequence normalizer is supported");
  }
  const json& list = Member(value, "normalizers");
  if (!list.is_array()) return JsonTypeError(path + ".normalizers", "an array", list);
  for (size_t i = 0; i < list.size(); ++i) {
    RETURN_IF_ERROR(CheckNormalizer(list[i], absl::StrCat(path, ".normalizers[", i, "]")));
  }
  return absl::OkStatus();
}

// The decoder must be ByteLevel (alone or as the only member of a Sequence).
absl::Status CheckDecoder(const json& value, const std::string& path) {
  if (value.is_null()) {
    return JsonUnsupported(path, value, "byte-level BPE needs the ByteLevel decoder");
  }
  ASSIGN_OR_RETURN(const std::string type, JsonTypeName(value, path));
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "Sequence") {
    const json& list = Member(value, "decoders");
    if (!list.is_array()) return JsonTypeError(path + ".decoders", "an array", list);
    if (list.size() != 1) {
      return JsonUnsupported(path + ".decoders", list,
                             "only a Sequence holding one ByteLevel decoder is supported");
    }
    return CheckDecoder(list[0], path + ".decoders[0]");
  }
  return JsonUnsupported(path + ".type", type, "only the ByteLevel decoder is supported");
}

absl::StatusOr<int> ReadId(const json& value, const std::string& path) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > kMaxId) {
    return JsonTypeError(path, "an id in [0, 2^26)", value);
  }
  return static_cast<int>(value.get<int64_t>());
}

// One TemplateProcessing "single" template: what goes before and after $A.
absl::Status ReadTemplate(const json& value, const std::string& path, std::vector<int>* prefix,
                          std::vector<int>* suffix) {
  const json& single = Member(value, "single");
  if (!single.is_array()) return JsonTypeError(path + ".single", "an array", single);
  const json& specials = Member(value, "special_tokens");
  if (!specials.is_null() && !specials.is_object()) {
    return JsonTypeError(path + ".special_tokens", "an object", specials);
  }
  std::vector<int> before, after;
  int sequences = 0;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string item_path = absl::StrCat(path, ".single[", i, "]");
    const json& item = single[i];
    if (!item.is_object() || item.size() != 1) {
      return JsonTypeError(item_path, "{\"SpecialToken\": ...} or {\"Sequence\": ...}", item);
    }
    if (const json& seq = Member(item, "Sequence"); !seq.is_null()) {
      const json& id = Member(seq, "id");
      if (!id.is_string() || id.get<std::string>() != "A") {
        return JsonInvalid(item_path + ".Sequence.id",
                           absl::StrCat("a single-sequence template can only hold \"A\", got ",
                                        DescribeJson(id)));
      }
      ++sequences;
      continue;
    }
    const json& special = Member(item, "SpecialToken");
    const json& name = Member(special, "id");
    if (!name.is_string()) {
      return JsonTypeError(item_path + ".SpecialToken.id", "a token name", name);
    }
    const json& entry = specials.is_object() ? Member(specials, name.get<std::string>().c_str())
                                             : Member(json(), "");
    const json& ids = Member(entry, "ids");
    if (!ids.is_array()) {
      return JsonInvalid(item_path, absl::StrCat("special token ", DescribeJson(name),
                                                 " has no ids in special_tokens"));
    }
    for (size_t k = 0; k < ids.size(); ++k) {
      ASSIGN_OR_RETURN(const int id,
                       ReadId(ids[k], absl::StrCat(path, ".special_tokens[",
                                                   DescribeJson(name), "].ids[", k, "]")));
      (sequences == 0 ? before : after).push_back(id);
    }
  }
  if (sequences != 1) {
    return JsonInvalid(path + ".single", "the template must hold $A exactly once");
  }
  // Templates applied later wrap the result of earlier ones.
  prefix->insert(prefix->begin(), before.begin(), before.end());
  suffix->insert(suffix->end(), after.begin(), after.end());
  return absl::OkStatus();
}

absl::Status ReadPostProcessor(const json& value, const std::string& path,
                               std::vector<int>* prefix, std::vector<int>* suffix) {
  if (value.is_null()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::string type, JsonTypeName(value, path));
  if (type == "ByteLevel") return absl::OkStatus();  // only adjusts offsets
  if (type == "TemplateProcessing") return ReadTemplate(value, path, prefix, suffix);
  if (type == "Sequence") {
    const json& list = Member(value, "processors");
    if (!list.is_array()) return JsonTypeError(path + ".processors", "an array", list);
    for (size_t i = 0; i < list.size(); ++i) {
      RETURN_IF_ERROR(
          ReadPostProcessor(list[i], absl::StrCat(path, ".processors[", i, "]"), prefix, suffix));
    }
    return absl::OkStatus();
  }
  return JsonUnsupported(path + ".type", type,
                         "supported post-processors are TemplateProcessing, ByteLevel, Sequence");
}

absl::StatusOr<std::vector<AddedToken>> ReadAddedTokens(const json& value) {
  std::vector<AddedToken> tokens;
  if (value.is_null()) return tokens;
  if (!value.is_array()) return JsonTypeError("added_tokens", "an array", value);
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string path = absl::StrCat("added_tokens[", i, "]");
    const json& entry = value[i];
    if (!entry.is_object()) return JsonTypeError(path, "an object", entry);
    AddedToken token;
    ASSIGN_OR_RETURN(token.id, ReadId(Member(entry, "id"), path + ".id"));
    const json& content = Member(entry, "content");
    if (!content.is_string() || content.get<std::string>().empty()) {
      return JsonTypeError(path + ".content", "a non-empty string", content);
    }
    token.content = content.get<std::string>();
    ASSIGN_OR_RETURN(token.special, JsonBool(entry, "special", path, false));
    ASSIGN_OR_RETURN(token.single_word, JsonBool(entry, "single_word", path, false));
    ASSIGN_OR_RETURN(token.lstrip, JsonBool(entry, "lstrip", path, false));
    ASSIGN_OR_RETURN(token.rstrip, JsonBool(entry, "rstrip", path, false));
    ASSIGN_OR_RETURN(token.normalized, JsonBool(entry, "normalized", path, true));
    tokens.push_back(std::move(token));
  }
  return tokens;
}

// What the ByteLevel decoder makes of one token: the bytes its characters
// stand for, or the token's own UTF-8 when any character is not in GPT-2's
// table (added tokens such as "<｜User｜>").
std::string ByteLevelBytes(const std::string& token) {
  std::string bytes;
  bytes.reserve(token.size());
  for (size_t pos = 0; pos < token.size();) {
    size_t len = 0;
    const int b = tokenizer_internal::CharToByte(tokenizer_internal::DecodeUtf8At(token, pos, &len));
    if (b < 0) return token;
    bytes.push_back(static_cast<char>(b));
    pos += len;
  }
  return bytes;
}

absl::Status WithPath(const absl::Status& status, const std::string& path) {
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read tokenizer file ", path));
  auto tokenizer = FromJson(buffer.str());
  if (!tokenizer.ok()) return WithPath(tokenizer.status(), path);
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view text) {
  ASSIGN_OR_RETURN(tokenizer_internal::TokenizerJson parsed,
                   tokenizer_internal::ParseTokenizerJson(text, kMaxId));
  const json& root = parsed.dom;
  if (!root.is_object()) return JsonTypeError("(root)", "an object", root);

  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  RETURN_IF_ERROR(CheckNormalizer(Member(root, "normalizer"), "normalizer"));
  ASSIGN_OR_RETURN(tok->pre_, tokenizer_internal::PreTokenizer::FromJson(
                                  Member(root, "pre_tokenizer"), "pre_tokenizer"));
  if (!tok->pre_->has_byte_level()) {
    return JsonUnsupported("pre_tokenizer", Member(root, "pre_tokenizer"),
                           "only byte-level BPE is supported (no ByteLevel pre-tokenizer)");
  }
  ASSIGN_OR_RETURN(tok->bpe_, tokenizer_internal::BpeModel::FromParsed(&parsed));
  ASSIGN_OR_RETURN(tok->added_tokens_, ReadAddedTokens(Member(root, "added_tokens")));
  RETURN_IF_ERROR(ReadPostProcessor(Member(root, "post_processor"), "post_processor",
                                    &tok->prefix_ids_, &tok->suffix_ids_));
  RETURN_IF_ERROR(CheckDecoder(Member(root, "decoder"), "decoder"));
  // "truncation" and "padding" are ignored: like transformers' tokenizer(text),
  // Strata never truncates or pads.

  // Id tables: added tokens override the vocabulary entry of their id.
  int64_t bound = tok->bpe_->id_bound();
  absl::flat_hash_map<std::string, int> added_by_content;
  absl::flat_hash_set<int> added_ids;
  for (size_t i = 0; i < tok->added_tokens_.size(); ++i) {
    const AddedToken& t = tok->added_tokens_[i];
    const std::string path = absl::StrCat("added_tokens[", i, "]");
    if (!tokenizer_internal::IsValidUtf8(t.content)) {
      return JsonInvalid(path + ".content", "not valid UTF-8");
    }
    if (!added_by_content.emplace(t.content, t.id).second) {
      return JsonInvalid(path, absl::StrCat("duplicate content ", DescribeJson(t.content)));
    }
    if (!added_ids.insert(t.id).second) {
      return JsonInvalid(path + ".id", absl::StrCat("duplicate id ", t.id));
    }
    if (auto vocab_id = tok->bpe_->TokenToId(t.content); vocab_id && *vocab_id != t.id) {
      return JsonInvalid(path + ".id", absl::StrCat("id ", t.id, " but the vocabulary gives ",
                                                    DescribeJson(t.content), " id ", *vocab_id));
    }
    const std::string& owner = tok->bpe_->IdToToken(t.id);
    if (!owner.empty() && owner != t.content) {
      return JsonInvalid(path + ".id", absl::StrCat("id ", t.id, " already names vocabulary token ",
                                                    DescribeJson(owner)));
    }
    bound = std::max<int64_t>(bound, int64_t{t.id} + 1);
  }
  for (int id : tok->prefix_ids_) bound = std::max<int64_t>(bound, int64_t{id} + 1);
  for (int id : tok->suffix_ids_) bound = std::max<int64_t>(bound, int64_t{id} + 1);

  tok->token_text_.resize(bound);
  tok->token_bytes_.resize(bound);
  tok->flags_.assign(bound, 0);
  for (int id = 0; id < tok->bpe_->id_bound(); ++id) {
    const std::string& token = tok->bpe_->IdToToken(id);
    if (token.empty()) continue;
    tok->token_text_[id] = token;
    tok->flags_[id] = kKnown;
  }
  for (const AddedToken& t : tok->added_tokens_) {
    tok->added_ids_[t.content] = t.id;
    tok->token_text_[t.id] = t.content;
    tok->flags_[t.id] = kKnown | (t.special ? kSpecial : 0);
  }
  for (int64_t id = 0; id < bound; ++id) {
    if (tok->flags_[id] & kKnown) tok->token_bytes_[id] = ByteLevelBytes(tok->token_text_[id]);
  }
  ASSIGN_OR_RETURN(tok->added_vocab_,
                   tokenizer_internal::AddedVocabulary::Create(tok->added_tokens_));
  return tok;
}

absl::StatusOr<std::vector<int>> Tokenizer::Encode(std::string_view text,
                                                   bool add_special_tokens) const {
  if (const size_t bad = tokenizer_internal::FindInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("text to encode is not valid UTF-8 (byte offset ", bad, ")"));
  }
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids = prefix_ids_;
  std::vector<tokenizer_internal::AddedVocabulary::Segment> segments;
  added_vocab_->Split(text, &segments);
  std::vector<std::string> pieces;
  for (const auto& segment : segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    pieces.clear();
    RETURN_IF_ERROR(pre_->Run(text.substr(segment.begin, segment.end - segment.begin), &pieces));
    for (const std::string& piece : pieces) bpe_->Tokenize(piece, &ids);
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string Tokenizer::Decode(absl::Span<const int> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int id : ids) {
    if (!IsKnown(id)) continue;
    if (skip_special_tokens && (flags_[id] & kSpecial)) continue;
    bytes += token_bytes_[id];
  }
  return tokenizer_internal::DecodeUtf8Lossy(bytes);
}

bool Tokenizer::IsKnown(int id) const {
  return id >= 0 && id < id_bound() && (flags_[id] & kKnown);
}

bool Tokenizer::IsSpecial(int id) const { return IsKnown(id) && (flags_[id] & kSpecial); }

const std::string& Tokenizer::TokenBytes(int id) const {
  static const std::string* const kEmpty = new std::string();
  return IsKnown(id) ? token_bytes_[id] : *kEmpty;
}

const std::string& Tokenizer::IdToToken(int id) const {
  static const std::string* const kEmpty = new std::string();
  return IsKnown(id) ? token_text_[id] : *kEmpty;
}

std::optional<int> Tokenizer::TokenToId(std::string_view token) const {
  if (auto it = added_ids_.find(tokenizer_internal::ToAbsl(token)); it != added_ids_.end()) {
    return it->second;
  }
  return bpe_->TokenToId(token);
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamDecoder::Add(int id) {
  std::string out;
  if (!tokenizer_.IsKnown(id)) return out;
  if (skip_special_tokens_ && tokenizer_.IsSpecial(id)) return out;
  utf8_.Feed(tokenizer_.TokenBytes(id), &out);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out;
  utf8_.Finish(&out);
  return out;
}

}  // namespace strata
