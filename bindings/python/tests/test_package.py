"""The package as a user meets it: `import kvmap` is quiet, one LibTorch and one OpenMP runtime
in the process, and (when kvmap was installed by pip) the installed files are the ones in use."""
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from mpi4py import MPI

import kvmap

COMM = MPI.COMM_WORLD


def mapped_files(prefix):
    """The distinct files whose basename starts with ``prefix`` mapped into this process."""
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if path.startswith("/") and os.path.basename(path).startswith(prefix):
                found.add(os.path.realpath(path))
    return sorted(found)


def agreed(value):
    """Rank 0's value on every rank (one rank runs a subprocess, every rank asserts)."""
    return COMM.bcast(value, root=0)


def test_import_prints_nothing():
    """A fresh interpreter importing kvmap, with no OpenMP or Kokkos variables set, writes
    nothing to stdout or stderr (Kokkos' OpenMP warnings are off)."""
    result = None
    if COMM.rank == 0:
        # Without the launcher's variables the child is a singleton MPI process of its own.
        with tempfile.TemporaryDirectory() as cwd:
            p = subprocess.run([sys.executable, "-c", "import kvmap"], cwd=cwd, env=singleton_env(),
                               capture_output=True, timeout=120)
        result = (p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))
    rc, out, err = agreed(result)
    assert rc == 0, err
    assert out == ""
    assert err == ""


def singleton_env(**extra):
    """The environment of a fresh singleton MPI process: no launcher, OpenMP or Kokkos variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMP_", "KOKKOS_", "OMPI_", "PMIX_", "PMI_", "HYDRA_", "MPIR_"))
           or k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    env.update(extra)
    return env


def test_build_info_reports_mpi_device_and_gpu_aware_decision():
    """build_info names the running MPI library (as MPI_Get_library_version does), the device this
    rank uses and the GPU-aware MPI decision with its reason; stats() carries the decision."""
    info = kvmap.build_info()
    library = " ".join(MPI.Get_library_version().splitlines()[0].split(",")[0].split())
    assert f"; MPI {library};" in info, (info, library)
    assert "; device " in info
    decision = "yes" if kvmap.stats()["gpu_aware_mpi"] else "no"
    assert f"; GPU-aware MPI {decision} (" in info
    if os.environ.get("KVMAP_GPU_AWARE_MPI") is None and "AUTO: " in info:
        assert ("MPIX_" in info) or ("offers no query" in info)


@pytest.mark.parametrize("value", ["0", "1", "yes"])
def test_gpu_aware_mpi_environment_override(value):
    """KVMAP_GPU_AWARE_MPI=0|1 decides at import (build_info and stats say so); another value
    stops the import with a message naming the variable."""
    result = None
    if COMM.rank == 0:
        code = "import kvmap; print(kvmap.build_info()); print(kvmap.stats()['gpu_aware_mpi'])"
        with tempfile.TemporaryDirectory() as cwd:
            p = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                               env=singleton_env(KVMAP_GPU_AWARE_MPI=value), timeout=120)
        result = (p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))
    rc, out, err = agreed(result)
    if value == "yes":
        assert rc != 0
        assert "KVMAP_GPU_AWARE_MPI='yes' is neither 0" in err, err
        return
    assert rc == 0, err
    info, flag = out.splitlines()
    word = "yes" if value == "1" else "no"
    assert f"GPU-aware MPI {word} (KVMAP_GPU_AWARE_MPI={value} in the environment)" in info
    assert flag == str(value == "1")


def test_one_libc10_and_one_libgomp():
    """Kokkos and LibTorch share one OpenMP runtime, and the process maps one libc10."""
    c10 = mapped_files("libc10.so")
    gomp = mapped_files("libgomp")
    assert len(c10) == 1, c10
    assert len(gomp) <= 1, gomp


def installed_distribution():
    """kvmap's pip distribution when the imported kvmap is the installed one, else None."""
    try:
        dist = importlib.metadata.distribution("kvmap")
    except importlib.metadata.PackageNotFoundError:
        return None
    init = dist.locate_file("kvmap/__init__.py")
    if os.path.realpath(str(init)) != os.path.realpath(kvmap.__file__):
        return None
    return dist


def test_installed_package_is_the_one_in_use():
    dist = installed_distribution()
    if dist is None:
        pytest.skip("kvmap is imported from a build tree, not from a pip installation")
    package = os.path.dirname(os.path.realpath(kvmap.__file__))
    assert dist.version == kvmap.__version__  # one version: the CMake project's
    # The extension is the package's, and carries kvmap itself (the internal static library):
    # no libkvmap is loaded from anywhere else (the package's own libkvmap serves C++ users).
    extension = mapped_files("_kvmap")
    assert extension and all(p.startswith(package + os.sep) for p in extension), extension
    libkvmap = mapped_files("libkvmap")
    assert all(p.startswith(package + os.sep) for p in libkvmap), libkvmap
    assert "LD_LIBRARY_PATH" not in os.environ or not os.environ["LD_LIBRARY_PATH"]
    import torch
    torch_lib = os.path.join(os.path.dirname(os.path.realpath(torch.__file__)), "lib")
    assert [os.path.dirname(p) for p in mapped_files("libc10.so")] == [torch_lib]
    # C++ users of the wheel: the CMake package ships inside it.
    assert os.path.isfile(os.path.join(package, "lib", "cmake", "kvmap", "kvmapConfig.cmake"))


def elf_files(root):
    """Every ELF file under root (shared libraries and the extension), symlinks resolved once."""
    found = set()
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.realpath(os.path.join(directory, name))
            with open(path, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    found.add(path)
    return sorted(found)


def run_paths(path):
    """The RPATH and RUNPATH entries of an ELF file, as `readelf -d` shows them."""
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    entries = []
    for line in out.splitlines():
        if "(RPATH)" in line or "(RUNPATH)" in line:
            entries += line.split("[", 1)[1].rsplit("]", 1)[0].split(":")
    return [e for e in entries if e]


def test_installed_package_is_relocatable():
    """Every ELF file of the installed package finds its libraries relative to itself
    ($ORIGIN): no directory of the machine that built it, but the MPI library's own (which the
    process has loaded) and, for a wheel built against a named Kokkos, that Kokkos' directory."""
    dist = installed_distribution()
    if dist is None:
        pytest.skip("kvmap is imported from a build tree, not from a pip installation")
    if shutil.which("readelf") is None:
        pytest.skip("no readelf (binutils) on PATH")
    package = os.path.dirname(os.path.realpath(kvmap.__file__))
    # The libraries the process loaded from outside the package that may be named by
    # directory: the MPI's, and a named Kokkos.
    loaded = set(mapped_files("libmpi"))
    loaded |= {p for p in mapped_files("libkokkos") if not p.startswith(package + os.sep)}

    def holds_loaded(directory):
        """Whether directory holds (under any name, e.g. the compiler wrapper's symlink) a
        library the process loaded."""
        return os.path.isdir(directory) and any(
            os.path.realpath(os.path.join(directory, name)) in loaded
            for name in os.listdir(directory) if name.startswith(("libmpi", "libkokkos")))

    files = elf_files(package)
    assert any(os.path.basename(f).startswith("_kvmap") for f in files), files
    bad = {}
    for f in files:
        for entry in run_paths(f):
            if entry.startswith("$ORIGIN") or holds_loaded(entry):
                continue
            bad.setdefault(os.path.relpath(f, package), []).append(entry)
    assert not bad, f"RPATH entries of the build machine (allowed: $ORIGIN and the directories of {sorted(loaded)}): {bad}"


def test_one_kokkos_in_the_process():
    """One Kokkos in the process: the extension and libkvmap use the same one (the package's
    own where pip built Kokkos into the wheel)."""
    cores = mapped_files("libkokkoscore")
    assert len(cores) <= 1, cores
    dist = installed_distribution()
    if dist is not None and kvmap._build.KOKKOS_BUNDLED:
        package = os.path.dirname(os.path.realpath(kvmap.__file__))
        assert cores and cores[0].startswith(package + os.sep), cores
