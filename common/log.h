// Structured logs: one line per event, in logfmt (space-separated key=value
// pairs), on stderr. The format, the events every daemon logs and their keys
// are in docs/logging.md.
//
//   log::Info("request_finish", {{"request_id", id}, {"prompt_tokens", 12}, {"latency_ms", 31.5}});
//   ts=2025-01-02T03:04:05.678Z level=info daemon=strata-coordinator event=request_finish
//       request_id=r1 prompt_tokens=12 latency_ms=31.5          (one line)
//
// Values that hold a space, '=', '"', a control character or nothing are
// quoted, with \" \\ \n \r \t and \xNN escapes, so a line never breaks and
// always splits back into its fields. Fields whose key names a secret
// (IsSecretKey: authorization, token, api_key, password, secret) are written
// as `[redacted]`, whatever the caller passes: a guard, not the plan: code
// never hands secrets or prompt text to the log (prompts only behind the
// coordinator's --log-prompts).
//
// Thread-safety: everything is thread-safe. Each line is written with one
// write(2), so lines of concurrent events never interleave. Configure is
// meant for main() before other threads log, but is safe at any time.
#ifndef STRATA_COMMON_LOG_H_
#define STRATA_COMMON_LOG_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace strata::log {

enum class Level { kInfo, kWarn, kError };

// One field's value, rendered as text when the Field is made.
class Value {
 public:
  Value(std::string_view v) : text_(v) {}  // NOLINT: implicit by design
  Value(absl::string_view v) : text_(v.data(), v.size()) {}  // NOLINT (absl::Status::message())
  Value(const std::string& v) : text_(v) {}  // NOLINT
  Value(const char* v) : text_(v != nullptr ? v : "") {}  // NOLINT
  Value(bool v) : text_(v ? "true" : "false") {}  // NOLINT
  template <typename T, typename = std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>>
  Value(T v) : text_(std::to_string(v)) {}  // NOLINT
  Value(double v);  // NOLINT: six significant digits (%.6g)

  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

struct Field {
  std::string_view key;  // [a-z0-9_]+ by convention
  Value value;
};

struct Options {
  // The `daemon` field of every line (strata-coordinator, strata-worker,
  // strata-kvstore, strata); empty leaves the field out.
  std::string daemon;
  // Where lines go (each with its trailing newline); empty: stderr.
  std::function<void(std::string_view line)> sink;
};

// Replaces the process-wide options (the default: no daemon, stderr).
void Configure(Options options);

// Writes `ts=... level=... daemon=... event=EVENT` and the fields, in order.
void Event(Level level, std::string_view event, std::initializer_list<Field> fields = {});
// The same with fields chosen at run time.
void Event(Level level, std::string_view event, const std::vector<Field>& fields);
inline void Info(std::string_view event, std::initializer_list<Field> fields = {}) {
  Event(Level::kInfo, event, fields);
}
inline void Warn(std::string_view event, std::initializer_list<Field> fields = {}) {
  Event(Level::kWarn, event, fields);
}
inline void Error(std::string_view event, std::initializer_list<Field> fields = {}) {
  Event(Level::kError, event, fields);
}

// The pieces (exposed for tests).
// The line Event writes, without the timestamp when `ts` is empty.
std::string FormatLine(std::string_view ts, Level level, std::string_view daemon, std::string_view event,
                       absl::Span<const Field> fields);
// A value as written: bare when it is a non-empty run of printable
// characters other than space, '=' and '"'; quoted and escaped otherwise.
std::string QuoteValue(std::string_view v);
// Keys whose values are never written: authorization, token, api_key,
// api_token, password, secret (exactly; "prompt_tokens" is not one).
bool IsSecretKey(std::string_view key);

}  // namespace strata::log

#endif  // STRATA_COMMON_LOG_H_
