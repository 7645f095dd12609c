# loom-info: version, build features and every setting with its doc.
# --plan and --algos use the planner (src/core), by the algorithms issue's leave.
add_executable(loom-info ${CMAKE_CURRENT_LIST_DIR}/loom_info/main.cc ${CMAKE_CURRENT_LIST_DIR}/loom_info/flight.cc
                         ${CMAKE_CURRENT_LIST_DIR}/loom_info/plans.cc)
target_link_libraries(loom-info PRIVATE loom_core loom_common loom_kernels loom_topology)
set_property(GLOBAL APPEND PROPERTY LOOM_TOOL_TARGETS loom-info)

# loom-topo: the detected (or loaded) topology, its rings and trees, XML
# dumps and graphviz pictures.
add_executable(loom-topo ${CMAKE_CURRENT_LIST_DIR}/loom_topo/main.cc)
target_link_libraries(loom-topo PRIVATE loom_common loom_topology)
set_property(GLOBAL APPEND PROPERTY LOOM_TOOL_TARGETS loom-topo)
