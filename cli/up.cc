// `strata up`: a whole local cluster on loopback — one strata-kvstore, one
// strata-coordinator and N strata-worker processes (docs/service.md,
// "strata up"). Prints `ready ADDRESS` once the coordinator reports the
// Generation service SERVING, and stops every child cleanly on SIGINT or
// SIGTERM.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "common/flags.h"
#include "common/thread_pool.h"
#include "coordinator/health_client.h"
#include "grpcpp/grpcpp.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kHelp = R"(usage: strata up [--workers N] [--model DIR] [flags]

Starts strata-kvstore, strata-coordinator and N strata-worker processes on
127.0.0.1, waits until the cluster is ready and prints `ready ADDRESS`.
Ctrl-C (or SIGTERM) stops them all. Sessions persist in --kv-dir, so a
cluster started again on the same directory resumes them.
flags:
)";

struct Child {
  std::string name;
  pid_t pid = -1;
};

std::vector<Child> g_children;

int Fail(const std::string& msg, int code = 1) {
  std::fprintf(stderr, "strata up: %s\n", msg.c_str());
  return code;
}

// Starts `argv`; its stdout goes to `out_fd` (-1: inherited).
pid_t Spawn(const std::vector<std::string>& argv, int out_fd) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  if (out_fd >= 0) dup2(out_fd, 1);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  std::fprintf(stderr, "strata up: cannot run %s\n", args[0]);
  _exit(127);
}

void StopAll() {
  for (auto it = g_children.rbegin(); it != g_children.rend(); ++it) {
    if (it->pid > 0) kill(it->pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (auto& c : g_children) {
    while (c.pid > 0) {
      int status = 0;
      pid_t r = waitpid(c.pid, &status, WNOHANG);
      if (r == c.pid || r < 0) {
        c.pid = -1;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &status, 0);
        c.pid = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

std::string FindBinary(const std::string& bin_dir, const std::string& name, const std::string& sub) {
  std::vector<fs::path> candidates;
  if (!bin_dir.empty()) candidates.push_back(fs::path(bin_dir) / name);
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(self.parent_path() / name);
    candidates.push_back(self.parent_path().parent_path() / sub / name);
  }
  for (const auto& c : candidates) {
    if (fs::exists(c)) return c.string();
  }
  return "";
}

// The coordinator's addresses from its first lines on a pipe ("internal
// ADDRESS", then "listening ADDRESS"), waiting at most `timeout`; empty
// strings when they do not come.
struct CoordinatorAddresses {
  std::string internal, public_api;
};
CoordinatorAddresses ReadListenLines(int fd, std::chrono::seconds timeout) {
  CoordinatorAddresses out;
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  while (std::chrono::steady_clock::now() < deadline && out.public_api.empty()) {
    char c;
    ssize_t n = read(fd, &c, 1);
    if (n == 1) {
      if (c != '\n') {
        line.push_back(c);
        continue;
      }
      if (line.rfind("internal ", 0) == 0) out.internal = line.substr(9);
      if (line.rfind("listening ", 0) == 0) out.public_api = line.substr(10);
      line.clear();
    } else if (n == 0) {
      break;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return out;
}

}  // namespace

int Up(const std::vector<std::string>& args) {
  FlagSet flags;
  flags.Declare("workers", "number of strata-worker processes (default 2)");
  flags.Declare("model", "model directory (default models/demo)");
  flags.Declare("port", "coordinator port (default 50051; 0 picks a free one)");
  flags.Declare("kv-dir",
                "directory of the session files; a cluster started again on it resumes its sessions "
                "(default ./strata-sessions)");
  flags.Declare("no-kvstore", "run without a KV store (sessions are not persisted)", true);
  flags.Declare("kv-dtype", "KV cache dtype: fp8 (default) or f32");
  flags.Declare("worker-threads", "engine threads per worker (default 1)");
  flags.Declare("device", "where workers run their layers: cpu (default) or gpu (every worker on GPU 0)");
  flags.Declare("gpu-kv-bytes", "with --device gpu: KV bytes each worker reserves on the GPU (default 1073741824)");
  flags.Declare("gpu-gemm", "with --device gpu: bf16 (default; f32 inputs enter as hi + lo bf16 terms), "
                            "bf16-rounded (inputs of steps over four rows rounded to bf16: faster prefill, "
                            "less exact) or f32 (a test mode matching the CPU engine)");
  flags.Declare("gpu-weights", "with --device gpu: fp8 (default: weights the checkpoint stores as fp8 with block "
                               "scales stay fp8 on the GPU, run as fp8 GEMMs) or bf16 (decoded to bf16 at load)");
  flags.Declare("synthetic-weights", "with --device gpu: generate the weights on the GPU from this seed instead of "
                                     "reading them (--model then needs only config.json)");
  flags.Declare("placement", "manual placement, e.g. 0-1:w0,2-3:w1");
  flags.Declare("max-running", "sequences generating at once (default 64)");
  flags.Declare("bin-dir", "directory holding strata-coordinator, strata-worker, strata-kvstore");
  flags.Declare("ready-timeout", "seconds to wait for readiness (default 120)");
  flags.Declare("help", "show this help", true);
  if (auto st = flags.Parse(args); !st.ok()) return Fail(std::string(st.message()), 2);
  if (flags.Has("help")) {
    std::printf("%s%s", kHelp, flags.Help().c_str());
    return 0;
  }
  auto workers = flags.GetInt("workers", 2), port = flags.GetInt("port", 50051),
       threads = flags.GetInt("worker-threads", 1), ready_timeout = flags.GetInt("ready-timeout", 120),
       max_running = flags.GetInt("max-running", 64);
  for (const auto* v : {&workers, &port, &threads, &ready_timeout, &max_running}) {
    if (!v->ok()) return Fail(std::string(v->status().message()), 2);
  }
  if (*workers < 1 || *workers > 64) return Fail("--workers must be in [1, 64]", 2);
  if (*port < 0 || *port > 65535) return Fail("--port must be in [0, 65535]", 2);
  if (*threads < 0 || *threads > kMaxThreads) {
    return Fail(absl::StrCat("--worker-threads must be in [0, ", kMaxThreads, "]"), 2);
  }
  if (*ready_timeout < 1) return Fail("--ready-timeout must be at least 1 (seconds)", 2);
  const std::string model = flags.Get("model", "models/demo");
  if (!fs::exists(fs::path(model) / "config.json")) {
    return Fail(absl::StrCat(model, "/config.json not found: give --model DIR"), 2);
  }
  const std::string bin_dir = flags.Get("bin-dir");
  const std::string coord_bin = FindBinary(bin_dir, "strata-coordinator", "coordinator");
  const std::string worker_bin = FindBinary(bin_dir, "strata-worker", "worker");
  const std::string device = flags.Get("device", "cpu");
  if (device != "cpu" && device != "gpu") return Fail("--device must be cpu or gpu, not '" + device + "'", 2);
  const bool gpu = device == "gpu";
  if (!gpu && (flags.Has("gpu-kv-bytes") || flags.Has("gpu-gemm") || flags.Has("gpu-weights") ||
               flags.Has("synthetic-weights"))) {
    return Fail("--gpu-kv-bytes, --gpu-gemm, --gpu-weights and --synthetic-weights need --device gpu", 2);
  }
  const std::string weights = flags.Get("gpu-weights", "fp8");
  if (weights != "fp8" && weights != "bf16") return Fail("--gpu-weights must be fp8 or bf16, not '" + weights + "'", 2);
  const std::string gemm = flags.Get("gpu-gemm", "bf16");
  if (gemm != "bf16" && gemm != "bf16-rounded" && gemm != "f32") {
    return Fail("--gpu-gemm must be bf16, bf16-rounded or f32, not '" + gemm + "'", 2);
  }
  const std::string kv_bin = FindBinary(bin_dir, "strata-kvstore", "kvstore");
  if (coord_bin.empty() || worker_bin.empty()) {
    return Fail("cannot find strata-coordinator and strata-worker next to strata; give --bin-dir", 2);
  }
  const bool use_kv = !flags.Has("no-kvstore");
  if (use_kv && kv_bin.empty()) return Fail("cannot find strata-kvstore; give --bin-dir or --no-kvstore", 2);

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  std::string kv_address;
  if (use_kv) {
    const std::string dir = flags.Get("kv-dir", "strata-sessions");
    std::error_code ec;
    fs::create_directories(dir, ec);
    const std::string port_file = (fs::path(dir) / ".kvstore.port").string();
    fs::remove(port_file, ec);
    pid_t pid =
        Spawn({kv_bin, "--dir=" + dir, "--listen=127.0.0.1:0", "--port-file=" + port_file, "--insecure-cluster"}, -1);
    g_children.push_back({"strata-kvstore", pid});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream f(port_file);
      std::string p;
      if (f >> p && !p.empty()) {
        kv_address = "127.0.0.1:" + p;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (kv_address.empty()) {
      StopAll();
      return Fail("strata-kvstore did not start (see its messages above)");
    }
  }
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return Fail("pipe failed");
  // Loopback only: plaintext and no tokens, explicitly (docs/deploy.md for
  // a cluster on a network).
  std::vector<std::string> cargs = {coord_bin, "--model", model, "--listen", absl::StrCat("127.0.0.1:", *port),
                                    "--internal-listen", "127.0.0.1:0", "--workers", absl::StrCat(*workers),
                                    "--max-running", absl::StrCat(*max_running), "--insecure-cluster",
                                    "--insecure-public", "--allow-unauthenticated"};
  if (!kv_address.empty()) cargs.insert(cargs.end(), {"--kvstore", kv_address});
  if (flags.Has("kv-dtype")) cargs.insert(cargs.end(), {"--kv-dtype", flags.Get("kv-dtype")});
  if (flags.Has("placement")) cargs.insert(cargs.end(), {"--placement", flags.Get("placement")});
  if (flags.Has("synthetic-weights")) cargs.insert(cargs.end(), {"--synthetic-weights", flags.Get("synthetic-weights")});
  pid_t cpid = Spawn(cargs, pipe_fds[1]);
  close(pipe_fds[1]);
  g_children.push_back({"strata-coordinator", cpid});
  const CoordinatorAddresses addresses = ReadListenLines(pipe_fds[0], std::chrono::seconds(30));
  const std::string& address = addresses.public_api;
  if (address.empty() || addresses.internal.empty()) {
    StopAll();
    return Fail("strata-coordinator did not start (see its messages above)");
  }
  for (int i = 0; i < *workers; ++i) {
    const std::string name = absl::StrCat("w", i);
    std::vector<std::string> wargs = {worker_bin,          "--coordinator", addresses.internal, "--name", name,
                                      "--threads",         absl::StrCat(*threads), "--model-root", model,
                                      "--insecure-cluster"};
    if (gpu) {
      wargs.insert(wargs.end(), {"--device", "gpu", "--gpu-kv-bytes", flags.Get("gpu-kv-bytes", "1073741824"),
                                 "--gpu-gemm", gemm, "--gpu-weights", weights});
    }
    pid_t pid = Spawn(wargs, open("/dev/null", O_WRONLY));
    g_children.push_back({"strata-worker " + name, pid});
  }
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(*ready_timeout);
  bool ready = false;
  while (!ready && std::chrono::steady_clock::now() < deadline) {
    auto h = coordinator::CheckHealth(channel, "strata.v1.Generation", absl::Seconds(1));
    ready = h.ok() && *h;
    if (!ready) {
      timespec ts{0, 100 * 1000 * 1000};
      siginfo_t info;
      int sig = sigtimedwait(&set, &info, &ts);
      if (sig == SIGINT || sig == SIGTERM) {
        StopAll();
        return 130;
      }
    }
  }
  if (!ready) {
    StopAll();
    return Fail(absl::StrCat("the cluster at ", address, " did not become ready within ", *ready_timeout, " s"));
  }
  std::printf("ready %s\n", address.c_str());
  std::fflush(stdout);
  for (;;) {
    siginfo_t info;
    int sig = sigwaitinfo(&set, &info);
    if (sig == SIGINT || sig == SIGTERM) break;
    if (sig == SIGCHLD) {
      int status;
      pid_t pid;
      while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (auto& c : g_children) {
          if (c.pid == pid) {
            std::fprintf(stderr, "strata up: %s (pid %d) exited (%s %d)\n", c.name.c_str(), pid,
                         WIFSIGNALED(status) ? "signal" : "status",
                         WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            c.pid = -1;
          }
        }
      }
    }
  }
  std::fprintf(stderr, "strata up: stopping\n");
  StopAll();
  return 0;
}

}  // namespace strata::cli
