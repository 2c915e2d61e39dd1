// `strata session save|resume|list|rm --server ADDR [ID]`: session management
// through strata.v1.Generation (docs/cli.md).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/remote.h"
#include "common/flags.h"
#include "grpcpp/grpcpp.h"
#include "strata/v1/generation.grpc.pb.h"

namespace strata::cli {


namespace {

void Print(const v1::SessionState& s) {
  std::printf("%s\ttokens=%lld\tturn_watermark=%lld\tresident=%d\tpersistent=%d\n", s.session_id().c_str(),
              static_cast<long long>(s.tokens()), static_cast<long long>(s.turn_watermark()), s.resident(),
              s.persistent());
}

}  // namespace

int Session(const std::vector<std::string>& args) {
  FlagSet flags;
  DeclareRemoteFlags(&flags);
  flags.Declare("prefix", "list: only ids starting with this");
  flags.Declare("help", "show this help", true);
  auto fail = [](const std::string& m, int code) {
    std::fprintf(stderr, "strata session: %s\n", m.c_str());
    return code;
  };
  if (auto st = flags.Parse(args); !st.ok()) return fail(std::string(st.message()), 2);
  const auto& pos = flags.positional();
  if (flags.Has("help") || pos.empty()) {
    std::printf("usage: strata session (save|resume|rm) ID --server ADDR\n       strata session list --server ADDR\n%s",
                flags.Help().c_str());
    return flags.Has("help") ? 0 : 2;
  }
  absl::StatusOr<Remote> remote = Remote::FromFlags(flags);
  if (!remote.ok()) return fail(std::string(remote.status().message()), 2);
  const std::string& verb = pos[0];
  if (verb != "list" && pos.size() != 2) return fail(absl::StrCat(verb, " needs one session id"), 2);
  auto stub = v1::Generation::NewStub(remote->channel());
  grpc::ClientContext ctx;
  remote->Authorize(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  grpc::Status st;
  if (verb == "save" || verb == "resume") {
    v1::SessionState s;
    if (verb == "save") {
      v1::SaveSessionRequest r;
      r.set_session_id(pos[1]);
      st = stub->SaveSession(&ctx, r, &s);
    } else {
      v1::ResumeSessionRequest r;
      r.set_session_id(pos[1]);
      st = stub->ResumeSession(&ctx, r, &s);
    }
    if (st.ok()) Print(s);
  } else if (verb == "list") {
    v1::ListSessionsRequest r;
    r.set_prefix(flags.Get("prefix"));
    v1::ListSessionsResponse resp;
    st = stub->ListSessions(&ctx, r, &resp);
    if (st.ok()) {
      for (const auto& s : resp.sessions()) Print(s);
    }
  } else if (verb == "rm") {
    v1::DeleteSessionRequest r;
    r.set_session_id(pos[1]);
    v1::DeleteSessionResponse resp;
    st = stub->DeleteSession(&ctx, r, &resp);
  } else {
    return fail(absl::StrCat("unknown verb '", verb, "' (save, resume, list, rm)"), 2);
  }
  if (!st.ok()) {
    const std::string code = absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code()));
    return fail(absl::StrCat(st.error_message(), " [", code, "]"),
                st.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? 2 : 1);
  }
  return 0;
}

}  // namespace strata::cli
