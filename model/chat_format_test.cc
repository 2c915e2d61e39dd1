// Chat formats against strings written from the published templates (not
// from the code), and the EOS-id union.
#include "model/chat_format.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

ChatMessage Msg(std::string role, std::string content, std::string reasoning = "") {
  return ChatMessage{std::move(role), std::move(content), std::move(reasoning)};
}

std::string Format(std::string_view model_type, const std::vector<ChatMessage>& messages,
                   bool add_generation_prompt, bool thinking = false) {
  auto out = FormatChat(model_type, messages, add_generation_prompt, ChatOptions{thinking});
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "";
}

const std::vector<ChatMessage> kConversation = {
    Msg("system", "You are a helpful assistant."),
    Msg("user", "Hello"),
    Msg("assistant", "Hi there!"),
    Msg("user", "How are you?"),
};

// --- DeepSeek-V3 (tokenizer_config.json chat_template) ------------------------

TEST(DeepseekV3Chat, Conversation) {
  EXPECT_EQ(Format("deepseek_v3", kConversation, true),
            "<｜begin▁of▁sentence｜>You are a helpful assistant."
            "<｜User｜>Hello<｜Assistant｜>Hi there!<｜end▁of▁sentence｜>"
            "<｜User｜>How are you?<｜Assistant｜>");
  EXPECT_EQ(Format("deepseek_v3", {Msg("user", "Hi")}, false),
            "<｜begin▁of▁sentence｜><｜User｜>Hi");
}

TEST(DeepseekV3Chat, SystemPromptsAreJoinedAfterBos) {
  // Every system message goes right after BOS, joined by a blank line,
  // wherever it stands in the conversation.
  EXPECT_EQ(Format("deepseek_v3", {Msg("system", "A"), Msg("user", "u"), Msg("system", "B")}, true),
            "<｜begin▁of▁sentence｜>A\n\nB<｜User｜>u<｜Assistant｜>");
}

TEST(DeepseekV3Chat, RejectsThinkingAndUnknownRoles) {
  EXPECT_EQ(FormatChat("deepseek_v3", kConversation, true, ChatOptions{true}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FormatChat("deepseek_v3", {Msg("tool", "42")}, true).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(FormatChat("deepseek_v3", {Msg("narrator", "x")}, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FormatChat("llama", kConversation, true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// --- DeepSeek-V3.2 (encoding/encoding_dsv32.py) ---------------------------------

TEST(DeepseekV32Chat, ChatModeClosesThinkingAfterEveryUserTurn) {
  const std::vector<ChatMessage> messages = {
      Msg("system", "You are a helpful assistant."),
      Msg("user", "hello"),
      Msg("assistant", "Hello! I am DeepSeek.", "thinking..."),
      Msg("user", "1+1=?"),
  };
  const std::string chat =
      "<｜begin▁of▁sentence｜>You are a helpful assistant."
      "<｜User｜>hello<｜Assistant｜></think>Hello! I am DeepSeek.<｜end▁of▁sentence｜>"
      "<｜User｜>1+1=?<｜Assistant｜></think>";
  EXPECT_EQ(Format("deepseek_v32", messages, true), chat);
  // The script has no separate generation prompt: the user turn carries it.
  EXPECT_EQ(Format("deepseek_v32", messages, false), chat);
  // Thinking mode opens <think> after the last user turn only; the earlier
  // reasoning is dropped.
  EXPECT_EQ(Format("deepseek_v32", messages, true, /*thinking=*/true),
            "<｜begin▁of▁sentence｜>You are a helpful assistant."
            "<｜User｜>hello<｜Assistant｜></think>Hello! I am DeepSeek.<｜end▁of▁sentence｜>"
            "<｜User｜>1+1=?<｜Assistant｜><think>");
}

TEST(DeepseekV32Chat, ThinkingKeepsReasoningAfterTheLastUserTurn) {
  EXPECT_EQ(Format("deepseek_v32", {Msg("user", "q"), Msg("assistant", "a", "r")}, false, true),
            "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜><think>r</think>a<｜end▁of▁sentence｜>");
  EXPECT_EQ(Format("deepseek_v32", {Msg("user", "q"), Msg("assistant", "a", "r")}, false, false),
            "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think>a<｜end▁of▁sentence｜>");
  EXPECT_EQ(FormatChat("deepseek_v32", {Msg("user", "q"), Msg("assistant", "a")}, false,
                       ChatOptions{true})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DeepseekV32Chat, DeveloperTurn) {
  EXPECT_EQ(Format("deepseek_v32", {Msg("developer", "Do X")}, true),
            "<｜begin▁of▁sentence｜><｜User｜>\n\n# The user's message is: Do X<｜Assistant｜></think>");
}

// --- GLM-4.7 / GLM-5 (chat_template.jinja) ---------------------------------------

TEST(GlmChat, Conversation) {
  for (const char* type : {"glm_moe_dsa", "glm4_moe_lite"}) {
    EXPECT_EQ(Format(type, kConversation, true),
              "[gMASK]<sop><|system|>You are a helpful assistant.<|user|>Hello"
              "<|assistant|></think>Hi there!<|user|>How are you?<|assistant|></think>")
        << type;
    EXPECT_EQ(Format(type, kConversation, true, /*thinking=*/true),
              "[gMASK]<sop><|system|>You are a helpful assistant.<|user|>Hello"
              "<|assistant|></think>Hi there!<|user|>How are you?<|assistant|><think>")
        << type;
    EXPECT_EQ(Format(type, kConversation, false),
              "[gMASK]<sop><|system|>You are a helpful assistant.<|user|>Hello"
              "<|assistant|></think>Hi there!<|user|>How are you?")
        << type;
  }
}

TEST(GlmChat, ReasoningIsKeptOnlyAfterTheLastUserTurn) {
  const ChatMessage answer = Msg("assistant", "<think>\nreason\n</think>\n\n answer ");
  EXPECT_EQ(Format("glm_moe_dsa", {Msg("user", "q"), answer}, false),
            "[gMASK]<sop><|user|>q<|assistant|><think>reason</think>answer");
  EXPECT_EQ(Format("glm_moe_dsa", {Msg("user", "q"), answer, Msg("user", "more")}, true),
            "[gMASK]<sop><|user|>q<|assistant|></think>answer<|user|>more<|assistant|></think>");
  EXPECT_EQ(Format("glm_moe_dsa", {Msg("user", "q"), Msg("assistant", " a ", " why ")}, false),
            "[gMASK]<sop><|user|>q<|assistant|><think>why</think>a");
  EXPECT_EQ(Format("glm_moe_dsa", {Msg("user", "q"), Msg("assistant", "  Hi  \n")}, false),
            "[gMASK]<sop><|user|>q<|assistant|></think>Hi");
}

// --- Rendered by transformers' apply_chat_template --------------------------------
// tests/data/tokenizers/chat_cases.json holds the real DeepSeek-V3 and GLM-4.7
// templates rendered by transformers (tools/make_tokenizer_fixtures.py).

TEST(ChatFixture, MatchesTemplatesRenderedByTransformers) {
  std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/tests/data/tokenizers/chat_cases.json");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const nlohmann::json fixture = nlohmann::json::parse(buffer.str());
  ASSERT_FALSE(fixture.contains("error")) << fixture["error"];
  int checked = 0;
  for (const nlohmann::json& c : fixture["cases"]) {
    ASSERT_TRUE(c.contains("rendered")) << c.dump();
    std::vector<ChatMessage> messages;
    for (const nlohmann::json& m : c["messages"]) {
      messages.push_back(Msg(m["role"], m["content"], m.value("reasoning_content", "")));
    }
    const std::string templ = c["template"];
    const std::vector<std::string> types =
        templ == "deepseek_v3" ? std::vector<std::string>{"deepseek_v3"}
                               : std::vector<std::string>{"glm_moe_dsa", "glm4_moe_lite"};
    for (const std::string& type : types) {
      EXPECT_EQ(Format(type, messages, c["add_generation_prompt"], c["thinking"]),
                c["rendered"].get<std::string>())
          << type << " " << c.dump();
      ++checked;
    }
  }
  EXPECT_GE(checked, 20);
}

// --- EOS ids -------------------------------------------------------------------------

class EosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeScratchDir(std::string("eos_test_") + ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                          "_");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  absl::StatusOr<std::vector<int>> Load() { return LoadEosTokenIds(dir_.string()); }

  std::filesystem::path dir_;
};

TEST_F(EosTest, IntWithoutGenerationConfig) {
  Write("config.json", R"({"model_type": "deepseek_v3", "eos_token_id": 1})");
  EXPECT_EQ(*Load(), (std::vector<int>{1}));
}

TEST_F(EosTest, UnionOfIntAndListSortedAndDeduplicated) {
  Write("config.json", R"({"eos_token_id": 154820})");
  Write("generation_config.json", R"({"eos_token_id": [154829, 154820, 154827]})");
  EXPECT_EQ(*Load(), (std::vector<int>{154820, 154827, 154829}));
}

TEST_F(EosTest, ListInConfigAndMissingInGenerationConfig) {
  Write("config.json", R"({"eos_token_id": [2, 1, 2]})");
  Write("generation_config.json", R"({"temperature": 0.6, "eos_token_id": null})");
  EXPECT_EQ(*Load(), (std::vector<int>{1, 2}));
}

TEST_F(EosTest, OnlyGenerationConfig) {
  Write("config.json", R"({"model_type": "glm_moe_dsa"})");
  Write("generation_config.json", R"({"eos_token_id": [5, 3]})");
  EXPECT_EQ(*Load(), (std::vector<int>{3, 5}));
}

TEST_F(EosTest, Errors) {
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kNotFound);
  Write("config.json", R"({"eos_token_id": "</s>"})");
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kInvalidArgument);
  Write("config.json", R"({"eos_token_id": [1, -2]})");
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kInvalidArgument);
  Write("config.json", R"({"eos_token_id": 1})");
  Write("generation_config.json", R"({"eos_token_id": )");
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
