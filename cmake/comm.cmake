# The communicators (issue 17, docs/communicator.md): their sources, the optional MPI backend (CPU
# tensors) and the NCCL backend (CUDA tensors), and their tests. Kept in this file of its own so that
# the rest of the build can change beside it; included at the end of CMakeLists.txt.
set(FP8AMP_MPI "AUTO" CACHE STRING "Build the MPI backend of the CPU communicator: AUTO (when MPI is found), ON or OFF")
set_property(CACHE FP8AMP_MPI PROPERTY STRINGS AUTO ON OFF)

# The sources are in CMakeLists.txt's FP8AMP_SOURCES (the fuzzers' library builds them too).

# ---- MPI -----------------------------------------------------------------------------------------
set(FP8AMP_HAVE_MPI OFF)
if(NOT FP8AMP_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C)
  if(MPI_C_FOUND)
    set(FP8AMP_HAVE_MPI ON)
  elseif(FP8AMP_MPI STREQUAL "ON")
    message(FATAL_ERROR "FP8AMP_MPI=ON but MPI was not found (install libopenmpi-dev)")
  endif()
endif()
if(FP8AMP_HAVE_MPI)
  # The C interface only (Open MPI's deprecated C++ bindings stay out).
  set_source_files_properties(kernels/cpu/mpi_transport.cpp PROPERTIES COMPILE_DEFINITIONS "FP8AMP_HAVE_MPI=1;OMPI_SKIP_MPICXX=1;MPICH_SKIP_MPICXX=1")
  target_link_libraries(fp8amp PRIVATE MPI::MPI_C)
endif()
message(STATUS "fp8amp: MPI communicator ${FP8AMP_HAVE_MPI}")

# ---- NCCL and the CUDA kernels --------------------------------------------------------------------
# FP8AMP_HAVE_NCCL and the imported target fp8amp::nccl come from CMakeLists.txt (option FP8AMP_NCCL).
if(FP8AMP_HAVE_CUDA AND FP8AMP_HAVE_NCCL)
  set_source_files_properties(kernels/cuda/nccl_transport.cpp PROPERTIES COMPILE_DEFINITIONS "FP8AMP_HAVE_NCCL=1")
  # dladdr/dlopen/dlsym: the optional NCCL registration functions are looked up at run time
  # (kernels/cuda/nccl_transport.cpp); libdl for glibc before 2.34.
  target_link_libraries(fp8amp PRIVATE fp8amp::nccl ${CMAKE_DL_LIBS})
endif()
message(STATUS "fp8amp: NCCL communicator ${FP8AMP_HAVE_NCCL}")

# ---- the data-parallel example (examples/CMakeLists.txt, added before this file) -----------------
if(TARGET fp8amp_data_parallel AND FP8AMP_HAVE_MPI)
  target_compile_definitions(fp8amp_data_parallel PRIVATE FP8AMP_EXAMPLE_HAVE_MPI=1 OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  target_link_libraries(fp8amp_data_parallel PRIVATE MPI::MPI_C)
endif()

# ---- multi-rank tests: under mpirun (with MPI), and through run_ranks.sh (always; tests/mpi) --------
if(FP8AMP_BUILD_TESTS)
  add_subdirectory(tests/mpi)
endif()
