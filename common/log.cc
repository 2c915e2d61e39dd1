#include "common/log.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace strata::log {
namespace {

std::mutex& OptionsMu() {
  static std::mutex mu;
  return mu;
}

// Shared so that a line being written keeps its sink alive across Configure.
std::shared_ptr<const Options>& CurrentOptions() {
  static auto* options = new std::shared_ptr<const Options>(std::make_shared<Options>());
  return *options;
}

const char* LevelName(Level l) {
  switch (l) {
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
  }
  return "info";
}

void WriteAll(int fd, std::string_view s) {
  while (!s.empty()) {
    const ssize_t n = ::write(fd, s.data(), s.size());
    if (n <= 0) return;  // nothing sensible to do when stderr is gone
    s.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

Value::Value(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  text_ = buf;
}

void Configure(Options options) {
  auto next = std::make_shared<const Options>(std::move(options));
  std::lock_guard<std::mutex> l(OptionsMu());
  CurrentOptions() = std::move(next);
}

bool IsSecretKey(std::string_view key) {
  for (std::string_view s : {"authorization", "token", "api_key", "api_token", "password", "secret"}) {
    if (key == s) return true;
  }
  return false;
}

std::string QuoteValue(std::string_view v) {
  bool bare = !v.empty();
  for (unsigned char c : v) {
    if (c <= ' ' || c == '=' || c == '"' || c == 0x7f) {
      bare = false;
      break;
    }
  }
  if (bare) return std::string(v);
  std::string out = "\"";
  for (unsigned char c : v) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < ' ' || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  return out;
}

std::string FormatLine(std::string_view ts, Level level, std::string_view daemon, std::string_view event,
                       absl::Span<const Field> fields) {
  std::string line;
  if (!ts.empty()) {
    line += "ts=";
    line += ts;
    line += ' ';
  }
  line += "level=";
  line += LevelName(level);
  if (!daemon.empty()) {
    line += " daemon=";
    line += QuoteValue(daemon);
  }
  line += " event=";
  line += QuoteValue(event);
  for (const Field& f : fields) {
    line += ' ';
    line += f.key;
    line += '=';
    line += IsSecretKey(f.key) ? std::string("[redacted]") : QuoteValue(f.value.text());
  }
  line += '\n';
  return line;
}

namespace {

void Write(Level level, std::string_view event, absl::Span<const Field> fields) {
  std::shared_ptr<const Options> options;
  {
    std::lock_guard<std::mutex> l(OptionsMu());
    options = CurrentOptions();
  }
  const std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  const std::string line = FormatLine(ts, level, options->daemon, event, fields);
  if (options->sink) {
    options->sink(line);
  } else {
    WriteAll(STDERR_FILENO, line);
  }
}

}  // namespace

void Event(Level level, std::string_view event, std::initializer_list<Field> fields) {
  Write(level, event, absl::Span<const Field>(fields.begin(), fields.size()));
}

void Event(Level level, std::string_view event, const std::vector<Field>& fields) { Write(level, event, fields); }

}  // namespace strata::log
