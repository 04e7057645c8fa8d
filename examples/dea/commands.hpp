// The subcommands of the `dea` program (examples/dea/main.cpp dispatches to them). Each takes the command line
// from its own name on (argv[0] = "train", ...) and returns the exit status: 0 done, 1 failure, 2 bad command line
// or bad file.
#pragma once

int dea_train(int argc, char** argv);
int dea_eval(int argc, char** argv);
int dea_visualize(int argc, char** argv);
int dea_interop(int argc, char** argv);
int dea_export_c(int argc, char** argv);
int dea_tokenize(int argc, char** argv);
int dea_oracle(int argc, char** argv);
int dea_generate(int argc, char** argv);
int dea_completion(int argc, char** argv);
