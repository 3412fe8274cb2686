"""Stub of spack's ROCmPackage mixin: the variants `rocm` and `amdgpu_target` (values below)."""


class ROCmPackage:
    # A subset of spack's list.
    amdgpu_targets = ("gfx906", "gfx908", "gfx90a", "gfx942", "gfx1100")
