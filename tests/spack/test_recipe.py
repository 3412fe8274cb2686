"""kvmap's spack recipe: valid Python, imports against a stub of spack's API, declares what
the project needs, and passes only CMake options the project really has."""
import glob
import importlib.util
import os
import re
import subprocess
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
    # A release is pinned to a commit (no tag lookups at concretization); the newest is not
    # deprecated, so that `spack install kvmap` takes it.
    releases = sorted((v for v in versions if v != "main"), key=lambda v: tuple(map(int, v.split("."))))
    for v in releases:
        assert re.fullmatch(r"[0-9a-f]{40}", versions[v]["commit"]), v
        assert set(versions[v]) <= {"commit", "deprecated"}
    assert not versions[releases[-1]].get("deprecated")
    assert versions["0.1.0"].get("deprecated") is True
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
    assert deps["nlohmann-json@3.11:"] == [{"type": "build", "when": "@0.2: ^py-torch@2:"}]
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
    # nvcc_wrapper for every CUDA Kokkos, whatever its compiler (the rule was keyed on kvmap's
    # compiler: a GCC Kokkos under a clang kvmap concretized to kokkos+cuda~wrapper, which
    # Kokkos refuses; clang's own CUDA support lags the CUDA spack picks).
    assert deps["kokkos+wrapper"] == [{"when": "+cuda"}]
    assert deps["kokkos~cuda"] == [{"when": "~cuda"}] and deps["kokkos~rocm"] == [{"when": "~rocm"}]
    conflicts = {(a[0], kw.get("when")) for a, kw in names(d, "conflicts")}
    assert ("+cuda", "cuda_arch=none") in conflicts
    assert ("+rocm", "amdgpu_target=none") in conflicts
    assert ("+cuda", "+rocm") in conflicts
    assert ("gpu_aware_mpi=on", "~cuda ~rocm") in conflicts
    # 0.1.0 has no run-time query: auto is refused there, for either GPU backend.
    assert ("gpu_aware_mpi=auto", "@:0.1 +cuda") in conflicts and ("gpu_aware_mpi=auto", "@:0.1 +rocm") in conflicts
    # gpu_aware_mpi=on takes an MPI built to read device memory, for the same GPU.
    for mpi in ("mpich", "openmpi"):
        for arch in CudaPackage.cuda_arch_values:
            assert deps["%s+cuda cuda_arch=%s" % (mpi, arch)] == [
                {"when": "+cuda cuda_arch=%s gpu_aware_mpi=on ^[virtuals=mpi] %s" % (arch, mpi)}]
        for target in ROCmPackage.amdgpu_targets:
            assert deps["%s+rocm amdgpu_target=%s" % (mpi, target)] == [
                {"when": "+rocm amdgpu_target=%s gpu_aware_mpi=on ^[virtuals=mpi] %s" % (target, mpi)}]
    # Kokkos Kernels keeps its default spaces: kvmap instantiates its BLAS-1 calls itself.
    assert not any("execspace" in dep or "memspace" in dep for dep in deps)
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


def version_key(v):
    """spack's order for kvmap's versions: numbered releases, then main above all."""
    return (1,) if v == "main" else (0,) + tuple(int(x) for x in v.split("."))


def version_in(v, lo, hi):
    """v in spack's range lo:hi (either end open; hi=0.1 includes 0.1.x)."""
    key = version_key(v)
    if lo and key < version_key(lo):
        return False
    if hi:
        h = version_key(hi)
        return key <= h or key[:len(h)] == h
    return True


class Spec:
    def __init__(self, variants, mpi="openmpi", kokkos_variants=(), kokkos_external=False, version="main",
                 torch_version="2.14.0"):
        self.variants = variants
        self.version = version
        self.torch_version = torch_version
        self.mpi = mpi
        self.deps = {
            "cmake": Dep("/opt/cmake"),
            "mpi": Dep("/opt/" + mpi),
            "cxx": Dep("/usr", cxx="/usr/bin/g++-12"),
            "hip": Dep("/opt/rocm", hipcc="/opt/rocm/bin/hipcc"),
            "kokkos": Dep("/opt/kokkos", kokkos_variants, kokkos_external,
                          kokkos_cxx="/opt/kokkos-nvcc-wrapper/bin/nvcc_wrapper"),
            "kokkos-kernels": Dep("/opt/kokkos-kernels"),
            "nlohmann-json": Dep("/opt/nlohmann-json"),
            "py-torch": Dep(cmake_prefix_paths=["/opt/python/lib/python3.11/site-packages/torch/share/cmake"]),
            "python": Dep("/opt/python", command=types.SimpleNamespace(path="/opt/python/bin/python3")),
        }

    def __getitem__(self, name):
        return self.deps[name]

    def satisfies(self, constraint):
        if " " in constraint:
            return all(self.satisfies(c) for c in constraint.split())
        if constraint.startswith("^py-torch@"):
            lo, _, hi = constraint[len("^py-torch@"):].partition(":")
            return version_in(self.torch_version, lo, hi)
        if constraint.startswith("^"):
            return constraint[1:] == self.mpi
        if constraint.startswith("@"):
            lo, _, hi = constraint[1:].partition(":")
            return version_in(self.version, lo, hi)
        if "=" in constraint:
            name, _, value = constraint.partition("=")
            return self.variants.get(name) == value
        return constraint.startswith("+") and bool(self.variants.get(constraint[1:]))


def make(module, variants, **kw):
    prefix = kw.pop("prefix", "/opt/kvmap")
    pkg = module.Kvmap(Spec(variants, **kw), prefix=prefix)
    # spack sets python_platlib in an extension's module: lib/pythonX.Y/site-packages of its prefix.
    module.python_platlib = os.path.join(prefix, "lib", "python3.11", "site-packages")
    return pkg


def cmake_declarations(text):
    """The option() and cache variables one CMake file declares."""
    return set(re.findall(r"option\(\s*([A-Za-z_0-9]+)", text)) | \
        set(re.findall(r"set\(\s*([A-Za-z_0-9]+)\s+[^)]*\bCACHE\b", text))


def project_cmake_variables():
    """Every option() and cache variable the project's CMake (the working tree) declares."""
    found = set()
    files = [os.path.join(ROOT, "CMakeLists.txt")] + glob.glob(os.path.join(ROOT, "*", "**", "*.cmake"), recursive=True) \
        + glob.glob(os.path.join(ROOT, "*", "**", "CMakeLists.txt"), recursive=True)
    for path in files:
        if "/build/" in path:
            continue
        found |= cmake_declarations(open(path).read())
    return found


def git(*args):
    return subprocess.run(["git", "-C", ROOT] + list(args), capture_output=True, text=True)


def cmake_variables_at(commit):
    """Every option() and cache variable the project's CMake declares at a commit."""
    listing = git("ls-tree", "-r", "--name-only", commit)
    assert listing.returncode == 0, listing.stderr
    found = set()
    for path in listing.stdout.split():
        if path.endswith("CMakeLists.txt") or path.endswith(".cmake"):
            found |= cmake_declarations(git("show", "%s:%s" % (commit, path)).stdout)
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
    # torch 2.x's headers need nlohmann/json.hpp, which PyTorch does not install.
    assert defined["KVMAP_NLOHMANN_JSON_INCLUDE_DIR"] == "/opt/nlohmann-json/include"
    old_torch = make(module, {"python": python, "perf": True, "shared": False}, torch_version="1.13.1")
    old_torch.cmake_args()
    assert "KVMAP_NLOHMANN_JSON_INCLUDE_DIR" not in {n for n, _, _ in old_torch.defined}
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


def recipe_versions(directives):
    return {a[0]: kw for a, kw in names(directives, "version")}


# The specs whose cmake_args are checked at every version: CPU with and without Python, and
# each GPU backend with each gpu_aware_mpi value the version allows.
SPEC_VARIANTS = [
    {"python": True, "perf": True, "shared": True},
    {"python": False, "perf": False, "shared": False},
] + [{"python": False, "perf": True, "shared": True, gpu: True, "gpu_aware_mpi": mode}
     for gpu in ("cuda", "rocm") for mode in ("auto", "on", "off")]


def test_every_version_gets_only_options_its_cmake_declares(recipe):
    """Each version() builds what the recipe says: every CMake variable cmake_args passes to a
    version is declared by that version's own CMake (main: this checkout; a release: its
    commit), so a release can never again receive options it does not know (0.1.0 once got
    gpu_aware_mpi's "auto", which its on/off option read as ON)."""
    module, d = recipe
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone holds no release commits to read")
    conflicts = [(a[0], kw.get("when", "")) for a, kw in names(d, "conflicts")]
    checked = 0
    for version, kw in recipe_versions(d).items():
        if "commit" in kw:
            assert git("cat-file", "-e", kw["commit"] + "^{commit}").returncode == 0, \
                "kvmap@%s's commit %s is not in this repository's history" % (version, kw["commit"])
            known = cmake_variables_at(kw["commit"])
        else:
            known = project_cmake_variables()
        for variants in SPEC_VARIANTS:
            pkg = make(module, dict(variants), version=version)
            # A spec the recipe refuses (a conflict) is never built: skip it.
            if any(all(pkg.spec.satisfies(c) for c in (what + " " + when).split()) for what, when in conflicts):
                continue
            pkg.cmake_args()
            for name, value, _ in pkg.defined:
                assert name in known or name in CMAKE_OWN, \
                    "kvmap@%s: cmake_args passes %s, which its CMake does not declare" % (version, name)
            defined = {n: v for n, v, _ in pkg.defined}
            if "KVMAP_ENABLE_GPU_AWARE_MPI" in defined:
                at = kw.get("commit")
                cmake = git("show", "%s:CMakeLists.txt" % at).stdout if at else open(os.path.join(ROOT, "CMakeLists.txt")).read()
                value = defined["KVMAP_ENABLE_GPU_AWARE_MPI"]
                if re.search(r"option\(\s*KVMAP_ENABLE_GPU_AWARE_MPI", cmake):
                    assert isinstance(value, bool), "kvmap@%s: an on/off option gets %r" % (version, value)
                else:
                    assert str(value).upper() in ("AUTO", "ON", "OFF")
            checked += 1
    assert checked >= 2 * len(recipe_versions(d))
