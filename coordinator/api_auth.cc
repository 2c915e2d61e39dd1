#include "coordinator/api_auth.h"

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace strata::coordinator {
namespace {

constexpr size_t kMaxNameBytes = 64;
constexpr size_t kMinTokenBytes = 16;
constexpr size_t kMaxTokenBytes = 256;
constexpr absl::string_view kBearer = "Bearer ";

bool ValidName(absl::string_view s) {
  if (s.empty() || s.size() > kMaxNameBytes) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

bool ValidToken(absl::string_view s) {
  if (s.size() < kMinTokenBytes || s.size() > kMaxTokenBytes) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c > ' ' && c < 127; });
}

// Equal in time that depends only on the lengths: every byte is looked at.
bool ConstantTimeEqual(absl::string_view a, absl::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ApiAuth>> ApiAuth::FromTokens(absl::string_view file_text, ApiAuthOptions options) {
  std::unique_ptr<ApiAuth> a(new ApiAuth(options));
  std::set<std::string> names, secrets;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(file_text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const size_t colon = line.find(':');
    const absl::string_view name = colon == absl::string_view::npos ? line : line.substr(0, colon);
    const absl::string_view secret = colon == absl::string_view::npos ? absl::string_view() : line.substr(colon + 1);
    if (colon == absl::string_view::npos || !ValidName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "API tokens, line ", line_no, ": expected NAME:TOKEN with a NAME of 1 to 64 characters [A-Za-z0-9._-]"));
    }
    if (!ValidToken(secret)) {
      return absl::InvalidArgumentError(absl::StrCat("API tokens, line ", line_no, " (", name,
                                                     "): the token must have 16 to 256 printable characters "
                                                     "without spaces"));
    }
    if (!names.insert(std::string(name)).second) {
      return absl::InvalidArgumentError(absl::StrCat("API tokens, line ", line_no, ": the name ", name, " repeats"));
    }
    if (!secrets.insert(std::string(secret)).second) {
      return absl::InvalidArgumentError(absl::StrCat("API tokens, line ", line_no, " (", name,
                                                     "): the same token is given to another name"));
    }
    a->tokens_.push_back(Token{std::string(name), std::string(secret)});
  }
  if (a->tokens_.empty()) return absl::InvalidArgumentError("the API token file holds no token");
  return a;
}

std::unique_ptr<ApiAuth> ApiAuth::Anonymous(ApiAuthOptions options) {
  return std::unique_ptr<ApiAuth>(new ApiAuth(options));
}

absl::StatusOr<std::string> ApiAuth::Authenticate(absl::string_view authorization) const {
  if (tokens_.empty()) return std::string();
  if (authorization.empty()) {
    return absl::UnauthenticatedError("this API needs a token: send the metadata `authorization: Bearer <token>`");
  }
  if (!absl::ConsumePrefix(&authorization, kBearer)) {
    return absl::UnauthenticatedError("the authorization metadata must be `Bearer <token>`");
  }
  // Every configured token is compared (no early exit), each in constant time.
  const Token* match = nullptr;
  for (const Token& t : tokens_) {
    if (ConstantTimeEqual(authorization, t.secret)) match = &t;
  }
  if (match == nullptr) return absl::UnauthenticatedError("the API token is not valid");
  return match->name;
}

absl::Status ApiAuth::AdmitLocked(const std::string& caller, absl::Time now) {
  if (options_.max_rps <= 0) return absl::OkStatus();
  Usage& u = usage_[caller];
  const double capacity = std::max(1.0, options_.max_rps);
  if (u.refilled == absl::InfinitePast()) {
    u.bucket = capacity;
  } else if (now > u.refilled) {
    u.bucket = std::min(capacity, u.bucket + absl::ToDoubleSeconds(now - u.refilled) * options_.max_rps);
  }
  u.refilled = std::max(u.refilled, now);
  if (u.bucket < 1.0) {
    return absl::ResourceExhaustedError(absl::StrCat("caller '", caller, "' is over its limit of ", options_.max_rps,
                                                     " requests per second (--max-rps-per-token); retry later"));
  }
  u.bucket -= 1.0;
  return absl::OkStatus();
}

absl::Status ApiAuth::Admit(const std::string& caller, absl::Time now) {
  std::lock_guard<std::mutex> l(mu_);
  return AdmitLocked(caller, now);
}

absl::StatusOr<ApiAuth::Slot> ApiAuth::AdmitStream(const std::string& caller, absl::Time now) {
  std::lock_guard<std::mutex> l(mu_);
  Usage& u = usage_[caller];
  if (options_.max_concurrent > 0 && u.open >= options_.max_concurrent) {
    return absl::ResourceExhaustedError(absl::StrCat("caller '", caller, "' has ", u.open,
                                                     " generations running, its limit "
                                                     "(--max-concurrent-per-token); retry when one ends"));
  }
  if (absl::Status s = AdmitLocked(caller, now); !s.ok()) return s;
  ++u.open;
  return Slot(this, caller);
}

void ApiAuth::Release(const std::string& caller) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = usage_.find(caller);
  if (it != usage_.end() && it->second.open > 0) --it->second.open;
}

ApiAuth::Slot::~Slot() {
  if (auth_ != nullptr) auth_->Release(caller_);
}

}  // namespace strata::coordinator
