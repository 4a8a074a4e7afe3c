# `cmake --install`: headers, libballast, the `ballast` executable, plugins,
# scripts, the CMake package (find_package(Ballast) -> Ballast::abi,
# Ballast::core) and a pkg-config file (ballast.pc).
include(CMakePackageConfigHelpers)

install(DIRECTORY abi/ballast DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(TARGETS ballast_abi ballast_core EXPORT BallastTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT BallastTargets NAMESPACE Ballast:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ballast)

configure_package_config_file(cmake/BallastConfig.cmake.in
  "${PROJECT_BINARY_DIR}/BallastConfig.cmake"
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ballast
  PATH_VARS BALLAST_PLUGIN_INSTALL_DIR)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/BallastConfigVersion.cmake"
  COMPATIBILITY SameMajorVersion)
install(FILES "${PROJECT_BINARY_DIR}/BallastConfig.cmake" "${PROJECT_BINARY_DIR}/BallastConfigVersion.cmake"
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ballast)

configure_file(cmake/ballast.pc.in "${PROJECT_BINARY_DIR}/ballast.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/ballast.pc" DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
