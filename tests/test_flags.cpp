// The flag table (cli/flags.hpp) and the flags of dea train declared on it (train/config.hpp): a range or a choice
// written once is the one the help shows, the command line enforces and a configuration from a file is checked
// against; '-' and '_' spell one flag; the resume rule and the implied values come from the declaration.
#include <dea/cli/flags.hpp>
#include <dea/train/config.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_flags {

using Catch::Contains;
using namespace dea;

struct Options {
  double rate = 0.5;
  std::int64_t count = 3;
  std::string mode = "fast";
  std::string file;
  bool extra = false;
  std::string kind = "plain";
};

/// A small table: every kind of flag, a resumable one and implications.
cli::FlagTable<Options> table() {
  cli::FlagTable<Options> t;
  t.real("rate", &Options::rate, cli::Range::open_closed(0, 2), "a rate");
  t.integer("count", &Options::count, cli::IntRange::closed(1, 9), "a count").resumable();
  t.choice("mode", &Options::mode, {"fast", "slow"}, "a mode");
  t.text("file", &Options::file, "FILE", "a file", cli::Empty::allowed).implies("mode", "slow");
  t.toggle("extra", &Options::extra, "a switch").implies("kind", "fancy");
  t.choice("kind", &Options::kind, {"plain", "fancy", "odd"}, "a kind").implies_when("odd", "mode", "slow");
  t.set_value_hint([](const std::string& flag, const std::string& v) {
    return flag == "mode" && v == "turbo" ? std::string("turbo is another program's mode") : std::string();
  });
  return t;
}

cli::FlagSet::Parsed parse(const cli::FlagTable<Options>& t, Options& o, std::vector<std::string> args) {
  cli::FlagSet fs("prog [flags]");
  t.bind(fs, o);
  return fs.parse(args);
}

TEST_CASE("flag table: a range written once shows in the help, the parse error and the check", "[flags]") {
  const auto t = table();
  Options o;
  cli::FlagSet fs("prog [flags]");
  t.bind(fs, o);
  const std::string help = fs.help();
  CHECK_THAT(help, Contains("--rate X") && Contains("default 0.5, range (0, 2]"));
  CHECK_THAT(help, Contains("--count N") && Contains("default 3, range [1, 9]"));
  CHECK_THAT(help, Contains("--mode fast|slow"));
  CHECK_THROWS_WITH(parse(t, o, {"--rate", "0"}), Contains("--rate: expected a number in (0, 2], got '0'"));
  CHECK_THROWS_WITH(parse(t, o, {"--count", "10"}), Contains("--count: expected an integer in [1, 9], got '10'"));
  CHECK_THROWS_WITH(parse(t, o, {"--mode", "medium"}), Contains("--mode: expected 'fast' or 'slow', got 'medium'"));
  Options bad;
  bad.rate = 2.5;
  CHECK_THROWS_WITH(t.check(bad), Contains("--rate: 2.5 is outside the range (0, 2]"));
  bad = Options();
  bad.count = 0;
  CHECK_THROWS_WITH(t.check(bad), Contains("--count: 0 is outside the range [1, 9]"));
  bad = Options();
  bad.mode = "medium";
  CHECK_THROWS_WITH(t.check(bad), Contains("--mode: expected 'fast' or 'slow', got 'medium'"));
  // a value with a hint names the hint, on the command line and in a check alike
  CHECK_THROWS_WITH(parse(t, o, {"--mode", "turbo"}), Contains("--mode 'turbo': turbo is another program's mode"));
  bad.mode = "turbo";
  CHECK_THROWS_WITH(t.check(bad), Contains("--mode 'turbo': turbo is another program's mode"));
  CHECK_NOTHROW(t.check(Options()));

  // the flags of dea train: the dropout's range [0, 1) is the help's, the parser's and validate()'s
  train::TrainConfig c;
  cli::FlagSet train_fs("dea train [flags]");
  train::add_config_flags(train_fs, c);
  CHECK_THAT(train_fs.help(), Contains("--dropout P") && Contains("default 0.1, range [0, 1)"));
  CHECK_THROWS_WITH(train::parse_args({"--dropout", "1"}), Contains("--dropout: expected a number in [0, 1), got '1'"));
  c.dropout = 1;
  CHECK_THROWS_WITH(train::validate(c), Contains("--dropout: 1 is outside the range [0, 1)"));
  // a seed beyond int64 (a config.json may hold one) is inside the seed's range, which has no upper bound
  train::TrainConfig big_seed;
  big_seed.seed = std::numeric_limits<std::uint64_t>::max();
  CHECK_NOTHROW(train::validate(big_seed));
  // and a choice list: the one of --attention
  CHECK_THAT(train_fs.help(), Contains("--attention mha|gqa|tr_mha|tr_mha_v2|dea"));
  train::TrainConfig a;
  a.attention = "flash";
  CHECK_THROWS_WITH(train::validate(a),
                    Contains("--attention: expected 'mha', 'gqa', 'tr_mha', 'tr_mha_v2' or 'dea', got 'flash'"));
  CHECK_THROWS_WITH(train::parse_args({"--attention", "flash"}),
                    Contains("--attention: expected 'mha', 'gqa', 'tr_mha', 'tr_mha_v2' or 'dea', got 'flash'"));
}

TEST_CASE("flag table: '-' and '_' spell one flag", "[flags]") {
  std::int64_t max_len = 0;
  bool no_plots = false;
  cli::FlagSet fs("prog [flags]");
  fs.integer("max_len", max_len, cli::IntRange::closed(3, 100), "a length").toggle("no-plots", no_plots, "a switch");
  const auto p = fs.parse(std::vector<std::string>{"--max-len", "7", "--no_plots"});
  CHECK(max_len == 7);
  CHECK(no_plots);
  CHECK(p.flags == std::set<std::string>{"max_len", "no-plots"});  // the declared names
  CHECK(fs.parse(std::vector<std::string>{"--max-len=9"}).flags.count("max_len") == 1);
  CHECK(max_len == 9);
  // a bad value is named as given
  CHECK_THROWS_WITH(fs.parse(std::vector<std::string>{"--max-len", "2"}), Contains("--max-len: expected an integer"));
  CHECK_THROWS_WITH(fs.parse(std::vector<std::string>{"--max+len", "5"}), Contains("unknown flag --max+len"));
  // one flag: declaring the other spelling too is a mistake of the program
  CHECK_THROWS_WITH(fs.integer("max-len", max_len, cli::IntRange::closed(3, 100), "again"), Contains("declared twice"));

  // the flags of dea train and their alias (--wiki_alpha, also --wiki-alpha)
  const train::ParsedArgs t = train::parse_args({"--lr-main", "0.01", "--wiki-alpha", "none", "--batch_size", "4"});
  CHECK(t.config.lr_main == 0.01);
  CHECK(t.config.text_alpha == "none");
  CHECK(t.config.batch_size == 4);
  CHECK(t.explicit_flags == std::set<std::string>{"lr_main", "text_alpha", "batch_size"});

  // the hand-written loop takes both spellings too
  const char* argv[] = {"prog", "--dump_batches", "x", "--lr-grid", "0.1"};
  cli::Args args(5, const_cast<char**>(argv));
  REQUIRE(args.next());
  CHECK(args.is("--dump-batches"));
  CHECK(args.value() == "x");
  REQUIRE(args.next());
  CHECK(args.is("--lr_grid"));
  CHECK_FALSE(args.is("--lr"));
  CHECK(args.double_value(cli::Range::open_closed(0, 1)) == 0.1);
}

TEST_CASE("flags: \"--\" ends the options of a hand-written loop too", "[flags]") {
  // a program's loop as in the file comment: every argument is a flag or refused
  const auto run = [](std::vector<const char*> line) {
    line.insert(line.begin(), "prog");
    cli::Args args(static_cast<int>(line.size()), const_cast<char**>(line.data()));
    std::int64_t steps = 0;
    while (args.next()) {
      if (args.is("--steps")) steps = args.int_value(0, 100);
      else args.unknown();
    }
    return steps;
  };
  CHECK(run({"--steps", "7"}) == 7);
  CHECK(run({"--steps", "7", "--"}) == 7);  // nothing after it: nothing to refuse
  CHECK(run({"--"}) == 0);
  // after "--" a flag's name is an operand, and these programs take none
  CHECK_THROWS_WITH(run({"--steps", "7", "--", "--steps", "9"}),
                    Contains("unexpected argument '--steps' after '--' (this program takes no positional argument)"));
  CHECK_THROWS_WITH(run({"--", "-h"}), Contains("unexpected argument '-h' after '--'"));
  // only the first "--" ends the options: a second one is an operand
  CHECK_THROWS_WITH(run({"--", "--"}), Contains("unexpected argument '--' after '--'"));
  // before "--" nothing changes
  CHECK_THROWS_WITH(run({"--bogus", "--"}), Contains("unknown flag '--bogus'"));
  CHECK_THROWS_WITH(run({"file"}), Contains("unexpected argument 'file'"));

  const char* argv[] = {"prog", "--steps", "3", "--", "x"};
  cli::Args args(5, const_cast<char**>(argv));
  REQUIRE(args.next());
  CHECK_FALSE(args.options_ended());
  CHECK(args.is("--steps"));
  CHECK(args.value() == "3");
  REQUIRE(args.next());
  CHECK(args.options_ended());
  CHECK(args.arg() == "x");
  CHECK_FALSE(args.is("x"));
  CHECK_FALSE(args.next());
}

TEST_CASE("flag table: the resume rule comes from the declaration", "[flags]") {
  const auto t = table();
  CHECK(t.resumable_names() == std::set<std::string>{"count"});
  Options saved, given;
  given.count = 7;
  t.copy_resumable("count", given, saved);
  CHECK(saved.count == 7);
  CHECK_THROWS_WITH(t.copy_resumable("rate", given, saved), Contains("--rate is not a resumable flag"));
  Options o;
  cli::FlagSet fs("prog");
  t.bind(fs, o);
  CHECK_THAT(fs.help(), Contains("range [1, 9]; a resumed run may change it"));

  // dea train: a changed resumable flag is taken, a changed other flag refused, a repeated one allowed
  train::TrainConfig run;
  run.d_model = 16;
  run.n_heads = 2;
  train::TrainConfig again = run;
  again.eval_every = 7;
  again.lr_main = 0.5;
  const train::TrainConfig r = train::resume_config(run, again, {"eval_every"});
  CHECK(r.eval_every == 7);
  CHECK(r.resume);
  CHECK_THROWS_WITH(train::resume_config(run, again, {"eval_every", "lr_main"}),
                    Contains("--lr_main: 0.5 differs from the checkpoint's 0.0003") &&
                        Contains("it may change --bucket_mb, --eval_batches, --eval_every, --exchange, --log_every, "
                                 "--no_isolation_check, --steps, --threads"));
  again.lr_main = run.lr_main;
  CHECK_NOTHROW(train::resume_config(run, again, {"eval_every", "lr_main"}));
  CHECK(train::resumable_flags() ==
        std::set<std::string>{"bucket_mb", "eval_batches", "eval_every", "exchange", "log_every", "no_isolation_check",
                              "steps", "threads"});
  train::TrainConfig c;
  cli::FlagSet train_fs("dea train");
  train::add_config_flags(train_fs, c);
  const std::string help = train_fs.help();
  CHECK_THAT(help, Contains("optimiser steps of the run (default 12000, range >= 1; a resumed run may change it)"));
  CHECK_THAT(help, Contains("learning rate of the gate group (W_gate, c_gate) (default 0.001, range (0, 1e+09])"));
}

TEST_CASE("flag table: what a given flag implies is filled in, an explicit flag never changed", "[flags]") {
  const auto t = table();
  Options o;
  CHECK(t.apply_implications(o, {"file"}) == std::set<std::string>{"mode"});
  CHECK(o.mode == "slow");
  o = Options();
  CHECK(t.apply_implications(o, {"file", "mode"}).empty());  // the explicit --mode wins (checked elsewhere)
  CHECK(o.mode == "fast");
  // a chain: --extra implies --kind fancy, which implies nothing; --kind odd implies --mode slow
  o = Options();
  CHECK(t.apply_implications(o, {"extra"}) == std::set<std::string>{"kind"});
  CHECK(o.kind == "fancy");
  CHECK(o.mode == "fast");
  o = Options();
  o.kind = "odd";
  CHECK(t.apply_implications(o, {"kind"}) == std::set<std::string>{"mode"});
  CHECK(o.mode == "slow");
  o = Options();
  CHECK(t.apply_implications(o, {}).empty());  // nothing given: the defaults stay
  CHECK(o.mode == "fast");

  // the help says what each flag implies
  Options shown;
  cli::FlagSet fs("prog");
  t.bind(fs, shown);
  CHECK_THAT(fs.help(), Contains("a file (default none; implies --mode slow)") &&
                            Contains("(default plain; --kind odd implies --mode slow)"));

  // dea train
  train::TrainConfig tc;
  cli::FlagSet train_fs("dea train");
  train::add_config_flags(train_fs, tc);
  CHECK_THAT(train_fs.help(), Contains("(default none; implies --data_source text)") &&
                                  Contains("(default encoder; --model lm implies --data_source text)") &&
                                  Contains("range [0, 1048576]; implies --shared_expert)"));
  train::ParsedArgs p = train::parse_args({"--model", "lm", "--text", "corpus.txt"});
  CHECK(p.config.data_source == "dalpha");  // parse_args reads the line as written
  CHECK(train::apply_implications(p.config, p.explicit_flags) == std::set<std::string>{"data_source"});
  CHECK(p.config.data_source == "text");
  CHECK_NOTHROW(train::validate(p.config));
  p = train::parse_args({"--model", "lm"});  // the corpus is still needed: said so
  train::apply_implications(p.config, p.explicit_flags);
  CHECK_THROWS_WITH(train::validate(p.config), Contains("--model lm trains on a text corpus: it needs --text FILE"));
  p = train::parse_args({"--model", "lm", "--text", "c.txt", "--shared_d_ff", "64"});  // a chain
  CHECK(train::apply_implications(p.config, p.explicit_flags) ==
        std::set<std::string>{"data_source", "mlp", "shared_expert"});
  CHECK(p.config.shared_expert);
  CHECK(p.config.mlp == "tr_moe");
  p = train::parse_args({"--vocab", "v.txt", "--babi", "b"});
  train::apply_implications(p.config, p.explicit_flags);
  CHECK(p.config.tokenizer == "wordpiece");
  CHECK(p.config.dalpha_source == "files");
  p = train::parse_args({"--hf_model", "dir"});
  train::apply_implications(p.config, p.explicit_flags);
  CHECK(p.config.model == "dea_bert");
  // an explicit contradiction is left as given, and validate() names both flags
  p = train::parse_args({"--data_source", "dalpha", "--text", "c.txt"});
  CHECK(train::apply_implications(p.config, p.explicit_flags).empty());
  CHECK_THROWS_WITH(train::validate(p.config), Contains("--text 'c.txt' is given, but --data_source is 'dalpha'"));
  // --model encoder implies nothing
  p = train::parse_args({"--model", "encoder"});
  CHECK(train::apply_implications(p.config, p.explicit_flags).empty());
  CHECK(p.config.data_source == "dalpha");
}

TEST_CASE("flag table: a program's message carries one prefix", "[flags]") {
  CHECK(cli::message("dea eval", Error("dea: cannot open file 'x'")) == "dea eval: cannot open file 'x'\n");
  CHECK(cli::message("dea eval", "no library prefix") == "dea eval: no library prefix\n");
  try {
    train::parse_args({"--steps", "0"});
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(cli::message("dea train", e) == "dea train: --steps: expected an integer >= 1, got '0'\n");
  }
}

TEST_CASE("flag set: '--' ends the flags", "[flags]") {
  std::string out = "none";
  bool quiet = false;
  cli::FlagSet files("prog [flags] FILE...");
  files.text("out", out, "FILE", "the output").toggle("quiet", quiet, "say less").positional("FILE", "the inputs", 4);
  // after "--" an argument that looks like a flag is a positional argument, and the flags before it still count
  const auto p = files.parse({"--quiet", "a", "--", "--out", "-x", "--help"});
  CHECK(quiet);
  CHECK(out == "none");
  CHECK_FALSE(p.help);
  CHECK(p.positional == std::vector<std::string>{"a", "--out", "-x", "--help"});
  CHECK(p.flags == std::set<std::string>{"quiet"});
  // a second "--" is an argument too; the count of positional arguments still holds
  CHECK(files.parse({"--", "--"}).positional == std::vector<std::string>{"--"});
  CHECK_THROWS_WITH(files.parse({"a", "--", "b", "c", "d", "e"}),
                    Contains("unexpected argument 'e' after '--' (at most 4 FILE)"));
  // a "--" as the value of a flag is refused as before (a value does not start with "--")
  CHECK_THROWS_WITH(files.parse({"--out", "--"}), Contains("--out: missing value"));
  CHECK_THAT(files.help(), Contains("  --\n      ends the flags: what follows is FILE, even when it starts with '-'"));

  cli::FlagSet none("prog [flags]");
  none.toggle("quiet", quiet, "say less");
  CHECK(none.parse({"--"}).positional.empty());  // nothing after it: accepted
  CHECK_THROWS_WITH(none.parse({"--", "--quiet"}),
                    Contains("unexpected argument '--quiet' after '--' (this command takes no positional argument)"));
  CHECK_THAT(none.help(), !Contains("ends the flags"));
}

TEST_CASE("flag set: the help ends with the exit statuses", "[flags]") {
  cli::FlagSet fs("prog [flags]");
  CHECK_THAT(fs.help(), !Contains("Exit status"));
  fs.exit_status("0 done, 1 failure, 2 bad command line");
  const std::string help = fs.help();
  const std::string last = "\nExit status: 0 done, 1 failure, 2 bad command line\n";
  REQUIRE(help.size() > last.size());
  CHECK(help.compare(help.size() - last.size(), last.size(), last) == 0);
  CHECK_THAT(help, Contains("this text\n\nExit status: 0 done, 1 failure, 2 bad command line\n"));
}

}  // namespace test_flags
