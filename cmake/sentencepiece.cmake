# SentencePiece, optional: the tokenizer of DeBERTa-v2/v3 model directories (include/dea/text/spm_tokenizer.hpp),
# `dea tokenize --spm` and their tests. The library itself never needs it: only code that includes spm_tokenizer.hpp
# does, and programs built without it refuse a SentencePiece model with a message saying how to get it.
# Debian: libsentencepiece-dev (cmake/install_deps.sh installs it). Found by its header and its shared library
# (libsentencepiece; the trainer library libsentencepiece_train that its pkg-config file also names is not needed).
# DEA_WITH_SENTENCEPIECE is ON when it is found; a value given with -DDEA_WITH_SENTENCEPIECE=... is kept, the default
# follows the library when it is installed or removed later.
# dea_sentencepiece: the interface target such programs link (the library; DEA_HAVE_SENTENCEPIECE=1 defined).
find_path(DEA_SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h)
find_library(DEA_SENTENCEPIECE_LIBRARY sentencepiece)
mark_as_advanced(DEA_SENTENCEPIECE_INCLUDE_DIR DEA_SENTENCEPIECE_LIBRARY)
set(dea_spm_found OFF)
if(DEA_SENTENCEPIECE_INCLUDE_DIR AND DEA_SENTENCEPIECE_LIBRARY)
  set(dea_spm_found ON)
endif()
if(DEFINED DEA_WITH_SENTENCEPIECE_DEFAULT AND DEFINED DEA_WITH_SENTENCEPIECE
   AND "${DEA_WITH_SENTENCEPIECE}" STREQUAL "${DEA_WITH_SENTENCEPIECE_DEFAULT}")
  set(DEA_WITH_SENTENCEPIECE ${dea_spm_found} CACHE BOOL "" FORCE)  # never set by hand: follows the library
endif()
option(DEA_WITH_SENTENCEPIECE
       "Build the SentencePiece tokenizer (DeBERTa-v3), dea tokenize --spm and their tests (default: ON when found)"
       ${dea_spm_found})
set(DEA_WITH_SENTENCEPIECE_DEFAULT ${dea_spm_found} CACHE INTERNAL "the default DEA_WITH_SENTENCEPIECE was given")
set(DEA_SENTENCEPIECE_ENABLED OFF)
if(DEA_WITH_SENTENCEPIECE AND dea_spm_found)
  set(DEA_SENTENCEPIECE_ENABLED ON)
  add_library(dea_sentencepiece INTERFACE)
  target_include_directories(dea_sentencepiece SYSTEM INTERFACE ${DEA_SENTENCEPIECE_INCLUDE_DIR})
  target_link_libraries(dea_sentencepiece INTERFACE ${DEA_SENTENCEPIECE_LIBRARY})
  target_compile_definitions(dea_sentencepiece INTERFACE DEA_HAVE_SENTENCEPIECE=1)
  message(STATUS "SentencePiece found (${DEA_SENTENCEPIECE_LIBRARY}): the DeBERTa tokenizer, dea tokenize --spm "
                 "and their tests are built")
elseif(DEA_WITH_SENTENCEPIECE)
  message(STATUS "SentencePiece not found: the DeBERTa tokenizer (dea tokenize --spm) and its tests are not built; "
                 "install Debian's libsentencepiece-dev (bash cmake/install_deps.sh) and configure again")
else()
  message(STATUS "SentencePiece off (DEA_WITH_SENTENCEPIECE=OFF): the DeBERTa tokenizer and its tests are not built")
endif()
