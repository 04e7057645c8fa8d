# dea train --precision (included by tests/CMakeLists.txt after cli_tests.cmake, whose dea_cli_sh / dea_cli_test it
# uses): a bf16 run records its precision in config.json and in the checkpoint's metadata, a resumed run keeps it
# without the flag, and a resume that gives the other precision is refused naming the flag (exit 2); a value other
# than fp32 or bf16 is refused.
if(TARGET dea_cli)
  set(dea_prec_dir ${CMAKE_CURRENT_BINARY_DIR}/cli_precision)
  set(dea_prec_run "--d_model 16 --n_heads 2 --n_layers 1 --d_ff 32 --batch_size 8 --n_per_source 20 --no-plots")
  dea_cli_sh(train_precision_resume_rule dea_cli 2
             "config.json: bf16.*metadata: bf16.*bf16 products, resumed at step 2.*--precision: .fp32. differs from the checkpoint's .bf16."
             "d=${dea_prec_dir}; rm -rf \"$d\"; \
\"$0\" train ${dea_prec_run} --steps 2 --eval_every 2 --precision bf16 --out_dir \"$d\" >/dev/null && \
grep -q '\"precision\": \"bf16\"' \"$d/config.json\" && echo 'config.json: bf16' && \
grep -aq '\"precision\":\"bf16\"' \"$d/checkpoint.safetensors\" && echo 'metadata: bf16' && \
\"$0\" train --resume --out_dir \"$d\" --steps 3 --no-plots && \
\"$0\" train --resume --out_dir \"$d\" --steps 4 --precision fp32")
  dea_cli_test(train_precision_bad_value dea_cli 2 "--precision: expected 'fp32' or 'bf16', got 'fp16'"
               train --precision fp16 --out_dir ${dea_prec_dir}_bad)
endif()
