"""Stub of spack's CudaPackage mixin: the variants `cuda` and `cuda_arch` (values below)."""


class CudaPackage:
    # A subset of spack's list (compute capabilities as spack spells them).
    cuda_arch_values = ("60", "70", "75", "80", "86", "89", "90", "100", "120")
