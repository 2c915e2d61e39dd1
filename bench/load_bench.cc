// Loading a real-format checkpoint (bench/make_checkpoint.cc) onto the GPU
// with GpuEngine::Load, next to a plain sequential read of the same shard
// files in the same run: from the page cache (a first read warms it), and
// from disk where this process may drop the page cache
// (/proc/sys/vm/drop_caches). Rates are the shard files' bytes over the
// wall time; the load's ratio to the plain read is the figure of merit
// (docs/gpu-engine.md, "Loading").
//
//   strata_load_bench DIR [--readers N] [--ahead N]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/gpu/gpu_engine.h"

namespace {

namespace fs = std::filesystem;

std::vector<fs::path> Shards(const std::string& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Reads every shard once, in order, with one thread and 16 MiB reads;
// seconds.
double ReadAll(const std::vector<fs::path>& shards) {
  std::vector<char> buf(size_t{16} << 20);
  const auto t0 = std::chrono::steady_clock::now();
  for (const fs::path& p : shards) {
    const int fd = ::open(p.c_str(), O_RDONLY);
    if (fd < 0) continue;
    while (::read(fd, buf.data(), buf.size()) > 0) {
    }
    ::close(fd);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool DropPageCache() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  f << "1";
  f.close();
  return static_cast<bool>(f);
}

// GpuEngine::Load of the whole checkpoint with fp8 weights kept; seconds,
// or a negative value on failure.
double Load(const std::string& dir, int readers, int ahead, uint64_t* device_bytes) {
  strata::GpuEngineOptions o;
  o.fp8_weights = true;
  o.kv_cache_bytes = int64_t{64} << 20;
  o.max_sequences = 4;
  o.load_readers = readers;
  o.load_parts_ahead = ahead;
  o.on_load_progress = [](const strata::LoadProgress& p) {
    std::fprintf(stderr, "  part %d/%d: %.2f GB read, %.2f GB on the GPU, %.1f s\n", p.parts_done, p.parts,
                 p.host_bytes / 1e9, p.device_bytes / 1e9, p.seconds);
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto engine = strata::GpuEngine::Load(dir, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!engine.ok()) {
    std::fprintf(stderr, "load: %s\n", engine.status().ToString().c_str());
    return -1;
  }
  *device_bytes = (*engine)->weight_bytes();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: strata_load_bench DIR [--readers N] [--ahead N]\n");
    return 2;
  }
  const std::string dir = argv[1];
  int readers = 4, ahead = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--readers") == 0) readers = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--ahead") == 0) ahead = std::atoi(argv[i + 1]);
  }
  const std::vector<fs::path> shards = Shards(dir);
  uint64_t bytes = 0;
  for (const fs::path& p : shards) bytes += fs::file_size(p);
  std::printf("checkpoint %s: %zu shards, %.2f GB; loader: %d readers, %d parts ahead\n", dir.c_str(), shards.size(),
              bytes / 1e9, readers, ahead);
  const double gb = bytes / 1e9;
  const double first = ReadAll(shards);
  const double cached = ReadAll(shards);
  uint64_t device_bytes = 0;
  const double load = Load(dir, readers, ahead, &device_bytes);
  if (load < 0) return 1;
  std::printf("| source | plain read GB/s | GpuEngine::Load s | load GB/s | load / read |\n| --- | --- | --- | --- | --- |\n");
  std::printf("| page cache | %.2f | %.1f | %.2f | %.2f |\n", gb / cached, load, gb / load, cached / load);
  std::printf("(first plain read %.2f GB/s; %.2f GB resident on the GPU)\n", gb / first, device_bytes / 1e9);
  if (DropPageCache()) {
    const double cold = ReadAll(shards);
    DropPageCache();
    const double cold_load = Load(dir, readers, ahead, &device_bytes);
    if (cold_load > 0) {
      std::printf("| disk | %.2f | %.1f | %.2f | %.2f |\n", gb / cold, cold_load, gb / cold_load, cold / cold_load);
    }
  } else {
    std::printf("(the page cache cannot be dropped here: no disk figures)\n");
  }
  return 0;
}
