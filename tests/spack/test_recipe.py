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
    assert module.Kvmap.__name__ == "Kvmap"
    versions = {a[0]: kw for a, kw in names(d, "version")}
    assert versions["main"] == {"branch": "main"}
    assert "0.1.0" in versions
    variants = {a[0]: kw for a, kw in names(d, "variant")}
    assert set(variants) == {"python", "perf", "shared"}
    deps = {a[0]: kw for a, kw in names(d, "depends_on")}
    assert deps["cxx"]["type"] == "build"
    assert deps["cmake@3.20:"]["type"] == "build"
    assert "kokkos@3.4:" in deps and "kokkos-kernels" in deps and "py-torch" in deps and "mpi" in deps
    assert deps["doctest"]["type"] == "test"
    assert deps["py-pybind11"]["when"] == "+python"
    assert deps["python@3.8:"]["when"] == "+python"
    assert names(d, "extends") == [(("python",), {"when": "+python"})]
    req = {(a[0], kw.get("when")) for a, kw in names(d, "requires")}
    assert ("^py-torch+cuda", "^kokkos+cuda") in req
    assert ("^py-torch+rocm", "^kokkos+rocm") in req
    # The backend is not a variant of kvmap's own.
    assert not any(v in variants for v in ("cuda", "rocm", "hip"))


class Spec:
    def __init__(self, variants, mpi="openmpi"):
        self.variants = variants
        self.mpi = mpi
        self.deps = {
            "cmake": types.SimpleNamespace(prefix=stub.Prefix("/opt/cmake")),
            "mpi": types.SimpleNamespace(prefix=stub.Prefix("/opt/" + mpi)),
            "kokkos": types.SimpleNamespace(prefix="/opt/kokkos"),
            "kokkos-kernels": types.SimpleNamespace(prefix="/opt/kokkos-kernels"),
            "py-torch": types.SimpleNamespace(package=types.SimpleNamespace(
                cmake_prefix_paths=["/opt/python/lib/python3.11/site-packages/torch/share/cmake"])),
            "python": types.SimpleNamespace(
                command=types.SimpleNamespace(path="/opt/python/bin/python3"), prefix="/opt/python",
                package=types.SimpleNamespace(platlib="lib/python3.11/site-packages")),
        }

    def __getitem__(self, name):
        return self.deps[name]

    def satisfies(self, constraint):
        if constraint.startswith("^"):
            return constraint[1:] == self.mpi
        return constraint.startswith("+") and bool(self.variants.get(constraint[1:]))


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
CMAKE_OWN = {"Kokkos_ROOT", "KokkosKernels_ROOT", "Torch_DIR", "Python_EXECUTABLE", "CMAKE_PREFIX_PATH"}


@pytest.mark.parametrize("python", [True, False])
def test_cmake_args_use_defines_of_existing_options(recipe, python):
    module, _ = recipe
    pkg = module.Kvmap(Spec({"python": python, "perf": True, "shared": False}))
    args = pkg.cmake_args()
    assert len(args) == len(pkg.defined), "every argument must come from define/define_from_variant"
    assert all(a.startswith("-D") for a in args)
    known = project_cmake_variables()
    for name, _, _ in pkg.defined:
        assert name in known or name in CMAKE_OWN, "%s is not a CMake option of the project" % name
    defined = {n: v for n, v, _ in pkg.defined}
    assert defined["KVMAP_PYTHON"] is python
    assert defined["BUILD_SHARED_LIBS"] is False
    assert defined["Torch_DIR"].endswith("torch/share/cmake/Torch")
    assert ("KVMAP_PYTHON_INSTALL_DIR" in defined) == python
    if python:
        assert defined["KVMAP_PYTHON_INSTALL_DIR"] == "lib/python3.11/site-packages"
    variant_names = {n for n, _, how in pkg.defined if how == "define_from_variant"}
    assert variant_names == {"KVMAP_PYTHON", "KVMAP_ENABLE_PERF", "BUILD_SHARED_LIBS"}


@pytest.mark.parametrize("mpi", ["openmpi", "mpich"])
def test_smoke_test_builds_the_installed_example(recipe, mpi):
    module, _ = recipe
    assert "particles" in module.Kvmap.test_particles.__doc__
    pkg = module.Kvmap(Spec({"python": True, "perf": True, "shared": True}, mpi=mpi), prefix="/opt/kvmap")
    stub.CALLS.clear()
    stub.OUTPUT["text"] = "particles: 2007 on 2 ranks\ntotal energy = 2834.482087289438\nbytes copied = 0\n"
    pkg.test_particles()
    example = "/opt/kvmap/share/kvmap/examples/particles"
    (cmake, configure), (cmake2, build), (mpiexec, run) = stub.CALLS
    assert cmake == cmake2 == "/opt/cmake/bin/cmake"
    assert configure[0] == example and "-DCMAKE_PREFIX_PATH:STRING=/opt/kvmap" in configure
    assert build == ("--build", ".")
    assert mpiexec == "/opt/%s/bin/mpiexec" % mpi
    # Open MPI refuses more ranks than cores unless told; other MPIs do not know the flag.
    expected = ["-np", "2"] + (["--oversubscribe"] if mpi == "openmpi" else []) + ["./particles"]
    assert list(run) == expected
    # A run that copied bytes, or printed no result, fails the smoke test.
    for bad in ("total energy = 1.0\nbytes copied = 96\n", "bytes copied = 0\n"):
        stub.OUTPUT["text"] = bad
        with pytest.raises(AssertionError):
            pkg.test_particles()
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        assert "examples/particles DESTINATION ${CMAKE_INSTALL_DATADIR}/kvmap/examples" in f.read()
