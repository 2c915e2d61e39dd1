// Reading and writing `.coli_kv` files through an Env: ColiKvReader,
// ColiKvWriter, and the v1 → v2 upgrade / conversion. The byte layout and the
// append, commit, truncate and upgrade protocols with their crash behaviour
// are specified in docs/coli-kv.md.
#ifndef STRATA_KVSTORE_COLI_KV_FILE_H_
#define STRATA_KVSTORE_COLI_KV_FILE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstore/coli_kv.h"
#include "kvstore/env.h"

namespace strata::kv {

// How ReadRecords returns records.
enum class RecordFormat {
  kStored,       // the file's bytes, unchanged
  kV2,           // v2 encoding: a v2 file's bytes, or a v1 file quantised with the
                 // fp8 codec (QuantizeV1Record); what manifest checksums cover
  kV2Sanitized,  // kV2, then SanitizeV2Record: what a cache loads
  kV1,           // f32 rows: a v1 file's bytes, or a v2 file sanitised and decoded
};

// Read access to one file. The header is validated at Open; the number of
// readable records is min(header nrec, complete records in the file), so a
// short or torn file reads up to its last complete committed record, and no
// allocation is ever larger than what the file holds (×4 for kV1 of a v2 file).
//
// Thread-safety: immutable after Open; ReadRecords may be called from several
// threads at once.
class ColiKvReader {
 public:
  // NOT_FOUND, or a DecodeHeader error (DATA_LOSS / INVALID_ARGUMENT).
  static absl::StatusOr<std::unique_ptr<ColiKvReader>> Open(Env* env, const std::string& path);

  const Header& header() const { return header_; }
  Version version() const { return header_.version; }
  const Dims& dims() const { return header_.dims; }
  const RecordLayout& layout() const { return layout_; }
  uint64_t file_size() const { return file_size_; }
  // Readable committed records.
  int64_t nrec() const { return nrec_; }
  // True when the header promises more records than the file holds.
  bool torn() const { return nrec_ < header_.nrec; }

  // Bytes of one record in `format`.
  int64_t RecordBytes(RecordFormat format) const;

  // Replaces *out with records [first, first + count) in `format`; adds what
  // sanitising changed to *stats (may be null). OUT_OF_RANGE unless
  // 0 <= first <= first + count <= nrec(); DATA_LOSS if the file shrank
  // underneath.
  absl::Status ReadRecords(int64_t first, int64_t count, RecordFormat format, std::string* out,
                           SanitizeStats* stats = nullptr) const;

 private:
  ColiKvReader(std::unique_ptr<File> file, Header header, uint64_t size);

  std::unique_ptr<File> file_;
  Header header_;
  RecordLayout layout_;
  uint64_t file_size_;
  int64_t nrec_;
};

// Appends to, commits, and truncates one file; "one open handle per session".
//
// Protocols (docs/coli-kv.md, "Protocols"): Append writes the records after
// the last committed one, Syncs, then rewrites nrec and Syncs again; a record
// counts only once nrec covers it. Truncate writes the smaller nrec, Syncs,
// then shrinks the file. A failed Sync (or nrec write) leaves the writer
// broken: every later call returns FAILED_PRECONDITION naming the first error,
// and the file must be reopened (what reached the disk is unknown).
//
// Thread-safety: WriteAt and Sync may be called concurrently from several
// threads, also while one thread runs Commit; Append, Commit, Truncate and
// Close must be serialised by the caller. nrec() may be read from any thread.
class ColiKvWriter {
 public:
  // Creates `path` holding only a header with nrec 0, atomically (temporary
  // file, Sync, Rename, SyncDir). ALREADY_EXISTS when `path` exists;
  // INVALID_ARGUMENT for bad dims.
  static absl::StatusOr<std::unique_ptr<ColiKvWriter>> Create(Env* env, const std::string& path,
                                                              Version version, const Dims& dims);

  // Opens an existing file. A torn header (nrec beyond the complete records)
  // is repaired first: nrec is rewritten to the complete count and synced, so
  // that records written later cannot become visible before their commit.
  static absl::StatusOr<std::unique_ptr<ColiKvWriter>> Open(Env* env, const std::string& path);

  ~ColiKvWriter();

  const Header& header() const { return header_; }
  Version version() const { return header_.version; }
  const Dims& dims() const { return header_.dims; }
  const RecordLayout& layout() const { return layout_; }
  int64_t nrec() const { return nrec_.load(std::memory_order_acquire); }
  const std::string& path() const { return path_; }

  // Appends whole records (write, Sync, write nrec, Sync). On error nrec() is
  // unchanged. INVALID_ARGUMENT unless records.size() is a positive multiple of
  // the record size; OUT_OF_RANGE past 2^31 - 1 records.
  absl::Status Append(std::string_view records);

  // Writes `bytes` at `offset_in_record` of record `position` (in place; the
  // record need not be complete). REQUIRES: position >= nrec() (never rewrites
  // a committed record; INVALID_ARGUMENT otherwise) and the bytes inside the
  // record.
  absl::Status WriteAt(int64_t position, int64_t offset_in_record, std::string_view bytes);

  // Writes whole records [position, position + k) in one write, without
  // committing them. REQUIRES: position >= nrec() (INVALID_ARGUMENT otherwise),
  // records.size() a positive multiple of the record size.
  absl::Status WriteRecords(int64_t position, std::string_view records);

  // Makes every completed WriteAt / WriteRecords durable.
  absl::Status Sync();

  // Writes nrec = new_nrec and Syncs. REQUIRES: records [nrec(), new_nrec)
  // were completely written and Synced. FAILED_PRECONDITION when the file is
  // too short to hold them; OUT_OF_RANGE when new_nrec < nrec() or > 2^31 - 1.
  absl::Status Commit(int64_t new_nrec);

  // Drops every record from n on: nrec = n, Sync, shrink the file, Sync.
  // OUT_OF_RANGE unless 0 <= n <= nrec().
  absl::Status Truncate(int64_t n);

  // Reads `n` bytes at file offset `offset` (for owners that read back what
  // they committed). Thread-safe.
  absl::StatusOr<size_t> ReadAt(uint64_t offset, size_t n, char* scratch) const;

  absl::Status Close();

 private:
  ColiKvWriter(std::string path, std::unique_ptr<File> file, Header header, int64_t nrec);
  absl::Status Broken() const;
  void MarkBroken(const absl::Status& s);
  absl::Status WriteNrec(int64_t n);

  const std::string path_;
  std::unique_ptr<File> file_;
  Header header_;
  RecordLayout layout_;
  std::atomic<int64_t> nrec_;
  mutable std::mutex broken_mu_;
  absl::Status broken_status_;  // GUARDED_BY(broken_mu_); the first failure, OK while healthy
};

// Writes the committed records of `in_path` as a complete file of version
// `to` at `out_path`, atomically: `out_path`.tmp is written, Synced, renamed
// over `out_path`, and the directory Synced. v1 → v2 quantises
// (RecordFormat::kV2, no sanitising, so checksums carry over); v2 → v1
// sanitises and decodes; same version copies the committed records. A crash
// leaves `out_path` either as it was or complete. in_path == out_path is
// allowed (an in-place conversion). Records are copied in writes of about
// `copy_bytes` (at least one record each).
inline constexpr int64_t kDefaultCopyBytes = int64_t{16} << 20;
absl::Status ConvertFile(Env* env, const std::string& in_path, const std::string& out_path,
                         Version to, int64_t copy_bytes = kDefaultCopyBytes);

// The v1 → v2 upgrade of docs/coli-kv.md "v1 → v2 upgrade": ConvertFile(path,
// path, kV2) when the file is v1; OK and no change when it is v2 already. A
// crash anywhere leaves either the intact v1 file or the complete v2 file.
absl::Status UpgradeToV2(Env* env, const std::string& path, int64_t copy_bytes = kDefaultCopyBytes);

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_COLI_KV_FILE_H_
