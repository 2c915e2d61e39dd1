// Unit tests of the tokenizer on hand-made tokenizer.json files: malformed and
// unsupported input, BPE options, both merge forms, concurrency and a
// 128k-entry vocabulary.
#include "model/tokenizer.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/tokenizer_regex.h"
#include "model/tokenizer_utf8.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using tokenizer_internal::ByteToChar;

std::string DataPath(const std::string& name) {
  return std::string(STRATA_SOURCE_DIR) + "/tests/data/tokenizers/" + name;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// The byte-level character string of `text` ("a b" -> "aĠb").
std::string Bl(const std::string& text) {
  std::string out;
  for (char c : text) out += ByteToChar()[static_cast<unsigned char>(c)];
  return out;
}

// A minimal byte-level BPE: ids 0..255 are the byte characters, then the
// given merges (each result gets the next id), then extra vocabulary entries.
json TinyTokenizer(const std::vector<std::pair<std::string, std::string>>& merges,
                   const std::vector<std::string>& extra_vocab = {}) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteToChar()[b]] = b;
  int next = 256;
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    merge_list.push_back(Bl(a) + " " + Bl(b));
    if (!vocab.contains(Bl(a + b))) vocab[Bl(a + b)] = next++;
  }
  for (const std::string& t : extra_vocab) vocab[Bl(t)] = next++;
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
        {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
        {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", merge_list}}},
  };
}

std::unique_ptr<Tokenizer> Load(const json& j) {
  auto tok = Tokenizer::FromJson(j.dump());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

absl::Status LoadStatus(const json& j) { return Tokenizer::FromJson(j.dump()).status(); }

std::vector<int> Ids(const Tokenizer& tok, const std::string& text, bool special = true) {
  auto ids = tok.Encode(text, special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int>{};
}

TEST(Tokenizer, MergesApplyByRankThenPosition) {
  // "aaa": (a,a) merges the leftmost pair first, leaving "aa" "a".
  auto tok = Load(TinyTokenizer({{"a", "a"}}));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Ids(*tok, "aaa"), (std::vector<int>{256, 'a'}));
  // Lower rank wins even to the right: (b,c) before (a,b).
  auto tok2 = Load(TinyTokenizer({{"b", "c"}, {"a", "b"}}));
  ASSERT_NE(tok2, nullptr);
  EXPECT_EQ(Ids(*tok2, "abc"), (std::vector<int>{'a', 256}));
  EXPECT_EQ(Ids(*tok2, "ab"), (std::vector<int>{257}));
}

TEST(Tokenizer, IgnoreMergesTakesWholeVocabularyWords) {
  // "abc" is in the vocabulary but no merge builds it from "a" "bc".
  json j = TinyTokenizer({{"b", "c"}}, {"abc"});
  auto plain = Load(j);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(Ids(*plain, "abc"), (std::vector<int>{'a', 256}));
  j["model"]["ignore_merges"] = true;
  auto ignoring = Load(j);
  ASSERT_NE(ignoring, nullptr);
  EXPECT_EQ(Ids(*ignoring, "abc"), (std::vector<int>{257}));
  EXPECT_EQ(Ids(*ignoring, "abcd"), (std::vector<int>{'a', 256, 'd'}));
}

TEST(Tokenizer, UnknownCharactersUseUnkTokenOrAreDropped) {
  json j = TinyTokenizer({});
  // Remove "x" and "y" from the vocabulary and add an unknown token.
  j["model"]["vocab"].erase("x");
  j["model"]["vocab"].erase("y");
  j["model"]["vocab"]["<unk>"] = 300;
  auto dropping = Load(j);
  ASSERT_NE(dropping, nullptr);
  EXPECT_EQ(Ids(*dropping, "axyb"), (std::vector<int>{'a', 'b'}));
  j["model"]["unk_token"] = "<unk>";
  auto unk = Load(j);
  ASSERT_NE(unk, nullptr);
  EXPECT_EQ(Ids(*unk, "axyb"), (std::vector<int>{'a', 300, 300, 'b'}));
  j["model"]["fuse_unk"] = true;
  auto fused = Load(j);
  ASSERT_NE(fused, nullptr);
  EXPECT_EQ(Ids(*fused, "axyb"), (std::vector<int>{'a', 300, 'b'}));
}

TEST(Tokenizer, BothMergeFormsGiveTheSameTokenizer) {
  // Rewrite the DeepSeek-style fixture ("a b" merges) with ["a", "b"] pairs.
  const std::string text = ReadFile(DataPath("deepseek_v3_style.tokenizer.json"));
  json j = json::parse(text);
  ASSERT_TRUE(j["model"]["merges"][0].is_string());
  auto as_strings = Tokenizer::FromJson(text);
  ASSERT_TRUE(as_strings.ok());
  for (json& m : j["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ');
    m = json::array({s.substr(0, space), s.substr(space + 1)});
  }
  auto as_pairs = Load(j);
  ASSERT_NE(as_pairs, nullptr);
  const json expected = json::parse(ReadFile(DataPath("expected.json")));
  for (const json& c : expected["fixtures"]["deepseek_v3_style"]["cases"]) {
    const std::string t = c["text"].get<std::string>();
    EXPECT_EQ(Ids(*as_pairs, t), Ids(**as_strings, t)) << t;
  }
}

TEST(Tokenizer, TemplatePostProcessorAddsBosOnlyWithSpecialTokens) {
  json j = TinyTokenizer({});
  j["model"]["vocab"]["<bos>"] = 300;
  j["model"]["vocab"]["<eos>"] = 301;
  j["added_tokens"] = json::array(
      {{{"id", 300}, {"content", "<bos>"}, {"special", true}, {"normalized", false}},
       {{"id", 301}, {"content", "<eos>"}, {"special", true}, {"normalized", false}}});
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "<eos>"}, {"type_id", 0}}}}})},
      {"pair", json::array()},
      {"special_tokens",
       {{"<bos>", {{"id", "<bos>"}, {"ids", {300}}, {"tokens", {"<bos>"}}}},
        {"<eos>", {{"id", "<eos>"}, {"ids", {301}}, {"tokens", {"<eos>"}}}}}}};
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Ids(*tok, "a", true), (std::vector<int>{300, 'a', 301}));
  EXPECT_EQ(Ids(*tok, "a", false), (std::vector<int>{'a'}));
  EXPECT_EQ(Ids(*tok, "", true), (std::vector<int>{300, 301}));
  EXPECT_EQ(tok->prefix_ids(), (std::vector<int>{300}));
  EXPECT_EQ(tok->suffix_ids(), (std::vector<int>{301}));
  EXPECT_EQ(tok->Decode({300, 'a', 301}, false), "<bos>a<eos>");
  EXPECT_EQ(tok->Decode({300, 'a', 301}, true), "a");
  EXPECT_TRUE(tok->IsSpecial(300));
  EXPECT_EQ(tok->TokenToId("<eos>"), 301);
}

TEST(Tokenizer, RejectsInvalidUtf8Input) {
  auto tok = Load(TinyTokenizer({}));
  ASSERT_NE(tok, nullptr);
  auto ids = tok->Encode("ok\xC3(", true);
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(), HasSubstr("byte offset 2"));
  EXPECT_EQ(tok->Encode("\xED\xA0\x80").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Tokenizer, DecodeSkipsIdsWithoutToken) {
  auto tok = Load(TinyTokenizer({}));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Decode({'o', -1, 5000, 'k'}), "ok");
  EXPECT_FALSE(tok->IsKnown(5000));
  EXPECT_EQ(tok->IdToToken(5000), "");
}

TEST(Regex, EmptyMatchesFollowOniguruma) {
  auto re = tokenizer_internal::Regex::Compile("a*");
  ASSERT_TRUE(re.ok());
  std::vector<std::pair<size_t, size_t>> m;
  ASSERT_TRUE((*re)->FindAll("baab", &m).ok());
  // No empty match right where the previous match ended (3), but one at 0 and 4.
  EXPECT_EQ(m, (std::vector<std::pair<size_t, size_t>>{{0, 0}, {1, 3}, {4, 4}}));
}

TEST(Regex, OnigurumaEscapesAreTranslated) {
  using tokenizer_internal::TranslateOnigPattern;
  EXPECT_EQ(TranslateOnigPattern("\\s+(?!\\S)"), "\\p{White_Space}+(?!\\P{White_Space})");
  EXPECT_EQ(TranslateOnigPattern("[^\\s\\p{L}]"), "[^\\p{White_Space}\\p{L}]");
  EXPECT_EQ(TranslateOnigPattern("\\\\s\\h"), "\\\\s\\p{ASCII_Hex_Digit}");
  EXPECT_EQ(TranslateOnigPattern("\\Q\\s\\E\\s"), "\\Q\\s\\E\\p{White_Space}");
  // U+180E is not White_Space (Oniguruma's \s) although PCRE2's own \s matches it;
  // U+0085 and U+3000 are.
  auto re = tokenizer_internal::Regex::Compile("\\s+");
  ASSERT_TRUE(re.ok()) << re.status();
  std::vector<std::pair<size_t, size_t>> m;
  ASSERT_TRUE((*re)->FindAll("a\u180eb", &m).ok());
  EXPECT_TRUE(m.empty());
  ASSERT_TRUE((*re)->FindAll("a\u0085\u3000b", &m).ok());
  EXPECT_EQ(m, (std::vector<std::pair<size_t, size_t>>{{1, 6}}));
  auto hex = tokenizer_internal::Regex::Compile("\\h+");
  ASSERT_TRUE(hex.ok()) << hex.status();
  m.clear();
  ASSERT_TRUE((*hex)->FindAll("zz0aF9 g", &m).ok());
  EXPECT_EQ(m, (std::vector<std::pair<size_t, size_t>>{{2, 6}}));
}

// --- malformed and unsupported tokenizer.json ---------------------------------

struct BadCase {
  const char* name;
  std::function<void(json*)> edit;
  absl::StatusCode code;
  const char* message;  // must appear in the status message
};

TEST(TokenizerErrors, EachMalformedOrUnsupportedFileHasItsOwnStatus) {
  const std::vector<BadCase> cases = {
      {"model missing", [](json* j) { j->erase("model"); }, absl::StatusCode::kInvalidArgument,
       "model"},
      {"model type", [](json* j) { (*j)["model"]["type"] = "WordPiece"; },
       absl::StatusCode::kUnimplemented, "model.type = \"WordPiece\""},
      {"merge string", [](json* j) { (*j)["model"]["merges"] = json::array({"a b c"}); },
       absl::StatusCode::kInvalidArgument, "model.merges[0]"},
      {"merge not in vocab",
       [](json* j) { (*j)["model"]["merges"] = json::array({json::array({"a", "zz"})}); },
       absl::StatusCode::kInvalidArgument, "\"zz\" is not in the vocabulary"},
      {"merge result not in vocab",
       [](json* j) { (*j)["model"]["merges"] = json::array({"q r"}); },
       absl::StatusCode::kInvalidArgument, "\"qr\" is not in the vocabulary"},
      {"merge entry type", [](json* j) { (*j)["model"]["merges"] = json::array({7}); },
       absl::StatusCode::kInvalidArgument, "model.merges[0]"},
      {"vocab id", [](json* j) { (*j)["model"]["vocab"]["a"] = -3; },
       absl::StatusCode::kInvalidArgument, "model.vocab[\"a\"]"},
      {"vocab type", [](json* j) { (*j)["model"]["vocab"] = json::array(); },
       absl::StatusCode::kInvalidArgument, "model.vocab"},
      {"dropout", [](json* j) { (*j)["model"]["dropout"] = 0.1; },
       absl::StatusCode::kUnimplemented, "model.dropout"},
      {"byte fallback", [](json* j) { (*j)["model"]["byte_fallback"] = true; },
       absl::StatusCode::kUnimplemented, "model.byte_fallback"},
      {"subword prefix", [](json* j) { (*j)["model"]["continuing_subword_prefix"] = "##"; },
       absl::StatusCode::kUnimplemented, "continuing_subword_prefix"},
      {"unk not in vocab", [](json* j) { (*j)["model"]["unk_token"] = "<unk>"; },
       absl::StatusCode::kInvalidArgument, "model.unk_token"},
      {"normalizer NFC", [](json* j) { (*j)["normalizer"] = {{"type", "NFC"}}; },
       absl::StatusCode::kUnimplemented, "normalizer.type = \"NFC\""},
      {"normalizer in sequence",
       [](json* j) {
         (*j)["normalizer"] = {{"type", "Sequence"},
                               {"normalizers", json::array({{{"type", "Lowercase"}}})}};
       },
       absl::StatusCode::kUnimplemented, "normalizer.normalizers[0].type"},
      {"pre-tokenizer type", [](json* j) { (*j)["pre_tokenizer"] = {{"type", "Whitespace"}}; },
       absl::StatusCode::kUnimplemented, "pre_tokenizer.type = \"Whitespace\""},
      {"no byte level",
       [](json* j) {
         (*j)["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", true}};
       },
       absl::StatusCode::kUnimplemented, "ByteLevel"},
      {"bad regex",
       [](json* j) {
         (*j)["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers",
              json::array({{{"type", "Split"},
                            {"pattern", {{"Regex", "(\\p{L}+"}}},
                            {"behavior", "Isolated"},
                            {"invert", false}},
                           {{"type", "ByteLevel"}, {"use_regex", false}}})}};
       },
       absl::StatusCode::kInvalidArgument, "pre_tokenizer.pretokenizers[0].pattern.Regex"},
      {"bad behavior",
       [](json* j) {
         (*j)["pre_tokenizer"] = {{"type", "Split"},
                                  {"pattern", {{"String", " "}}},
                                  {"behavior", "Sideways"},
                                  {"invert", false}};
       },
       absl::StatusCode::kInvalidArgument, "Sideways"},
      {"pattern shape",
       [](json* j) {
         (*j)["pre_tokenizer"] = {{"type", "Split"}, {"pattern", "x"}, {"behavior", "Isolated"}};
       },
       absl::StatusCode::kInvalidArgument, "pre_tokenizer.pattern"},
      {"decoder type", [](json* j) { (*j)["decoder"] = {{"type", "WordPiece"}}; },
       absl::StatusCode::kUnimplemented, "decoder.type = \"WordPiece\""},
      {"decoder null", [](json* j) { (*j)["decoder"] = nullptr; },
       absl::StatusCode::kUnimplemented, "decoder"},
      {"post-processor type",
       [](json* j) { (*j)["post_processor"] = {{"type", "BertProcessing"}}; },
       absl::StatusCode::kUnimplemented, "post_processor.type = \"BertProcessing\""},
      {"template special missing",
       [](json* j) {
         (*j)["post_processor"] = {
             {"type", "TemplateProcessing"},
             {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
             {"special_tokens", json::object()}};
       },
       absl::StatusCode::kInvalidArgument, "post_processor.single[0]"},
      {"template without A",
       [](json* j) {
         (*j)["post_processor"] = {{"type", "TemplateProcessing"},
                                   {"single", json::array()},
                                   {"special_tokens", json::object()}};
       },
       absl::StatusCode::kInvalidArgument, "$A exactly once"},
      {"added token conflicts with vocab",
       [](json* j) {
         (*j)["added_tokens"] = json::array({{{"id", 5}, {"content", "a"}, {"special", true}}});
       },
       absl::StatusCode::kInvalidArgument, "added_tokens[0].id"},
      {"added token empty",
       [](json* j) { (*j)["added_tokens"] = json::array({{{"id", 400}, {"content", ""}}}); },
       absl::StatusCode::kInvalidArgument, "added_tokens[0].content"},
      {"added token duplicate",
       [](json* j) {
         (*j)["added_tokens"] = json::array(
             {{{"id", 400}, {"content", "<x>"}}, {{"id", 401}, {"content", "<x>"}}});
       },
       absl::StatusCode::kInvalidArgument, "added_tokens[1]"},
      {"added token flag type",
       [](json* j) {
         (*j)["added_tokens"] =
             json::array({{{"id", 400}, {"content", "<x>"}, {"special", "yes"}}});
       },
       absl::StatusCode::kInvalidArgument, "added_tokens[0].special"},
      {"root not object", [](json* j) { *j = json::array({1, 2}); },
       absl::StatusCode::kInvalidArgument, "(root)"},
  };
  for (const BadCase& c : cases) {
    json j = TinyTokenizer({{"a", "b"}});
    c.edit(&j);
    const absl::Status status = LoadStatus(j);
    EXPECT_EQ(status.code(), c.code) << c.name << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message)) << c.name;
  }
}

TEST(TokenizerErrors, NotJsonAndMissingFile) {
  EXPECT_EQ(Tokenizer::FromJson("{\"model\": ").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromJson("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromFile("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TokenizerErrors, DeepNestingIsRefusedNotRecursedInto) {
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "{\"type\": \"Sequence\", \"pretokenizers\": [";
  const std::string text = "{\"pre_tokenizer\": " + deep;
  const absl::Status status = Tokenizer::FromJson(text).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("nests deeper"));
}

TEST(TokenizerErrors, DamagedFilesNeverCrash) {
  const std::string text = ReadFile(DataPath("glm_style.tokenizer.json"));
  std::mt19937 rng(1234);
  int rejected = 0;
  for (int round = 0; round < 60; ++round) {
    std::string damaged = text;
    if (round % 3 == 0) {
      damaged.resize(rng() % text.size());  // truncated
    } else {
      for (int k = 0; k < 5; ++k) damaged[rng() % damaged.size()] = static_cast<char>(rng());
    }
    auto tok = Tokenizer::FromJson(damaged);
    if (!tok.ok()) {
      ++rejected;
      EXPECT_NE(tok.status().code(), absl::StatusCode::kOk);
      continue;
    }
    // A file that still loads must still work.
    EXPECT_TRUE((*tok)->Encode("Hello world 123").ok());
  }
  EXPECT_GT(rejected, 20);
}

// --- concurrency and size --------------------------------------------------------

TEST(Tokenizer, ConcurrentEncodeAndDecodeMatchSingleThreaded) {
  auto tok = Tokenizer::FromFile(DataPath("deepseek_v3_style.tokenizer.json"));
  ASSERT_TRUE(tok.ok());
  const json expected = json::parse(ReadFile(DataPath("expected.json")));
  std::vector<std::string> texts;
  std::vector<std::vector<int>> want;
  for (const json& c : expected["fixtures"]["deepseek_v3_style"]["cases"]) {
    texts.push_back(c["text"].get<std::string>());
    want.push_back(c["ids"].get<std::vector<int>>());
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i + t * 7 + round) % texts.size();
          auto ids = (*tok)->Encode(texts[k]);
          if (!ids.ok() || *ids != want[k]) ++mismatches;
          if ((*tok)->Decode(want[k], true) != (*tok)->Decode(want[k], true)) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// A 128k-entry vocabulary with 127k merges (DeepSeek-V3's size) loads, and its
// merges are honoured. Load time is printed for docs/tokenizer.md; timings are
// measured, not asserted.
TEST(Tokenizer, LoadsA128kVocabulary) {
  json vocab = json::object();
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) {
    vocab[ByteToChar()[b]] = b;
    tokens.push_back(ByteToChar()[b]);
  }
  json merges = json::array();
  std::mt19937 rng(7);
  const std::string letters = Bl("abcdefghijklmnopqrstuvwxyz");
  // Chains over letters give long tokens; random pairs fill up the rest.
  while (tokens.size() < 128000) {
    const std::string& a = tokens[rng() % tokens.size()];
    const std::string& b = tokens['a' + rng() % 26];
    std::string joined = a + b;
    if (joined.size() > 48 || vocab.contains(joined)) continue;
    merges.push_back(json::array({a, b}));
    vocab[joined] = static_cast<int>(tokens.size());
    tokens.push_back(joined);
  }
  json j = TinyTokenizer({});
  j["model"]["vocab"] = vocab;
  j["model"]["merges"] = merges;
  const std::string text = j.dump();
  const auto start = std::chrono::steady_clock::now();
  auto tok = Tokenizer::FromJson(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::cout << "[ info ] loaded " << vocab.size() << " tokens, " << merges.size()
            << " merges, " << text.size() / 1e6 << " MB in " << seconds << " s\n";
  EXPECT_EQ((*tok)->id_bound(), 128000);
  // The last token was built by its merge: it encodes to itself.
  std::string last_bytes = (*tok)->TokenBytes(127999);
  auto ids = (*tok)->Encode(last_bytes, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*tok)->Decode(*ids), last_bytes);
}

}  // namespace
}  // namespace strata
