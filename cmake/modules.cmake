# One CMake library per top-level folder. Sources are globbed so that adding a file needs no
# edit here; dependencies are declared explicitly and only flow one way:
#   server -> scheduler -> {model, storage, spec}; spec -> model; config <- everyone.
# EXCLUDE names subfolders whose sources form a library of their own (model/cuda).
function(moestream_module name)
  cmake_parse_arguments(ARG "" "" "DEPS;SYSTEM_DEPS;EXCLUDE" ${ARGN})
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS
       "${CMAKE_CURRENT_SOURCE_DIR}/*.cpp")
  foreach(dir ${ARG_EXCLUDE})
    list(FILTER srcs EXCLUDE REGEX "^${CMAKE_CURRENT_SOURCE_DIR}/${dir}/")
  endforeach()
  if(srcs)
    add_library(${name} STATIC ${srcs})
    target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
    target_link_libraries(${name} PUBLIC ${ARG_DEPS} ${ARG_SYSTEM_DEPS})
    target_compile_options(${name} PRIVATE ${MOESTREAM_WARNINGS})
  else()
    # A module with no sources yet is an interface target so dependants link uniformly.
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR})
    target_link_libraries(${name} INTERFACE ${ARG_DEPS} ${ARG_SYSTEM_DEPS})
  endif()
  add_library(moestream::${name} ALIAS ${name})
endfunction()

# One Boost.Test executable per module, built from tests/<module>/*.cpp and registered in ctest.
# Exit code 77 means "skipped" (no GPU, no io_uring, fixtures absent).
function(moestream_test_suite module)
  # SPLIT NAME SUITE...: those suites run as a ctest test of their own (NAME), the rest as
  # `module`, so that ctest -j runs a long suite beside the others.
  cmake_parse_arguments(ARG "" "" "DEPS;LABELS;SPLIT" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/${module}/*.cpp")
  list(LENGTH srcs n_srcs)
  if(n_srcs LESS 2)  # main.cpp alone holds no test
    return()
  endif()
  set(exe test_${module})
  add_executable(${exe} ${srcs})
  target_link_libraries(${exe} PRIVATE ${ARG_DEPS} Boost::unit_test_framework)
  target_compile_definitions(${exe} PRIVATE BOOST_TEST_DYN_LINK
      MOESTREAM_SHARED_DIR="${MOESTREAM_SHARED_DIR}"
      MOESTREAM_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
      MOESTREAM_BINARY_DIR="${PROJECT_BINARY_DIR}")
  target_compile_options(${exe} PRIVATE ${MOESTREAM_WARNINGS})
  if(ARG_SPLIT)
    list(POP_FRONT ARG_SPLIT split_name)
    list(JOIN ARG_SPLIT "," split_suites)
    add_test(NAME ${module} COMMAND ${exe} --log_level=message --report_level=short "--run_test=!${split_suites}")
    add_test(NAME ${split_name} COMMAND ${exe} --log_level=message --report_level=short "--run_test=${split_suites}")
    set_tests_properties(${split_name} PROPERTIES SKIP_RETURN_CODE 77 LABELS "${ARG_LABELS}")
  else()
    add_test(NAME ${module} COMMAND ${exe} --log_level=message --report_level=short)
  endif()
  set_tests_properties(${module} PROPERTIES SKIP_RETURN_CODE 77 LABELS "${ARG_LABELS}")
endfunction()
