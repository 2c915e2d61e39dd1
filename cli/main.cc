// The `strata` command: dispatches to subcommands (see docs/cli.md).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace {

constexpr const char* kUsage = R"(usage: strata COMMAND [flags]

commands:
  generate   generate text in-process, streamed to standard output
  score      teacher-forced log-probabilities of a token sequence, as JSON
  kv         inspect, verify, convert or import .coli_kv session files
  up         start a local cluster (coordinator, workers, KV store) on loopback
  plan       print the layer placement for a model and a number of workers
  session    save, resume, list or remove sessions of a cluster (--server ADDR)
  bench      benchmarks: `bench serve` measures streaming through local clusters
  (generate --server ADDR streams from a cluster instead of running in-process)

Run `strata COMMAND --help` for the flags of a command. See docs/cli.md.
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "score") return strata::cli::Score(args);
  if (cmd == "kv") return strata::cli::Kv(args);
  if (cmd == "generate" && std::find_if(args.begin(), args.end(), [](const std::string& a) {
                             return a == "--server" || a.rfind("--server=", 0) == 0;
                           }) != args.end()) {
    return strata::cli::GenerateRemote(args);
  }
  if (cmd == "generate") return strata::cli::Generate(args);
  if (cmd == "up") return strata::cli::Up(args);
  if (cmd == "plan") return strata::cli::Plan(args);
  if (cmd == "session") return strata::cli::Session(args);
  if (cmd == "bench") return strata::cli::Bench(args);
  std::fprintf(stderr, "strata: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
  return 2;
}
