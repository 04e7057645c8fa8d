// dea completion bash: prints a bash completion script for the dea program. The script is generated from the
// programs' own help texts, which the flag table writes: the commands of `dea --help`, and for each command the
// flags of `dea <command> --help` (a flag whose value name is a list "a|b|c" completes to its choices, any other
// flag with a value to file names). Install it as /usr/share/bash-completion/completions/dea, or source it:
//   source <(dea completion bash)
// Exit status: 0 printed, 1 a help text could not be read, 2 bad command line.
#include "commands.hpp"

#include <dea/cli/flags.hpp>

#include <fmt/core.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <system_error>
#include <string>
#include <vector>

namespace completion_detail {  // (named: the subcommands are compiled as one unit)

/// The standard output of `dea <args>` run as a child of this program.
std::string run_self(const std::string& args) {
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();  // this program's file
  dea::check(!ec && !self.empty() && self.find('\'') == std::string::npos, "cannot find this program's file");
  const std::string cmd = "'" + self + "' " + args + " 2>/dev/null";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  dea::check(p != nullptr, "cannot run '", cmd, "'");
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int rc = ::pclose(p);
  dea::check(rc == 0 && !out.empty(), "'dea ", args, "' gave no help text");
  return out;
}

std::vector<std::string> lines_of(const std::string& s) { return dea::cli::split(s, '\n'); }

struct Flag {
  std::string name, value_name;  // value_name empty: a switch
};

/// The flags of a help text: its lines "  --name [VALUE]" (the "--" line that ends the flags excluded).
std::vector<Flag> flags_of(const std::string& help) {
  std::vector<Flag> out;
  for (const std::string& l : lines_of(help)) {
    if (l.compare(0, 4, "  --") != 0 || l.size() == 4) continue;
    const std::size_t sp = l.find(' ', 4);
    out.push_back({l.substr(4, sp == std::string::npos ? std::string::npos : sp - 4),
                   sp == std::string::npos ? std::string() : l.substr(sp + 1)});
  }
  return out;
}

/// The commands of `dea --help`: the lines "  name  summary" after "commands:".
std::vector<std::string> commands_of(const std::string& help) {
  std::vector<std::string> out;
  bool in = false;
  for (const std::string& l : lines_of(help)) {
    if (l == "commands:") {
      in = true;
      continue;
    }
    if (!in) continue;
    if (l.compare(0, 2, "  ") != 0 || l.size() < 3 || l[2] == ' ') break;
    out.push_back(l.substr(2, l.find(' ', 2) - 2));
  }
  return out;
}

std::string bash_script() {
  const std::vector<std::string> commands = commands_of(run_self("--help"));
  dea::check(!commands.empty(), "'dea --help' lists no command");
  std::string cases_value, cases_flags, all;
  for (const std::string& c : commands) {
    all += (all.empty() ? "" : " ") + c;
    std::string words;
    for (const Flag& f : flags_of(run_self(c + " --help"))) {
      words += (words.empty() ? "--" : " --") + f.name;
      if (f.value_name.empty()) continue;
      const std::string pattern = fmt::format("      \"{} --{}\")", c, f.name);
      if (f.value_name.find('|') != std::string::npos) {
        std::string choices = f.value_name;
        for (char& ch : choices)
          if (ch == '|') ch = ' ';
        cases_value += fmt::format("{} COMPREPLY=($(compgen -W \"{}\" -- \"$cur\")); return ;;\n", pattern, choices);
      } else {
        cases_value += fmt::format("{} COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n", pattern);
      }
    }
    cases_flags += fmt::format("      {}) flags=\"{} --help\" ;;\n", c, words);
  }
  return fmt::format(
      "# bash completion for dea (written by `dea completion bash`)\n"
      "_dea() {{\n"
      "  local cur=\"${{COMP_WORDS[COMP_CWORD]}}\" prev=\"${{COMP_WORDS[COMP_CWORD-1]}}\" cmd=\"${{COMP_WORDS[1]}}\" "
      "flags= w\n"
      "  if (( COMP_CWORD == 1 )); then\n"
      "    COMPREPLY=($(compgen -W \"{} --help\" -- \"$cur\")); return\n"
      "  fi\n"
      "  for w in \"${{COMP_WORDS[@]:2:COMP_CWORD-2}}\"; do  # after \"--\": arguments, not flags\n"
      "    [[ $w == -- ]] && {{ COMPREPLY=($(compgen -f -- \"$cur\")); return; }}\n"
      "  done\n"
      "  case \"$cmd $prev\" in\n"
      "{}"
      "  esac\n"
      "  case \"$cmd\" in\n"
      "{}"
      "  esac\n"
      "  if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W \"$flags\" -- \"$cur\"));\n"
      "  else COMPREPLY=($(compgen -f -- \"$cur\")); fi\n"
      "}}\n"
      "complete -o filenames -F _dea dea\n",
      all, cases_value, cases_flags);
}

}  // namespace completion_detail

int dea_completion(int argc, char** argv) {
  dea::cli::FlagSet fs("dea completion bash",
                       "Prints a bash completion script for dea, generated from the commands' flags:\n"
                       "  source <(dea completion bash)");
  fs.positional("SHELL", "the shell: bash", 1);
  fs.exit_status("0 printed, 1 a help text could not be read, 2 bad command line");
  dea::cli::FlagSet::Parsed p;
  try {
    p = fs.parse(std::vector<std::string>(argv + 1, argv + argc));
    if (p.help) {
      fmt::print("{}", fs.help());
      return 0;
    }
    dea::check(p.positional.size() == 1, "the shell is required (dea completion bash)");
    dea::check(p.positional[0] == "bash", "expected the shell 'bash', got '", p.positional[0], "'");
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}(dea completion --help)\n", dea::cli::message("dea completion", e));
    return 2;
  }
  try {
    fmt::print("{}", completion_detail::bash_script());
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}", dea::cli::message("dea completion", e));
    return 1;
  }
  return 0;
}
