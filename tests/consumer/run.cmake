# The consumer test, run with cmake -P: install attn from its build tree into a fresh
# prefix, configure and build tests/consumer against that prefix alone, then run it.
# Inputs (-D): ATTN_BUILD_DIR, CONSUMER_SOURCE_DIR, WORK_DIR, GENERATOR, CXX_COMPILER,
# BUILD_TYPE, CXX_FLAGS (extra flags, e.g. the sanitizers the library was built with).
set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${prefix} ${build})

execute_process(COMMAND ${CMAKE_COMMAND} --install ${ATTN_BUILD_DIR} --prefix ${prefix}
                        --component library
                OUTPUT_QUIET COMMAND_ERROR_IS_FATAL ANY)
execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${build} -G ${GENERATOR}
                        -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
                        "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" -DCMAKE_PREFIX_PATH=${prefix}
                        -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
                OUTPUT_QUIET COMMAND_ERROR_IS_FATAL ANY)
execute_process(COMMAND ${CMAKE_COMMAND} --build ${build}
                OUTPUT_QUIET COMMAND_ERROR_IS_FATAL ANY)
execute_process(COMMAND ${build}/attn_consumer COMMAND_ERROR_IS_FATAL ANY)
