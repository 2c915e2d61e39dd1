#include "model/tokenizer_bpe.h"

#include <algorithm>
#include <queue>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/tokenizer_json_util.h"
#include "model/tokenizer_utf8.h"

namespace strata::tokenizer_internal {
namespace {

// A model option that must be absent, null or equal to one of the harmless
// values.
absl::Status RequireNeutral(const nlohmann::json& model, const char* key,
                            const std::string& path, const char* what) {
  auto it = model.find(key);
  if (it == model.end() || it->is_null()) return absl::OkStatus();
  if (it->is_string() && it->get<std::string>().empty()) return absl::OkStatus();
  if (it->is_boolean() && !it->get<bool>()) return absl::OkStatus();
  if (it->is_number() && it->get<double>() == 0.0) return absl::OkStatus();
  return JsonUnsupported(absl::StrCat(path, ".", key), *it, what);
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromParsed(TokenizerJson* parsed) {
  const std::string path = "model";
  const nlohmann::json& json = parsed->dom.is_object() && parsed->dom.contains("model")
                                   ? parsed->dom["model"]
                                   : nlohmann::json();
  if (json.is_null()) return JsonInvalid(path, "missing");
  if (!json.is_object()) return JsonTypeError(path, "an object", json);
  // Old files may omit "type"; a vocab with merges is then BPE.
  if (auto type = json.find("type"); type != json.end()) {
    if (!type->is_string()) return JsonTypeError(path + ".type", "a string", *type);
    if (type->get<std::string>() != "BPE") {
      return JsonUnsupported(path + ".type", *type, "only BPE models are supported");
    }
  }
  RETURN_IF_ERROR(RequireNeutral(json, "dropout", path, "BPE dropout is not supported"));
  RETURN_IF_ERROR(RequireNeutral(json, "byte_fallback", path,
                                 "byte fallback is not supported (byte-level BPE needs none)"));
  RETURN_IF_ERROR(RequireNeutral(json, "continuing_subword_prefix", path,
                                 "subword prefixes are not supported"));
  RETURN_IF_ERROR(RequireNeutral(json, "end_of_word_suffix", path,
                                 "end-of-word suffixes are not supported"));

  std::unique_ptr<BpeModel> model(new BpeModel());
  ASSIGN_OR_RETURN(model->fuse_unk_, JsonBool(json, "fuse_unk", path, false));
  ASSIGN_OR_RETURN(model->ignore_merges_, JsonBool(json, "ignore_merges", path, false));

  if (!parsed->has_vocab) {
    auto vocab = json.find("vocab");
    return JsonTypeError(path + ".vocab", "an object of token -> id",
                         vocab == json.end() ? nlohmann::json() : *vocab);
  }
  model->vocab_.reserve(parsed->vocab.size());
  int max_id = -1;
  for (auto& [token, id] : parsed->vocab) {
    max_id = std::max(max_id, id);
    // A repeated key: the later value wins, as in a JSON object.
    model->vocab_[std::move(token)] = id;
  }
  parsed->vocab.clear();
  parsed->vocab.shrink_to_fit();
  model->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [token, id] : model->vocab_) {
    // Several tokens with one id: keep one deterministically (the smallest).
    std::string& slot = model->id_to_token_[id];
    if (slot.empty() || token < slot) slot = token;
  }

  ASSIGN_OR_RETURN(const std::string unk, JsonString(json, "unk_token", path, ""));
  if (!unk.empty()) {
    auto it = model->vocab_.find(unk);
    if (it == model->vocab_.end()) {
      return JsonInvalid(path + ".unk_token",
                         absl::StrCat("\"", unk, "\" is not in the vocabulary"));
    }
    model->unk_id_ = it->second;
  }

  if (!parsed->has_merges) {
    auto merges = json.find("merges");
    if (merges != json.end() && !merges->is_null()) {
      return JsonTypeError(path + ".merges", "an array", *merges);
    }
  }
  RETURN_IF_ERROR(model->LoadMerges(parsed->merges));
  parsed->merges.clear();
  parsed->merges.shrink_to_fit();
  return model;
}

absl::Status BpeModel::LoadMerges(
    const std::vector<std::pair<std::string, std::string>>& merges) {
  merges_.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto a = vocab_.find(left);
    auto b = vocab_.find(right);
    joined.assign(left);
    joined.append(right);
    auto c = vocab_.find(joined);
    if (a == vocab_.end() || b == vocab_.end() || c == vocab_.end()) {
      const std::string& missing = a == vocab_.end() ? left : (b == vocab_.end() ? right : joined);
      return JsonInvalid(absl::StrCat("model.merges[", rank, "]"),
                         absl::StrCat("[", DescribeJson(left), ", ", DescribeJson(right), "]: \"",
                                      missing, "\" is not in the vocabulary"));
    }
    // A later duplicate overrides an earlier one, as in `tokenizers`.
    merges_[PairKey(a->second, b->second)] = Merge{static_cast<int>(rank), c->second};
  }
  return absl::OkStatus();
}

std::optional<int> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(ToAbsl(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeModel::IdToToken(int id) const {
  static const std::string* const kEmpty = new std::string();
  if (id < 0 || id >= static_cast<int>(id_to_token_.size())) return *kEmpty;
  return id_to_token_[id];
}

void BpeModel::Tokenize(std::string_view piece, std::vector<int>* ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(ToAbsl(piece)); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  if (piece.size() > kMaxCachedPieceBytes) {
    MergeWord(piece, ids);
    return;
  }
  CacheShard& shard = cache_[absl::HashOf(ToAbsl(piece)) % kCacheShards];
  {
    absl::MutexLock lock(&shard.mu);
    if (auto it = shard.map.find(ToAbsl(piece)); it != shard.map.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int> word;
  MergeWord(piece, &word);
  ids->insert(ids->end(), word.begin(), word.end());
  absl::MutexLock lock(&shard.mu);
  if (shard.map.size() >= kCacheShardCapacity) shard.map.clear();
  shard.map.emplace(piece, std::move(word));
}

void BpeModel::MergeWord(std::string_view piece, std::vector<int>* ids) const {
  struct Symbol {
    int id;
    int prev;
    int next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  auto push = [&symbols](int id) {
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, true});
  };
  bool pending_unk = false;
  for (size_t i = 0; i < piece.size();) {
    size_t len = 1;
    const auto lead = static_cast<unsigned char>(piece[i]);
    if (lead >= 0xF0) {
      len = 4;
    } else if (lead >= 0xE0) {
      len = 3;
    } else if (lead >= 0xC0) {
      len = 2;
    }
    len = std::min(len, piece.size() - i);
    auto it = vocab_.find(ToAbsl(piece.substr(i, len)));
    i += len;
    if (it != vocab_.end()) {
      if (pending_unk) push(unk_id_);
      pending_unk = false;
      push(it->second);
    } else if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_) push(unk_id_);
      pending_unk = true;
    }
    // Without an unknown token, a character missing from the vocabulary is
    // dropped, as `tokenizers` does.
  }
  if (pending_unk) push(unk_id_);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int rank;
    int pos;
    int new_id;
  };
  auto later = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
  auto enqueue = [&](int pos) {
    const int next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int pos = 0; pos + 1 < static_cast<int>(symbols.size()); ++pos) enqueue(pos);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Skip entries made stale by earlier merges.
    auto it = merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) enqueue(left.prev);
    enqueue(top.pos);
  }
  for (int pos = 0; pos >= 0; pos = symbols[pos].next) ids->push_back(symbols[pos].id);
}

}  // namespace strata::tokenizer_internal
