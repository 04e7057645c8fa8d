# `dea train --model lm` end to end (run by ctest as lm_train_<arch>):
#   cmake -DDEA=<dea program> -DTEXT=<corpus> -DWORK=<scratch dir> -DARCH=<flag,value,...>
#         [-DROUTE_TABLES=1 [-DPYTHON=python3]] -P lm_train.cmake
# A run of 40 steps on the corpus must lower the training loss (each of the last five logged steps below the first
# step's) and end with a finite validation NLL; dea eval on its checkpoint must give the run's last evaluation
# exactly. A run of 20 steps resumed to 40 must end with a byte-identical checkpoint (parameters, AdamW state, route
# tables) and an identical log apart from the measured speed (steps_per_s), and the same 40 steps on one thread must
# give the same checkpoint bytes. With ROUTE_TABLES the checkpoint must hold layer 0's and layer 1's TR-MoE route
# table. dea generate from the checkpoint must give the same text twice (greedy, and sampled with one seed),
# starting with the prompt. With PYTHON a checkpoint whose route table names an expert beyond E must be refused by
# dea generate (exit 2, the tensor named).
cmake_minimum_required(VERSION 3.16)
foreach(v DEA TEXT WORK ARCH)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "lm_train.cmake: -D${v}=... is required")
  endif()
endforeach()
string(REPLACE "," ";" ARCH "${ARCH}")
set(common train --model lm --data_source text --text ${TEXT} --d_model 32 --n_heads 4 --n_layers 2 --d_ff 64
           --max_len 32 --batch_size 8 --lr_main 3e-3 --log_every 1 --eval_every 10 --seed 7 ${ARCH})

function(dea_run out_var)
  execute_process(COMMAND ${DEA} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "dea ${ARGN}: exit status ${rc}\n${out}\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK})
dea_run(train_out ${common} --steps 40 --out_dir ${WORK}/straight)
dea_run(half_out ${common} --steps 20 --out_dir ${WORK}/resumed)
dea_run(resume_out train --resume --steps 40 --out_dir ${WORK}/resumed)

# training lowers the loss
file(READ ${WORK}/straight/train_log.jsonl log)
string(REGEX MATCHALL "\"loss\":[-+.eE0-9]+" losses "${log}")
string(REGEX REPLACE "\"loss\":" "" losses "${losses}")
list(LENGTH losses n)
if(NOT n EQUAL 40)
  message(FATAL_ERROR "expected 40 logged training steps, got ${n}:\n${log}")
endif()
list(GET losses 0 first)
set(tail_list)
foreach(i 35 36 37 38 39)
  list(GET losses ${i} x)
  list(APPEND tail_list ${x})
endforeach()
foreach(x ${tail_list})  # (a floating-point comparison)
  if(NOT x LESS first)
    message(FATAL_ERROR "the training loss did not fall: step 1 ${first}, steps 36-40 ${tail_list}")
  endif()
endforeach()

# the run's last evaluation, and dea eval on its checkpoint
string(REGEX MATCHALL "\"event\":\"eval\",\"n_tokens\":[0-9]+,\"n_windows\":[0-9]+,\"nll\":[-+.eE0-9]+,\"perplexity\":[-+.eE0-9]+,\"split\":\"val\",\"step\":40" last_eval "${log}")
if(NOT last_eval)
  message(FATAL_ERROR "no evaluation at step 40 in the log:\n${log}")
endif()
string(REGEX REPLACE ".*\"nll\":([-+.eE0-9]+).*" "\\1" nll "${last_eval}")
string(REGEX REPLACE ".*\"perplexity\":([-+.eE0-9]+).*" "\\1" ppl "${last_eval}")
dea_run(eval_out eval --ckpt ${WORK}/straight)
string(REGEX REPLACE ".*\"nll\": ([-+.eE0-9]+).*" "\\1" eval_nll "${eval_out}")
if(NOT eval_nll STREQUAL nll)
  message(FATAL_ERROR "dea eval's NLL ${eval_nll} differs from the run's last evaluation ${nll}:\n${eval_out}")
endif()

# resume is bit-exact
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK}/straight/checkpoint.safetensors
                        ${WORK}/resumed/checkpoint.safetensors RESULT_VARIABLE differ)
if(NOT differ EQUAL 0)
  message(FATAL_ERROR "the checkpoint of 20 steps resumed to 40 differs from that of 40 steps straight")
endif()
# and the result does not depend on the thread count (the straight run uses the library default)
dea_run(one_thread_out ${common} --steps 40 --threads 1 --out_dir ${WORK}/one_thread)
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK}/straight/checkpoint.safetensors
                        ${WORK}/one_thread/checkpoint.safetensors RESULT_VARIABLE differ)
if(NOT differ EQUAL 0)
  message(FATAL_ERROR "the checkpoint of the run on one thread differs from that on the default threads")
endif()
foreach(run straight resumed)
  file(READ ${WORK}/${run}/train_log.jsonl l)
  string(REGEX REPLACE ",?\"steps_per_s\":[-+.eE0-9]+" "" log_${run} "${l}")
endforeach()
if(NOT log_straight STREQUAL log_resumed)
  message(FATAL_ERROR "the training logs differ:\n--- 40 steps straight\n${log_straight}\n--- 20 resumed to 40\n"
                      "${log_resumed}")
endif()

if(ROUTE_TABLES)
  # (the safetensors header is the file's first printable string)
  file(STRINGS ${WORK}/straight/checkpoint.safetensors header REGEX "route_table" LIMIT_COUNT 1)
  foreach(l 0 1)
    string(FIND "${header}" "\"layers.${l}.mlp.engine.route_table\":{\"dtype\":\"I64\",\"shape\":[2,256]" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "the checkpoint holds no I64 route table [2, 256] of layer ${l}")
    endif()
  endforeach()
endif()

# generation: the same flags give the same text
dea_run(g1 generate --ckpt ${WORK}/straight --prompt "The keeper" --max_new 40)
dea_run(g2 generate --ckpt ${WORK}/resumed --prompt "The keeper" --max_new 40)
dea_run(s1 generate --ckpt ${WORK}/straight --prompt "The keeper" --max_new 40 --temperature 0.8 --top_k 20 --seed 3)
dea_run(s2 generate --ckpt ${WORK}/straight --prompt "The keeper" --max_new 40 --temperature 0.8 --top_k 20 --seed 3)
if(NOT g1 STREQUAL g2 OR NOT s1 STREQUAL s2)
  message(FATAL_ERROR "generate is not repeatable:\n${g1}\n${g2}\n${s1}\n${s2}")
endif()
if(NOT g1 MATCHES "^The keeper" OR NOT s1 MATCHES "^The keeper")
  message(FATAL_ERROR "generate: the output does not start with the prompt: '${g1}', '${s1}'")
endif()
# bf16 inference: the same text on 1 and 2 threads, and it starts with the prompt
dea_run(b1 generate --ckpt ${WORK}/straight --prompt "The keeper" --max_new 40 --precision bf16 --threads 1)
dea_run(b2 generate --ckpt ${WORK}/straight --prompt "The keeper" --max_new 40 --precision bf16 --threads 2)
if(NOT b1 STREQUAL b2 OR NOT b1 MATCHES "^The keeper")
  message(FATAL_ERROR "generate --precision bf16 differs between 1 and 2 threads:\n${b1}\n${b2}")
endif()
# a route table that names an expert beyond E is refused on load (exit 2, the tensor named)
if(ROUTE_TABLES AND PYTHON)
  file(REMOVE_RECURSE ${WORK}/badtable)
  file(COPY ${WORK}/straight/ DESTINATION ${WORK}/badtable)
  execute_process(COMMAND ${PYTHON} -c "import json,struct,sys;p=sys.argv[1];b=bytearray(open(p,'rb').read());\
n=struct.unpack('<Q',b[:8])[0];h=json.loads(bytes(b[8:8+n]));o=8+n+h['layers.1.mlp.engine.route_table']['data_offsets'][0];\
b[o:o+8]=struct.pack('<q',9);open(p,'wb').write(b)" ${WORK}/badtable/checkpoint.safetensors RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "could not write the bad route table")
  endif()
  execute_process(COMMAND ${DEA} generate --ckpt ${WORK}/badtable --prompt x RESULT_VARIABLE rc ERROR_VARIABLE err
                  OUTPUT_QUIET)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "layers\\.1\\.mlp\\.engine\\.route_table")
    message(FATAL_ERROR "generate with a bad route table: expected exit status 2 naming the table, got ${rc}: ${err}")
  endif()
  message(STATUS "a bad route table is refused: ${err}")
endif()
message(STATUS "lm train: loss step 1 ${first}, steps 36-40 ${tail_list}; val nll ${nll} perplexity ${ppl}; resume "
               "bit-exact; greedy: '${g1}'")
