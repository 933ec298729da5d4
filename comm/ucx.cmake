# UCX transfer engine (issue 5), included from comm/CMakeLists.txt. Needs UCX's
# pkg-config file (Debian: libucx-dev).
pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
ina_add_library(ina_ucx
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/ucx_blob.c ${CMAKE_CURRENT_LIST_DIR}/ucx_engine.c
          ${CMAKE_CURRENT_LIST_DIR}/ucx_peer.c ${CMAKE_CURRENT_LIST_DIR}/ucx_xfer.c
  DEPS ina_core PkgConfig::UCX)
