// dea: the library's command-line program. `dea <command> [flags]`; `dea --help` lists the commands,
// `dea <command> --help` documents every flag with its default and range.
//
// Exit status: 0 done, 1 failure, 2 bad command line or bad file (an unknown command included).
//
// OpenMP waiting. By default libgomp lets an idle thread spin for a while before it sleeps, which costs nothing on
// an idle machine and a lot on a busy one (the spinning threads take the cores that the working threads and the
// other programs need). So dea waits passively (OMP_WAIT_POLICY=passive) unless the user chose a policy: when
// neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set, the program sets OMP_WAIT_POLICY=passive and starts itself
// again (libgomp reads its environment before main runs); the variable it set keeps the second start from
// starting again. Set OMP_WAIT_POLICY=active (or GOMP_SPINCOUNT) to keep OpenMP's default spinning.
#include "commands.hpp"

#include <dea/version.hpp>
#include <fmt/core.h>

#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__linux__)
#include <unistd.h>
#endif

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
};

const Command kCommands[] = {
    {"train", dea_train, "train the Dual-Expert encoder (the reference's train.py) or --model lm: checkpoints, log"},
    {"eval", dea_eval, "evaluate a run's checkpoint on a split (the reference's eval.py)"},
    {"generate", dea_generate, "text from a --model lm run's checkpoint (greedy or sampled, KV-cached)"},
    {"visualize", dea_visualize, "the reference's attention pictures (visualize.py) as SVG files"},
    {"interop", dea_interop, "run a golden case of the reference: write the results, compare them"},
    {"export-c", dea_export_c, "write a safetensors file as a C++ header (weights compiled in)"},
    {"tokenize", dea_tokenize, "BERT WordPiece or DeBERTa SentencePiece over JSON lines: ids, pieces or pairs"},
    {"oracle", dea_oracle, "the NLI oracle's alpha of every pair, from two local BERT model directories"},
    {"completion", dea_completion, "a bash completion script made from the commands' flags (bash)"},
};

std::string command_list() {
  std::string s = "usage: dea <command> [flags]   (dea <command> --help: its flags)\n\ncommands:\n";
  for (const Command& c : kCommands) s += fmt::format("  {:<10} {}\n", c.name, c.summary);
  s += "\n`dea --version` prints the version.\n";
  s += "\nFlag names take '_' and '-' alike: --max_len and --max-len are one flag, in every command.\n";
  s += "\nOpenMP threads wait passively unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set.\n";
  s += "\nExit status: 0 done, 1 failure, 2 bad command line (an unknown command included); a command's own are at\n"
       "the end of its --help.\n";
  return s;
}

/// Restarts the program with OMP_WAIT_POLICY=passive unless the user chose a waiting policy (see the file comment).
/// Returns only when it does not restart (a policy is set, or the restart failed: then the program runs as it is).
void prefer_passive_waiting(char** argv) {
#if defined(__linux__)
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
  if (::setenv("OMP_WAIT_POLICY", "passive", 0) != 0) return;
  ::execv("/proc/self/exe", argv);
  // execv returned: it failed; run on with OpenMP's default (the variable is now set, so nothing loops)
#else
  (void)argv;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  prefer_passive_waiting(argv);
  if (argc < 2) {
    fmt::print(stderr, "{}", command_list());
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    fmt::print("{}", command_list());
    return 0;
  }
  if (cmd == "--version" || cmd == "-V") {
    fmt::print("dea {}\n", DEA_VERSION_STRING);
    return 0;
  }
  for (const Command& c : kCommands)
    if (cmd == c.name) return c.run(argc - 1, argv + 1);
  fmt::print(stderr, "dea: unknown command '{}'\n{}", cmd, command_list());
  return 2;
}
