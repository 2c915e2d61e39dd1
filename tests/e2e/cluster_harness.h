// A local cluster of real processes for end-to-end tests: an optional
// strata-kvstore, a strata-coordinator and N strata-worker processes on
// loopback, started from the build tree, with helpers to generate, kill and
// restart workers.
//
// Thread-safety: a harness is used by one test thread; Generate* may be
// called from several threads at once (each call has its own RPC).
#ifndef STRATA_TESTS_E2E_CLUSTER_HARNESS_H_
#define STRATA_TESTS_E2E_CLUSTER_HARNESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/testing/test_certs.h"
#include "grpcpp/grpcpp.h"
#include "strata/v1/generation.grpc.pb.h"

namespace strata::e2e {

struct HarnessOptions {
  std::string model_dir;
  int workers = 1;
  std::string kv_dir;  // non-empty: start a strata-kvstore on it
  std::vector<std::string> coordinator_flags;
  int worker_threads = 1;
  std::vector<std::string> worker_flags;
  // Plaintext everywhere and no API tokens (--insecure-cluster,
  // --insecure-public, --allow-unauthenticated), unless `tls` is set: then
  // every internal RPC uses mutual TLS with these files, the public port TLS
  // with the same certificate, and the API needs the tokens of `api_tokens`
  // (NAME:TOKEN lines; the harness calls with `token`).
  std::optional<testing::TestCerts> tls;
  std::string api_tokens;
  std::string token;
  // --metrics-listen 127.0.0.1:0 on every worker and the KV store
  // (WorkerMetricsAddress, KvStoreMetricsAddress).
  bool metrics = false;
};

struct GenerateResult {
  grpc::Status status;
  std::vector<int> tokens;
  std::string text;
  v1::GenerateFinal final_msg;
  bool got_final = false;
  double first_token_ms = -1;  // from the call to the first chunk
  std::vector<double> token_ms;  // arrival time of every token
};

class ClusterHarness {
 public:
  // Starts everything and waits (up to 60 s) for readiness; on failure the
  // returned harness has ok() == false and error() says why.
  explicit ClusterHarness(HarnessOptions options);
  // Stops the processes; removes their log folder unless the cluster failed
  // to start or the current test has failed.
  ~ClusterHarness();

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& address() const { return address_; }
  // The coordinator's internal port (where workers register).
  const std::string& internal_address() const { return internal_address_; }
  v1::Generation::Stub& stub() { return *stub_; }
  // A channel to the public port with the harness's transport security.
  std::shared_ptr<grpc::Channel> NewChannel() const;
  // Adds the harness's API token (if any) to a call.
  void Authorize(grpc::ClientContext* ctx) const;

  // Waits until the Generation service reports `serving`.
  bool WaitReady(bool serving, double timeout_s);

  GenerateResult Generate(const v1::GenerateRequest& req, double timeout_s = 60);
  static v1::GenerateRequest Greedy(const std::vector<int>& prompt, int max_tokens);
  // A greedy continue_turn request on `session` (no new prompt).
  static v1::GenerateRequest ContinueTurn(const std::string& session, int max_tokens);

  v1::StatsResponse Stats();

  // The folder of the processes' logs (stdout and stderr): coordinator.out,
  // w0.log, w1.log, ..., kvstore.log.
  const std::string& log_dir() const { return log_dir_; }
  // Where worker i (the process running now) and the KV store serve
  // /metrics, read from their "metrics HOST:PORT" lines (waits up to 10 s;
  // "" when there is none). REQUIRES: options.metrics.
  std::string WorkerMetricsAddress(int i);
  std::string KvStoreMetricsAddress();
  // GET http://ADDRESS/metrics: the body, or "" when the request failed.
  static std::string Scrape(const std::string& address);

  // SIGKILLs worker i; RestartWorker starts a new process with the same name.
  void KillWorker(int i);
  void RestartWorker(int i);
  // SIGKILLs the KV store; RestartKvStore starts it again on the same
  // directory and port (returns false when it does not come up in 20 s).
  void KillKvStore();
  bool RestartKvStore();
  // SIGSTOP / SIGCONT worker i: a hung process whose connections stay open.
  void PauseWorker(int i);
  void ContinueWorker(int i);
  // Stops everything (SIGTERM, then SIGKILL after 5 s).
  void Stop();
  // SIGKILLs every process at once (coordinator, workers, KV store): a crash.
  void KillAll();

  // Session RPCs (10 s deadline).
  grpc::Status SaveSession(const std::string& id, v1::SessionState* state);
  grpc::Status ResumeSession(const std::string& id, v1::SessionState* state);
  grpc::Status ListSessions(const std::string& prefix, v1::ListSessionsResponse* list);
  grpc::Status DeleteSession(const std::string& id);

 private:
  pid_t Spawn(const std::vector<std::string>& argv, const std::string& log);
  void StartWorker(int i);
  // Starts strata-kvstore on options_.kv_dir listening at `listen` (port 0:
  // any) and waits up to 20 s for its port; sets kv_address_.
  bool StartKvStore(const std::string& listen);
  // The internal RPCs' security flags: mutual TLS with options_.tls, or
  // --insecure-cluster.
  std::vector<std::string> ClusterFlags() const;
  // " (worker w1 exited with 1, ...)" for the processes that have ended
  // (reaping them), or "" when all still run.
  std::string Exited();

  HarnessOptions options_;
  std::string error_;
  std::string address_, internal_address_, kv_address_;
  std::string log_dir_;
  pid_t kvstore_ = -1, coordinator_ = -1;
  std::vector<pid_t> workers_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::shared_ptr<grpc::ChannelCredentials> client_credentials_;
};

// a followed by b (a conversation's turns).
std::vector<int> Concat(const std::vector<int>& a, const std::vector<int>& b);

// The tokens the in-process engine gives for a greedy continuation (fp8 KV,
// EOS ignored), the oracle for the cluster's tokens.
std::vector<int> InProcessGreedy(const std::string& model_dir, const std::vector<int>& prompt, int max_tokens);

}  // namespace strata::e2e

#endif  // STRATA_TESTS_E2E_CLUSTER_HARNESS_H_
