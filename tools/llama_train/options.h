// llama_train's command line: the training job's options (train/options.h's TrainOptions) as long flags with their
// built-in defaults, through CLI11 (tools/common/cli.h: `--help` is generated from these definitions).
#pragma once

#include <string>
#include <vector>

#include "tools/common/cli.h"
#include "train/options.h"

namespace llama_train {

using UsageError = tools_cli::UsageError;  // bad flags: one `error:` line, exit 2

// Parses argv (without argv[0]) and resolves the options (train::resolve_options). Sets `help` when --help is
// given. Throws UsageError (train::ConfigError's message included).
train::TrainOptions parse_options(const std::vector<std::string>& args, bool& help);
std::string help_text();

}  // namespace llama_train
