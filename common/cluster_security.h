// ClusterCredentials: how the daemons of one Strata cluster (coordinator,
// workers, KV store) authenticate each other on their internal RPCs
// (docs/deploy.md, "Security"): mutual TLS with one cluster CA — a server
// accepts only clients presenting a certificate the CA signed, and a client
// trusts only servers whose certificate the CA signed (for the host name or
// IP address it dials) — or, with an explicit --insecure-cluster, plaintext.
//
// Also the public port's TLS (PublicServerCredentials): a certificate and key
// without client certificates (callers are authenticated by API token).
//
// Thread-safety: immutable value type; copies share the credentials.
#ifndef STRATA_COMMON_CLUSTER_SECURITY_H_
#define STRATA_COMMON_CLUSTER_SECURITY_H_

#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "common/flags.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace strata {

struct ClusterSecurityOptions {
  // PEM files: the cluster CA, this daemon's certificate (chain) and key.
  // All three for mutual TLS.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // Plaintext internal RPCs (development, loopback). Exclusive with the files.
  bool insecure = false;
};

class ClusterCredentials {
 public:
  // Reads the PEM files. INVALID_ARGUMENT when neither the three files nor
  // `insecure` are given, when only some files are, or when both are;
  // NOT_FOUND / PERMISSION_DENIED / INVALID_ARGUMENT naming an unreadable or
  // empty file.
  static absl::StatusOr<ClusterCredentials> Create(const ClusterSecurityOptions& options);
  // Plaintext both ways.
  static ClusterCredentials Insecure();

  // For servers of internal RPCs: TLS requiring and verifying client
  // certificates, or plaintext.
  std::shared_ptr<grpc::ServerCredentials> server() const { return server_; }
  // For channels to other daemons of the cluster.
  std::shared_ptr<grpc::ChannelCredentials> channel() const { return channel_; }
  bool insecure() const { return insecure_; }

 private:
  ClusterCredentials() = default;

  std::shared_ptr<grpc::ServerCredentials> server_;
  std::shared_ptr<grpc::ChannelCredentials> channel_;
  bool insecure_ = true;
};

// The flags --cluster-ca, --cluster-cert, --cluster-key and
// --insecure-cluster, and the credentials they ask for. An insecure choice is
// logged on stderr as a warning naming `program`.
void DeclareClusterSecurityFlags(FlagSet& flags);
absl::StatusOr<ClusterCredentials> ClusterCredentialsFromFlags(const FlagSet& flags, absl::string_view program);

// TLS for a public port from PEM files (no client certificate requested).
// INVALID_ARGUMENT / NOT_FOUND naming an unreadable or empty file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PublicServerCredentials(const std::string& cert_file,
                                                                                 const std::string& key_file);

// A whole small file (PEM, token lists): NOT_FOUND, PERMISSION_DENIED, or
// INVALID_ARGUMENT for an empty file or one over 1 MiB; `what` names it in
// the message ("--cluster-ca").
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view what);

}  // namespace strata

#endif  // STRATA_COMMON_CLUSTER_SECURITY_H_
