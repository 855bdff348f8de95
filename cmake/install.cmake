# Installs the library, headers and a package config, so another CMake project can
# find_package(attn) and link attn::attn. All of it is the "library" component, so
# `cmake --install build --component library` works without the command-line tool built.
include(CMakePackageConfigHelpers)

install(TARGETS attn EXPORT attnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT library
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT library
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/attn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT library
        FILES_MATCHING PATTERN "*.hpp")
install(FILES ${PROJECT_BINARY_DIR}/include/attn/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attn COMPONENT library)
install(EXPORT attnTargets NAMESPACE attn:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attn
        COMPONENT library)

configure_package_config_file(cmake/attnConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/attnConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attn)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/attnConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/attnConfig.cmake ${PROJECT_BINARY_DIR}/attnConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attn COMPONENT library)
