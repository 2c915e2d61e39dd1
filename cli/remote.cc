#include "cli/remote.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/strip.h"
#include "common/cluster_security.h"
#include "common/status_macros.h"

namespace strata::cli {
namespace {

std::shared_ptr<grpc::Channel> Dial(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> creds) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  return grpc::CreateCustomChannel(address, std::move(creds), args);
}

}  // namespace

void DeclareRemoteFlags(FlagSet* flags) {
  flags->Declare("server", "address of strata-coordinator's public API (HOST:PORT)");
  flags->Declare("ca", "PEM file of the CA that signs the coordinator's TLS certificate (default: plaintext)");
  flags->Declare("token-file", "file holding the API token (sent as `authorization: Bearer TOKEN`)");
}

absl::StatusOr<Remote> Remote::FromFlags(const FlagSet& flags) {
  if (!flags.Has("server")) return absl::InvalidArgumentError("--server is required");
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (flags.Has("ca")) {
    ASSIGN_OR_RETURN(std::string pem, ReadSecretFile(flags.Get("ca"), "--ca"));
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = std::move(pem);
    creds = grpc::SslCredentials(o);
  }
  Remote r;
  r.channel_ = Dial(flags.Get("server"), std::move(creds));
  if (flags.Has("token-file")) {
    ASSIGN_OR_RETURN(std::string token, ReadSecretFile(flags.Get("token-file"), "--token-file"));
    r.token_ = std::string(absl::StripAsciiWhitespace(token));
    if (r.token_.empty() ||
        !std::all_of(r.token_.begin(), r.token_.end(), [](char c) { return c > ' ' && c < 127; })) {
      return absl::InvalidArgumentError("--token-file must hold one token of printable characters without spaces");
    }
  }
  return r;
}

Remote Remote::Plaintext(const std::string& address) {
  Remote r;
  r.channel_ = Dial(address, grpc::InsecureChannelCredentials());
  return r;
}

void Remote::Authorize(grpc::ClientContext* ctx) const {
  if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
}

}  // namespace strata::cli
