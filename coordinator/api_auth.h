// ApiAuth: who may call the coordinator's public API, and how much
// (docs/deploy.md, "API tokens").
//
// Callers send `authorization: Bearer <token>` metadata. Tokens come from a
// file of `NAME:TOKEN` lines (`#` comments and blank lines allowed; names of
// 1 to 64 characters [A-Za-z0-9._-], tokens of 16 to 256 printable ASCII
// characters without spaces); a token is compared with every configured one
// in constant time, so the time taken says nothing about which token, or how
// much of one, matched. The caller's identity is the token's NAME: requests
// are owned by it (Abort reaches only the caller's own requests) and the
// limits apply per name: at most `max_concurrent` Generate streams at once
// and `max_rps` requests per second (a token bucket of one second's worth),
// RESOURCE_EXHAUSTED beyond either.
//
// Without a token file (--allow-unauthenticated) every caller is the
// anonymous caller "" and the limits apply to all of them together.
//
// Thread-safety: all methods are thread-safe.
#ifndef STRATA_COORDINATOR_API_AUTH_H_
#define STRATA_COORDINATOR_API_AUTH_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace strata::coordinator {

struct ApiAuthOptions {
  // Generate streams one caller may have open at once (0: no limit).
  int max_concurrent = 64;
  // Requests per second one caller may start (0: no limit).
  double max_rps = 0;
};

class ApiAuth {
 public:
  // Parses a token file's contents. INVALID_ARGUMENT naming the line of a
  // malformed entry, a duplicate name or token, or a file without tokens.
  static absl::StatusOr<std::unique_ptr<ApiAuth>> FromTokens(absl::string_view file_text, ApiAuthOptions options);
  // Every caller is "" (no token required).
  static std::unique_ptr<ApiAuth> Anonymous(ApiAuthOptions options);

  // The caller's name from the value of its `authorization` metadata (empty
  // when absent). UNAUTHENTICATED when a token is required and the value is
  // missing, not `Bearer <token>`, or not a configured token.
  absl::StatusOr<std::string> Authenticate(absl::string_view authorization) const;

  // Holds one of a caller's concurrent-stream slots until destroyed.
  class Slot {
   public:
    Slot(Slot&& other) noexcept : auth_(other.auth_), caller_(std::move(other.caller_)) { other.auth_ = nullptr; }
    Slot& operator=(Slot&&) = delete;
    ~Slot();

   private:
    friend class ApiAuth;
    Slot(ApiAuth* auth, std::string caller) : auth_(auth), caller_(std::move(caller)) {}
    ApiAuth* auth_;
    std::string caller_;
  };

  // Counts one request against the caller's rate: RESOURCE_EXHAUSTED naming
  // the limit when it is spent.
  absl::Status Admit(const std::string& caller, absl::Time now = absl::Now());
  // Admit, and a concurrent-stream slot: RESOURCE_EXHAUSTED when the caller
  // has max_concurrent open already.
  absl::StatusOr<Slot> AdmitStream(const std::string& caller, absl::Time now = absl::Now());

  bool anonymous() const { return tokens_.empty(); }
  const ApiAuthOptions& options() const { return options_; }

 private:
  struct Token {
    std::string name;
    std::string secret;
  };
  struct Usage {
    int open = 0;
    double bucket = 0;  // requests that may start now
    absl::Time refilled = absl::InfinitePast();
  };

  explicit ApiAuth(ApiAuthOptions options) : options_(options) {}
  absl::Status AdmitLocked(const std::string& caller, absl::Time now);
  void Release(const std::string& caller);

  const ApiAuthOptions options_;
  std::vector<Token> tokens_;
  std::mutex mu_;
  std::map<std::string, Usage> usage_;  // guarded by mu_
};

}  // namespace strata::coordinator

#endif  // STRATA_COORDINATOR_API_AUTH_H_
