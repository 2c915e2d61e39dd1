#include "kvstore/coli_kv_file.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace strata::kv {
namespace {

constexpr int64_t kMaxNrec = std::numeric_limits<int32_t>::max();
// Conversions move at most this many bytes of records per step.

absl::StatusOr<Header> ReadHeader(File* file, const std::string& path, uint64_t size) {
  char buf[kHeaderBytes];
  const size_t want = static_cast<size_t>(std::min<uint64_t>(size, kHeaderBytes));
  ASSIGN_OR_RETURN(size_t got, file->Read(0, want, buf));
  absl::StatusOr<Header> h = DecodeHeader(std::string_view(buf, got));
  if (!h.ok()) return absl::Status(h.status().code(), absl::StrCat(path, ": ", h.status().message()));
  return h;
}

int64_t CompleteRecords(const RecordLayout& layout, uint64_t size) {
  if (size < static_cast<uint64_t>(kHeaderBytes)) return 0;
  return static_cast<int64_t>((size - kHeaderBytes) / static_cast<uint64_t>(layout.record_bytes()));
}

}  // namespace

// ---------------------------------------------------------------- reader

ColiKvReader::ColiKvReader(std::unique_ptr<File> file, Header header, uint64_t size)
    : file_(std::move(file)),
      header_(header),
      layout_(header.version, header.dims),
      file_size_(size),
      nrec_(std::min<int64_t>(header.nrec, CompleteRecords(layout_, size))) {}

absl::StatusOr<std::unique_ptr<ColiKvReader>> ColiKvReader::Open(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(path, OpenMode::kRead));
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  ASSIGN_OR_RETURN(Header header, ReadHeader(file.get(), path, size));
  return std::unique_ptr<ColiKvReader>(new ColiKvReader(std::move(file), header, size));
}

int64_t ColiKvReader::RecordBytes(RecordFormat format) const {
  switch (format) {
    case RecordFormat::kStored:
      return layout_.record_bytes();
    case RecordFormat::kV2:
    case RecordFormat::kV2Sanitized:
      return RecordLayout(Version::kV2, dims()).record_bytes();
    case RecordFormat::kV1:
      return RecordLayout(Version::kV1, dims()).record_bytes();
  }
  return 0;
}

absl::Status ColiKvReader::ReadRecords(int64_t first, int64_t count, RecordFormat format,
                                       std::string* out, SanitizeStats* stats) const {
  if (first < 0 || count < 0 || first > nrec_ || count > nrec_ - first) {
    return absl::OutOfRangeError(absl::StrCat("records [", first, ", ", first + count,
                                              ") are not within the ", nrec_,
                                              " committed records"));
  }
  const int64_t stored = layout_.record_bytes();
  const int64_t out_bytes = RecordBytes(format);
  const bool same = format == RecordFormat::kStored ||
                    (version() == Version::kV2 && format == RecordFormat::kV2) ||
                    (version() == Version::kV1 && format == RecordFormat::kV1);
  std::string raw;
  std::string* dst = same ? out : &raw;
  dst->resize(static_cast<size_t>(count * stored));
  ASSIGN_OR_RETURN(size_t got, file_->Read(static_cast<uint64_t>(layout_.file_offset(first)),
                                           dst->size(), dst->data()));
  if (got != dst->size()) {
    return absl::DataLossError(absl::StrCat("the file shrank while reading records [", first, ", ",
                                            first + count, ")"));
  }
  if (same) return absl::OkStatus();

  out->resize(static_cast<size_t>(count * out_bytes));
  const RecordLayout v2(Version::kV2, dims());
  SanitizeStats local;
  SanitizeStats* st = stats != nullptr ? stats : &local;
  std::string tmp;
  for (int64_t i = 0; i < count; ++i) {
    const char* src = raw.data() + i * stored;
    char* o = out->data() + i * out_bytes;
    switch (format) {
      case RecordFormat::kV2:
        QuantizeV1Record(dims(), src, o);  // only reached for v1 files
        break;
      case RecordFormat::kV2Sanitized:
        if (version() == Version::kV1) {
          QuantizeV1Record(dims(), src, o);
        } else {
          std::memcpy(o, src, static_cast<size_t>(stored));
        }
        SanitizeV2Record(v2, o, st);
        break;
      case RecordFormat::kV1:  // only reached for v2 files
        tmp.assign(src, static_cast<size_t>(stored));
        SanitizeV2Record(v2, tmp.data(), st);
        DequantizeV2Record(dims(), tmp.data(), o);
        break;
      case RecordFormat::kStored:
        break;
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- writer

ColiKvWriter::ColiKvWriter(std::string path, std::unique_ptr<File> file, Header header,
                           int64_t nrec)
    : path_(std::move(path)),
      file_(std::move(file)),
      header_(header),
      layout_(header.version, header.dims),
      nrec_(nrec) {}

ColiKvWriter::~ColiKvWriter() = default;

absl::StatusOr<std::unique_ptr<ColiKvWriter>> ColiKvWriter::Create(Env* env, const std::string& path,
                                                                   Version version,
                                                                   const Dims& dims) {
  RETURN_IF_ERROR(ValidateDims(dims));
  if (env->FileExists(path)) return absl::AlreadyExistsError(absl::StrCat(path, " already exists"));
  Header h;
  h.version = version;
  h.dims = dims;
  h.nrec = 0;
  RETURN_IF_ERROR(WriteFileAtomically(env, path, EncodeHeader(h)));
  return Open(env, path);
}

absl::StatusOr<std::unique_ptr<ColiKvWriter>> ColiKvWriter::Open(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(path, OpenMode::kReadWrite));
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  ASSIGN_OR_RETURN(Header header, ReadHeader(file.get(), path, size));
  const int64_t nrec =
      std::min<int64_t>(header.nrec, CompleteRecords(RecordLayout(header.version, header.dims), size));
  std::unique_ptr<ColiKvWriter> w(new ColiKvWriter(path, std::move(file), header, nrec));
  if (nrec != header.nrec) {
    // Torn: make the header agree with the records before anything is appended.
    RETURN_IF_ERROR(w->WriteNrec(nrec));
    RETURN_IF_ERROR(w->file_->Sync());
  }
  return w;
}

absl::Status ColiKvWriter::Broken() const {
  std::lock_guard<std::mutex> lock(broken_mu_);
  if (broken_status_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(path_, ": an earlier write or sync failed (", broken_status_.ToString(),
                   "); reopen the file"));
}

void ColiKvWriter::MarkBroken(const absl::Status& s) {
  std::lock_guard<std::mutex> lock(broken_mu_);
  if (broken_status_.ok()) broken_status_ = s;
}

absl::Status ColiKvWriter::WriteNrec(int64_t n) {
  char buf[4];
  StoreI32(buf, static_cast<int32_t>(n));
  header_.nrec = static_cast<int32_t>(n);
  return file_->Write(kNrecOffset, std::string_view(buf, 4));
}

absl::Status ColiKvWriter::Append(std::string_view records) {
  RETURN_IF_ERROR(Broken());
  const int64_t rb = layout_.record_bytes();
  if (records.empty() || records.size() % static_cast<size_t>(rb) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Append takes whole records of ", rb,
                                                   " bytes; got ", records.size(), " bytes"));
  }
  const int64_t n = nrec();
  const int64_t k = static_cast<int64_t>(records.size()) / rb;
  if (k > kMaxNrec - n) {
    return absl::OutOfRangeError(absl::StrCat("a .coli_kv file holds at most ", kMaxNrec, " records"));
  }
  RETURN_IF_ERROR(file_->Write(static_cast<uint64_t>(layout_.file_offset(n)), records));
  if (absl::Status s = file_->Sync(); !s.ok()) {
    MarkBroken(s);
    return s;
  }
  return Commit(n + k);
}

absl::Status ColiKvWriter::WriteAt(int64_t position, int64_t offset_in_record,
                                   std::string_view bytes) {
  RETURN_IF_ERROR(Broken());
  if (position < nrec()) {
    return absl::InvalidArgumentError(
        absl::StrCat("record ", position, " is committed and cannot be rewritten"));
  }
  if (position >= kMaxNrec) {
    return absl::OutOfRangeError(absl::StrCat("a .coli_kv file holds at most ", kMaxNrec, " records"));
  }
  if (offset_in_record < 0 || offset_in_record > layout_.record_bytes() ||
      static_cast<int64_t>(bytes.size()) > layout_.record_bytes() - offset_in_record) {
    return absl::InvalidArgumentError("write outside the record");
  }
  return file_->Write(static_cast<uint64_t>(layout_.file_offset(position) + offset_in_record), bytes);
}

absl::Status ColiKvWriter::WriteRecords(int64_t position, std::string_view records) {
  RETURN_IF_ERROR(Broken());
  const int64_t rb = layout_.record_bytes();
  if (records.empty() || records.size() % static_cast<size_t>(rb) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("WriteRecords takes whole records of ", rb,
                                                   " bytes; got ", records.size(), " bytes"));
  }
  if (position < nrec()) {
    return absl::InvalidArgumentError(
        absl::StrCat("record ", position, " is committed and cannot be rewritten"));
  }
  if (position > kMaxNrec - static_cast<int64_t>(records.size()) / rb) {
    return absl::OutOfRangeError(absl::StrCat("a .coli_kv file holds at most ", kMaxNrec, " records"));
  }
  return file_->Write(static_cast<uint64_t>(layout_.file_offset(position)), records);
}

absl::Status ColiKvWriter::Sync() {
  RETURN_IF_ERROR(Broken());
  absl::Status s = file_->Sync();
  if (!s.ok()) MarkBroken(s);
  return s;
}

absl::Status ColiKvWriter::Commit(int64_t new_nrec) {
  RETURN_IF_ERROR(Broken());
  const int64_t n = nrec();
  if (new_nrec < n || new_nrec > kMaxNrec) {
    return absl::OutOfRangeError(absl::StrCat("cannot commit nrec ", new_nrec, " (committed: ", n, ")"));
  }
  if (new_nrec == n) return absl::OkStatus();
  ASSIGN_OR_RETURN(uint64_t size, file_->Size());
  if (CompleteRecords(layout_, size) < new_nrec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot commit ", new_nrec, " records: the file holds only ",
                     CompleteRecords(layout_, size)));
  }
  absl::Status s = WriteNrec(new_nrec);
  if (s.ok()) s = file_->Sync();
  if (!s.ok()) {
    MarkBroken(s);
    return s;
  }
  nrec_.store(new_nrec, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status ColiKvWriter::Truncate(int64_t n) {
  RETURN_IF_ERROR(Broken());
  const int64_t cur = nrec();
  if (n < 0 || n > cur) {
    return absl::OutOfRangeError(absl::StrCat("cannot truncate to ", n, " records: ", cur,
                                              " are committed"));
  }
  absl::Status s = WriteNrec(n);
  if (s.ok()) s = file_->Sync();
  if (!s.ok()) {
    MarkBroken(s);
    return s;
  }
  nrec_.store(n, std::memory_order_release);
  // The records beyond n are no longer committed; dropping their bytes is
  // housekeeping (a crash before it leaves ignored bytes past nrec).
  s = file_->Truncate(static_cast<uint64_t>(layout_.file_offset(n)));
  if (s.ok()) s = file_->Sync();
  if (!s.ok()) MarkBroken(s);
  return s;
}

absl::StatusOr<size_t> ColiKvWriter::ReadAt(uint64_t offset, size_t n, char* scratch) const {
  return file_->Read(offset, n, scratch);
}

absl::Status ColiKvWriter::Close() { return file_->Close(); }

// ---------------------------------------------------------------- conversion

absl::Status ConvertFile(Env* env, const std::string& in_path, const std::string& out_path,
                         Version to, int64_t copy_bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<ColiKvReader> in, ColiKvReader::Open(env, in_path));
  const RecordFormat format = to == Version::kV2 ? RecordFormat::kV2 : RecordFormat::kV1;
  Header h;
  h.version = to;
  h.dims = in->dims();
  h.nrec = static_cast<int32_t>(in->nrec());
  const std::string tmp = out_path + ".tmp";
  {
    ASSIGN_OR_RETURN(std::unique_ptr<File> out, env->Open(tmp, OpenMode::kCreateTruncate));
    RETURN_IF_ERROR(out->Write(0, EncodeHeader(h)));
    const int64_t rb = in->RecordBytes(format);
    const int64_t step =
        std::max<int64_t>(1, copy_bytes / std::max(rb, in->layout().record_bytes()));
    std::string buf;
    uint64_t offset = kHeaderBytes;
    for (int64_t p = 0; p < in->nrec(); p += step) {
      const int64_t k = std::min(step, in->nrec() - p);
      RETURN_IF_ERROR(in->ReadRecords(p, k, format, &buf));
      RETURN_IF_ERROR(out->Write(offset, buf));
      offset += buf.size();
    }
    RETURN_IF_ERROR(out->Sync());
    RETURN_IF_ERROR(out->Close());
  }
  RETURN_IF_ERROR(env->Rename(tmp, out_path));
  return env->SyncDir(DirName(out_path));
}

absl::Status UpgradeToV2(Env* env, const std::string& path, int64_t copy_bytes) {
  {
    ASSIGN_OR_RETURN(std::unique_ptr<ColiKvReader> r, ColiKvReader::Open(env, path));
    if (r->version() == Version::kV2) return absl::OkStatus();
  }
  return ConvertFile(env, path, path, Version::kV2, copy_bytes);
}

}  // namespace strata::kv
