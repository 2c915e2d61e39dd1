#include "tests/e2e/cluster_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/testing/scratch_dir.h"
#include "coordinator/health_client.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "model/engine.h"

namespace strata::e2e {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string Bin(const std::string& sub, const std::string& name) {
  return (fs::path(STRATA_BINARY_DIR) / sub / name).string();
}

// The address of the last "metrics HOST:PORT" line of a log, waiting up to
// 10 s for one to appear after `skip` such lines.
std::string MetricsLine(const std::string& log, size_t skip) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  do {
    std::ifstream f(log);
    std::string line, last;
    size_t seen = 0;
    while (std::getline(f, line)) {
      if (line.rfind("metrics ", 0) == 0 && line.find(':') != std::string::npos) {
        last = line.substr(8);
        ++seen;
      }
    }
    if (seen > skip) return last;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (Clock::now() < deadline);
  return "";
}

void Terminate(pid_t& pid, int sig) {
  if (pid <= 0) return;
  kill(pid, sig);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  int status;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pid = -1;
}

}  // namespace

ClusterHarness::ClusterHarness(HarnessOptions options) : options_(std::move(options)) {
  static int counter = 0;
  // A new directory per cluster: the coordinator's address is read back from
  // its log, so a stale log must never be there to read.
  log_dir_ = MakeScratchDir(absl::StrCat("cluster_", getpid(), "_", counter++, "_"));
  client_credentials_ = grpc::InsecureChannelCredentials();
  if (options_.tls) {
    std::ifstream ca(options_.tls->ca);
    std::stringstream pem;
    pem << ca.rdbuf();
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = pem.str();
    client_credentials_ = grpc::SslCredentials(o);
  }
  if (!options_.kv_dir.empty() && !StartKvStore("127.0.0.1:0")) {
    error_ = "strata-kvstore did not start" + Exited() + "; see " + log_dir_;
    return;
  }
  const std::string out = log_dir_ + "/coordinator.out";
  std::vector<std::string> args = {Bin("coordinator", "strata-coordinator"), "--model", options_.model_dir,
                                   "--listen", "127.0.0.1:0", "--internal-listen", "127.0.0.1:0",
                                   "--workers", absl::StrCat(options_.workers)};
  if (options_.tls) {
    const std::string tokens = log_dir_ + "/tokens";
    std::ofstream(tokens) << options_.api_tokens;
    args.insert(args.end(), {"--tls-cert", options_.tls->cert, "--tls-key", options_.tls->key, "--api-tokens", tokens});
  } else {
    args.insert(args.end(), {"--insecure-public", "--allow-unauthenticated"});
  }
  for (const std::string& f : ClusterFlags()) args.push_back(f);
  if (!kv_address_.empty()) args.insert(args.end(), {"--kvstore", kv_address_});
  args.insert(args.end(), options_.coordinator_flags.begin(), options_.coordinator_flags.end());
  coordinator_ = Spawn(args, out);
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline && address_.empty()) {
    std::ifstream f(out);
    std::string line;
    while (address_.empty() && std::getline(f, line)) {
      if (line.rfind("internal ", 0) == 0 && line.find(':') != std::string::npos) internal_address_ = line.substr(9);
      if (line.rfind("listening ", 0) == 0 && line.find(':') != std::string::npos) address_ = line.substr(10);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (address_.empty()) {
    error_ = "strata-coordinator did not start" + Exited() + "; see " + log_dir_;
    return;
  }
  for (int i = 0; i < options_.workers; ++i) {
    workers_.push_back(-1);
    StartWorker(i);
  }
  grpc::ChannelArguments ca;
  ca.SetMaxReceiveMessageSize(16 << 20);
  ca.SetMaxSendMessageSize(64 << 20);
  stub_ = v1::Generation::NewStub(grpc::CreateCustomChannel(address_, client_credentials_, ca));
  if (!WaitReady(true, 60)) error_ = "the cluster did not become ready" + Exited() + "; see " + log_dir_;
}

std::vector<std::string> ClusterHarness::ClusterFlags() const {
  if (!options_.tls) return {"--insecure-cluster"};
  return {"--cluster-ca", options_.tls->ca, "--cluster-cert", options_.tls->cert, "--cluster-key", options_.tls->key};
}

std::shared_ptr<grpc::Channel> ClusterHarness::NewChannel() const {
  return grpc::CreateChannel(address_, client_credentials_);
}

void ClusterHarness::Authorize(grpc::ClientContext* ctx) const {
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
}

std::string ClusterHarness::Exited() {
  std::string out;
  auto check = [&out](pid_t& pid, const std::string& name) {
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, WNOHANG) == pid) {
      pid = -1;  // reaped: never signal the number again
      absl::StrAppend(&out, out.empty() ? " (" : ", ", name, WIFEXITED(status) ? " exited with " : " died of signal ",
                      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    }
  };
  check(kvstore_, "strata-kvstore");
  check(coordinator_, "strata-coordinator");
  for (size_t i = 0; i < workers_.size(); ++i) check(workers_[i], absl::StrCat("worker w", i));
  return out.empty() ? out : out + ")";
}

ClusterHarness::~ClusterHarness() {
  Stop();
  // The logs are kept for a test that failed (its messages name the folder).
  if (ok() && !::testing::Test::HasFailure()) {
    std::error_code ec;
    fs::remove_all(log_dir_, ec);
  }
}

void ClusterHarness::Stop() {
  for (pid_t w : workers_) {
    if (w > 0) kill(w, SIGTERM);
  }
  if (coordinator_ > 0) kill(coordinator_, SIGTERM);
  for (auto& w : workers_) Terminate(w, SIGTERM);
  Terminate(coordinator_, SIGTERM);
  Terminate(kvstore_, SIGTERM);
}

void ClusterHarness::KillAll() {
  for (pid_t w : workers_) {
    if (w > 0) kill(w, SIGKILL);
  }
  if (coordinator_ > 0) kill(coordinator_, SIGKILL);
  if (kvstore_ > 0) kill(kvstore_, SIGKILL);
  for (auto& w : workers_) Terminate(w, SIGKILL);
  Terminate(coordinator_, SIGKILL);
  Terminate(kvstore_, SIGKILL);
}

namespace {
void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
}
}  // namespace

grpc::Status ClusterHarness::SaveSession(const std::string& id, v1::SessionState* state) {
  grpc::ClientContext ctx;
  Authorize(&ctx);
  SetDeadline(&ctx);
  v1::SaveSessionRequest req;
  req.set_session_id(id);
  return stub_->SaveSession(&ctx, req, state);
}

grpc::Status ClusterHarness::ResumeSession(const std::string& id, v1::SessionState* state) {
  grpc::ClientContext ctx;
  Authorize(&ctx);
  SetDeadline(&ctx);
  v1::ResumeSessionRequest req;
  req.set_session_id(id);
  return stub_->ResumeSession(&ctx, req, state);
}

grpc::Status ClusterHarness::ListSessions(const std::string& prefix, v1::ListSessionsResponse* list) {
  grpc::ClientContext ctx;
  Authorize(&ctx);
  SetDeadline(&ctx);
  v1::ListSessionsRequest req;
  req.set_prefix(prefix);
  return stub_->ListSessions(&ctx, req, list);
}

grpc::Status ClusterHarness::DeleteSession(const std::string& id) {
  grpc::ClientContext ctx;
  Authorize(&ctx);
  SetDeadline(&ctx);
  v1::DeleteSessionRequest req;
  req.set_session_id(id);
  v1::DeleteSessionResponse resp;
  return stub_->DeleteSession(&ctx, req, &resp);
}

pid_t ClusterHarness::Spawn(const std::vector<std::string>& argv, const std::string& log) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

void ClusterHarness::StartWorker(int i) {
  std::vector<std::string> args = {Bin("worker", "strata-worker"), "--coordinator", internal_address_, "--name",
                                   absl::StrCat("w", i), "--threads", absl::StrCat(options_.worker_threads),
                                   "--model-root", options_.model_dir};
  for (const std::string& f : ClusterFlags()) args.push_back(f);
  if (options_.metrics) args.insert(args.end(), {"--metrics-listen", "127.0.0.1:0"});
  args.insert(args.end(), options_.worker_flags.begin(), options_.worker_flags.end());
  workers_[i] = Spawn(args, absl::StrCat(log_dir_, "/w", i, ".log"));
}

std::string ClusterHarness::WorkerMetricsAddress(int i) {
  return MetricsLine(absl::StrCat(log_dir_, "/w", i, ".log"), 0);
}

std::string ClusterHarness::KvStoreMetricsAddress() { return MetricsLine(log_dir_ + "/kvstore.log", 0); }

std::string ClusterHarness::Scrape(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "";
  httplib::Client c(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  c.set_connection_timeout(5);
  c.set_read_timeout(5);
  auto res = c.Get("/metrics");
  return res && res->status == 200 ? res->body : "";
}

void ClusterHarness::KillWorker(int i) { Terminate(workers_[i], SIGKILL); }

void ClusterHarness::KillKvStore() { Terminate(kvstore_, SIGKILL); }

bool ClusterHarness::RestartKvStore() {
  if (kvstore_ > 0) KillKvStore();
  return StartKvStore(kv_address_);
}

bool ClusterHarness::StartKvStore(const std::string& listen) {
  const std::string port_file = log_dir_ + "/kv.port";
  fs::remove(port_file);
  std::vector<std::string> args = {Bin("kvstore", "strata-kvstore"), "--dir=" + options_.kv_dir, "--listen=" + listen,
                                   "--port-file=" + port_file, "--commit-threads=1"};
  if (options_.metrics) args.push_back("--metrics-listen=127.0.0.1:0");
  for (const std::string& f : ClusterFlags()) args.push_back(f);
  kvstore_ = Spawn(args, log_dir_ + "/kvstore.log");
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline) {
    std::ifstream f(port_file);
    std::string port;
    if (f >> port) {
      kv_address_ = "127.0.0.1:" + port;
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void ClusterHarness::PauseWorker(int i) {
  if (workers_[i] > 0) ::kill(workers_[i], SIGSTOP);
}

void ClusterHarness::ContinueWorker(int i) {
  if (workers_[i] > 0) ::kill(workers_[i], SIGCONT);
}

void ClusterHarness::RestartWorker(int i) {
  if (workers_[i] > 0) KillWorker(i);
  StartWorker(i);
}

bool ClusterHarness::WaitReady(bool serving, double timeout_s) {
  auto channel = NewChannel();
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (Clock::now() < deadline) {
    auto h = coordinator::CheckHealth(channel, "strata.v1.Generation", absl::Seconds(1));
    if (h.ok() && *h == serving) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

v1::GenerateRequest ClusterHarness::Greedy(const std::vector<int>& prompt, int max_tokens) {
  v1::GenerateRequest req;
  for (int t : prompt) req.mutable_tokens()->add_ids(t);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_stopping()->set_max_tokens(max_tokens);
  req.mutable_stopping()->set_ignore_eos(true);
  return req;
}

v1::GenerateRequest ClusterHarness::ContinueTurn(const std::string& session, int max_tokens) {
  v1::GenerateRequest req = Greedy({}, max_tokens);
  req.set_session_id(session);
  req.set_continue_turn(true);
  return req;
}

GenerateResult ClusterHarness::Generate(const v1::GenerateRequest& req, double timeout_s) {
  GenerateResult out;
  grpc::ClientContext ctx;
  Authorize(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  const auto t0 = Clock::now();
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (resp.has_chunk()) {
      for (const auto& t : resp.chunk().tokens()) {
        out.tokens.push_back(t.id());
        out.token_ms.push_back(ms);
        if (out.first_token_ms < 0) out.first_token_ms = ms;
      }
      out.text += resp.chunk().text();
    } else if (resp.has_final()) {
      out.final_msg = resp.final();
      out.got_final = true;
    }
  }
  out.status = reader->Finish();
  return out;
}

v1::StatsResponse ClusterHarness::Stats() {
  grpc::ClientContext ctx;
  Authorize(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::StatsResponse resp;
  stub_->Stats(&ctx, v1::StatsRequest(), &resp);
  return resp;
}

std::vector<int> Concat(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

std::vector<int> InProcessGreedy(const std::string& model_dir, const std::vector<int>& prompt, int max_tokens) {
  EngineOptions opt;
  opt.kv_dtype = KvDtype::kFp8;
  opt.num_threads = 1;
  auto engine = Engine::Load(model_dir, opt);
  if (!engine.ok()) return {};
  Engine& e = **engine;
  auto seq = e.NewSequence();
  std::vector<int> out, next = prompt;
  std::vector<float> logits;
  for (int i = 0; i < max_tokens; ++i) {
    SeqChunk ch{seq.get(), next};
    if (!e.Forward({ch}, false, &logits).ok()) return {};
    int best = 0;
    for (int v = 1; v < static_cast<int>(logits.size()); ++v) {
      if (logits[v] > logits[best]) best = v;
    }
    out.push_back(best);
    next = {best};
  }
  return out;
}

}  // namespace strata::e2e
