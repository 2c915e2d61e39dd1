// The flags `strata generate` shares between its in-process and its
// --server (gRPC client) forms: input, sampling and stopping.
#ifndef STRATA_CLI_GENERATION_FLAGS_H_
#define STRATA_CLI_GENERATION_FLAGS_H_

#include "absl/status/statusor.h"
#include "common/flags.h"
#include "model/sampler.h"

namespace strata::cli {

// --prompt, --chat, --system, --tokens, --max-tokens, the sampling flags,
// --stop (repeatable), --ignore-eos, --json, --help.
void DeclareGenerationFlags(FlagSet* flags);

// Sampling and stopping from the parsed flags. INVALID_ARGUMENT naming the
// flag for values that do not parse or are out of range for the command
// line (the full Validate against a vocabulary happens where it is known).
absl::StatusOr<SamplingParams> SamplingFromFlags(const FlagSet& flags);

}  // namespace strata::cli

#endif  // STRATA_CLI_GENERATION_FLAGS_H_
