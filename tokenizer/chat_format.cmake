# ina_chat: the DeepSeek chat formats (chat_format.h), included by tokenizer/CMakeLists.txt;
# defined once.
if(NOT TARGET ina_chat)
  ina_add_library(ina_chat SOURCES ${PROJECT_SOURCE_DIR}/tokenizer/chat_format.c DEPS ina_core)
endif()
