// Subcommands of the `strata` tool. Each takes the arguments after its name
// and returns the process exit code (0 ok, 1 runtime error, 2 usage error).
#ifndef STRATA_CLI_COMMANDS_H_
#define STRATA_CLI_COMMANDS_H_

#include <string>
#include <vector>

namespace strata::cli {

int Score(const std::vector<std::string>& args);
int Generate(const std::vector<std::string>& args);
int Kv(const std::vector<std::string>& args);
// `strata generate --server ADDR`: the gRPC client (cli/client.cc).
int GenerateRemote(const std::vector<std::string>& args);
int Up(const std::vector<std::string>& args);
int Plan(const std::vector<std::string>& args);
int Session(const std::vector<std::string>& args);
// `strata bench serve` (cli/bench.cc).
int Bench(const std::vector<std::string>& args);

}  // namespace strata::cli

#endif  // STRATA_CLI_COMMANDS_H_
