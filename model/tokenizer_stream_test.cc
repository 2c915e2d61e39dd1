// StreamDecoder: whole characters only, held bytes, U+FFFD for bytes that can
// never form a character, and equality with Decode().
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/tokenizer.h"
#include "model/tokenizer_utf8.h"

namespace strata {
namespace {

using tokenizer_internal::ByteToChar;

constexpr char kFffd[] = "\xEF\xBF\xBD";

class StreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::FromFile(std::string(STRATA_SOURCE_DIR) +
                                   "/tests/data/tokenizers/deepseek_v3_style.tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok);
  }
  // The id of the single-byte token for `b`.
  int Byte(unsigned char b) const { return *tok_->TokenToId(ByteToChar()[b]); }

  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(StreamTest, HoldsBytesUntilTheCharacterIsComplete) {
  StreamDecoder s(*tok_);
  EXPECT_EQ(s.Add(Byte(0xE2)), "");
  EXPECT_TRUE(s.has_pending());
  EXPECT_EQ(s.Add(Byte(0x82)), "");
  EXPECT_EQ(s.Add(Byte(0xAC)), "\xE2\x82\xAC");  // €
  EXPECT_FALSE(s.has_pending());
  EXPECT_EQ(s.Flush(), "");
}

TEST_F(StreamTest, FourByteCharacterSplitOverTokens) {
  // 🦓 = F0 9F A6 93, fed as single bytes after an ASCII token.
  StreamDecoder s(*tok_);
  EXPECT_EQ(s.Add(Byte('x')), "x");
  EXPECT_EQ(s.Add(Byte(0xF0)), "");
  EXPECT_EQ(s.Add(Byte(0x9F)), "");
  EXPECT_EQ(s.Add(Byte(0xA6)), "");
  EXPECT_EQ(s.Add(Byte(0x93)), "\xF0\x9F\xA6\x93");
}

TEST_F(StreamTest, InvalidBytesBecomeReplacementCharacters) {
  StreamDecoder s(*tok_);
  // A lone continuation byte can never start a character: replaced at once.
  EXPECT_EQ(s.Add(Byte(0x80)), kFffd);
  // A started sequence broken by ASCII: one U+FFFD, then the ASCII.
  EXPECT_EQ(s.Add(Byte(0xE4)), "");
  EXPECT_EQ(s.Add(Byte('A')), std::string(kFffd) + "A");
  // A surrogate prefix (ED A0) is ill-formed byte by byte.
  EXPECT_EQ(s.Add(Byte(0xED)), "");
  EXPECT_EQ(s.Add(Byte(0xA0)), std::string(kFffd) + kFffd);
  // An unfinished character at the end is replaced by Flush().
  EXPECT_EQ(s.Add(Byte(0xF0)), "");
  EXPECT_EQ(s.Add(Byte(0x9F)), "");
  EXPECT_EQ(s.Flush(), kFffd);
  EXPECT_EQ(s.Flush(), "");
}

TEST_F(StreamTest, SkipsSpecialAndUnknownIds) {
  const int bos = *tok_->TokenToId("<｜begin▁of▁sentence｜>");
  const int user = *tok_->TokenToId("<｜User｜>");  // added but not special
  StreamDecoder keep(*tok_, /*skip_special_tokens=*/false);
  StreamDecoder skip(*tok_, /*skip_special_tokens=*/true);
  EXPECT_EQ(keep.Add(bos), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(skip.Add(bos), "");
  EXPECT_EQ(skip.Add(user), "<｜User｜>");
  EXPECT_EQ(skip.Add(-5), "");
  EXPECT_EQ(skip.Add(1 << 20), "");
}

TEST_F(StreamTest, ConcatenationEqualsDecodeOnEncodedText) {
  const std::string text =
      "Emoji 👨‍👩‍👧‍👦 and 👍🏽, 漢字 and かな, العربية, "
      "<｜User｜>hi<｜Assistant｜>ok<｜end▁of▁sentence｜>";
  auto ids = tok_->Encode(text);
  ASSERT_TRUE(ids.ok());
  for (bool skip_special : {false, true}) {
    StreamDecoder s(*tok_, skip_special);
    std::string joined;
    for (int id : *ids) {
      const std::string piece = s.Add(id);
      EXPECT_TRUE(tokenizer_internal::IsValidUtf8(piece));
      joined += piece;
    }
    joined += s.Flush();
    EXPECT_EQ(joined, tok_->Decode(*ids, skip_special));
  }
  EXPECT_EQ(tok_->Decode(*ids, /*skip_special_tokens=*/false), "<｜begin▁of▁sentence｜>" + text);
}

}  // namespace
}  // namespace strata
