#include "common/log.h"

#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace strata::log {
namespace {

// Splits a logfmt line back into its key/value pairs (the inverse of
// FormatLine's quoting), failing the test on anything malformed.
std::vector<std::pair<std::string, std::string>> Parse(const std::string& line) {
  std::vector<std::pair<std::string, std::string>> out;
  EXPECT_FALSE(line.empty());
  EXPECT_EQ(line.back(), '\n');
  size_t i = 0;
  const size_t n = line.size() - 1;
  while (i < n) {
    const size_t eq = line.find('=', i);
    EXPECT_NE(eq, std::string::npos) << line;
    if (eq == std::string::npos) return out;
    std::string key = line.substr(i, eq - i);
    std::string value;
    i = eq + 1;
    if (i < n && line[i] == '"') {
      ++i;
      while (i < n && line[i] != '"') {
        if (line[i] == '\\') {
          const char e = line[++i];
          if (e == 'n') value += '\n';
          else if (e == 'r') value += '\r';
          else if (e == 't') value += '\t';
          else if (e == 'x') {
            value += static_cast<char>(std::stoi(line.substr(i + 1, 2), nullptr, 16));
            i += 2;
          } else value += e;
        } else {
          value += line[i];
        }
        ++i;
      }
      EXPECT_LT(i, n) << "unterminated quote: " << line;
      ++i;
    } else {
      while (i < n && line[i] != ' ') value += line[i++];
    }
    out.emplace_back(std::move(key), std::move(value));
    if (i < n) {
      EXPECT_EQ(line[i], ' ') << line;
      ++i;
    }
  }
  return out;
}

TEST(LogTest, FormatsFieldsInOrder) {
  EXPECT_EQ(FormatLine("", Level::kInfo, "strata-worker", "batch_failed",
                       {{"stage", 1}, {"code", "NOT_FOUND"}, {"ok", false}, {"ms", 2.5}}),
            "level=info daemon=strata-worker event=batch_failed stage=1 code=NOT_FOUND ok=false ms=2.5\n");
  EXPECT_EQ(FormatLine("2025-01-02T03:04:05.678Z", Level::kError, "", "x", {}),
            "ts=2025-01-02T03:04:05.678Z level=error event=x\n");
  EXPECT_EQ(FormatLine("", Level::kWarn, "d", "e", {{"n", int64_t{-7}}, {"u", uint64_t{18446744073709551615u}}}),
            "level=warn daemon=d event=e n=-7 u=18446744073709551615\n");
}

TEST(LogTest, QuotesWhatWouldBreakTheLine) {
  EXPECT_EQ(QuoteValue("plain-value_1.2:3/4"), "plain-value_1.2:3/4");
  EXPECT_EQ(QuoteValue(""), "\"\"");
  EXPECT_EQ(QuoteValue("a b"), "\"a b\"");
  EXPECT_EQ(QuoteValue("k=v"), "\"k=v\"");
  EXPECT_EQ(QuoteValue("say \"hi\"\\"), "\"say \\\"hi\\\"\\\\\"");
  EXPECT_EQ(QuoteValue("two\nlines\r\t"), "\"two\\nlines\\r\\t\"");
  EXPECT_EQ(QuoteValue(std::string("\x01\x7f", 2)), "\"\\x01\\x7f\"");
  EXPECT_EQ(QuoteValue("héllo"), "héllo");  // UTF-8 passes through
}

TEST(LogTest, EveryLineSplitsBackIntoItsFields) {
  const std::string nasty = "a \"quoted\" = value\nwith\\ escapes\x02 and é";
  const std::string line = FormatLine("t", Level::kInfo, "strata-coordinator", "request_start",
                                      {{"request_id", "r 1"}, {"text", nasty}, {"empty", ""}});
  EXPECT_EQ(line.find('\n'), line.size() - 1) << line;
  auto fields = Parse(line);
  ASSERT_EQ(fields.size(), 7u) << line;
  EXPECT_EQ(fields[0], (std::pair<std::string, std::string>{"ts", "t"}));
  EXPECT_EQ(fields[3], (std::pair<std::string, std::string>{"event", "request_start"}));
  EXPECT_EQ(fields[4].second, "r 1");
  EXPECT_EQ(fields[5].second, nasty);
  EXPECT_EQ(fields[6].second, "");
}

TEST(LogTest, SecretKeysAreRedacted) {
  for (const char* key : {"authorization", "token", "api_key", "api_token", "password", "secret"}) {
    EXPECT_TRUE(IsSecretKey(key)) << key;
    const std::string line = FormatLine("", Level::kInfo, "", "e", {{key, "sk-very-secret"}});
    EXPECT_EQ(line.find("sk-very-secret"), std::string::npos) << line;
    EXPECT_NE(line.find(std::string(key) + "=[redacted]"), std::string::npos) << line;
  }
  EXPECT_FALSE(IsSecretKey("prompt_tokens"));
  EXPECT_FALSE(IsSecretKey("caller"));
  EXPECT_NE(FormatLine("", Level::kInfo, "", "e", {{"prompt_tokens", 5}}).find("prompt_tokens=5"), std::string::npos);
}

TEST(LogTest, EventGoesToTheSinkWithTimestampAndDaemon) {
  std::mutex mu;
  std::vector<std::string> lines;
  Configure({"strata-test", [&](std::string_view l) {
               std::lock_guard<std::mutex> g(mu);
               lines.emplace_back(l);
             }});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 50; ++i) Info("tick", {{"thread", t}, {"i", i}});
    });
  }
  for (auto& t : threads) t.join();
  std::vector<Field> chosen = {{"a", 1}};
  chosen.push_back({"prompt", std::string("built at run time")});
  Event(Level::kWarn, "dynamic", chosen);
  Error("boom", {{"error", "disk full"}});
  Configure({});
  ASSERT_EQ(lines.size(), 202u);
  EXPECT_NE(lines[200].find(" level=warn daemon=strata-test event=dynamic a=1 prompt=\"built at run time\"\n"),
            std::string::npos)
      << lines[200];
  for (const std::string& l : lines) {
    auto f = Parse(l);
    ASSERT_GE(f.size(), 4u) << l;
    EXPECT_EQ(f[0].first, "ts");
    EXPECT_EQ(f[0].second.size(), 24u) << f[0].second;  // 2025-01-02T03:04:05.678Z
    EXPECT_EQ(f[0].second.back(), 'Z');
    EXPECT_EQ(f[2], (std::pair<std::string, std::string>{"daemon", "strata-test"}));
  }
  EXPECT_NE(lines.back().find(" level=error daemon=strata-test event=boom error=\"disk full\"\n"), std::string::npos)
      << lines.back();
}

}  // namespace
}  // namespace strata::log
