// Reading and writing `.coli_kv` v3 files (DeepSeek-V4 sequence state)
// through an Env. The layout and the create / append protocols with their
// crash behaviour are specified in docs/coli-kv.md, "Version 3": a file is a
// header, two commit records, a ring of token records and a log of block
// records; an append writes its records where no committed record lives,
// syncs, then writes a new commit record over the older of the two and syncs
// again — acknowledged only then. A crash at any point leaves the state of the
// last acknowledged append, or of the one in flight.
#ifndef STRATA_KVSTORE_COLI_KV3_FILE_H_
#define STRATA_KVSTORE_COLI_KV3_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvstore/coli_kv3.h"
#include "kvstore/env.h"

namespace strata::kv {

// Read access to the committed state of one v3 file. Open picks the current
// commit record (the valid one with the larger seq); records are checked when
// read, and nothing larger than the file is ever allocated.
//
// Thread-safety: immutable after Open; reads may run from several threads.
class ColiKv3Reader {
 public:
  // NOT_FOUND; a DecodeV3Header error (INVALID_ARGUMENT: not a v3 file;
  // DATA_LOSS: corrupt header); DATA_LOSS when neither commit record is valid.
  static absl::StatusOr<std::unique_ptr<ColiKv3Reader>> Open(Env* env, const std::string& path);

  const V3Header& header() const { return layout_.header(); }
  const V3Layout& layout() const { return layout_; }
  const V3Commit& commit() const { return commit_; }
  int64_t num_tokens() const { return commit_.num_tokens; }
  // Which commit record is current: 0 or 1.
  int current() const { return current_; }
  uint64_t file_size() const { return file_size_; }
  // Why the other commit record is not current ("" when it is valid and older).
  const std::string& other_commit_problem() const { return other_problem_; }

  // The first position whose token record the committed state holds:
  // T − min(T, live_tokens).
  int64_t first_live() const { return commit_.num_tokens - static_cast<int64_t>(commit_.slots.size()); }

  // Replaces *out with the token record of position p. OUT_OF_RANGE unless
  // first_live() <= p < T; DATA_LOSS when the file does not hold it, its
  // CRC32C differs, or it names another position or a token id outside the
  // vocabulary.
  absl::Status ReadTokenRecord(int64_t p, std::string* out) const;

  // Replaces *out with the committed block log; DATA_LOSS when the file does
  // not hold it or a record's CRC32C, layer or block index is not the one the
  // log order puts there.
  absl::Status ReadBlockLog(std::string* out) const;

 private:
  ColiKv3Reader(std::unique_ptr<File> file, V3Layout layout, V3Commit commit, int current, uint64_t size);

  std::unique_ptr<File> file_;
  V3Layout layout_;
  V3Commit commit_;
  int current_;
  uint64_t file_size_;
  std::string other_problem_;
};

// Appends to one v3 file: the single writer of a session.
//
// Thread-safety: not thread-safe; one thread at a time.
class ColiKv3Writer {
 public:
  // Creates `path` with the header, commit record 0 (seq 1, no tokens) and
  // commit record 1 zeroed (invalid), atomically (temporary file, Sync,
  // Rename, SyncDir). ALREADY_EXISTS when it exists; INVALID_ARGUMENT for a
  // bad header.
  static absl::StatusOr<std::unique_ptr<ColiKv3Writer>> Create(Env* env, const std::string& path,
                                                               const V3Header& header);
  // Opens an existing file at its current commit (the errors of
  // ColiKv3Reader::Open).
  static absl::StatusOr<std::unique_ptr<ColiKv3Writer>> Open(Env* env, const std::string& path);

  const V3Layout& layout() const { return layout_; }
  const V3Commit& commit() const { return commit_; }
  int64_t num_tokens() const { return commit_.num_tokens; }

  // Advances the committed state from T = num_tokens() to new_t tokens.
  // token_records: the sealed records of positions [max(T, new_t − N), new_t)
  // in order (N = live_tokens); blocks: the sealed block records of
  // layout().Closes(T, new_t), concatenated in that order. Writes the token
  // records into ring slots no committed position uses and the blocks after
  // the committed log, Syncs, writes the new commit record over the older one,
  // Syncs — acknowledged. INVALID_ARGUMENT (nothing written) for new_t <= T,
  // beyond 2^31 − 1, or records that are not those; RESOURCE_EXHAUSTED etc.
  // from a failed write (the committed state unchanged, the writer usable); a
  // failed Sync or commit write leaves the writer broken
  // (FAILED_PRECONDITION from then on: reopen the file).
  absl::Status Append(int64_t new_t, absl::Span<const std::string> token_records, std::string_view blocks);

  absl::Status Close();

 private:
  ColiKv3Writer(std::unique_ptr<File> file, V3Layout layout, V3Commit commit, int current);
  absl::Status CheckAppend(int64_t new_t, absl::Span<const std::string> token_records,
                           std::string_view blocks) const;

  std::unique_ptr<File> file_;
  V3Layout layout_;
  V3Commit commit_;
  int current_;
  absl::Status broken_;  // the first failed sync or commit write
};

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_COLI_KV3_FILE_H_
