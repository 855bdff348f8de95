# Cross-compiling for aarch64 Linux with Debian's cross toolchain (g++-aarch64-linux-gnu) and
# the multiarch arm64 -dev packages (scripts/install-deps.sh aarch64). The binaries run here
# under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR), so ctest runs the suite as on x86.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Libraries from /usr/lib/aarch64-linux-gnu only; headers are shared across architectures.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
# The runtime libraries are the multiarch arm64 ones under / (libc6:arm64, libgomp1:arm64):
# with the cross toolchain's own glibc (-L /usr/aarch64-linux-gnu), qemu 7.2 hangs in the
# first pthread_create.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static -L /)
