"""kvmap's spack recipe: valid Python, imports against a stub of spack's API, declares what
the project needs, and passes only CMake options the project really has."""
import glob
import importlib.util
import os
import re
import sys
import types

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
RECIPE = os.path.join(ROOT, "spack", "spack_repo", "kvmap", "packages", "kvmap", "package.py")
sys.path.insert(0, os.path.join(HERE, "stub"))

import spack.package as stub  # noqa: E402


@pytest.fixture(scope="module")
def recipe():
    stub.DIRECTIVES.clear()
    spec = importlib.util.spec_from_file_location("kvmap_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, list(stub.DIRECTIVES)


def names(directives, kind):
    return [(args, kwargs) for k, args, kwargs in directives if k == kind]


def test_repo_layout_is_spack_1x():
    with open(os.path.join(ROOT, "spack", "spack_repo", "kvmap", "repo.yaml")) as f:
        text = f.read()
    assert re.search(r"namespace:\s*kvmap", text)
    assert re.search(r"api:\s*v2", text)
    compile(open(RECIPE).read(), RECIPE, "exec")


def test_versions_variants_dependencies(recipe):
    module, d = recipe
    cls = module.Kvmap
    assert cls.__name__ == "Kvmap"
    # spack's GPU mixins give kvmap the variants cuda/cuda_arch and rocm/amdgpu_target.
    bases = {b.__name__ for b in cls.__mro__}
    assert {"CMakePackage", "CudaPackage", "ROCmPackage"} <= bases
    assert cls.test_requires_compiler is True
    assert names(d, "license") and names(d, "license")[0][0][0] == "BSD-3-Clause"
    assert names(d, "maintainers")
    versions = {a[0]: kw for a, kw in names(d, "version")}
    assert versions["main"] == {"branch": "main"}
    # A release is pinned to a commit (no tag lookups at concretization).
    assert set(versions["0.1.0"]) == {"commit"} and re.fullmatch(r"[0-9a-f]{40}", versions["0.1.0"]["commit"])
    variants = {a[0] for a, kw in names(d, "variant")}
    assert variants == {"python", "perf", "shared", "gpu_aware_mpi"}
    # gpu_aware_mpi mirrors KVMAP_ENABLE_GPU_AWARE_MPI: AUTO (asked of the MPI at run time) by
    # default. Declared unconditionally: a variant that exists only under +cuda makes the
    # concretizer turn +cuda on when a spec names it (kvmap gpu_aware_mpi=on ^mpich did).
    gpu_aware = [kw for a, kw in names(d, "variant") if a[0] == "gpu_aware_mpi"]
    assert len(gpu_aware) == 1 and "when" not in gpu_aware[0]
    for kw in gpu_aware:
        assert kw["default"] == "auto" and set(kw["values"]) == {"auto", "on", "off"}
        assert kw["multi"] is False
    deps = {}
    for a, kw in names(d, "depends_on"):
        deps.setdefault(a[0], []).append(kw)
    assert deps["cxx"] == [{"type": "build"}]
    assert deps["cmake@3.20:"] == [{"type": "build"}]
    assert "kokkos@3.4:" in deps and "kokkos-kernels" in deps and "mpi" in deps
    assert deps["py-torch@1.13:"] == [{}], "ATen/functorch exists from PyTorch 1.13"
    assert deps["doctest"] == [{"type": "test"}]
    assert deps["py-pybind11"][0]["when"] == "+python"
    assert deps["python@3.8:"][0]["when"] == "+python"
    # import kvmap imports torch: a run dependency of +python.
    assert any(kw.get("when") == "+python" and "run" in kw.get("type", ()) for kw in deps["py-torch"])
    assert names(d, "extends") == [(("python",), {"when": "+python"})]
    req = {(a[0], kw.get("when")) for a, kw in names(d, "requires")}
    # Kokkos and PyTorch for the same GPU as kvmap, for every architecture spack knows.
    from spack_repo.builtin.build_systems.cuda import CudaPackage
    from spack_repo.builtin.build_systems.rocm import ROCmPackage
    for arch in CudaPackage.cuda_arch_values:
        when = "+cuda cuda_arch=%s" % arch
        assert deps["kokkos+cuda+cuda_lambda cuda_arch=%s" % arch] == [{"when": when}]
        assert deps["py-torch+cuda cuda_arch=%s" % arch] == [{"when": when}]
        # Never the other way round: a rule deriving kvmap's cuda_arch from Kokkos' let the
        # solver pick Kokkos' architecture and impose it, so `kvmap+cuda` without cuda_arch
        # concretized silently (to 70 or 72) instead of failing on the conflict below.
        assert not any(r.startswith("cuda_arch=") for r, _ in req)
    for target in ROCmPackage.amdgpu_targets:
        when = "+rocm amdgpu_target=%s" % target
        assert deps["kokkos+rocm amdgpu_target=%s" % target] == [{"when": when}]
        assert deps["py-torch+rocm amdgpu_target=%s" % target] == [{"when": when}]
        assert not any(r.startswith("amdgpu_target=") for r, _ in req)
    assert deps["kokkos+wrapper"] == [{"when": "+cuda %gcc"}], "a CUDA Kokkos under GCC compiles with nvcc_wrapper"
    assert deps["kokkos~cuda"] == [{"when": "~cuda"}] and deps["kokkos~rocm"] == [{"when": "~rocm"}]
    conflicts = {(a[0], kw.get("when")) for a, kw in names(d, "conflicts")}
    assert ("+cuda", "cuda_arch=none") in conflicts
    assert ("+rocm", "amdgpu_target=none") in conflicts
    assert ("+cuda", "+rocm") in conflicts
    assert ("gpu_aware_mpi=on", "~cuda ~rocm") in conflicts
    # gpu_aware_mpi=on takes an MPI built to read device memory.
    assert deps["mpich+cuda"] == [{"when": "+cuda gpu_aware_mpi=on ^[virtuals=mpi] mpich"}]
    assert deps["openmpi+cuda"] == [{"when": "+cuda gpu_aware_mpi=on ^[virtuals=mpi] openmpi"}]
    assert deps["mpich+rocm"] == [{"when": "+rocm gpu_aware_mpi=on ^[virtuals=mpi] mpich"}]
    assert ("^kokkos-kernels@4:", "^kokkos@4:") in req


class Dep:
    """A dependency node: spec-like (prefix, satisfies, external) with its package."""

    def __init__(self, prefix="", variants=(), external=False, **package):
        self.prefix = stub.Prefix(prefix)
        self.variants = set(variants)
        self.external = external
        self.package = types.SimpleNamespace(**package)
        for k, v in package.items():
            setattr(self, k, v)

    def satisfies(self, constraint):
        return all(v in self.variants for v in constraint.split())


class Spec:
    def __init__(self, variants, mpi="openmpi", kokkos_variants=(), kokkos_external=False):
        self.variants = variants
        self.mpi = mpi
        self.deps = {
            "cmake": Dep("/opt/cmake"),
            "mpi": Dep("/opt/" + mpi),
            "cxx": Dep("/usr", cxx="/usr/bin/g++-12"),
            "hip": Dep("/opt/rocm", hipcc="/opt/rocm/bin/hipcc"),
            "kokkos": Dep("/opt/kokkos", kokkos_variants, kokkos_external,
                          kokkos_cxx="/opt/kokkos-nvcc-wrapper/bin/nvcc_wrapper"),
            "kokkos-kernels": Dep("/opt/kokkos-kernels"),
            "py-torch": Dep(cmake_prefix_paths=["/opt/python/lib/python3.11/site-packages/torch/share/cmake"]),
            "python": Dep("/opt/python", command=types.SimpleNamespace(path="/opt/python/bin/python3")),
        }

    def __getitem__(self, name):
        return self.deps[name]

    def satisfies(self, constraint):
        if constraint.startswith("^"):
            return constraint[1:] == self.mpi
        return constraint.startswith("+") and bool(self.variants.get(constraint[1:]))


def make(module, variants, **kw):
    prefix = kw.pop("prefix", "/opt/kvmap")
    pkg = module.Kvmap(Spec(variants, **kw), prefix=prefix)
    # spack sets python_platlib in an extension's module: lib/pythonX.Y/site-packages of its prefix.
    module.python_platlib = os.path.join(prefix, "lib", "python3.11", "site-packages")
    return pkg


def project_cmake_variables():
    """Every option() and cache variable the project's CMake declares."""
    found = set()
    files = [os.path.join(ROOT, "CMakeLists.txt")] + glob.glob(os.path.join(ROOT, "*", "**", "*.cmake"), recursive=True) \
        + glob.glob(os.path.join(ROOT, "*", "**", "CMakeLists.txt"), recursive=True)
    for path in files:
        if "/build/" in path:
            continue
        text = open(path).read()
        found |= set(re.findall(r"option\(\s*([A-Za-z_0-9]+)", text))
        found |= set(re.findall(r"set\(\s*([A-Za-z_0-9]+)\s+[^)]*\bCACHE\b", text))
    return found


# Variables CMake or the find modules of kvmap's dependencies read (not kvmap's own options).
CMAKE_OWN = {"Kokkos_ROOT", "KokkosKernels_ROOT", "Torch_DIR", "Python_EXECUTABLE", "CMAKE_PREFIX_PATH",
             "CMAKE_CXX_COMPILER"}


@pytest.mark.parametrize("python", [True, False])
def test_cmake_args_use_defines_of_existing_options(recipe, python):
    module, _ = recipe
    pkg = make(module, {"python": python, "perf": True, "shared": False})
    args = pkg.cmake_args()
    assert len(args) == len(pkg.defined), "every argument must come from define/define_from_variant"
    assert all(a.startswith("-D") for a in args)
    known = project_cmake_variables()
    for name, _, _ in pkg.defined:
        assert name in known or name in CMAKE_OWN, "%s is not a CMake option of the project" % name
    defined = {n: v for n, v, _ in pkg.defined}
    assert defined["KVMAP_PYTHON"] is python
    assert defined["BUILD_SHARED_LIBS"] is False
    assert defined["KVMAP_ENABLE_CCACHE"] is False, "spack's compiler wrapper must not be wrapped by ccache"
    assert defined["Torch_DIR"].endswith("torch/share/cmake/Torch")
    assert ("KVMAP_PYTHON_INSTALL_DIR" in defined) == python
    if python:
        assert defined["KVMAP_PYTHON_INSTALL_DIR"] == "lib/python3.11/site-packages"
    # A CPU build keeps the compiler spack chose.
    assert "CMAKE_CXX_COMPILER" not in defined and "KVMAP_ENABLE_GPU_AWARE_MPI" not in defined
    variant_names = {n for n, _, how in pkg.defined if how == "define_from_variant"}
    assert variant_names == {"KVMAP_PYTHON", "KVMAP_ENABLE_PERF", "BUILD_SHARED_LIBS"}


@pytest.mark.parametrize("wrapper, external, expected", [
    (True, False, "/opt/kokkos-nvcc-wrapper/bin/nvcc_wrapper"),  # spack's Kokkos +wrapper
    (True, True, None),   # an external Kokkos has no kokkos-nvcc-wrapper node
    (False, False, None),  # a Kokkos built with clang (no wrapper)
])
def test_cuda_compiles_with_kokkos_compiler(recipe, wrapper, external, expected):
    module, _ = recipe
    pkg = make(module, {"python": False, "perf": True, "shared": True, "cuda": True, "gpu_aware_mpi": "on"},
               kokkos_variants=("+cuda", "+wrapper") if wrapper else ("+cuda",), kokkos_external=external)
    pkg.cmake_args()
    defined = {n: v for n, v, _ in pkg.defined}
    assert defined.get("CMAKE_CXX_COMPILER") == expected
    assert defined["KVMAP_ENABLE_GPU_AWARE_MPI"] == "on"
    assert "KVMAP_ENABLE_GPU_AWARE_MPI" in project_cmake_variables()


def test_rocm_compiles_with_hipcc(recipe):
    module, _ = recipe
    pkg = make(module, {"python": False, "perf": False, "shared": True, "rocm": True, "gpu_aware_mpi": "auto"},
               kokkos_variants=("+rocm",))
    pkg.cmake_args()
    defined = {n: v for n, v, _ in pkg.defined}
    assert defined["CMAKE_CXX_COMPILER"] == "/opt/rocm/bin/hipcc"
    assert defined["KVMAP_ENABLE_GPU_AWARE_MPI"] == "auto"


@pytest.mark.parametrize("mpi", ["openmpi", "mpich"])
@pytest.mark.parametrize("root", [False, True])
def test_smoke_test_builds_the_installed_example(recipe, mpi, root, monkeypatch):
    module, _ = recipe
    assert "particles" in module.Kvmap.test_particles.__doc__
    monkeypatch.setattr(os, "geteuid", lambda: 0 if root else 1000)
    pkg = make(module, {"python": True, "perf": True, "shared": True}, mpi=mpi, prefix="/opt/kvmap")
    stub.CALLS.clear()
    stub.OUTPUT["text"] = "particles: 2007 on 2 ranks\ntotal energy = 2834.482087289438\nbytes copied = 0\n"
    pkg.test_particles()
    example = "/opt/kvmap/share/kvmap/examples/particles"
    (cmake, configure), (cmake2, build), (mpiexec, run) = stub.CALLS
    assert cmake == cmake2 == "/opt/cmake/bin/cmake"
    assert configure[0] == example and "-DCMAKE_PREFIX_PATH:STRING=/opt/kvmap" in configure
    # The spec's compiler, not whatever c++ is first on the test environment's PATH.
    assert "-DCMAKE_CXX_COMPILER:STRING=/usr/bin/g++-12" in configure
    assert build == ("--build", ".")
    assert mpiexec == "/opt/%s/bin/mpiexec" % mpi
    # Open MPI refuses more ranks than cores, and root, unless told; other MPIs do not know the flags.
    flags = (["--oversubscribe"] + (["--allow-run-as-root"] if root else [])) if mpi == "openmpi" else []
    assert list(run) == ["-np", "2"] + flags + ["./particles"]
    # A run that copied bytes, or printed no result, fails the smoke test.
    for bad in ("total energy = 1.0\nbytes copied = 96\n", "bytes copied = 0\n"):
        stub.OUTPUT["text"] = bad
        with pytest.raises(AssertionError):
            pkg.test_particles()
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        assert "examples/particles DESTINATION ${CMAKE_INSTALL_DATADIR}/kvmap/examples" in f.read()
