#include "common/cluster_security.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace strata {
namespace {

constexpr size_t kMaxSecretFileBytes = size_t{1} << 20;

absl::Status CheckPem(const std::string& data, absl::string_view kind, absl::string_view what,
                      const std::string& path) {
  if (data.find(absl::StrCat("-----BEGIN ", kind)) == std::string::npos &&
      !(kind == "PRIVATE KEY" && data.find("PRIVATE KEY-----") != std::string::npos)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " holds no PEM ", kind));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    const int err = errno;
    const std::string msg = absl::StrCat(what, ": cannot read ", path, ": ", std::strerror(err));
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
    if (err == ENOENT) return absl::NotFoundError(msg);
    return absl::InvalidArgumentError(msg);
  }
  std::string data;
  data.resize(kMaxSecretFileBytes + 1);
  f.read(data.data(), static_cast<std::streamsize>(data.size()));
  data.resize(static_cast<size_t>(f.gcount()));
  if (data.size() > kMaxSecretFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is larger than 1 MiB"));
  }
  if (data.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is empty"));
  return data;
}

absl::StatusOr<ClusterCredentials> ClusterCredentials::Create(const ClusterSecurityOptions& o) {
  const int files = !o.ca_file.empty() + !o.cert_file.empty() + !o.key_file.empty();
  if (o.insecure) {
    if (files > 0) {
      return absl::InvalidArgumentError(
          "--insecure-cluster and the --cluster-ca/--cluster-cert/--cluster-key files exclude each other");
    }
    return Insecure();
  }
  if (files == 0) {
    return absl::InvalidArgumentError(
        "the cluster's internal RPCs need mutual TLS (--cluster-ca, --cluster-cert, --cluster-key) or an "
        "explicit --insecure-cluster");
  }
  if (files < 3) {
    return absl::InvalidArgumentError("mutual TLS needs all of --cluster-ca, --cluster-cert and --cluster-key");
  }
  ASSIGN_OR_RETURN(std::string ca, ReadSecretFile(o.ca_file, "--cluster-ca"));
  ASSIGN_OR_RETURN(std::string cert, ReadSecretFile(o.cert_file, "--cluster-cert"));
  ASSIGN_OR_RETURN(std::string key, ReadSecretFile(o.key_file, "--cluster-key"));
  RETURN_IF_ERROR(CheckPem(ca, "CERTIFICATE", "--cluster-ca", o.ca_file));
  RETURN_IF_ERROR(CheckPem(cert, "CERTIFICATE", "--cluster-cert", o.cert_file));
  RETURN_IF_ERROR(CheckPem(key, "PRIVATE KEY", "--cluster-key", o.key_file));
  ClusterCredentials c;
  c.insecure_ = false;
  grpc::SslServerCredentialsOptions so(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  so.pem_root_certs = ca;
  so.pem_key_cert_pairs.push_back({key, cert});
  c.server_ = grpc::SslServerCredentials(so);
  grpc::SslCredentialsOptions co;
  co.pem_root_certs = ca;
  co.pem_private_key = key;
  co.pem_cert_chain = cert;
  c.channel_ = grpc::SslCredentials(co);
  if (c.server_ == nullptr || c.channel_ == nullptr) {
    return absl::InvalidArgumentError("the cluster's TLS files are not usable PEM certificates and key");
  }
  return c;
}

ClusterCredentials ClusterCredentials::Insecure() {
  ClusterCredentials c;
  c.insecure_ = true;
  c.server_ = grpc::InsecureServerCredentials();
  c.channel_ = grpc::InsecureChannelCredentials();
  return c;
}

void DeclareClusterSecurityFlags(FlagSet& flags) {
  flags.Declare("cluster-ca", "PEM file: the CA that signs every daemon of the cluster (mutual TLS)");
  flags.Declare("cluster-cert", "PEM file: this daemon's certificate for the cluster's internal RPCs");
  flags.Declare("cluster-key", "PEM file: the key of --cluster-cert");
  flags.Declare("insecure-cluster", "internal RPCs in plaintext, unauthenticated (development only)", true);
}

absl::StatusOr<ClusterCredentials> ClusterCredentialsFromFlags(const FlagSet& flags, absl::string_view program) {
  ClusterSecurityOptions o;
  o.ca_file = flags.Get("cluster-ca");
  o.cert_file = flags.Get("cluster-cert");
  o.key_file = flags.Get("cluster-key");
  o.insecure = flags.Has("insecure-cluster");
  ASSIGN_OR_RETURN(ClusterCredentials c, ClusterCredentials::Create(o));
  if (c.insecure()) {
    log::Warn("insecure_cluster", {{"program", program},
                                   {"reason", "--insecure-cluster: the cluster's internal RPCs are plaintext and "
                                              "unauthenticated; anyone who reaches the internal ports can steer the "
                                              "cluster"}});
  }
  return c;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PublicServerCredentials(const std::string& cert_file,
                                                                                 const std::string& key_file) {
  ASSIGN_OR_RETURN(std::string cert, ReadSecretFile(cert_file, "--tls-cert"));
  ASSIGN_OR_RETURN(std::string key, ReadSecretFile(key_file, "--tls-key"));
  RETURN_IF_ERROR(CheckPem(cert, "CERTIFICATE", "--tls-cert", cert_file));
  RETURN_IF_ERROR(CheckPem(key, "PRIVATE KEY", "--tls-key", key_file));
  grpc::SslServerCredentialsOptions so(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  so.pem_key_cert_pairs.push_back({key, cert});
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(so);
  if (creds == nullptr) return absl::InvalidArgumentError("--tls-cert / --tls-key are not usable PEM files");
  return creds;
}

}  // namespace strata
