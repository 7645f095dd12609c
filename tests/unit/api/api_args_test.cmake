# api_args_test: bad arguments to every entry point of nccl.h, with real 1-
# and 2-rank communicators in one process (label `unit`). Public API only:
# links the `nccl` library and GoogleTest.
add_executable(api_args_test ${CMAKE_CURRENT_LIST_DIR}/api_args_test.cc)
target_link_libraries(api_args_test PRIVATE nccl GTest::gtest Threads::Threads)
target_compile_options(api_args_test PRIVATE -Wall -Wextra)
loom_unit_tests(api_args_test DISCOVERY_TIMEOUT 60 TEST_PREFIX "api_args_test." PROPERTIES LABELS unit TIMEOUT 60)
