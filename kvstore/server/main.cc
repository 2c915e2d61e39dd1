// strata-kvstore: serves a directory of `.coli_kv` sessions over gRPC
// (strata.v1.KVStore and grpc.health.v1) to the daemons of one cluster. Runs
// until SIGINT or SIGTERM, then drains and shuts down (docs/coli-kv.md, "The
// KV store service"; docs/deploy.md for TLS and the health port).
//
//   strata-kvstore --dir=/var/lib/strata/kv --listen=0.0.0.0:50070 \
//       --cluster-ca=ca.pem --cluster-cert=kv.pem --cluster-key=kv.key
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cluster_security.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kvstore/env.h"
#include "kvstore/server/server.h"

namespace {

constexpr const char* kUsage = "usage: strata-kvstore --dir=DIR [flags]\n";

int Usage(const std::string& msg, const strata::FlagSet& flags) {
  std::fprintf(stderr, "strata-kvstore: %s\n\n%s%s", msg.c_str(), kUsage, flags.Help().c_str());
  return 2;
}

// Maps the flags to the server's options; a message on bad values.
absl::StatusOr<strata::kv::ServerOptions> OptionsFromFlags(const strata::FlagSet& flags) {
  strata::kv::ServerOptions o;
  o.listen_address = flags.Get("listen", "0.0.0.0:50070");
  o.health_listen = flags.Get("health-listen");
  o.metrics_listen = flags.Get("metrics-listen");
  o.store.dir = flags.Get("dir");
  if (o.store.dir.empty()) return absl::InvalidArgumentError("--dir is required");
  auto threads = flags.GetInt("commit-threads", o.store.commit_threads);
  auto open = flags.GetInt("max-open-sessions", static_cast<int64_t>(o.store.max_open_sessions));
  auto chunk = flags.GetInt("load-chunk-bytes", o.service.load_chunk_bytes);
  auto message = flags.GetInt("max-message-bytes", o.max_receive_message_bytes);
  auto drain = flags.GetInt("drain-timeout-s", absl::ToInt64Seconds(o.drain_timeout));
  for (const auto* v : {&threads, &open, &chunk, &message, &drain}) {
    if (!v->ok()) return v->status();
  }
  if (*threads < 1 || *threads > 256) return absl::InvalidArgumentError("--commit-threads must be in [1, 256]");
  if (*open < 1) return absl::InvalidArgumentError("--max-open-sessions must be at least 1");
  if (*chunk < 1 || *chunk > (int64_t{64} << 20)) {
    return absl::InvalidArgumentError("--load-chunk-bytes must be in [1, 64 MiB]");
  }
  if (*message < (1 << 20) || *message > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError("--max-message-bytes must be in [1 MiB, 1 GiB]");
  }
  if (*drain < 0 || *drain > 3600) return absl::InvalidArgumentError("--drain-timeout-s must be in [0, 3600]");
  o.store.commit_threads = static_cast<int>(*threads);
  o.store.max_open_sessions = static_cast<size_t>(*open);
  o.service.load_chunk_bytes = *chunk;
  o.max_receive_message_bytes = static_cast<int>(*message);
  o.drain_timeout = absl::Seconds(*drain);
  const std::string verify = flags.Get("verify-checksums-on-open", "true");
  if (verify != "true" && verify != "false") {
    return absl::InvalidArgumentError("--verify-checksums-on-open must be true or false");
  }
  o.store.verify_checksums_on_open = verify == "true";
  ASSIGN_OR_RETURN(strata::ClusterCredentials creds, strata::ClusterCredentialsFromFlags(flags, "strata-kvstore"));
  o.credentials = creds.server();
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  strata::FlagSet flags;
  flags.Declare("dir", "directory holding the session files (created when missing)");
  flags.Declare("listen", "address to serve strata.v1.KVStore on (default 0.0.0.0:50070; port 0 picks a free port)");
  flags.Declare("health-listen", "plaintext address serving only grpc.health.v1, for probes (default: none)");
  flags.Declare("metrics-listen", "plaintext address serving only GET /metrics, for Prometheus (default: none)");
  flags.Declare("port-file", "write the bound port to this file once serving (for --listen=...:0)");
  flags.Declare("commit-threads", "threads running group commits (default 4)");
  flags.Declare("max-open-sessions", "idle sessions kept open, i.e. file handles (default 256)");
  flags.Declare("verify-checksums-on-open", "true (default) or false: recompute every checksum when a session opens");
  flags.Declare("load-chunk-bytes", "default size of the rows in one Load message (default 1048576)");
  flags.Declare("max-message-bytes", "largest request message accepted (default 67108864)");
  flags.Declare("drain-timeout-s", "on SIGTERM, running calls get this long before they are cancelled (default 2)");
  strata::DeclareClusterSecurityFlags(flags);
  flags.Declare("help", "show this help", true);
  if (auto st = flags.Parse(argc, argv, 1); !st.ok()) return Usage(std::string(st.message()), flags);
  if (flags.Has("help")) {
    std::printf("%s%s", kUsage, flags.Help().c_str());
    return 0;
  }
  strata::log::Configure({"strata-kvstore", nullptr});
  absl::StatusOr<strata::kv::ServerOptions> options = OptionsFromFlags(flags);
  if (!options.ok()) return Usage(std::string(options.status().message()), flags);

  // Signals are taken by sigwait below, not by a handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = strata::kv::KvStoreServer::Start(strata::kv::Env::Default(), *options);
  if (!server.ok()) {
    strata::log::Error("start_failed", {{"dir", options->store.dir},
                                        {"code", absl::StatusCodeToString(server.status().code())},
                                        {"error", server.status().message()}});
    return 1;
  }
  if ((*server)->metrics_port() != 0) {
    const std::string& ml = options->metrics_listen;
    std::printf("metrics %s:%d\n", ml.substr(0, ml.rfind(':')).c_str(), (*server)->metrics_port());
    std::fflush(stdout);
  }
  strata::log::Info("listening", {{"dir", options->store.dir}, {"port", (*server)->port()},
                                  {"health_port", (*server)->health_port()},
                                  {"metrics_port", (*server)->metrics_port()}});
  const std::string port_file = flags.Get("port-file");
  if (!port_file.empty()) {
    // Written to a temporary name and renamed, so readers never see half a number.
    const std::string tmp = port_file + ".tmp";
    {
      std::ofstream out(tmp);
      out << (*server)->port() << "\n";
    }
    if (std::rename(tmp.c_str(), port_file.c_str()) != 0) {
      strata::log::Error("port_file_failed", {{"path", port_file}});
      return 1;
    }
  }
  int sig = 0;
  sigwait(&signals, &sig);
  strata::log::Info("drain", {{"signal", sig}, {"timeout_s", absl::ToInt64Seconds(options->drain_timeout)}});
  // A second signal exits at once (the rows already acknowledged are durable).
  std::thread([signals] {
    int again = 0;
    sigwait(&signals, &again);
    strata::log::Warn("exit_now", {{"signal", again}});
    std::_Exit(1);
  }).detach();
  (*server)->Shutdown();
  strata::log::Info("stopped");
  return 0;
}
