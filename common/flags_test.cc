#include "common/flags.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

FlagSet Make() {
  FlagSet f;
  f.Declare("model", "model dir");
  f.Declare("json", "json output", true);
  f.Declare("stop", "stop string", false, true);
  f.Declare("n", "count");
  return f;
}

TEST(FlagsTest, ParsesForms) {
  FlagSet f = Make();
  ASSERT_TRUE(f.Parse({"--model", "m", "--json", "--stop=a", "--stop", "b", "pos", "--n=3"}).ok());
  EXPECT_EQ(f.Get("model"), "m");
  EXPECT_TRUE(f.Has("json"));
  EXPECT_EQ(f.GetAll("stop"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(*f.GetInt("n", 0), 3);
  EXPECT_EQ(f.positional(), (std::vector<std::string>{"pos"}));
}

TEST(FlagsTest, Errors) {
  EXPECT_EQ(Make().Parse({"--nope"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Make().Parse({"--model"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Make().Parse({"--model", "a", "--model", "b"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Make().Parse({"--json=maybe"}).code(), absl::StatusCode::kInvalidArgument);
  FlagSet f = Make();
  ASSERT_TRUE(f.Parse({"--n", "x1"}).ok());
  EXPECT_EQ(f.GetInt("n", 0).status().code(), absl::StatusCode::kInvalidArgument);
  FlagSet g = Make();
  ASSERT_TRUE(g.Parse({"--model", "1,2, 3"}).ok());
  EXPECT_EQ(*g.GetIntList("model"), (std::vector<int>{1, 2, 3}));
  FlagSet h = Make();
  ASSERT_TRUE(h.Parse({"--model", "1,x"}).ok());
  EXPECT_FALSE(h.GetIntList("model").ok());
}

}  // namespace
}  // namespace strata
