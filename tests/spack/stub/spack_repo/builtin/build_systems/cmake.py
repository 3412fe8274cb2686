"""Stub of spack's CMakePackage: define/define_from_variant record what they were given;
self[name] is a dependency's package, as in spack 1.x."""


from spack.package import Prefix


class CMakePackage:
    def __init__(self, spec, run_tests=False, prefix="/opt/kvmap"):
        self.spec = spec
        self.run_tests = run_tests
        self.prefix = Prefix(prefix)
        self.defined = []  # (name, value, how)

    def __getitem__(self, name):
        """self["kokkos"]: the package object of a dependency (spack 1.x)."""
        return self.spec[name].package

    def define(self, name, value):
        self.defined.append((name, value, "define"))
        kind = "BOOL" if isinstance(value, bool) else "STRING"
        value = ("ON" if value else "OFF") if isinstance(value, bool) else value
        return "-D%s:%s=%s" % (name, kind, value)

    def define_from_variant(self, name, variant):
        if variant not in self.spec.variants:
            raise KeyError("define_from_variant: the spec has no variant %r" % variant)
        value = self.spec.variants[variant]
        self.defined.append((name, value, "define_from_variant"))
        if isinstance(value, str):  # a single-valued variant: its value, as a string
            return "-D%s:STRING=%s" % (name, value)
        return "-D%s:BOOL=%s" % (name, "ON" if value else "OFF")
