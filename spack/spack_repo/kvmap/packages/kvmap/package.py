# kvmap's spack recipe (spack 1.x package repository layout).
#   spack repo add <kvmap checkout>/spack/spack_repo/kvmap
#   spack install kvmap            # or kvmap ^kokkos+cuda ^py-torch+cuda, ...
import os

from spack_repo.builtin.build_systems.cmake import CMakePackage

from spack.package import *


class Kvmap(CMakePackage):
    """Per-sample torch functions vectorized (functorch vmap) over Kokkos arrays sharded
    across MPI ranks: distributed views, zero-copy tensors, chunked by Kokkos policies."""

    homepage = "https://github.com/kvmap/kvmap"
    git = "https://github.com/kvmap/kvmap.git"

    version("main", branch="main")
    version("0.1.0", tag="v0.1.0")

    variant("python", default=True, description="Build the Python bindings (import kvmap)")
    variant("perf", default=True, description="Build and install the perf harness kvmap-perf")
    variant("shared", default=True, description="Build libkvmap as a shared library")

    depends_on("cxx", type="build")
    depends_on("cmake@3.20:", type="build")

    depends_on("kokkos@3.4:")
    # Kokkos Kernels on that same Kokkos (one Kokkos per DAG), of the matching major version.
    depends_on("kokkos-kernels")
    requires("^kokkos-kernels@4:", when="^kokkos@4:", msg="Kokkos 4 needs Kokkos Kernels 4")
    requires("^kokkos-kernels@:3", when="^kokkos@:3", msg="Kokkos 3 needs Kokkos Kernels 3")
    # LibTorch comes from PyTorch (its CMake package lives under torch/share/cmake).
    depends_on("py-torch")
    depends_on("mpi")
    depends_on("doctest", type="test")

    # The device backend is not a variant of its own: it follows the Kokkos kvmap links.
    requires("^py-torch+cuda", when="^kokkos+cuda", msg="a CUDA Kokkos needs a CUDA PyTorch")
    requires("^py-torch+rocm", when="^kokkos+rocm", msg="a ROCm Kokkos needs a ROCm PyTorch")
    conflicts("^kokkos+sycl", msg="kvmap maps no SYCL memory space to a torch device")

    extends("python", when="+python")
    depends_on("python@3.8:", when="+python", type=("build", "link", "run"))
    depends_on("py-pybind11", when="+python", type=("build", "link"))
    depends_on("py-mpi4py", when="+python", type=("build", "run"))

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
        if spec.satisfies("+python"):
            args.append(self.define("Python_EXECUTABLE", spec["python"].command.path))
            args.append(self.define("KVMAP_PYTHON_INSTALL_DIR", self._python_install_dir()))
        return args

    def _python_install_dir(self):
        # site-packages relative to the prefix, as python lays it out (lib/pythonX.Y/site-packages).
        platlib = str(self.spec["python"].package.platlib)
        python_prefix = str(self.spec["python"].prefix)
        if os.path.isabs(platlib) and platlib.startswith(python_prefix):
            platlib = os.path.relpath(platlib, python_prefix)
        return platlib

    def test_particles(self):
        """build the installed particles example against this kvmap and run it on 2 ranks"""
        example = join_path(self.prefix.share.kvmap.examples, "particles")
        cmake = which(self.spec["cmake"].prefix.bin.cmake)
        mpiexec = which(join_path(self.spec["mpi"].prefix.bin, "mpiexec"))
        with working_dir("particles-build", create=True):
            cmake(example, self.define("CMAKE_PREFIX_PATH", self.prefix))
            cmake("--build", ".")
            # Open MPI refuses more ranks than a small test node has cores unless told.
            flags = ["--oversubscribe"] if self.spec.satisfies("^openmpi") else []
            out = mpiexec("-np", "2", *flags, "./particles", output=str.split, error=str.split)
            assert "bytes copied = 0" in out, out
            assert "total energy = " in out, out
