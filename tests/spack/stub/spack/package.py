"""Stub of `spack.package`: directives are recorded in DIRECTIVES, in declaration order."""
import contextlib
import os

DIRECTIVES = []


def _directive(name):
    def record(*args, **kwargs):
        DIRECTIVES.append((name, args, kwargs))

    record.__name__ = name
    return record


version = _directive("version")
variant = _directive("variant")
depends_on = _directive("depends_on")
requires = _directive("requires")
conflicts = _directive("conflicts")
extends = _directive("extends")
maintainers = _directive("maintainers")
license = _directive("license")

join_path = os.path.join


def which(*names):
    return names[0] if names else None


@contextlib.contextmanager
def working_dir(path, create=False):
    yield path


__all__ = ["version", "variant", "depends_on", "requires", "conflicts", "extends", "maintainers",
           "license", "join_path", "which", "working_dir"]
