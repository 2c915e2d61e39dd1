// strata-kvstore: serves a directory of `.coli_kv` sessions over gRPC
// (strata.v1.KVStore and grpc.health.v1). Runs until SIGINT or SIGTERM, then
// shuts down gracefully.
//
//   strata-kvstore --dir=/var/lib/strata/kv --listen=0.0.0.0:50070
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "kvstore/env.h"
#include "kvstore/server/server.h"

ABSL_FLAG(std::string, dir, "", "Directory holding the session files (created when missing).");
ABSL_FLAG(std::string, listen, "0.0.0.0:50070", "Address to serve on; port 0 picks a free port.");
ABSL_FLAG(std::string, port_file, "",
          "When set, the bound port is written to this file once the server is serving.");
ABSL_FLAG(int, commit_threads, 4, "Threads running group commits.");
ABSL_FLAG(int, max_open_sessions, 256, "Idle sessions kept open (file handles).");
ABSL_FLAG(bool, verify_checksums_on_open, true,
          "Recompute every manifest checksum when a session is opened.");
ABSL_FLAG(int64_t, load_chunk_bytes, 1 << 20, "Default size of the rows in one Load message.");
ABSL_FLAG(int, max_message_bytes, 64 << 20, "Largest request message accepted.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Serves .coli_kv KV-cache sessions over gRPC (strata.v1.KVStore).");
  absl::ParseCommandLine(argc, argv);
  strata::kv::ServerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.store.dir = absl::GetFlag(FLAGS_dir);
  options.store.commit_threads = absl::GetFlag(FLAGS_commit_threads);
  options.store.max_open_sessions = static_cast<size_t>(absl::GetFlag(FLAGS_max_open_sessions));
  options.store.verify_checksums_on_open = absl::GetFlag(FLAGS_verify_checksums_on_open);
  options.service.load_chunk_bytes = absl::GetFlag(FLAGS_load_chunk_bytes);
  options.max_receive_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (options.store.dir.empty()) {
    std::fprintf(stderr, "strata-kvstore: --dir is required\n");
    return 2;
  }
  if (options.store.commit_threads < 1) {
    std::fprintf(stderr, "strata-kvstore: --commit_threads must be at least 1\n");
    return 2;
  }

  // Signals are taken by sigwait below, not by a handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = strata::kv::KvStoreServer::Start(strata::kv::Env::Default(), options);
  if (!server.ok()) {
    std::fprintf(stderr, "strata-kvstore: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "strata-kvstore: serving %s on port %d\n", options.store.dir.c_str(),
               (*server)->port());
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    // Written to a temporary name and renamed, so readers never see half a number.
    const std::string tmp = port_file + ".tmp";
    {
      std::ofstream out(tmp);
      out << (*server)->port() << "\n";
    }
    if (std::rename(tmp.c_str(), port_file.c_str()) != 0) {
      std::fprintf(stderr, "strata-kvstore: cannot write %s\n", port_file.c_str());
      return 1;
    }
  }
  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "strata-kvstore: signal %d, shutting down\n", sig);
  (*server)->Shutdown();
  return 0;
}
