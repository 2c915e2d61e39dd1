#include "kvstore/coli_kv3_file.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kvstore/coli_kv.h"

namespace strata::kv {
namespace {

// The header, the current commit record and why the other is not current.
struct State {
  std::optional<V3Layout> layout;
  V3Commit commit;
  int current = 0;
  uint64_t size = 0;
  std::string other_problem;
};

absl::StatusOr<State> ReadState(File* file, const std::string& path) {
  State st;
  ASSIGN_OR_RETURN(st.size, file->Size());
  std::string head(static_cast<size_t>(std::min<uint64_t>(st.size, 44 + 8 * uint64_t{kMaxLayers})), '\0');
  ASSIGN_OR_RETURN(size_t got, file->Read(0, head.size(), head.data()));
  absl::StatusOr<V3Header> h = DecodeV3Header(std::string_view(head.data(), got));
  if (!h.ok()) return absl::Status(h.status().code(), absl::StrCat(path, ": ", h.status().message()));
  st.layout.emplace(*h);
  const V3Layout& L = *st.layout;
  absl::StatusOr<V3Commit> c[2];
  std::string buf(static_cast<size_t>(L.commit_bytes()), '\0');
  for (int i = 0; i < 2; ++i) {
    if (static_cast<uint64_t>(L.commit_offset(i) + L.commit_bytes()) > st.size) {
      c[i] = absl::DataLossError("commit record cut off");
      continue;
    }
    ASSIGN_OR_RETURN(size_t n, file->Read(static_cast<uint64_t>(L.commit_offset(i)), buf.size(), buf.data()));
    c[i] = DecodeV3Commit(L, std::string_view(buf.data(), n));
  }
  if (!c[0].ok() && !c[1].ok()) {
    return absl::DataLossError(absl::StrCat(path, ": no valid commit record (0: ", c[0].status().message(),
                                            "; 1: ", c[1].status().message(), ")"));
  }
  st.current = !c[0].ok() || (c[1].ok() && c[1]->seq > c[0]->seq) ? 1 : 0;
  st.commit = *c[st.current];
  const absl::StatusOr<V3Commit>& other = c[1 - st.current];
  if (!other.ok()) st.other_problem = std::string(other.status().message());
  return st;
}

absl::Status CheckToken(const V3Layout& L, const char* rec, int64_t p, const std::string& what) {
  if (!V3RecordSealed(rec, L.token_bytes())) {
    return absl::Status(absl::StatusCode::kDataLoss, absl::StrCat(what, " of position ", p, ": CRC32C mismatch"));
  }
  if (LoadI32(rec) != p) {
    return absl::DataLossError(absl::StrCat(what, " of position ", p, " names position ", LoadI32(rec)));
  }
  const int32_t token = LoadI32(rec + 4);
  if (token < 0 || token >= L.header().vocab) {
    return absl::DataLossError(absl::StrCat(what, " of position ", p, ": token id ", token, " outside the vocabulary"));
  }
  return absl::OkStatus();
}

// Checks concatenated block records against the closes they must be.
absl::Status CheckBlocks(const V3Layout& L, std::string_view blocks, int64_t t0, int64_t t1, absl::StatusCode code) {
  size_t at = 0;
  for (const auto& [layer, w] : L.Closes(t0, t1)) {
    const int64_t n = L.block_bytes(layer);
    if (blocks.size() - at < static_cast<size_t>(n)) return absl::Status(code, "block records cut off");
    const char* r = blocks.data() + at;
    if (!V3RecordSealed(r, n)) {
      return absl::Status(code, absl::StrCat("block record of layer ", layer, " block ", w, ": CRC32C mismatch"));
    }
    if (LoadI32(r) != layer || LoadI32(r + 4) != w) {
      return absl::Status(code, absl::StrCat("block record at log byte ", at, " names layer ", LoadI32(r), " block ",
                                             LoadI32(r + 4), "; the log order puts layer ", layer, " block ", w, " there"));
    }
    at += static_cast<size_t>(n);
  }
  if (at != blocks.size()) return absl::Status(code, absl::StrCat(blocks.size() - at, " bytes beyond the block records"));
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------- reader

ColiKv3Reader::ColiKv3Reader(std::unique_ptr<File> file, V3Layout layout, V3Commit commit, int current, uint64_t size)
    : file_(std::move(file)), layout_(std::move(layout)), commit_(std::move(commit)), current_(current), file_size_(size) {}

absl::StatusOr<std::unique_ptr<ColiKv3Reader>> ColiKv3Reader::Open(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(path, OpenMode::kRead));
  ASSIGN_OR_RETURN(State st, ReadState(file.get(), path));
  std::unique_ptr<ColiKv3Reader> r(
      new ColiKv3Reader(std::move(file), std::move(*st.layout), std::move(st.commit), st.current, st.size));
  r->other_problem_ = std::move(st.other_problem);
  return r;
}

absl::Status ColiKv3Reader::ReadTokenRecord(int64_t p, std::string* out) const {
  if (p < first_live() || p >= num_tokens()) {
    return absl::OutOfRangeError(absl::StrCat("position ", p, " has no token record: the committed state holds [",
                                              first_live(), ", ", num_tokens(), ")"));
  }
  const int32_t slot = commit_.slots[static_cast<size_t>(p - first_live())];
  const int64_t off = layout_.slot_offset(slot), n = layout_.token_bytes();
  if (static_cast<uint64_t>(off + n) > file_size_) {
    return absl::DataLossError(absl::StrCat("the token record of position ", p, " (ring slot ", slot,
                                            ") lies beyond the end of the file"));
  }
  out->resize(static_cast<size_t>(n));
  ASSIGN_OR_RETURN(size_t got, file_->Read(static_cast<uint64_t>(off), out->size(), out->data()));
  if (got != out->size()) return absl::DataLossError("the file shrank while reading a token record");
  return CheckToken(layout_, out->data(), p, absl::StrCat("token record (ring slot ", slot, ")"));
}

absl::Status ColiKv3Reader::ReadBlockLog(std::string* out) const {
  const uint64_t end = static_cast<uint64_t>(layout_.log_offset()) + commit_.log_bytes;
  if (commit_.log_bytes > 0 && end > file_size_) {
    return absl::DataLossError(absl::StrCat("the committed block log (", commit_.log_bytes,
                                            " bytes) runs beyond the end of the file"));
  }
  out->resize(static_cast<size_t>(commit_.log_bytes));
  ASSIGN_OR_RETURN(size_t got, file_->Read(static_cast<uint64_t>(layout_.log_offset()), out->size(), out->data()));
  if (got != out->size()) return absl::DataLossError("the file shrank while reading the block log");
  return CheckBlocks(layout_, *out, 0, num_tokens(), absl::StatusCode::kDataLoss);
}

// ---------------------------------------------------------------- writer

ColiKv3Writer::ColiKv3Writer(std::unique_ptr<File> file, V3Layout layout, V3Commit commit, int current)
    : file_(std::move(file)), layout_(std::move(layout)), commit_(std::move(commit)), current_(current) {}

absl::StatusOr<std::unique_ptr<ColiKv3Writer>> ColiKv3Writer::Create(Env* env, const std::string& path,
                                                                     const V3Header& header) {
  RETURN_IF_ERROR(ValidateV3Header(header));
  if (env->FileExists(path)) return absl::AlreadyExistsError(absl::StrCat(path, " already exists"));
  const V3Layout L(header);
  std::string bytes(static_cast<size_t>(L.ring_offset()), '\0');
  const std::string h = EncodeV3Header(header);
  bytes.replace(0, h.size(), h);
  V3Commit c;
  c.seq = 1;
  const std::string c0 = EncodeV3Commit(L, c);
  bytes.replace(static_cast<size_t>(L.commit_offset(0)), c0.size(), c0);
  RETURN_IF_ERROR(WriteFileAtomically(env, path, bytes));
  return Open(env, path);
}

absl::StatusOr<std::unique_ptr<ColiKv3Writer>> ColiKv3Writer::Open(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(path, OpenMode::kReadWrite));
  ASSIGN_OR_RETURN(State st, ReadState(file.get(), path));
  return std::unique_ptr<ColiKv3Writer>(
      new ColiKv3Writer(std::move(file), std::move(*st.layout), std::move(st.commit), st.current));
}

absl::Status ColiKv3Writer::CheckAppend(int64_t new_t, absl::Span<const std::string> recs,
                                        std::string_view blocks) const {
  const int64_t t = num_tokens();
  if (new_t <= t || new_t > kV3MaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat("cannot append from ", t, " to ", new_t, " tokens"));
  }
  const int64_t first = std::max(t, new_t - layout_.live_tokens());
  if (static_cast<int64_t>(recs.size()) != new_t - first) {
    return absl::InvalidArgumentError(absl::StrCat("an append to ", new_t, " tokens takes the token records of [",
                                                   first, ", ", new_t, "); got ", recs.size()));
  }
  for (size_t i = 0; i < recs.size(); ++i) {
    if (static_cast<int64_t>(recs[i].size()) != layout_.token_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat("a token record has ", layout_.token_bytes(), " bytes"));
    }
    absl::Status s = CheckToken(layout_, recs[i].data(), first + static_cast<int64_t>(i), "token record");
    if (!s.ok()) return absl::InvalidArgumentError(s.message());
  }
  return CheckBlocks(layout_, blocks, t, new_t, absl::StatusCode::kInvalidArgument);
}

absl::Status ColiKv3Writer::Append(int64_t new_t, absl::Span<const std::string> recs, std::string_view blocks) {
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("an earlier sync or commit write failed (", broken_.ToString(), "); reopen the file"));
  }
  RETURN_IF_ERROR(CheckAppend(new_t, recs, blocks));
  const int64_t t = num_tokens();
  const int32_t live = layout_.live_tokens();

  // The next commit's slot table: positions still live keep their slots, new
  // ones take the lowest slots the current commit does not use.
  V3Commit next;
  next.seq = commit_.seq + 1;
  next.num_tokens = new_t;
  next.log_bytes = layout_.LogBytes(new_t);
  const int64_t first_live = t - static_cast<int64_t>(commit_.slots.size());
  for (int64_t p = std::max<int64_t>(new_t - live, first_live); p < t; ++p) {
    next.slots.push_back(commit_.slots[static_cast<size_t>(p - first_live)]);
  }
  std::vector<bool> used(static_cast<size_t>(layout_.ring_slots()), false);
  for (int32_t s : commit_.slots) used[static_cast<size_t>(s)] = true;
  int32_t free_slot = 0;
  for (const std::string& rec : recs) {
    while (used[static_cast<size_t>(free_slot)]) ++free_slot;  // at least N free: never runs past R
    RETURN_IF_ERROR(file_->Write(static_cast<uint64_t>(layout_.slot_offset(free_slot)), rec));
    next.slots.push_back(free_slot++);
  }
  if (!blocks.empty()) {
    RETURN_IF_ERROR(file_->Write(static_cast<uint64_t>(layout_.log_offset()) + commit_.log_bytes, blocks));
  }
  absl::Status s = file_->Sync();
  if (s.ok()) s = file_->Write(static_cast<uint64_t>(layout_.commit_offset(1 - current_)), EncodeV3Commit(layout_, next));
  if (s.ok()) s = file_->Sync();
  if (!s.ok()) {
    broken_ = s;
    return s;
  }
  commit_ = std::move(next);
  current_ = 1 - current_;
  return absl::OkStatus();
}

absl::Status ColiKv3Writer::Close() { return file_->Close(); }

}  // namespace strata::kv
