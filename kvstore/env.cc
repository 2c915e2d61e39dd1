#include "kvstore/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace strata::kv {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  const std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case EINVAL:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return absl::StrCat(dir, "/", name);
}

absl::StatusOr<std::string> ReadFileToString(Env* env, const std::string& path,
                                             uint64_t max_bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(path, OpenMode::kRead));
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  if (size > max_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": ", size, " bytes, more than the limit of ", max_bytes));
  }
  std::string out(size, '\0');
  ASSIGN_OR_RETURN(size_t got, file->Read(0, size, out.data()));
  out.resize(got);
  return out;
}

absl::Status WriteFileAtomically(Env* env, const std::string& path, std::string_view data) {
  const std::string tmp = path + ".tmp";
  {
    ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(tmp, OpenMode::kCreateTruncate));
    RETURN_IF_ERROR(file->Write(0, data));
    RETURN_IF_ERROR(file->Sync());
    RETURN_IF_ERROR(file->Close());
  }
  RETURN_IF_ERROR(env->Rename(tmp, path));
  return env->SyncDir(DirName(path));
}

namespace {

class PosixFile final : public File {
 public:
  PosixFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Write(uint64_t offset, std::string_view data) override {
    if (fd_ < 0) return Closed();
    const char* p = data.data();
    size_t left = data.size();
    while (left > 0) {
      const ssize_t n = ::pwrite(fd_, p, left, static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, absl::StrCat("pwrite ", path_));
      }
      p += n;
      left -= static_cast<size_t>(n);
      offset += static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> Read(uint64_t offset, size_t n, char* scratch) override {
    if (fd_ < 0) return Closed();
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd_, scratch + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, absl::StrCat("pread ", path_));
      }
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    return done;
  }

  absl::Status Sync() override {
    if (fd_ < 0) return Closed();
    // fdatasync also flushes the file size, which is all the metadata a
    // later read needs.
    if (::fdatasync(fd_) != 0) return ErrnoStatus(errno, absl::StrCat("fdatasync ", path_));
    return absl::OkStatus();
  }

  absl::Status Truncate(uint64_t size) override {
    if (fd_ < 0) return Closed();
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      return ErrnoStatus(errno, absl::StrCat("ftruncate ", path_));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Size() override {
    if (fd_ < 0) return Closed();
    struct stat st;
    if (::fstat(fd_, &st) != 0) return ErrnoStatus(errno, absl::StrCat("fstat ", path_));
    return static_cast<uint64_t>(st.st_size);
  }

  absl::Status Close() override {
    if (fd_ < 0) return absl::OkStatus();
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return ErrnoStatus(errno, absl::StrCat("close ", path_));
    return absl::OkStatus();
  }

 private:
  absl::Status Closed() const {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": file is closed"));
  }

  const std::string path_;
  int fd_;
};

class PosixEnv final : public Env {
 public:
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) override {
    int flags = O_CLOEXEC;
    switch (mode) {
      case OpenMode::kRead:
        flags |= O_RDONLY;
        break;
      case OpenMode::kReadWrite:
        flags |= O_RDWR;
        break;
      case OpenMode::kCreate:
        flags |= O_RDWR | O_CREAT;
        break;
      case OpenMode::kCreateTruncate:
        flags |= O_RDWR | O_CREAT | O_TRUNC;
        break;
    }
    int fd;
    do {
      fd = ::open(path.c_str(), flags, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
      ::close(fd);
      return absl::FailedPreconditionError(absl::StrCat(path, " is a directory"));
    }
    return std::unique_ptr<File>(new PosixFile(path, fd));
  }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open directory ", dir));
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoStatus(err, absl::StrCat("fsync directory ", dir));
    return absl::OkStatus();
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("rename ", from, " to ", to));
    }
    return absl::OkStatus();
  }

  absl::Status Delete(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoStatus(errno, absl::StrCat("unlink ", path));
    return absl::OkStatus();
  }

  absl::Status CreateDir(const std::string& dir) override {
    if (dir.empty()) return absl::InvalidArgumentError("empty directory name");
    std::string prefix;
    size_t pos = 0;
    while (pos != std::string::npos) {
      pos = dir.find('/', pos + 1);
      prefix = dir.substr(0, pos);
      if (prefix.empty()) continue;
      if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoStatus(errno, absl::StrCat("mkdir ", prefix));
      }
    }
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", dir));
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(dir, " exists and is not a directory"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return ErrnoStatus(errno, absl::StrCat("opendir ", dir));
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      names.push_back(name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
    return static_cast<uint64_t>(st.st_size);
  }

  bool FileExists(const std::string& path) override {
    return ::access(path.c_str(), F_OK) == 0;
  }

  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) {
        return absl::FailedPreconditionError(
            absl::StrCat(path, " is locked by another process (one process per directory)"));
      }
      return ErrnoStatus(err, absl::StrCat("flock ", path));
    }
    return std::unique_ptr<FileLock>(new PosixLock(fd));
  }

 private:
  class PosixLock final : public FileLock {
   public:
    explicit PosixLock(int fd) : fd_(fd) {}
    ~PosixLock() override { ::close(fd_); }  // releases the flock

   private:
    const int fd_;
  };
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new PosixEnv;
  return env;
}

}  // namespace strata::kv
