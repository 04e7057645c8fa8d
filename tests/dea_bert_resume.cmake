# Resume bit-exactness of `dea train --model dea_bert` (run by ctest as dea_bert_train_resume):
#   cmake -DDEA=<dea program> -DHF=<Hugging Face model dir> -DWORK=<scratch dir> -P dea_bert_resume.cmake
# A run of 4 steps straight and a run of 2 steps resumed to 4 must end with byte-identical checkpoints (every
# parameter, the AdamW moments and step counts, the Rng check) and identical training logs (every logged step's
# losses and statistics, and the evaluations), apart from the measured speed (steps_per_s).
foreach(v DEA HF WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "dea_bert_resume.cmake: -D${v}=... is required")
  endif()
endforeach()
set(common train --model dea_bert --hf_model ${HF} --batch_size 8 --max_len 32 --n_per_source 20 --eval_every 2
           --log_every 1 --no-plots)

function(dea_run)
  execute_process(COMMAND ${DEA} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "dea ${ARGN}: exit status ${rc}\n${out}\n${err}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK})
dea_run(${common} --steps 4 --out_dir ${WORK}/straight)
dea_run(${common} --steps 2 --out_dir ${WORK}/resumed)
dea_run(train --resume --steps 4 --out_dir ${WORK}/resumed --no-plots)

execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK}/straight/checkpoint.safetensors
                        ${WORK}/resumed/checkpoint.safetensors RESULT_VARIABLE differ)
if(NOT differ EQUAL 0)
  message(FATAL_ERROR "the checkpoint of 2 steps resumed to 4 differs from that of 4 steps straight")
endif()

foreach(run straight resumed)
  file(READ ${WORK}/${run}/train_log.jsonl log)
  string(REGEX REPLACE "\"steps_per_s\":[-+.eE0-9]+,?" "" log_${run} "${log}")
endforeach()
if(NOT log_straight STREQUAL log_resumed)
  message(FATAL_ERROR "the training logs differ:\n--- 4 steps straight\n${log_straight}\n--- 2 steps resumed to 4\n"
                      "${log_resumed}")
endif()
# the training lines' losses (keys in order: ..., "n_labelled", "step", "task_loss"; evaluations have "split" first)
string(REGEX MATCHALL "\"n_labelled\":[0-9]+,\"step\":[0-9]+,\"task_loss\":[-+.eE0-9]+" losses "${log_straight}")
string(REGEX REPLACE "\"n_labelled\":[0-9]+,|\"" "" losses "${losses}")
message(STATUS "resume bit-exact: checkpoints identical, logs identical (${losses})")
