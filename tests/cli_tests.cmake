# Command-line programs given bad flags and bad files (included by tests/CMakeLists.txt). Each test runs a program
# as a user would and requires its documented exit status and a message that names the bad flag or file.

# dea_cli_sh(NAME PROGRAM STATUS REGEX SCRIPT [ARG...]): runs the sh script SCRIPT, in which "$0" is the program's
# path and "$@" the ARGs. It passes when the output (stdout and stderr together) matches REGEX and the exit status
# of the script's last command (the program, unless the script goes on) is exactly STATUS; an uncaught exception
# never passes, nor does a message with two prefixes ("dea train: dea: ..."), nor a run that takes more than 30 s
# (each takes well under a second: a check that came after the work would time out).
function(dea_cli_sh name program status regex script)
  add_test(NAME ${name} COMMAND sh -c "exec 2>&1; ${script}; echo \"[exit status $?]\"" $<TARGET_FILE:${program}>
                                ${ARGN})
  set_tests_properties(${name} PROPERTIES PASS_REGULAR_EXPRESSION "${regex}.*\\[exit status ${status}\\]"
                       FAIL_REGULAR_EXPRESSION "terminate called|std::bad_alloc|: dea: " TIMEOUT 30)
endfunction()
# dea_cli_test(NAME PROGRAM STATUS REGEX ARG...): the program run with the ARGs (as dea_cli_sh).
function(dea_cli_test name program status regex)
  dea_cli_sh(${name} ${program} ${status} "${regex}" "\"$0\" \"$@\"" ${ARGN})
endfunction()

# paris_demo: bad values exit 2 naming the flag; at a large --lr every gate cell saturates at the 0.95 cap, the gate
# gradient vanishes after the fit and the isolation check there cannot tell: reported as such, exit 0 (the check
# before the fit holds)
if(TARGET paris_demo)
  dea_cli_test(paris_demo_rejects_inf_lr paris_demo 2 "--lr: expected a number in \\(0, 1000\\], got 'inf'" --lr inf)
  dea_cli_test(paris_demo_rejects_huge_steps paris_demo 2
               "--steps: expected an integer in .*got '99999999999999999999'" --steps 99999999999999999999)
  dea_cli_sh(paris_demo_rejects_empty_steps paris_demo 2 "--steps: expected an integer in .*got ''"
             "\"$0\" --steps ''")
  dea_cli_test(paris_demo_rejects_huge_threads paris_demo 2
               "--threads: expected an integer in \\[1, 4096\\], got '99999999999'" --threads 99999999999)
  dea_cli_test(paris_demo_unknown_flag_last paris_demo 2 "unknown flag '--bogus'" --seed 1 --bogus)
  dea_cli_test(paris_demo_isolation_saturated paris_demo 0 "isolation after the fit : .*inconclusive.*\
gradient isolation: OK before the fit \\(the check after the fit is inconclusive: the gate gradient vanished"
               --lr 1 --steps 30 --threads 1)
  set_tests_properties(paris_demo_isolation_saturated PROPERTIES
                       FAIL_REGULAR_EXPRESSION "FAILED|VIOLATED|terminate called")
endif()

# tr_mha_demo: --steps and --threads are integers in range (a huge --steps used to hang)
if(TARGET tr_mha_demo)
  foreach(bad 2147483647 99999999999 abc -5)
    dea_cli_test(tr_mha_demo_rejects_steps_${bad} tr_mha_demo 2
                 "--steps: expected an integer in \\[0, 100000\\], got '${bad}'" --steps ${bad} --no-plots)
  endforeach()
  dea_cli_test(tr_mha_demo_rejects_threads tr_mha_demo 2 "--threads: expected an integer in \\[1, 4096\\], got 'abc'"
               --threads abc --no-plots)
endif()

# lm_compare: bad flags and an unusable corpus or output directory exit 2 before any training
if(TARGET lm_compare)
  set(dea_lmc_text ${CMAKE_CURRENT_SOURCE_DIR}/data/lm/tiny_corpus.txt)
  set(dea_lmc_out ${CMAKE_CURRENT_BINARY_DIR}/lm_compare_cli)
  dea_cli_test(lm_compare_needs_text lm_compare 2 "--text FILE is required" --out ${dea_lmc_out})
  dea_cli_test(lm_compare_text_missing lm_compare 2 "--text '[^']*no_such_corpus.txt': not a readable file"
               --text ${CMAKE_CURRENT_BINARY_DIR}/no_such_corpus.txt --out ${dea_lmc_out})
  dea_cli_test(lm_compare_one_seed lm_compare 2 "--seeds: the paired statistics need at least 2 seeds, got 1"
               --text ${dea_lmc_text} --seeds 4 --out ${dea_lmc_out})
  dea_cli_test(lm_compare_seed_twice lm_compare 2 "--seeds '1,2,1': seed 1 given twice"
               --text ${dea_lmc_text} --seeds 1,2,1 --out ${dea_lmc_out})
  dea_cli_test(lm_compare_bad_variant lm_compare 2 "--variants 'mha_dense,gpt': unknown variant 'gpt'"
               --text ${dea_lmc_text} --variants mha_dense,gpt --out ${dea_lmc_out})
  dea_cli_test(lm_compare_routed_too_wide lm_compare 2 "--routed \\(512\\) must be below --d_ff \\(512\\)"
               --text ${dea_lmc_text} --routed 512 --out ${dea_lmc_out})
  dea_cli_test(lm_compare_bad_steps lm_compare 2 "--steps: expected an integer in \\[1, 10000000\\], got '0'"
               --text ${dea_lmc_text} --steps 0 --out ${dea_lmc_out})
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    dea_cli_test(lm_compare_out_unwritable lm_compare 2 "--out '/proc/dea_lm_compare': cannot create the directory"
                 --text ${dea_lmc_text} --out /proc/dea_lm_compare)
  endif()
endif()

# laplacian_bench: strict lists and ranges (a range to 2^64 used to fill the memory), and where the results go is
# checked before any training (the default protocol takes minutes: the 30 s limit catches a late check)
if(TARGET laplacian_bench)
  set(dea_lap_out ${CMAKE_CURRENT_BINARY_DIR}/laplacian_cli.json)
  foreach(bad "1--1" "0-18446744073709551615" "0-1000000" "0-1,3abc")
    string(MAKE_C_IDENTIFIER "${bad}" id)
    dea_cli_test(laplacian_bench_rejects_seeds_${id} laplacian_bench 2
                 "--seeds: expected .*at most 1000 values, got '${bad}'" --seeds ${bad} --out ${dea_lap_out})
  endforeach()
  dea_cli_test(laplacian_bench_rejects_epochs laplacian_bench 2
               "--epochs: expected an integer in \\[1, 100000\\], got '2abc'" --epochs 2abc --out ${dea_lap_out})
  dea_cli_test(laplacian_bench_rejects_lr_grid laplacian_bench 2 "--lr-grid: expected .*got '0.003abc'"
               --lr-grid 0.003abc --out ${dea_lap_out})
  dea_cli_test(laplacian_bench_out_dir_missing laplacian_bench 2
               "--out '[^']*/no_such_dir/report.json': the directory '[^']*/no_such_dir' does not exist"
               --out ${CMAKE_CURRENT_BINARY_DIR}/no_such_dir/report.json)
  dea_cli_test(laplacian_bench_out_dir_is_file laplacian_bench 2
               "--out '[^']*': the directory '[^']*CMakeLists.txt' is not a directory"
               --out ${CMAKE_CURRENT_SOURCE_DIR}/CMakeLists.txt/report.json)
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")  # /proc takes no new files, not even from root
    dea_cli_test(laplacian_bench_out_dir_unwritable laplacian_bench 2
                 "--out '/proc/dea_report.json': cannot write into the directory '/proc'" --out /proc/dea_report.json)
    dea_cli_test(laplacian_bench_plot_dir_unwritable laplacian_bench 2
                 "--plot_dir '/proc/dea_plots': cannot create the directory" --plot_dir /proc/dea_plots
                 --out ${dea_lap_out})
  endif()
endif()

# visualize: a --threads typo is refused; sentences of long words give capped file names (a stem of at most 60 bytes
# ending in a hash, so two long sentences that share their start keep both sets of files) and a short one keeps its
# name (they used to fail with "File name too long")
if(TARGET dea_cli)
  dea_cli_test(visualize_rejects_huge_threads dea_cli 2
               "--threads: expected an integer in \\[1, 4096\\], got '99999999999'" visualize --threads 99999999999)
  set(dea_vis_dir ${CMAKE_CURRENT_BINARY_DIR}/visualize_long_pairs)
  set(dea_long "extraordinarily incomprehensible characteristically unquestionably overwhelmingly misunderstanding \
institutionalization counterrevolutionaries internationalization disproportionately uncharacteristically \
indistinguishable electroencephalographically telecommunications")
  set(dea_hash "[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]")
  dea_cli_sh(visualize_long_pairs dea_cli 0
             "wrote 15 SVGs.*heatmap_S_tilde_extraordinarily_incomprehensible_characteristically_${dea_hash}\\.svg.*\
photo_finish_paris_and_france\\.svg.*photo_finish files: 3"
             "rm -rf '${dea_vis_dir}' && mkdir -p '${dea_vis_dir}' && printf '%s paris france\\tparis\\tfrance\\t0.9\\n\
%s paris is in france\\tparis\\tfrance\\t0.5\\nparis and france\\tparis\\tfrance\\t0.3\\n' '${dea_long}' '${dea_long}' \
>'${dea_vis_dir}.tsv' && \"$0\" visualize --warmup_steps 0 --pairs '${dea_vis_dir}.tsv' --out_dir '${dea_vis_dir}' && \
ls '${dea_vis_dir}' && echo \"photo_finish files: $(ls '${dea_vis_dir}' | grep -c '^photo_finish_')\"")
endif()

# dea export-c: --namespace must be an identifier that is not a keyword; the header test_export writes from tensors
# named like the header's own declarations, keywords and macros compiles (in GNU mode, where `linux` is a macro)
if(TARGET dea_cli)
  dea_cli_test(dea_export_c_rejects_keyword_namespace dea_cli 2
               "--namespace expects a C\\+\\+ identifier.*got 'int'"
               export-c ${CMAKE_CURRENT_SOURCE_DIR}/data/golden/layer_basic.safetensors
               ${CMAKE_CURRENT_BINARY_DIR}/export_ns_int.hpp --all --namespace int)
  if(TARGET test_export AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    set_tests_properties(test_export PROPERTIES FIXTURES_SETUP dea_export_names)
    set(dea_export_dir ${CMAKE_CURRENT_BINARY_DIR}/export_test_names)
    add_test(NAME dea_export_c_names_compile
             COMMAND sh -c "printf '#include \"names.hpp\"\\nint main() { return !names_ns::find(\"int\"); }\\n' \
| \"$0\" -std=gnu++17 -fsyntax-only -I '${dea_export_dir}' -x c++ - && echo compiled" ${CMAKE_CXX_COMPILER})
    set_tests_properties(dea_export_c_names_compile PROPERTIES FIXTURES_REQUIRED dea_export_names
                         PASS_REGULAR_EXPRESSION "compiled" TIMEOUT 60)
  endif()
endif()

# bench_dea (bench/ is added after tests/: the target is not defined yet, $<TARGET_FILE:bench_dea> resolves at
# generation): strict values; out of memory is a message and exit 1, not an abort (under a 2 GB address-space limit,
# so that the allocation fails at once whatever the machine has)
if(DEA_BUILD_BENCH AND EXISTS ${PROJECT_SOURCE_DIR}/bench/bench_dea.cpp)
  dea_cli_test(bench_dea_rejects_reps bench_dea 2 "--reps: expected an integer in \\[1, 100000\\], got 'abc'"
               --reps abc)
  dea_cli_test(bench_dea_rejects_threads bench_dea 2 "--threads: expected .*got 'abc'" --threads abc)
  dea_cli_test(bench_dea_rejects_mode bench_dea 2
               "--mode: expected a comma-separated list of forward, train, got 'bogus'" --mode bogus)
  dea_cli_test(bench_dea_rejects_sizes bench_dea 2 "--sizes: expected .*got 'fixed,bogus'" --sizes fixed,bogus)
  dea_cli_test(bench_dea_rejects_kernel bench_dea 2 "--kernel: expected .*got 'tiles'" --kernel tiles)
  dea_cli_test(bench_dea_rejects_huge_shape bench_dea 2 "--shape: expected BxTxDxH .*got '99999999999999999999x16x32x4'"
               --shape 99999999999999999999x16x32x4 --no-check)
  if(NOT DEA_SANITIZE AND CMAKE_SYSTEM_NAME STREQUAL "Linux")
    dea_cli_sh(bench_dea_out_of_memory bench_dea 1 "out of memory at shape 1024x1024x1024x8 \\(tiled kernel"
               "ulimit -v 2000000 && \"$0\" \"$@\"" --shape 1024x1024x1024x8 --kernel tiled --threads 1 --reps 1
               --no-yardstick --mode forward --sizes dynamic --no-check)
    dea_cli_sh(bench_dea_out_of_memory_in_check bench_dea 1 "out of memory in the kernel check at shape 1x2x65536x8"
               "ulimit -v 2000000 && \"$0\" \"$@\"" --shape 1x2x65536x8 --kernel tiled --threads 1 --reps 1
               --no-yardstick --mode forward --sizes dynamic)
  endif()
endif()

# bench_gemm: strict values, and a small run that compares and times both products
if(DEA_BUILD_BENCH AND EXISTS ${PROJECT_SOURCE_DIR}/bench/bench_gemm.cpp)
  dea_cli_test(bench_gemm_rejects_shape bench_gemm 2 "--shape: expected MxNxK.*got '12x0x4'" --shape 12x0x4)
  dea_cli_test(bench_gemm_rejects_scalar bench_gemm 2 "--scalar: expected float, double or bf16, got 'half'" --scalar half)
  dea_cli_test(bench_gemm_smoke bench_gemm 0 "\"product\": \"weight_grad\".*\"packed_over_eigen\""
               --shape 70x80x600 --threads 1,2 --rounds 1 --scalar double)
endif()

# dea train and dea eval: a fresh run refuses the directory of another run (nothing touched; --overwrite replaces it),
# bad flags name themselves, a bad saved configuration is bad input (exit 1), an impossible model is refused
# before anything is allocated, interop refuses a case whose sizes disagree with its tensors
if(TARGET dea_cli)
  dea_cli_test(train_refuses_existing_run dea_cli 2 "--out_dir '.*train_smoke' already holds a run.*--overwrite"
               train --d_model 16 --n_heads 2 --n_layers 1 --d_ff 32 --steps 2 --out_dir ${DEA_TRAIN_SMOKE_DIR})
  set_tests_properties(train_refuses_existing_run PROPERTIES FIXTURES_REQUIRED trained_smoke)
  dea_cli_test(train_unknown_flag_last dea_cli 2 "unknown flag --bogus" train --steps 2 --bogus)
  dea_cli_test(train_flag_as_value dea_cli 2 "--steps: missing value \\(the next argument is the flag '--out_dir'\\)"
               train --steps --out_dir x)
  dea_cli_test(train_threads_before_narrowing dea_cli 2 "--threads: expected an integer in \\[0, 4096\\], got '4294967297'"
               train --threads 4294967297)
  dea_cli_test(train_model_beyond_memory dea_cli 2 "--d_model 65536 --d_ff 1048576 --n_layers 4: .* GB, more than"
               train --d_model 65536 --n_heads 1 --d_ff 1048576 --n_layers 4 --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_big)
  dea_cli_test(train_text_without_source dea_cli 2 "--text 'c.txt' is given, but --data_source is 'dalpha'"
               train --data_source dalpha --text c.txt)
  dea_cli_sh(train_resume_bad_config dea_cli 1 "--resume: .*config.json: invalid JSON"
             "d=${CMAKE_CURRENT_BINARY_DIR}/cli_bad_config; rm -rf \"$d\"; mkdir -p \"$d\"; echo '{' > \"$d/config.json\"; \
\"$0\" train --resume --out_dir \"$d\"")
  dea_cli_test(eval_unknown_flag_last dea_cli 2 "unknown flag --bogus" eval --ckpt x --bogus)
  dea_cli_test(eval_rejects_huge_threads dea_cli 2 "--threads: expected an integer in \\[0, 4096\\], got '99999999999'"
               eval --ckpt x --threads 99999999999)
endif()
if(TARGET dea_cli AND Python3_Interpreter_FOUND)
  dea_cli_sh(interop_rejects_model_sizes dea_cli 2 "metadata 'vocab_size' = 1000000000000 disagrees with tensor 'tok_emb.weight'"
             "python3 -c \"import json,struct,sys;b=open(sys.argv[1],'rb').read();n=struct.unpack('<Q',b[:8])[0];h=json.loads(b[8:8+n]);\
h['__metadata__']['vocab_size']='1000000000000';s=json.dumps(h).encode();open(sys.argv[2],'wb').write(struct.pack('<Q',len(s))+s+b[8+n:])\" \
${CMAKE_CURRENT_SOURCE_DIR}/data/golden/model_cls.safetensors ${CMAKE_CURRENT_BINARY_DIR}/cli_vocab.safetensors && \
\"$0\" interop ${CMAKE_CURRENT_BINARY_DIR}/cli_vocab.safetensors")
endif()

# dea interop --hf_model: a model directory that does not load is a bad file (exit 2, the message names the file and
# the problem) and nothing is written
if(TARGET dea_cli)
  set(dea_hf ${CMAKE_CURRENT_SOURCE_DIR}/data/bert/hf_fixtures/f32)
  set(dea_hf_bad ${CMAKE_CURRENT_BINARY_DIR}/cli_hf_bad)
  dea_cli_sh(interop_hf_model_without_config dea_cli 2 "has no config.json.*absent"
             "rm -rf '${dea_hf_bad}' && mkdir -p '${dea_hf_bad}' && cp '${dea_hf}/model.safetensors' '${dea_hf_bad}/' && \
\"$0\" interop '${dea_hf}/expected.safetensors' --hf_model '${dea_hf_bad}' --out '${dea_hf_bad}/r.safetensors'; s=$?; \
test -e '${dea_hf_bad}/r.safetensors' || echo absent; (exit $s)")
  dea_cli_sh(interop_hf_model_truncated dea_cli 2 "model.safetensors.*truncated"
             "d='${dea_hf_bad}_trunc'; rm -rf \"$d\" && mkdir -p \"$d\" && cp '${dea_hf}/config.json' \"$d/\" && \
head -c 50000 '${dea_hf}/model.safetensors' > \"$d/model.safetensors\" && \
\"$0\" interop '${dea_hf}/expected.safetensors' --hf_model \"$d\"")
  dea_cli_sh(interop_hf_model_bad_hidden_act dea_cli 2 "config.json.*hidden_act: expected .*got \"swish\""
             "d='${dea_hf_bad}_act'; rm -rf \"$d\" && mkdir -p \"$d\" && cp '${dea_hf}/model.safetensors' \"$d/\" && \
sed 's/\"gelu\"/\"swish\"/' '${dea_hf}/config.json' > \"$d/config.json\" && \
\"$0\" interop '${dea_hf}/expected.safetensors' --hf_model \"$d\"")
  dea_cli_test(interop_hf_model_missing_dir dea_cli 2 "Hugging Face model directory '.*no_such_model' does not exist"
               interop ${dea_hf}/expected.safetensors --hf_model ${CMAKE_CURRENT_BINARY_DIR}/no_such_model)
  # an hf_fixture case without --hf_model: its kind is not one interop runs by itself
  dea_cli_test(interop_hf_fixture_needs_model dea_cli 2 "unsupported case kind 'hf_fixture'.*--hf_model"
               interop ${dea_hf}/expected.safetensors)
endif()

# dea interop --hf_model on a DeBERTa directory (B50-B53): an unsupported feature, buckets that do not fit the relative
# embeddings, heads that do not divide the hidden size, a truncated file: exit 2 naming the file and the field or
# tensor, nothing written
if(TARGET dea_cli)
  set(dea_deb ${CMAKE_CURRENT_SOURCE_DIR}/data/deberta/deberta_fixtures/f32)
  set(dea_deb_bad ${CMAKE_CURRENT_BINARY_DIR}/cli_deberta_bad)
  # SED edits config.json; the run writes --out, which must not exist afterwards
  set(dea_deb_edit "d=\"$1\"; rm -rf \"$d\" && mkdir -p \"$d\" && cp '${dea_deb}/model.safetensors' \"$d/\" && \
sed \"$2\" '${dea_deb}/config.json' > \"$d/config.json\" && \
\"$0\" interop '${dea_deb}/expected.safetensors' --hf_model \"$d\" --out \"$d/r.safetensors\"; s=$?; \
test -e \"$d/r.safetensors\" || echo absent; (exit $s)")
  dea_cli_sh(interop_deberta_conv_layer dea_cli 2 "config.json.*conv_kernel_size: 3 asks for the convolution block.*absent"
             "${dea_deb_edit}" ${dea_deb_bad}_conv "s/\"pad_token_id\": 0,/\"pad_token_id\": 0, \"conv_kernel_size\": 3,/")
  dea_cli_sh(interop_deberta_p2p dea_cli 2 "config.json.*pos_att_type: the position term \"p2p\" is not supported.*absent"
             "${dea_deb_edit}" ${dea_deb_bad}_p2p "s/\"c2p\"$/\"c2p\", \"p2p\"/")
  dea_cli_sh(interop_deberta_bad_buckets dea_cli 2
             "config.json.*position_buckets \\(254\\) does not fit the relative range.*absent"
             "${dea_deb_edit}" ${dea_deb_bad}_buckets "s/\"position_buckets\": 64/\"position_buckets\": 254/")
  dea_cli_sh(interop_deberta_heads dea_cli 2
             "config.json.*hidden_size \\(32\\) must be divisible by num_attention_heads \\(5\\).*absent"
             "${dea_deb_edit}" ${dea_deb_bad}_heads "s/\"num_attention_heads\": 4/\"num_attention_heads\": 5/")
  dea_cli_sh(interop_deberta_truncated dea_cli 2 "model.safetensors.*truncated"
             "d='${dea_deb_bad}_trunc'; rm -rf \"$d\" && mkdir -p \"$d\" && cp '${dea_deb}/config.json' \"$d/\" && \
head -c 50000 '${dea_deb}/model.safetensors' > \"$d/model.safetensors\" && \
\"$0\" interop '${dea_deb}/expected.safetensors' --hf_model \"$d\"")
  dea_cli_test(interop_deberta_fixture_needs_model dea_cli 2 "unsupported case kind 'deberta_fixture'.*--hf_model"
               interop ${dea_deb}/expected.safetensors)
endif()

# the second review: contradictory flags, an output over its own input, plot directories checked before the work,
# bench_train's thread count
if(TARGET dea_cli)
  dea_cli_test(train_resume_and_overwrite dea_cli 2 "--resume and --overwrite contradict each other"
               train --resume --overwrite --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_nothing)
  # a resumed run whose train_log.jsonl was deleted says so (and logs from the resumed step on)
  dea_cli_sh(train_resume_missing_log dea_cli 0 "train_log.jsonl is missing; the resumed run's log starts at step 3"
             "d=${CMAKE_CURRENT_BINARY_DIR}/cli_resume_log; rm -rf \"$d\"; \
f='--d_model 16 --n_heads 2 --n_layers 1 --d_ff 32 --batch_size 8 --n_per_source 40 --eval_every 100 --threads 1'; \
\"$0\" train $f --steps 2 --out_dir \"$d\" >/dev/null && rm \"$d/train_log.jsonl\" && \
\"$0\" train $f --steps 4 --resume --out_dir \"$d\" && test -s \"$d/train_log.jsonl\"")
endif()
if(TARGET dea_cli)
  dea_cli_sh(eval_plot_dir_checked_first dea_cli 2 "--plot_dir: cannot create the directory"
             "f=${CMAKE_CURRENT_BINARY_DIR}/cli_a_file; echo x > \"$f\"; \
\"$0\" eval --ckpt ${CMAKE_CURRENT_BINARY_DIR}/cli_nothing --plot_dir \"$f/p\"")
endif()
if(TARGET dea_cli)
  dea_cli_sh(interop_out_is_the_case dea_cli 2 "--out '.*' is the case file itself"
             "c=${CMAKE_CURRENT_BINARY_DIR}/cli_case.safetensors; cp ${CMAKE_CURRENT_SOURCE_DIR}/data/golden/layer_basic.safetensors \"$c\" && \
\"$0\" interop \"$c\" --out \"$c\"; s=$?; cmp -s \"$c\" ${CMAKE_CURRENT_SOURCE_DIR}/data/golden/layer_basic.safetensors && echo unchanged; (exit $s)")
  set_tests_properties(interop_out_is_the_case PROPERTIES PASS_REGULAR_EXPRESSION
                       "is the case file itself.*unchanged.*\\[exit status 2\\]")
endif()
if(DEA_BUILD_BENCH AND EXISTS ${PROJECT_SOURCE_DIR}/bench/bench_train.cpp)  # bench/ is added after tests/
  dea_cli_test(bench_train_rejects_huge_threads bench_train 2 "--threads: expected a comma-separated list of integers in \\[1, 4096\\]"
               --config quick --steps 1 --warmup 0 --threads 99999)
endif()

# dea: an unknown command exits 2 and lists the commands; no command is a bad command line too
if(TARGET dea_cli)
  dea_cli_test(dea_unknown_command dea_cli 2 "dea: unknown command 'bogus'.*commands:.*train.*export-c" bogus)
  dea_cli_test(dea_no_command dea_cli 2 "usage: dea <command>")
  dea_cli_test(dea_unknown_subcommand_flag dea_cli 2 "unknown flag --bogus" interop --bogus)
endif()

# dea --version: "dea X.Y.Z", the project() version (the one <dea/version.hpp> carries), on stdout, exit 0
if(TARGET dea_cli)
  string(REPLACE "." "\\." dea_version_re "${PROJECT_VERSION}")
  dea_cli_sh(dea_version dea_cli 0 "^dea ${dea_version_re}\n" "\"$0\" --version 2>/dev/null")
endif()

# dea tokenize: JSON lines in, ids / pieces / pair encodings out, as Hugging Face's tokenizers gives them for
# bert-base-uncased; a bad line exits 2 naming it, after the complete lines before it (stdout) or with nothing written
# (--out)
if(TARGET dea_cli)
  set(dea_vocab ${CMAKE_CURRENT_SOURCE_DIR}/data/bert/vocab.txt)
  dea_cli_sh(tokenize_ids dea_cli 0 "^\\[7592,1010,2088,999\\]\n\\[1060,103,1061\\]\n\\[\\]\n"
             "printf '%s\\n' '\"Hello, world!\"' '\"x[MASK]y\"' '\"\"' | \"$0\" tokenize --vocab '${dea_vocab}'")
  dea_cli_sh(tokenize_tokens dea_cli 0 "^\\[\"hello\",\",\",\"world\",\"!\"\\]\n\\[\"naive\",\"cafe\"\\]\n"
             "printf '%s\\n' '\"Hello, world!\"' '\"na\\u00efve caf\\u00e9\"' | \"$0\" tokenize --vocab '${dea_vocab}' --tokens")
  dea_cli_sh(tokenize_normalized dea_cli 0 "^\" 東  京 \"\n"
             "printf '%s\\n' '\"東京\"' | \"$0\" tokenize --vocab '${dea_vocab}' --normalized")
  dea_cli_sh(tokenize_pair dea_cli 0
             "^{\"ids\":\\[101,3000,2003,1996,3007,1997,2605,1012,102,2605,102\\],\"token_type_ids\":\\[0,0,0,0,0,0,0,0,0,1,1\\]}\n\
{\"ids\":\\[101,1037,1038,1039,102,1043,1044,1045,102\\],\"token_type_ids\":\\[0,0,0,0,0,1,1,1,1\\]}\n"
             "printf '%s\\n' '[\"Paris is the capital of France.\", \"France\"]' | \"$0\" tokenize --vocab '${dea_vocab}' --pair && \
printf '%s\\n' '[\"a b c d e f\", \"g h i j k\"]' | \"$0\" tokenize --vocab '${dea_vocab}' --pair --max_length 9")
  # max_length 8, 6 and 4 pieces: longest_first keeps 3 + 2, the reference's rule 2 + 3
  dea_cli_sh(tokenize_pair_rules dea_cli 0
             "^{\"tokens\":\\[\"\\[CLS\\]\",\"a\",\"b\",\"c\",\"\\[SEP\\]\",\"g\",\"h\",\"\\[SEP\\]\"\\],\"token_type_ids\":\\[0,0,0,0,0,1,1,1\\]}\n\
{\"tokens\":\\[\"\\[CLS\\]\",\"a\",\"b\",\"\\[SEP\\]\",\"g\",\"h\",\"i\",\"\\[SEP\\]\"\\],\"token_type_ids\":\\[0,0,0,0,1,1,1,1\\],\"span_a\":\\[1,3\\],\"span_b\":\\[4,7\\]}\n"
             "l='[\"a b c d e f\", \"g h i j\"]' && printf '%s\\n' \"$l\" | \"$0\" tokenize --vocab '${dea_vocab}' --pair --tokens --max_length 8 && \
printf '%s\\n' \"$l\" | \"$0\" tokenize --vocab '${dea_vocab}' --pair --tokens --max_length 8 --truncation reference")
  dea_cli_sh(tokenize_bad_line dea_cli 2 "^\\[7592\\]\ndea tokenize: .*stdin:2: invalid JSON"
             "printf '%s\\n' '\"hello\"' 'hello' '\"world\"' | \"$0\" tokenize --vocab '${dea_vocab}'")
  set_tests_properties(tokenize_bad_line PROPERTIES FAIL_REGULAR_EXPRESSION "2088|terminate called|std::bad_alloc")
  dea_cli_sh(tokenize_bad_line_out dea_cli 2 "stdin:3: expected a JSON string \\(the text\\), got array \\(a pair\\? add --pair\\).*nothing written"
             "f=${CMAKE_CURRENT_BINARY_DIR}/tokenize_bad.jsonl; rm -f \"$f\"; printf '%s\\n' '\"a\"' '\"b\"' '[\"c\", \"d\"]' | \
\"$0\" tokenize --vocab '${dea_vocab}' --out \"$f\"; s=$?; test -e \"$f\" || echo 'nothing written'; (exit $s)")
  dea_cli_sh(tokenize_bad_utf8 dea_cli 2 "stdin:1: invalid JSON \\(.*UTF-8"
             "printf '\"caf\\377\"\\n' | \"$0\" tokenize --vocab '${dea_vocab}'")
  dea_cli_sh(tokenize_pair_not_two dea_cli 2 "stdin:1: expected a two-element array of strings \\[A, B\\], got an array of 3"
             "printf '%s\\n' '[\"a\", \"b\", \"c\"]' | \"$0\" tokenize --vocab '${dea_vocab}' --pair")
  dea_cli_sh(tokenize_duplicate_vocab dea_cli 2 "dup_vocab.txt:3: duplicate token 'a' \\(the same token as line 2"
             "f=${CMAKE_CURRENT_BINARY_DIR}/dup_vocab.txt; printf '[UNK]\\na\\na\\n' > \"$f\"; echo '\"a\"' | \"$0\" tokenize --vocab \"$f\"")
  dea_cli_sh(tokenize_empty_vocab dea_cli 2 "empty_vocab.txt: empty vocabulary"
             "f=${CMAKE_CURRENT_BINARY_DIR}/empty_vocab.txt; : > \"$f\"; echo '\"a\"' | \"$0\" tokenize --vocab \"$f\"")
  dea_cli_test(tokenize_needs_vocab dea_cli 2 "--vocab FILE is required" tokenize)
  dea_cli_test(tokenize_max_length_without_pair dea_cli 2 "--max_length applies to --pair only"
               tokenize --vocab ${dea_vocab} --max_length 8)
  dea_cli_test(tokenize_rejects_max_length dea_cli 2 "--max_length: expected an integer in \\[3, 1048576\\], got '2'"
               tokenize --vocab ${dea_vocab} --pair --max_length 2)
  dea_cli_test(tokenize_help dea_cli 0 "usage: dea tokenize --vocab vocab.txt.*--vocab FILE.*--pair.*--max_length N.*range \\[3, 1048576\\]"
               tokenize --help)
endif()

# dea tokenize --spm: the SentencePiece tokenizer of a DeBERTa-v2/v3 model (a directory or a bare spm.model), fast
# (Hugging Face's tokenizers, as AutoTokenizer) or slow (the sentencepiece library); the golden model spm_nfkc
if(TARGET dea_cli AND DEA_SENTENCEPIECE_ENABLED)
  set(dea_spm ${CMAKE_CURRENT_SOURCE_DIR}/data/deberta/spm)
  # "Hello, world!", then a snowman outside the vocabulary: one [UNK] (3) in fast, three byte pieces in slow
  dea_cli_sh(tokenize_spm_ids dea_cli 0
             "^\\[310,288,291,270,286,315,364,496\\]\n\\[286,260,3\\]\n\\[286,260,230,156,135\\]\n"
             "printf '%s\\n' '\"Hello, world!\"' '\"w \\u2603\"' | \"$0\" tokenize --spm '${dea_spm}/spm_nfkc.model' && \
printf '%s\\n' '\"w \\u2603\"' | \"$0\" tokenize --spm '${dea_spm}/spm_nfkc.model' --spm_mode slow")
  dea_cli_sh(tokenize_spm_tokens dea_cli 0 "^\\[\"▁w\",\"▁\",\"<0xE2>\",\"<0x98>\",\"<0x83>\"\\]\n\\[\"▁w\",\"▁\",\"☃\"\\]\n"
             "printf '%s\\n' '\"w \\u2603\"' | \"$0\" tokenize --spm '${dea_spm}/spm_nfkc.model' --spm_mode slow --tokens && \
printf '%s\\n' '\"w \\u2603\"' | \"$0\" tokenize --spm '${dea_spm}/spm_nfkc.model' --tokens")
  dea_cli_sh(tokenize_spm_normalized dea_cli 0 "^\"fi A\"\n"
             "printf '%s\\n' '\" \\ufb01  \\uff21 \"' | \"$0\" tokenize --spm '${dea_spm}/spm_nfkc.model' --normalized")
  # a golden truncated pair: 40 and 12 tokens cut to 8 in all
  dea_cli_sh(tokenize_spm_pair dea_cli 0
             "^\\{\"ids\":\\[1,263,379,272,2,263,334,2\\],\"token_type_ids\":\\[0,0,0,0,0,1,1,1\\]\\}\n"
             "printf '%s\\n' '[\"The old library has more than 40,000 books and a reading room on the third floor.\", \"The library is large.\"]' | \
\"$0\" tokenize --spm '${dea_spm}/spm_nfkc.model' --pair --max_length 8")
  # a DeBERTa directory: [MASK] has the id of its added_tokens.json
  dea_cli_sh(tokenize_spm_directory dea_cli 0 "^\\[1,286,520,2,2\\]\n"
             "d=${CMAKE_CURRENT_BINARY_DIR}/tokenize_spm_dir; rm -rf \"$d\"; mkdir -p \"$d\" && \
cp '${dea_spm}/spm_nfkc.model' \"$d/spm.model\" && cp '${dea_spm}'/dir/*.json \"$d/\" && \
printf '%s\\n' '[\"w[MASK]\", \"\"]' | \"$0\" tokenize --spm \"$d\" --pair | sed 's/,\"token_type_ids.*//; s/{\"ids\"://'")
  dea_cli_sh(tokenize_spm_no_model dea_cli 2 "has no spm.model.*nothing written"
             "d=${CMAKE_CURRENT_BINARY_DIR}/tokenize_spm_empty_dir; f=${CMAKE_CURRENT_BINARY_DIR}/tokenize_spm_out.jsonl; \
rm -rf \"$d\" \"$f\"; mkdir -p \"$d\"; echo '\"a\"' | \"$0\" tokenize --spm \"$d\" --out \"$f\"; s=$?; \
test -e \"$f\" || echo 'nothing written'; (exit $s)")
  dea_cli_sh(tokenize_spm_corrupt_model dea_cli 2 "tokenize_spm_corrupt.model.*truncated protobuf"
             "f=${CMAKE_CURRENT_BINARY_DIR}/tokenize_spm_corrupt.model; head -c 1000 '${dea_spm}/spm_nfkc.model' > \"$f\"; \
echo '\"a\"' | \"$0\" tokenize --spm \"$f\"")
  dea_cli_sh(tokenize_spm_bad_utf8 dea_cli 2 "^\\[344\\]\ndea tokenize: stdin:2: invalid JSON \\(.*UTF-8"
             "printf '\"o\"\\n\"caf\\377\"\\n\"x\"\\n' | \"$0\" tokenize --spm '${dea_spm}/spm_nfkc.model'")
  dea_cli_sh(tokenize_spm_bad_utf8_out dea_cli 2 "stdin:2: invalid JSON \\(.*UTF-8.*nothing written"
             "f=${CMAKE_CURRENT_BINARY_DIR}/tokenize_spm_bad.jsonl; rm -f \"$f\"; printf '[\"a\", \"b\"]\\n[\"caf\\377\", \"b\"]\\n' | \
\"$0\" tokenize --spm '${dea_spm}/spm_nfkc.model' --pair --out \"$f\"; s=$?; test -e \"$f\" || echo 'nothing written'; (exit $s)")
  dea_cli_test(tokenize_spm_rejects_wordpiece_flag dea_cli 2 "--truncation applies to --vocab \\(WordPiece\\) only"
               tokenize --spm ${dea_spm}/spm_nfkc.model --pair --max_length 8 --truncation reference)
  dea_cli_test(tokenize_spm_mode_without_spm dea_cli 2 "--spm_mode applies to --spm only"
               tokenize --vocab ${dea_vocab} --spm_mode slow)
  dea_cli_test(tokenize_spm_rejects_mode dea_cli 2 "--spm_mode.*medium"
               tokenize --spm ${dea_spm}/spm_nfkc.model --spm_mode medium)
  dea_cli_test(tokenize_spm_and_vocab dea_cli 2 "--vocab and --spm cannot be combined"
               tokenize --vocab ${dea_vocab} --spm ${dea_spm}/spm_nfkc.model)
  dea_cli_test(tokenize_spm_slow_normalized dea_cli 2 "--normalized applies to --spm_mode fast only"
               tokenize --spm ${dea_spm}/spm_nfkc.model --spm_mode slow --normalized)
  dea_cli_test(tokenize_spm_help dea_cli 0 "dea tokenize --spm MODEL_OR_DIR.*--spm MODEL_OR_DIR.*--spm_mode fast\\|slow"
               tokenize --help)
elseif(TARGET dea_cli)
  # built without the sentencepiece library: --spm is refused, saying how to get it
  dea_cli_sh(tokenize_spm_unavailable dea_cli 2 "built without the sentencepiece library.*libsentencepiece-dev"
             "echo '\"a\"' | \"$0\" tokenize --spm '${CMAKE_CURRENT_SOURCE_DIR}/data/deberta/spm/spm_nfkc.model'")
endif()

# dea train on local copies of the D_alpha data sets (tests/data/dalpha) and dea eval on that run; a source without
# its file (an error naming the flag, or the synthetic generator with a notice); the pairs an oracle must score; an
# alpha cache that lacks pairs (exit 2, or the mock fallback, counted); WordPiece; --text_alpha none; dea eval refusing
# a configuration whose data it cannot rebuild
if(TARGET dea_cli)
  set(dea_dalpha ${CMAKE_CURRENT_SOURCE_DIR}/data/dalpha)
  set(dea_tiny --d_model 16 --n_heads 2 --n_layers 1 --d_ff 32 --batch_size 8 --steps 2 --gamma_steps 2 --eval_every 2
               --log_every 1 --threads 1 --no-plots)
  set(dea_files --dalpha_source files --babi ${dea_dalpha}/babi --clutrr ${dea_dalpha}/clutrr.csv
                --conceptnet ${dea_dalpha}/conceptnet_assertions.csv --capitals ${dea_dalpha}/capitals.txt)
  set(dea_files_run ${CMAKE_CURRENT_BINARY_DIR}/train_dalpha_files)
  add_test(NAME train_dalpha_files_smoke COMMAND dea_cli train ${dea_tiny} ${dea_files} --out_dir ${dea_files_run} --overwrite)
  set_tests_properties(train_dalpha_files_smoke PROPERTIES FIXTURES_SETUP trained_dalpha_files PASS_REGULAR_EXPRESSION
                       "loaded real babi: 7 positives.*loaded real clutrr: 5.*loaded real conceptnet: 11.*data: 38 train / 3 val / 5 test \\(dalpha\\).*gradient isolation: .* OK.*Paris probe")
  add_test(NAME eval_dalpha_files COMMAND dea_cli eval --ckpt ${dea_files_run} --no-plots)
  set_tests_properties(eval_dalpha_files PROPERTIES FIXTURES_REQUIRED trained_dalpha_files
                       PASS_REGULAR_EXPRESSION "\"n_examples\": 5")
  dea_cli_test(train_dalpha_missing_source dea_cli 2
               "--dalpha_source files: no file for --clutrr FILE \\(CLUTRR\\), --conceptnet FILE or --capitals FILE.*--synthetic_fallback"
               train --dalpha_source files --babi ${dea_dalpha}/babi --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_dalpha_missing)
  dea_cli_test(train_dalpha_missing_file dea_cli 2 "no_such.csv"
               train ${dea_tiny} ${dea_files} --clutrr ${dea_dalpha}/no_such.csv --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_dalpha_nofile)
  dea_cli_sh(train_dump_pairs dea_cli 0 "wrote 46 distinct \\(q_text, k_text\\) pairs of 46 D_alpha records.*lines 46, repeated 0, first \\{\"q_text\":\"[^\"]+\",\"k_text\":\"[^\"]+\"\\}"
             "f=${CMAKE_CURRENT_BINARY_DIR}/cli_pairs.jsonl; rm -f \"$f\"; \"$0\" \"$@\" --dump_pairs \"$f\" && \
echo \"lines $(wc -l < \"$f\"), repeated $(sort \"$f\" | uniq -d | wc -l), first $(head -n 1 \"$f\")\""
             train ${dea_files} --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_pairs_run)
  dea_cli_test(train_dump_pairs_fallback_notice dea_cli 0
               "clutrr: no --clutrr given; using the synthetic CLUTRR-like generator \\(--synthetic_fallback\\).*wrote [0-9]+ distinct"
               train --dalpha_source files --babi ${dea_dalpha}/babi --synthetic_fallback --n_per_source 10
               --dump_pairs ${CMAKE_CURRENT_BINARY_DIR}/cli_pairs_fallback.jsonl)
  dea_cli_test(train_dump_pairs_text dea_cli 2 "--dump_pairs: --data_source text has no \\(q_text, k_text\\) pairs"
               train --data_source text --text corpus.txt --dump_pairs ${CMAKE_CURRENT_BINARY_DIR}/cli_pairs_text.jsonl)
  set(dea_one_pair ${CMAKE_CURRENT_BINARY_DIR}/cli_one_pair.jsonl)
  dea_cli_sh(train_oracle_missing_pair dea_cli 2
             "cli_one_pair.jsonl'?: 45 of the 46 \\(q_text, k_text\\) pairs of the run's data are not in the cache, e.g. q_text \".*--oracle_fallback mock.*nothing written"
             "printf '%s\\n' '{\"q_text\": \"Paris\", \"k_text\": \"France\", \"alpha\": 0.9}' > '${dea_one_pair}' && \
d=${CMAKE_CURRENT_BINARY_DIR}/cli_oracle_missing; rm -rf \"$d\"; \"$0\" \"$@\" --oracle '${dea_one_pair}' --out_dir \"$d\"; s=$?; \
test -e \"$d/config.json\" || echo 'nothing written'; (exit $s)" train ${dea_tiny} ${dea_files})
  dea_cli_sh(train_oracle_fallback_mock dea_cli 0
             "\\[oracle\\] 45 of 46 records \\(45 distinct pairs\\) are not in the cache .*--oracle_fallback mock.*Paris probe"
             "printf '%s\\n' '{\"q_text\": \"Paris\", \"k_text\": \"France\", \"alpha\": 0.9}' > '${dea_one_pair}_fb' && \
\"$0\" \"$@\" --oracle '${dea_one_pair}_fb' --oracle_fallback mock --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_oracle_fallback --overwrite"
             train ${dea_tiny} ${dea_files})
  dea_cli_test(train_wordpiece_smoke dea_cli 0 "vocab 30522 \\(wordpiece\\).*gradient isolation: .* OK.*layer 0:"
               train ${dea_tiny} ${dea_files} --tokenizer wordpiece --vocab ${CMAKE_CURRENT_SOURCE_DIR}/data/bert/vocab.txt
               --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_wordpiece --overwrite)
  dea_cli_sh(train_wordpiece_empty_vocab dea_cli 2 "--vocab '[^']*cli_empty_vocab.txt': .*empty vocabulary.*nothing written"
             "f=${CMAKE_CURRENT_BINARY_DIR}/cli_empty_vocab.txt; : > \"$f\"; d=${CMAKE_CURRENT_BINARY_DIR}/cli_wordpiece_empty; \
rm -rf \"$d\"; \"$0\" train --tokenizer wordpiece --vocab \"$f\" --out_dir \"$d\"; s=$?; test -e \"$d\" || echo 'nothing written'; (exit $s)")
  dea_cli_test(train_vocab_without_wordpiece dea_cli 2 "--vocab 'v.txt' is given, but --tokenizer is 'simple'"
               train --tokenizer simple --vocab v.txt)
  dea_cli_sh(train_text_alpha_none dea_cli 0 "gradient isolation: skipped \\(--text_alpha none: the batches carry no oracle"
             "c=${CMAKE_CURRENT_BINARY_DIR}/cli_text_corpus.txt; : > \"$c\"; for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do \
echo \"The river runs past the old mill number $i. A stone bridge crosses it near the church. Children fish from it.\" >> \"$c\"; done; \
\"$0\" \"$@\" --data_source text --text \"$c\" --wiki_alpha none --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_text_none --overwrite"
             train ${dea_tiny})
  dea_cli_test(train_text_alpha_for_dalpha dea_cli 2 "--text_alpha applies to --data_source text only"
               train --data_source dalpha --wiki_alpha none)
  # --model dea_bert (B40-B43): no --hf_model, a directory without config.json, --max_len beyond the config's
  # max_position_embeddings (160 in the fixture), an encoder-only flag; each exits 2 naming the flag or the file, and
  # the run directory is not created
  set(dea_bert_sim ${CMAKE_CURRENT_SOURCE_DIR}/data/bert/oracle/oracle_sim)
  set(dea_bert_bad "d=${CMAKE_CURRENT_BINARY_DIR}/cli_dea_bert_bad; rm -rf \"$d\"; \"$0\" train --model dea_bert \"$@\" \
--out_dir \"$d\"; s=$?; test -e \"$d\" || echo 'nothing written'; (exit $s)")
  dea_cli_sh(dea_bert_train_rejects_no_hf_model dea_cli 2 "--model dea_bert needs --hf_model DIR.*nothing written"
             "${dea_bert_bad}" --steps 2)
  dea_cli_sh(dea_bert_train_rejects_no_config dea_cli 2
             "--hf_model '[^']*/data/dalpha' has no config.json \\(expected '.*config.json'\\).*nothing written"
             "${dea_bert_bad}" --hf_model ${CMAKE_CURRENT_SOURCE_DIR}/data/dalpha)
  dea_cli_sh(dea_bert_train_rejects_max_len dea_cli 2
             "--max_len 161 exceeds the max_position_embeddings \\(160\\) of .*oracle_sim/config.json.*nothing written"
             "${dea_bert_bad}" --hf_model ${dea_bert_sim} --max_len 161)
  dea_cli_sh(dea_bert_train_rejects_encoder_flag dea_cli 2
             "--d_model applies to --model encoder only: with --model dea_bert the sizes come from --hf_model's config.json.*nothing written"
             "${dea_bert_bad}" --hf_model ${dea_bert_sim} --d_model 16)
  dea_cli_sh(dea_bert_train_rejects_text dea_cli 2
             "--data_source text: --model dea_bert fine-tunes on D_alpha pairs only.*nothing written"
             "${dea_bert_bad}" --hf_model ${dea_bert_sim} --data_source text --text corpus.txt)
  dea_cli_test(dea_bert_train_rejects_hf_model_for_encoder dea_cli 2
               "--hf_model '[^']*' is given, but --model is 'encoder' \\(add --model dea_bert" train --model encoder
               --hf_model ${dea_bert_sim})
  dea_cli_sh(eval_refuses_reference_data_source dea_cli 1 "config.json: --data_source 'wikipedia': the reference's Wikipedia stream cannot be rebuilt"
             "d=${CMAKE_CURRENT_BINARY_DIR}/cli_reference_wiki; rm -rf \"$d\"; mkdir -p \"$d\" && \
echo '{\"data_source\": \"wikipedia\", \"d_model\": 16, \"n_heads\": 2}' > \"$d/config.json\" && \"$0\" eval --ckpt \"$d\"")
  dea_cli_sh(eval_refuses_reference_dalpha_source dea_cli 1 "--dalpha_source 'real': the reference's Hugging Face downloads"
             "d=${CMAKE_CURRENT_BINARY_DIR}/cli_reference_real; rm -rf \"$d\"; mkdir -p \"$d\" && \
echo '{\"data_source\": \"dalpha\", \"dalpha_source\": \"real\"}' > \"$d/config.json\" && \"$0\" eval --ckpt \"$d\"")
endif()

# dea oracle: the public oracle case end to end (tests/check_oracle_out.py: the values to the golden set's
# tolerances, the recovery rule, --calibrate), and bad input (docs/hardening.md B27, B33, B34): exit 2 with the
# file and line named, and nothing written (or the existing cache left as it was)
if(TARGET dea_cli)
  set(dea_or ${CMAKE_CURRENT_SOURCE_DIR}/data/bert/oracle)
  set(dea_or_models "--nli '${dea_or}/oracle_nli' --embedder '${dea_or}/oracle_sim'")
  set(dea_or_tmp ${CMAKE_CURRENT_BINARY_DIR}/oracle_cli)
  if(Python3_Interpreter_FOUND)
    add_test(NAME dea_oracle_golden_float
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/check_oracle_out.py $<TARGET_FILE:dea_cli>
                     ${dea_or} ${dea_or_tmp}_golden_float)
    add_test(NAME dea_oracle_golden_double
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/check_oracle_out.py $<TARGET_FILE:dea_cli>
                     ${dea_or} ${dea_or_tmp}_golden_double --double)
    set_tests_properties(dea_oracle_golden_float dea_oracle_golden_double PROPERTIES
                         PASS_REGULAR_EXPRESSION "oracle --out: ok" TIMEOUT 60)
  endif()
  dea_cli_test(oracle_bf16_needs_float dea_cli 2 "--precision bf16 applies to float" oracle --nli a --embedder b
               --pairs p --out o --double --precision bf16)
  # a DeBERTa-v3 cross-encoder (tests/check_oracle_deberta_out.py: the public DeBERTa oracle case to its tolerances,
  # the same bytes for other threads and batches, resuming); --nli_tokenizer chooses its tokenizer's mode and is
  # refused for a BERT model
  set(dea_od ${CMAKE_CURRENT_SOURCE_DIR}/data/deberta/oracle)
  if(DEA_SENTENCEPIECE_ENABLED)
    if(Python3_Interpreter_FOUND)
      foreach(p float double)
        add_test(NAME dea_oracle_deberta_golden_${p}
                 COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/check_oracle_deberta_out.py
                         $<TARGET_FILE:dea_cli> ${CMAKE_CURRENT_SOURCE_DIR}/data ${dea_or_tmp}_deberta_${p}
                         $<$<STREQUAL:${p},double>:--double>)
        set_tests_properties(dea_oracle_deberta_golden_${p} PROPERTIES PASS_REGULAR_EXPRESSION
                             "oracle deberta --out: ok" TIMEOUT 60)
      endforeach()
    endif()
    dea_cli_sh(oracle_deberta_slow_tokenizer dea_cli 0 "DeBERTa, slow tokenizer.*14 records"
               "d=${dea_or_tmp}_deberta_slow; rm -rf \"$d\"; mkdir -p \"$d\" && \"$0\" oracle --nli '${dea_od}/nli' \
--embedder '${dea_or}/oracle_sim' --pairs '${dea_od}/pairs.jsonl' --out \"$d/c.jsonl\" --nli_tokenizer slow")
    dea_cli_sh(oracle_deberta_no_spm_model dea_cli 2 "no_spm.*spm.model.*nothing written"
               "d=${dea_or_tmp}_deberta_no_spm; rm -rf \"$d\"; mkdir -p \"$d\" && cp '${dea_od}/nli/config.json' \
'${dea_od}/nli/model.safetensors' \"$d\" && \"$0\" oracle --nli \"$d\" --embedder '${dea_or}/oracle_sim' \
--pairs '${dea_od}/pairs.jsonl' --out \"$d/c.jsonl\"; s=$?; test -e \"$d/c.jsonl\" || echo 'nothing written'; (exit $s)")
  else()
    # built without the sentencepiece library: a DeBERTa NLI directory is refused, saying how to get it
    dea_cli_test(oracle_deberta_unavailable dea_cli 2 "built without the sentencepiece library.*libsentencepiece-dev"
                 oracle --nli ${dea_od}/nli --embedder ${dea_or}/oracle_sim --pairs ${dea_od}/pairs.jsonl
                 --out ${dea_or_tmp}_deberta_unavailable.jsonl)
  endif()
  dea_cli_test(oracle_nli_tokenizer_bert dea_cli 2 "--nli_tokenizer slow: --nli '.*oracle_nli' is a BERT model"
               oracle --nli ${dea_or}/oracle_nli --embedder ${dea_or}/oracle_sim --pairs ${dea_od}/pairs.jsonl
               --out ${dea_or_tmp}_bert_slow.jsonl --nli_tokenizer slow)
  dea_cli_test(oracle_nli_tokenizer_bad dea_cli 2 "--nli_tokenizer: expected fast or slow, got 'medium'"
               oracle --nli a --embedder b --pairs p --out o --nli_tokenizer medium)
  # B27: a pairs file with a missing field, invalid JSON, invalid UTF-8
  dea_cli_sh(oracle_pairs_missing_field dea_cli 2 "p.jsonl:2: missing field \"hypothesis\".*nothing written"
             "d=${dea_or_tmp}_field; rm -rf \"$d\" && mkdir -p \"$d\" && \
printf '%s\\n' '{\"premise\": \"a\", \"hypothesis\": \"b\"}' '{\"premise\": \"c\"}' > \"$d/p.jsonl\" && \
\"$0\" oracle ${dea_or_models} --pairs \"$d/p.jsonl\" --out \"$d/c.jsonl\"; s=$?; test -e \"$d/c.jsonl\" || echo 'nothing written'; (exit $s)")
  dea_cli_sh(oracle_pairs_invalid_json dea_cli 2 "p.jsonl:1: invalid JSON.*nothing written"
             "d=${dea_or_tmp}_json; rm -rf \"$d\" && mkdir -p \"$d\" && printf '{\"premise\": \"a\",\\n' > \"$d/p.jsonl\" && \
\"$0\" oracle ${dea_or_models} --pairs \"$d/p.jsonl\" --out \"$d/c.jsonl\"; s=$?; test -e \"$d/c.jsonl\" || echo 'nothing written'; (exit $s)")
  dea_cli_sh(oracle_pairs_invalid_utf8 dea_cli 2 "p.jsonl:1: the line is not valid UTF-8 \\(byte 0xFF at byte offset 16\\).*nothing written"
             "d=${dea_or_tmp}_utf8; rm -rf \"$d\" && mkdir -p \"$d\" && printf '{\"premise\": \"caf\\377\", \"hypothesis\": \"b\"}\\n' > \"$d/p.jsonl\" && \
\"$0\" oracle ${dea_or_models} --pairs \"$d/p.jsonl\" --out \"$d/c.jsonl\"; s=$?; test -e \"$d/c.jsonl\" || echo 'nothing written'; (exit $s)")
  dea_cli_sh(oracle_labels_missing_alpha dea_cli 2 "l.jsonl:1: missing field \"alpha\".*nothing written"
             "d=${dea_or_tmp}_labels; rm -rf \"$d\" && mkdir -p \"$d\" && printf '%s\\n' '{\"premise\": \"a\", \"hypothesis\": \"b\"}' > \"$d/p.jsonl\" && \
cp \"$d/p.jsonl\" \"$d/l.jsonl\" && \"$0\" oracle ${dea_or_models} --pairs \"$d/p.jsonl\" --calibrate \"$d/l.jsonl\" --out \"$d/c.jsonl\"; s=$?; \
test -e \"$d/c.jsonl\" || echo 'nothing written'; (exit $s)")
  # B33: a model directory that is missing or not an NLI model
  dea_cli_sh(oracle_missing_model_dir dea_cli 2 "Hugging Face model directory '.*no_such_model' does not exist.*nothing written"
             "d=${dea_or_tmp}_model; rm -rf \"$d\" && mkdir -p \"$d\" && printf '%s\\n' '{\"premise\": \"a\", \"hypothesis\": \"b\"}' > \"$d/p.jsonl\" && \
\"$0\" oracle --nli \"$d/no_such_model\" --embedder '${dea_or}/oracle_sim' --pairs \"$d/p.jsonl\" --out \"$d/c.jsonl\"; s=$?; \
test -e \"$d/c.jsonl\" || echo 'nothing written'; (exit $s)")
  dea_cli_sh(oracle_embedder_as_nli dea_cli 2 "required tensor\\(s\\) missing: 'classifier.weight'"
             "d=${dea_or_tmp}_swap; rm -rf \"$d\" && mkdir -p \"$d\" && printf '%s\\n' '{\"premise\": \"a\", \"hypothesis\": \"b\"}' > \"$d/p.jsonl\" && \
\"$0\" oracle --nli '${dea_or}/oracle_sim' --embedder '${dea_or}/oracle_sim' --pairs \"$d/p.jsonl\" --out \"$d/c.jsonl\"")
  # B34: an output that does not continue this run, or that is the input
  dea_cli_sh(oracle_cache_of_other_pairs dea_cli 2 "c.jsonl:1: holds the pair \\('a', 'b'\\) but pair 1 of .*p2.jsonl \\(line 1\\) is \\('x', 'y'\\).*unchanged"
             "d=${dea_or_tmp}_other; rm -rf \"$d\" && mkdir -p \"$d\" && printf '%s\\n' '{\"premise\": \"a\", \"hypothesis\": \"b\"}' > \"$d/p1.jsonl\" && \
printf '%s\\n' '{\"premise\": \"x\", \"hypothesis\": \"y\"}' > \"$d/p2.jsonl\" && \"$0\" oracle ${dea_or_models} --pairs \"$d/p1.jsonl\" --out \"$d/c.jsonl\" --quiet && \
cp \"$d/c.jsonl\" \"$d/before\" && \"$0\" oracle ${dea_or_models} --pairs \"$d/p2.jsonl\" --out \"$d/c.jsonl\"; s=$?; cmp -s \"$d/c.jsonl\" \"$d/before\" && echo unchanged; (exit $s)")
  dea_cli_sh(oracle_resume_other_precision dea_cli 2 "c.jsonl:1: this record, computed again, differs.*another precision.*unchanged"
             "d=${dea_or_tmp}_prec; rm -rf \"$d\" && mkdir -p \"$d\" && printf '%s\\n' '{\"premise\": \"a\", \"hypothesis\": \"b\"}' '{\"premise\": \"c\", \"hypothesis\": \"d\"}' > \"$d/p.jsonl\" && \
\"$0\" oracle ${dea_or_models} --pairs \"$d/p.jsonl\" --out \"$d/c.jsonl\" --quiet && head -n 1 \"$d/c.jsonl\" > \"$d/c1\" && cp \"$d/c1\" \"$d/c.jsonl\" && \
\"$0\" oracle ${dea_or_models} --pairs \"$d/p.jsonl\" --out \"$d/c.jsonl\" --double; s=$?; cmp -s \"$d/c.jsonl\" \"$d/c1\" && echo unchanged; (exit $s)")
  dea_cli_sh(oracle_out_is_pairs dea_cli 2 "--out '.*p.jsonl' is the input file .*unchanged"
             "d=${dea_or_tmp}_self; rm -rf \"$d\" && mkdir -p \"$d\" && printf '%s\\n' '{\"premise\": \"a\", \"hypothesis\": \"b\"}' > \"$d/p.jsonl\" && \
cp \"$d/p.jsonl\" \"$d/before\" && \"$0\" oracle ${dea_or_models} --pairs \"$d/p.jsonl\" --out \"$d/p.jsonl\"; s=$?; cmp -s \"$d/p.jsonl\" \"$d/before\" && echo unchanged; (exit $s)")
  dea_cli_test(oracle_needs_embedder dea_cli 2 "--embedder is required" oracle --nli x --pairs p --out o)
  dea_cli_test(oracle_float_and_double dea_cli 2 "--float and --double exclude each other"
               oracle --nli x --embedder y --pairs p --out o --float --double)
  dea_cli_test(oracle_rejects_batch_size dea_cli 2 "--batch_size: expected an integer in \\[1, 65536\\], got '0'"
               oracle --nli x --embedder y --pairs p --out o --batch_size 0)
  dea_cli_test(oracle_help dea_cli 0 "usage: dea oracle --nli DIR.*--calibrate LABELS.jsonl.*--batch_size N.*default 128.*--threads N.*range \\[0, 4096\\]"
               oracle --help)
endif()

# dea interop on the TR-MoE MLP cases (kind tr_moe_mlp, tests/data/golden/lm/mlp_*): double (2e-6 x max(1, max|ref|))
# and float (1e-4), routes and route tables exact; a case whose configuration names a route strategy dea does not
# build is a bad file (exit 2, the message names the strategy)
if(TARGET dea_cli)
  foreach(case mlp_e2_k1_noshared_l1 mlp_e4_k2_shared_l0 mlp_e8_k2_pw07_l3 mlp_modulo_cyclic_e4_k2_l2)
    dea_cli_test(dea_interop_lm_${case} dea_cli 0 "ok   out.route_table max\\|diff\\| 0.000e\\+00 \\(exact\\).*\\(double\\): PASS"
                 interop ${CMAKE_CURRENT_SOURCE_DIR}/data/golden/lm/${case}.safetensors --compare)
    dea_cli_test(dea_interop_lm_${case}_float dea_cli 0 "ok   out.routes max\\|diff\\| 0.000e\\+00 \\(exact\\).*\\(float\\): PASS"
                 interop ${CMAKE_CURRENT_SOURCE_DIR}/data/golden/lm/${case}.safetensors --compare --float)
  endforeach()
endif()
if(TARGET dea_cli AND Python3_Interpreter_FOUND)
  dea_cli_sh(interop_tr_moe_unknown_strategy dea_cli 2 "routing_strategy: 'token_id_multi_hash' is a strategy of the reference that dea does not build"
             "python3 -c \"import json,struct,sys;b=open(sys.argv[1],'rb').read();n=struct.unpack('<Q',b[:8])[0];h=json.loads(b[8:8+n]);\
c=json.loads(h['__metadata__']['config_json']);c['routing_strategy']='token_id_multi_hash';h['__metadata__']['config_json']=json.dumps(c);\
s=json.dumps(h).encode();open(sys.argv[2],'wb').write(struct.pack('<Q',len(s))+s+b[8+n:])\" \
${CMAKE_CURRENT_SOURCE_DIR}/data/golden/lm/mlp_e4_k2_shared_l0.safetensors ${CMAKE_CURRENT_BINARY_DIR}/cli_tr_moe_strategy.safetensors && \
\"$0\" interop ${CMAKE_CURRENT_BINARY_DIR}/cli_tr_moe_strategy.safetensors --compare")
endif()

# The decoder LM golden cases (kind lm_model): lm_a (MHA + dense SwiGLU) and lm_b (MHA + TR-MoE
# with the shared expert, whose route tables must be exact) pass in double and float, every tensor.
if(TARGET dea_cli)
  set(dea_lm_golden ${CMAKE_CURRENT_SOURCE_DIR}/data/golden/lm)
  foreach(c "lm_a_mha_dense;mha \\+ dense_deterministic" "lm_b_mha_trmoe_shared;mha \\+ tr_hash_engine")
    list(GET c 0 name)
    list(GET c 1 what)
    dea_cli_test(dea_interop_${name} dea_cli 0 "lm_model case ${name} \\(${what}\\): PASS.*\\(double\\): PASS"
                 interop ${dea_lm_golden}/${name}.safetensors --compare)
    dea_cli_test(dea_interop_${name}_float dea_cli 0 "lm_model case ${name} \\(${what}\\): PASS.*\\(float\\): PASS"
                 interop ${dea_lm_golden}/${name}.safetensors --compare --float)
  endforeach()
endif()

# dea train --model lm and dea generate (train/lm.hpp, examples/dea/generate.cpp): end to end on a small corpus
# (tests/lm_train.cmake: the loss falls, dea eval gives the run's last NLL, 20 steps resumed to 40 are bit-exact,
# generate is repeatable) for grouped-query attention with the TR-MoE MLP (a shared expert of its own width, the
# balanced-hash route tables in the checkpoint, label smoothing, a learning-rate warmup), for token-routed attention v2 with the dense SwiGLU and for causal Dual-Expert attention; then bad command lines (exit 2, the flag
# named): the encoder's and the DEA oracle's flags refused with --model lm and the LM's without it, a corpus too
# short for one window, generate without its required flags or with a directory that holds no run.
if(TARGET dea_cli)
  set(dea_lm_corpus ${CMAKE_CURRENT_SOURCE_DIR}/data/lm/tiny_corpus.txt)
  # ARCH: the run's architecture flags, comma-separated
  foreach(c "gqa_trmoe;--attention,gqa,--kv_heads,2,--mlp,tr_moe,--experts,4,--top_k,2,--shared_expert,--shared_d_ff,48,--routing,balanced_hash,--label_smoothing,0.1,--warmup_steps,5;1"
            "trmha2_swiglu;--attention,tr_mha_v2,--mlp,swiglu;0"
            "dea_swiglu;--attention,dea,--mlp,swiglu;0")
    list(GET c 0 name)
    list(GET c 1 arch)
    list(GET c 2 tables)
    add_test(NAME lm_train_${name}
             COMMAND ${CMAKE_COMMAND} -DDEA=$<TARGET_FILE:dea_cli> -DTEXT=${dea_lm_corpus}
                     -DWORK=${CMAKE_CURRENT_BINARY_DIR}/lm_train_${name} -DARCH=${arch} -DROUTE_TABLES=${tables}
                     -DPYTHON=$<$<BOOL:${Python3_Interpreter_FOUND}>:${Python3_EXECUTABLE}> -P ${CMAKE_CURRENT_SOURCE_DIR}/lm_train.cmake)
    set_tests_properties(lm_train_${name} PROPERTIES PASS_REGULAR_EXPRESSION "resume bit-exact" TIMEOUT 600)
  endforeach()
  set(dea_lm_flags train --model lm --data_source text --text ${dea_lm_corpus} --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_lm_bad)
  dea_cli_test(lm_rejects_oracle dea_cli 2 "--oracle does not apply to --model lm" ${dea_lm_flags} --oracle x.jsonl)
  dea_cli_test(lm_rejects_dropout dea_cli 2 "--dropout does not apply to --model lm" ${dea_lm_flags} --dropout 0.2)
  dea_cli_test(lm_rejects_quick dea_cli 2 "--quick does not apply to --model lm" ${dea_lm_flags} --quick)
  dea_cli_test(lm_rejects_plot_dir dea_cli 2 "--plot_dir does not apply to --model lm" ${dea_lm_flags} --plot_dir p)
  dea_cli_test(lm_needs_text dea_cli 2 "--model lm trains on a text corpus: it needs --text FILE" train
               --model lm --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_lm_bad)
  dea_cli_test(lm_rejects_top_k_above_experts dea_cli 2 "--top_k \\(4\\) cannot exceed --experts \\(2\\)"
               ${dea_lm_flags} --mlp tr_moe --experts 2 --top_k 4)
  dea_cli_test(lm_rejects_bad_experts dea_cli 2 "--experts: expected 1, 2, 4, 8 or 16, got 3" ${dea_lm_flags}
               --mlp tr_moe --experts 3 --d_ff 96)
  dea_cli_test(lm_rejects_bad_attention dea_cli 2 "--attention: expected 'mha', 'gqa', 'tr_mha', 'tr_mha_v2' or 'dea', got 'flash'" ${dea_lm_flags} --attention flash)
  dea_cli_test(lm_rejects_shared_d_ff_without_shared dea_cli 2
               "--shared_d_ff 64 applies to --mlp tr_moe --shared_expert only" ${dea_lm_flags} --mlp swiglu --shared_d_ff 64)
  dea_cli_test(lm_rejects_routing_with_swiglu dea_cli 2 "--routing balanced_hash applies to --mlp tr_moe only"
               ${dea_lm_flags} --mlp swiglu --routing balanced_hash)
  dea_cli_test(lm_rejects_bad_routing dea_cli 2 "--routing: expected 'modulo_cyclic' or 'balanced_hash', got 'random'"
               ${dea_lm_flags} --mlp tr_moe --routing random)
  dea_cli_test(lm_rejects_label_smoothing_one dea_cli 2 "--label_smoothing: expected a number in \\[0, 1\\), got '1'"
               ${dea_lm_flags} --label_smoothing 1)
  dea_cli_test(lm_rejects_warmup_beyond_steps dea_cli 2 "--warmup_steps: expected 0 .. --steps \\(10\\), got 20"
               ${dea_lm_flags} --steps 10 --warmup_steps 20)
  dea_cli_test(lm_rejects_bad_lr_schedule dea_cli 2 "--lr_schedule: expected 'constant' or 'cosine', got 'linear'"
               ${dea_lm_flags} --lr_schedule linear)
  dea_cli_test(encoder_rejects_lm_schedule dea_cli 2 "--lr_schedule applies to --model lm only, but --model is 'encoder'"
               train --lr_schedule cosine --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_lm_bad)
  dea_cli_test(encoder_rejects_lm_flags dea_cli 2 "--attention applies to --model lm only, but --model is 'encoder'"
               train --attention mha --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_lm_bad)
  dea_cli_sh(lm_rejects_short_corpus dea_cli 2 "needs at least --max_len \\+ 1 = 65 bytes"
             "printf 'too short' > ${CMAKE_CURRENT_BINARY_DIR}/cli_lm_short.txt && \"$0\" train --model lm \
--data_source text --text ${CMAKE_CURRENT_BINARY_DIR}/cli_lm_short.txt --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_lm_bad")
  dea_cli_test(generate_help dea_cli 0 "usage: dea generate --ckpt DIR --prompt TEXT.*--temperature T.*--top_k K"
               generate --help)
  dea_cli_test(generate_needs_ckpt dea_cli 2 "--ckpt DIR is required" generate --prompt hi)
  dea_cli_test(generate_needs_prompt dea_cli 2 "--prompt TEXT is required" generate --ckpt d)
  dea_cli_test(generate_rejects_bad_temperature dea_cli 2 "--temperature: expected a number" generate --ckpt d
               --prompt hi --temperature -1)
  dea_cli_test(generate_rejects_missing_run dea_cli 2 "--ckpt '/nonexistent/lm_run': .*config.json"
               generate --ckpt /nonexistent/lm_run --prompt hi)
  dea_cli_test(generate_rejects_bad_precision dea_cli 2 "--precision.*fp32.*bf16" generate --ckpt d --prompt hi
               --precision fp16)
endif()

# What a flag implies is inferred when nothing else is possible, and an explicit contradiction is still refused (the
# tests above): --model lm --text FILE trains (the decoder LM on the corpus: --data_source text), --text implies
# --data_source text, --vocab --tokenizer wordpiece, --hf_model --model dea_bert, a TR-MoE flag --mlp tr_moe, and
# the hyphenated spelling of a flag is the flag (--max-len is --max_len)
if(TARGET dea_cli)
  set(dea_lm_corpus ${CMAKE_CURRENT_SOURCE_DIR}/data/lm/tiny_corpus.txt)
  dea_cli_sh(train_lm_text_implies_source dea_cli 0 "checkpoint: .*\"data_source\": \"text\".*\"max_len\": 16"
             "d=${CMAKE_CURRENT_BINARY_DIR}/cli_lm_implied; rm -rf \"$d\"; \"$0\" train --model lm --text '${dea_lm_corpus}' \
--d-model 16 --n-heads 2 --n_layers 1 --d_ff 32 --batch-size 4 --max-len 16 --steps 2 --eval_every 2 --eval-batches 1 \
--threads 1 --out_dir \"$d\" && cat \"$d/config.json\"")
  dea_cli_test(train_text_implies_source dea_cli 2 "--dump_pairs: --data_source text has no \\(q_text, k_text\\) pairs"
               train --text corpus.txt --dump_pairs ${CMAKE_CURRENT_BINARY_DIR}/cli_pairs_implied.jsonl)
  dea_cli_test(train_vocab_implies_wordpiece dea_cli 2 "--vocab '[^']*cli_no_such_vocab.txt': cannot open"
               train --vocab ${CMAKE_CURRENT_BINARY_DIR}/cli_no_such_vocab.txt
               --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_vocab_implied)
  dea_cli_test(train_hf_model_implies_dea_bert dea_cli 2
               "--d_model applies to --model encoder only: with --model dea_bert the sizes come from --hf_model"
               train --hf_model ${CMAKE_CURRENT_SOURCE_DIR}/data/bert/oracle/oracle_sim --d_model 16
               --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_hf_implied)
  dea_cli_test(lm_experts_imply_tr_moe dea_cli 2 "--d_ff \\(100\\) must be a multiple of --experts \\(8\\) with --mlp tr_moe"
               train --model lm --text ${dea_lm_corpus} --experts 8 --d_ff 100
               --out_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_lm_experts_implied)
  dea_cli_test(train_hyphen_alias_checked dea_cli 2 "--max-len: expected an integer in \\[3, 65536\\], got '2'"
               train --max-len 2)
  dea_cli_test(dea_help_flag_spelling dea_cli 0 "Flag names take '_' and '-' alike: --max_len and --max-len are one flag"
               --help)
endif()

# Messages carry one prefix, the command's: "dea eval: ...", never "dea eval: dea: ..." (every dea_cli_sh test refuses
# the second; here each command meets a bad flag or a missing file)
if(TARGET dea_cli)
  foreach(c "train;2;--steps: expected an integer >= 1, got '0';train;--steps;0"
            "eval;1;cannot open file '/nonexistent/config.json';eval;--ckpt;/nonexistent"
            "visualize;2;--threads: expected an integer in \\[1, 4096\\], got '0';visualize;--threads;0"
            "interop;2;safetensors '/nonexistent.safetensors': cannot open;interop;/nonexistent.safetensors"
            "export-c;1;safetensors '/nonexistent.safetensors': cannot open;export-c;/nonexistent.safetensors;/nonexistent/o.hpp"
            "tokenize;2;cannot open file '/nonexistent';tokenize;--vocab;/nonexistent"
            "oracle;2;--batch_size: expected an integer in \\[1, 65536\\], got '0';oracle;--nli;x;--embedder;y;--pairs;p;--out;o;--batch_size;0"
            "generate;2;--ckpt '/nonexistent/lm_run': cannot open file;generate;--ckpt;/nonexistent/lm_run;--prompt;hi")
    list(POP_FRONT c cmd status message)
    dea_cli_test(one_prefix_${cmd} dea_cli ${status} "^dea ${cmd}: ${message}" ${c})
  endforeach()
endif()
# the conventions every subcommand keeps: exit statuses in the help, "--", stdout and stderr
include(${CMAKE_CURRENT_LIST_DIR}/cli/conventions.cmake)
