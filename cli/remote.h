// How the `strata` client commands reach a cluster's public API
// (`generate --server`, `session`): the address, the CA that signs the
// coordinator's TLS certificate, and an API token (docs/deploy.md, §6).
//
//   --server HOST:PORT   the coordinator's public port
//   --ca FILE            PEM: trust this CA and speak TLS (default: plaintext)
//   --token-file FILE    the API token, sent as `authorization: Bearer TOKEN`
//
// Thread-safety: immutable after Create; Authorize may be called from any
// thread.
#ifndef STRATA_CLI_REMOTE_H_
#define STRATA_CLI_REMOTE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/flags.h"
#include "grpcpp/grpcpp.h"

namespace strata::cli {

void DeclareRemoteFlags(FlagSet* flags);

class Remote {
 public:
  // INVALID_ARGUMENT without --server; the file errors of ReadSecretFile
  // (common/cluster_security.h) for --ca and --token-file; INVALID_ARGUMENT
  // for a token with spaces or control characters.
  static absl::StatusOr<Remote> FromFlags(const FlagSet& flags);
  // A plaintext connection without a token (a cluster `strata up` started).
  static Remote Plaintext(const std::string& address);

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // Adds the token, if any, to a call.
  void Authorize(grpc::ClientContext* ctx) const;

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::string token_;
};

}  // namespace strata::cli

#endif  // STRATA_CLI_REMOTE_H_
