# kvmap's spack recipe (spack 1.x package repository layout).
#   spack repo add <kvmap checkout>/spack/spack_repo/kvmap
#   spack install kvmap                        # CPU
#   spack install kvmap+cuda cuda_arch=90      # a CUDA Kokkos and a CUDA PyTorch for sm_90
import os

from spack_repo.builtin.build_systems.cmake import CMakePackage
from spack_repo.builtin.build_systems.cuda import CudaPackage
from spack_repo.builtin.build_systems.rocm import ROCmPackage

from spack.package import *


class Kvmap(CMakePackage, CudaPackage, ROCmPackage):
    """Per-sample torch functions vectorized (functorch vmap) over Kokkos arrays sharded
    across MPI ranks: distributed views, zero-copy tensors, chunked by Kokkos policies."""

    homepage = "https://github.com/kvmap/kvmap"
    git = "https://github.com/kvmap/kvmap.git"

    maintainers("kvmap")
    license("BSD-3-Clause", checked_by="kvmap")

    # Each release is pinned to a commit, and cmake_args passes a release only the options its
    # own CMake declares (tests/spack/test_recipe.py reads every listed commit's CMake files).
    version("main", branch="main")
    version("0.2.0", commit="17c0b796950fdda75aaf1c903d5bf79c4662ad74")
    # 0.1.0 knows no run-time GPU-aware query (KVMAP_ENABLE_GPU_AWARE_MPI was on/off) and no
    # KVMAP_ENABLE_CCACHE; superseded by 0.2.0.
    version("0.1.0", commit="e3c0213fd54bd5e12fef87db78e8580cd300de3e", deprecated=True)

    variant("python", default=True, description="Build the Python bindings (import kvmap)")
    variant("perf", default=True, description="Build and install the perf harness kvmap-perf")
    variant("shared", default=True, description="Build libkvmap as a shared library")
    # auto: kvmap asks the MPI library at run time (Open MPI's MPIX_Query_cuda_support or
    # MPIX_Query_rocm_support, MPICH's MPIX_GPU_query_support); on: MPI is given device
    # pointers; off: device data is staged through host buffers. KVMAP_GPU_AWARE_MPI=0|1 in the
    # environment overrides all three at run time. Declared for every build, so that a spec
    # naming it never makes the concretizer switch a GPU backend on to give the variant a
    # meaning; `on` without +cuda or +rocm is a conflict instead.
    variant("gpu_aware_mpi", default="auto", values=("auto", "on", "off"), multi=False,
            description="Whether MPI reads device memory (a GPU-aware MPI; GPU builds)")

    depends_on("cxx", type="build")
    depends_on("cmake@3.20:", type="build")

    depends_on("kokkos@3.4:")
    # Kokkos Kernels on that same Kokkos (one Kokkos per DAG), of the matching major version.
    depends_on("kokkos-kernels")
    requires("^kokkos-kernels@4:", when="^kokkos@4:", msg="Kokkos 4 needs Kokkos Kernels 4")
    requires("^kokkos-kernels@:3", when="^kokkos@:3", msg="Kokkos 3 needs Kokkos Kernels 3")
    # LibTorch comes from PyTorch (its CMake package lives under torch/share/cmake);
    # ATen/functorch, which kvmap drives, exists from PyTorch 1.13.
    depends_on("py-torch@1.13:")
    # torch 2.x's ATen/functorch headers include nlohmann/json.hpp, which PyTorch does not
    # install; kvmap's CMake is told where it is (KVMAP_NLOHMANN_JSON_INCLUDE_DIR).
    depends_on("nlohmann-json@3.11:", type="build", when="@0.2: ^py-torch@2:")
    depends_on("mpi")
    depends_on("doctest", type="test")

    # GPU backends: Kokkos and PyTorch built for the same GPU. A DistView's device memory
    # becomes a torch tensor on that device, and code that includes Kokkos' headers is
    # compiled by Kokkos' compiler (nvcc_wrapper under GCC, hipcc for ROCm).
    # The architecture is the user's to name (kvmap+cuda cuda_arch=90): spack's cuda_arch and
    # amdgpu_target are sticky, so the concretizer cannot pick one, and no rule of this recipe
    # derives kvmap's from a dependency's (which would let the solver choose Kokkos' and
    # impose it here), so these conflicts fire.
    conflicts("+cuda", when="cuda_arch=none", msg="kvmap+cuda needs cuda_arch=<your GPU's>")
    conflicts("+rocm", when="amdgpu_target=none", msg="kvmap+rocm needs amdgpu_target=<gfx...>")
    conflicts("+cuda", when="+rocm", msg="one GPU backend at a time")
    conflicts("gpu_aware_mpi=on", when="~cuda ~rocm",
              msg="gpu_aware_mpi=on gives MPI device memory: it needs +cuda or +rocm")
    for gpu in ("+cuda", "+rocm"):
        conflicts("gpu_aware_mpi=auto", when=f"@:0.1 {gpu}",
                  msg="kvmap 0.1.0 cannot ask the MPI library at run time: choose gpu_aware_mpi=on or off")
    for arch in CudaPackage.cuda_arch_values:
        depends_on(f"kokkos+cuda+cuda_lambda cuda_arch={arch}", when=f"+cuda cuda_arch={arch}")
        depends_on(f"py-torch+cuda cuda_arch={arch}", when=f"+cuda cuda_arch={arch}")
    for target in ROCmPackage.amdgpu_targets:
        depends_on(f"kokkos+rocm amdgpu_target={target}", when=f"+rocm amdgpu_target={target}")
        depends_on(f"py-torch+rocm amdgpu_target={target}", when=f"+rocm amdgpu_target={target}")
    # gpu_aware_mpi=on: an MPI that reads device memory, built for the same GPU.
    for arch in CudaPackage.cuda_arch_values:
        for mpi in ("mpich", "openmpi"):
            depends_on(f"{mpi}+cuda cuda_arch={arch}",
                       when=f"+cuda cuda_arch={arch} gpu_aware_mpi=on ^[virtuals=mpi] {mpi}")
    for target in ROCmPackage.amdgpu_targets:
        for mpi in ("mpich", "openmpi"):
            depends_on(f"{mpi}+rocm amdgpu_target={target}",
                       when=f"+rocm amdgpu_target={target} gpu_aware_mpi=on ^[virtuals=mpi] {mpi}")
    # CUDA is compiled by nvcc, through Kokkos' nvcc_wrapper, whatever compiler builds Kokkos
    # (GCC or clang as nvcc's host compiler; the cuda package's conflicts keep that pair
    # supported), and kvmap through the same wrapper. Kokkos' recipe refuses +cuda ~wrapper under
    # GCC, and a Kokkos built by clang without the wrapper would compile CUDA with clang itself,
    # which supports only CUDA releases older than that clang (clang 15: up to CUDA 11.5, while
    # spack picks CUDA 12). A rule keyed on Kokkos' compiler (^kokkos%gcc) is not enough: a
    # condition on a dependency's compiler did not fire in spack 1.1's solver.
    depends_on("kokkos+wrapper", when="+cuda")
    # Kokkos Kernels keeps its default execution and memory spaces (no CUDA/HIP explicit
    # instantiations): kvmap instantiates the few BLAS-1 kernels it calls (dot, nrm2, axpby on
    # device views) from the headers in its own translation units, as its CI's CUDA and HIP
    # builds do; asking for device instantiations would add a long Kokkos Kernels build for
    # nothing kvmap calls.
    depends_on("kokkos~cuda", when="~cuda")
    depends_on("kokkos~rocm", when="~rocm")
    depends_on("hip", when="+rocm")
    conflicts("^kokkos+sycl", msg="kvmap maps no SYCL memory space to a torch device")

    extends("python", when="+python")
    depends_on("python@3.8:", when="+python", type=("build", "link", "run"))
    depends_on("py-pybind11", when="+python", type=("build", "link"))
    depends_on("py-mpi4py", when="+python", type=("build", "run"))
    # `import kvmap` imports torch.
    depends_on("py-torch", when="+python", type=("build", "link", "run"))

    # The smoke test compiles the installed example.
    test_requires_compiler = True

    def _kokkos_compiler(self):
        """Kokkos' compiler for code that includes Kokkos headers, or None for the default."""
        if self.spec.satisfies("+rocm"):
            return self.spec["hip"].hipcc
        # nvcc_wrapper comes from spack's kokkos-nvcc-wrapper; an external Kokkos has none.
        kokkos = self.spec["kokkos"]
        if self.spec.satisfies("+cuda") and kokkos.satisfies("+wrapper") and not kokkos.external:
            return self["kokkos"].kokkos_cxx
        return None

    def cmake_args(self):
        spec = self.spec
        torch_cmake = spec["py-torch"].package.cmake_prefix_paths[0]
        args = [
            self.define_from_variant("KVMAP_PYTHON", "python"),
            self.define_from_variant("KVMAP_ENABLE_PERF", "perf"),
            self.define_from_variant("BUILD_SHARED_LIBS", "shared"),
            self.define("KVMAP_ENABLE_TESTS", self.run_tests),
            self.define("KVMAP_ENABLE_EXAMPLES", False),
            self.define("Kokkos_ROOT", spec["kokkos"].prefix),
            self.define("KokkosKernels_ROOT", spec["kokkos-kernels"].prefix),
            self.define("Torch_DIR", join_path(torch_cmake, "Torch")),
        ]
        if spec.satisfies("@0.2:"):
            # spack's compiler wrappers are the launcher; no ccache around them.
            args.append(self.define("KVMAP_ENABLE_CCACHE", False))
        if spec.satisfies("@0.2: ^py-torch@2:"):
            args.append(self.define("KVMAP_NLOHMANN_JSON_INCLUDE_DIR", spec["nlohmann-json"].prefix.include))
        if spec.satisfies("+cuda") or spec.satisfies("+rocm"):
            if spec.satisfies("@0.2:"):
                args.append(self.define_from_variant("KVMAP_ENABLE_GPU_AWARE_MPI", "gpu_aware_mpi"))
            else:
                # 0.1.0: an on/off option (auto is a conflict above).
                args.append(self.define("KVMAP_ENABLE_GPU_AWARE_MPI", spec.satisfies("gpu_aware_mpi=on")))
        compiler = self._kokkos_compiler()
        if compiler:
            args.append(self.define("CMAKE_CXX_COMPILER", compiler))
        if spec.satisfies("+python"):
            args.append(self.define("Python_EXECUTABLE", spec["python"].command.path))
            # spack's convention for extensions: lib/pythonX.Y/site-packages of this prefix.
            args.append(self.define("KVMAP_PYTHON_INSTALL_DIR", os.path.relpath(python_platlib, self.prefix)))
        return args

    def test_particles(self):
        """build the installed particles example against this kvmap and run it on 2 ranks"""
        example = join_path(self.prefix.share.kvmap.examples, "particles")
        cmake = which(self.spec["cmake"].prefix.bin.cmake)
        mpiexec = which(join_path(self.spec["mpi"].prefix.bin, "mpiexec"))
        compiler = self._kokkos_compiler() or self.spec["cxx"].package.cxx
        with working_dir("particles-build", create=True):
            cmake(example, self.define("CMAKE_PREFIX_PATH", self.prefix),
                  self.define("CMAKE_CXX_COMPILER", compiler))
            cmake("--build", ".")
            flags = []
            if self.spec.satisfies("^openmpi"):
                # More ranks than a small test node has cores; and Open MPI refuses root (spack's
                # test environment keeps none of the OMPI_ALLOW_RUN_AS_ROOT variables).
                flags.append("--oversubscribe")
                if os.geteuid() == 0:
                    flags.append("--allow-run-as-root")
            out = mpiexec("-np", "2", *flags, "./particles", output=str.split, error=str.split)
            assert "bytes copied = 0" in out, out
            assert "total energy = " in out, out
