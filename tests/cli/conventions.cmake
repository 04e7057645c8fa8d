# The conventions every dea subcommand keeps (included at the end of cli_tests.cmake, whose dea_cli_sh / dea_cli_test
# it uses): its help names its exit statuses; "--" ends the flags; results go to stdout and progress and notices to
# stderr, and dea eval --json leaves the JSON document alone on stdout; dea eval --ckpt takes the run directory or its checkpoint.
if(TARGET dea_cli)
  foreach(cmd train eval generate visualize interop export-c tokenize oracle completion)
    dea_cli_test(dea_${cmd}_help_exit_status dea_cli 0 "\nExit status: 0 [^\n]*, 1 [^\n]*, 2 " ${cmd} --help)
  endforeach()

  # "--" ends the flags: after it a command without positional arguments refuses what follows, and export-c takes a
  # file whose name starts with '-' (here a missing one: the error is about reading it, exit 1, not an unknown flag)
  dea_cli_test(dea_eval_double_dash_refused dea_cli 2
               "dea eval: unexpected argument '--split' after '--' \\(this command takes no positional argument\\)"
               eval --ckpt x -- --split)
  dea_cli_sh(dea_export_c_double_dash dea_cli 1 "dea export-c: safetensors '-missing.safetensors': cannot open"
             "cd '${CMAKE_CURRENT_BINARY_DIR}' && \"$0\" export-c -- -missing.safetensors cli_double_dash.hpp")

  # dea completion bash: a script bash reads, completing commands, flags (from each command's flag table), the
  # choices of a choice flag and nothing flag-like after "--"; another shell is a bad command line
  dea_cli_sh(dea_completion_bash dea_cli 0
             "syntax ok.*\\[ev\\] eval\n\\[eval --sp\\] --split\n\\[eval --split \\] test val train\n\
\\[train --attention \\] mha gqa tr_mha tr_mha_v2 dea\n\\[eval -- --sp\\] \n"
             "f='${CMAKE_CURRENT_BINARY_DIR}/cli_completion.bash'; \"$0\" completion bash > \"$f\" && bash -n \"$f\" && \
echo 'syntax ok' && bash -c 'source \"$1\"; t() { COMP_WORDS=(dea \"$@\"); COMP_CWORD=$#; _dea; echo \"[$*] \${COMPREPLY[*]}\"; }; \
t ev; t eval --sp; t eval --split \"\"; t train --attention \"\"; t eval -- --sp' sh \"$f\"")
  dea_cli_test(dea_completion_other_shell dea_cli 2 "dea completion: expected the shell 'bash', got 'zsh'" completion zsh)

  # --ckpt names a file that is not the run's checkpoint: a bad command line, said before any loading
  dea_cli_sh(eval_ckpt_other_file dea_cli 2
             "--ckpt '[^']*cli_not_a_checkpoint.txt': expected a run directory or the checkpoint.safetensors in one"
             "f='${CMAKE_CURRENT_BINARY_DIR}/cli_not_a_checkpoint.txt'; echo x > \"$f\"; \"$0\" eval --ckpt \"$f\"")

  # dea train: the progress lines on stderr, stdout without them (and still with the run's results)
  set(dea_conv_data ${CMAKE_CURRENT_SOURCE_DIR}/data/dalpha)
  dea_cli_sh(train_progress_on_stderr dea_cli 0
             "stdout: progress 0, probe 1.*stderr: progress 2, last 'step +2/2 "
             "t='${CMAKE_CURRENT_BINARY_DIR}/cli_train_streams'; rm -rf \"$t\"; mkdir -p \"$t\" && \
\"$0\" train --d_model 16 --n_heads 2 --n_layers 1 --d_ff 32 --batch_size 8 --steps 2 --gamma_steps 2 --eval_every 2 \
--log_every 1 --threads 1 --no-plots --dalpha_source files --babi '${dea_conv_data}/babi' \
--clutrr '${dea_conv_data}/clutrr.csv' --conceptnet '${dea_conv_data}/conceptnet_assertions.csv' \
--capitals '${dea_conv_data}/capitals.txt' --out_dir \"$t/run\" >\"$t/out\" 2>\"$t/err\" && \
echo \"stdout: progress $(grep -c '^step ' \"$t/out\"), probe $(grep -c '^Paris probe' \"$t/out\")\" && \
echo \"stderr: progress $(grep -c '^step ' \"$t/err\"), last '$(grep '^step ' \"$t/err\" | tail -n 1)'\"")

  if(TEST train_dalpha_files_smoke)
    set(dea_conv_run ${CMAKE_CURRENT_BINARY_DIR}/train_dalpha_files)
    set(dea_conv_tmp ${CMAKE_CURRENT_BINARY_DIR}/cli_eval_streams)
    # --ckpt RUN/checkpoint.safetensors --json: stdout is one JSON object (first line '{', last line '}') with the
    # split's results; where the files went and the Paris probe are on stderr
    dea_cli_sh(eval_ckpt_file_json dea_cli 0
               "stdout: first '\\{' last '\\}', n_examples 5, written to 0, probe 0.*stderr: written to 1, plot 1, probe 1"
               "t='${dea_conv_tmp}_json'; rm -rf \"$t\"; mkdir -p \"$t\" && \
\"$0\" eval --ckpt '${dea_conv_run}/checkpoint.safetensors' --json --plot_dir \"$t\" >\"$t/out\" 2>\"$t/err\" && \
echo \"stdout: first '$(head -n 1 \"$t/out\")' last '$(tail -n 1 \"$t/out\")', \
n_examples $(sed -n 's/^  \"n_examples\": \\([0-9]*\\),*$/\\1/p' \"$t/out\"), \
written to $(grep -c 'written to' \"$t/out\"), probe $(grep -c 'Paris probe' \"$t/out\")\" && \
echo \"stderr: written to $(grep -c '^written to .*eval_test.json$' \"$t/err\"), plot $(grep -c '^plot: ' \"$t/err\"), \
probe $(grep -c '^Paris probe' \"$t/err\")\"")
    # without --json: the JSON and then the Paris probe on stdout (results); the file notices on stderr
    dea_cli_sh(eval_streams dea_cli 0
               "stdout: first '\\{', n_examples 5, probe 1, written to 0.*stderr: written to 1, probe 0"
               "t='${dea_conv_tmp}_text'; rm -rf \"$t\"; mkdir -p \"$t\" && \
\"$0\" eval --ckpt '${dea_conv_run}' --no-plots >\"$t/out\" 2>\"$t/err\" && \
echo \"stdout: first '$(head -n 1 \"$t/out\")', \
n_examples $(sed -n 's/^  \"n_examples\": \\([0-9]*\\),*$/\\1/p' \"$t/out\"), \
probe $(grep -c '^Paris probe' \"$t/out\"), written to $(grep -c 'written to' \"$t/out\")\" && \
echo \"stderr: written to $(grep -c '^written to ' \"$t/err\"), probe $(grep -c 'Paris probe' \"$t/err\")\"")
    set_tests_properties(eval_ckpt_file_json eval_streams PROPERTIES FIXTURES_REQUIRED trained_dalpha_files)
  endif()
endif()

# dea --help ends with the exit statuses too, like every command's help
if(TARGET dea_cli)
  dea_cli_test(dea_help_exit_status dea_cli 0 "\nExit status: 0 [^\n]*, 1 [^\n]*, 2 [^\n]*\n" --help)
endif()

# "--" ends the options of the hand-written flag loops too (cli::Args: the examples and bench/ programs): a flag's
# name after it is an operand, which these programs refuse (they take none); before it the flags still count
if(TARGET paris_demo)
  dea_cli_test(paris_demo_double_dash paris_demo 2
               "paris_demo: unexpected argument '--steps' after '--' \\(this program takes no positional argument\\)"
               --seed 1 -- --steps 3)
  dea_cli_test(paris_demo_flag_before_double_dash paris_demo 2 "paris_demo: --steps: expected an integer" --steps x --)
endif()
# (bench/ is added after tests/: $<TARGET_FILE:bench_peak> resolves at generation time)
if(DEA_BUILD_BENCH AND EXISTS ${PROJECT_SOURCE_DIR}/bench/bench_peak.cpp)
  dea_cli_test(bench_peak_double_dash bench_peak 2 "bench_peak: unexpected argument '--help' after '--'" -- --help)
endif()
